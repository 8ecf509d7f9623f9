"""Test helpers for the committed fixtures and for cross-checking against ExecuTorch's runtime.

Importing this module needs only numpy: torch and executorch are imported lazily, inside the
functions that run ExecuTorch, so torch-free test runs can still list and load fixtures.
"""

from __future__ import annotations

import functools
import pathlib
import re
from collections.abc import Sequence

import numpy as np

__all__ = [
    "FIXTURES",
    "NPZ_KEY",
    "delegate_backends",
    "executorch_available",
    "fixture_names",
    "load_npz",
    "run_executorch",
    "xnnpack_available",
]

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# ``METHOD.in_N`` / ``METHOD.out_N``; method names are C identifiers in ExecuTorch programs.
NPZ_KEY = re.compile(r"^(?P<method>[A-Za-z_][A-Za-z0-9_]*)\.(?P<kind>in|out)_(?P<index>0|[1-9][0-9]*)$")


@functools.cache
def executorch_available() -> bool:
    """True when ``executorch.runtime`` (and so torch and the pybindings) imports."""
    try:
        import executorch.runtime  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def xnnpack_available() -> bool:
    """True when ExecuTorch's runtime has the XNNPACK backend registered."""
    if not executorch_available():
        return False
    from executorch.runtime import Runtime

    return bool(Runtime.get().backend_registry.is_available("XnnpackBackend"))


def run_executorch(pte: bytes, method: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``method`` of the program ``pte`` in ExecuTorch's own runtime; return numpy outputs.

    Each call loads a fresh program, so calls never share method state or planned memory.
    """
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(bytes(pte))
    loaded = program.load_method(method)
    if loaded is None:  # pragma: no cover - the runtime raises instead in practice
        raise RuntimeError(f"ExecuTorch could not load method {method!r}")
    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    outputs = loaded.execute(args)
    result: list[np.ndarray] = []
    for out in outputs:
        if isinstance(out, torch.Tensor):
            result.append(out.detach().cpu().numpy().copy())
        else:
            result.append(np.asarray(out))
    return result


def delegate_backends(pte: bytes) -> dict[str, list[tuple[str, str]]]:
    """Map method → [(backend id, "inline" | "segment"), ...] using ExecuTorch's own reader.

    Needs executorch. Reads the raw flatbuffer: ``deserialize_pte_binary`` would move every
    segment-backed delegate blob back inline and hide where it lives.
    """
    from executorch.exir._serialize._program import (
        _flatbuffer_to_program,
        _get_extended_header,
    )
    from executorch.exir.schema import DataLocation

    header = _get_extended_header(pte)
    program = _flatbuffer_to_program(pte[: header.program_size] if header else pte)
    return {
        plan.name: [
            (d.id, "inline" if d.processed.location == DataLocation.INLINE else "segment")
            for d in plan.delegates
        ]
        for plan in program.execution_plan
    }


def fixture_names() -> list[str]:
    """Stems of every ``*.pte`` in :data:`FIXTURES`, sorted."""
    return sorted(p.stem for p in FIXTURES.glob("*.pte"))


def load_npz(name: str) -> dict[str, dict[str, list[np.ndarray]]]:
    """Load ``FIXTURES/NAME.npz`` as method → ``{"in": [...], "out": [...]}`` (by index).

    Raises ``ValueError`` on a key that is not ``METHOD.in_N`` / ``METHOD.out_N`` or on a gap
    in the indices.
    """
    path = FIXTURES / f"{name}.npz"
    indexed: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            match = NPZ_KEY.match(key)
            if match is None:
                raise ValueError(f"{path}: key {key!r} is not METHOD.in_N or METHOD.out_N")
            slots = indexed.setdefault(match["method"], {"in": {}, "out": {}})
            slots[match["kind"]][int(match["index"])] = data[key]
    result: dict[str, dict[str, list[np.ndarray]]] = {}
    for method, slots in indexed.items():
        result[method] = {}
        for kind in ("in", "out"):
            found = slots[kind]
            if sorted(found) != list(range(len(found))):
                raise ValueError(
                    f"{path}: method {method!r} has {kind}_ indices {sorted(found)}, "
                    f"expected 0..{len(found) - 1}"
                )
            result[method][kind] = [found[i] for i in range(len(found))]
    return result
