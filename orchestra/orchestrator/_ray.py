"""Instances on a Ray cluster: the generic cluster pieces (errors, live nodes, reachability)
and the Ray-actor worker kind behind ``Orchestrator(cluster=...)``.

Ray is the ``ray`` extra and is imported only when a cluster is used (never at import time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import Error, OrchestraError
from ..telemetry import get_logger
from ._errors import ResourceError

__all__ = ["ClusterError", "NodeInfo", "PlacementError", "cluster_nodes"]

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
    """A live node: its Ray node id, address and the resources it advertises in total."""

    node_id: str
    address: str
    resources: Mapping[str, float]


def _fmt_res(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(res.items())) or "none"


_HIDDEN = ("memory", "object_store_memory")


def _shown(res: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in res.items() if k not in _HIDDEN and not k.startswith("node:")}


def cluster_nodes() -> list[NodeInfo]:
    """The live nodes of the cluster this process is connected to."""
    import ray

    return [NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
            for n in ray.nodes() if n.get("Alive")]


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
