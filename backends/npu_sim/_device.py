"""A model of a multi-core NPU whose cores are wired to camera links (not hardware).

Each core is a dedicated long-lived thread with its own command queue
(:class:`queue.SimpleQueue`) and its own on-chip memory. The core thread is the only thing
that touches the core's state (its job queue, its memory reservations, its counters): other
threads talk to it by message, so the model needs no lock. What it publishes for
:meth:`NpuDevice.statistics` is replaced whole (one attribute assignment), never mutated.

Scheduling on one core: jobs that arrive while the core is busy wait in a small priority
queue (a heap) owned by the core thread; when the core finishes a job it takes every new
arrival into the heap, then starts the waiting job with the highest ``priority``, the one
submitted first among equals (so with equal priorities jobs run in submission order). A
running job is never pre-empted.

Cost of one job (see README.md)::

    cycles         = ceil(MACs / macs_per_cycle) + job_overhead_cycles
    device_seconds = cycles / (clock_mhz[power_mode] * 1e6)
    energy_joules  = device_seconds * power_w[power_mode]

``time_scale`` decides what the modelled time does to wall-clock time: 0 only accounts it; s > 0
also keeps the core occupied for ``s * device_seconds`` of wall-clock time in total (the real
numpy computation counts towards it; the core thread sleeps the rest), so wall-clock latency
and throughput follow the model.

Hot-plug: :meth:`NpuDevice.set_online` takes a core offline (thermal trip, unplug) or back.
Submitting to an offline core fails at once; every job queued on a core, or running on it,
when it goes offline fails (its result is lost), even if the core is back before the job's
turn comes; other cores are unaffected. An offline core keeps its memory reservations.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import structlog

from orchestra.errors import BackendError, Error, InvalidArgumentError

__all__ = [
    "DEFAULT_CLOCK_MHZ",
    "DEFAULT_JOB_OVERHEAD_CYCLES",
    "DEFAULT_LINKS",
    "DEFAULT_POWER_W",
    "POWER_MODES",
    "CoreStatistics",
    "DeviceStatistics",
    "JobCost",
    "JobRecord",
    "ModeUsage",
    "NpuDevice",
    "NpuJob",
    "Reservation",
    "ServedInstance",
    "devices",
    "get_device",
    "register_device",
    "unregister_device",
]

_log = structlog.get_logger(__name__)

POWER_MODES = ("low", "balanced", "performance")
DEFAULT_CLOCK_MHZ: Mapping[str, float] = MappingProxyType({"low": 200, "balanced": 500, "performance": 1000})
DEFAULT_POWER_W: Mapping[str, float] = MappingProxyType({"low": 0.3, "balanced": 0.9, "performance": 2.5})
DEFAULT_LINKS: Mapping[str, int] = MappingProxyType({"front": 0, "rear": 1})
# Fixed cost of one job (descriptor fetch, DMA setup, completion interrupt), in core cycles:
# 2 µs at 1 GHz. In cycles, not seconds, so it scales with the clock like the compute does.
DEFAULT_JOB_OVERHEAD_CYCLES = 2000



# ---------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class JobCost:
    """The modelled cost of one job at one power mode (see the module docstring)."""

    macs: int
    cycles: int
    power_mode: str
    clock_hz: float
    power_w: float
    device_seconds: float
    energy_joules: float


class JobRecord(NamedTuple):
    """One finished job, as its submitter gets it back from :meth:`NpuJob.wait`.

    ``seq`` is the job's completion order on its core (1 = first job the core finished);
    ``queued_seconds`` and ``run_seconds`` are wall-clock (submit to start, start to end,
    the latter including the numpy work and any ``time_scale`` sleep); ``thread_id`` is
    the core thread that ran the work. (An immutable named tuple: one is made per job, on
    the core thread, where a frozen dataclass would cost several times as much.)
    """

    core: int
    seq: int
    handle_id: int
    label: str
    priority: int
    cost: JobCost
    queued_seconds: float
    run_seconds: float
    thread_id: int

    @property
    def device_seconds(self) -> float:
        return self.cost.device_seconds

    @property
    def energy_joules(self) -> float:
        return self.cost.energy_joules

    @property
    def power_mode(self) -> str:
        return self.cost.power_mode


@dataclass(frozen=True, slots=True)
class ServedInstance:
    """What one instance (a delegate handle) got from one core."""

    handle_id: int
    label: str
    jobs: int
    device_seconds: float
    energy_joules: float

    @property
    def name(self) -> str:
        """The label, or ``#<handle id>`` for an unlabelled instance."""
        return self.label or f"#{self.handle_id}"


