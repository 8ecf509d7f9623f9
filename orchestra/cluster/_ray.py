"""Cameras as Ray actors placed by custom resources (the ``ray`` extra; imported only when used)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..orchestrator._ray import ClusterError, NodeInfo, PlacementError, _fmt_res, _reachable, _shown, cluster_nodes
from ..telemetry import get_logger

__all__ = ["CameraJob", "ClusterError", "JobResult", "NodeInfo", "PlacementError", "camera_resources",
           "check_placement", "cluster_nodes", "run_jobs"]

_log = get_logger("orchestra.cluster")

NODE_SHARE = 0.01  # of a node's "node.NAME" resource a camera pinned to it takes (many cameras per node)


@dataclass(frozen=True)
class CameraJob:
    """One camera's work for one actor: ``work(payload, report)`` runs in an actor that
    requests ``resources`` (so Ray starts it on a node that has them) and its return value
    travels back to the driver. ``report(snapshot)`` sends a progress snapshot to the driver
    (non-blocking; the driver keeps the latest: :attr:`JobResult.progress`, what is known of
    a job whose node died). ``work`` must be a module-level function importable on every node."""

    camera: str
    resources: Mapping[str, float]
    work: Callable[[Any], Any]
    payload: Any = None


@dataclass(frozen=True)
class JobResult:
    """What one camera's actor did: the node it ran on, ``value`` (what ``work`` returned) or
    ``error`` (why it has no value: the work raised, or its node or actor died)."""

    camera: str
    node_id: str | None
    address: str | None
    value: Any = None
    error: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    progress: Any = None  # the latest snapshot the job reported (None: none yet)

    @property
    def ok(self) -> bool:
        return self.error is None


def camera_resources(camera: str, core: tuple[str, int] | None = None, node: str | None = None,
                     cpus: int = 0) -> dict[str, float]:
    """The Ray resources a camera's actor requests: ``camera.NAME`` (the node it is wired
    to), ``DEVICE.core.N`` for its NPU core binding, ``node.NAME`` (a share of it) when the
    config pins it to a named node, and ``CPU`` when ``cpus`` > 0."""
    res: dict[str, float] = {f"camera.{camera}": 1.0}
    if core is not None:
        res[f"{core[0]}.core.{core[1]}"] = 1.0
    if node is not None:
        res[f"node.{node}"] = NODE_SHARE
    if cpus:
        res["CPU"] = float(cpus)
    return res


def check_placement(jobs: Sequence[CameraJob], nodes: Sequence[NodeInfo]) -> dict[str, str]:
    """Which node each camera will run on (camera -> node id), assigning each job in turn to
    the first node that still has its resources (what Ray's scheduler will find for exact
    resources such as ``camera.NAME``).

    Raises:
        PlacementError: a camera's resources are on no node, or taken by cameras before it;
            the message names the camera, the resources missing and what every node has.
    """
    left = {n.node_id: dict(n.resources) for n in nodes}
    taken: dict[str, list[str]] = {}
    placed: dict[str, str] = {}
    for job in jobs:
        fits = [n for n in nodes if all(left[n.node_id].get(k, 0.0) + 1e-9 >= v for k, v in job.resources.items())]
        if not fits:
            have = "; ".join(f"node {n.node_id[:8]} ({n.address}): {_fmt_res(_shown(n.resources))}" for n in nodes)
            missing = [k for k, v in job.resources.items() if not any(n.resources.get(k, 0.0) >= v for n in nodes)]
            users = sorted({c for k in job.resources for c in taken.get(k, [])})
            why = (f"no node advertises {', '.join(missing)}" if missing else
                   f"no node has them all free (taken by camera{'s' if len(users) > 1 else ''} {', '.join(users)})"
                   if users else "no node has them all")
            raise PlacementError(f"camera {job.camera!r} needs Ray resources {_fmt_res(job.resources)}: {why} "
                                 f"(nodes: {have or 'none alive'}); start the node wired to it with "
                                 f"ray start --resources '{{\"camera.{job.camera}\": 1, ...}}'")
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

    def run(self, work: Callable[[Any, Callable[[Any], None]], Any], payload: Any, progress: Any, camera: str) -> Any:
        def report(snapshot: Any) -> None:
            progress.put.remote(camera, snapshot)

        return work(payload, report)


class _Progress:
    """On the driver's node: the latest progress snapshot of every job."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    def put(self, camera: str, snapshot: Any) -> None:
        self.latest[camera] = snapshot

    def get(self) -> dict[str, Any]:
        return self.latest


def run_jobs(jobs: Sequence[CameraJob], address: str = "auto", *, start_timeout_s: float = 60.0,
             run_timeout_s: float | None = None) -> list[JobResult]:
    """Runs every job in its own actor on the node that has its resources, all at once, and
    returns one :class:`JobResult` per job (in order) when all are done.

    Connects to the cluster at ``address`` (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``)
    unless this process is already connected (then that connection is used and kept). A job
    whose actor dies (its node or worker process killed) gets an ``error`` saying so; the
    others run on.

    Raises:
        ClusterError: the cluster can't be reached, or an actor did not start within
            ``start_timeout_s``.
        PlacementError: a job's resources are on no live node (checked before any actor starts).
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
        check_placement(jobs, nodes)
        cls = ray.remote(_CameraActor)
        # on the head node (it outlives the others; the driver's own raylet is not always the head's
        # when several nodes share an address)
        progress = ray.remote(_Progress).options(num_cpus=0, resources={"node:__internal_head__": 0.001}).remote()
        actors.append(progress)
        for job in jobs:
            res = dict(job.resources)
            cpus = res.pop("CPU", 0.0)
            actors.append(cls.options(num_cpus=cpus, resources=res, max_restarts=0,
                                      name=None, lifetime=None).remote())
        cams = actors[1:]
        where_refs = [a.where.remote() for a in cams]
        t0 = time.monotonic()
        where: list[tuple[str | None, str | None]] = []
        for job, ref in zip(jobs, where_refs):
            try:
                where.append(ray.get(ref, timeout=max(0.1, start_timeout_s - (time.monotonic() - t0))))
            except GetTimeoutError:
                raise ClusterError(f"camera {job.camera!r}: its actor did not start on a node with "
                                   f"{_fmt_res(job.resources)} within {start_timeout_s:g} s") from None
            except RayActorError as exc:
                where.append((None, None))
                _log.warning("camera actor died before it started", camera=job.camera, error=str(exc))
        for job, (node, ip) in zip(jobs, where):
            _log.info("camera placed", camera=job.camera, node=node, address=ip)
        run_refs = [a.run.remote(job.work, job.payload, progress, job.camera) for a, job in zip(cams, jobs)]
        results = []
        for job, (node, ip), ref in zip(jobs, where, run_refs):
            try:
                value = ray.get(ref, timeout=run_timeout_s)
                results.append(JobResult(job.camera, node, ip, value=value, resources=dict(job.resources)))
            except RayActorError as exc:
                try:
                    last = ray.get(progress.get.remote(), timeout=30).get(job.camera)
                except (RayActorError, GetTimeoutError):
                    last = None
                results.append(JobResult(job.camera, node, ip, error=f"its actor died (node {node} lost?): "
                                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                                         resources=dict(job.resources), progress=last))
            except RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                results.append(JobResult(job.camera, node, ip, error=f"{type(cause).__name__}: {cause}",
                                         resources=dict(job.resources)))
            except GetTimeoutError:
                results.append(JobResult(job.camera, node, ip, error=f"still running after {run_timeout_s:g} s",
                                         resources=dict(job.resources)))
        return results
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead with its node
                pass
        if own:
            ray.shutdown()
