"""Without orchestra's optional C extensions for loading, the same plans and the same results.

The program reader's decoder and verifier (``orchestra.program._decode``), the plan analysis
(``orchestra.runtime._uses``: the use scan, the memory proofs, the matchers' tables), the
compiled plan's value loops (``orchestra.runtime._plan``) and the XNNPACK blob decoder
(``orchestra.backends.xnnpack._xdecode``) are optional: an install without a C compiler runs
their Python code. Each has tests of its own answers against its Python counterpart; this one
checks the whole: a process where none of the four can be imported compiles every committed
fixture (and the real-size models, where cached) to the same rewrites and steps, and its
executes give bit-identical outputs to this process's, which has them. The compiled kernels
(``_native``) stay on in both, so the outputs compare bit for bit.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
REAL = pathlib.Path(os.environ.get("ORCHESTRA_REAL_MODELS", "")) if os.environ.get("ORCHESTRA_REAL_MODELS") else (
    pathlib.Path.home() / ".cache" / "orchestra" / "real_models")
BLOCKED = ("orchestra.runtime._uses", "orchestra.runtime._plan", "orchestra.program._decode",
           "orchestra.backends.xnnpack._xdecode")

# Run by both sides: every program's plans and outputs, into OUT (json + npz).
_PROBE = r"""
import json, pathlib, sys
import numpy as np
from orchestra.runtime import load_program

out, paths = pathlib.Path(sys.argv[1]), sys.argv[2:]
plans, arrays = {}, {}
for p in paths:
    prog = load_program(p)
    npz = pathlib.Path(p).with_suffix(".npz")
    given = np.load(npz) if npz.exists() else None
    for name in prog.method_names:
        m = prog.load_method(name)
        cp = m._cp
        plans[f"{p}:{name}"] = {
            "spans": [list(s) for s in cp.step_spans],
            "rewrites": [[r.kind, list(r.instructions)] for r in cp.rewrites],
        }
        if given is not None and f"{name}.in_0" in given.files:
            ins = [given[f"{name}.in_{k}"] for k in range(len(m.meta.inputs))]
        elif not all(getattr(t, "dtype", None) is not None for t in m.meta.inputs):
            m.close()  # (a scalar input and no recorded one: its plan is compared, not run)
            continue
        else:  # seeded inputs of the method's own shapes
            rng = np.random.default_rng(0)
            ins = []
            for t in m.meta.inputs:
                dt = np.dtype(t.dtype)
                ins.append(rng.integers(0, 100, t.shape).astype(dt) if dt.kind in "iu" else
                           rng.standard_normal(t.shape).astype(dt))
        for k, o in enumerate(m.execute(ins)):
            if isinstance(o, np.ndarray):
                arrays[f"{p}:{name}:{k}"] = o
            else:  # a scalar or list output
                plans[f"{p}:{name}"][f"out_{k}"] = repr(o)
        m.close()
(out / "plans.json").write_text(json.dumps(plans))
np.savez(out / "outputs.npz", **{f"a{k}": v for k, v in enumerate(arrays.values())}, keys=np.array(list(arrays)))
"""

# Makes the extensions unimportable, checks their hooks read None, then probes.
_WITHOUT = r"""
import importlib.abc, sys
BLOCKED = set(sys.argv.pop(1).split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED:
            raise ImportError(f"{name} blocked for this test")
        return None

sys.meta_path.insert(0, Block())
from orchestra.runtime import _method, _optimize
from orchestra.program import _reader
from orchestra.backends.xnnpack import _blob
hooks = {"_uses": _optimize._uses, "_match": _optimize._match, "_plan": _method._plan,
         "_native_decode": _reader._native_decode, "_native_xdecode": _blob._native_xdecode}
bad = [k for k, v in hooks.items() if v is not None]
if bad:
    raise SystemExit(f"still loaded: {bad}")
exec(compile(open(sys.argv.pop(1)).read(), "probe", "exec"))
"""


def _programs() -> list[str]:
    found = sorted(str(p) for p in FIXTURES.rglob("*.pte"))
    real = sorted(REAL.glob("*/*.pte")) if REAL.is_dir() else []
    # one real conv net, transformer and XNNPACK file keep the run short; the rest are the
    # fixtures (every kind of plan the runtime rewrites)
    wanted = ("mobilenet_v3.portable", "vit_tiny.portable", "mobilenet_v3.xnnpack", "vit_tiny.xnnpack")
    found += [str(p) for p in real if p.name.removesuffix(".pte") in wanted]
    return found


def _probe(out: pathlib.Path, paths: list[str], without: bool) -> tuple[dict, dict[str, np.ndarray]]:
    out.mkdir()
    probe = out / "probe.py"
    probe.write_text(_PROBE, encoding="utf-8")
    if without:
        cmd = [sys.executable, "-c", _WITHOUT, ",".join(BLOCKED), str(probe), str(out), *paths]
    else:
        cmd = [sys.executable, str(probe), str(out), *paths]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plans = json.loads((out / "plans.json").read_text())
    with np.load(out / "outputs.npz") as z:
        keys = list(z["keys"])
        arrays = {k: z[f"a{i}"] for i, k in enumerate(keys)}
    return plans, arrays


def test_without_the_load_extensions_plans_and_outputs_are_the_same(tmp_path: pathlib.Path) -> None:
    paths = _programs()
    assert len(paths) >= 20, paths  # the committed fixtures at least
    with_c = _probe(tmp_path / "with", paths, without=False)
    without_c = _probe(tmp_path / "without", paths, without=True)
    assert without_c[0].keys() == with_c[0].keys()
    for key, plan in with_c[0].items():
        assert without_c[0][key] == plan, key
    assert without_c[1].keys() == with_c[1].keys()
    for key, a in with_c[1].items():
        b = without_c[1][key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert np.array_equal(a, b, equal_nan=True), key


def test_the_blocker_is_what_turns_them_off(tmp_path: pathlib.Path) -> None:
    """The probe above would prove nothing if the extensions were not built here: this
    process has every one of them."""
    import importlib

    for name in BLOCKED:
        try:
            importlib.import_module(name)
        except ImportError:
            pytest.fail(f"{name} is not built in this checkout: the comparison would compare Python with Python")
