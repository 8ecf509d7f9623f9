"""``placement="process"``: the instance's Method lives in a worker process.

The child process (``spawn``) pins itself to the binding's CPUs (``os.sched_setaffinity``
before it loads anything, so the threads its backends start inherit the mask), loads the
program and the Method, then serves requests from a pipe one at a time, in order.

Tensors cross through one ``multiprocessing.shared_memory`` block with
:data:`PIPELINE_DEPTH` *slots* (each room for every input and output at its static shape or
upper bound): the parent copies a request's inputs into a free slot and writes a small
message (slot, shapes, scalars, per-call overrides) on the request pipe; the child executes
on views of that slot (reading its tensors in place: ``Method.execute(borrow_inputs=True)``),
copies the outputs into it and answers on the reply pipe. With two
slots the next request is already waiting in the pipe when the child finishes one, so the
child never waits for the parent between executes.

Messages are length-prefixed (4-byte little-endian length) pickles, except the two of the
common case, which skip pickle: a request whose inputs have exactly their static shapes and
no per-call overrides is the byte 0 and the slot number; its reply, when every output has its
static shape and the options in force did not change, is the byte 0 and the execute's
duration (a little-endian double). The parent side
(:class:`ProcessWorker` in ``_process_worker.py``) is driven by the event loop: it writes
requests from ``Instance.execute`` and reads replies in a ``loop.add_reader`` callback, so
an execute costs the parent a few syscalls and no thread hop. :class:`WorkerProcess` here is
the parent's handle of one child; starting it blocks (it waits for the child to load), so
the ProcessWorker starts it on a short-lived thread.

Backends reach the child through the entry-point registry; backends and devices registered
at run time in the parent don't exist there: pass ``process_initializer`` (a picklable,
module-level function) to the Orchestrator to register them in each child.
"""

from __future__ import annotations

import functools
import gc
import math
import multiprocessing as mp
import os
import pathlib
import pickle
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import shared_memory
from types import MappingProxyType
from typing import Any

import numpy as np

from .. import errors as _errors
from ..errors import Error, OrchestraError
from ..program import dumps
from ..runtime import Method, MethodMeta, Program, TensorInfo, kernels, load_program
from ._methods import Routed, load_for_worker
from ._threads import apply_blas_limit, worker_blas_env

__all__ = ["PIPELINE_DEPTH", "WorkerProcess"]

PIPELINE_DEPTH = 2  # requests a worker process may hold at once (slots of the shared block)

_ALIGN = 64
_LEN = struct.Struct("<I")
_PICKLE = pickle.HIGHEST_PROTOCOL
_MAX_MESSAGE = 1 << 30

Slot = tuple[int, np.dtype, tuple[int, ...]]


