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


def _build_backend_path() -> str | None:
    """A folder holding setuptools >= 68 (the build backend pyproject.toml asks for), to
    build the wheel offline without build isolation; None when none is installed."""
    from importlib.metadata import distributions

    for dist in distributions():
        if (dist.metadata["Name"] or "").lower() == "setuptools":
            major = int(dist.version.split(".")[0])
            if major >= 68:
                return str(dist.locate_file(""))
    return None


def test_the_readme_install_gives_a_working_console_script(tmp_path: pathlib.Path) -> None:
    """The README's first command, ``pip install .`` then ``orchestra run``: a wheel built from
    the checkout, installed (not editable, ``--no-deps``) into a fresh venv that sees the
    dependencies, runs ``orchestra validate`` and ``orchestra run`` through its console script."""
    import os
    import shutil
    import subprocess
    import sys
    import sysconfig

    import pytest

    backend = _build_backend_path()
    if backend is None:
        pytest.skip("needs setuptools>=68 installed to build the wheel offline")
    env = dict(os.environ, PYTHONPATH=backend, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    # a copy of the checkout: building in place would leave build/ behind (and reuse a stale one)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(wheels), str(src)], capture_output=True, text=True, env=env, timeout=300,
                           cwd=tmp_path)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("orchestra-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # the dependencies: this interpreter's site folders (not the checkout), after the venv's own
    site_packages = pathlib.Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                                capture_output=True, text=True, check=True).stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages") and not p.startswith(str(ROOT))]
    deps.append(sysconfig.get_paths()["purelib"])
    (site_packages / "_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                              str(wheel)], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = subprocess.run([str(py), "-c", "import orchestra, orchestra.backends, orchestra.policies; "
                            "print(orchestra.__file__); print(orchestra.backends.__file__)"],
                           capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site_packages)) for line in where.stdout.split()), where.stdout  # the wheel's copy
    script = venv / "bin" / "orchestra"
    config = src / "examples" / "street.toml"  # the main job (the copy: its results go to the copy's out/)
    pytest.importorskip("av", reason="the main job decodes video: the video extra (PyAV)")
    val = subprocess.run([str(script), "validate", str(config)], capture_output=True, text=True, env=clean,
                         cwd=tmp_path, timeout=120)
    assert (val.returncode, val.stdout, val.stderr) == (0, f"{config}: ok (4 cameras, 1 policy)\n", "")
    run = subprocess.run([str(script), "run", str(config), "--duration", "1", "--no-dashboard"], capture_output=True,
                         text=True, env=dict(clean, NO_COLOR="1"), cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "accounting: produced = processed + dropped + failed for every camera" in run.stdout
    assert run.stdout.rstrip().endswith("result: ok")
