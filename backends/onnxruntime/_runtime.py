"""The runtime half: ``OnnxRuntimeBackend`` runs a delegate's ONNX model with onnxruntime.

The processed blob is the ONNX model's bytes. ``init`` creates one
``onnxruntime.InferenceSession`` per delegate of each Method, with ``SessionOptions`` built
from that Method's init-only options; ``execute`` runs it with a ``RunOptions`` built from the
hot options (cached in the handle, keyed by the hot values).

When every output has a static shape, the Method's planned arrays are bound to the session
(``io_binding``): onnxruntime reads the inputs and writes the outputs in place, and each
execute whose arguments are the arrays bound last time is one ``run_with_iobinding`` call.
Otherwise (dynamic shapes, other arrays) ``execute`` feeds ``session.run`` and copies results
into the output arrays, or replaces an output whose shape changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from orchestra.errors import BackendError, Error, InvalidArgumentError
from orchestra.program import CompileSpec
from orchestra.runtime import BackendExecutionContext, BackendInitContext, BackendInterface, OptionSpec, RuntimeSpecs

from ._common import BACKEND_ID, check_names, names_from_specs

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeHandle"]

# onnxruntime's tensor type names -> numpy dtypes orchestra can hold.
_ORT_DTYPES: Mapping[str, np.dtype] = MappingProxyType({
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
})

_EXECUTION_MODES = MappingProxyType({"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"})
_OPT_LEVELS = MappingProxyType({"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"})

# A handle keeps at most this many prepared RunOptions (per-call overrides with ever new
# run tags must not grow it without end).
_RUN_OPTIONS_CACHE = 16


def _ort() -> Any:
    import onnxruntime  # lazily: orchestra imports without the onnx extra

    return onnxruntime


class OnnxRuntimeHandle:
    """One delegate's onnxruntime state in one Method.

    Attributes:
        session: the ``onnxruntime.InferenceSession`` (None once destroyed).
        input_names, output_names: the model's names in the DelegateCall's argument order.
        run_options: the ``RunOptions`` of the last execute; ``run_options_cache`` maps hot
            option values (in :attr:`OnnxRuntimeBackend.hot_option_names` order) to prepared
            ``RunOptions``.
        binding: the session's ``IOBinding`` over :attr:`bound` (the argument arrays bound
            last), or None; ``bindable`` says whether this model may use one.
    """

    __slots__ = ("session", "input_names", "output_names", "where", "n_inputs", "n_args", "input_checks",
                 "output_dtypes", "output_shapes", "specs", "run_options", "run_options_cache", "bindable",
                 "binding", "bound", "misses", "__weakref__")

    def __init__(self, session: Any, input_names: tuple[str, ...], output_names: tuple[str, ...], where: str,
                 input_checks: tuple[tuple[str, np.dtype, tuple[int, ...] | None, tuple[int | None, ...] | None], ...],
                 output_dtypes: tuple[np.dtype, ...], output_shapes: tuple[tuple[int, ...] | None, ...],
                 bindable: bool) -> None:
        self.session = session
        self.input_names = input_names
        self.output_names = list(output_names)  # session.run takes a list
        self.where = where
        self.n_inputs = len(input_names)
        self.n_args = len(input_names) + len(output_names)
        self.input_checks = input_checks
        self.output_dtypes = output_dtypes
        self.output_shapes = output_shapes  # static shape per output, or None when dynamic
        self.bindable = bindable
        self.binding: Any = None
        self.bound: tuple[Any, ...] = ()
        self.misses = 0  # executes in a row that brought other arrays than the bound ones
        self.specs: RuntimeSpecs | None = None
        self.run_options: Any = None
        self.run_options_cache: dict[tuple[Any, ...], Any] = {}

    def __repr__(self) -> str:
        state = "destroyed" if self.session is None else "live"
        return f"<OnnxRuntimeHandle {self.where} inputs={list(self.input_names)} outputs={self.output_names} {state}>"


def _values(specs: Mapping[str, Any], option_specs: Sequence[OptionSpec]) -> dict[str, Any]:
    """Every option's value (declared defaults fill any the snapshot lacks)."""
    values = {s.name: s.default for s in option_specs}
    values.update(specs)
    return values


