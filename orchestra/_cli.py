"""The ``orchestra`` command.

``orchestra inspect FILE.pte [--json]`` prints what a program holds: the file's header and
segments, and per method its inputs/outputs, instructions, operators, delegates, planned
memory and constants. Errors a user can cause (a missing or invalid file) print one line,
``orchestra: <message>``, on stderr and exit with status 2.

``orchestra validate FILE.toml`` checks a config file (see :mod:`orchestra.config`): it
prints ``FILE: ok (N cameras, M policies)`` and exits 0, or prints every problem on stderr,
one line each prefixed ``FILE: `` (``FILE:LINE: `` for TOML syntax errors), and exits 2.

``orchestra bench FILE.toml [--fps 30] [--p99-ms 100] [--duration S] [--max-streams N]`` runs
N copies of the config's first camera (``--camera NAME``: that one), raising N until the
target rate or p99 no longer holds, and prints the largest N held (see :mod:`orchestra._bench`);
exits 0, 130 when interrupted (with what was found so far), 2 for a bad file or argument.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from .errors import OrchestraError
from .program import (
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    FreeCall,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    ProgramDef,
    ScalarType,
    Tensor,
    TensorDataLocation,
    TensorShapeDynamism,
    load,
    numpy_dtype,
)

__all__ = ["inspect_file", "main", "render_text"]

_EXIT_USER_ERROR = 2
_EXTENDED_HEADER_MAGIC = b"eh00"
_HEADER_READ = 40  # root offset + identifier + the longest extended header (32 bytes)
_MAX_BENCH_STREAMS = 4096  # instances one bench step may start
_MAX_BENCH_FPS = 10_000.0  # as ConfigLimits.max_fps

_DYNAMISM_KEY = {
    TensorShapeDynamism.STATIC: "static",
    TensorShapeDynamism.DYNAMIC_BOUND: "dynamic_bound",
    TensorShapeDynamism.DYNAMIC_UNBOUND: "dynamic_unbound",
}
_DYNAMISM_TEXT = {
    "static": "static",
    "dynamic_bound": "dynamic ≤ bound (sizes are upper bounds)",
    "dynamic_unbound": "dynamic, unbound (sizes not meaningful)",
}
_INSTRUCTION_WORD = {
    "kernel_calls": "kernel call", "delegate_calls": "delegate call", "moves": "move",
    "jumps": "jump", "frees": "free",
}
# EValue payload class name -> kind shown for it.
_KIND = {
    "Null": "none",
    "Int": "int",
    "Bool": "bool",
    "Double": "float",
    "String": "string",
    "IntList": "int_list",
    "DoubleList": "float_list",
    "BoolList": "bool_list",
    "TensorList": "tensor_list",
    "OptionalTensorList": "optional_tensor_list",
    "Tensor": "tensor",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orchestra")
    except PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------
# Facts: one JSON-able dict; the text layout is rendered from it.


def _dtype_name(scalar_type: int) -> str:
    dt = numpy_dtype(scalar_type)
    if dt is not None:
        return dt.name
    try:
        return ScalarType(scalar_type).name.lower()
    except ValueError:
        return f"scalar_type_{scalar_type}"


def _tensor_nbytes(t: Tensor) -> int | None:
    if t.shape_dynamism == TensorShapeDynamism.DYNAMIC_UNBOUND:
        return None
    n = 1
    for s in t.sizes:
        n *= s
    return n * ScalarType(t.scalar_type).itemsize


def _io_entry(plan: ExecutionPlan, position: int, value_index: int) -> dict[str, Any]:
    ev: EValue = plan.values[value_index]
    v = ev.val
    entry: dict[str, Any] = {
        "index": position,
        "value": value_index,
        "kind": "none" if v is None else _KIND.get(type(v).__name__, type(v).__name__.lower()),
        "dtype": None,
        "shape": None,
        "dynamism": None,
        "nbytes": None,
        "literal": None,
    }
    if isinstance(v, Tensor):
        entry["dtype"] = _dtype_name(v.scalar_type)
        entry["shape"] = list(v.sizes)
        entry["dynamism"] = _DYNAMISM_KEY.get(TensorShapeDynamism(v.shape_dynamism), "unknown")
        entry["nbytes"] = _tensor_nbytes(v)
    elif v is not None:
        for attr in ("int_val", "bool_val", "double_val", "string_val", "items"):
            if hasattr(v, attr):
                lit = getattr(v, attr)
                entry["literal"] = list(lit) if isinstance(lit, tuple) else lit
                break
    return entry


def _delegate_details(prog: ProgramDef, backend_id: str, blob: memoryview) -> dict[str, Any] | None:
    """The optional hook: a backend registered as ``backend_id`` may describe its blobs with
    ``describe_delegate(blob, named_data) -> dict`` (with a one-line ``"summary"``). None when
    the backend is unknown or has no hook; ``{"error": ...}`` when it rejects the blob."""
    from .runtime import get_backend_class

    try:
        hook = getattr(get_backend_class(backend_id), "describe_delegate", None)
    except OrchestraError:
        return None
    if hook is None:
        return None
    try:
        return dict(hook(blob, prog.named_data_bytes))
    except OrchestraError as exc:
        return {"error": str(exc)}


def _method_facts(prog: ProgramDef, plan: ExecutionPlan) -> dict[str, Any]:
    op_calls: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    for chain in plan.chains:
        for ins in chain.instructions:
            a = ins.instr_args
            if isinstance(a, KernelCall):
                op_calls[a.op_index] += 1
                kinds["kernel_calls"] += 1
            elif isinstance(a, DelegateCall):
                kinds["delegate_calls"] += 1
            elif isinstance(a, MoveCall):
                kinds["moves"] += 1
            elif isinstance(a, JumpFalseCall):
                kinds["jumps"] += 1
            elif isinstance(a, FreeCall):
                kinds["frees"] += 1

    delegates = []
    for di, d in enumerate(plan.delegates):
        inline = d.processed.location == DataLocation.INLINE
        entry = {
            "index": di,
            "backend": d.id,
            "blob_size": len(prog.delegate_data(d.processed)),
            "location": "inline" if inline else "segment",
            "data_index": d.processed.index,
            "compile_specs": [c.key for c in d.compile_specs],
        }
        details = _delegate_details(prog, d.id, prog.delegate_data(d.processed))
        if details is not None:
            entry["details"] = details
        delegates.append(entry)

    seen_buffers: set[int] = set()
    const_count = const_bytes = external = 0
    for ev in plan.values:
        t = ev.val
        if not isinstance(t, Tensor) or not t.is_constant:
            continue
        if t.extra_tensor_info is not None and t.extra_tensor_info.location == TensorDataLocation.EXTERNAL:
            external += 1
            continue
        const_count += 1
        if t.data_buffer_idx not in seen_buffers:
            seen_buffers.add(t.data_buffer_idx)
            const_bytes += _tensor_nbytes(t) or 0

    buffers = plan.non_const_buffer_sizes[1:]  # [0] is reserved by ExecuTorch
    return {
        "name": plan.name,
        "inputs": [_io_entry(plan, i, v) for i, v in enumerate(plan.inputs)],
        "outputs": [_io_entry(plan, i, v) for i, v in enumerate(plan.outputs)],
        "values": len(plan.values),
        "chains": [len(c.instructions) for c in plan.chains],
        "instructions": {k: kinds[k] for k in ("kernel_calls", "delegate_calls", "moves", "jumps", "frees")},
        "operators": [
            {"index": oi, "name": op.qualified_name, "calls": op_calls[oi]}
            for oi, op in enumerate(plan.operators)
        ],
        "delegates": delegates,
        "planned_memory": {
            "total": sum(buffers),
            "buffers": [{"id": bi, "size": s} for bi, s in enumerate(buffers, start=1)],
        },
        "constants": {
            "count": const_count, "buffers": len(seen_buffers), "bytes": const_bytes, "external": external,
        },
    }


def _segment_refs(prog: ProgramDef) -> list[list[dict[str, Any]]]:
    refs: list[list[dict[str, Any]]] = [[] for _ in prog.segments]
    cs = prog.constant_segment
    if cs is not None and cs.offsets and cs.segment_index < len(refs):
        # offsets[0] belongs to data_buffer_idx 0, which ExecuTorch reserves for "no data".
        refs[cs.segment_index].append({"kind": "constants", "buffers": max(len(cs.offsets) - 1, 0)})
    for plan in prog.execution_plan:
        for di, d in enumerate(plan.delegates):
            if d.processed.location == DataLocation.SEGMENT:
                refs[d.processed.index].append({"kind": "delegate", "method": plan.name, "delegate": di})
    for nd in prog.named_data:
        refs[nd.segment_index].append({"kind": "named_data", "key": nd.key})
    for mi, ms in enumerate(prog.mutable_data_segments):
        refs[ms.segment_index].append({"kind": "mutable_data", "index": mi, "buffers": len(ms.offsets)})
    return refs


def _read_header(path: str) -> tuple[str, dict[str, int | None] | None]:
    with open(path, "rb") as f:
        head = f.read(_HEADER_READ)
    ident = head[4:8].decode("ascii", "backslashreplace")
    if len(head) < 16 or head[8:12] != _EXTENDED_HEADER_MAGIC:
        return ident, None
    length = struct.unpack_from("<I", head, 12)[0]
    program_size, segment_base = struct.unpack_from("<QQ", head, 16)
    data_size = struct.unpack_from("<Q", head, 32)[0] if length >= 32 and len(head) >= 40 else None
    return ident, {
        "length": length,
        "program_size": program_size,
        "segment_base_offset": segment_base,
        "segment_data_size": data_size,
    }


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything ``orchestra inspect`` reports about the program at ``path``, as a dict.

    Raises:
        OrchestraError: the file is missing, unreadable or not a valid program.
    """
    name = os.fspath(path)
    prog = load(name)
    try:
        size = os.stat(name).st_size
        ident, header = _read_header(name)
    except OSError as exc:  # the file went away after load()
        from .errors import NotFoundError

        raise NotFoundError(f"{name}: cannot read: {exc.strerror or exc}") from None
    refs = _segment_refs(prog)
    return {
        "file": {
            "path": name,
            "name": os.path.basename(name),
            "size": size,
            "identifier": ident,
            "schema_version": prog.version,
            "extended_header": header,
        },
        "segments": [
            {"index": i, "offset": s.offset, "size": s.size, "used_by": refs[i]}
            for i, s in enumerate(prog.segments)
        ],
        "inline_delegate_data": [
            {"index": i, "size": len(d.data)} for i, d in enumerate(prog.backend_delegate_data)
        ],
        "methods": [_method_facts(prog, plan) for plan in prog.execution_plan],
    }


