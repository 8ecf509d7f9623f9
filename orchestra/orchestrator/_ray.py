"""Instances on a Ray cluster: the generic cluster pieces (errors, live nodes, reachability)
and the Ray-actor worker kind behind ``Orchestrator(cluster=...)``.

Ray is the ``ray`` extra and is imported only when a cluster is used (never at import time).
"""

from __future__ import annotations

import gc
import importlib.util
import pathlib
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..program import dumps
from ..runtime import Program, load_program
from ..telemetry import get_logger
from ._errors import InstanceFailedError, ResourceError
from ._methods import load_for_worker
from ._process import describe_error, rebuild_error
from ._resources import Reservation, Slot
from ._threads import apply_blas_limit
from ._worker import Worker

__all__ = ["ActorLostError", "ClusterError", "NodeInfo", "PlacementError", "RayWorker", "cluster_nodes", "ray_resources"]

_log = get_logger("orchestra.orchestrator.ray")


class ClusterError(OrchestraError):
    """The cluster can't be reached (or Ray is not installed), or an actor could not run there."""

    default_code = Error.AccessFailed


class PlacementError(ClusterError, ResourceError):
    """No live node of the cluster has the resources a binding needs (also a
    :class:`ResourceError`); the message names the instance or camera, the resources missing
    and what every node has."""

    default_code = Error.OutOfResources


@dataclass(frozen=True)
class NodeInfo:
    """A live node: its Ray node id, address, the resources it advertises in total and its
    Ray node labels (``ray start --labels``)."""

    node_id: str
    address: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


def _fmt_res(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(res.items())) or "none"


_HIDDEN = ("memory", "object_store_memory")


def _shown(res: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in res.items() if k not in _HIDDEN and not k.startswith("node:")}


