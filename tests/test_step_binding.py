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


# -- the other step factories: bound the same way, same labels, same error texts -----------------

def _plain(shape: tuple[int, ...], body: object) -> Method:
    b = ProgramBuilder()
    f = b.method("forward")
    body(f, f.input(np.float32, shape))  # type: ignore[operator]
    return load_program(b.to_bytes()).load_method()


def _static_out(m: Method) -> int:
    return next(i for i, s in enumerate(m._cp.slots) if s is not None and not s.dynamic)


def test_elementwise_chain_and_gelu_steps_capture_no_cells() -> None:
    def chain(f: object, x: object) -> None:
        f.output(f.call("aten::mul.out", f.call("aten::relu.out", f.call("aten::add.out", x, x, 1.0)), x))  # type: ignore[attr-defined]

    with _plain((2, 4), chain) as m:
        step = m._cp.steps[-1]
        assert step.__qualname__ == "step[2] aten::relu.out + aten::mul.out (elementwise chain)"
        assert step.__closure__ is None, step.__code__.co_freevars
    with _plain((1, 3, 24, 32), lambda f, x: f.output(f.call("aten::gelu.out", x, "none"))) as m:
        (step,) = m._cp.steps
        assert step.__qualname__ == "step[0] aten::gelu.out (float32 fit, scratch)"
        assert step.__closure__ is None, step.__code__.co_freevars


def test_a_views_step_captures_no_cells_and_reports_the_full_text() -> None:
    from orchestra.runtime._optimize import _views_step
    with _method() as m:
        cp, out = m._cp, _static_out(m)
        seen: list[tuple[int, ...]] = []

        def wrong(a: np.ndarray, b: object) -> np.ndarray:
            seen.append(a.shape)
            return np.zeros(7, np.float32)

        what = "chains[0].instructions[1], chains[0].instructions[2] (aten::t_copy.out + aten::mm.out (as views))"
        step = _views_step(cp, wrong, (0, 0), out, {0: (0, lambda v: v[:, :1])}, what, "step[2] views")
        assert step.__qualname__ == "step[2] views" and step.__closure__ is None
        with pytest.raises(OrchestraError) as e:
            step(m._vals, m)
        assert seen == [(1, 1, 8, 8)]  # operand 0 read through its view
        assert f"{m._where}: {what}: result of shape [7] does not fit output values[{out}]" in str(e.value)


def test_a_kernel_step_with_several_results_captures_no_cells_and_reports_the_count() -> None:
    with _method() as m:
        out = _static_out(m)
        step = m._cp._kernel_step(lambda a, b: (a,), (0, 0), (out, out), "chains[0].instructions[5] (aten::y.out)",
                                  "step[5] aten::y.out")
        assert step.__qualname__ == "step[5] aten::y.out" and step.__closure__ is None
        with pytest.raises(OrchestraError) as e:
            step(m._vals, m)
        assert f"{m._where}: chains[0].instructions[5] (aten::y.out): kernel returned 1 results for 2 returns" in str(e.value)


def test_delegate_and_squeeze_excite_steps_capture_no_cells() -> None:
    from orchestra.runtime._optimize import _se_step
    with _method() as m:
        step = m._cp.delegate_step(0, (0, 1), "chains[0].instructions[0] (delegate 0, X)", "step[0] delegate X",
                                   {1: (0, lambda v: v)})
        assert step.__qualname__ == "step[0] delegate X" and step.__closure__ is None
    ran: list[int] = []
    as_written = tuple((lambda vals, m, k=k: ran.append(k)) for k in range(6))
    consts = tuple(np.zeros(2, np.float64) for _ in range(6))  # not float32: the compiled call declines
    step = _se_step((0, 0, 0, 0, 0, 0, 0), consts, as_written, "step[5] squeeze-and-excite")
    assert step.__qualname__ == "step[5] squeeze-and-excite" and step.__closure__ is None
    step([np.zeros((1, 2, 1, 1), np.float64)], None)  # type: ignore[arg-type]
    assert ran == [0, 1, 2, 3, 4, 5]  # declined: the six steps as written, in order
    assert all(not c.flags.writeable for c in consts)
