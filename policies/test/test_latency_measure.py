"""``latency_target`` acts on the latency a camera user means: frame latency (capture to
result, queueing included) when the instance serves a pipeline (issue 15 item 7).

A real pipeline feeds a real orchestrator instance faster than it can execute: frames wait
in the pipeline's queue, so frame latency is many times the execute latency. The same
policy, given that instance, steps *up* on frame latency (default, and ``measure="frame"``)
and *down* on execute latency (``measure="execute"``). Nothing asserts on wall-clock time:
the decisions follow from the latencies the run measured, which the test reads back.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from orchestra import InvalidArgumentError
from orchestra.aot import BackendDetails, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.orchestrator import InstanceSpec, Orchestrator
from orchestra.pipeline import Pipeline, SyntheticCamera
from orchestra.policies import InstanceView, LatencyTargetPolicy, Signals
from orchestra.runtime import Backend, BackendInterface, OptionSpec, load_program, register_backend, registered_backends

SLOW = "PolicyTestSlow"
EXEC_S = 0.01  # each execute sleeps this long
TARGET_S = 0.03


class Slow(BackendInterface):
    """Copies its input after sleeping ``sleep_s``; ``level`` is the option the policy steps."""

    option_specs = (OptionSpec("sleep_s", float, 0.0, hot=True), OptionSpec("level", int, 2, hot=True))

    def init(self, context, processed, compile_specs):
        return None

    def execute(self, context, handle, args):
        time.sleep(context.runtime_specs["sleep_s"])
        np.copyto(args[1], args[0])

    def destroy(self, handle) -> None:
        pass


class _Blob(BackendDetails):
    @staticmethod
    def preprocess(program, compile_specs):
        return PreprocessResult(b"\0")


if SLOW not in registered_backends():
    register_backend(Backend(SLOW, Slow()))
if SLOW not in aot_backends():
    register_aot_backend(SLOW, _Blob)


def slow_program() -> Any:
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::add.Scalar_out", s.input(np.float32, (16,)), 0.0))
    b = ProgramBuilder()
    f = b.method("forward")
    (y,) = f.delegate(SLOW, sub, [f.input(np.float32, (16,))])
    f.output(y)
    return load_program(b.to_bytes())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("measure", [None, "frame", "execute"])
async def test_latency_target_acts_on_frame_latency_when_the_instance_serves_a_pipeline(measure: str | None) -> None:
    policy = LatencyTargetPolicy(TARGET_S, SLOW, "level", [1, 2, 3], band=0.1, min_interval_s=0, measure=measure)
    async with Orchestrator(policies=[policy], period=None) as orch:
        pool = await orch.load(slow_program(), instances=[
            InstanceSpec("cam", backend_options={SLOW: {"sleep_s": EXEC_S}})])
        inst = pool["cam"]
        # 400 fps into an instance that does ~100: the queue of 8 stays full (drop oldest)
        pipe = Pipeline("cam", SyntheticCamera("cam", fps=400, shape=16, count=160), inst, queue=8,
                        drop="drop_oldest")
        stats = await pipe.run()
        assert stats.accounting.processed >= 20 and stats.accounting.failed == 0
        view = orch._engine._view(inst)  # what the policy is shown
        assert view.serves_pipeline and view.frame_latency_p95 > 0 and view.latency_p95 > 0
        # what the pipeline measured: queueing makes frame latency >> execute latency
        assert view.frame_latency_p95 > 3 * view.latency_p95, view
        assert view.latency_p95 < TARGET_S * 0.9 < TARGET_S * 1.1 < view.frame_latency_p95, view
        run = await orch.refresh()
        assert run.errors == 0 and run.rejected == 0
        e = orch.explain()["cam"][SLOW]["level"]
        assert e.source == "policy" and e.policy == "latency_target"
        if measure == "execute":
            assert e.reason.startswith("latency_p95=") and "step down 2 -> 1" in e.reason, e.reason
            assert e.value == 1
        else:  # default: the instance serves a pipeline, so frame latency
            assert e.reason.startswith("frame_latency_p95=") and "step up 2 -> 3" in e.reason, e.reason
            assert e.value == 3
        await inst.execute([np.zeros(16, np.float32)])  # a hot change: in force from the next execute
        assert inst.options()[SLOW]["level"] == e.value


def test_without_a_pipeline_the_default_measure_is_execute_latency() -> None:
    policy = LatencyTargetPolicy(TARGET_S, SLOW, "level", [1, 2, 3], min_interval_s=0)
    view = InstanceView("solo", backends=(SLOW,), options={SLOW: {"level": 2}}, latency_p95=0.1,
                        frame_latency_p95=0.0, serves_pipeline=False)
    p = policy.propose(Signals({}, at=0.0), [view])
    assert p.options["solo"][SLOW]["level"] == 3
    assert p.reasons[("solo", SLOW, "level")].startswith("latency_p95=0.1s > ")
    # measure="frame" on an instance without frames: nothing measured, no proposal
    frame_only = LatencyTargetPolicy(TARGET_S, SLOW, "level", [1, 2, 3], min_interval_s=0, measure="frame")
    assert not frame_only.propose(Signals({}, at=0.0), [view]).options


def test_measure_must_be_frame_or_execute() -> None:
    with pytest.raises(InvalidArgumentError, match="parameter 'measure' must be \"frame\", \"execute\" or absent"):
        LatencyTargetPolicy(TARGET_S, SLOW, "level", [1, 2], measure="queue")
