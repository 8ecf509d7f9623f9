"""The committed real-toolchain fixtures are complete, well-formed and reproducible.

The ExecuTorch cross-checks re-run each committed ``.pte`` in ExecuTorch's own runtime and
compare with the committed outputs; they skip when executorch is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # tests/ may or may not be a package
    from ._executorch import (
        FIXTURES,
        NPZ_KEY,
        delegate_backends,
        fixture_names,
        load_npz,
        run_executorch,
        xnnpack_available,
    )
except ImportError:
    from _executorch import (  # type: ignore[no-redef]
        FIXTURES,
        NPZ_KEY,
        delegate_backends,
        fixture_names,
        load_npz,
        run_executorch,
        xnnpack_available,
    )

EXPECTED = {
    "mlp",
    "cnn",
    "convnet",
    "dwsep",
    "transformer",
    "dynamic_batch",
    "two_methods",
    "xnnpack_convnet",
    "xnnpack_inline",
}
MAX_PTE_BYTES = 200 * 1024
# ExecuTorch's runtime is deterministic on one machine; the slack covers other CPUs, where
# XNNPACK and the optimized kernels may pick different microkernels.
ATOL = RTOL = 1e-6

NAMES = fixture_names()


def _pte(name: str) -> bytes:
    return (FIXTURES / f"{name}.pte").read_bytes()


def _require_executorch() -> None:
    pytest.importorskip("executorch.runtime")


def test_expected_fixtures_are_present() -> None:
    assert EXPECTED <= set(NAMES), f"missing fixtures: {sorted(EXPECTED - set(NAMES))}"


def test_every_fixture_has_pte_and_npz() -> None:
    ptes = {p.stem for p in FIXTURES.glob("*.pte")}
    npzs = {p.stem for p in FIXTURES.glob("*.npz")}
    assert ptes == npzs, f"unpaired: {sorted(ptes ^ npzs)}"


@pytest.mark.parametrize("name", NAMES)
def test_pte_is_small_executorch_program(name: str) -> None:
    data = _pte(name)
    assert len(data) < MAX_PTE_BYTES
    assert data[4:8] == b"ET12", f"{name}.pte: file identifier {data[4:8]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_npz_keys(name: str) -> None:
    with np.load(FIXTURES / f"{name}.npz", allow_pickle=False) as data:
        keys = list(data.files)
    bad = [k for k in keys if not NPZ_KEY.match(k)]
    assert not bad, f"{name}.npz: keys not METHOD.in_N / METHOD.out_N: {bad}"
    methods = load_npz(name)  # also checks indices are 0..n-1 without gaps
    assert methods
    for method, io in methods.items():
        assert io["in"], f"{name}.npz: {method} has no inputs"
        assert io["out"], f"{name}.npz: {method} has no outputs"


def test_two_methods_npz_has_both_methods() -> None:
    assert set(load_npz("two_methods")) == {"forward", "encode"}


def test_transformer_takes_int64_tokens() -> None:
    (tokens,) = load_npz("transformer")["forward"]["in"]
    assert tokens.dtype == np.int64


def _assert_outputs_equal(name: str, method: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want), f"{name}.{method}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        where = f"{name}.{method}.out_{i}"
        assert g.shape == w.shape, f"{where}: shape {g.shape}, expected {w.shape}"
        assert g.dtype == w.dtype, f"{where}: dtype {g.dtype}, expected {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=where)


@pytest.mark.executorch
@pytest.mark.parametrize("name", NAMES)
def test_executorch_reproduces_committed_outputs(name: str) -> None:
    _require_executorch()
    data = _pte(name)
    backends = {b for ds in delegate_backends(data).values() for b, _ in ds}
    if "XnnpackBackend" in backends and not xnnpack_available():
        pytest.skip("XnnpackBackend is not registered in this ExecuTorch runtime")
    expected = load_npz(name)
    assert set(expected) == set(delegate_backends(data)), "npz methods != program methods"
    for method, io in expected.items():
        got = run_executorch(data, method, io["in"])
        _assert_outputs_equal(name, method, got, io["out"])


@pytest.mark.executorch
@pytest.mark.parametrize("batch", [1, 8])
def test_dynamic_batch_accepts_batches_1_to_8(batch: int) -> None:
    _require_executorch()
    io = load_npz("dynamic_batch")["forward"]
    (x,), (y,) = io["in"], io["out"]
    assert x.shape[0] == 3
    # Rows are independent: batch 1 is row 0; batch 8 repeats the stored rows.
    rows = np.arange(batch) % x.shape[0]
    (got,) = run_executorch(_pte("dynamic_batch"), "forward", [x[rows]])
    np.testing.assert_allclose(got, y[rows], rtol=RTOL, atol=ATOL)


@pytest.mark.executorch
@pytest.mark.parametrize(
    ("name", "location"), [("xnnpack_convnet", "segment"), ("xnnpack_inline", "inline")]
)
def test_xnnpack_delegate_data_location(name: str, location: str) -> None:
    _require_executorch()
    assert delegate_backends(_pte(name)) == {"forward": [("XnnpackBackend", location)]}


def test_xnnpack_convnet_matches_portable_convnet() -> None:
    portable, xnnpack = load_npz("convnet")["forward"], load_npz("xnnpack_convnet")["forward"]
    np.testing.assert_array_equal(portable["in"][0], xnnpack["in"][0])
    # Same weights and input; XNNPACK fuses BN into the conv, so only close, not equal.
    np.testing.assert_allclose(portable["out"][0], xnnpack["out"][0], rtol=1e-5, atol=1e-5)
