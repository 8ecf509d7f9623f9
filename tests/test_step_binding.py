"""Kernel and folded-convolution steps bind what they read as default arguments (no closure
cells: fewer objects per load for the collector), and still report errors in full and carry
their labels as ``__qualname__``."""

from __future__ import annotations

import numpy as np
import pytest

from orchestra.aot import ProgramBuilder
from orchestra.errors import OrchestraError
from orchestra.runtime import load_program
from orchestra.runtime._method import Method

CONV = "aten::convolution.out"
BN = "aten::_native_batch_norm_legit_no_training.out"


def _method() -> Method:
    rng = np.random.default_rng(0)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = f.call(CONV, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    c = [rng.standard_normal(4).astype(np.float32) for _ in range(3)] + [np.full(4, 1.5, np.float32)]
    out, _, _ = f.call(BN, y, *c, 0.1, 1e-3)
    f.output(f.call("aten::relu.out", out))  # joins the folded step
    return load_program(b.to_bytes()).load_method()


def test_steps_capture_no_cells_and_keep_their_labels() -> None:
    with _method() as m:
        (step,) = m._cp.steps
        assert step.__qualname__.startswith("step[0] aten::convolution.out + ")
        assert step.__qualname__.endswith(" (folded) + relu")
        assert step.__closure__ is None, step.__code__.co_freevars


@pytest.mark.parametrize("n_params", [1, 2])
def test_a_bound_kernel_step_reports_the_full_text(n_params: int) -> None:
    with _method() as m:
        cp = m._cp
        out = next(i for i, s in enumerate(cp.slots) if s is not None and not s.dynamic)
        params = (0,) * n_params

        def wrong(*a: object) -> np.ndarray:
            return np.zeros(7, np.float32)

        step = cp._kernel_step(wrong, params, (out,), "chains[0].instructions[3] (aten::x.out)", "step[3] aten::x.out")
        assert step.__qualname__ == "step[3] aten::x.out" and step.__closure__ is None
        with pytest.raises(OrchestraError) as e:
            step(m._vals, m)
        assert f"{m._where}: chains[0].instructions[3] (aten::x.out): result of shape [7] does not fit output values[{out}]" in str(e.value)
