"""orchestra.pipeline.Batcher: frames of several cameras stacked into one execute.

Cameras here carry a marker in their pixels (camera number and frame index in the first
pixels of channel 0), so every result can be traced back to the camera and frame it came
from. Executors are real: numpy code on the loop that records every batch it gets, and a real
batched CNN (exported with torch + executorch, a dynamic batch dimension) run by the real
orchestrator in thread and process placement, checked against ExecuTorch's own runtime.
Every test checks the accounting identity of every pipeline it ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import orchestra.pipeline as pl
from orchestra.errors import InvalidArgumentError, OrchestraError
from orchestra.pipeline import (
    BatchError,
    Batcher,
    BatchShare,
    CollectSink,
    Frame,
    FrameDropped,
    Pipeline,
    Pipelines,
    SyntheticCamera,
)

SHAPE = (3, 16, 16)


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class MarkedCamera:
    """A SyntheticCamera whose frames carry ``marker`` and their index in channel 0's first
    two pixels (a fresh array per frame)."""

    def __init__(self, name: str, marker: int, *, fps: float = 500.0, count: int | None = 12,
                 shape: tuple[int, ...] = SHAPE) -> None:
        self.name = name
        self.marker = marker
        self._cam = SyntheticCamera(name, fps, shape, seed=marker, count=count)
        self.clock = self._cam.clock

    async def frames(self) -> AsyncIterator[Frame]:
        async for f in self._cam.frames():
            data = np.array(f.data, copy=True)
            data[0, 0, 0] = self.marker
            data[0, 0, 1] = f.index
            yield Frame(f.camera, f.index, data, f.t_capture, f.pts)


def batch_pre(frame: Frame) -> list[Any]:
    return [frame.data[None]]


class RecordingExecutor:
    """Numpy on the loop: returns (marker, index) per row and each row's sum; records the
    (marker, index) pairs and row count of every batch it got."""

    def __init__(self, delay: float = 0.002, fail_if: Any = None) -> None:
        self.delay = delay
        self.batches: list[list[tuple[int, int]]] = []
        self.rows: list[int] = []
        self.fail_if = fail_if

    async def execute(self, inputs: list[Any]) -> list[Any]:
        (x,) = inputs
        marks = [(int(m), int(i)) for m, i in x[:, 0, 0, :2]]
        self.batches.append(marks)
        self.rows.append(x.shape[0])
        await anyio.sleep(self.delay)
        if self.fail_if is not None and self.fail_if(marks):
            raise RuntimeError(f"batch {marks} refused")
        return [x[:, 0, 0, :2].copy(), x.reshape(x.shape[0], -1).sum(axis=1), np.float32(len(marks))]


def check(group: Pipelines) -> None:
    for p in group:
        p.accounting().check()
    group.accounting().check()


def cameras(n: int, **kw: Any) -> dict[str, MarkedCamera]:
    return {f"cam{k}": MarkedCamera(f"cam{k}", k + 1, **kw) for k in range(n)}


def group_on(batcher: Batcher, cams: dict[str, MarkedCamera], *, inflight: int = 1, drop: str = "block",
             queue: int = 4) -> tuple[Pipelines, dict[str, CollectSink]]:
    sinks = {c: CollectSink() for c in cams}
    group = Pipelines(Pipeline(c, src, batcher.member(c), pre=batch_pre, sink=sinks[c], drop=drop, queue=queue,
                               inflight=inflight) for c, src in cams.items())
    return group, sinks


def assert_routed(cams: dict[str, MarkedCamera], sinks: dict[str, CollectSink]) -> None:
    """Each camera's sink holds its own frames, in order, each result the one for that frame."""
    for c, sink in sinks.items():
        marker = cams[c].marker
        for r in sink.results:
            assert r.frame.camera == c
            assert r.outputs[0].shape == (1, 2)
            assert tuple(int(v) for v in r.outputs[0][0]) == (marker, r.frame.index)
            np.testing.assert_allclose(r.outputs[1], [r.frame.data.sum()], rtol=1e-5)
        idx = [r.frame.index for r in sink.results]
        assert idx == sorted(idx)


