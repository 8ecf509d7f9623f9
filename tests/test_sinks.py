"""orchestra.pipeline sinks: JSONL and NPY files written off the loop, MQTT to a real broker,
sink failures counted per camera, a sink that hangs never stalls the other cameras.

Executors are real: the committed ``cnn.pte`` classifier run by orchestra's runtime (checked
against ExecuTorch's outputs in test_post.py), or plain numpy. The MQTT tests start a real
mosquitto broker on a free 127.0.0.1 port and check what a real paho subscriber received;
they are skipped when mosquitto or paho-mqtt is missing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import orchestra
import orchestra.pipeline as pl
from orchestra.errors import InvalidArgumentError, NotFoundError
from orchestra.pipeline import (
    CollectSink,
    Frame,
    JsonlSink,
    NpySink,
    Pipeline,
    Pipelines,
    Result,
    SinkError,
    SyntheticCamera,
    ThreadedSink,
    TopK,
    jsonable,
    load_sink,
)

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE = (1, 3, 32, 32)  # cnn.pte's input


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@dataclasses.dataclass(frozen=True)
class Execution:
    """What an orchestrator's ``execute(..., detail=True)`` returns (contract: duck-typed)."""

    outputs: list[Any]
    options: Mapping[str, Mapping[str, Any]]
    instance: str
    latency_s: float


class CnnExecutor:
    """The real cnn.pte Method, run inline; returns an Execution with the options in force."""

    program = None

    def __init__(self, name: str, threads: int = 1) -> None:
        if CnnExecutor.program is None:
            CnnExecutor.program = orchestra.load_program(str(FIXTURES / "cnn.pte"))
        self.method = CnnExecutor.program.load_method("forward")
        self.name = name
        self.options = {"NumpyCpuBackend": {"threads": threads}}

    async def execute(self, inputs: list[Any]) -> Execution:
        t = time.perf_counter()
        out = self.method.execute(inputs)
        return Execution(list(out), self.options, self.name, time.perf_counter() - t)


class SumExecutor:
    """Cheap numpy work: [data.sum(), data.mean()] as arrays."""

    async def execute(self, inputs: list[Any]) -> list[Any]:
        x = np.asarray(inputs[0])
        return [np.array([x.sum(), x.mean()], np.float32)]


class PtsCamera:
    """A SyntheticCamera whose frames carry a source timestamp (pts = pts0 + index / fps)."""

    def __init__(self, name: str, fps: float, count: int, pts0: float, seed: int = 0) -> None:
        self.name = name
        self.fps = fps
        self.pts0 = pts0
        self.cam = SyntheticCamera(name, fps=fps, shape=SHAPE, seed=seed, count=count)

    async def frames(self) -> AsyncIterator[Frame]:
        inner = self.cam.frames()
        try:
            async for f in inner:
                yield dataclasses.replace(f, pts=self.pts0 + f.index / self.fps)
        finally:
            await inner.aclose()


def check(*pipes: Pipeline | Pipelines) -> None:
    for p in pipes:
        p.accounting().check()
        if isinstance(p, Pipelines):
            for q in p:
                q.accounting().check()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- JSON values --------------------------------------------------------------------------

def test_jsonable_values() -> None:
    big = np.zeros((2, 1000), np.float32)
    v = jsonable({"a": np.arange(3), 1: np.float32(0.5), "big": big, "t": (np.int8(3), None, np.nan),
                  "bad": np.array([1.0, np.inf, -np.inf, np.nan]), "b": b"xyz", "o": object,
                  "s": np.array([b"ab"]), "u": np.array(["x", "y"]), "ok": np.array([True]), "c": np.array([1 + 2j])})
    assert v == {"a": [0, 1, 2], "1": 0.5, "big": {"shape": [2, 1000], "dtype": "float32"}, "t": [3, None, None],
                 "bad": [1.0, None, None, None], "b": {"bytes": 3}, "o": repr(object),
                 "s": {"shape": [1], "dtype": "|S2"}, "u": ["x", "y"], "ok": [True], "c": [[1.0, 2.0]]}
    json.dumps(v, allow_nan=False)
    assert jsonable(big, max_elements=2000) == big.tolist()


