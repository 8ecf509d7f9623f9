"""The package layout: every source package is installed, under the right name."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "test" in rel.parts or "tests" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]))
    # A sub-folder of orchestra/ that is itself mapped elsewhere doesn't exist, so found is exact.
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_backends_and_policies_install_under_orchestra() -> None:
    import orchestra.backends
    import orchestra.policies

    assert pathlib.Path(orchestra.backends.__file__).parent == ROOT / "backends"
    assert pathlib.Path(orchestra.policies.__file__).parent == ROOT / "policies"
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "backends" not in cfg["packages"] and "policies" not in cfg["packages"]


def test_public_names_are_importable() -> None:
    import orchestra
    import orchestra.program

    for mod in (orchestra, orchestra.program):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_import_orchestra_loads_nothing_heavy_until_a_name_is_used() -> None:
    """`import orchestra` (and the CLI's quick commands) must not pay for the orchestrator,
    the pipelines, the policies or the kernels; each public name loads its module on use."""
    import subprocess
    import sys

    code = ("import sys, orchestra; before = sorted(m for m in sys.modules if m.startswith('orchestra')); "
            "from orchestra import Orchestrator, load_program; import orchestra as o; "
            "print(before, o.Orchestrator is Orchestrator, 'orchestra.orchestrator' in sys.modules, "
            "o.runtime.load_program is load_program, 'Pipeline' in dir(o))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['orchestra', 'orchestra.errors'] True True True True", out
    import orchestra

    try:
        orchestra.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no attribute 'no_such_name'" in str(exc)
    else:
        raise AssertionError("orchestra.no_such_name did not raise AttributeError")
