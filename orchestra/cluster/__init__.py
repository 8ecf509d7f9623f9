"""orchestra across machines: each camera's pipeline in a Ray actor on the node wired to it.

A node advertises what orchestra can bind as Ray custom resources when it joins the cluster
(``ray start --resources '{"camera.front": 1, "npu0.core.0": 1}'``); a camera's actor
requests exactly its binding's resources (:func:`camera_resources`: ``camera.NAME``,
``DEVICE.core.N``, ``node.NAME``), so Ray starts it on that node and the camera's frames
never cross the network. The actor builds the camera's orchestrator and pipeline locally and
hands what happened back to the driver (:class:`JobResult`). A binding no live node can
hold fails before anything starts (:class:`PlacementError`, naming the resource and what
every node has), or, with ``wait_for_nodes``, waits for a node with it to join. A camera whose
node dies is started again when a live node has its resources back, while the run lasts
(:attr:`CameraJob.resume`, :attr:`JobResult.earlier`). While the jobs run, ``on_status``
gets every job's state, node and latest progress snapshot about once a second
(:class:`ClusterStatus`): what ``orchestra run`` draws its cluster dashboard from.

This package needs the ``ray`` extra only when :func:`run_jobs` runs; importing it does not
import Ray. :class:`ClusterError`, :class:`PlacementError`, :class:`NodeInfo` and
:func:`cluster_nodes` are defined in the orchestrator layer (``orchestra.orchestrator``, which
``Orchestrator(cluster=...)`` uses: one instance per Ray actor) and re-exported here. ``orchestra run`` uses it for a config with a ``[cluster]`` table
(see :func:`orchestra._run.run_cluster`).
"""

from ._ray import (
    NODE_LABEL,
    CameraJob,
    ClusterError,
    ClusterStatus,
    JobResult,
    JobStatus,
    NodeInfo,
    PlacementError,
    camera_resources,
    check_placement,
    cluster_nodes,
    for_nodes,
    label_selector,
    run_jobs,
)

__all__ = ["NODE_LABEL", "CameraJob", "ClusterError", "ClusterStatus", "JobResult", "JobStatus", "NodeInfo",
           "PlacementError", "camera_resources", "check_placement", "cluster_nodes", "for_nodes", "label_selector",
           "run_jobs"]
