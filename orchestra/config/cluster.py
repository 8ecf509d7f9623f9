"""``[cluster]`` (run the cameras across a Ray cluster) and a camera's ``node`` key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._base import _BAD, Checker, _hint, _join, _names, _show

_CLUSTER_KEYS = ("address", "timeout_s", "wait_for_nodes")
_NODE = re.compile(r"[A-Za-z0-9_.-]+")
_ADDRESS = re.compile(r"(auto|local|ray://[^\s]+|[A-Za-z0-9_.-]+:\d+)")


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the Ray cluster the cameras run on.

    ``address``: ``"auto"`` (the cluster this machine belongs to, as ``ray start`` left it),
    ``"HOST:PORT"`` (a head's GCS) or ``"ray://HOST:PORT"`` (Ray Client). ``timeout_s``: how
    long to wait for every camera's actor to start on its node (and, in a run without a
    duration, for a lost node's camera to find a node again). ``wait_for_nodes``: a camera
    whose resources no live node advertises at the start waits for a node with them to join
    (within the run's duration) instead of failing the run.
    """

    address: str = "auto"
    timeout_s: float = 60.0
    wait_for_nodes: bool = False


class ClusterChecks(Checker):
    """Checks ``[cluster]`` (sets ``cluster_config``) and a camera's ``node``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cluster_config: ClusterConfig | None = None

    def check_cluster(self, value: Any) -> None:
        if value is None:
            return
        t = self.table(value, "cluster")
        if t is None:
            return
        self.known(t, "cluster", _CLUSTER_KEYS)
        address = self.get(t, "address", "cluster", "string", "auto")
        if address is not _BAD and not _ADDRESS.fullmatch(address):
            self.err(_join("cluster", "address"), f"{_show(address)} is not a Ray address: use \"auto\", "
                                                  f"\"HOST:PORT\" (a head node) or \"ray://HOST:PORT\"")
            address = _BAD
        timeout = self.get(t, "timeout_s", "cluster", "positive_number", 60.0)
        wait = self.get(t, "wait_for_nodes", "cluster", "bool", False)
        if address is not _BAD and timeout is not _BAD and wait is not _BAD:
            self.cluster_config = ClusterConfig(address=address, timeout_s=float(timeout), wait_for_nodes=wait)

    def check_node(self, path: str, t: dict[str, Any]) -> Any:
        """A ``node`` key (a camera's, a policy's, a signal's): the name of the node it must
        run on (the node advertises the Ray resource ``node.NAME``), or None."""
        if "node" not in t:
            return None
        node = self.get(t, "node", path, "string")
        if node is _BAD:
            return _BAD
        if not _NODE.fullmatch(node):
            self.err(_join(path, "node"), f"{_show(node)} is not a node name: use letters, digits, '.', '_' and '-'")
            return _BAD
        return node

    def check_cluster_cameras(self) -> None:
        """What [cluster] can't do yet ([[batch]]: its cameras may sit on different nodes), and
        ``node`` keys that have no effect without it (a warning)."""
        cameras = getattr(self, "cameras", [])
        tables = [(p, x, "policy") for p, x in zip(getattr(self, "policy_paths", []), getattr(self, "policies", []))]
        tables += [(p, x, "signal") for p, x in zip(getattr(self, "signal_paths", []), getattr(self, "signals", []))]
        if self.cluster_config is None:
            for i, cam in enumerate(cameras):
                if cam.node is not None:
                    self.warnings.append(f"camera[{i}].node: has no effect without a [cluster] table "
                                         f"(the cameras run on this machine)")
            for p, x, kind in tables:
                if x.node is not None:
                    self.warnings.append(f"{_join(p, 'node')}: has no effect without a [cluster] table "
                                         f"(the {kind} runs on this machine)")
            return
        used = sorted({cam.node for cam in cameras if cam.node is not None})
        for p, x, kind in tables:
            if x.node is not None and x.node not in used:
                self.err(_join(p, "node"), f"no camera runs on node {_show(x.node)} (camera nodes: "
                                           f"{_names(used)}): set a camera's node, or fix the name{_hint(x.node, used)}")
        if self.doc.get("batch"):
            self.err("cluster", "can't run [[batch]] tables on a cluster yet (a batch's cameras may sit on "
                                "different nodes): remove [cluster] or the [[batch]] tables")