# --- JSONL --------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_jsonl_one_line_per_processed_frame(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    sink = JsonlSink(path)
    top = TopK(3)
    group = Pipelines()
    cams = {}
    for i in range(3):
        cam = PtsCamera(f"cam{i}", fps=60, count=45, pts0=100.0 * i, seed=i)
        cams[cam.name] = cam
        group.add(Pipeline(cam.name, cam, CnnExecutor(f"inst{i}", threads=i + 1), post=top, sink=sink,
                           queue=2, drop="drop_oldest"))
    await group.run()
    check(group)
    assert sink._file.closed  # the group closed the shared sink once, at the end

    lines = read_jsonl(path)
    reference = CnnExecutor("ref").method
    by_cam: dict[str, list[dict[str, Any]]] = {}
    for rec in lines:
        assert set(rec) == {"camera", "index", "pts", "time", "latency_s", "options", "value"}
        by_cam.setdefault(rec["camera"], []).append(rec)
    assert set(by_cam) == set(cams)
    for name, recs in by_cam.items():
        i = int(name[3:])
        acc = group[name].accounting()
        idx = [r["index"] for r in recs]
        assert len(recs) == acc.processed > 0  # none missing
        assert len(set(idx)) == len(idx)  # none duplicated
        assert idx == sorted(idx)
        pts = [r["pts"] for r in recs]
        assert all(a < b for a, b in zip(pts, pts[1:]))  # monotone per camera
        assert pts == [100.0 * i + k / 60 for k in idx]
        for r in recs:
            t = datetime.datetime.fromisoformat(r["time"])
            assert t.utcoffset() == datetime.timedelta(0)
            assert r["latency_s"] >= 0
            assert r["options"] == {"NumpyCpuBackend": {"threads": i + 1}}
        for r in recs[:4]:  # the value is TopK of this frame's real output
            out = reference.execute([cams[name].cam.frame_data(r["index"])])[0]
            assert r["value"] == json.loads(json.dumps(top(Frame(name, r["index"], out, 0.0), [out])))


@pytest.mark.anyio
async def test_result_options_come_from_the_executor_result() -> None:
    sink = CollectSink()
    p = Pipeline("cam", SyntheticCamera("cam", fps=500, shape=SHAPE, count=5), CnnExecutor("i0", threads=2),
                 sink=sink, drop="block")
    await p.run()
    check(p)
    assert len(sink) == 5
    for r in sink.results:
        assert isinstance(r, Result) and isinstance(r.outputs, list) and r.outputs[0].shape == (1, 10)
        assert r.options == {"NumpyCpuBackend": {"threads": 2}}
    plain = CollectSink()
    q = Pipeline("cam", SyntheticCamera("cam", fps=500, shape=SHAPE, count=2), SumExecutor(), sink=plain, drop="block")
    await q.run()
    assert [r.options for r in plain.results] == [None, None]


@pytest.mark.anyio
async def test_a_lone_pipeline_closes_its_sink_and_append_mode(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    for run in range(2):
        sink = JsonlSink(path, append=run > 0)
        p = Pipeline("cam", SyntheticCamera("cam", fps=500, shape=(4,), count=7), SumExecutor(), sink=sink,
                     drop="block")
        await p.run()
        check(p)
        assert sink._file.closed and sink.written == 7
    recs = read_jsonl(path)
    assert [r["index"] for r in recs] == list(range(7)) * 2
    assert all(r["pts"] is None and r["options"] is None and len(r["value"][0]) == 2 for r in recs)
    with pytest.raises(SinkError, match="closed"):
        await sink.send(Result(Frame("cam", 0, np.zeros(1), 0.0), [], None, 0.0))


def test_jsonl_open_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="no-such-dir"):
        JsonlSink(tmp_path / "no-such-dir" / "x.jsonl")
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        JsonlSink(tmp_path / "x.jsonl", timeout_s=0)