def cluster_nodes() -> list[NodeInfo]:
    """The live nodes of the cluster this process is connected to."""
    import ray

    return [NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})),
                     dict(n.get("Labels") or {})) for n in ray.nodes() if n.get("Alive")]


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address must accept a TCP connection (else
    ``ray.init`` retries for minutes before it gives up)."""
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if address in ("auto", "local") or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"can't connect to the Ray cluster at {address!r}: {exc.strerror or exc} (is its head "
                           f"node started? ray start --head --port {port})") from None


# -- Orchestrator(cluster=...): instances in Ray actors -----------------------------------------

RAY_EXTRA = "pip install 'orchestra[ray]'"
START_TIMEOUT_S = 60.0  # how long an instance's actor may wait for a node with its resources


class ActorLostError(ClusterError):
    """An instance's Ray actor died (its node went away, or its worker process was killed);
    the message names the node it ran on."""

    def __init__(self, message: str, *, node_id: str | None = None, address: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.address = address


def _need_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(f"Orchestrator(cluster=...) runs instances on a Ray cluster and needs Ray: {RAY_EXTRA}") from None
    return ray


def check_cluster_address(cluster: Any) -> str:
    """The ``cluster`` argument of an Orchestrator, checked (Ray is not imported)."""
    if not isinstance(cluster, str) or not cluster.strip():
        raise InvalidArgumentError(f"cluster must be 'auto', 'ray://HOST:PORT' or 'HOST:PORT', got {cluster!r}")
    if importlib.util.find_spec("ray") is None:
        raise ClusterError(f"Orchestrator(cluster={cluster!r}) runs instances on a Ray cluster and needs Ray: {RAY_EXTRA}")
    return cluster.strip()


def node_label(node_id: str | None, address: str | None) -> str:
    """``node 1a2b3c4d (10.0.0.7)``: how messages name a node."""
    return f"node {node_id[:8] if node_id else '?'} ({address or '?'})"


def ray_resources(reservation: Reservation, capacity: Callable[[Slot], int | None]) -> dict[str, float]:
    """The Ray resources an instance's actor requests for its binding: ``DEVICE.core.N`` for
    each core slot (all of it when the core is exclusive, ``1/capacity`` of it when shared),
    ``camera.NAME`` for a camera it is bound to, and ``CPU`` = the number of CPUs bound."""
    out: dict[str, float] = {}
    cpus = 0
    for slot in reservation.slots:
        unit, value = slot
        if unit == "cpu":
            cpus += 1
            continue
        cap = capacity(slot)
        out[f"{unit}.{value}"] = 1.0 if cap == 1 else (1.0 / cap if cap else 0.001)
    for unit, value in reservation.bind.items():
        if unit == "camera" or unit.endswith(".camera"):
            out[f"camera.{value}"] = 1.0
    if cpus:
        out["CPU"] = float(cpus)
    return out


def _plain(options: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {b: dict(v) for b, v in options.items()}


def _frozen(options: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({b: MappingProxyType(dict(v)) for b, v in options.items()})


class RayCluster:
    """One Orchestrator's connection to a Ray cluster (made in ``__aenter__``, on a thread)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ray: Any = None
        self.own = False
        self._actor_cls: Any = None
        self._programs: dict[int, tuple[Program, Any]] = {}  # id(program) -> (program, its ObjectRef)
        self.start_timeout_s = START_TIMEOUT_S

    def connect(self) -> None:
        ray = _need_ray()
        self.ray = ray
        if ray.is_initialized():  # this process is connected already: use that connection and keep it
            return
        _reachable(self.address)
        try:
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"can't connect to the Ray cluster at {self.address!r}: {exc}") from None
        self.own = True
        nodes = cluster_nodes()
        _log.info("connected to the Ray cluster", address=self.address, nodes=len(nodes))

    def close(self) -> None:
        self._programs.clear()
        if self.own and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        self.own = False

    @property
    def actor_cls(self) -> Any:
        if self._actor_cls is None:
            self._actor_cls = self.ray.remote(_InstanceActor)
        return self._actor_cls

    def program_ref(self, program: Program) -> Any:
        """The program's bytes in the cluster's object store, put once: every actor gets the
        same object, which Ray copies to a node once (actors there share it)."""
        have = self._programs.get(id(program))
        if have is not None and have[0] is program:
            return have[1]
        src = program.source
        if src not in ("<bytes>", "<ProgramDef>") and pathlib.Path(src).is_file():
            data = pathlib.Path(src).read_bytes()
        else:
            data = dumps(program.definition)
        ref = self.ray.put(np.frombuffer(data, np.uint8))
        self._programs[id(program)] = (program, ref)
        return ref

    def live_nodes(self, exclude: set[str] = frozenset()) -> list[NodeInfo]:  # type: ignore[assignment]
        """The nodes Ray lists alive, but ``exclude``."""
        return [NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
                for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in exclude]

    def node_gone(self, node_id: str) -> bool:
        """Ray lists the node dead, or its raylet's port refuses connections (a node killed a
        moment ago stays listed alive for seconds). A port that does not answer at all (a
        firewall between a ``ray://`` client and the nodes) proves nothing: not gone."""
        for n in self.ray.nodes():
            if n["NodeID"] != node_id:
                continue
            if not n.get("Alive"):
                return True
            port = n.get("NodeManagerPort")
            if not port:
                return False
            try:
                socket.create_connection((n.get("NodeManagerAddress", "?"), int(port)), timeout=2.0).close()
            except ConnectionRefusedError:
                return True
            except OSError:
                return False
            return False
        return True

    def check(self, instance: str, resources: Mapping[str, float], exclude: set[str] = frozenset(),  # type: ignore[assignment]
              lost: str = "") -> list[NodeInfo]:
        """The live nodes that advertise all of ``resources`` in total (not ``exclude``d).

        Raises:
            PlacementError: none does.
        """
        nodes = self.live_nodes(exclude)
        need = {k: v for k, v in resources.items() if v > 0}
        fits = [n for n in nodes if all(n.resources.get(k, 0.0) + 1e-9 >= v for k, v in need.items())]
        if fits:
            return fits
        missing = [k for k, v in need.items() if not any(n.resources.get(k, 0.0) + 1e-9 >= v for n in nodes)]
        have = "; ".join(f"{node_label(n.node_id, n.address)}: {_fmt_res(_shown(n.resources))}" for n in nodes)
        why = f"no live node advertises {', '.join(missing)}" if missing else "no live node has them all"
        raise PlacementError(f"{lost}instance {instance!r} needs Ray resources {_fmt_res(need)}: {why} "
                             f"(nodes: {have or 'none alive'}); start a node with them, e.g. ray start --address "
                             f"HEAD:PORT --resources '{{{', '.join(f'{chr(34)}{k}{chr(34)}: {v:g}' for k, v in need.items())}}}'")