def assert_one_per_camera(batches: list[list[tuple[int, int]]], max_size: int) -> None:
    for marks in batches:
        cams = [m for m, _ in marks if m != 0]  # 0: a padding row
        assert len(cams) == len(set(cams)), f"a camera twice in one batch: {marks}"
        assert 1 <= len(cams) <= max_size


# --- the core logic, with a numpy executor ------------------------------------------------

def test_public_names() -> None:
    for name in ("Batcher", "BatchMember", "BatchStatistics", "BatchShare", "BatchError", "FrameDropped"):
        assert name in pl.__all__ and getattr(pl, name) is not None


@pytest.mark.anyio
@pytest.mark.parametrize("inflight", [1, 3])
async def test_eight_cameras_max_four_routed_back_one_frame_per_camera_per_batch(inflight: int) -> None:
    ex = RecordingExecutor()
    batcher = Batcher(ex, max_size=4, max_wait_s=0.05)
    cams = cameras(8)
    group, sinks = group_on(batcher, cams, inflight=inflight)
    await group.run()
    check(group)
    acc = group.accounting()
    assert acc.produced == acc.processed == 8 * 12
    assert_routed(cams, sinks)
    for sink in sinks.values():
        assert [r.frame.index for r in sink.results] == list(range(12))
    assert_one_per_camera(ex.batches, 4)
    assert sum(len(b) for b in ex.batches) == 96
    st = batcher.statistics()
    assert st.batches == len(ex.batches) and st.frames == 96
    assert sum(size * n for size, n in st.sizes.items()) == 96 and max(st.sizes) <= 4
    assert st.sizes.get(4, 0) > 0  # 8 cameras at once do fill batches
    assert sum(st.triggers.values()) == st.batches
    assert st.pending == 0 and st.running == 0 and st.mean_wait_s >= 0
    assert st.format_sizes().startswith(min(st.sizes).__str__() + "x")
    # a camera's second frame never shares a batch with its first: per camera, batches are in order
    seen: dict[int, list[int]] = {}
    for marks in ex.batches:
        for m, i in marks:
            seen.setdefault(m, []).append(i)
    assert all(v == sorted(v) for v in seen.values())


@pytest.mark.anyio
async def test_fifo_across_cameras_no_camera_crowds_out_another() -> None:
    """Camera a has three frames waiting before b's one arrives; with max_size 2 the first
    batch takes a's oldest and b's, the next ones a's others in order."""
    ex = RecordingExecutor(delay=0)
    batcher = Batcher(ex, max_size=2, max_wait_s=0.05)
    a, b = batcher.member("a"), batcher.member("b")
    got: dict[tuple[str, int], Any] = {}

    def frame(marker: int, index: int) -> np.ndarray:
        x = np.zeros((1, *SHAPE), np.float32)
        x[0, 0, 0, :2] = marker, index
        return x

    async def send(member: Any, marker: int, index: int) -> None:
        got[(member.camera, index)] = await member.execute([frame(marker, index)])

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(send, a, 1, i)
            await anyio.sleep(0)
        tg.start_soon(send, b, 2, 0)
    assert ex.batches == [[(1, 0), (2, 0)], [(1, 1)], [(1, 2)]]
    st = batcher.statistics()
    assert dict(st.sizes) == {1: 2, 2: 1}
    assert st.triggers["full"] == 1 and st.triggers["timeout"] == 2
    for (cam, i), out in got.items():
        assert tuple(out[0][0]) == ((1 if cam == "a" else 2), i)
        assert out[2] == np.float32(2 if i == 0 else 1)  # a per-batch value goes whole to each


