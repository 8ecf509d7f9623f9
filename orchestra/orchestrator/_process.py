"""``placement="process"``: the instance's Method lives in a worker process.

The instance keeps its worker thread (the same hand-off to the event loop, the same
batching, restarts and deadlines); instead of a :class:`~orchestra.runtime.Method` it drives
a :class:`RemoteMethod`: a child process (``spawn``) pinned to the binding's CPUs
(``os.sched_setaffinity`` in the child, so the whole process and the threads its backends
start), which loads the program and the Method itself. Tensors cross through one
``multiprocessing.shared_memory`` block per process: inputs are copied into it, the child
executes on views of it and writes the outputs back there; the pipe carries only shapes,
scalars and small control messages. Each instance's worker thread is the only user of its
process, so there is one request in flight per process and no locking.

A restart starts a fresh process; a deadline kills the stuck process outright (nothing is
abandoned). Backends reach the child through the entry-point registry; backends and devices
registered at run time in the parent don't exist there: pass ``process_initializer`` (a
picklable, module-level function) to the Orchestrator to register them in each child.
Init-only option changes are set and rebuilt at the next execute boundary in the child
(never prepared concurrently), options in force are mirrored after every execute.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from .. import errors as _errors
from ..errors import Error, OrchestraError
from ..program import dumps
from ..runtime import MethodStatistics, Program, TensorInfo, load_program

__all__ = ["RemoteMethod"]

_ALIGN = 64


def _layout(infos: Sequence[Any], start: int) -> tuple[list[tuple[int, np.dtype, tuple[int, ...]] | None], int]:
    """Offsets of the tensors of ``infos`` (their static shape or upper bound)."""
    out: list[tuple[int, np.dtype, tuple[int, ...]] | None] = []
    off = start
    for info in infos:
        if isinstance(info, TensorInfo) and info.dtype is not None:
            off = -(-off // _ALIGN) * _ALIGN
            out.append((off, np.dtype(info.dtype), tuple(info.shape)))
            off += math.prod(info.shape) * np.dtype(info.dtype).itemsize
        else:
            out.append(None)
    return out, off


def _view(buf: Any, slot: tuple[int, np.dtype, tuple[int, ...]], shape: tuple[int, ...]) -> np.ndarray:
    off, dtype, _ = slot
    return np.ndarray(shape, dtype, buffer=buf, offset=off) if math.prod(shape) else np.empty(shape, dtype)


class _Views:
    """Views into the shared block, cached per (tensor, shape)."""

    def __init__(self, buf: Any, slots: list) -> None:
        self.buf = buf
        self.slots = slots
        self.cache: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def get(self, k: int, shape: tuple[int, ...]) -> np.ndarray:
        v = self.cache.get((k, shape))
        if v is None:
            if len(self.cache) > 256:
                self.cache.clear()
            v = self.cache[(k, shape)] = _view(self.buf, self.slots[k], shape)
        return v


def _describe(exc: BaseException) -> tuple[str, str, int | None, list[str]]:
    chain = []
    c = exc.__cause__
    while c is not None and len(chain) < 5:
        chain.append(f"{type(c).__name__}: {c}")
        c = c.__cause__
    code = int(exc.code) if isinstance(exc, OrchestraError) else None
    return type(exc).__name__, str(exc), code, chain


def _rebuild(info: tuple[str, str, int | None, list[str]], where: str) -> OrchestraError:
    name, message, code, chain = info
    cls = getattr(_errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, OrchestraError)) or cls is _errors.ConfigError:
        cls, message = OrchestraError, (message if code is not None else f"{name}: {message}")
    exc = cls(message, Error(code) if code is not None else Error.Internal)
    cause: BaseException | None = None
    for text in reversed(chain):
        nxt = RuntimeError(f"{text} (in the worker process of {where})")
        nxt.__cause__ = cause
        cause = nxt
    exc.__cause__ = cause
    return exc


def _in_force(m: Any) -> dict[str, dict[str, Any]]:
    return {b: m.backend_options(b) for b in m.meta.backends}


def _child(conn: Any, program_ref: Any, method_name: str, options: Mapping[str, Mapping[str, Any]],
           cpus: tuple[int, ...] | None, shm_name: str, in_slots: list, out_slots: list,
           initializer: Callable[[], None] | None) -> None:
    """The worker process: load, then serve requests from the pipe one at a time."""
    shm = None
    m = None
    try:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        if initializer is not None:
            initializer()
        m = load_program(program_ref).load_method(method_name, backend_options=options)
        shm = shared_memory.SharedMemory(name=shm_name)
        ins, outs_v = _Views(shm.buf, in_slots), _Views(shm.buf, out_slots)
        conn.send(("ready", _in_force(m)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", _describe(exc)))
        return
    changed = False
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            kind = msg[0]
            if kind == "exec":
                _, shapes, scalars, overrides = msg
                inputs = [scalars[k] if slot is None else ins.get(k, shapes[k]) for k, slot in enumerate(in_slots)]
                t0 = time.perf_counter()
                try:
                    outs = m.execute(inputs, overrides)
                except BaseException as exc:  # noqa: BLE001
                    conn.send(("error", _describe(exc)))
                    continue
                dt = time.perf_counter() - t0
                oshapes, oscalars = [], []
                for k, (slot, v) in enumerate(zip(out_slots, outs)):
                    if slot is not None and isinstance(v, np.ndarray):
                        np.copyto(outs_v.get(k, v.shape), v)
                        oshapes.append(v.shape)
                        oscalars.append(None)
                    else:
                        oshapes.append(None)
                        oscalars.append(v)
                forced = _in_force(m) if changed else None
                changed = False
                conn.send(("ok", oshapes, oscalars, dt, forced))
            elif kind == "options":
                try:
                    for b, vals in msg[1].items():
                        m.set_backend_options(b, vals)
                    changed = True
                    conn.send(("ok",))
                except BaseException as exc:  # noqa: BLE001
                    conn.send(("error", _describe(exc)))
            elif kind == "stats":
                conn.send(("ok", m.statistics()))
            elif kind == "stop":
                return
    finally:
        if m is not None:
            m.close()
        if shm is not None:
            ins = outs_v = None  # drop the views before closing the block
            shm.close()


class RemoteMethod:
    """A Method in a worker process, driven from one thread (the instance's worker)."""

    supports_prepare = False

    def __init__(self, program: Program, method_name: str, options: Mapping[str, Mapping[str, Any]],
                 cpus: tuple[int, ...] | None, initializer: Callable[[], None] | None, where: str) -> None:
        self.where = where
        self.meta = program.method_meta(method_name)
        self._in, end = _layout(self.meta.inputs, 0)
        self._out, end = _layout(self.meta.outputs, end)
        self._shm = shared_memory.SharedMemory(create=True, size=max(end, 1))
        self._ins, self._outs = _Views(self._shm.buf, self._in), _Views(self._shm.buf, self._out)
        src = program.source
        ref: Any = src if src not in ("<bytes>", "<ProgramDef>") and pathlib.Path(src).is_file() else dumps(program.definition)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, name=f"orchestra:{where}",
                                 args=(child, ref, method_name, {b: dict(v) for b, v in options.items()}, cpus,
                                       self._shm.name, self._in, self._out, initializer), daemon=True)
        self._closed = False
        try:
            self._proc.start()
            child.close()
            reply = self._recv()
        except BaseException:
            self.close()
            raise
        if reply[0] != "ready":
            self.close()
            raise _rebuild(reply[1], where)
        self._forced: dict[str, dict[str, Any]] = reply[1]
        self._executions = self._failures = 0
        self._total = self._last = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _recv(self) -> Any:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.exitcode
            raise OrchestraError(f"{self.where}: the worker process exited (exit code {code})", Error.Internal) from None

    def _send(self, msg: Any) -> None:
        try:
            self._conn.send(msg)
        except (OSError, ValueError):
            raise OrchestraError(f"{self.where}: the worker process is gone", Error.Internal) from None

    def execute(self, inputs: Sequence[Any], backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Any]:
        if self._closed:
            raise OrchestraError(f"{self.where}: execute on a closed worker process", Error.InvalidState)
        infos = self.meta.inputs
        if len(inputs) != len(infos):
            raise _errors.InvalidArgumentError(f"{self.where}: expected {len(infos)} inputs, got {len(inputs)}")
        views = self._ins
        shapes: list[Any] = []
        scalars: list[Any] = []
        for k, (slot, x) in enumerate(zip(self._in, inputs)):
            if slot is None:
                shapes.append(None)
                scalars.append(x)
                continue
            _, dtype, bound = slot
            if not isinstance(x, np.ndarray):
                x = np.asarray(x)
            if x.dtype != dtype or len(x.shape) != len(bound) or any(s > b for s, b in zip(x.shape, bound)):
                raise _errors.InvalidArgumentError(
                    f"{self.where}: input {k}: {x.dtype} {list(x.shape)} does not fit the program's {dtype} {list(bound)}")
            np.copyto(views.get(k, x.shape), x)
            shapes.append(x.shape)
            scalars.append(None)
        self._send(("exec", shapes, scalars, backend_options))
        reply = self._recv()
        if reply[0] != "ok":
            self._failures += 1
            raise _rebuild(reply[1], self.where)
        _, oshapes, oscalars, dt, forced = reply
        if forced is not None:
            self._forced = forced
        self._executions += 1
        self._total += dt
        self._last = dt
        outs = self._outs
        return [v if shape is None else np.array(outs.get(k, shape), copy=True)
                for k, (shape, v) in enumerate(zip(oshapes, oscalars))]

    def set_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        self._send(("options", {backend_id: dict(values)}))
        reply = self._recv()
        if reply[0] != "ok":
            raise _rebuild(reply[1], self.where)

    prepare_backend_options = set_backend_options

    def backend_options(self, backend_id: str) -> dict[str, Any]:
        return dict(self._forced.get(backend_id, {}))

    def statistics(self) -> MethodStatistics:
        return MethodStatistics(self._executions, self._failures, self._total, self._last,
                                self.meta.planned_bytes, 0, 0)

    def kill(self) -> None:
        """Ends the process at once (a stuck execute: its caller was already answered)."""
        if self._proc.is_alive():
            self._proc.kill()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.is_alive():
                try:
                    self._conn.send(("stop",))
                except (OSError, ValueError):
                    pass
                self._proc.join(10)
                if self._proc.is_alive():
                    self._proc.kill()
                    self._proc.join(5)
        except (AssertionError, ValueError):  # never started
            pass
        finally:
            self._conn.close()
            self._ins = self._outs = None  # type: ignore[assignment]
            try:
                self._shm.close()
            except BufferError:  # a view is still referenced somewhere; the unlink still frees the name
                pass
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"<RemoteMethod {self.where} pid={self._proc.pid}>"