@dataclass(frozen=True, slots=True)
class ModeUsage:
    """Jobs, device seconds and energy one core spent in one power mode."""

    power_mode: str
    jobs: int
    device_seconds: float
    energy_joules: float


@dataclass(frozen=True, slots=True)
class CoreStatistics:
    """One core, as of the last job it finished (``queue_depth``, ``running`` and
    ``online`` are read live).

    Attributes:
        core: the core index.
        online: False while the core is offline.
        links: the camera links wired to this core.
        memory_bytes / reserved_bytes / reservations: on-chip memory capacity, the part
            reserved by instances, and by how many.
        jobs / failed_jobs: jobs finished / failed (offline, closed, or the work raised).
        busy_seconds / energy_joules: modelled device time and energy of finished jobs.
        by_mode: the same per power mode (modes never used are left out).
        served: every instance this core has finished a job for, first served first.
        queue_depth: jobs submitted and not started yet.
        running: True while a job runs.
        last_job: the last finished job.
    """

    core: int
    online: bool
    links: tuple[str, ...]
    memory_bytes: int
    reserved_bytes: int
    reservations: int
    jobs: int
    failed_jobs: int
    busy_seconds: float
    energy_joules: float
    by_mode: tuple[ModeUsage, ...]
    served: tuple[ServedInstance, ...]
    queue_depth: int
    running: bool
    last_job: JobRecord | None

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.reserved_bytes

    @property
    def instances(self) -> tuple[str, ...]:
        """Names (labels) of the instances served, first served first."""
        return tuple(s.name for s in self.served)


@dataclass(frozen=True, slots=True)
class DeviceStatistics:
    """Every core of one device, plus device-wide modelled totals."""

    name: str
    closed: bool
    time_scale: float
    cores: tuple[CoreStatistics, ...]

    @property
    def jobs(self) -> int:
        return sum(c.jobs for c in self.cores)

    @property
    def busy_seconds(self) -> float:
        """Device seconds summed over cores (core-seconds)."""
        return sum(c.busy_seconds for c in self.cores)

    @property
    def energy_joules(self) -> float:
        return sum(c.energy_joules for c in self.cores)

    @property
    def makespan_seconds(self) -> float:
        """Modelled time to run every finished job with the cores in parallel: the busiest
        core's device seconds."""
        return max((c.busy_seconds for c in self.cores), default=0.0)

    @property
    def throughput_jobs_per_s(self) -> float:
        """Modelled jobs per second: ``jobs / makespan_seconds`` (0 before any job)."""
        span = self.makespan_seconds
        return self.jobs / span if span > 0 else 0.0

    @property
    def online_cores(self) -> tuple[int, ...]:
        return tuple(c.core for c in self.cores if c.online)


@dataclass(frozen=True, slots=True)
class Reservation:
    """``nbytes`` of one core's memory, held until :meth:`NpuDevice.release`."""

    device: str
    core: int
    id: int
    nbytes: int
    what: str


# ---------------------------------------------------------------------------------------
# Messages to a core thread