# --- failures, hangs ----------------------------------------------------------------------

class FlakySink:
    """Raises on every third frame."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.raised = 0

    async def send(self, result: Result) -> None:
        if result.frame.index % 3 == 2:
            self.raised += 1
            raise OSError(f"disk full at frame {result.frame.index}")
        self.seen.append(result.frame.index)


@pytest.mark.anyio
async def test_sink_failures_are_counted_per_camera_and_the_accounting_holds() -> None:
    flaky, good = FlakySink(), CollectSink()
    group = Pipelines([
        Pipeline("a", SyntheticCamera("a", fps=400, shape=(8,), count=30), SumExecutor(), sink=flaky, drop="block"),
        Pipeline("b", SyntheticCamera("b", fps=400, shape=(8,), count=30), SumExecutor(), sink=good, drop="block"),
    ])
    stats = await group.run()
    check(group)
    a, b = stats["a"], stats["b"]
    assert a.sink_failures == flaky.raised == 10 and a.failures == 10 and a.failed_by["execute"] == 0
    assert a.accounting.processed == len(flaky.seen) == 20
    assert "sink: OSError: disk full" in (a.last_error or "")
    assert b.sink_failures == 0 and b.accounting.processed == 30
    assert stats.sink_failures == 10


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])  # seconds long
@pytest.mark.anyio
async def test_a_hanging_sink_never_stalls_the_other_cameras() -> None:
    async def hang(result: Result) -> None:
        await anyio.sleep_forever()

    sinks = [CollectSink(), CollectSink()]
    group = Pipelines([Pipeline("stuck", SyntheticCamera("stuck", fps=40, shape=(8,)), SumExecutor(), sink=hang,
                                queue=4, sink_timeout_s=0.1)])
    for i, s in enumerate(sinks):
        group.add(Pipeline(f"ok{i}", SyntheticCamera(f"ok{i}", fps=40, shape=(8,), seed=i), SumExecutor(), sink=s,
                           queue=16))
    stats = await group.run(duration_s=1.5)  # returns: the hanging sink can't hold the end of the run
    check(group)
    stuck = stats["stuck"]
    assert stuck.accounting.processed == 0 and stuck.sink_failures >= 5
    assert "sink_timeout_s=0.1" in (stuck.last_error or "")
    for i, s in enumerate(sinks):
        ok = stats[f"ok{i}"]
        assert ok.accounting.dropped_total == 0 and ok.sink_failures == 0
        assert ok.accounting.processed == ok.accounting.produced == len(s) >= 30


class StuckWriter(ThreadedSink):
    """A writer thread that hangs (a dead NFS mount) until released."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(timeout_s=0.1, close_timeout_s=0.3)
        self.release = release

    def write_batch(self, items: list[tuple[Result, float]]) -> list[BaseException | None]:
        self.release.wait()
        return [None] * len(items)


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])  # seconds long
@pytest.mark.anyio
async def test_a_stuck_writer_thread_fails_its_frames_and_its_close_times_out() -> None:
    release = threading.Event()
    stuck = StuckWriter(release)
    good = CollectSink()
    try:
        group = Pipelines([
            Pipeline("w", SyntheticCamera("w", fps=40, shape=(8,)), SumExecutor(), sink=stuck, queue=16),
            Pipeline("ok", SyntheticCamera("ok", fps=40, shape=(8,)), SumExecutor(), sink=good, queue=16),
        ])
        stats = await group.run(duration_s=1.0)
        check(group)
    finally:
        release.set()
    w, ok = stats["w"], stats["ok"]
    assert w.accounting.processed == 0 and w.sink_failures == w.accounting.produced - w.accounting.dropped_total > 0
    assert "sink close" in (w.last_error or "") and "did not finish" in (w.last_error or "")
    assert ok.accounting.dropped_total == 0 and ok.accounting.processed == ok.accounting.produced == len(good)