@pytest.mark.anyio
async def test_a_batch_goes_when_full_when_every_member_waits_or_after_max_wait() -> None:
    ex = RecordingExecutor(delay=0)
    batcher = Batcher(ex, max_size=2, max_wait_s=0.2)
    members = [batcher.member(f"c{k}") for k in range(3)]
    x = np.zeros((1, *SHAPE), np.float32)
    clock = anyio.current_time
    t0 = clock()
    async with anyio.create_task_group() as tg:  # 2 of 3 members: full at max_size
        for m in members[:2]:
            tg.start_soon(m.execute, [x])
    assert clock() - t0 < 0.2 and batcher.statistics().triggers["full"] == 1
    t0 = clock()
    await members[0].execute([x])  # alone: only max_wait_s sends it
    assert clock() - t0 >= 0.19 and batcher.statistics().triggers["timeout"] == 1

    small = Batcher(RecordingExecutor(delay=0), max_size=8, max_wait_s=5.0)
    ms = [small.member(f"c{k}") for k in range(3)]
    t0 = clock()
    async with anyio.create_task_group() as tg:  # every member waiting: no need to wait 5 s
        for m in ms:
            tg.start_soon(m.execute, [x])
    assert clock() - t0 < 5.0
    st = small.statistics()
    assert st.triggers["members"] == 1 and dict(st.sizes) == {3: 1}


@pytest.mark.anyio
async def test_static_batch_pads_and_padding_never_reaches_a_camera() -> None:
    ex = RecordingExecutor()
    batcher = Batcher(ex, max_size=3, max_wait_s=0.01, static_batch=4)
    cams = cameras(5, count=10)
    group, sinks = group_on(batcher, cams)
    await group.run()
    check(group)
    assert group.accounting().processed == 50
    assert set(ex.rows) == {4}  # every execute had exactly static_batch rows
    assert_one_per_camera(ex.batches, 3)
    for marks in ex.batches:  # the padding is zero rows after the real ones
        n = sum(1 for m, _ in marks if m != 0)
        assert all(m == (0, 0) for m in marks[n:])
    assert_routed(cams, sinks)
    st = batcher.statistics()
    assert st.padded_rows == sum(4 - len([m for m in b if m[0]]) for b in ex.batches) > 0
    assert max(st.sizes) <= 3


@pytest.mark.anyio
async def test_a_failed_batch_fails_each_of_its_frames_once_per_camera() -> None:
    ex = RecordingExecutor(fail_if=lambda marks: any(m == 3 and i % 4 == 1 for m, i in marks))
    batcher = Batcher(ex, max_size=4, max_wait_s=0.02)
    cams = cameras(8)
    group, sinks = group_on(batcher, cams)
    await group.run()
    check(group)
    failed_batches = [b for b in ex.batches if any(m == 3 and i % 4 == 1 for m, i in b)]
    assert len(failed_batches) == 3  # cam2's frames 1, 5, 9
    failed_by_marker: dict[int, int] = {}
    for b in failed_batches:
        for m, _ in b:
            failed_by_marker[m] = failed_by_marker.get(m, 0) + 1
    for c, cam in cams.items():
        acc = group[c].accounting()
        assert acc.failed == failed_by_marker.get(cam.marker, 0)
        assert acc.processed + acc.failed == 12
    st = batcher.statistics()
    assert st.failed_batches == 3 and st.failed_frames == sum(len(b) for b in failed_batches)
    assert group.accounting().failed == st.failed_frames
    assert "RuntimeError" in (group["cam2"].statistics().last_error or "")
    assert_routed(cams, sinks)


@pytest.mark.anyio
async def test_batch_error_names_the_batch_and_keeps_the_cause() -> None:
    ex = RecordingExecutor(delay=0, fail_if=lambda marks: True)
    batcher = Batcher(ex, max_size=2, max_wait_s=0.01, name="front")
    x = np.zeros((1, *SHAPE), np.float32)
    errors: list[BaseException] = []

    async def one(m: Any) -> None:
        try:
            await m.execute([x])
        except BatchError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for c in ("a", "b"):
            tg.start_soon(one, batcher.member(c))
    assert len(errors) == 2 and errors[0] is not errors[1]
    for e in errors:
        assert "batch 'front'" in str(e) and "cameras a, b" in str(e) and isinstance(e.__cause__, RuntimeError)