class _InstanceActor:
    """On a node of the cluster: one instance's Method (Ray runs one call at a time)."""

    def __init__(self, program: Any, method_name: str, methods: tuple[str, ...],
                 options: Mapping[str, Mapping[str, Any]], initializer: Callable[[], None] | None,
                 blas_threads: int | None) -> None:
        self._args = (program, method_name, methods, options, initializer, blas_threads)
        self.m: Any = None
        self._sent: Any = None

    def load(self) -> tuple:
        import ray

        program, method_name, methods, options, initializer, blas_threads = self._args
        self._args = None
        try:
            blas = apply_blas_limit(blas_threads)
            if initializer is not None:
                initializer()
            self.m = load_for_worker(load_program(memoryview(program)), method_name, methods, options)
            self._sent = self.m.options()
            # The collector's first full pass over the actor's heap (Ray's own objects
            # included), here rather than in the middle of the first executes
            gc.collect()
            return ("ok", ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                    _plain(self._sent), blas)
        except BaseException as exc:  # noqa: BLE001 - sent to the driver
            return ("err", describe_error(exc))

    def execute(self, inputs: Any, overrides: Any) -> tuple:
        m = self.m
        t0 = time.perf_counter()
        try:
            outs = m.execute(inputs, overrides)
        except BaseException as exc:  # noqa: BLE001 - sent to the driver
            return ("err", describe_error(exc))
        dt = time.perf_counter() - t0
        now = m.options()
        if now is self._sent:
            return ("ok", outs, dt, None)
        self._sent = now
        return ("ok", outs, dt, _plain(now))

    def call(self, what: str, *args: Any) -> tuple:
        """``set_options`` / ``commit_options`` / ``prepare_backend_options``: the options in force after it."""
        try:
            getattr(self.m, what)(*args)
        except BaseException as exc:  # noqa: BLE001 - sent to the driver
            return ("err", describe_error(exc))
        self._sent = self.m.options()
        return ("ok", _plain(self._sent))

    def close(self) -> None:
        m, self.m = self.m, None
        if m is not None:
            m.close()