# --- NPY ----------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_npy_stacks_per_camera(tmp_path: Path) -> None:
    sink = NpySink(tmp_path / "out")
    cams = [PtsCamera(f"cam/{i}", fps=400, count=12, pts0=5.0 * i, seed=i) for i in range(2)]
    group = Pipelines(Pipeline(f"p{i}", c, CnnExecutor(f"i{i}"), sink=sink, drop="block") for i, c in enumerate(cams))
    await group.run()
    check(group)
    reference = CnnExecutor("ref").method
    files = sink.files()
    assert set(files) == {"cam/0", "cam/1"}
    for i, cam in enumerate(cams):
        frames_path, out_path = files[cam.name]
        assert frames_path.name == f"cam_{i}.frames.npy" and out_path.name == f"cam_{i}.out0.npy"
        rows = np.load(frames_path)
        out = np.load(out_path, mmap_mode="r")
        assert rows["index"].tolist() == list(range(12)) and out.shape == (12, 1, 10) and out.dtype == np.float32
        np.testing.assert_array_equal(rows["pts"], 5.0 * i + np.arange(12) / 400)
        assert (rows["latency_s"] >= 0).all() and (rows["time"] > 1e9).all()
        for k in (0, 11):
            np.testing.assert_array_equal(out[k], reference.execute([cam.cam.frame_data(k)])[0])


@pytest.mark.anyio
async def test_npy_file_is_valid_while_written_and_refuses_other_shapes(tmp_path: Path) -> None:
    sink = NpySink(tmp_path, what="value")

    def result(i: int, value: Any) -> Result:
        return Result(Frame("c", i, np.zeros(1), 0.0), [], value, 0.01)

    for i in range(3):
        await sink.send(result(i, np.full((2, 3), i, np.int16)))
    data = np.load(tmp_path / "c.value.npy")  # before close: a valid .npy of 3 rows
    assert data.shape == (3, 2, 3) and data[2].tolist() == [[2] * 3] * 2
    with pytest.raises(SinkError, match=r"frame 3 is int16 \[3, 2\], the file holds int16 \[2, 3\]"):
        await sink.send(result(3, np.zeros((3, 2), np.int16)))
    with pytest.raises(SinkError, match="not a numeric array"):
        await sink.send(result(4, [{"label": "x"}]))
    await sink.send(result(5, np.ones((2, 3), np.int16)))
    await sink.aclose()
    assert np.load(tmp_path / "c.value.npy").shape == (4, 2, 3)
    assert np.load(tmp_path / "c.frames.npy")["index"].tolist() == [0, 1, 2, 5]
    with pytest.raises(InvalidArgumentError, match="what must be"):
        NpySink(tmp_path, what="frames")


def test_load_sink_by_kind(tmp_path: Path) -> None:
    s = load_sink("jsonl", path=tmp_path / "a.jsonl", timeout_s=1.0)
    assert isinstance(s, JsonlSink)
    s.close()
    assert isinstance(load_sink("npy", directory=tmp_path / "n"), NpySink)
    with pytest.raises(NotFoundError, match="no sink kind 'csv'"):
        load_sink("csv")
    with pytest.raises(InvalidArgumentError, match=r"sink 'jsonl': bad parameters \['pth'\]"):
        load_sink("jsonl", pth="x")
    with pytest.raises(orchestra.errors.ConfigError, match="not a class"):
        load_sink("os:system")
    with pytest.raises(orchestra.errors.ConfigError, match="no send"):
        load_sink("collections:OrderedDict")
    assert isinstance(load_sink("orchestra.pipeline:CollectSink", maxlen=3), CollectSink)