@pytest.mark.anyio
async def test_stop_without_drain_counts_frames_waiting_for_a_batch_as_shutdown() -> None:
    """A long max_wait and few cameras producing: frames sit in the batcher when the group is
    stopped without drain; each is counted dropped "shutdown" by its own pipeline."""
    ex = RecordingExecutor(delay=0.0)
    batcher = Batcher(ex, max_size=4, max_wait_s=30.0)
    cams = cameras(8, count=None, fps=50.0)
    live = {c: cams[c] for c in ("cam0", "cam1")}  # 2 of 8 members send frames: never full
    group, _ = group_on(batcher, live)
    for c in cams:
        if c not in live:
            batcher.member(c)

    async def stopper() -> None:
        await anyio.sleep(0.3)
        group.stop(drain=False)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stopper)
        await group.run()
    check(group)
    assert ex.batches == []
    for c in live:
        acc = group[c].accounting()
        assert acc.processed == 0 and acc.dropped["shutdown"] >= 1
        assert acc.produced == acc.dropped_total
    assert batcher.statistics().pending == 0


@pytest.mark.anyio
async def test_closing_the_batcher_drops_waiting_frames_as_shutdown_via_frame_dropped() -> None:
    ex = RecordingExecutor(delay=0.0)
    batcher = Batcher(ex, max_size=4, max_wait_s=30.0)
    cams = cameras(2, count=None, fps=50.0)
    group, _ = group_on(batcher, cams, drop="drop_oldest")
    for k in range(2, 6):
        batcher.member(f"idle{k}")

    async def closer() -> None:
        await anyio.sleep(0.2)
        batcher.close()  # the two waiting frames, and every later one, are dropped
        await anyio.sleep(0.2)
        group.stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(closer)
        await group.run()
    check(group)
    st = batcher.statistics()
    assert st.dropped == 2 and st.batches == 0
    for c in cams:
        acc = group[c].accounting()
        assert acc.failed == 0 and acc.processed == 0
        assert acc.dropped["shutdown"] >= 2  # one dropped by close(), the rest refused after
    with pytest.raises(FrameDropped) as info:
        await batcher.member("cam0").execute([np.zeros((1, *SHAPE), np.float32)])
    assert info.value.reason == "shutdown"


@pytest.mark.anyio
async def test_frame_dropped_with_any_reason_is_counted_as_dropped_not_failed() -> None:
    class Gate:
        async def execute(self, inputs: list[Any]) -> list[Any]:
            if int(inputs[0][0, 0, 0, 1]) % 3 == 0:
                raise FrameDropped("no_motion")
            return [inputs[0].sum()]

    cam = MarkedCamera("c", 1, count=9)
    p = Pipeline("c", cam, Gate(), pre=batch_pre, drop="block")
    await p.run()
    acc = p.accounting()
    acc.check()
    assert acc.processed == 6 and acc.failed == 0 and acc.dropped["no_motion"] == 3
    assert p.statistics().dropped["no_motion"] == 3


@pytest.mark.anyio
async def test_frames_of_another_shape_are_batched_only_with_their_own_kind() -> None:
    ex = RecordingExecutor()
    batcher = Batcher(ex, max_size=4, max_wait_s=0.02)
    cams = cameras(3, count=6)
    odd = MarkedCamera("odd", 9, count=6, shape=(3, 8, 8))
    group, sinks = group_on(batcher, {**cams, "odd": odd})
    await group.run()
    check(group)
    assert group.accounting().processed == 24
    with_odd = [b for b in ex.batches if any(m == 9 for m, _ in b)]
    assert sum(len(b) for b in with_odd) == len(with_odd) == 6  # never mixed with the 16x16 frames
    assert_routed(cams, {c: sinks[c] for c in cams})
    assert [int(r.outputs[0][0, 0]) for r in sinks["odd"].results] == [9] * 6