def _dims(shape: Any) -> tuple[int | None, ...] | None:
    """onnxruntime's shape (ints, symbolic names or None per dim) as ints and Nones."""
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) and d > 0 else None for d in shape)


class OnnxRuntimeBackend(BackendInterface):
    """Runs ONNX models (the delegate blob is the model's bytes) with onnxruntime.

    Init-only options build the session's ``SessionOptions`` (a change re-creates the
    session at the next execute boundary); hot options build the ``RunOptions`` of each run.
    See ``backends/onnxruntime/README.md``.
    """

    install_hint = "it needs onnxruntime: pip install 'orchestra[onnx]'"
    option_specs = (
        OptionSpec("intra_op_num_threads", int, 1, doc="threads inside one operator (0: onnxruntime's default, one per core)"),
        OptionSpec("inter_op_num_threads", int, 1, doc="threads running operators in parallel when execution_mode is 'parallel' (0: onnxruntime's default)"),
        OptionSpec("execution_mode", str, "sequential", choices=tuple(_EXECUTION_MODES), doc="run operators one by one or in parallel"),
        OptionSpec("graph_optimization_level", str, "all", choices=tuple(_OPT_LEVELS), doc="onnxruntime graph optimizations applied when the session is created"),
        OptionSpec("providers", str, "CPUExecutionProvider", doc="comma-separated execution providers, in priority order"),
        OptionSpec("intra_op_thread_affinities", str, "", doc="onnxruntime's session.intra_op_thread_affinities: intra_op_num_threads - 1 entries, processor ids from 1, e.g. '1;2' for 3 threads ('' = none)"),
        OptionSpec("allow_spinning", bool, True, doc="let idle onnxruntime threads spin (faster wake-up, burns power)"),
        OptionSpec("enable_cpu_mem_arena", bool, True, doc="onnxruntime's CPU memory arena"),
        OptionSpec("enable_mem_pattern", bool, True, doc="pre-plan memory from the first run's allocation pattern"),
        OptionSpec("io_binding", bool, True, doc="bind the Method's planned arrays so onnxruntime reads and writes them in place (static shapes)"),
        OptionSpec("log_severity_level", int, 2, choices=(0, 1, 2, 3, 4), hot=True, doc="per-run log level: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal"),
        OptionSpec("run_tag", str, "", hot=True, doc="tag in onnxruntime's log lines of each run (RunOptions.logid)"),
        OptionSpec("shrink_arena", bool, False, hot=True, doc="shrink the CPU memory arena after each run (less memory held between runs, slower runs)"),
    )
    hot_option_names: tuple[str, ...] = tuple(s.name for s in option_specs if s.hot)

    def is_available(self) -> bool:
        try:
            _ort()
        except ImportError:
            return False
        return True

    # -- init -----------------------------------------------------------------------------
    def _session_options(self, ort: Any, values: Mapping[str, Any], where: str) -> Any:
        so = ort.SessionOptions()
        for key in ("intra_op_num_threads", "inter_op_num_threads"):
            n = values[key]
            if n < 0:
                raise InvalidArgumentError(f"{where}: backend {BACKEND_ID!r} option {key!r} must be >= 0 (0: onnxruntime's default), got {n}")
            setattr(so, key, n)
        so.execution_mode = getattr(ort.ExecutionMode, _EXECUTION_MODES[values["execution_mode"]])
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[values["graph_optimization_level"]])
        so.enable_cpu_mem_arena = values["enable_cpu_mem_arena"]
        so.enable_mem_pattern = values["enable_mem_pattern"]
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if values["allow_spinning"] else "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "1" if values["allow_spinning"] else "0")
        if values["intra_op_thread_affinities"]:
            so.add_session_config_entry("session.intra_op_thread_affinities", values["intra_op_thread_affinities"])
        return so

    def _providers(self, ort: Any, text: str, where: str) -> list[str]:
        available = ort.get_available_providers()
        providers = [p.strip() for p in text.split(",") if p.strip()]
        if not providers:
            raise BackendError(f"{where}: backend {BACKEND_ID!r} option 'providers' names no provider (available: {', '.join(available)})")
        for p in providers:
            if p not in available:
                raise BackendError(
                    f"{where}: backend {BACKEND_ID!r} option 'providers': execution provider {p!r} is not available "
                    f"in this onnxruntime build (available: {', '.join(available)})"
                )
        return providers

    def init(self, context: BackendInitContext, processed: memoryview, compile_specs: tuple[CompileSpec, ...]) -> OnnxRuntimeHandle:
        ort = _ort()
        where = f"method {context.method_name!r}: delegate {context.delegate_index} ({context.backend_id or BACKEND_ID})"
        values = _values(context.runtime_specs, self.option_specs)
        providers = self._providers(ort, values["providers"], where)
        so = self._session_options(ort, values, where)
        try:
            session = ort.InferenceSession(bytes(processed), sess_options=so, providers=providers)
        except Exception as exc:
            raise BackendError(f"{where}: onnxruntime could not create a session from the delegate's ONNX model "
                               f"({len(processed)} bytes): {type(exc).__name__}: {exc}") from exc
        model_inputs = {i.name: i for i in session.get_inputs()}
        model_outputs = {o.name: o for o in session.get_outputs()}
        input_names, output_names = check_names(
            names_from_specs(compile_specs, where, strict=False), tuple(model_inputs), tuple(model_outputs), where)
        checks = []
        for name in input_names:
            arg = model_inputs[name]
            dtype = _ORT_DTYPES.get(arg.type)
            if dtype is None:
                raise BackendError(f"{where}: model input {name!r} has type {arg.type}, which orchestra can't pass "
                                   f"(supported: {', '.join(_ORT_DTYPES)})", Error.NotSupported)
            dims = _dims(arg.shape)
            static = dims if dims is not None and None not in dims else None
            checks.append((name, dtype, static, dims))
        out_dtypes, out_shapes = [], []
        for name in output_names:
            dtype = _ORT_DTYPES.get(model_outputs[name].type)
            if dtype is None:
                raise BackendError(f"{where}: model output {name!r} has type {model_outputs[name].type}, which orchestra "
                                   f"can't hold (supported: {', '.join(_ORT_DTYPES)})", Error.NotSupported)
            out_dtypes.append(dtype)
            dims = _dims(model_outputs[name].shape)
            out_shapes.append(dims if dims is not None and None not in dims else None)
        bindable = values["io_binding"] and None not in out_shapes
        handle = OnnxRuntimeHandle(session, input_names, output_names, where, tuple(checks), tuple(out_dtypes),
                                   tuple(out_shapes), bindable)
        self._use_run_options(handle, context.runtime_specs)
        return handle

    # -- execute ----------------------------------------------------------------------------
    def _use_run_options(self, handle: OnnxRuntimeHandle, specs: RuntimeSpecs) -> Any:
        """The RunOptions for ``specs``' hot values: from the handle's cache, or built once."""
        values = _values(specs, self.option_specs)
        key = tuple(values[n] for n in self.hot_option_names)
        cache = handle.run_options_cache
        ro = cache.get(key)
        if ro is None:
            ro = _ort().RunOptions()
            ro.log_severity_level = values["log_severity_level"]
            ro.logid = values["run_tag"]
            if values["shrink_arena"] and values["enable_cpu_mem_arena"]:  # no arena: nothing to shrink
                ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
            # No graph capture (a CPU run never captures). Set explicitly, it also spares
            # run_with_iobinding the cost of looking up a missing entry (a raised exception).
            ro.add_run_config_entry("gpu_graph_id", "-1")
            if len(cache) >= _RUN_OPTIONS_CACHE:
                del cache[next(iter(cache))]
            cache[key] = ro
        handle.specs = specs
        handle.run_options = ro
        return ro

    def _bad_input(self, handle: OnnxRuntimeHandle, i: int, a: Any) -> InvalidArgumentError:
        name, dtype, _, dims = handle.input_checks[i]
        want = "?" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        if not isinstance(a, np.ndarray):
            got = type(a).__name__
        else:
            got = f"{a.dtype} {list(a.shape)}"
        return InvalidArgumentError(f"{handle.where}: model input {name!r} (argument {i}) expects {dtype} {want}, got {got}")

    def _bind(self, handle: OnnxRuntimeHandle, args: list[Any]) -> bool:
        """Binds ``args`` (inputs already checked) to a new IOBinding when they allow it:
        C-contiguous arrays, outputs writeable with the model's static shapes and dtypes, no
        output overlapping another argument."""
        n = handle.n_inputs
        outs = args[n:]
        for o, shape, dtype in zip(outs, handle.output_shapes, handle.output_dtypes):
            if not (isinstance(o, np.ndarray) and o.shape == shape and o.dtype == dtype
                    and o.flags.c_contiguous and o.flags.writeable):
                return False
        if not all(a.flags.c_contiguous for a in args[:n]):
            return False
        for k, o in enumerate(outs, n):
            if any(np.may_share_memory(o, a) for j, a in enumerate(args) if j != k):
                return False
        io = handle.session.io_binding()
        for name, a in zip(handle.input_names, args):
            io.bind_cpu_input(name, a)  # zero copy: onnxruntime reads the array at each run
        for name, o in zip(handle.output_names, outs):
            io.bind_output(name, "cpu", 0, o.dtype.type, list(o.shape), o.ctypes.data)
        handle.binding, handle.bound = io, tuple(args)
        return True

    def execute(self, context: BackendExecutionContext, handle: OnnxRuntimeHandle, args: list[Any]) -> None:
        specs = context.runtime_specs
        ro = handle.run_options if specs is handle.specs else self._use_run_options(handle, specs)
        bound = handle.bound
        if bound and len(args) == len(bound):
            # The arrays checked and bound last time (the Method's planned arrays keep their
            # identity, dtype and shape between executes): run in place.
            for a, b in zip(args, bound):
                if a is not b:
                    break
            else:
                handle.misses = 0
                try:
                    handle.session.run_with_iobinding(handle.binding, ro)
                except Exception as exc:
                    raise BackendError(f"{handle.where}: onnxruntime run failed: {type(exc).__name__}: {exc}", Error.Internal) from exc
                return
        if len(args) != handle.n_args:
            raise InvalidArgumentError(f"{handle.where}: the DelegateCall passes {len(args)} values; the model takes "
                                       f"{handle.n_inputs} inputs and returns {handle.n_args - handle.n_inputs} outputs")
        i = 0
        for _, dtype, static, dims in handle.input_checks:
            a = args[i]
            if not isinstance(a, np.ndarray) or a.dtype != dtype:
                raise self._bad_input(handle, i, a)
            shape = a.shape
            if shape != static and dims is not None and (
                len(shape) != len(dims) or any(d is not None and d != s for s, d in zip(shape, dims))
            ):
                raise self._bad_input(handle, i, a)
            i += 1
        session = handle.session
        if session is None:
            raise BackendError(f"{handle.where}: execute on a destroyed handle", Error.DelegateInvalidHandle)
        if handle.bindable:
            if handle.binding is not None:
                # Other arrays than those bound (a dynamic input changed shape, or inputs
                # without planned memory). Twice in a row: binding costs more than it saves.
                handle.misses += 1
                handle.bindable = handle.misses < 2
            if handle.bindable and self._bind(handle, args):
                try:
                    session.run_with_iobinding(handle.binding, ro)
                except Exception as exc:
                    handle.binding, handle.bound = None, ()
                    raise BackendError(f"{handle.where}: onnxruntime run failed: {type(exc).__name__}: {exc}", Error.Internal) from exc
                return
            handle.bindable = False  # these arrays can't be bound; the next ones won't either
        handle.binding, handle.bound = None, ()
        try:
            results = session.run(handle.output_names, dict(zip(handle.input_names, args)), ro)
        except Exception as exc:
            raise BackendError(f"{handle.where}: onnxruntime run failed: {type(exc).__name__}: {exc}", Error.Internal) from exc
        k = handle.n_inputs
        for r, dtype in zip(results, handle.output_dtypes):
            out = args[k]
            if isinstance(out, np.ndarray) and out.shape == r.shape:
                if out.dtype != dtype:
                    raise InvalidArgumentError(f"{handle.where}: model output {handle.output_names[k - handle.n_inputs]!r} "
                                               f"(argument {k}) is {dtype}, the program's tensor is {out.dtype}")
                np.copyto(out, r)
            else:
                args[k] = r  # a new shape (dynamic output): the interpreter checks it against the bound
            k += 1

    def destroy(self, handle: OnnxRuntimeHandle) -> None:
        # onnxruntime frees a session when the last reference goes.
        handle.binding, handle.bound = None, ()
        handle.session = None
        handle.specs = None
        handle.run_options = None
        handle.run_options_cache.clear()