class _Job:
    __slots__ = ("work", "cost", "priority", "seq", "handle_id", "label", "reply", "trips", "submitted")

    def __init__(self, work: Callable[[], Any], cost: JobCost, priority: int, seq: int, handle_id: int,
                 label: str, trips: int) -> None:
        self.work = work
        self.cost = cost
        self.priority = priority
        self.seq = seq
        self.handle_id = handle_id
        self.label = label
        self.reply: queue.SimpleQueue[tuple[bool, Any, Any]] = queue.SimpleQueue()
        self.trips = trips  # the core's offline count at submission
        self.submitted = time.perf_counter()

    def __lt__(self, other: _Job) -> bool:  # heap order: higher priority, then earlier
        return (-self.priority, self.seq) < (-other.priority, other.seq)


class _Control:
    __slots__ = ("kind", "arg", "reply")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind = kind  # "reserve", "release", "stop"
        self.arg = arg
        self.reply: queue.SimpleQueue[tuple[bool, Any, Any]] = queue.SimpleQueue()


class NpuJob:
    """A job submitted to a core. :meth:`wait` blocks until the core has run it."""

    __slots__ = ("_core", "_reply", "_done")

    def __init__(self, core: _Core, reply: queue.SimpleQueue[tuple[bool, Any, Any]]) -> None:
        self._core = core
        self._reply = reply
        self._done: tuple[bool, Any, Any] | None = None

    def wait(self) -> tuple[Any, JobRecord]:
        """Blocks until the job has run; returns ``(what the work returned, JobRecord)``.

        Raises:
            BackendError: the core went offline before or while the job ran (code
                DelegateInvalidHandle) or the device was closed (code InvalidState).
            Exception: whatever the work raised, re-raised here.
        """
        done = self._done
        if done is None:
            done = self._done = self._core.wait_reply(self._reply)
        ok, value, record = done
        if not ok:
            raise value
        return value, record


# ---------------------------------------------------------------------------------------
# A core


