"""Cameras as Ray actors placed by custom resources (the ``ray`` extra; imported only when used)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..orchestrator._ray import ClusterError, NodeInfo, PlacementError, _fmt_res, _reachable, _shown, cluster_nodes
from ..telemetry import get_logger

__all__ = ["NODE_LABEL", "CameraJob", "ClusterError", "ClusterStatus", "JobResult", "JobStatus", "NodeInfo",
           "PlacementError", "camera_resources", "check_placement", "cluster_nodes", "for_nodes", "label_selector",
           "run_jobs"]

_log = get_logger("orchestra.cluster")

NODE_SHARE = 0.01  # of a node's "node.NAME" resource a camera pinned to it takes (many cameras per node)
# A node is named NAME (a camera's or device's ``node = "NAME"``) by its custom resource
# ``node.NAME`` or by this Ray node label: ray start --labels orchestra-node=NAME.
NODE_LABEL = "orchestra-node"


def _effective(n: NodeInfo) -> dict[str, float]:
    """``n``'s resources, with ``node.NAME`` for its ``orchestra-node`` label (a whole node's
    worth: as many cameras as pin themselves to it)."""
    res = dict(n.resources)
    name = n.labels.get(NODE_LABEL)
    if name and f"node.{name}" not in res:
        res[f"node.{name}"] = 1.0
    return res


def label_selector(job: CameraJob, nodes: Sequence[NodeInfo]) -> tuple[dict[str, float], dict[str, str] | None]:
    """The Ray resources and label selector ``job``'s actor requests: a ``node.NAME``
    resource no live node advertises, while a live node has the label ``orchestra-node=NAME``,
    is asked for as that label instead."""
    res = dict(job.resources)
    for k in [k for k in res if k.startswith("node.")]:
        name = k[len("node."):]
        if not any(k in n.resources for n in nodes) and any(n.labels.get(NODE_LABEL) == name for n in nodes):
            del res[k]
            return res, {NODE_LABEL: name}
    return res, None


@dataclass(frozen=True)
class CameraJob:
    """One camera's work for one actor: ``work(payload, report)`` runs in an actor that
    requests ``resources`` (so Ray starts it on a node that has them) and its return value
    travels back to the driver. ``report(snapshot)`` sends a progress snapshot to the driver
    (non-blocking; the driver keeps the latest: :attr:`JobResult.progress`, what is known of
    a job whose node died). ``work`` must be a module-level function importable on every node.

    ``resume(payload, seconds_left)`` (optional, called on the driver) gives the payload of a
    restart: when the job's actor dies while the run lasts, :func:`run_jobs` starts a new actor
    (on whichever live node has the resources again) with that payload; without ``resume`` a
    job whose actor died is not restarted."""

    camera: str
    resources: Mapping[str, float]
    work: Callable[[Any], Any]
    payload: Any = None
    resume: Callable[[Any, float | None], Any] | None = None


@dataclass(frozen=True)
class JobResult:
    """What one camera's actor did: the node it ran on, ``value`` (what ``work`` returned) or
    ``error`` (why it has no value: the work raised, its node or actor died, or no node with
    its resources joined in time: then ``node_id`` is None).

    A job restarted after its actor died has the earlier tries in ``earlier`` (oldest first,
    each with its ``error`` and last ``progress``); this result is its last try. ``started_s``
    and ``ended_s``: when this try started on its node and when the driver saw it end, in
    seconds since the jobs started running (``started_s`` > 0 for a restart or a camera that
    waited for its node)."""

    camera: str
    node_id: str | None
    address: str | None
    value: Any = None
    error: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    progress: Any = None  # the latest snapshot the job reported (None: none yet)
    earlier: tuple[JobResult, ...] = ()
    started_s: float | None = None
    ended_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def restarts(self) -> int:
        """How many times the job was started again after its actor died."""
        return len(self.earlier)


@dataclass(frozen=True)
class JobStatus:
    """One job, now (see :class:`ClusterStatus`): ``state`` is one of ``"starting"`` (its actor
    waits for Ray to place it), ``"waiting for a node"`` (no live node has its resources yet),
    ``"running"``, ``"lost, restarting"`` (its actor died; a new one waits for a live node),
    ``"done"`` or ``"failed"`` (``error`` says why). ``node_id``/``address``: where its current
    (or last) try runs, None before it is placed. ``progress``: the latest snapshot this try
    reported (None: none yet); ``earlier``: the last snapshot of each lost try, oldest first."""

    camera: str
    state: str
    node_id: str | None = None
    address: str | None = None
    restarts: int = 0
    started_s: float | None = None
    progress: Any = None
    earlier: tuple[Any, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ClusterStatus:
    """Every job of a :func:`run_jobs` call, now (what ``on_status`` gets about once a
    second): ``elapsed_s`` since the jobs started running (0 while their actors start),
    ``duration_s`` the run's length (None: until interrupted), ``done`` True in the last one
    (every job has its result)."""

    elapsed_s: float
    duration_s: float | None
    jobs: tuple[JobStatus, ...]
    done: bool = False


def camera_resources(camera: str, core: tuple[str, int] | None = None, node: str | None = None,
                     cpus: int = 0, cpu_set: Sequence[int] = ()) -> dict[str, float]:
    """The Ray resources a camera's actor requests: ``camera.NAME`` (the node it is wired
    to), ``DEVICE.core.N`` for its NPU core binding, ``node.NAME`` (a share of it) when the
    config pins it to a named node, ``CPU`` when ``cpus`` > 0, and ``cpu.N`` for each CPU of
    its CPU binding (``cpu_set``: nodes advertise the CPUs orchestra may pin as ``cpu.0``,
    ``cpu.1``, ...; see :func:`for_nodes`)."""
    res: dict[str, float] = {f"camera.{camera}": 1.0}
    if core is not None:
        res[f"{core[0]}.core.{core[1]}"] = 1.0
    if node is not None:
        res[f"node.{node}"] = NODE_SHARE
    if cpus:
        res["CPU"] = float(cpus)
    for c in cpu_set:
        res[f"cpu.{int(c)}"] = 1.0
    return res


def for_nodes(job: CameraJob, nodes: Sequence[NodeInfo]) -> CameraJob:
    """``job`` as the live ``nodes`` can hold it: its ``cpu.N`` resources are dropped when no
    node advertises any ``cpu.*`` (a cluster that doesn't offer CPU sets: the camera's node
    then pins the CPUs itself, Ray unaware of them), kept otherwise (Ray places the camera on
    a node whose CPUs are free, and two cameras never share one)."""
    if not any(k.startswith("cpu.") for k in job.resources):
        return job
    if any(k.startswith("cpu.") for n in nodes for k in n.resources):
        return job
    return dataclasses.replace(job, resources={k: v for k, v in job.resources.items() if not k.startswith("cpu.")})


def check_placement(jobs: Sequence[CameraJob], nodes: Sequence[NodeInfo]) -> dict[str, str]:
    """Which node each camera will run on (camera -> node id), assigning each job in turn to
    the first node that still has its resources (what Ray's scheduler will find for exact
    resources such as ``camera.NAME``).

    Raises:
        PlacementError: a camera's resources are on no node, or taken by cameras before it;
            the message names the camera, the resources missing and what every node has.
    """
    left = {n.node_id: _effective(n) for n in nodes}
    taken: dict[str, list[str]] = {}
    placed: dict[str, str] = {}
    for job in jobs:
        fits = [n for n in nodes if all(left[n.node_id].get(k, 0.0) + 1e-9 >= v for k, v in job.resources.items())]
        if not fits:
            have = "; ".join(f"node {n.node_id[:8]} ({n.address}): {_fmt_res(_shown(n.resources))}" for n in nodes)
            missing = [k for k, v in job.resources.items() if not any(_effective(n).get(k, 0.0) >= v for n in nodes)]
            users = sorted({c for k in job.resources for c in taken.get(k, [])})
            why = (f"no node advertises {', '.join(missing)}" if missing else
                   f"no node has them all free (taken by camera{'s' if len(users) > 1 else ''} {', '.join(users)})"
                   if users else "no node has them all")
            names = [k[len("node."):] for k in missing if k.startswith("node.")]
            named = f" (or --labels {NODE_LABEL}={names[0]})" if names else ""
            raise PlacementError(f"camera {job.camera!r} needs Ray resources {_fmt_res(job.resources)}: {why} "
                                 f"(nodes: {have or 'none alive'}); start the node wired to it with "
                                 f"ray start --resources '{{\"camera.{job.camera}\": 1, ...}}'{named}")
        node = fits[0]
        for k, v in job.resources.items():
            left[node.node_id][k] -= v
            taken.setdefault(k, []).append(job.camera)
        placed[job.camera] = node.node_id
    return placed


class _CameraActor:
    """Runs one camera's work on the node Ray placed it on."""

    def where(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def run(self, work: Callable[[Any, Callable[[Any], None]], Any], payload: Any, progress: Any, key: Any) -> Any:
        import ray

        last: list[Any] = []

        def report(snapshot: Any) -> None:
            last[:] = [progress.put.remote(key, snapshot)]

        value = work(payload, report)
        if last:  # the driver reads the last snapshot once the value is back: make sure it is there
            try:
                ray.get(last[0], timeout=10)
            except Exception:  # noqa: BLE001 - the driver's progress actor is gone: nobody to tell
                pass
        return value


class _Progress:
    """On the driver's node: the latest progress snapshot of every job's try ((camera, try))."""

    def __init__(self) -> None:
        self.latest: dict[Any, Any] = {}

    def put(self, key: Any, snapshot: Any) -> None:
        self.latest[key] = snapshot

    def get(self) -> dict[Any, Any]:
        return self.latest


MIN_RESTART_S = 1.0  # a job whose actor dies with less of the run left than this is not restarted
RETRY_S = 1.0  # an actor that died before it ran (placed on a dying node) is tried again after this


def _missing(job: CameraJob, nodes: Sequence[NodeInfo]) -> list[str]:
    """The resources of ``job`` that no node in ``nodes`` advertises (enough of)."""
    return [k for k, v in job.resources.items() if not any(_effective(n).get(k, 0.0) + 1e-9 >= v for n in nodes)]


class _Try:
    """The driver's bookkeeping for one job in :func:`run_jobs`: its current actor and the call
    in flight (``where`` while it waits for a node, then ``run``), its earlier tries."""

    def __init__(self, job: CameraJob) -> None:
        self.job = job
        self.actor: Any = None
        self.ref: Any = None
        self.running = False
        self.node: str | None = None
        self.ip: str | None = None
        self.tries = 0  # restarts so far
        self.earlier: list[JobResult] = []
        self.wait_until: float | None = None  # monotonic: a node not found by then ends the wait
        self.run_until: float | None = None  # monotonic: run_timeout_s
        self.started: float | None = None  # seconds since the run began
        self.late = False  # starts after the others: runs for the time the run has left
        self.retry_at: float | None = None  # monotonic: start a new actor then (no actor meanwhile)
        self.result: JobResult | None = None

    def status(self, latest: Mapping[Any, Any]) -> JobStatus:
        """Where this job stands, with ``latest`` the progress actor's snapshots."""
        job = self.job
        earlier = tuple(e.progress for e in self.earlier)
        if self.result is not None:
            r = self.result
            return JobStatus(job.camera, "done" if r.ok else "failed", r.node_id, r.address, len(r.earlier),
                             r.started_s, latest.get((job.camera, self.tries), r.progress) if r.node_id else None,
                             tuple(e.progress for e in r.earlier), r.error)
        if self.running:
            state = "running"
        elif self.tries:
            state = "lost, restarting"
        elif self.late:
            state = "waiting for a node"
        else:
            state = "starting"
        return JobStatus(job.camera, state, self.node, self.ip, self.tries, self.started if self.running else None,
                         latest.get((job.camera, self.tries)) if self.running else None, earlier)


STATUS_S = 1.0  # how often run_jobs calls on_status


def run_jobs(jobs: Sequence[CameraJob], address: str = "auto", *, start_timeout_s: float = 60.0,
             run_timeout_s: float | None = None, duration_s: float | None = None,
             wait_for_nodes: bool = False, on_status: Callable[[ClusterStatus], None] | None = None,
             status_s: float = STATUS_S) -> list[JobResult]:
    """Runs every job in its own actor on the node that has its resources, all at once, and
    returns one :class:`JobResult` per job (in order) when all are done.

    Connects to the cluster at ``address`` (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``)
    unless this process is already connected (then that connection is used and kept).

    A job whose actor dies (its node or worker process killed) and that has a ``resume`` is
    started again in a new actor, which Ray places as soon as a live node advertises its
    resources again (the same node back, or another), as long as the run lasts: ``duration_s``
    seconds after the jobs started, or, without a duration, ``start_timeout_s`` after the
    death. A job not restarted in time gets an ``error`` saying its actor died (its ``progress``
    is the last it reported); the others run on.

    ``wait_for_nodes``: a job whose resources no live node advertises at the start waits for
    a node with them to join (within ``duration_s``; without one, until it is interrupted)
    instead of raising :class:`PlacementError`, and then runs for the time left (its
    ``resume`` payload); if none joins in time its result has ``node_id`` None and an
    ``error`` starting "waiting for a node".

    ``on_status``: called (on this thread) every ``status_s`` seconds while the jobs start and
    run, and at once when a job changes state (placed, lost, restarting, ended), with a
    :class:`ClusterStatus` of every job (its state, node and latest progress snapshot), and
    once more when all are done (``done`` True, each job's last snapshot: the
    last one its work reported before it returned). What it raises ends the run.

    Raises:
        ClusterError: the cluster can't be reached, or an actor whose resources a live node
            advertised did not start within ``start_timeout_s``.
        PlacementError: a job's resources are on no live node (checked before any actor
            starts), unless ``wait_for_nodes``; or live nodes can't hold every job together.
    """
    try:
        import ray
    except ImportError:
        raise ClusterError("running on a cluster needs Ray: pip install 'orchestra[ray]'") from None
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    own = not ray.is_initialized()
    if own:
        _reachable(address)
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"can't connect to the Ray cluster at {address!r}: {exc}") from None
    actors: list[Any] = []
    try:
        nodes = cluster_nodes()
        jobs = [for_nodes(j, nodes) for j in jobs]
        tries = [_Try(job) for job in jobs]
        absent = {j.camera: m for j in jobs if (m := _missing(j, nodes))} if wait_for_nodes else {}
        check_placement([j for j in jobs if j.camera not in absent], nodes)
        cls = ray.remote(_CameraActor)
        # on the head node (it outlives the others; the driver's own raylet is not always the head's
        # when several nodes share an address)
        progress = ray.remote(_Progress).options(num_cpus=0, resources={"node:__internal_head__": 0.001}).remote()
        actors.append(progress)

        def start(t: _Try) -> None:
            """A new actor for ``t``; Ray holds it until a live node has its resources."""
            res, labels = label_selector(t.job, nodes)
            cpus = res.pop("CPU", 0.0)
            opts: dict[str, Any] = {"label_selector": labels} if labels else {}
            t.actor = cls.options(num_cpus=cpus, resources=res, max_restarts=0, name=None, lifetime=None,
                                  **opts).remote()
            actors.append(t.actor)
            t.ref, t.running, t.node, t.ip = t.actor.where.remote(), False, None, None

        for t in tries:
            start(t)
            if t.job.camera in absent:
                t.late = True
                _log.bind(camera=t.job.camera).info("camera waiting for a node", resources=_fmt_res(t.job.resources),
                                                    missing=absent[t.job.camera])
        t0 = time.monotonic()
        t_run: float | None = None
        seen: dict[Any, Any] = {}  # the progress actor's latest snapshots, as last read
        next_status = t0
        shown: tuple[Any, ...] = ()  # the states of the last status

        def states() -> tuple[Any, ...]:
            return tuple((t.running, t.tries, t.late, t.node, t.result is None) for t in tries)

        def due() -> bool:
            """Time for a status: a second since the last, or a job changed state (shown at once)."""
            return on_status is not None and (time.monotonic() >= next_status or states() != shown)

        def emit(done: bool = False) -> None:
            """``on_status`` with every job's state and latest snapshot (now)."""
            nonlocal next_status, seen, shown
            if on_status is None:
                return
            shown = states()
            try:
                seen = dict(ray.get(progress.get.remote(), timeout=5))
            except (RayActorError, GetTimeoutError):
                pass  # what was read last
            elapsed = 0.0 if t_run is None else round(time.monotonic() - t_run, 3)
            next_status = time.monotonic() + status_s
            on_status(ClusterStatus(elapsed, duration_s, tuple(t.status(seen) for t in tries), done))

        emit()
        died: list[tuple[_Try, BaseException]] = []
        pending = [t for t in tries if t.job.camera not in absent]
        while pending:
            left = start_timeout_s - (time.monotonic() - t0)
            if left <= 0:
                t = pending[0]
                raise ClusterError(f"camera {t.job.camera!r}: its actor did not start on a node with "
                                   f"{_fmt_res(t.job.resources)} within {start_timeout_s:g} s")
            wait = min(left, max(0.05, next_status - time.monotonic())) if on_status is not None else left
            ready, _ = ray.wait([t.ref for t in pending], num_returns=len(pending), timeout=wait)
            for t in [t for t in pending if any(t.ref == r for r in ready)]:
                try:
                    t.node, t.ip = ray.get(t.ref)
                except RayActorError as exc:
                    _log.warning("camera actor died before it started", camera=t.job.camera, error=str(exc))
                    died.append((t, exc))
            pending = [t for t in pending if not any(t.ref == r for r in ready)]
            if pending and due():
                emit()
        t_run = time.monotonic()
        deadline = None if duration_s is None else t_run + duration_s

        def since() -> float:
            return round(time.monotonic() - (t_run or 0.0), 3)

        def begin(t: _Try) -> None:
            """``t``'s actor is on its node: run the work there (a restart: for the time left)."""
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 and t.late:
                give_up(t)  # placed just as the run ended
                return
            payload = t.job.payload
            if t.job.resume is not None and t.late:
                payload = t.job.resume(t.job.payload, left)  # the time the run has left
            log = _log.bind(camera=t.job.camera, node=t.node)
            if t.tries:
                log.info("camera restarted", address=t.ip, restarts=t.tries, lost_node=t.earlier[-1].node_id,
                         seconds_left=None if left is None else round(left, 3))
            elif t.late:
                log.info("camera placed on a node that joined" if t.job.camera in absent else "camera placed late",
                         address=t.ip, waited_s=since())
            else:
                log.info("camera placed", address=t.ip)
            t.started, t.running = since(), True
            t.run_until = None if run_timeout_s is None else time.monotonic() + run_timeout_s
            t.ref = t.actor.run.remote(t.job.work, payload, progress, (t.job.camera, t.tries))

        def lost(t: _Try, exc: BaseException) -> None:
            """``t``'s actor died: start a new one while the run lasts, else that is its result."""
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            left = None if deadline is None else deadline - time.monotonic()
            again = t.job.resume is not None and (left is None or left > MIN_RESTART_S)
            if not t.running:  # died before it ran anything (placed on a node that was dying): no frames
                if again:
                    _log.bind(camera=t.job.camera, node=t.node).info("camera actor died before it started; "
                                                                     "trying again", error=first)
                    t.late, t.actor, t.ref, t.retry_at = True, None, None, time.monotonic() + RETRY_S
                    if t.wait_until is None:
                        t.wait_until = time.monotonic() + (start_timeout_s if left is None else left)
                elif t.earlier:
                    give_up(t)
                else:
                    t.result = JobResult(t.job.camera, t.node, t.ip, error=f"its actor died before it started: {first}",
                                         resources=dict(t.job.resources), ended_s=since())
                return
            last = None
            try:
                last = ray.get(progress.get.remote(), timeout=30).get((t.job.camera, t.tries))
            except (RayActorError, GetTimeoutError):
                last = None
            seg = JobResult(t.job.camera, t.node, t.ip, error=f"its actor died (node {t.node} lost?): {first}",
                            resources=dict(t.job.resources), progress=last, started_s=t.started, ended_s=since())
            log = _log.bind(camera=t.job.camera, node=t.node)
            if again:
                t.earlier.append(seg)
                t.tries += 1
                t.late = True
                start(t)
                t.wait_until = time.monotonic() + (start_timeout_s if left is None else left)
                log.warning("camera lost its node; restarting it when a live node has its resources",
                            resources=_fmt_res(t.job.resources), restarts=t.tries)
            else:
                log.warning("camera lost its node", error=seg.error)
                t.result = dataclasses.replace(seg, earlier=tuple(t.earlier))

        def give_up(t: _Try) -> None:
            """No node with ``t``'s resources came (back) in time."""
            if t.actor is not None:
                try:
                    ray.kill(t.actor)
                except Exception:  # noqa: BLE001 - never placed
                    pass
            log = _log.bind(camera=t.job.camera)
            if t.earlier:  # its node did not come back: the last try's death is its result
                log.warning("camera not restarted: no live node had its resources in time",
                            resources=_fmt_res(t.job.resources))
                t.result = dataclasses.replace(t.earlier[-1], earlier=tuple(t.earlier[:-1]))
            else:
                log.warning("camera never started: no node with its resources joined in time",
                            resources=_fmt_res(t.job.resources))
                within = "before the run ended" if duration_s is None else f"within the run's {duration_s:g} s"
                t.result = JobResult(t.job.camera, None, None, resources=dict(t.job.resources), ended_s=since(),
                                     error=f"waiting for a node: no live node advertised "
                                           f"{', '.join(absent.get(t.job.camera, [])) or _fmt_res(t.job.resources)} "
                                           f"{within}")

        for t in tries:
            if t.job.camera in absent:
                t.wait_until = deadline
            elif not any(t is d for d, _ in died):
                begin(t)
        for t, exc in died:
            lost(t, exc)

        while True:
            live = [t for t in tries if t.result is None]
            now = time.monotonic()
            for t in live:
                if not t.running and t.wait_until is not None and now >= t.wait_until:
                    give_up(t)
                elif t.ref is None and t.retry_at is not None and now >= t.retry_at:
                    t.retry_at = None
                    start(t)
                elif t.running and t.run_until is not None and now >= t.run_until:
                    t.result = JobResult(t.job.camera, t.node, t.ip, error=f"still running after {run_timeout_s:g} s",
                                         resources=dict(t.job.resources), earlier=tuple(t.earlier),
                                         started_s=t.started, ended_s=since())
            live = [t for t in tries if t.result is None]
            if not live:
                break
            limits = [x for t in live for x in ((t.run_until,) if t.running else (t.wait_until, t.retry_at))
                      if x is not None]
            if on_status is not None:
                limits.append(next_status)
            timeout = min([1.0] + [max(0.0, x - now) for x in limits])  # 1 s: stays interruptible
            refs = [t.ref for t in live if t.ref is not None]
            if due():
                emit()
            if not refs:  # only retries to come
                time.sleep(timeout)
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            for t in [t for t in live if t.ref is not None and any(t.ref == r for r in ready)]:
                if not t.running:
                    try:
                        t.node, t.ip = ray.get(t.ref)
                    except RayActorError as exc:
                        lost(t, exc)
                        continue
                    begin(t)
                    continue
                try:
                    value = ray.get(t.ref)
                except RayActorError as exc:
                    lost(t, exc)
                except RayTaskError as exc:
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    t.result = JobResult(t.job.camera, t.node, t.ip, error=f"{type(cause).__name__}: {cause}",
                                         resources=dict(t.job.resources), earlier=tuple(t.earlier),
                                         started_s=t.started, ended_s=since())
                else:
                    t.result = JobResult(t.job.camera, t.node, t.ip, value=value, resources=dict(t.job.resources),
                                         earlier=tuple(t.earlier), started_s=t.started, ended_s=since())
        emit(done=True)
        return [t.result for t in tries if t.result is not None]
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead with its node
                pass
        if own:
            ray.shutdown()