def _layout(infos: Sequence[Any], start: int) -> tuple[list[Slot | None], int]:
    """Offsets of the tensors of ``infos`` (their static shape or upper bound)."""
    out: list[Slot | None] = []
    off = start
    for info in infos:
        if isinstance(info, TensorInfo) and info.dtype is not None:
            off = -(-off // _ALIGN) * _ALIGN
            out.append((off, np.dtype(info.dtype), tuple(info.shape)))
            off += math.prod(info.shape) * np.dtype(info.dtype).itemsize
        else:
            out.append(None)
    return out, off


def _slots(meta: MethodMeta) -> tuple[list[tuple[list[Slot | None], list[Slot | None]]], int]:
    """``PIPELINE_DEPTH`` slots, each (input layout, output layout), and the block size."""
    slots = []
    end = 0
    for _ in range(PIPELINE_DEPTH):
        ins, end = _layout(meta.inputs, end)
        outs, end = _layout(meta.outputs, end)
        slots.append((ins, outs))
        end = -(-end // _ALIGN) * _ALIGN
    return slots, max(end, 1)


def _method_slots(metas: Mapping[str, MethodMeta]) -> tuple[dict[str, list[tuple[list[Slot | None], list[Slot | None]]]], int]:
    """Slot layouts for several methods of a program instance: slot ``s`` is one region (as
    large as the largest method needs) that any method's request may use, so requests of
    different methods in flight never overlap. Returns the layouts by method and the block size."""
    region = 0
    for meta in metas.values():
        _, end = _layout(meta.outputs, _layout(meta.inputs, 0)[1])
        region = max(region, -(-end // _ALIGN) * _ALIGN)
    layouts: dict[str, list[tuple[list[Slot | None], list[Slot | None]]]] = {}
    for name, meta in metas.items():
        slots = []
        for s in range(PIPELINE_DEPTH):
            ins, end = _layout(meta.inputs, s * region)
            outs, _ = _layout(meta.outputs, end)
            slots.append((ins, outs))
        layouts[name] = slots
    return layouts, max(region * PIPELINE_DEPTH, 1)


class _Views:
    """Views into the shared block, cached per (tensor, shape)."""

    def __init__(self, buf: Any, slots: list[Slot | None]) -> None:
        self.buf = buf
        self.slots = slots
        self.cache: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def get(self, k: int, shape: tuple[int, ...]) -> np.ndarray:
        v = self.cache.get((k, shape))
        if v is None:
            if len(self.cache) > 256:
                self.cache.clear()
            off, dtype, _ = self.slots[k]  # type: ignore[misc]
            v = np.ndarray(shape, dtype, buffer=self.buf, offset=off) if math.prod(shape) else np.empty(shape, dtype)
            self.cache[(k, shape)] = v
        return v


def frame(msg: Any) -> bytes:
    """One message on a pipe: its length, then its pickle."""
    body = pickle.dumps(msg, _PICKLE)
    return _LEN.pack(len(body)) + body


_FAST_REQUEST = struct.Struct("<IBB")  # length 2, 0, slot
_FAST_REPLY = struct.Struct("<IBd")  # length 9, 0, duration


def fast_request(slot: int) -> bytes:
    return _FAST_REQUEST.pack(2, 0, slot)


def fast_reply(dt: float) -> bytes:
    return _FAST_REPLY.pack(9, 0, dt)


def unframe(buf: bytearray) -> list[Any]:
    """Takes every whole message off the front of ``buf`` (the rest stays)."""
    out = []
    pos = 0
    n = len(buf)
    while n - pos >= 4:
        (size,) = _LEN.unpack_from(buf, pos)
        if size > _MAX_MESSAGE:
            raise OrchestraError(f"worker process pipe: message of {size} bytes (corrupt stream)", Error.Internal)
        if n - pos - 4 < size:
            break
        if size and buf[pos + 4] == 0:  # a fast request (its slot, an int) or reply (its duration, a float)
            out.append(buf[pos + 5] if size == 2 else _FAST_REPLY.unpack_from(buf, pos)[2])
        else:
            out.append(pickle.loads(memoryview(buf)[pos + 4:pos + 4 + size]))
        pos += 4 + size
    if pos:
        del buf[:pos]
    return out


def describe_error(exc: BaseException) -> tuple[str, str, int | None, list[str]]:
    chain = []
    c = exc.__cause__
    while c is not None and len(chain) < 5:
        chain.append(f"{type(c).__name__}: {c}")
        c = c.__cause__
    code = int(exc.code) if isinstance(exc, OrchestraError) else None
    return type(exc).__name__, str(exc), code, chain


def rebuild_error(info: tuple[str, str, int | None, list[str]], where: str) -> OrchestraError:
    """The parent's copy of an error raised in a worker process (same class when it is an
    orchestra error, its cause chain as text)."""
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
    return {b: dict(v) for b, v in m.options().items()}


def _reply(out_slots: list[Slot | None], outs_v: _Views, outs: list[Any], dt: float, m: Any) -> tuple:
    """An ``ok`` reply: tensor outputs copied into the slot (their shapes sent), others sent
    as they are; the options in force when ``m`` is given (they changed)."""
    oshapes: list[Any] = []
    oscalars: list[Any] = []
    for k, (slot, v) in enumerate(zip(out_slots, outs)):
        if slot is not None and isinstance(v, np.ndarray):
            np.copyto(outs_v.get(k, v.shape), v)
            oshapes.append(v.shape)
            oscalars.append(None)
        else:
            oshapes.append(None)
            oscalars.append(v)
    return ("ok", oshapes, oscalars, dt, _in_force(m) if m is not None else None)


class _Reader:
    """Blocking message reader of the child."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.ready: list[Any] = []

    def next(self) -> Any:
        while not self.ready:
            data = os.read(self.fd, 1 << 16)
            if not data:
                raise EOFError
            self.buf += data
            self.ready = unframe(self.buf)
            self.ready.reverse()
        return self.ready.pop()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child(requests: Any, replies: Any, program_ref: Any, method_name: str, options: Mapping[str, Mapping[str, Any]],
           cpus: tuple[int, ...] | None, shm_name: str, slots: list, initializer: Callable[[], None] | None,
           methods: tuple[str, ...] = (), layouts: Mapping[str, list] | None = None,
           blas_threads: int | None = None) -> None:
    """The worker process: load, then serve requests from the pipe one at a time."""
    rfd, wfd = requests.fileno(), replies.fileno()
    shm = None
    m = None
    try:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        blas = apply_blas_limit(blas_threads)  # None: the user's environment decides
        if initializer is not None:
            initializer()
        m = load_for_worker(load_program(program_ref), method_name, methods, options)
        shm = shared_memory.SharedMemory(name=shm_name)
        views = [(_Views(shm.buf, i), _Views(shm.buf, o)) for i, o in slots]
        # another method of a program instance: its own views of the same slots ("xm" requests)
        mviews = {n: [(_Views(shm.buf, i), _Views(shm.buf, o)) for i, o in sl] for n, sl in (layouts or {}).items()}
        # per slot: the inputs at their static shapes (a fast request's), the outputs' views
        static_in = [[None if sl is None else views[s][0].get(k, sl[2]) for k, sl in enumerate(i)]
                     for s, (i, _) in enumerate(slots)]
        static_out = [[(None, None) if sl is None else (views[s][1].get(k, sl[2]), sl[2]) for k, sl in enumerate(o)]
                      for s, (_, o) in enumerate(slots)]
        # The collector's first full pass over this process's heap (tens of ms), here rather
        # than in the middle of the first requests (see orchestra._run._collect_before_frames)
        gc.collect()
        _write_all(wfd, frame(("ready", _in_force(m), blas)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        try:
            _write_all(wfd, frame(("error", describe_error(exc))))
        except OSError:
            pass
        return
    reader = _Reader(rfd)
    perf = time.perf_counter
    # the request's tensors are read where they are, in the shared block (the parent writes
    # the next request into the other slot), rather than copied into the Method's memory
    execute = functools.partial(m.execute, borrow_inputs=True) if type(m) is Method else m.execute
    # After each execute the compiled kernels' pool threads stop spinning (kernels.rest): the
    # reply wakes the parent, which then finds their CPU free instead of preempting this
    # thread as it starts the next request (one CPU each, with two compute threads)
    rest = kernels.rest
    changed = False
    ins = outs_v = inputs = None
    lock = threading.Lock()  # replies come from this thread and from a preparing one

    def send(data: bytes) -> None:
        with lock:
            _write_all(wfd, data)

    prepared = [False]  # set by the preparing thread: the options in force change at the next execute
    prep: threading.Thread | None = None

    def prepare(cid: int, backend: str, values: Mapping[str, Any]) -> None:
        try:
            m.prepare_backend_options(backend, values)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            send(frame(("prep", cid, describe_error(exc))))
        else:
            prepared[0] = True
            send(frame(("prep", cid, None)))

    try:
        while True:
            try:
                msg = reader.next()
            except (EOFError, OSError):
                return
            if type(msg) is int:  # fast request: inputs at their static shapes in slot ``msg``
                s = msg
                t0 = perf()
                try:
                    outs = execute(static_in[s], None)
                except BaseException as exc:  # noqa: BLE001
                    send(frame(("error", describe_error(exc))))
                    continue
                dt = perf() - t0
                if prepared[0]:
                    prepared[0] = False
                    changed = True
                fast = not changed
                for (view, shape), v in zip(static_out[s], outs):
                    if view is not None and type(v) is np.ndarray and v.shape == shape:
                        np.copyto(view, v)
                    else:
                        fast = False
                        break
                rest()
                if fast:
                    send(fast_reply(dt))
                else:
                    send(frame(_reply(slots[s][1], views[s][1], outs, dt, m if changed else None)))
                    changed = False
                continue
            kind = msg[0]
            if kind == "x":
                _, s, shapes, scalars, overrides = msg
                ins, outs_v = views[s]
                in_slots = slots[s][0]
                inputs = [scalars[k] if slot is None else ins.get(k, shapes[k]) for k, slot in enumerate(in_slots)]
                t0 = perf()
                try:
                    outs = execute(inputs, overrides)
                except BaseException as exc:  # noqa: BLE001
                    reply: Any = ("error", describe_error(exc))
                else:
                    if prepared[0]:
                        prepared[0] = False
                        changed = True
                    reply = _reply(slots[s][1], outs_v, outs, perf() - t0, m if changed else None)
                    changed = False
                rest()
                send(frame(reply))
            elif kind == "xm":  # a request for another method of the program instance
                _, name, s, shapes, scalars, overrides = msg
                mins, mouts = mviews[name][s]
                in_slots, out_slots = layouts[name][s]  # type: ignore[index]
                minputs = [scalars[k] if slot is None else mins.get(k, shapes[k]) for k, slot in enumerate(in_slots)]
                t0 = perf()
                try:
                    outs = execute(Routed(name, minputs), overrides)
                except BaseException as exc:  # noqa: BLE001
                    reply = ("error", describe_error(exc))
                else:
                    if prepared[0]:
                        prepared[0] = False
                        changed = True
                    reply = _reply(out_slots, mouts, outs, perf() - t0, m if changed else None)
                    changed = False
                minputs = mins = mouts = None
                rest()
                send(frame(reply))
            elif kind == "p":  # one backend's init-only change: built on a thread, swapped at a boundary
                if prep is not None:
                    prep.join()  # a change waits until the one before it is published
                prep = threading.Thread(target=prepare, args=msg[1:], name="orchestra:prepare", daemon=True)
                prep.start()
            elif kind == "o":
                if prep is not None:
                    prep.join()
                    prep = None
                try:  # in force at once: the process is between executes here
                    m.set_options(msg[1])
                    m.commit_options()
                except BaseException as exc:  # noqa: BLE001
                    send(frame(("error", describe_error(exc))))
                else:
                    send(frame(("ok", _in_force(m))))
            elif kind == "c":  # put a prepared change in force now (between executes)
                if prep is not None:
                    prep.join()
                    prep = None
                try:
                    m.commit_options()
                except BaseException as exc:  # noqa: BLE001
                    send(frame(("error", describe_error(exc))))
                else:
                    prepared[0] = False
                    send(frame(("ok", _in_force(m))))
            elif kind == "t":  # the CPUs changed: so does the BLAS limit (before the next execute)
                apply_blas_limit(msg[1])
            elif kind == "s":
                return
    finally:
        if prep is not None:
            prep.join()
        m.close()
        views = ins = outs_v = inputs = mviews = None  # drop the views before closing the block
        try:
            shm.close()
        except BufferError:  # pragma: no cover - a view survived; the process exits anyway
            pass


_env_lock = threading.Lock()


def _start_with_env(proc: Any, extra: Mapping[str, str]) -> None:
    """Starts ``proc`` (spawn: a fresh interpreter inheriting ``os.environ``) with ``extra``
    in its environment, which must be there before the child loads numpy; this process's
    environment is restored at once (other workers started meanwhile wait on the lock)."""
    if not extra:
        proc.start()
        return
    with _env_lock:
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class WorkerProcess:
    """The parent's handle of one worker process (see the module docstring).

    Construction blocks until the child has loaded the Method (or raises what it raised).
    Afterwards everything is non-blocking and meant for one thread (the event loop's):
    :meth:`send_execute` / :meth:`send_options` write requests, :attr:`fd` becomes
    readable when replies arrive, :meth:`read` returns them in request order.
    """

    def __init__(self, program: Program, method_name: str, options: Mapping[str, Mapping[str, Any]],
                 cpus: tuple[int, ...] | None, initializer: Callable[[], None] | None, where: str,
                 *, methods: tuple[str, ...] = (), blas_threads: int | None = None) -> None:
        self.where = where
        self.meta = program.method_meta(method_name)
        # methods: a program instance; requests whose inputs are Routed go to the method named
        names = tuple(dict.fromkeys((method_name, *methods))) if methods else ()
        layouts: dict[str, Any] = {}
        if names:
            self._metas = {n: program.method_meta(n) for n in names}
            layouts, size = _method_slots(self._metas)
            self._slots = layouts.pop(method_name)
        else:
            self._slots, size = _slots(self.meta)
        self._layouts = layouts
        self._slot_method: list[str | None] = [None] * PIPELINE_DEPTH  # per slot: "xm" method in flight
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        self._views = [(_Views(self._shm.buf, i), _Views(self._shm.buf, o)) for i, o in self._slots]
        self._mviews = {n: [(_Views(self._shm.buf, i), _Views(self._shm.buf, o)) for i, o in sl] for n, sl in layouts.items()}
        src = program.source
        ref: Any = src if src not in ("<bytes>", "<ProgramDef>") and pathlib.Path(src).is_file() else dumps(program.definition)
        ctx = mp.get_context("spawn")
        req_r, self._req = ctx.Pipe(duplex=False)
        self._rep, rep_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, name=f"orchestra:{where}",
                                 args=(req_r, rep_w, ref, method_name, {b: dict(v) for b, v in options.items()}, cpus,
                                       self._shm.name, self._slots, initializer, names, layouts, blas_threads),
                                 daemon=True)
        self._closed = False
        self._buf = bytearray()
        self._out = bytearray()  # request bytes the pipe did not take yet
        self.fd = self._rep.fileno()
        self._wfd = self._req.fileno()
        try:
            _start_with_env(self._proc, worker_blas_env())
            req_r.close()
            rep_w.close()
            reply = self._first_reply()
        except BaseException:
            self.close()
            raise
        if reply[0] != "ready":
            self.close()
            raise rebuild_error(reply[1], where)
        self.forced: dict[str, dict[str, Any]] = reply[1]
        self.blas: int | None = reply[2]  # BLAS/OpenMP threads in force in the child
        self._fast_path()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wfd, False)

    def _first_reply(self) -> Any:
        reader = _Reader(self.fd)
        try:
            return reader.next()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            raise OrchestraError(f"{self.where}: the worker process exited while loading (exit code {code})",
                                 Error.Internal) from None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def exitcode(self) -> int | None:
        return self._proc.exitcode

    # -- requests ---------------------------------------------------------------------------
    def _fast_path(self) -> None:
        """Per slot: views of every input at its static shape and the request message to send
        when the inputs have exactly those shapes and there are no per-call overrides."""
        self._fast: list[tuple[list[tuple[np.ndarray, np.dtype, tuple[int, ...]]], bytes] | None] = []
        for s, (ins, _) in enumerate(self._slots):
            if not ins or any(sl is None for sl in ins):
                self._fast.append(None)
                continue
            views = self._views[s][0]
            self._fast.append(([(views.get(k, sl[2]), sl[1], sl[2]) for k, sl in enumerate(ins)],  # type: ignore[index]
                               fast_request(s)))
        # per slot: the outputs at their static shapes (what a fast reply leaves there)
        self._static_out = [[None if sl is None else self._views[s][1].get(k, sl[2]) for k, sl in enumerate(outs)]
                            for s, (_, outs) in enumerate(self._slots)]

    def send_execute(self, slot: int, inputs: Sequence[Any], overrides: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Copies ``inputs`` into ``slot`` and sends the request. Raises InvalidArgumentError
        (nothing sent) when an input does not fit."""
        if type(inputs) is Routed:
            name = inputs.method
            if name not in self._layouts:
                if name != self.meta.name:
                    raise _errors.InvalidArgumentError(
                        f"{self.where}: method {name!r} is not loaded in this instance "
                        f"(methods: {', '.join([self.meta.name, *self._layouts])})")
                inputs = inputs.inputs
            else:
                shapes, scalars = self._put_inputs(slot, inputs.inputs, name)
                self._write(frame(("xm", name, slot, shapes, scalars, overrides)))
                self._slot_method[slot] = name
                return
        self._slot_method[slot] = None
        fast = self._fast[slot]
        if fast is not None and overrides is None and len(inputs) == len(fast[0]):
            for (view, dtype, shape), x in zip(fast[0], inputs):
                if type(x) is not np.ndarray or x.shape != shape or x.dtype != dtype:
                    break
                np.copyto(view, x)
            else:
                self._write(fast[1])
                return
        shapes, scalars = self._put_inputs(slot, inputs)
        self._write(frame(("x", slot, shapes, scalars, overrides)))

    def _put_inputs(self, slot: int, inputs: Sequence[Any], method: str | None = None) -> tuple[list[Any], list[Any]]:
        if method is None:
            infos, views, layout = self.meta.inputs, self._views[slot][0], self._slots[slot][0]
        else:
            infos, views, layout = self._metas[method].inputs, self._mviews[method][slot][0], self._layouts[method][slot][0]
        if len(inputs) != len(infos):
            what = f" (method {method!r})" if method else ""
            raise _errors.InvalidArgumentError(f"{self.where}: expected {len(infos)} inputs{what}, got {len(inputs)}")
        shapes: list[Any] = []
        scalars: list[Any] = []
        for k, (sl, x) in enumerate(zip(layout, inputs)):
            if sl is None:
                shapes.append(None)
                scalars.append(x)
                continue
            _, dtype, bound = sl
            if not isinstance(x, np.ndarray):
                x = np.asarray(x)
            shape = x.shape
            if x.dtype != dtype or len(shape) != len(bound) or any(s > b for s, b in zip(shape, bound)):
                raise _errors.InvalidArgumentError(
                    f"{self.where}: input {k}: {x.dtype} {list(shape)} does not fit the program's {dtype} {list(bound)}")
            np.copyto(views.get(k, shape), x)
            shapes.append(shape)
            scalars.append(None)
        return shapes, scalars

    def send_options(self, changes: Mapping[str, Mapping[str, Any]]) -> None:
        """Options set at the next execute boundary in the process; answered in order."""
        self._write(frame(("o", {b: dict(v) for b, v in changes.items()})))

    def send_commit(self) -> None:
        """Puts the change prepared last in force now (answered in order, with the options
        in force then)."""
        self._write(frame(("c",)))

    def send_prepare(self, cid: int, backend_id: str, values: Mapping[str, Any]) -> None:
        """One backend's init-only change, built on a thread of the process while it keeps
        executing and swapped in at the first execute boundary after; answered out of order
        with ``("prep", cid, error or None)`` once built."""
        self._write(frame(("p", cid, backend_id, dict(values))))

    def send_blas_threads(self, n: int) -> None:
        """Limits the process's BLAS/OpenMP pools to ``n`` threads from its next execute
        (no answer)."""
        self._write(frame(("t", n)))

    def _write(self, data: bytes) -> None:
        if self._out:
            self._out += data
            return
        try:
            n = os.write(self._wfd, data)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, OSError, ValueError):
            return  # the child is gone: the reply pipe reports it (EOF)
        if n < len(data):
            self._out += memoryview(data)[n:]

    @property
    def backlog(self) -> bool:
        """Request bytes wait for room in the pipe (call :meth:`flush` when writable)."""
        return bool(self._out)

    def flush(self) -> None:
        try:
            n = os.write(self._wfd, self._out)
        except BlockingIOError:
            return
        except (BrokenPipeError, OSError, ValueError):
            self._out.clear()
            return
        del self._out[:n]

    # -- replies ------------------------------------------------------------------------------
    def read(self) -> list[Any] | None:
        """Replies that arrived (in request order); None when the child is gone."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self._buf += data
        return unframe(self._buf)

    def static_outputs(self, slot: int) -> list[Any]:
        """The outputs of a fast reply (every output a tensor at its static shape), copied."""
        return [np.array(v, copy=True) for v in self._static_out[slot]]

    def outputs(self, slot: int, shapes: list[Any], scalars: list[Any], forced: Any) -> list[Any]:
        """The outputs of an ``ok`` reply, copied out of ``slot``."""
        if forced is not None:
            self.forced = forced
        name = self._slot_method[slot]
        views = self._views[slot][1] if name is None else self._mviews[name][slot][1]
        return [v if shape is None else np.array(views.get(k, shape), copy=True)
                for k, (shape, v) in enumerate(zip(shapes, scalars))]

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        """Options in force in the child (as of its last reply), read-only."""
        return MappingProxyType({b: MappingProxyType(dict(v)) for b, v in self.forced.items()})

    # -- end ------------------------------------------------------------------------------------
    def kill(self) -> None:
        """Ends the process at once."""
        try:
            if self._proc.is_alive():
                self._proc.kill()
        except (AssertionError, ValueError):  # never started, or closed
            pass

    def close(self, timeout: float = 10.0) -> None:
        """Asks the child to finish what it holds and exit; kills it after ``timeout``.
        Blocks up to ``timeout`` (call it off the event loop)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.is_alive():
                try:
                    os.set_blocking(self._wfd, True)
                    if self._out:
                        _write_all(self._wfd, bytes(self._out))
                    _write_all(self._wfd, frame(("s",)))
                except (OSError, ValueError):
                    pass
                self._proc.join(timeout)
                if self._proc.is_alive():
                    self._proc.kill()
                    self._proc.join(5)
        except (AssertionError, ValueError):  # never started
            pass
        finally:
            self._req.close()
            self._rep.close()
            self._views = []
            self._mviews = {}
            try:
                self._shm.close()
            except BufferError:  # a view is still referenced somewhere; the unlink still frees the name
                pass
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"<WorkerProcess {self.where} pid={self._proc.pid}>"
