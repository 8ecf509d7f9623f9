"""orchestra's TOML configuration: programs, devices, cameras, policies, signal sources.

:func:`load_config` reads a file into a :class:`Config` (frozen dataclasses; paths resolved
against the config file's folder) or raises :class:`~orchestra.errors.ConfigError` whose
``errors`` hold *every* problem found, one line each, starting with its path in the file::

    camera[2].bind: core 7 does not exist on device npu0 (cores 0-3)
    policy[0].params.lwo: policy 'battery' has no parameter 'lwo' (parameters: low, high, ...)

:func:`validate_config` returns those lines (``[]`` when the file is valid). A config is
untrusted input: nothing in it makes these functions raise anything but ``ConfigError``, and
sizes and rates are bounded by :class:`ConfigLimits`. ``orchestra validate FILE`` prints them.
A ``"module:attr"`` in the file imports that module (its code runs): only a class
implementing the protocol (Policy, SignalSource, frame source, post-process, sink) is then
called.

Schema (every table rejects keys it doesn't know, naming the known ones)::

    [program]                       # or [[program]] entries, each with a unique name
    name = "convnet"                # optional for a single program (default: the file's stem)
    path = "models/convnet.pte"     # relative to the config file's folder; loaded and checked
    method = "forward"              # default "forward"

    [device.npu0]                   # device names: letters, digits, '_' and '-'
    kind = "npu_sim"                # a simulated NPU (orchestra.backends.npu_sim.NpuDevice)
    cores = 4                       # default 4
    core_memory = "4MiB"            # bytes per core: an int or "512KiB", "4MiB", "1GB", ...;
                                    #   or a list, one per core (default 4MiB)
    links = { front = 0, rear = 1 } # camera -> core wiring; each link names a camera
                                    #   (default: front -> 0, rear -> 1, the cores it has)
    time_scale = 1.0                # 0: modelled time only; s > 0: jobs take s x modelled time
    clock_mhz = { low = 200, balanced = 500, performance = 1000 }   # optional
    power_w = { low = 0.3, balanced = 0.9, performance = 2.5 }      # optional, same modes
    macs_per_cycle = 256            # optional
    job_overhead_cycles = 2000      # optional
    exclusive = true                # a core serves one camera (default); false: shared,
    capacity = 2                    #   by at most `capacity` cameras (default: any number)

    [device.cpu]
    kind = "cpu"                    # host CPUs (at most one such device)
    cpus = [0, 1]                   # default: the CPUs this process may use
    exclusive = true
    capacity = 2
    thread_options = { NumpyCpuBackend = "num_threads" }   # backend -> int option set to
                                                            #   the number of bound CPUs

    [[camera]]
    name = "front"                  # unique
    program = "convnet"             # needed only when there are several programs
    source = { kind = "synthetic", fps = 30, shape = [1, 3, 16, 16], dtype = "float32", seed = 1 }
        # synthetic: fps (required), shape and dtype (default: the method's input 0), seed,
        #   count (frames, default endless)
        # kind = "file": path (.npy stack, or .raw/.bin with shape and dtype), fps, loop
        # kind = "video" (PyAV, the video extra): uri (a file path relative to this file, an
        #   rtsp:// rtsps:// http(s):// rtmp:// udp:// tcp:// srt:// rtp:// stream, or /dev/videoN),
        #   loop, realtime (files: paced by their pts; default true), fps (files: pace at this
        #   rate instead), reconnect = { initial_s = 0.5, max_s = 10, factor = 2, max_attempts = 5 }
        #   (live sources; default: retry forever), options = { rtsp_transport = "tcp", ... }
        #   (FFmpeg's), format, live, timeout_s, decoder_threads, count
        # any other kind: a registered orchestra.pipeline source or "module:attr"; the
        #   table's other keys are its parameters
    pre = { resize = [224, 224], mode = "letterbox", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] }
        # video sources only, run on the decoder's thread: resize = [h, w], mode = "letterbox" |
        #   "stretch" | "center_crop", color = "rgb" | "bgr", mean, std (output channel order,
        #   on pixel * scale), scale (default 1/255), pad (letterbox fill, 0..255), layout =
        #   "nchw" | "nhwc", dtype = "float32" | "uint8"; checked against the method's input 0
        #   (its leading batch dimension of 1 is added to each frame). Without pre a video
        #   source makes RGB uint8 [H, W, 3] frames.
    bind = { "npu0.core" = 0 }      # or { camera_link = "npu0" } (the core npu0's link for
                                    #   this camera's name is wired to), { "npu0.camera" = "rear" },
                                    #   { cpu = 1 } or { cpu = [0, 1] }; cpu combines with the others
    backend_options = { NpuSimBackend = { power_mode = "balanced", priority = 1 } }
                                    # checked against each backend's declared options; only
                                    #   backends the method delegates to
    queue = 8                       # frames waiting for the executor (default 8)
    drop = "drop_oldest"            # drop_oldest | drop_newest | block
    deadline_ms = 200               # frames older than this are dropped (optional)
    inflight = 1                    # frames between stream and sink at once (default 1)
    placement = "auto"              # auto (default) | thread | process: "process" runs the instance
                                    #   in a worker process (scales numpy-interpreted programs
                                    #   across cores; not with npu_sim devices, which live in this
                                    #   process); "auto": process for a program on the CPU when
                                    #   orchestra has more than one CPU, else thread
    post = { kind = "topk", k = 5, labels = "labels.txt" }
        # optional: outputs -> value. topk: k (default 5), labels (a file, one label per line,
        #   relative to this file), softmax (default false), output (default 0);
        #   or kind = "module:attr" (a class whose instances are called (frame, outputs));
        #   the table's other keys are its parameters
    sink = { kind = "jsonl", path = "results.jsonl" }
        # optional: where results go (default: counted, then discarded).
        # jsonl: path (relative to this file; its folder must exist), append, max_elements
        # npy: dir (a folder of per-camera .npy stacks), what = "outputs" | "value"
        # mqtt: host, port (1883), topic ("orchestra/{camera}"), qos, retain, client_id,
        #   username, password, keepalive, max_elements
        # "module:attr": a sink class (with send); the table's other keys are its parameters
        # all: timeout_ms (default 5000): a frame not written by then fails (stage sink).
        # Cameras with equal sink tables share one sink (one file, one connection); two
        #   different tables can't write one jsonl file or npy folder.

    [[batch]]                       # cross-camera batching (orchestra.pipeline.Batcher)
    name = "row1"                   # optional (default batch0, batch1, ...), unique
    cameras = ["front", "rear"]     # cameras of one program, each in at most one batch; their
                                    #   frames carry one row of the batch dimension (synthetic
                                    #   default shape: input 0 with batch 1)
    max_size = 2                    # frames per execute, one per camera (default: len(cameras));
                                    #   at most the batch bound of a dynamic-batch input 0
    max_wait_ms = 10                # a batch goes at the latest this long after its oldest frame
    static_batch = 4                # only for a program with a fixed batch: pad to that many rows

    [[policy]]
    use = "battery"                 # a registered policy name or "module:attr"
    priority = 80                   # optional (the policy's default otherwise)
    params = { low = 20, high = 30, low_options = { NpuSimBackend = { power_mode = "low" } } }
        # the policy's constructor parameters; *_options tables are checked like
        #   backend_options
    node = "edge-b"                 # optional, with [cluster]: runs only on the node whose
                                    #   cameras have this node (none: on every node); must
                                    #   be a camera's node (a warning without [cluster])

    [[signal]]
    use = "scripted"                # battery | cpu | thermal | pressure | scripted | "module:attr"
    params = { timeline = [[0, { "battery.percent" = 100 }], [2.5, { "battery.percent" = 15 }]] }
    node = "edge-b"                 # optional, like a policy's node: this node's signal only

    [run]
    duration_s = 5                  # optional: run until interrupted
    engine_period_s = 0.5           # the policy engine runs at least this often (default 1.0)
    poll_interval_s = 0.25          # how often signals are polled (default: engine_period_s)

    [cluster]                       # optional (the ray extra): each camera's pipeline in a Ray
                                    #   actor on the node advertising its resources: camera.NAME,
                                    #   DEVICE.core.N for a core binding, node.NODE (see `node`)
    address = "auto"                # "auto", "HOST:PORT" (a head node) or "ray://HOST:PORT"
    timeout_s = 60                  # how long every camera's actor may take to start
    wait_for_nodes = false          # true: a camera no live node advertises waits for its node
                                    #   to join (within the run's duration) instead of failing
                                    #   the run; a camera whose node dies is restarted when a
                                    #   node with its resources is back, either way
        # a camera's `node = "edge-a"`: run it on the node that advertises node.edge-a
        #   (a warning without [cluster]); [[batch]] can't be used with [cluster] yet

Besides types and ranges, the checks that need the whole file: the program loads
(``orchestra.program.load``) and has the method; each delegated backend is registered and
available; a camera's source shape/dtype matches the method's input 0; binding a core of an
``npu_sim`` device needs a method that delegates to ``NpuSimBackend`` (and such a method
needs a configured device); two cameras can't hold one exclusive core; the cameras on a core
fit its memory (each instance reserves the NpuSim subgraphs' working set); a backend option
set by a binding (``device``, ``core``, ``label``) can't be given another value; policy and
signal-source parameters are checked by building them (``load_policy`` / ``load_source``,
which construct the object and start nothing), and every parameter problem is reported at
once (a rejected value is left out, or stood in for when required, and the entry built again).

Warnings (``Config.warnings``; valid, but probably not meant) name settings that can never do
anything: a queue holding many seconds of frames; a policy that reads signals no
``[[signal]]`` source provides; a policy whose options (``*_options``, ``backend``) target a
backend no camera's method delegates to, or an option the backend doesn't have;
``thread_options`` for a backend no camera bound to that CPU device uses; a
``latency_target`` whose ladder holds no valid value (or one value), or that the run ends
before the engine's first periodic run.
"""

from __future__ import annotations

from ..errors import ConfigError
from ._base import DEFAULT_LIMITS, NPU_BACKEND, ConfigLimits
from .batching import BatchConfig
from ._load import Config, _check, _check_for_cli, load_config, validate_config
from .cameras import DROP_POLICIES, CameraConfig
from .cluster import ClusterConfig
from .devices import DEVICE_KINDS, DeviceConfig
from .policies import PolicyConfig, SignalConfig
from .post import PostConfig
from .programs import ProgramConfig
from .run import RunConfig
from .sinks import SinkConfig
from .sources import SourceConfig
from .video import PreConfig

__all__ = [
    "BatchConfig",
    "CameraConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConfigLimits",
    "DeviceConfig",
    "PolicyConfig",
    "PostConfig",
    "PreConfig",
    "ProgramConfig",
    "RunConfig",
    "SignalConfig",
    "SinkConfig",
    "SourceConfig",
    "load_config",
    "validate_config",
]