class _RemoteMethod:
    """The driver's side of an instance's actor, used by its RayWorker thread as its Method."""

    def __init__(self, worker: RayWorker, actor: Any, node_id: str, address: str,
                 options: Mapping[str, Mapping[str, Any]]) -> None:
        self.worker = worker
        self.actor = actor
        self.node_id = node_id
        self.address = address
        self._options = _frozen(options)
        self._ray = worker.cluster.ray

    def _get(self, ref: Any) -> Any:
        ray = self._ray
        try:
            reply = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ActorLostError(f"instance {self.worker.instance!r}: its Ray actor on "
                                 f"{node_label(self.node_id, self.address)} died ({first})",
                                 node_id=self.node_id, address=self.address) from None
        if reply[0] == "err":
            raise rebuild_error(reply[1], f"instance {self.worker.instance!r} on {node_label(self.node_id, self.address)}")
        return reply

    def execute(self, inputs: Any, overrides: Any = None) -> list[Any]:
        _, outs, _dt, options = self._get(self.actor.execute.remote(inputs, overrides))
        if options is not None:
            self._options = _frozen(options)
        return outs

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        return self._options

    def _call(self, what: str, *args: Any) -> None:
        self._options = _frozen(self._get(self.actor.call.remote(what, *args))[1])

    def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        self._call("set_options", _plain(options))

    def commit_options(self) -> None:
        self._call("commit_options")

    def prepare_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        self._call("prepare_backend_options", backend_id, dict(values))

    def kill(self) -> None:
        try:
            self._ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass

    def close(self) -> None:
        try:
            self._ray.get(self.actor.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - dead already, or stuck: killed below
            pass
        self.kill()


class RayWorker(Worker):
    """An instance whose Method runs in a Ray actor on the node that has its binding's
    resources: a driver thread (the :class:`Worker` loop: requests, option changes at execute
    boundaries, restarts) calls the actor for each execute. ``node_id``/``address``: where
    the actor runs now."""

    def __init__(self, *, cluster: RayCluster, reservation: Callable[[], Reservation],
                 capacity: Callable[[Slot], int | None], initializer: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.initializer = initializer
        self.reservation = reservation  # the instance's, now (Pool.move replaces it)
        self.capacity = capacity
        held = reservation()
        self.resources = ray_resources(held, capacity)
        self.cpus_bound = held.cpus
        self.node_id: str | None = None
        self.address: str | None = None
        self._lost: set[str] = set()  # nodes whose actor died and that no longer answer

    @property
    def label(self) -> str:
        return f"{self.thread.name} -> Ray actor on {node_label(self.node_id, self.address)}"

    def start(self) -> None:
        threads = self.threads
        if threads is not None:
            self.blas_source = threads.for_process(self.cpus_bound)[1]
        self.thread.start()

    def _pin(self, cpus: tuple[int, ...] | None) -> None:
        """The driver thread only waits on the actor: CPU placement is the actor's ``CPU`` resource."""

    def _load(self, resources: Mapping[str, float] | None = None) -> Any:
        ray = self.cluster.ray
        resources = self.resources if resources is None else resources
        lost = ""
        if self._lost:
            lost = f"its node{'s' if len(self._lost) > 1 else ''} {', '.join(i[:8] for i in self._lost)} died; "
        fits = self.cluster.check(self.instance, resources, self._lost, lost)
        res = dict(resources)
        num_cpus = res.pop("CPU", 0.0)
        blas = self.threads.for_process(self.cpus_bound)[0] if self.threads is not None else None
        where: dict[str, Any] = {}
        if self._lost:  # Ray may still count a node that just died as alive: prefer one that answers
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            where["scheduling_strategy"] = NodeAffinitySchedulingStrategy(fits[0].node_id, soft=True)
        actor = self.cluster.actor_cls.options(
            num_cpus=num_cpus, resources=res, max_restarts=0, max_concurrency=1,
            name=None, lifetime=None, **where).remote(self.cluster.program_ref(self.program), self.method_name,
                                             self.methods, _plain(self.desired()), self.initializer, blas)
        try:
            reply = ray.get(actor.load.remote(), timeout=self.cluster.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise ClusterError(f"instance {self.instance!r}: its Ray actor did not start within "
                               f"{self.cluster.start_timeout_s:g} s on a node with {_fmt_res(resources)} "
                               f"(are they taken by other actors?)") from None
        except ray.exceptions.RayActorError as exc:
            ray.kill(actor)
            raise ClusterError(f"instance {self.instance!r}: its Ray actor died while loading: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
        if reply[0] == "err":
            ray.kill(actor)
            raise rebuild_error(reply[1], f"instance {self.instance!r}")
        _, node_id, address, options, blas_in_force = reply
        address = next((n.address for n in cluster_nodes() if n.node_id == node_id), address)  # as Ray names it
        self.node_id, self.address, self.blas = node_id, address, blas_in_force
        _log.info("instance placed on a Ray node", instance=self.instance, node=node_id, address=address,
                  resources=_fmt_res(resources))
        return _RemoteMethod(self, actor, node_id, address, options)

    def _boundary(self) -> None:
        """Option changes at an execute boundary; a move (``Pool.move``: the instance's
        reservation now asks for other Ray resources) starts a new actor where they are,
        loaded with the desired options, swaps it in and ends the old one."""
        held = self.reservation()
        want = ray_resources(held, self.capacity)
        if want == self.resources or self.method is None:
            super()._boundary()
            return
        self._flush()
        changes = list(self.mailbox)
        self.mailbox.clear()
        shared = sorted(k for k in want if k in self.resources and k != "CPU")
        try:
            if shared:
                raise ClusterError(f"instance {self.instance!r}: can't move on a cluster to a binding that keeps "
                                   f"Ray resource(s) {', '.join(shared)} (its new actor would wait for the old one's)",
                                   Error.NotSupported)
            new = self._load(want)
        except Exception as exc:  # noqa: BLE001 - the move fails; the old actor and binding stay
            for ch in changes:
                self._ack(ch, exc)
            return
        old, self.method = self.method, new
        self.resources, self.cpus_bound = want, held.cpus
        old.close()
        for ch in changes:  # the new actor loaded the desired options: every queued change is in force
            self._ack(ch, None)

    def kill(self) -> None:
        """Kills the actor (a stuck execute's ``ray.get`` then returns)."""
        m = self.method
        if isinstance(m, _RemoteMethod):
            m.kill()

    def _failed(self, fut: Any, exc: Exception) -> bool:
        if not isinstance(exc, ActorLostError):
            return super()._failed(fut, exc)
        gone = exc.node_id is not None and self.cluster.node_gone(exc.node_id)
        if gone:
            self._lost.add(exc.node_id)  # type: ignore[arg-type]
            try:
                self.cluster.check(self.instance, self.resources, self._lost)
            except PlacementError as perr:  # nowhere to restart: failed now, naming the node
                self.failures += 1
                self.last_error = exc
                reason = (f"its {node_label(exc.node_id, exc.address)} died and no other live node has "
                          f"{_fmt_res(self.resources)} ({perr})")
                err = InstanceFailedError(f"instance {self.instance!r} failed: {reason}", instance=self.instance)
                err.__cause__ = exc
                m, self.method = self.method, None
                if isinstance(m, _RemoteMethod):
                    m.kill()
                self._fail(reason, exc)  # the loop marks the instance failed first, then its caller hears
                self.pending.append((fut, False, err))
                self._flush()
                return False
        verdict, reason, answer = self._judge_failure(fut, exc, fatal=True)
        self.pending.append(answer)
        if verdict == "failed":
            self._fail(reason, exc)
            return False
        self._flush()
        return self._restart(exc)