@dataclasses.dataclass(frozen=True)
class Execution:
    outputs: list[Any]
    options: dict[str, Any]
    instance: str


class DetailedExecutor:
    def __init__(self, dataclass_result: bool) -> None:
        self.dataclass_result = dataclass_result

    async def execute(self, inputs: list[Any]) -> Any:
        outs = [inputs[0] * 2]
        if self.dataclass_result:
            return Execution(outs, {"B": {"mode": "fast"}}, "i0")

        class Plain:
            outputs = outs
            options = {"B": {"mode": "slow"}}
        return Plain()


@pytest.mark.anyio
@pytest.mark.parametrize("dataclass_result", [True, False])
async def test_execution_like_results_keep_their_options(dataclass_result: bool) -> None:
    batcher = Batcher(DetailedExecutor(dataclass_result), max_size=2, max_wait_s=0.05)
    batcher.member("a"), batcher.member("b")
    got: dict[str, Any] = {}

    async def one(c: str, v: float) -> None:
        got[c] = await batcher.member(c).execute([np.full((1, 2), v, np.float32)])

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a", 1.0)
        tg.start_soon(one, "b", 5.0)
    assert batcher.statistics().sizes == {2: 1}
    for c, v in (("a", 2.0), ("b", 10.0)):
        r = got[c]
        np.testing.assert_array_equal(r.outputs[0], [[v, v]])
        if dataclass_result:
            assert isinstance(r, Execution) and r.options == {"B": {"mode": "fast"}} and r.instance == "i0"
        else:
            assert isinstance(r, BatchShare) and r.options == {"B": {"mode": "slow"}}


@pytest.mark.anyio
async def test_cancelling_a_leader_hands_its_batch_to_another_frame() -> None:
    """The frame whose task would run the batch is cancelled before it starts: the other
    frame of the batch runs it, and only the cancelled frame is missing."""
    ex = RecordingExecutor(delay=0)
    batcher = Batcher(ex, max_size=2, max_wait_s=0.05)
    a, b = batcher.member("a"), batcher.member("b")
    out: dict[str, Any] = {}
    xa, xb = np.ones((1, *SHAPE), np.float32), np.full((1, *SHAPE), 2, np.float32)
    xa[0, 0, 0, :2], xb[0, 0, 0, :2] = (1, 0), (2, 0)

    # anyio never cancels a task whose awaited future is already done (it runs the batch,
    # shielded, then stops); a plain asyncio cancel does: the frame leaves before the batch starts
    task_a = asyncio.get_running_loop().create_task(a.execute([xa]))
    await anyio.sleep(0.001)  # a waits, alone
    task_b = asyncio.get_running_loop().create_task(b.execute([xb]))
    await anyio.sleep(0)  # b arrives: the batch {a, b} forms with a as its leader ...
    assert not task_a.done()
    task_a.cancel()  # ... and a is cancelled before its task runs it
    out["b"] = await task_b
    with pytest.raises(asyncio.CancelledError):
        await task_a
    assert "a" not in out and tuple(out["b"][0][0]) == (2, 0)
    assert [[m for m, _ in bt] for bt in ex.batches] == [[2]]


def test_batcher_rejects_bad_parameters() -> None:
    ex = RecordingExecutor()
    with pytest.raises(InvalidArgumentError, match="max_size must be an int >= 1"):
        Batcher(ex, max_size=0, max_wait_s=0.1)
    with pytest.raises(InvalidArgumentError, match="max_wait_s"):
        Batcher(ex, max_size=2, max_wait_s=-1)
    with pytest.raises(InvalidArgumentError, match="max_size 4 is larger than static_batch 2"):
        Batcher(ex, max_size=4, max_wait_s=0.1, static_batch=2)
    with pytest.raises(InvalidArgumentError, match="has no execute"):
        Batcher(object(), max_size=2, max_wait_s=0.1)
    b = Batcher(ex, max_size=2, max_wait_s=0.1, name="b1")
    assert b.member("x") is b.member("x") and b.members == ("x",)
    with pytest.raises(InvalidArgumentError, match="camera"):
        b.member("")


