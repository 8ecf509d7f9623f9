"""Real-size models from ``benchmarks/real_models.py`` through orchestra's runtime, against
ExecuTorch's own runtime on the same portable ``.pte``.

Three architectures cover what the mobile nets and transformers need: MobileNetV3-small
(depthwise convolutions, hardswish, squeeze-excite with hardsigmoid), EfficientNet-B0
(depthwise 5x5 convolutions, SiLU, squeeze-excite with sigmoid) and the BERT-style encoder
(attention, layer norm, GELU, embedding). Each is exported once per session (or read from
``$ORCHESTRA_REAL_MODELS`` when set) and skipped without torch + executorch.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from types import ModuleType

import numpy as np
import pytest

from orchestra.runtime import load_program

try:
    from ._executorch import executorch_available
except ImportError:  # tests/ run as a plain directory
    from _executorch import executorch_available  # type: ignore[no-redef]

pytestmark = [
    pytest.mark.executorch,
    pytest.mark.skipif(not executorch_available(), reason="needs torch + executorch (the export extra)"),
]

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ["mobilenet_v3", "efficientnet", "bert"]


def _real_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("orchestra_bench_real_models", ROOT / "benchmarks" / "real_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def real_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, pathlib.Path]:
    cache = os.environ.get("ORCHESTRA_REAL_MODELS")
    return _real_models(), pathlib.Path(cache) if cache else tmp_path_factory.mktemp("real_models")


@pytest.mark.parametrize("name", MODELS)
def test_portable_export_matches_executorch_within_1e_5(name: str, real_models: tuple[ModuleType, pathlib.Path]) -> None:
    rm, cache = real_models
    pte = rm.export(name, "portable", cache)
    inputs, expected = rm.load_io(name, "portable", cache)
    prog = load_program(pte)
    with prog.load_method("forward") as m:
        kinds = {r.kind for r in m._cp.rewrites}
        for _ in range(2):  # the second execute runs on arenas the first one left dirty
            got = m.execute(inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        scale = float(np.max(np.abs(e)))
        assert float(np.max(np.abs(g - e))) <= 1e-5 * scale, f"{name}: max error {np.max(np.abs(g - e))} vs scale {scale}"
    if name != "bert":
        assert {"conv_bn", "elementwise_chain"} <= kinds