# ---------------------------------------------------------------------------------------
# Text layout.


def _n(x: int) -> str:
    return f"{x:,}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _table(rows: list[list[str]], indent: str, right: frozenset[int] | set[int] = frozenset()) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [
            cell.rjust(widths[c]) if c in right else cell.ljust(widths[c]) for c, cell in enumerate(r)
        ]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _ref_text(ref: dict[str, Any]) -> str:
    kind = ref["kind"]
    if kind == "constants":
        return f"constants ({_plural(ref['buffers'], 'buffer')})"
    if kind == "delegate":
        return f"delegate {ref['delegate']} of method {ref['method']}"
    if kind == "named_data":
        return f"named data {ref['key']}"
    if kind == "mutable_data":
        return f"mutable data [{ref['index']}] ({_plural(ref['buffers'], 'buffer')})"
    return kind


def _io_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for e in entries:
        pos, val = f"[{e['index']}]", f"value {e['value']}"
        if e["kind"] == "tensor":
            shape = "[" + ", ".join(str(s) for s in e["shape"]) + "]"
            rows.append([pos, val, "tensor", e["dtype"], shape, _DYNAMISM_TEXT.get(e["dynamism"], e["dynamism"])])
        else:
            lit = "" if e["literal"] is None else f"= {e['literal']}"
            rows.append([pos, val, e["kind"], lit, "", ""])
    return rows


