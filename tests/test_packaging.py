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
