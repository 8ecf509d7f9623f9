"""Built-in policies' decisions (hysteresis edges, backend filtering, reasons, the latency
controller) and the policy/source registries with ``module:attr`` loading."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import orchestra.policies as policies
from orchestra import ConfigError, Error, InvalidArgumentError, NotFoundError
from orchestra.policies import (
    POOL,
    BatteryPolicy,
    BatterySource,
    CoreAvailabilityPolicy,
    CpuSource,
    InstanceView,
    LatencyTargetPolicy,
    MemoryPressurePolicy,
    Policy,
    Proposal,
    ScaleTo,
    ScriptedSource,
    Signals,
    ThermalPolicy,
    get_policy,
    get_source,
    load_policy,
    load_source,
    policy_names,
    register_policy,
    register_source,
    source_names,
)

NPU = "NpuSimBackend"
CPU = "NumpyCpuBackend"


def inst(name: str, *backends: str, **kw: Any) -> InstanceView:
    return InstanceView(name=name, backends=backends, **kw)


def sig(at: float = 0.0, **values: Any) -> Signals:
    return Signals({k.replace("__", "."): v for k, v in values.items()}, at=at)


def opts(p: Proposal) -> dict[str, dict[str, dict[str, Any]]]:
    return {i: {b: dict(o) for b, o in bs.items()} for i, bs in p.options.items()}


# ---------------------------------------------------------------------------- battery


def test_battery_hysteresis_edges() -> None:
    pol = BatteryPolicy(low=20, high=30)
    cams = [inst("front", NPU), inst("rear", NPU)]

    p = pol.propose(sig(battery__percent=20, battery__charging=False), cams)
    assert pol.mode == "normal"  # 20 is not < 20
    assert opts(p) == {"front": {NPU: {"power_mode": "balanced"}}, "rear": {NPU: {"power_mode": "balanced"}}}
    assert p.reasons[("front", NPU, "power_mode")] == "battery.percent=20 >= low=20"

    p = pol.propose(sig(battery__percent=14, battery__charging=False), cams)
    assert pol.mode == "low"
    assert opts(p)["rear"] == {NPU: {"power_mode": "low"}}
    assert p.reasons[("rear", NPU, "power_mode")] == "battery.percent=14 < low=20 and not charging"

    for level in (20, 25, 29.9):  # between low and high: stays low
        p = pol.propose(sig(battery__percent=level, battery__charging=False), cams)
        assert pol.mode == "low" and opts(p)["front"][NPU]["power_mode"] == "low"
    assert "< high=30" in p.reasons[("front", NPU, "power_mode")]

    p = pol.propose(sig(battery__percent=30, battery__charging=False), cams)  # 30 >= high
    assert pol.mode == "normal" and opts(p)["front"][NPU]["power_mode"] == "balanced"
    assert p.reasons[("front", NPU, "power_mode")] == "battery.percent=30 >= high=30"

    p = pol.propose(sig(battery__percent=25), cams)  # back between: stays normal
    assert pol.mode == "normal"


def test_battery_charging_blocks_and_ends_low_mode() -> None:
    pol = BatteryPolicy()
    cams = [inst("front", NPU)]
    pol.propose(sig(battery__percent=5, battery__charging=True), cams)
    assert pol.mode == "normal"
    pol.propose(sig(battery__percent=5, battery__charging=False), cams)
    assert pol.mode == "low"
    p = pol.propose(sig(battery__percent=6, battery__charging=True), cams)
    assert pol.mode == "normal"
    assert p.reasons[("front", NPU, "power_mode")] == "battery.charging=True"
    # absent charging signal counts as not charging
    pol.propose(sig(battery__percent=5), cams)
    assert pol.mode == "low"


def test_battery_no_battery_proposes_nothing() -> None:
    pol = BatteryPolicy()
    p = pol.propose(sig(cpu__online=4), [inst("front", NPU)])
    assert p == Proposal() and not p.actions and pol.mode == "normal"


def test_battery_filters_by_backend_and_declared_options() -> None:
    pol = BatteryPolicy(
        low_options={NPU: {"power_mode": "low"}, CPU: {"num_threads": 1}},
        normal_options={NPU: {"power_mode": "balanced"}, CPU: {"num_threads": 4}},
    )
    views = [
        inst("npu_only", NPU),
        inst("cpu_only", CPU),
        inst("both", NPU, CPU),
        inst("neither", "OnnxRuntimeBackend"),
        inst(
            "strict",
            NPU,
            option_specs={NPU: {"power_mode": ("str", True, ("balanced", "performance"))}},
        ),
    ]
    p = pol.propose(sig(battery__percent=10, battery__charging=False), views)
    assert opts(p) == {
        "npu_only": {NPU: {"power_mode": "low"}},
        "cpu_only": {CPU: {"num_threads": 1}},
        "both": {NPU: {"power_mode": "low"}, CPU: {"num_threads": 1}},
        # "strict" doesn't allow "low": left out, as is "neither"
    }
    assert set(p.reasons) == {("npu_only", NPU, "power_mode"), ("cpu_only", CPU, "num_threads"), ("both", NPU, "power_mode"), ("both", CPU, "num_threads")}


def test_battery_empty_normal_options_proposes_nothing_when_normal() -> None:
    pol = BatteryPolicy(normal_options={})
    assert pol.propose(sig(battery__percent=90), [inst("a", NPU)]) == Proposal()
    assert opts(pol.propose(sig(battery__percent=1), [inst("a", NPU)])) == {"a": {NPU: {"power_mode": "low"}}}


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"low": 40, "high": 30}, "'high'"),
        ({"low": "20"}, "'low'"),
        ({"low_options": {"NpuSimBackend": "low"}}, "low_options"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_battery_rejects_bad_parameters(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        BatteryPolicy(**kw)


# ---------------------------------------------------------------------------- cores


def test_core_availability_shares_cpus() -> None:
    pol = CoreAvailabilityPolicy()
    views = [inst(f"i{k}", CPU) for k in range(3)] + [inst("npu", NPU)]
    p = pol.propose(sig(cpu__available=8), views)
    assert opts(p) == {f"i{k}": {CPU: {"num_threads": 2}} for k in range(3)}
    assert p.reasons[("i0", CPU, "num_threads")] == "cpu.available=8 over 3 instance(s) -> num_threads=2"
    assert not p.actions


def test_core_availability_min_max_reserve_and_fallback_signals() -> None:
    views = [inst("a", CPU), inst("b", CPU)]
    p = CoreAvailabilityPolicy(max_threads=3).propose(sig(cpu__available=16), views)
    assert opts(p)["a"][CPU]["num_threads"] == 3
    assert "capped at max_threads=3" in p.reasons[("a", CPU, "num_threads")]
    p = CoreAvailabilityPolicy(min_threads=2).propose(sig(cpu__available=2), views)
    assert opts(p)["b"][CPU]["num_threads"] == 2
    p = CoreAvailabilityPolicy(reserve=1).propose(sig(cpu__available=5), views)
    assert opts(p)["a"][CPU]["num_threads"] == 2
    assert p.reasons[("a", CPU, "num_threads")].startswith("cpu.available=5 - reserve=1")
    # no cpu.available: the smallest of online / affinity / quota
    p = CoreAvailabilityPolicy().propose(sig(cpu__online=8, cpu__affinity=6, cpu__quota=4.5), views)
    assert opts(p)["a"][CPU]["num_threads"] == 2
    assert p.reasons[("a", CPU, "num_threads")].startswith("cpu.quota=4.5")
    # nothing known, or nobody uses the backend: nothing
    assert CoreAvailabilityPolicy().propose(sig(), views) == Proposal()
    assert CoreAvailabilityPolicy().propose(sig(cpu__available=4), [inst("x", NPU)]) == Proposal()


def test_core_availability_for_onnxruntime_option() -> None:
    pol = CoreAvailabilityPolicy(backend="OnnxRuntimeBackend", option="intra_op_num_threads")
    p = pol.propose(sig(cpu__available=4), [inst("a", "OnnxRuntimeBackend")])
    assert opts(p) == {"a": {"OnnxRuntimeBackend": {"intra_op_num_threads": 4}}}


def test_core_availability_scales_instances_down_and_back() -> None:
    pol = CoreAvailabilityPolicy(scale_instances=True)
    four = [inst(f"i{k}", CPU) for k in range(4)]
    p = pol.propose(sig(cpu__available=2), four)
    assert p.actions == (ScaleTo(2),)
    assert p.reasons[(POOL, "", "ScaleTo")] == "cpu.available=2 fits 2 instance(s) of >= 1 thread(s), 4 running"
    assert opts(p)["i0"][CPU]["num_threads"] == 1
    # the engine drained to 2; still 2 CPUs: nothing to scale
    p = pol.propose(sig(cpu__available=2), four[:2])
    assert not p.actions and opts(p)["i1"][CPU]["num_threads"] == 1
    # 3 CPUs come back: up to 3, then up to the 4 it scaled down from, never beyond
    p = pol.propose(sig(cpu__available=3), four[:2])
    assert p.actions == (ScaleTo(3),)
    p = pol.propose(sig(cpu__available=16), four[:3])
    assert p.actions == (ScaleTo(4),)
    assert opts(p)["i0"][CPU]["num_threads"] == 4
    p = pol.propose(sig(cpu__available=16), four)
    assert not p.actions
    # without scale_instances there is never an action
    assert not CoreAvailabilityPolicy().propose(sig(cpu__available=1), four).actions


def test_scale_to_names_a_pool_or_none() -> None:
    assert ScaleTo(2) == ScaleTo(2, pool=None) and ScaleTo(2).pool is None  # as before: every pool
    assert ScaleTo(2, "a") == ScaleTo(count=2, pool="a") != ScaleTo(2)
    with pytest.raises(AttributeError):
        ScaleTo(2).pool = "a"  # type: ignore[misc]
    assert InstanceView("x").pool is None


def test_core_availability_names_the_pool_of_the_instances_it_scales() -> None:
    pol = CoreAvailabilityPolicy(scale_instances=True)
    four = [inst(f"i{k}", CPU, pool="cams") for k in range(4)]
    p = pol.propose(sig(cpu__available=2), four)
    assert p.actions == (ScaleTo(2, pool="cams"),)
    assert p.reasons[("cams", "", "ScaleTo")] == "cpu.available=2 fits 2 instance(s) of >= 1 thread(s), 4 running"
    assert (POOL, "", "ScaleTo") not in p.reasons
    assert pol.propose(sig(cpu__available=16), four[:2]).actions == (ScaleTo(4, pool="cams"),)


def test_core_availability_scales_several_pools_sharing_the_cpus() -> None:
    pol = CoreAvailabilityPolicy(scale_instances=True)
    a = [inst(f"a{k}", CPU, pool="a") for k in range(3)]
    b = [inst("b0", CPU, pool="b")]
    other = [inst("n0", NPU, pool="npu")]  # not on the backend: not reasoned about
    # 2 CPUs fit 2 of the 4 instances: both come off the largest pool, b keeps its one
    p = pol.propose(sig(cpu__available=2), a + b + other)
    assert p.actions == (ScaleTo(1, pool="a"),)
    assert p.reasons[("a", "", "ScaleTo")] == "cpu.available=2 fits 2 instance(s) of >= 1 thread(s), 4 running in pool 'a'"
    assert opts(p)["b0"][CPU]["num_threads"] == 1 and "n0" not in opts(p)
    # drained: nothing to scale while 2 CPUs stay
    p = pol.propose(sig(cpu__available=2), a[:1] + b)
    assert not p.actions and opts(p)["a0"][CPU]["num_threads"] == 1
    # CPUs come back: a grows back towards the 3 it had, never beyond, b is left alone
    p = pol.propose(sig(cpu__available=3), a[:1] + b)
    assert p.actions == (ScaleTo(2, pool="a"),)
    assert p.reasons[("a", "", "ScaleTo")] == "cpu.available=3 fits 3 instance(s) again; back towards 3 in pool 'a'"
    p = pol.propose(sig(cpu__available=16), a[:2] + b)
    assert p.actions == (ScaleTo(3, pool="a"),) and opts(p)["b0"][CPU]["num_threads"] == 4
    assert not pol.propose(sig(cpu__available=16), a + b).actions
    # equal pools: the one listed last gives first; every pool keeps at least one instance
    a2, b2 = a[:2], [inst(f"b{k}", CPU, pool="b") for k in range(2)]
    assert CoreAvailabilityPolicy(scale_instances=True).propose(sig(cpu__available=3), a2 + b2).actions == (
        ScaleTo(1, pool="b"),)
    assert CoreAvailabilityPolicy(scale_instances=True).propose(sig(cpu__available=2), a2 + b2).actions == (
        ScaleTo(1, pool="a"), ScaleTo(1, pool="b"))
    c = [inst(f"c{k}", CPU, pool="c") for k in range(2)]
    p = CoreAvailabilityPolicy(scale_instances=True).propose(sig(cpu__available=1), a[:1] + b + c)
    assert p.actions == (ScaleTo(1, pool="c"),)
    assert p.reasons[("a0", CPU, "num_threads")] == "cpu.available=1 over 3 instance(s) -> num_threads=1 (min_threads)"


# ---------------------------------------------------------------------------- thermal


def test_thermal_hysteresis() -> None:
    pol = ThermalPolicy(hot_c=80, cool_c=70)
    cams = [inst("front", NPU), inst("cpu", CPU)]
    assert pol.propose(sig(), cams) == Proposal()  # no zones: nothing
    p = pol.propose(sig(thermal__max_c=79.9), cams)
    assert opts(p) == {"front": {NPU: {"power_mode": "balanced"}}}
    assert p.reasons[("front", NPU, "power_mode")] == "thermal.max_c=79.9 < hot_c=80"
    p = pol.propose(sig(thermal__max_c=80), cams)
    assert pol.mode == "hot" and opts(p) == {"front": {NPU: {"power_mode": "low"}}}
    assert p.reasons[("front", NPU, "power_mode")] == "thermal.max_c=80 >= hot_c=80"
    p = pol.propose(sig(thermal__max_c=70.5), cams)
    assert pol.mode == "hot" and opts(p)["front"][NPU]["power_mode"] == "low"
    p = pol.propose(sig(), cams)  # the sensor vanished while hot: stay hot
    assert pol.mode == "hot" and opts(p)["front"][NPU]["power_mode"] == "low"
    p = pol.propose(sig(thermal__max_c=70), cams)
    assert pol.mode == "normal" and opts(p)["front"][NPU]["power_mode"] == "balanced"
    assert p.reasons[("front", NPU, "power_mode")] == "thermal.max_c=70 <= cool_c=70"


def test_thermal_zone_signal_and_no_normal_value() -> None:
    pol = ThermalPolicy(hot_c=90, cool_c=60, backend=CPU, option="num_threads", hot_value=1, normal_value=None, signal="thermal.x86_pkg_temp_c")
    assert pol.signals == ("thermal.x86_pkg_temp_c",)
    views = [inst("a", CPU)]
    assert pol.propose(sig(thermal__max_c=99, thermal__x86_pkg_temp_c=50), views) == Proposal()
    assert opts(pol.propose(sig(thermal__x86_pkg_temp_c=95), views)) == {"a": {CPU: {"num_threads": 1}}}
    with pytest.raises(InvalidArgumentError, match="cool_c"):
        ThermalPolicy(hot_c=50, cool_c=60)


# ---------------------------------------------------------------------------- memory


def test_memory_pressure_scales_down_with_cool_down() -> None:
    pol = MemoryPressurePolicy(psi_full_threshold=10.0, min_available_bytes=256 << 20, min_interval_s=10)
    four = [inst(f"i{k}", CPU) for k in range(4)]
    assert pol.propose(sig(at=0, memory__psi_full_avg10=10.0, memory__available_bytes=1 << 30), four) == Proposal()
    p = pol.propose(sig(at=1, memory__psi_full_avg10=12.5), four)
    assert p.actions == (ScaleTo(3),) and not p.options
    assert p.reasons[(POOL, "", "ScaleTo")] == "memory.psi_full_avg10=12.5 > psi_full_threshold=10: 4 -> 3 instance(s)"
    p = pol.propose(sig(at=5, memory__psi_full_avg10=12.5), four[:3])  # cooling down: hold at 3
    assert p.actions == (ScaleTo(3),)
    assert "next step after min_interval_s=10" in p.reasons[(POOL, "", "ScaleTo")]
    p = pol.propose(sig(at=11, memory__available_bytes=100 << 20), four[:3])
    assert p.actions == (ScaleTo(2),)
    assert p.reasons[(POOL, "", "ScaleTo")] == "memory.available_bytes=104857600 < min_available_bytes=268435456: 3 -> 2 instance(s)"
    p = pol.propose(sig(at=30, memory__available_bytes=1, memory__psi_full_avg10=50), four[:1])
    assert p.actions == (ScaleTo(1),)  # never below 1
    assert " and " in p.reasons[(POOL, "", "ScaleTo")]
    assert pol.propose(sig(at=40), four[:1]) == Proposal()  # no signals: nothing


def test_memory_pressure_drains_the_largest_of_several_pools() -> None:
    pol = MemoryPressurePolicy(min_interval_s=10)
    a = [inst("a0", CPU, pool="a")]
    b = [inst(f"b{k}", NPU, pool="b") for k in range(3)]
    p = pol.propose(sig(at=1, memory__psi_full_avg10=12.5), a + b)
    assert p.actions == (ScaleTo(2, pool="b"),)  # one instance in all, off the largest pool
    assert p.reasons[("b", "", "ScaleTo")] == "memory.psi_full_avg10=12.5 > psi_full_threshold=10: 3 -> 2 instance(s) in pool 'b'"
    p = pol.propose(sig(at=5, memory__psi_full_avg10=12.5), a + b)  # cooling down: hold b at 2
    assert p.actions == (ScaleTo(2, pool="b"),)
    assert "next step after min_interval_s=10" in p.reasons[("b", "", "ScaleTo")]
    p = pol.propose(sig(at=11, memory__psi_full_avg10=12.5), a + b[:2])
    assert p.actions == (ScaleTo(1, pool="b"),)
    p = pol.propose(sig(at=30, memory__psi_full_avg10=12.5), a + b[:1])  # every pool at 1: never below
    assert p.actions == (ScaleTo(1, pool="a"), ScaleTo(1, pool="b"))
    assert p.reasons[("a", "", "ScaleTo")].endswith("; already at 1 instance in pool 'a'")
    # equal pools: the one listed last gives; one pool shown: reasons read as for a single pool
    two = [inst(f"c{k}", CPU, pool="c") for k in range(2)]
    assert MemoryPressurePolicy().propose(sig(memory__psi_full_avg10=50), two + b[:2]).actions == (ScaleTo(1, pool="b"),)
    p = MemoryPressurePolicy().propose(sig(memory__psi_full_avg10=50), two)
    assert p.actions == (ScaleTo(1, pool="c"),)
    assert p.reasons[("c", "", "ScaleTo")] == "memory.psi_full_avg10=50 > psi_full_threshold=10: 2 -> 1 instance(s)"


# ---------------------------------------------------------------------------- latency


def lat(name: str, p95: float, value: Any, backend: str = CPU, option: str = "num_threads") -> InstanceView:
    return InstanceView(name=name, backends=(backend,), options={backend: {option: value}}, latency_p95=p95, executions=100)


def test_latency_controller_steps_up_down_and_holds() -> None:
    pol = LatencyTargetPolicy(target_p95_s=0.030, backend=CPU, option="num_threads", ladder=[1, 2, 4], band=0.1, min_interval_s=5)
    assert pol.signals == ()
    p = pol.propose(sig(at=0), [lat("slow", 0.050, 1), lat("fast", 0.010, 4), lat("ok", 0.031, 2), lat("new", 0.0, 1)])
    assert opts(p) == {"slow": {CPU: {"num_threads": 2}}, "fast": {CPU: {"num_threads": 2}}, "ok": {CPU: {"num_threads": 2}}}
    assert p.reasons[("slow", CPU, "num_threads")] == "latency_p95=0.05s > 0.033s (target_p95_s=0.03s + band): step up 1 -> 2"
    assert p.reasons[("fast", CPU, "num_threads")] == "latency_p95=0.01s < 0.027s (target_p95_s=0.03s - band): step down 4 -> 2"
    assert p.reasons[("ok", CPU, "num_threads")] == "latency_p95=0.031s within [0.027s, 0.033s] of target_p95_s=0.03s: hold 2"
    # "new" has no latency yet: nothing for it

    # cool-down: 'slow' is still slow 4 s later but holds at 2; 'ok' never stepped, so it may
    p = pol.propose(sig(at=4), [lat("slow", 0.050, 2), lat("ok", 0.040, 2)])
    assert opts(p)["slow"][CPU]["num_threads"] == 2
    assert "holding 2: last step 4s ago < min_interval_s=5" in p.reasons[("slow", CPU, "num_threads")]
    assert opts(p)["ok"][CPU]["num_threads"] == 4

    p = pol.propose(sig(at=5), [lat("slow", 0.050, 2)])  # cool-down over
    assert opts(p)["slow"][CPU]["num_threads"] == 4
    p = pol.propose(sig(at=20), [lat("slow", 0.050, 4)])  # top rung: stays
    assert opts(p)["slow"][CPU]["num_threads"] == 4
    assert "at the fastest rung 4" in p.reasons[("slow", CPU, "num_threads")]
    p = pol.propose(sig(at=20), [lat("fast", 0.001, 1)])  # bottom rung: stays
    assert opts(p)["fast"][CPU]["num_threads"] == 1
    assert "at the cheapest rung 1" in p.reasons[("fast", CPU, "num_threads")]


def test_latency_controller_on_power_mode_and_values_off_the_ladder() -> None:
    ladder = ["low", "balanced", "performance"]
    pol = LatencyTargetPolicy(0.010, NPU, "power_mode", ladder, min_interval_s=0)
    p = pol.propose(sig(at=0), [lat("cam", 0.020, "balanced", NPU, "power_mode"), lat("cpu", 0.5, 1)])
    assert opts(p) == {"cam": {NPU: {"power_mode": "performance"}}}
    # the value in force wins over what it proposed (another policy forced "low")
    p = pol.propose(sig(at=1), [lat("cam", 0.020, "low", NPU, "power_mode")])
    assert opts(p)["cam"][NPU]["power_mode"] == "balanced"
    # a numeric value in force between rungs starts from the rung below it
    threads = LatencyTargetPolicy(0.010, CPU, "num_threads", [1, 2, 4, 8], min_interval_s=0)
    assert opts(threads.propose(sig(), [lat("x", 0.020, 3)]))["x"][CPU]["num_threads"] == 4


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ladder": []}, "ladder"),
        ({"ladder": "fast"}, "ladder"),
        ({"ladder": [1, 1]}, "duplicate"),
        ({"target_p95_s": 0}, "target_p95_s"),
        ({"band": 1.0}, "band"),
        ({"min_interval_s": -1}, "min_interval_s"),
    ],
)
def test_latency_rejects_bad_parameters(kw: dict[str, Any], match: str) -> None:
    params: dict[str, Any] = {"target_p95_s": 0.01, "backend": CPU, "option": "num_threads", "ladder": [1, 2]} | kw
    with pytest.raises(InvalidArgumentError, match=match):
        LatencyTargetPolicy(**params)


def test_every_builtin_is_a_policy_and_takes_its_name() -> None:
    built = [
        BatteryPolicy(),
        CoreAvailabilityPolicy(),
        ThermalPolicy(),
        MemoryPressurePolicy(),
        LatencyTargetPolicy(0.01, CPU, "num_threads", [1, 2]),
    ]
    for pol in built:
        assert isinstance(pol, Policy)
        assert isinstance(pol.signals, tuple) and isinstance(pol.priority, int)
    assert [p.name for p in built] == ["battery", "core_availability", "thermal", "memory_pressure", "latency_target"]
    assert BatteryPolicy(name="night", priority=5).name == "night"
    # safety first: thermal > memory > battery > cores > latency
    assert built[2].priority > built[3].priority > built[0].priority > built[1].priority > built[4].priority


def test_scripted_battery_drives_the_policy() -> None:
    clock = policies.ManualClock()
    src = ScriptedSource([(0, {"battery.percent": 100}), (2.0, {"battery.percent": 15}), (4.0, {"battery.charging": True})], clock=clock)
    pol = BatteryPolicy()
    seen = []
    for _ in range(3):
        pol.propose(Signals(src.read(), at=clock()), [inst("cam", NPU)])
        seen.append(pol.mode)
        clock.advance(2.0)
    assert seen == ["normal", "low", "normal"]


# ---------------------------------------------------------------------------- registry


def test_builtin_names() -> None:
    assert {"battery", "core_availability", "thermal", "memory_pressure", "latency_target"} <= set(policy_names())
    assert {"battery", "cpu", "thermal", "pressure", "scripted"} <= set(source_names())
    assert get_policy("battery") is BatteryPolicy
    assert get_source("cpu") is CpuSource


def test_load_policy_by_name_and_module_attr() -> None:
    pol = load_policy("battery", low=10, high=15)
    assert isinstance(pol, BatteryPolicy) and pol.low == 10
    pol = load_policy("orchestra.policies:ThermalPolicy", hot_c=60, cool_c=50)
    assert isinstance(pol, ThermalPolicy) and pol.hot_c == 60
    assert isinstance(load_policy("orchestra.policies._builtin:MemoryPressurePolicy"), MemoryPressurePolicy)
    src = load_source("scripted", timeline=[(0, {"a": 1})])
    assert src.read() == {"a": 1}
    assert isinstance(load_source("battery", root="/nonexistent"), BatterySource)


def test_load_policy_unknown_name() -> None:
    with pytest.raises(NotFoundError, match="'batery' is not registered.*battery") as info:
        load_policy("batery")
    assert info.value.code is Error.NotFound
    with pytest.raises(NotFoundError, match="signal source 'gps'"):
        load_source("gps")


def test_load_policy_bad_parameters_name_policy_and_parameter() -> None:
    with pytest.raises(InvalidArgumentError, match=r"policy 'battery' has no parameter 'lwo'") as info:
        load_policy("battery", lwo=10)
    assert info.value.code is Error.InvalidArgument
    with pytest.raises(InvalidArgumentError, match=r"policy 'latency_target' needs parameter 'target_p95_s'"):
        load_policy("latency_target", backend=CPU, option="num_threads", ladder=[1])
    with pytest.raises(InvalidArgumentError, match=r"policy 'battery': BatteryPolicy: parameter 'high'"):
        load_policy("battery", low=50, high=10)
    with pytest.raises(InvalidArgumentError, match=r"signal source 'scripted'.*step 0"):
        load_source("scripted", timeline=[(0, 1)])


@pytest.fixture
def plugin_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real module on sys.path with policies and non-policies in it."""
    name = "orchestra_test_plugin_policies"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from orchestra.policies import Proposal

            class Night:
                signals = ()

                def __init__(self, strength=1, *, name="night", priority=7):
                    if strength not in (1, 2, 3):
                        raise TypeError(f"strength must be 1, 2 or 3, got {strength!r}")
                    self.name, self.priority, self.strength = name, priority, strength

                def propose(self, signals, instances):
                    return Proposal()

            def make_night(**kw):
                return Night(**kw)

            ready = Night(name="ready")

            class NotAPolicy:
                def __init__(self, x=1):
                    self.x = x

            def makes_junk():
                return 42

            number = 5

            class Namespace:
                Inner = Night

            class Ticker:
                name = "ticker"

                def read(self):
                    return {"ticker.n": 1}
            """
        )
    )
    (tmp_path / "orchestra_test_broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in (name, "orchestra_test_broken_plugin"):
        sys.modules.pop(mod, None)


def test_module_attr_policies(plugin_module: str) -> None:
    m = plugin_module
    pol = load_policy(f"{m}:Night", strength=2)
    assert isinstance(pol, Policy) and pol.strength == 2  # type: ignore[attr-defined]
    assert load_policy(f"{m}:ready").name == "ready"  # an already-built policy object
    assert load_policy(f"{m}:Namespace.Inner").name == "night"  # dotted attribute
    assert load_source(f"{m}:Ticker").read() == {"ticker.n": 1}


def test_module_attr_errors(plugin_module: str) -> None:
    m = plugin_module
    with pytest.raises(NotFoundError, match=r"policy 'no_such_module_xyz:Thing': can't import module 'no_such_module_xyz'"):
        load_policy("no_such_module_xyz:Thing")
    with pytest.raises(NotFoundError, match=rf"policy '{m}:Nope': module '{m}' has no attribute 'Nope'"):
        load_policy(f"{m}:Nope")
    with pytest.raises(ConfigError, match=r"importing module 'orchestra_test_broken_plugin' failed: RuntimeError: boom at import"):
        load_policy("orchestra_test_broken_plugin:X")
    with pytest.raises(ConfigError, match=rf"policy '{m}:NotAPolicy' is the class 'NotAPolicy', which is not a Policy"):
        load_policy(f"{m}:NotAPolicy")
    # a function named by module:attr is never called (only a Policy class or a built policy)
    with pytest.raises(ConfigError, match=rf"policy '{m}:makes_junk' is <function makes_junk at .*>, not a class: "
                                          r"'module:attr' must name a policy class \(one with propose\(\)\)"):
        load_policy(f"{m}:makes_junk")
    with pytest.raises(ConfigError, match=rf"policy '{m}:make_night' is <function make_night .*>, not a class"):
        load_policy(f"{m}:make_night", name="n2")
    with pytest.raises(ConfigError, match=rf"policy '{m}:number' is 5, which is not a Policy"):
        load_policy(f"{m}:number")
    with pytest.raises(ConfigError, match="not a SignalSource"):
        load_source(f"{m}:Night")
    with pytest.raises(InvalidArgumentError, match=rf"policy '{m}:Night' has no parameter 'colour' \(parameters: strength, name, priority\)"):
        load_policy(f"{m}:Night", colour="blue")
    with pytest.raises(InvalidArgumentError, match=rf"policy '{m}:Night': bad parameters \['strength'\]: TypeError: strength must be 1, 2 or 3"):
        load_policy(f"{m}:Night", strength=9)
    with pytest.raises(InvalidArgumentError, match=rf"policy '{m}:ready' is an object, not a factory"):
        load_policy(f"{m}:ready", strength=2)
    with pytest.raises(NotFoundError, match="module:attr"):
        load_policy(":Night")
    with pytest.raises(InvalidArgumentError):
        load_policy("")


def test_module_attr_never_calls_a_function(tmp_path: Path) -> None:
    """A config's ``use = "os:system"`` with ``params = { command = ... }`` must not run the
    command: only classes implementing the protocol are called."""
    marker = tmp_path / "ran"
    with pytest.raises(ConfigError, match=r"policy 'os:system' is <built-in function system>, not a class"):
        load_policy("os:system", command=f"touch {marker}")
    with pytest.raises(ConfigError, match=r"signal source 'os:system' is <built-in function system>, not a class"):
        load_source("os:system", command=f"touch {marker}")
    with pytest.raises(ConfigError, match=r"signal source 'subprocess:Popen' is the class 'Popen', which is not a SignalSource"):
        load_source("subprocess:Popen", args=["touch", str(marker)])
    assert not marker.exists()


def test_register_policy(plugin_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.policies import _registry

    monkeypatch.setattr(_registry, "_POLICIES", _registry._Registry("policy", "orchestra.test.none"))
    module = __import__(plugin_module)
    register_policy("night", module.Night)
    assert get_policy("night") is module.Night
    assert load_policy("night", strength=3).strength == 3
    assert policy_names() == ("night",)
    with pytest.raises(InvalidArgumentError, match="'night' is already registered"):
        register_policy("night", module.make_night)
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        register_policy("other", 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="without ':'"):
        register_policy("a:b", module.Night)
    with pytest.raises(NotFoundError, match=r"registered: night"):
        get_policy("day")


def test_register_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.policies import _registry

    monkeypatch.setattr(_registry, "_SOURCES", _registry._Registry("signal source", "orchestra.test.none"))

    class Fixed:
        name = "fixed"

        def __init__(self, values: Mapping[str, Any] | None = None) -> None:
            self.values = dict(values or {})

        def read(self) -> Mapping[str, Any]:
            return self.values

    register_source("fixed", Fixed)
    assert load_source("fixed", values={"a.b": 1}).read() == {"a.b": 1}
    assert source_names() == ("fixed",)


def _install_plugin(site: Path, name: str, entry_points: str) -> None:
    """A real installed distribution: ``<name>-1.0.dist-info`` with METADATA and
    entry_points.txt in a folder on sys.path (what pip leaves behind)."""
    dist = site / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_entry_point_discovery_is_lazy(plugin_module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.policies import _registry

    _install_plugin(tmp_path, "orchestra_test_policy_plugin", textwrap.dedent(f"""\
        [orchestra.policies]
        night = {plugin_module}:Night
        broken = orchestra_test_broken_plugin:X
        battery = somewhere:else

        [orchestra.signal_sources]
        ticker = {plugin_module}:Ticker
        """))  # "battery": a built-in name, the built-in stays
    monkeypatch.syspath_prepend(str(tmp_path))  # plugin_module's folder is there too
    policies_reg = _registry._Registry("policy", "orchestra.policies")
    policies_reg.register("battery", BatteryPolicy)
    monkeypatch.setattr(_registry, "_POLICIES", policies_reg)
    monkeypatch.setattr(_registry, "_SOURCES", _registry._Registry("signal source", "orchestra.signal_sources"))
    assert {"battery", "broken", "night"} <= set(policy_names())
    assert "orchestra_test_broken_plugin" not in sys.modules  # listed, not imported
    assert load_policy("night", strength=3).strength == 3  # type: ignore[attr-defined]
    assert get_policy("battery") is BatteryPolicy
    with pytest.raises(NotFoundError, match=r"policy 'broken': entry point in group 'orchestra.policies' .* failed to load: RuntimeError: boom"):
        get_policy("broken")
    assert "ticker" in source_names() and load_source("ticker").read() == {"ticker.n": 1}
    # discovered once: a plugin installed later is not seen by this registry
    _install_plugin(tmp_path, "orchestra_test_later_plugin", f"[orchestra.policies]\nlater = {plugin_module}:Night\n")
    assert "later" not in policy_names()


def test_public_names_importable() -> None:
    for name in policies.__all__:
        assert hasattr(policies, name), name
    assert len(set(policies.__all__)) == len(policies.__all__)