# --- MQTT against a real broker -------------------------------------------------------------

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
try:
    import paho.mqtt.client as mqtt
except ImportError:  # pragma: no cover - the mqtt extra is not installed
    mqtt = None

needs_broker = pytest.mark.skipif(MOSQUITTO is None or mqtt is None,
                                  reason="needs mosquitto (apt install mosquitto) and paho-mqtt (the mqtt extra)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A real mosquitto on 127.0.0.1:port, startable again on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.log = tmp / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(MOSQUITTO), "-c", str(self.conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mosquitto did not start: {self.log.read_text()}") from None
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.kill()


class Subscriber:
    """A real paho client subscribed to ``topic`` (again after every reconnect)."""

    def __init__(self, port: int, topic: str) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        c.reconnect_delay_set(1, 1)
        c.on_connect = lambda client, userdata, flags, rc, props: client.subscribe(topic, qos=1)
        c.on_subscribe = lambda *a: self.subscribed.set()
        c.on_message = self._on_message
        c.connect("127.0.0.1", port)
        c.loop_start()
        self.client = c
        assert self.subscribed.wait(10), "the subscriber could not subscribe"

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, json.loads(msg.payload)))

    def wait_for(self, n: int, timeout: float = 10.0) -> list[tuple[str, dict[str, Any]]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.messages) >= n:
                    break
            time.sleep(0.02)
        with self.lock:
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@needs_broker
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])
@pytest.mark.anyio
async def test_mqtt_every_frame_arrives_on_its_cameras_topic(broker: Broker) -> None:
    from orchestra.pipeline import MqttSink

    sub = Subscriber(broker.port, "orchestra-test/#")
    sink = MqttSink("127.0.0.1", broker.port, topic="orchestra-test/{camera}/top", qos=1)
    try:
        group = Pipelines(Pipeline(f"cam{i}", PtsCamera(f"cam{i}", fps=200, count=30, pts0=float(i)),
                                   CnnExecutor(f"i{i}"), post=TopK(2), sink=sink, drop="block") for i in range(3))
        await group.run()
        check(group)
        assert all(group[f"cam{i}"].accounting().processed == 30 for i in range(3))
        messages = sub.wait_for(90)
    finally:
        sub.close()
    assert len(messages) == 90 and sink.connects == 1
    for i in range(3):
        mine = [m for t, m in messages if t == f"orchestra-test/cam{i}/top"]
        assert [m["camera"] for m in mine] == [f"cam{i}"] * 30
        assert [m["index"] for m in mine] == list(range(30))  # each once, in order
        assert [m["pts"] for m in mine] == [i + k / 200 for k in range(30)]
        assert all(len(m["value"]) == 2 and set(m["value"][0]) == {"index", "label", "score"} for m in mine)
        assert mine[0]["options"] == {"NumpyCpuBackend": {"threads": 1}}