@pytest.mark.anyio
async def test_inputs_without_a_batch_dimension_are_rejected_naming_the_camera() -> None:
    b = Batcher(RecordingExecutor(), max_size=2, max_wait_s=0.01, batch_dim=1, static_batch=2, name="b1")
    with pytest.raises(InvalidArgumentError, match=r"batch 'b1': camera 'x': input 0 must be an array with batch dimension 1"):
        await b.member("x").execute([np.zeros(3, np.float32)])
    with pytest.raises(InvalidArgumentError, match="can't fit static_batch 2"):
        await b.member("x").execute([np.zeros((1, 3), np.float32)])
    with pytest.raises(InvalidArgumentError, match="input 1 has 1 rows"):
        await b.member("x").execute([np.zeros((1, 2), np.float32), np.zeros((1, 1), np.float32)])
    assert b.statistics().pending == 0


# --- a real batched model through the real orchestrator ---------------------------------

@pytest.fixture(scope="session")
def batched_cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN exported with a dynamic batch dimension (1..8) by torch + executorch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge

    class SmallCNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.c2(torch.relu(self.c1(x))))
            return self.fc(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    model = SmallCNN().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    with torch.no_grad():
        ep = torch.export.export(model, (torch.randn(2, *SHAPE),), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("batch") / "batched_cnn.pte"
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    return path


class ExecuTorchReference:
    """ExecuTorch's own runtime on one frame at a time."""

    def __init__(self, pte: Path) -> None:
        from executorch.runtime import Runtime

        self._program = Runtime.get().load_program(pte.read_bytes())
        self._method = self._program.load_method("forward")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch

        (out,) = self._method.execute([torch.from_numpy(np.ascontiguousarray(x))])
        return out.detach().numpy().copy()


@pytest.mark.executorch
@pytest.mark.anyio
@pytest.mark.parametrize("placement,static", [("thread", None), ("process", None), ("thread", 4)])
async def test_real_batched_model_through_the_orchestrator(batched_cnn: Path, placement: str,
                                                           static: int | None) -> None:
    from orchestra.orchestrator import InstanceSpec, Orchestrator
    from orchestra.runtime import load_program

    ref = ExecuTorchReference(batched_cnn)
    program = load_program(batched_cnn)
    async with Orchestrator(period=None) as orch:
        pool = await orch.load(program, instances=[InstanceSpec("i0", placement=placement)])
        instance = pool["i0"]
        batcher = Batcher(instance, max_size=4, max_wait_s=0.02, static_batch=static)
        cams = cameras(8, count=6)
        group, sinks = group_on(batcher, cams)
        await group.run()
        check(group)
        assert group.accounting().processed == 48
        st = batcher.statistics()
        assert instance.statistics().executes == st.batches < 48  # one execute per batch
        assert st.frames == 48 and max(st.sizes) <= 4
        assert st.padded_rows == (0 if static is None else 4 * st.batches - 48)
    for c, sink in sinks.items():
        assert [r.frame.index for r in sink.results] == list(range(6))
        for r in sink.results:
            assert r.frame.data[0, 0, 0] == cams[c].marker
            assert r.outputs[0].shape == (1, 5)
            np.testing.assert_allclose(r.outputs[0], ref(r.frame.data[None]), rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_batcher_errors_are_orchestra_errors() -> None:
    assert issubclass(BatchError, OrchestraError) and issubclass(FrameDropped, OrchestraError)
    with pytest.raises(InvalidArgumentError):
        FrameDropped("")


# --- option changes apply between batches (a real orchestrator instance) -----------------

ADD = "BatchTestAdd"
ADD_LOG: list[tuple[float, tuple[int, ...]]] = []  # per execute: (the add in force, the markers of its rows)


class _AddBackend:
    """out = x + ``add`` (a hot option); logs each execute's add and rows."""

    option_specs: tuple[Any, ...] = ()

    def is_available(self) -> bool:
        return True

    def init(self, context: Any, processed: Any, compile_specs: Any) -> Any:
        return {}

    def execute(self, context: Any, handle: Any, args: Any) -> None:
        add = context.runtime_specs["add"]
        ADD_LOG.append((add, tuple(int(m) for m in args[0][:, 0])))
        np.add(args[0], add, out=args[1])

    def destroy(self, handle: Any) -> None:
        pass


def _add_program(rows: int) -> Any:
    from orchestra.aot import BackendDetails, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
    from orchestra.runtime import Backend, BackendInterface, OptionSpec, load_program, register_backend, registered_backends

    if ADD not in registered_backends():
        cls = type("AddBackend", (_AddBackend, BackendInterface), {"option_specs": (OptionSpec("add", float, 0.0, hot=True),)})
        register_backend(Backend(ADD, cls()))
    if ADD not in aot_backends():
        blob = type("AddBlob", (BackendDetails,), {"preprocess": staticmethod(lambda program, specs: PreprocessResult(b"\0"))})
        register_aot_backend(ADD, blob)
    sub = ProgramBuilder()
    f = sub.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, (rows, 3)), 0.0))
    b = ProgramBuilder()
    g = b.method("forward")
    (y,) = g.delegate(ADD, sub, [g.input(np.float32, (rows, 3))])
    g.output(y)
    return load_program(b.to_bytes())