class _Core:
    """One NPU core: its thread, its queue, its memory. Private: use NpuDevice."""

    def __init__(self, device: NpuDevice, index: int, memory: int, links: tuple[str, ...]) -> None:
        self.device = device
        self.index = index
        self.memory = memory
        self.links = links
        self.inbox: queue.SimpleQueue[_Job | _Control] = queue.SimpleQueue()
        self.offline = threading.Event()
        self.trips = 0  # times this core went offline; a job queued before a trip fails
        self.seq = itertools.count()  # submission order (next() is atomic)
        self.heap: list[_Job] = []  # jobs waiting, owned by the core thread
        self.running = False
        self.stopped = False  # set by the core thread as it exits
        # Owned by the core thread (or by whoever drains the queue once it is gone).
        self.reservations: dict[int, Reservation] = {}
        # Per instance [label, jobs, device seconds, joules] and per mode [jobs, seconds,
        # joules]: updated in place by the core thread, copied by statistics().
        self.served: dict[int, list[Any]] = {}
        self.modes: dict[str, list[Any]] = {}
        self.finished = 0
        self.next_reservation = 0
        # Published, replaced whole: (jobs, failed jobs, busy seconds, joules), last record.
        self.totals: tuple[int, int, float, float] = (0, 0, 0.0, 0.0)
        self.last: JobRecord | None = None
        self.memory_state = (0, 0)  # (reserved bytes, reservations)
        self.thread = threading.Thread(target=self._loop, name=f"npu-sim:{device.name}:core{index}", daemon=True)

    # -- any thread -----------------------------------------------------------------------
    def wait_reply(self, reply: queue.SimpleQueue[tuple[bool, Any, Any]]) -> tuple[bool, Any, Any]:
        if threading.current_thread() is self.thread:
            try:
                return reply.get_nowait()
            except queue.Empty:
                raise BackendError(f"npu device {self.device.name!r}: a job running on core {self.index} waits for "
                                   "that same core (it would wait forever)", Error.InvalidState) from None
        return reply.get()

    def send(self, msg: _Job | _Control) -> None:
        """Queues ``msg`` for the core thread, and makes sure it gets an answer: when the
        device was closed meanwhile, the core thread may have taken its last look at the
        queue before ``msg`` arrived, so the sender answers what is left itself."""
        self.inbox.put(msg)
        if self.device.closed and threading.current_thread() is not self.thread:
            self.thread.join()
            self.drain_after_exit()

    def ask(self, kind: str, arg: Any) -> Any:
        msg = _Control(kind, arg)
        if threading.current_thread() is self.thread:
            self._take(msg)  # asked by a job running on this core: answer in place
        else:
            self.send(msg)
        ok, value, _ = self.wait_reply(msg.reply)
        if not ok:
            raise value
        return value

    def statistics(self) -> CoreStatistics:
        jobs, failed, busy, energy = self.totals
        reserved, count = self.memory_state
        modes = dict(list(self.modes.items()))  # list(): one C-level copy, safe while the core adds a key
        by_mode = [ModeUsage(k, *modes.pop(k)) for k in POWER_MODES if k in modes]
        by_mode += [ModeUsage(k, *v) for k, v in modes.items()]
        served = tuple(ServedInstance(h, *v) for h, v in list(self.served.items()))
        return CoreStatistics(
            core=self.index, online=not self.offline.is_set(), links=self.links, memory_bytes=self.memory,
            reserved_bytes=reserved, reservations=count, jobs=jobs, failed_jobs=failed,
            busy_seconds=busy, energy_joules=energy, by_mode=tuple(by_mode), served=served,
            queue_depth=self.inbox.qsize() + len(self.heap), running=self.running, last_job=self.last,
        )

    def offline_error(self, when: str) -> BackendError:
        online = ", ".join(map(str, self.device.online_cores())) or "none"
        return BackendError(
            f"npu device {self.device.name!r}: core {self.index} {when} (online cores: {online}); "
            f"set_online({self.index}, True) brings it back",
            Error.DelegateInvalidHandle,
        )

    def closed_error(self) -> BackendError:
        return BackendError(f"npu device {self.device.name!r} is closed (core {self.index})", Error.InvalidState)

    def drain_after_exit(self) -> None:
        """Answers every message left once the core thread has stopped (any thread)."""
        while True:
            try:
                job = self.heap.pop()
            except IndexError:
                break
            self._fail(job, self.closed_error())
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, _Job):
                self._fail(msg, self.closed_error())
            elif msg.kind == "release":
                msg.reply.put((True, None, None))  # closing released everything
            else:
                msg.reply.put((False, self.closed_error(), None))

    # -- the core thread ------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # stopped (or, on a bug, crashed): nothing queued may wait forever
            self.stopped = True
            for job in self.heap:
                self._fail(job, self.closed_error())
            self.heap.clear()
            self.reservations.clear()
            self.memory_state = (0, 0)
            self.drain_after_exit()

    def _serve(self) -> None:
        inbox, heap = self.inbox, self.heap
        stop = False
        while not stop:
            if not heap:
                stop = self._take(inbox.get())
            while not stop:
                try:
                    msg = inbox.get_nowait()
                except queue.Empty:
                    break
                stop = self._take(msg)
            if heap and not stop:
                self._run(heapq.heappop(heap))

    def _take(self, msg: _Job | _Control) -> bool:
        """Files a message; True for stop. Controls are answered at once."""
        if isinstance(msg, _Job):
            heapq.heappush(self.heap, msg)
            return False
        if msg.kind == "stop":
            msg.reply.put((True, None, None))
            return True
        if msg.kind == "reserve":
            nbytes, what = msg.arg
            reserved = sum(r.nbytes for r in self.reservations.values())
            free = self.memory - reserved
            if nbytes > free:
                err = BackendError(
                    f"npu device {self.device.name!r} core {self.index}: not enough core memory for {what}: "
                    f"needs {nbytes:,} bytes, {free:,} available ({self.memory:,} capacity, {reserved:,} reserved "
                    f"by {len(self.reservations)} other instance(s))",
                    Error.DelegateMemoryAllocationFailed,
                )
                msg.reply.put((False, err, None))
                return False
            self.next_reservation += 1
            r = Reservation(self.device.name, self.index, self.next_reservation, nbytes, what)
            self.reservations[r.id] = r
            self.memory_state = (reserved + nbytes, len(self.reservations))
            msg.reply.put((True, r, None))
            return False
        if msg.kind == "release":
            self.reservations.pop(msg.arg, None)
            self.memory_state = (sum(r.nbytes for r in self.reservations.values()), len(self.reservations))
            msg.reply.put((True, None, None))
            return False
        msg.reply.put((False, InvalidArgumentError(f"unknown core command {msg.kind!r}"), None))  # pragma: no cover
        return False

    def _fail(self, job: _Job, err: BaseException) -> None:
        jobs, failed, busy, energy = self.totals
        self.totals = (jobs, failed + 1, busy, energy)
        job.reply.put((False, err, None))

    def _run(self, job: _Job) -> None:
        if job.trips != self.trips:
            self._fail(job, self.offline_error("went offline while this job was queued"))
            return
        if self.offline.is_set():
            self._fail(job, self.offline_error("is offline"))
            return
        self.running = True
        start = time.perf_counter()
        try:
            try:
                result = job.work()
            except BaseException as exc:  # the submitter gets it; the core keeps going
                self._fail(job, exc)
                return
            cost = job.cost
            scale = self.device.time_scale
            if scale > 0:
                left = cost.device_seconds * scale - (time.perf_counter() - start)
                if left > 0:
                    self.offline.wait(left)  # an offline trip cuts the job short
            if job.trips != self.trips:
                self._fail(job, self.offline_error("went offline while this job was running"))
                return
            end = time.perf_counter()
        finally:
            self.running = False
        self.finished += 1
        seconds, joules = cost.device_seconds, cost.energy_joules
        m = self.modes.get(cost.power_mode)
        if m is None:
            m = self.modes[cost.power_mode] = [0, 0.0, 0.0]
        m[0] += 1
        m[1] += seconds
        m[2] += joules
        s = self.served.get(job.handle_id)
        if s is None:
            s = self.served[job.handle_id] = [job.label, 0, 0.0, 0.0]
        s[1] += 1
        s[2] += seconds
        s[3] += joules
        record = JobRecord(self.index, self.finished, job.handle_id, job.label, job.priority, cost,
                           start - job.submitted, end - start, threading.get_ident())
        jobs, failed, busy, energy = self.totals
        self.totals = (jobs + 1, failed, busy + seconds, energy + joules)
        self.last = record
        job.reply.put((True, result, record))


