"""Compute threads: orchestra owns every one it causes (DESIGN, invariants).

numpy's BLAS (OpenBLAS, or MKL) and OpenMP runtimes start one thread per core in every
process that loads them. Two processes doing that on a 2-core machine make each other's
GEMMs crawl (measured: 68x slower executes), so the orchestrator sets the limits itself,
through ``threadpoolctl``:

* a worker process (``placement="process"``) gets as many compute threads as the CPUs it is
  bound to; unbound, 1 when more than one instance shares the orchestrator, else every CPU
  orchestra was given (following instances added and removed). They go to orchestra's
  compiled kernels where those are built (its products and convolutions run on their pool)
  with the BLAS/OpenMP pools at 1, else to the BLAS/OpenMP pools (:func:`apply_blas_limit`);
* thread-placed instances share their process's pools, so while the orchestrator runs any,
  it limits the process to 1 BLAS thread (restored when it closes); their parallelism comes
  from orchestra's compiled kernels (every CPU for a lone unbound instance, else 1:
  :meth:`ThreadLimits._rethread`) and its own tiling (backend thread options, e.g.
  ``NumpyCpuBackend``'s ``num_threads``, set from a CPU binding);
* orchestra's compiled kernels (``orchestra.runtime.kernels``, where built) split a call over
  that many threads (``kernels.set_threads``), or, where the user set the BLAS pools, over
  as many as those have;
* a user's own setting wins: ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` or
  ``OMP_NUM_THREADS`` in the environment (the libraries read them at load; orchestra leaves
  them alone), or ``Orchestrator(blas_threads=n)``. Either way the value in force is reported
  in each instance's ``statistics().threads``.

BLAS kernels: OpenBLAS picks its kernels from the CPU model it recognises; a CPU newer than
the OpenBLAS build (e.g. AMD family 26 under OpenBLAS 0.3.31) falls back to the Haswell
(AVX2) kernels even when the CPU has AVX-512. For the worker processes it starts, the
orchestrator then sets ``OPENBLAS_CORETYPE=SkylakeX`` (the AVX-512 kernels, what newer
OpenBLAS builds pick for such CPUs) when the CPU reports every AVX-512 subset those kernels
use and the user has not set ``OPENBLAS_CORETYPE`` (:func:`worker_blas_env`). Measured on
such a VM: sgemm 1.5x, transformer executes 1.4x faster. This process's own OpenBLAS is
loaded already and is left as it is.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import InvalidArgumentError
from ..telemetry import get_logger
from ._stats import ThreadBudget

__all__ = ["ENV_VARS", "ThreadLimits", "apply_blas_limit", "blas_in_force", "thread_budget", "user_setting",
           "worker_blas_env"]

_log = get_logger(__name__)

ENV_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
_USER_APIS = ("blas", "openmp")


_AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")  # what OpenBLAS's SkylakeX kernels use
_GENERIC_ARCHS = ("haswell", "zen", "sandybridge", "prescott", "nehalem", "core2", "atom", "barcelona",
                  "bulldozer", "piledriver", "steamroller", "excavator")
_worker_env: dict[str, str] | None = None


def _cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def worker_blas_env(environ: Mapping[str, str] | None = None, flags: set[str] | None = None,
                    info: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """Environment variables a worker process should start with to get the BLAS kernels this
    CPU supports: ``{"OPENBLAS_CORETYPE": "SkylakeX"}`` when numpy's OpenBLAS fell back to
    AVX2-or-older kernels on a CPU with every AVX-512 subset the SkylakeX kernels use, and
    the user set no ``OPENBLAS_CORETYPE``; else ``{}``. ``environ``/``flags``/``info``
    (threadpoolctl's ``threadpool_info()``) default to this process's; the default answer is
    computed once."""
    global _worker_env
    default = environ is None and flags is None and info is None
    if default and _worker_env is not None:
        return dict(_worker_env)
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    if "OPENBLAS_CORETYPE" not in env:
        if info is None:
            try:
                import threadpoolctl

                info = threadpoolctl.threadpool_info()
            except Exception:  # noqa: BLE001 - no answer: leave the kernels alone
                info = []
        arch = next((str(i.get("architecture") or "") for i in info if i.get("internal_api") == "openblas"), "")
        cpu = _cpu_flags() if flags is None else flags
        if arch.lower() in _GENERIC_ARCHS and all(f in cpu for f in _AVX512):
            out["OPENBLAS_CORETYPE"] = "SkylakeX"
            _log.info("worker processes get OpenBLAS's AVX-512 kernels (OPENBLAS_CORETYPE=SkylakeX): this "
                      "OpenBLAS did not recognise the CPU and chose older ones", detected=arch)
    if default:
        _worker_env = dict(out)
    return out


def _env_threads(name: str, environ: Mapping[str, str]) -> int | None:
    """The thread count an environment variable asks for (OpenMP's ``"4,2"`` → 4); None
    when unset or not a positive integer (logged: the libraries ignore it too)."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    head = raw.split(",")[0].strip()
    try:
        n = int(head)
    except ValueError:
        n = 0
    if n < 1:
        _log.warning("ignoring a thread-count environment variable that is not a positive integer",
                     variable=name, value=raw)
        return None
    return n


def user_setting(explicit: int | None = None, environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The user's own BLAS thread setting and where it comes from, or None (orchestra
    decides). ``explicit`` (``Orchestrator(blas_threads=...)``) comes first, then the
    environment variables in :data:`ENV_VARS` order."""
    if explicit is not None:
        return explicit, "blas_threads option"
    env = os.environ if environ is None else environ
    for name in ENV_VARS:
        n = _env_threads(name, env)
        if n is not None:
            return n, name
    return None


def check_blas_threads(value: Any) -> int | None:
    """Validates ``Orchestrator(blas_threads=...)``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise InvalidArgumentError(f"blas_threads must be an integer from 1 to 4096 (or None: orchestra decides), "
                                   f"got {value!r}")
    return value


def blas_in_force() -> int | None:
    """The largest thread count of the BLAS/OpenMP pools loaded in this process (None:
    none is loaded)."""
    from threadpoolctl import threadpool_info

    counts = [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") in _USER_APIS]
    return max(counts) if counts else None


def _kernel_threads(n: int | None) -> None:
    """orchestra's compiled kernels follow the BLAS count in force (1 when none is known)."""
    from ..runtime import kernels

    kernels.set_threads(max(1, min(kernels.MAX_THREADS, n or 1)))


def apply_blas_limit(n: int | None) -> int | None:
    """In a worker process: gives it ``n`` compute threads. Where orchestra's compiled kernels
    are built they get the ``n`` (the products and convolutions of float32 programs run on
    their pool) and the BLAS/OpenMP pools 1: OpenBLAS's idle threads spin after each call and
    would take the CPUs the kernels' pool needs (measured: a 0.3 ms pass took 16 ms). Without
    the kernels the pools get ``n``. None: leaves the pools as they are (the user's environment
    decided) and gives the kernels the count in force. Returns the compute threads in force."""
    from ..runtime import kernels

    if n is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1 if kernels.NATIVE_KERNELS else n, user_api=None)
        _kernel_threads(n)
        return n if kernels.NATIVE_KERNELS else blas_in_force()
    in_force = blas_in_force()
    _kernel_threads(in_force)
    return in_force


class ThreadLimits:
    """One per orchestrator: decides each instance's BLAS threads and holds the
    process-wide limit while thread-placed instances run.

    ``sharing`` returns how many instances the orchestrator holds (loading ones included);
    ``available`` how many CPUs orchestra was given.
    """

    def __init__(self, explicit: int | None, sharing: Callable[[], int], available: Callable[[], int]) -> None:
        self.explicit = check_blas_threads(explicit)
        self._sharing = sharing
        self._available = available
        self._limiter: Any = None
        self._kernel_threads: int | None = None  # the compiled kernels' count enter_threads found
        self._held = False
        self.in_process: int | None = None  # BLAS threads in force in this process (thread placement)
        self.source = "orchestra"
        self._procs: weakref.WeakSet[Any] = weakref.WeakSet()  # process workers, to re-limit unbound ones
        self._thread_workers: weakref.WeakSet[Any] = weakref.WeakSet()  # thread-placed workers, to report to
        self.compute: int | None = None  # compute threads of thread-placed instances (see _rethread)

    def process_ready(self, worker: Any) -> None:
        """On the loop, when a worker process has loaded: unbound worker processes started
        while they were alone (every CPU's worth of BLAS threads) drop to the shared rule."""
        self._procs.add(worker)
        for w in list(self._procs):
            if w is not worker and not w.cpus and w.state == "running":
                w.relimit(None)

    def for_process(self, cpus: tuple[int, ...] | None) -> tuple[int | None, str]:
        """The limit a worker process bound to ``cpus`` sets (None: leave the user's
        environment in force) and its source."""
        user = user_setting(self.explicit)
        if user is not None:
            n, source = user
            return (n if source == "blas_threads option" else None), source
        if cpus:
            return len(cpus), "orchestra"
        return (1 if self._sharing() > 1 else max(1, self._available())), "orchestra"

    def sharing_changed(self) -> None:
        """On the loop, when the orchestrator gains or loses an instance (its name claimed or
        dropped) or one moves onto or off CPUs (``Pool.move``): thread-placed instances and
        unbound worker processes follow the rule for the new count (alone: every CPU; sharing:
        1 each)."""
        self._rethread()
        for w in list(self._procs):
            if not w.cpus and w.state == "running":
                w.relimit(None)

    def enter_threads(self, worker: Any) -> None:
        """Called (on the loop) when a thread-placed instance's ``worker`` starts: limits this
        process's BLAS/OpenMP pools to 1 thread (or the user's setting) until :meth:`restore`,
        gives the compiled kernels their count (:meth:`_rethread`) and sets the worker's
        ``blas``/``blas_source`` (what its statistics report)."""
        self._thread_workers.add(worker)
        if not self._held:
            self._held = True
            from ..runtime import kernels

            self._kernel_threads = kernels.threads()
            user = user_setting(self.explicit)
            if user is not None and user[1] != "blas_threads option":
                self.source = user[1]  # the libraries read it at load: nothing to change
                self.in_process = blas_in_force()
            else:
                from threadpoolctl import threadpool_limits

                n = 1 if user is None else user[0]
                self.source = "orchestra" if user is None else user[1]
                self._limiter = threadpool_limits(limits=n, user_api=None)
                self.in_process = blas_in_force()
            _log.info("thread-placed instances: BLAS threads of this process", blas_threads=self.in_process,
                      source=self.source)
        self._rethread()

    def _rethread(self) -> None:
        """The compiled kernels' count while thread-placed instances run (their pool is the
        process's): the user's setting where there is one; else every CPU orchestra was given
        when the orchestrator holds a single instance and it is unbound (measured: a lone
        MobileNetV3 instance 1.5x the executes/s it had on 1 thread, as a bare process has), 1
        when it holds several (a call made while another holds the pool runs on its own thread,
        so n each would exceed the CPUs) or a bound one (its parallelism is its binding's
        backend thread options; the pool's threads are not pinned to the binding)."""
        if not self._held:
            return
        from ..runtime import kernels

        user = user_setting(self.explicit)
        if user is not None:
            n = user[0]
        else:
            lone = self._sharing() <= 1 and not any(w.cpus for w in self._thread_workers)
            n = max(1, self._available()) if lone else 1
        _kernel_threads(n)
        compute = kernels.threads() if kernels.NATIVE_KERNELS and user is None else self.in_process
        if compute != self.compute and self.compute is not None:
            _log.info("thread-placed instances: compute threads", threads=compute, instances=self._sharing())
        self.compute = compute
        for w in list(self._thread_workers):
            w.blas, w.blas_source = compute, self.source

    def restore(self) -> None:
        """Puts back the limits :meth:`enter_threads` found (the orchestrator closed)."""
        lim, self._limiter = self._limiter, None
        self._held = False
        self.compute = None
        if lim is not None:
            lim.restore_original_limits()
        if self._kernel_threads is not None:
            _kernel_threads(self._kernel_threads)
            self._kernel_threads = None


def thread_budget(placement: str, blas: int | None, source: str, in_force: Mapping[str, Mapping[str, Any]],
                  thread_options: Mapping[str, str]) -> ThreadBudget:
    """An instance's :class:`ThreadBudget`: its BLAS threads and each backend's thread
    option in force (the options named by ``thread_options``, else ``num_threads``)."""
    backend: dict[str, int] = {}
    for b, vals in in_force.items():
        key = thread_options.get(b, "num_threads")
        v = vals.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            backend[b] = v
    return ThreadBudget(placement=placement, blas=blas, blas_source=source, backend=MappingProxyType(backend))