def render_text(facts: dict[str, Any]) -> str:
    """The human-readable layout of :func:`inspect_file`'s facts."""
    f = facts["file"]
    lines = []
    eh = f["extended_header"]
    if eh is None:
        header = "none"
    else:
        header = f"program {_n(eh['program_size'])} bytes, segment base {_n(eh['segment_base_offset'])}"
        if eh["segment_data_size"] is not None:
            header += f", segment data {_n(eh['segment_data_size'])} bytes"
    lines += _table([
        ["file", f["path"]],
        ["size", f"{_n(f['size'])} bytes"],
        ["identifier", f["identifier"]],
        ["schema", f"version {f['schema_version']}"],
        ["ext. header", header],
        ["methods", f"{len(facts['methods'])} ({', '.join(m['name'] for m in facts['methods'])})"],
        ["segments", str(len(facts["segments"]))],
    ], "")
    lines += _table([
        [f"[{s['index']}]", "offset", _n(s["offset"]), "size", _n(s["size"]),
         "; ".join(_ref_text(r) for r in s["used_by"]) or "(unreferenced)"]
        for s in facts["segments"]
    ], "  ", right={2, 4})
    if facts["inline_delegate_data"]:
        lines.append(f"inline delegate data  {len(facts['inline_delegate_data'])}")
        lines += _table([[f"[{d['index']}]", "size", _n(d["size"])] for d in facts["inline_delegate_data"]],
                        "  ", right={2})

    for m in facts["methods"]:
        lines += ["", f"method {m['name']}"]
        for label in ("inputs", "outputs"):
            lines.append(f"  {label} ({len(m[label])})")
            lines += _table(_io_rows(m[label]), "    ")
        ins = m["instructions"]
        kinds = ", ".join(_plural(v, _INSTRUCTION_WORD[k]) for k, v in ins.items() if v)
        per_chain = ", ".join(f"chain {i}: {n}" for i, n in enumerate(m["chains"])) or "no chains"
        pm, c = m["planned_memory"], m["constants"]
        const = _plural(c["count"], "tensor")
        if c["buffers"] != c["count"]:
            const += f" in {_plural(c['buffers'], 'buffer')}"
        const += f", {_n(c['bytes'])} bytes"
        if c["external"]:
            const += f" (+{c['external']} external)"

        lines.append(f"  {'values':<16}{m['values']}")
        lines.append(f"  {'instructions':<16}{sum(m['chains'])} ({per_chain}){'; ' + kinds if kinds else ''}")
        lines.append(f"  {'operators':<16}{len(m['operators'])}")
        lines += _table([[o["name"], _plural(o["calls"], "call")] for o in m["operators"]], "    ")
        lines.append(f"  {'delegates':<16}{len(m['delegates'])}")
        lines += _table([
            [f"[{d['index']}]", d["backend"], f"blob {_n(d['blob_size'])} bytes",
             f"{d['location']} [{d['data_index']}]",
             "compile specs: " + (", ".join(d["compile_specs"]) if d["compile_specs"] else "none")]
            for d in m["delegates"]
        ], "    ")
        for d in m["delegates"]:
            det = d.get("details")
            if det:
                lines.append(f"    [{d['index']}] {det.get('summary') or 'invalid: ' + str(det.get('error'))}")
        lines.append(f"  {'planned memory':<16}{_n(pm['total'])} bytes in {_plural(len(pm['buffers']), 'buffer')}")
        lines += _table([[f"buffer {b['id']}", f"{_n(b['size'])} bytes"] for b in pm["buffers"]], "    ", right={1})
        lines.append(f"  {'constants':<16}{const}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Entry point.


def _write(stream: TextIO, text: str) -> None:
    enc = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(enc)
    except (UnicodeEncodeError, LookupError):
        text = text.replace("≤", "<=").encode(enc, "backslashreplace").decode(enc)
    stream.write(text)
    stream.flush()


def _cmd_inspect(args: argparse.Namespace) -> int:
    facts = inspect_file(args.file)
    if args.json:
        _write(sys.stdout, json.dumps(facts, indent=2) + "\n")
    else:
        _write(sys.stdout, render_text(facts))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .config import _check_for_cli

    config, lines = _check_for_cli(args.file)
    if config is None:
        _write(sys.stderr, "".join(line + "\n" for line in lines))
        return _EXIT_USER_ERROR
    _write(sys.stderr, "".join(f"{args.file}: warning: {w}\n" for w in config.warnings))
    n, m = len(config.cameras), len(config.policies)
    _write(sys.stdout, f"{args.file}: ok ({n} camera{'' if n == 1 else 's'}, {m} polic{'y' if m == 1 else 'ies'})\n")
    return 0


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (0: any free port), got {text!r}")
    return v


def _cmd_run(args: argparse.Namespace) -> int:
    from ._run import deferred_signals

    # Ctrl-C while the config loads is acted on once the run can drain (it then ends at once)
    with deferred_signals() as early:
        return _run_config(args, early)


def _run_config(args: argparse.Namespace, early: list[int]) -> int:
    from ._run import RunOptions, render_summary, run, summary_dict
    from .config import _check_for_cli

    config, lines = _check_for_cli(args.file)
    if config is None:
        _write(sys.stderr, "".join(line + "\n" for line in lines))
        return _EXIT_USER_ERROR
    _write(sys.stderr, "".join(f"{args.file}: warning: {w}\n" for w in config.warnings))
    for flag, path in (("--summary-json", args.summary_json), ("--report", args.report)):
        problem = _unwritable(path) if path else None
        if problem:
            _write(sys.stderr, f"orchestra: {flag} {path}: {problem}\n")
            return _EXIT_USER_ERROR
    if config.cluster is not None:
        return _run_on_cluster(args, config, early)
    opened = _open_run_logs(args)
    if opened is None:
        return _EXIT_USER_ERROR
    dashboard, logs, log_file = opened
    duration = args.duration if args.duration is not None else config.run.duration_s
    try:
        result = run(config, RunOptions(duration_s=duration, dashboard=dashboard, metrics_port=args.metrics_port,
                                        metrics_host=args.metrics_host, logs=logs,
                                        record_s=1.0 if args.report else None), early_signals=early)
    finally:
        _close_run_logs(args, logs, log_file)
    _write(sys.stdout, render_summary(result))
    if args.summary_json:
        _write_file(args.summary_json, json.dumps(summary_dict(result), indent=2, allow_nan=False) + "\n")
    if args.report:
        from ._report import write_report

        write_report(result, args.report)
        _write(sys.stderr, f"report: {args.report}\n")
    return result.exit_code


def _open_run_logs(args: argparse.Namespace) -> tuple[bool, Any, Any] | None:
    """For ``orchestra run``: whether the live dashboard shows (a terminal, no
    --no-dashboard), the buffer its log lines wait in (None without it) and the --log-file
    opened; log events go to the file, the buffer or stderr from here on. None (the error
    printed) when --log-file can't be opened."""
    from ._dashboard import LogBuffer
    from ._run import configure_logging

    dashboard = not args.no_dashboard and sys.stdout.isatty()
    logs = None
    log_file = None
    if args.log_file:
        try:
            log_file = open(args.log_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - _close_run_logs
        except OSError as exc:
            _write(sys.stderr, f"orchestra: --log-file {args.log_file}: {exc.strerror or exc}\n")
            return None
        stream: Any = log_file
    elif dashboard:
        stream = logs = LogBuffer()
    else:
        stream = sys.stderr
    configure_logging(args.log_format, stream, timefmt="%H:%M:%S.%f" if logs is not None else "iso")
    return dashboard, logs, log_file


def _close_run_logs(args: argparse.Namespace, logs: Any, log_file: Any) -> None:
    """After the run: what the dashboard did not print (it prints each line once, as it
    comes) to stderr, log events back to stderr, the --log-file closed."""
    from ._run import configure_logging

    if logs is not None:
        kept, lost = logs.drain()
        if lost:
            _write(sys.stderr, f"({lost} earlier log lines not kept)\n")
        _write(sys.stderr, "".join(line + "\n" for line in kept))
    configure_logging(args.log_format, sys.stderr)
    if log_file is not None:
        log_file.close()


def _run_on_cluster(args: argparse.Namespace, config: Any, early: list[int]) -> int:
    """``orchestra run`` for a config with a [cluster] table: every camera on its node (see
    :func:`orchestra._run.run_cluster`), shown live as the local run is (one dashboard of every
    node's cameras on a terminal, else a status line); one summary line per camera.

    SIGINT/SIGTERM (remembered in ``early``) stop the run within a second: the cameras' actors
    are killed, there is no summary, the exit status is 128 + the signal's number."""
    from ._run import RunOptions, cluster_summary_dict, render_cluster_summary, run_cluster

    opened = _open_run_logs(args)
    if opened is None:
        return _EXIT_USER_ERROR
    dashboard, logs, log_file = opened
    duration = args.duration if args.duration is not None else config.run.duration_s
    def interrupted(status: Any) -> None:
        if early:  # run_jobs kills the actors on its way out
            raise KeyboardInterrupt

    try:  # PlacementError: exit 2, from main()
        result = run_cluster(config, RunOptions(duration_s=duration, dashboard=dashboard, logs=logs,
                                                metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                                                record_s=1.0 if args.report else None),
                             on_status=interrupted)
    except KeyboardInterrupt:
        sig = early[0] if early else signal.SIGINT
        _write(sys.stderr, f"orchestra: interrupted ({signal.Signals(sig).name}): the cameras' actors were "
                           f"stopped; no summary\n")
        return 128 + int(sig)
    finally:
        _close_run_logs(args, logs, log_file)
    _write(sys.stdout, render_cluster_summary(result))
    if args.summary_json:
        _write_file(args.summary_json, json.dumps(cluster_summary_dict(result), indent=2, allow_nan=False) + "\n")
    if args.report:
        from ._report import render_cluster_report, write_report
        from ._run import cluster_decisions

        write_report(result, args.report, render_cluster_report(result, result.timeline, cluster_decisions(result),
                                                                 result.elapsed_s))
        _write(sys.stderr, f"report: {args.report}\n")
    return result.exit_code


def _unwritable(path: str) -> str | None:
    """Why ``path`` can't be written (checked before a run, not to lose its end), or None."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        return "is a directory"
    if not os.path.isdir(d):
        return f"no such directory: {d}"
    if not os.access(d, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "permission denied"
    return None


def _write_file(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"{path}: can't write: {exc.strerror or exc}") from None


def _positive(kind: type, what: str, most: float = float("inf")) -> Any:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not 0 < v < float("inf"):
            raise argparse.ArgumentTypeError(f"must be {what} > 0, got {text!r}")
        if v > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {text!r}")
        return v
    return parse


_duration = _positive(float, "a number of seconds")  # --duration of run and bench


def _percent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 < v <= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage in (0, 100], got {text!r}")
    return v


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Usage errors of ``parser`` as one line on stderr (``PROG: error: ...``), status 2."""
    def error(message: str) -> NoReturn:
        parser.exit(_EXIT_USER_ERROR, f"{parser.prog}: error: {message} (see --help)\n")

    parser.error = error  # type: ignore[method-assign]


def _cmd_bench(args: argparse.Namespace) -> int:
    import logging

    import dataclasses

    from ._bench import BenchOptions, batch_of, bench, binding_plan, camera_of, copies_config, render_result
    from ._run import configure_logging, deferred_signals
    from .config import _check_for_cli

    with deferred_signals() as early:  # Ctrl-C while the config loads: nothing run, exit 130
        config, lines = _check_for_cli(args.file)
    if early:
        return 128 + early[0]
    if config is None:
        _write(sys.stderr, "".join(line + "\n" for line in lines))
        return _EXIT_USER_ERROR
    _write(sys.stderr, "".join(f"{args.file}: warning: {w}\n" for w in config.warnings))
    configure_logging("console", sys.stderr, level=logging.WARNING)
    options = BenchOptions(fps=args.fps, p99_ms=args.p99_ms, duration_s=args.duration, max_streams=args.max_streams,
                           min_rate=args.min_processed / 100.0, camera=args.camera, placement=args.placement)
    cam = camera_of(config, options.camera)
    copies_config(config, 1, options)  # a camera the bench can't copy is refused before anything prints
    if args.batch:
        copies_config(config, 1, dataclasses.replace(options, batch=True))
    _, cap, why = binding_plan(config, cam, 1)
    placement = options.placement or (f"auto: {cam.placement}" if cam.auto_placement else cam.placement)
    _write(sys.stdout, f"orchestra bench {os.path.basename(args.file)}: copies of camera {cam.name!r} "
                       f"({placement} placement) at {options.fps:g} fps, held when p99 <= {options.p99_ms:g} ms and "
                       f">= {args.min_processed:g} % of frames processed; {options.duration_s:g} s per step, "
                       f"up to {min(options.max_streams, cap) if cap is not None else options.max_streams} streams"
                       + (f" ({why})" if cap is not None and cap < options.max_streams else "") + "\n")
    if not args.batch:
        result = bench(config, options, out=sys.stdout)
        _write(sys.stdout, render_result(result, "streams"))
        return result.exit_code
    # with --batch: the same search without batching, then with the copies in one [[batch]]
    _write(sys.stdout, "without batching (each copy its own executes)\n")
    alone = bench(config, options, out=sys.stdout)
    _write(sys.stdout, render_result(alone, "streams"))
    if alone.interrupted_by is not None:
        return alone.exit_code
    batch = batch_of(config, cam)
    _write(sys.stdout, f"\nwith batching (the copies in one [[batch]]: max_size {batch.max_size}, "  # type: ignore[union-attr]
                       f"max_wait_ms {batch.max_wait_s * 1e3:g}"  # type: ignore[union-attr]
                       + (f", static_batch {batch.static_batch}" if batch.static_batch else "") + ")\n")  # type: ignore[union-attr]
    together = bench(config, dataclasses.replace(options, batch=True), out=sys.stdout)
    _write(sys.stdout, render_result(together, "streams"))
    ratio = f"{together.largest / alone.largest:.2f}x" if alone.largest else "-"
    _write(sys.stdout, f"batching: {together.largest} streams held against {alone.largest} without ({ratio})\n")
    return together.exit_code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orchestra",
        description="Run many instances of one ExecuTorch program method at once.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    ins = sub.add_parser(
        "inspect",
        help="show what a .pte program holds",
        description="Show a .pte program's header, segments, and per method its inputs, "
        "outputs, instructions, operators, delegates, planned memory and constants.",
    )
    ins.add_argument("file", metavar="FILE.pte", help="the program to inspect")
    ins.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ins.set_defaults(func=_cmd_inspect)
    val = sub.add_parser(
        "validate",
        help="check a TOML config file",
        description="Check a config file (programs, devices, cameras, policies, signals, run) and "
        "print every problem, one line each, starting with where it is in the file.",
    )
    val.add_argument("file", metavar="FILE.toml", help="the config to check")
    val.set_defaults(func=_cmd_validate)
    run = sub.add_parser(
        "run",
        help="run a config's cameras with a live dashboard",
        description="Run every camera of a config file as a pipeline on its own orchestrator instance, "
        "with the policy engine retuning them; show a live dashboard (or a status line when stdout is "
        "not a terminal) and a summary at the end. Ctrl-C stops the sources, drains and exits 130.",
    )
    run.add_argument("file", metavar="FILE.toml", help="the config to run")
    run.add_argument("--duration", type=_duration, metavar="S",
                     help="seconds to run (default: the config's run.duration_s; none: until Ctrl-C)")
    run.add_argument("--log-format", choices=("console", "json"), default="console",
                     help="log events as key=value lines (console, default) or JSON lines")
    run.add_argument("--log-file", metavar="PATH", help="append log events to PATH (default: stderr)")
    run.add_argument("--metrics-port", type=_port, metavar="N",
                     help="serve Prometheus metrics at http://HOST:N/metrics (0: any free port)")
    run.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="the address the metrics server listens on (default 127.0.0.1)")
    run.add_argument("--no-dashboard", action="store_true",
                     help="no live dashboard: a status line every few seconds instead")
    run.add_argument("--summary-json", metavar="PATH",
                     help="also write the summary as JSON to PATH (schema orchestra.run.summary/1, see README)")
    run.add_argument("--report", metavar="PATH.html",
                     help="write a self-contained HTML report to PATH: per camera over time (frame rate, latency, "
                     "queue, energy), the policy decisions and the signals behind them")
    run.set_defaults(func=_cmd_run)
    ben = sub.add_parser(
        "bench",
        help="find how many copies of a camera this machine sustains",
        description="Run N copies of one camera of a config (its program, options, binding and placement; "
        "sources paced at --fps), doubling N and then bisecting, until the target no longer holds: every "
        "frame processed (within --min-processed) and the p99 latency within --p99-ms. Prints a line per N "
        "and the largest N held. Ctrl-C ends it with what was found so far (exit 130).",
    )
    ben.add_argument("file", metavar="FILE.toml", help="the config whose camera is copied")
    ben.add_argument("--camera", metavar="NAME", help="the camera to copy (default: the first)")
    ben.add_argument("--fps", type=_positive(float, "a frame rate", _MAX_BENCH_FPS), default=30.0, metavar="F",
                     help="frames per second of every copy (default 30)")
    ben.add_argument("--p99-ms", type=_positive(float, "a number of milliseconds"), default=100.0, metavar="MS",
                     help="the p99 latency (capture to result) to hold (default 100)")
    ben.add_argument("--duration", type=_duration, default=10.0, metavar="S",
                     help="seconds each N runs (default 10)")
    ben.add_argument("--max-streams", type=_positive(int, "a whole number", _MAX_BENCH_STREAMS), default=64, metavar="N",
                     help=f"the most copies to try (default 64, at most {_MAX_BENCH_STREAMS})")
    ben.add_argument("--min-processed", type=_percent, default=99.0, metavar="PCT",
                     help="the share of frames that must be produced on time and processed (default 99)")
    ben.add_argument("--placement", choices=("thread", "process"),
                     help="run every copy in this placement (default: the camera's own)")
    ben.add_argument("--batch", action="store_true",
                     help="search twice: without batching, then with every copy in one [[batch]] with the settings "
                     "of the camera's own [[batch]] table; prints both and their ratio")
    ben.set_defaults(func=_cmd_bench, usage_parser=ben)
    _one_line_errors(ben)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``orchestra`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            sub = getattr(args, "usage_parser", parser)  # bench: its one-line errors
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, usage errors: argparse's status
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else _EXIT_USER_ERROR)
    try:
        return args.func(args)
    except OrchestraError as exc:
        _write(sys.stderr, f"orchestra: {exc.message}\n")
        return _EXIT_USER_ERROR
    except BrokenPipeError:
        # The reader went away (`orchestra inspect x.pte | head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
