"""What the AOT and runtime halves of the onnxruntime backend share (no onnx or onnxruntime
import here: each half imports its library lazily)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestra.errors import InvalidArgumentError
from orchestra.program import CompileSpec

__all__ = ["BACKEND_ID", "COMPILE_SPEC_KEYS", "check_names", "names_from_specs"]

BACKEND_ID = "OnnxRuntimeBackend"

# Compile specs the backend understands. Each value is UTF-8 text: comma-separated names.
#   input_names:  the order of the model inputs in the DelegateCall's args (default: the
#                 model's own input order); must name every model input exactly once.
#   output_names: the model outputs the delegate returns, in order (default: all of them,
#                 in the model's order).
COMPILE_SPEC_KEYS = ("input_names", "output_names")


def names_from_specs(compile_specs: Sequence[CompileSpec], where: str, *, strict: bool) -> dict[str, tuple[str, ...]]:
    """Parses the ``input_names`` / ``output_names`` compile specs.

    ``strict`` rejects keys the backend doesn't know (ahead of time, where a user wrote
    them); the runtime ignores them so that programs from newer toolchains still load.
    """
    found: dict[str, tuple[str, ...]] = {}
    for spec in compile_specs:
        key = spec.key
        if key not in COMPILE_SPEC_KEYS:
            if strict:
                raise InvalidArgumentError(
                    f"{where}: unknown compile spec {key!r} (known: {', '.join(COMPILE_SPEC_KEYS)})"
                )
            continue
        if key in found:
            raise InvalidArgumentError(f"{where}: compile spec {key!r} given twice")
        try:
            text = bytes(spec.value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"{where}: compile spec {key!r} must be UTF-8 text (comma-separated names)") from None
        names = tuple(n.strip() for n in text.split(",")) if text.strip() else ()
        if not names or any(not n for n in names):
            raise InvalidArgumentError(f"{where}: compile spec {key!r} must list names separated by commas, got {text!r}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidArgumentError(f"{where}: compile spec {key!r} names {', '.join(map(repr, dup))} more than once")
        found[key] = names
    return found


def check_names(found: dict[str, tuple[str, ...]], inputs: Sequence[str], outputs: Sequence[str], where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The delegate's input and output order given the model's names and the compile specs."""
    ins = found.get("input_names", tuple(inputs))
    outs = found.get("output_names", tuple(outputs))
    if set(ins) != set(inputs) or len(ins) != len(inputs):
        missing = [n for n in inputs if n not in ins]
        unknown = [n for n in ins if n not in inputs]
        raise InvalidArgumentError(
            f"{where}: compile spec 'input_names' must name every model input once "
            f"(model inputs: {', '.join(inputs) or 'none'}; missing: {', '.join(missing) or 'none'}; "
            f"unknown: {', '.join(unknown) or 'none'})"
        )
    unknown = [n for n in outs if n not in outputs]
    if unknown:
        raise InvalidArgumentError(
            f"{where}: compile spec 'output_names' names {', '.join(map(repr, unknown))}, not outputs of the model "
            f"(outputs: {', '.join(outputs)})"
        )
    return tuple(ins), tuple(outs)