# ---------------------------------------------------------------------------------------
# The device


def _positive_table(what: str, table: Mapping[str, float] | None, default: Mapping[str, float]) -> Mapping[str, float]:
    table = default if table is None else table
    if not isinstance(table, Mapping) or not table:
        raise InvalidArgumentError(f"NpuDevice {what} must be a non-empty mapping of power mode to a number, got {table!r}")
    out = {}
    for k, v in table.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            raise InvalidArgumentError(f"NpuDevice {what}[{k!r}] must be a positive number, got {v!r}")
        out[k] = float(v)
    return MappingProxyType(out)


class NpuDevice:
    """A modelled multi-core NPU. Its core threads start at construction; :meth:`close`
    (or leaving a ``with`` block) stops and joins them.

    Args:
        name: the name the backend's ``device`` option refers to (see :func:`register_device`).
        cores: number of cores.
        core_memory: on-chip memory per core in bytes (one int for all, or one per core).
        clock_mhz: core clock per power mode.
        macs_per_cycle: multiply-accumulates one core completes per cycle.
        power_w: power drawn by a busy core per power mode (watts); must name the same modes
            as ``clock_mhz``.
        links: camera link name -> the core it is wired to (default: front -> 0, rear -> 1,
            keeping only the cores the device has).
        time_scale: 0 = account modelled time only; s > 0 = a job also occupies its core for
            ``s * device_seconds`` of wall-clock time.
        job_overhead_cycles: fixed cycles added to every job.

    Raises:
        InvalidArgumentError: a parameter out of range (the message names it).
    """

    def __init__(
        self,
        name: str,
        cores: int = 4,
        core_memory: int | Sequence[int] = 4 << 20,
        clock_mhz: Mapping[str, float] | None = None,
        macs_per_cycle: int = 256,
        power_w: Mapping[str, float] | None = None,
        links: Mapping[str, int] | None = None,
        time_scale: float = 0.0,
        job_overhead_cycles: int = DEFAULT_JOB_OVERHEAD_CYCLES,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"NpuDevice name must be a non-empty string, got {name!r}")
        where = f"NpuDevice {name!r}"
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidArgumentError(f"{where}: cores must be an int >= 1, got {cores!r}")
        mems = [core_memory] * cores if isinstance(core_memory, int) and not isinstance(core_memory, bool) else list(core_memory)
        if len(mems) != cores or any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in mems):
            raise InvalidArgumentError(f"{where}: core_memory must be an int >= 0 or one per core ({cores}), got {core_memory!r}")
        clock = _positive_table(f"{where} clock_mhz", clock_mhz, DEFAULT_CLOCK_MHZ)
        power = _positive_table(f"{where} power_w", power_w, DEFAULT_POWER_W)
        if set(clock) != set(power):
            raise InvalidArgumentError(f"{where}: clock_mhz and power_w must name the same power modes "
                                       f"(clock_mhz: {', '.join(clock)}; power_w: {', '.join(power)})")
        if isinstance(macs_per_cycle, bool) or not isinstance(macs_per_cycle, int) or macs_per_cycle < 1:
            raise InvalidArgumentError(f"{where}: macs_per_cycle must be an int >= 1, got {macs_per_cycle!r}")
        if isinstance(job_overhead_cycles, bool) or not isinstance(job_overhead_cycles, int) or job_overhead_cycles < 0:
            raise InvalidArgumentError(f"{where}: job_overhead_cycles must be an int >= 0, got {job_overhead_cycles!r}")
        if isinstance(time_scale, bool) or not isinstance(time_scale, (int, float)) or not 0 <= time_scale < math.inf:
            raise InvalidArgumentError(f"{where}: time_scale must be a number >= 0, got {time_scale!r}")
        # The default wiring keeps only the links whose core exists (a 1-core device has "front").
        link_map = {k: c for k, c in DEFAULT_LINKS.items() if c < cores} if links is None else links
        clean_links = {}
        for link, core in dict(link_map).items():
            if not isinstance(link, str) or isinstance(core, bool) or not isinstance(core, int) or not 0 <= core < cores:
                raise InvalidArgumentError(f"{where}: link {link!r} -> core {core!r} is not a core of this device (cores 0..{cores - 1})")
            clean_links[link] = core
        self._name = name
        self._clock = clock
        self._power = power
        self._macs_per_cycle = macs_per_cycle
        self._overhead = job_overhead_cycles
        self._time_scale = float(time_scale)
        self._links: Mapping[str, int] = MappingProxyType(clean_links)
        self._ids = itertools.count(1)
        self._closed = False
        self._cores = tuple(
            _Core(self, i, mems[i], tuple(k for k, c in clean_links.items() if c == i)) for i in range(cores)
        )
        for c in self._cores:
            c.thread.start()

    # -- parameters -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def cores(self) -> int:
        return len(self._cores)

    @property
    def core_memory(self) -> tuple[int, ...]:
        """On-chip bytes of each core."""
        return tuple(c.memory for c in self._cores)

    @property
    def clock_mhz(self) -> Mapping[str, float]:
        return self._clock

    @property
    def power_w(self) -> Mapping[str, float]:
        return self._power

    @property
    def power_modes(self) -> tuple[str, ...]:
        return tuple(self._clock)

    @property
    def macs_per_cycle(self) -> int:
        return self._macs_per_cycle

    @property
    def job_overhead_cycles(self) -> int:
        return self._overhead

    @property
    def time_scale(self) -> float:
        return self._time_scale

    @property
    def links(self) -> Mapping[str, int]:
        """Camera link -> core."""
        return self._links

    @property
    def closed(self) -> bool:
        return self._closed

    def new_id(self) -> int:
        """A fresh instance id, unique on this device (1, 2, ...)."""
        return next(self._ids)

    def core_for_link(self, link: str) -> int:
        """The core wired to camera ``link``."""
        try:
            return self._links[link]
        except KeyError:
            raise InvalidArgumentError(
                f"npu device {self._name!r} has no camera link {link!r} (links: {', '.join(self._links) or 'none'})"
            ) from None

    def check_core(self, core: int) -> int:
        """Returns ``core`` if this device has it.

        Raises:
            BackendError: code InvalidArgument, naming the device and its core range.
        """
        if isinstance(core, bool) or not isinstance(core, int) or not 0 <= core < len(self._cores):
            raise BackendError(
                f"npu device {self._name!r} has no core {core!r} (it has {len(self._cores)} cores: "
                f"0..{len(self._cores) - 1})", Error.InvalidArgument)
        return core

    def cost(self, macs: int, power_mode: str) -> JobCost:
        """The modelled cost of a job of ``macs`` multiply-accumulates in ``power_mode``."""
        try:
            mhz = self._clock[power_mode]
        except KeyError:
            raise InvalidArgumentError(
                f"npu device {self._name!r} has no power mode {power_mode!r} (modes: {', '.join(self._clock)})"
            ) from None
        if isinstance(macs, bool) or not isinstance(macs, int) or macs < 0:
            raise InvalidArgumentError(f"npu device {self._name!r}: macs must be an int >= 0, got {macs!r}")
        cycles = -(-macs // self._macs_per_cycle) + self._overhead
        hz = mhz * 1e6
        seconds = cycles / hz
        watts = self._power[power_mode]
        return JobCost(macs, cycles, power_mode, hz, watts, seconds, seconds * watts)

    # -- hot-plug -------------------------------------------------------------------------
    def set_online(self, core: int, online: bool) -> None:
        """Takes ``core`` offline (False) or back online (True). Returns at once.

        Going offline fails every job queued on the core and the one running on it (at
        once when it is in a ``time_scale`` sleep, else when its numpy work returns).
        """
        c = self._cores[self.check_core(core)]
        was_online = not c.offline.is_set()
        if online:
            c.offline.clear()
        elif was_online:
            c.trips += 1
            c.offline.set()
        if bool(online) != was_online:  # log transitions only
            _log.info("npu core online" if online else "npu core offline", device=self._name, core=core,
                      online_cores=self.online_cores())

    def is_online(self, core: int) -> bool:
        return not self._cores[self.check_core(core)].offline.is_set()

    def online_cores(self) -> tuple[int, ...]:
        return tuple(c.index for c in self._cores if not c.offline.is_set())

    # -- memory ---------------------------------------------------------------------------
    def reserve(self, core: int, nbytes: int, what: str = "an instance") -> Reservation:
        """Reserves ``nbytes`` of ``core``'s memory (done by the core thread, so concurrent
        reservations never over-commit; waits for the job the core is running, if any).

        Raises:
            BackendError: code DelegateMemoryAllocationFailed naming the bytes needed and
                available; InvalidState when the device is closed.
        """
        c = self._cores[self.check_core(core)]
        if self._closed or c.stopped:
            raise c.closed_error()
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgumentError(f"npu device {self._name!r}: nbytes must be an int >= 0, got {nbytes!r}")
        return c.ask("reserve", (nbytes, what))

    def release(self, reservation: Reservation) -> None:
        """Gives a reservation back (idempotent; a no-op on a closed device)."""
        if reservation.device != self._name or not 0 <= reservation.core < len(self._cores):
            raise InvalidArgumentError(f"npu device {self._name!r}: {reservation!r} is not a reservation of this device")
        c = self._cores[reservation.core]
        if self._closed:
            return
        c.ask("release", reservation.id)

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, core: int, work: Callable[[], Any], *, cost: JobCost, priority: int = 0,
               handle_id: int = 0, label: str = "") -> NpuJob:
        """Queues ``work`` (a callable run on the core's thread) on ``core``. Returns at once.

        ``cost`` (from :meth:`cost`) is what the job is accounted; ``priority`` orders it
        among jobs waiting on the same core (higher first, then submission order).

        Raises:
            BackendError: the core is offline (code DelegateInvalidHandle; the message names
                the device, the core and the online cores), the device is closed (code
                InvalidState), or there is no such core (code InvalidArgument).
        """
        c = self._cores[self.check_core(core)]
        if self._closed or c.stopped:
            raise c.closed_error()
        if c.offline.is_set():
            raise c.offline_error("is offline")
        job = _Job(work, cost, priority, next(c.seq), handle_id, label, c.trips)
        c.send(job)
        return NpuJob(c, job.reply)

    # -- lifetime -------------------------------------------------------------------------
    def statistics(self) -> DeviceStatistics:
        return DeviceStatistics(self._name, self._closed, self._time_scale, tuple(c.statistics() for c in self._cores))

    def close(self) -> None:
        """Stops and joins the core threads (after the jobs they are running; queued jobs
        fail with code InvalidState), and unregisters the device. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for c in self._cores:
            c.inbox.put(_Control("stop"))
        for c in self._cores:
            if c.thread is not threading.current_thread():
                c.thread.join()
            c.drain_after_exit()
        if _REGISTRY.get(self._name) is self:
            del _REGISTRY[self._name]

    def __enter__(self) -> NpuDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"online cores {list(self.online_cores())}"
        return f"<NpuDevice {self._name!r} cores={len(self._cores)} {state}>"


# ---------------------------------------------------------------------------------------
# Registry (DESIGN: the only module-level mutable state allowed)

_REGISTRY: dict[str, NpuDevice] = {}


def register_device(device: NpuDevice) -> NpuDevice:
    """Makes ``device`` reachable by name from the backend's ``device`` option. Returns it.

    Raises:
        InvalidArgumentError: not an NpuDevice, closed, or its name is taken.
    """
    if not isinstance(device, NpuDevice):
        raise InvalidArgumentError(f"register_device takes an NpuDevice, got {device!r}")
    if device.closed:
        raise InvalidArgumentError(f"npu device {device.name!r} is closed")
    have = _REGISTRY.get(device.name)
    if have is not None and have is not device:
        raise InvalidArgumentError(f"an npu device named {device.name!r} is already registered")
    _REGISTRY[device.name] = device
    return device


def get_device(name: str) -> NpuDevice:
    """The registered device called ``name``.

    Raises:
        BackendError: code NotFound; the message lists the registered devices.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        have = ", ".join(sorted(_REGISTRY)) or "none"
        raise BackendError(
            f"npu device {name!r} is not registered (registered: {have}); "
            f"create one with register_device(NpuDevice({name!r}))", Error.NotFound) from None


def unregister_device(name: str) -> NpuDevice:
    """Removes ``name`` from the registry and returns it (it keeps running; close it).

    Raises:
        BackendError: code NotFound when no device has that name.
    """
    device = get_device(name)
    if _REGISTRY.get(name) is device:
        del _REGISTRY[name]
    return device


def devices() -> tuple[str, ...]:
    """Names of the registered devices, sorted."""
    return tuple(sorted(_REGISTRY))