@pytest.mark.anyio
async def test_an_option_change_applies_between_batches_never_inside_one() -> None:
    """Four cameras batched (static batch 4) on one real instance whose delegate adds a hot
    option to its input; the option changes mid-run, as a policy would change it: every
    batch ran with one value, every frame got its batch's value, and once the new value
    reached a batch every later batch has it."""
    from orchestra.orchestrator import InstanceSpec, Orchestrator

    class Rows:
        def __init__(self, name: str, marker: int) -> None:
            self.name, self.marker = name, marker

        async def frames(self) -> AsyncIterator[Frame]:
            for i in range(40):
                await anyio.sleep(0.002)
                yield Frame(self.name, i, np.array([[self.marker, i, 0.5]], np.float32), anyio.current_time())

    ADD_LOG.clear()
    program = _add_program(4)
    async with Orchestrator(period=None) as orch:
        pool = await orch.load(program, instances=[InstanceSpec("i0", backend_options={ADD: {"add": 0.0}})])
        batcher = Batcher(pool["i0"], max_size=4, max_wait_s=0.01, static_batch=4)
        sinks = {f"c{k}": CollectSink() for k in range(4)}
        group = Pipelines(Pipeline(c, Rows(c, k + 1), batcher.member(c), sink=sinks[c], drop="block")
                          for k, c in enumerate(sinks))

        async def change() -> None:  # after a few batches, as a policy would
            while len(ADD_LOG) < 5:
                await anyio.sleep(0.001)
            await pool["i0"].apply_options({ADD: {"add": 100.0}})

        async with anyio.create_task_group() as tg:
            tg.start_soon(change)
            await group.run()
        check(group)
    assert group.accounting().processed == 160
    adds = [a for a, _ in ADD_LOG]
    assert set(adds) == {0.0, 100.0}
    first_new = adds.index(100.0)
    assert all(a == 100.0 for a in adds[first_new:])  # applied at a batch boundary, for good
    batch_add = {}
    for add, markers in ADD_LOG:
        for m in markers:
            if m:
                batch_add.setdefault(m, []).append(add)
    for k, (c, sink) in enumerate(sinks.items()):
        assert [r.frame.index for r in sink.results] == list(range(40))
        got = [float(r.outputs[0][0, 2] - 0.5) for r in sink.results]
        assert got == batch_add[k + 1]  # each frame got the value its batch ran with
        assert all(r.outputs[0][0, 0] == k + 1 + got[i] for i, r in enumerate(sink.results))