@needs_broker
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])
@pytest.mark.anyio
async def test_mqtt_broker_killed_mid_run(broker: Broker, tmp_path: Path) -> None:
    from orchestra.pipeline import MqttSink

    sub = Subscriber(broker.port, "orchestra-test/#")
    sink = MqttSink("127.0.0.1", broker.port, topic="orchestra-test/{camera}", qos=0, reconnect_min_s=0.5,
                    reconnect_max_s=1.0)
    jsonl = JsonlSink(tmp_path / "j.jsonl")
    group = Pipelines()
    for name in ("m0", "m1"):
        group.add(Pipeline(name, SyntheticCamera(name, fps=50, shape=(16,)), SumExecutor(), sink=sink, queue=16))
    group.add(Pipeline("j0", SyntheticCamera("j0", fps=50, shape=(16,)), SumExecutor(), sink=jsonl, queue=16))
    seen_at_restart = 0

    async def outage() -> None:
        nonlocal seen_at_restart
        await anyio.sleep(1.0)
        await anyio.to_thread.run_sync(broker.kill)
        await anyio.sleep(0.6)
        with sub.lock:
            seen_at_restart = len(sub.messages)
        await anyio.to_thread.run_sync(broker.start)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(outage)
            stats = await group.run(duration_s=4.0)
        check(group)
        messages = sub.wait_for(10**9, timeout=0.5)
    finally:
        sub.close()
    for name in ("m0", "m1"):
        s = stats[name]
        assert s.sink_failures > 0 and "not connected" in (s.last_error or "")
        # no stall: every frame went through (processed or failed at the sink), none waited
        # long enough to be evicted
        assert s.accounting.dropped_total == 0
        assert s.accounting.processed + s.sink_failures == s.accounting.produced
        got = [m["index"] for t, m in messages if t == f"orchestra-test/{name}"]
        assert len(got) == len(set(got)) <= s.accounting.processed
    j = stats["j0"]
    assert j.sink_failures == 0 and j.accounting.dropped_total == 0
    assert len(read_jsonl(tmp_path / "j.jsonl")) == j.accounting.processed == j.accounting.produced
    assert sink.connects >= 2 and sink.disconnects >= 1  # reconnected ...
    assert len(messages) > seen_at_restart  # ... and delivered again after the restart


def test_mqtt_sink_argument_errors() -> None:
    if mqtt is None:
        pytest.skip("paho-mqtt is not installed")
    from orchestra.pipeline import MqttSink

    for kwargs, message in [(dict(topic="a/+/b"), "wildcard"), (dict(topic="a/{cam}"), "only placeholder"),
                            (dict(qos=3), "qos must be"), (dict(port=0), "port must be")]:
        with pytest.raises(InvalidArgumentError, match=message):
            MqttSink("127.0.0.1", **kwargs)  # type: ignore[arg-type]


def test_public_names() -> None:
    for name in ("JsonlSink", "NpySink", "MqttSink", "TopK", "SinkError", "load_sink", "load_post"):
        assert name in pl.__all__ and getattr(pl, name) is not None


@needs_broker
def test_mqtt_sink_from_a_config_run(broker: Broker, tmp_path: Path) -> None:
    """``orchestra run`` (in process) with ``sink = { kind = "mqtt" }``: every processed frame
    of both cameras arrives on its topic; the summary names the broker."""
    import io
    import shutil as sh

    from orchestra._run import RunOptions, render_summary, run
    from orchestra.config import load_config

    (tmp_path / "models").mkdir()
    sh.copy(Path(__file__).resolve().parent.parent / "examples" / "models" / "convnet.pte", tmp_path / "models")
    cams = "".join(f'''
[[camera]]
name = "{name}"
source = {{ kind = "synthetic", fps = 200, shape = [1, 3, 16, 16], seed = {i}, count = 15 }}
drop = "block"
post = {{ kind = "topk", k = 1 }}
sink = {{ kind = "mqtt", host = "127.0.0.1", port = {broker.port}, topic = "orchestra-test/run/{{camera}}" }}
''' for i, name in enumerate(("left", "right")))
    cfg = tmp_path / "mqtt.toml"
    cfg.write_text('[program]\npath = "models/convnet.pte"\n' + cams + "\n[run]\nduration_s = 30\n")
    sub = Subscriber(broker.port, "orchestra-test/run/#")
    try:
        result = run(load_config(cfg), RunOptions(use_uvloop=False, status_interval_s=60), out=io.StringIO())
        messages = sub.wait_for(30)
    finally:
        sub.close()
    assert result.exit_code == 0, result.problems
    assert len(messages) == 30
    for name in ("left", "right"):
        assert [m["index"] for t, m in messages if t == f"orchestra-test/run/{name}"] == list(range(15))
    summary = render_summary(result).splitlines()
    assert f"  mqtt://127.0.0.1:{broker.port} topic orchestra-test/run/{{camera}}: left, right" in summary
