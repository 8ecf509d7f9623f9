"""Signal sources against small sysfs/procfs-like trees built in tmp_path (real files, the real
parsing), and the real machine's sources run without raising."""

from __future__ import annotations

import os
import pathlib

import pytest

from orchestra import InvalidArgumentError
from orchestra.policies import (
    BatterySource,
    CpuSource,
    ManualClock,
    PressureSource,
    ScriptedSource,
    SignalSource,
    ThermalSource,
    parse_cpu_list,
)


def write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---------------------------------------------------------------------------- battery


def test_battery_discharging_laptop(tmp_path: pathlib.Path) -> None:
    root = write(
        tmp_path,
        {
            "BAT0/type": "Battery\n",
            "BAT0/present": "1\n",
            "BAT0/capacity": "14\n",
            "BAT0/status": "Discharging\n",
            "AC/type": "Mains\n",
            "AC/online": "0\n",
        },
    )
    assert BatterySource(root).read() == {"battery.present": True, "battery.percent": 14.0, "battery.charging": False}


def test_battery_charging_from_adapter_or_status(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "a", {"BAT0/type": "Battery", "BAT0/capacity": "50", "BAT0/status": "Not charging", "AC0/type": "Mains", "AC0/online": "1"})
    assert BatterySource(tmp_path / "a").read()["battery.charging"] is True
    write(tmp_path / "b", {"BAT1/type": "Battery", "BAT1/capacity": "100", "BAT1/status": "Full"})
    assert BatterySource(tmp_path / "b").read() == {"battery.present": True, "battery.percent": 100.0, "battery.charging": True}
    write(tmp_path / "c", {"BAT1/type": "Battery", "BAT1/capacity": "60", "BAT1/status": "Charging", "usb/type": "USB", "usb/online": "0"})
    assert BatterySource(tmp_path / "c").read()["battery.charging"] is True


def test_battery_two_batteries_average_and_energy_fallback(tmp_path: pathlib.Path) -> None:
    root = write(
        tmp_path,
        {
            "BAT0/type": "Battery",
            "BAT0/capacity": "80",
            "BAT1/type": "Battery",
            "BAT1/energy_now": "10000",
            "BAT1/energy_full": "40000",
        },
    )
    out = BatterySource(root).read()
    assert out["battery.percent"] == pytest.approx((80 + 25) / 2)
    assert "battery.charging" not in out  # no status, no adapter: unknown


def test_no_battery_gives_no_signals(tmp_path: pathlib.Path) -> None:
    # A server: an AC adapter at most, no Battery supply.
    write(tmp_path / "ac", {"AC/type": "Mains", "AC/online": "1"})
    assert BatterySource(tmp_path / "ac").read() == {}
    assert BatterySource(tmp_path / "empty").read() == {}  # the directory doesn't even exist
    write(tmp_path / "gone", {"BAT0/type": "Battery", "BAT0/present": "0", "BAT0/capacity": "77"})
    assert BatterySource(tmp_path / "gone").read() == {}


def test_battery_malformed_files_are_absent(tmp_path: pathlib.Path) -> None:
    root = write(
        tmp_path,
        {
            "BAT0/type": "Battery",
            "BAT0/capacity": "lots\n",
            "BAT0/energy_now": "12",
            "BAT0/energy_full": "0",  # would divide by zero
            "AC/type": "Mains",
            "AC/online": "maybe",
        },
    )
    (tmp_path / "BAT0" / "status").write_bytes(b"\xff\xfe")  # not text
    (tmp_path / "weird").mkdir()  # no type file at all
    assert BatterySource(root).read() == {"battery.present": True}
    write(tmp_path, {"BAT0/capacity": "-5"})
    assert "battery.percent" not in BatterySource(root).read()
    write(tmp_path, {"BAT0/capacity": "104"})  # some gauges overshoot
    assert BatterySource(root).read()["battery.percent"] == 100.0


# ---------------------------------------------------------------------------- cpu


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-3,5", {0, 1, 2, 3, 5}), ("0", {0}), ("0-1,4-5\n", {0, 1, 4, 5}), ("", set()), ("a-b", None), ("3-1", None), ("-1", None)],
)
def test_parse_cpu_list(text: str, expected: set[int] | None) -> None:
    assert parse_cpu_list(text) == expected


def cpu_source(tmp_path: pathlib.Path, *, cgroup_file: str = "none", **kw: object) -> CpuSource:
    return CpuSource(tmp_path / "online", tmp_path / "cgroup", tmp_path / cgroup_file, read_affinity=False, **kw)  # type: ignore[arg-type]


def test_cpu_online_and_v2_quota(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {"online": "0-3,5\n", "cgroup/cpu.max": "200000 100000\n"})
    assert cpu_source(tmp_path).read() == {"cpu.online": 5, "cpu.quota": 2.0, "cpu.available": 2.0}


def test_cpu_quota_max_is_absent(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {"online": "0-3", "cgroup/cpu.max": "max 100000\n"})
    assert cpu_source(tmp_path).read() == {"cpu.online": 4, "cpu.available": 4}


def test_cpu_fractional_quota_is_the_minimum(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {"online": "0-7", "cgroup/cpu.max": "150000 100000"})
    out = cpu_source(tmp_path).read()
    assert out["cpu.quota"] == 1.5 and out["cpu.available"] == 1.5


def test_cpu_quota_smallest_on_the_cgroup_path(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path,
        {
            "online": "0-15",
            "self-cgroup": "0::/app.slice/worker\n",
            "cgroup/app.slice/cpu.max": "300000 100000",
            "cgroup/app.slice/worker/cpu.max": "max 100000",
        },
    )
    assert cpu_source(tmp_path, cgroup_file="self-cgroup").read()["cpu.quota"] == 3.0


def test_cpu_v1_quota(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path,
        {
            "online": "0-3",
            "self-cgroup": "4:memory:/x\n2:cpu,cpuacct:/job\n0::/\n",
            "cgroup/cpu,cpuacct/job/cpu.cfs_quota_us": "50000",
            "cgroup/cpu,cpuacct/job/cpu.cfs_period_us": "100000",
            "cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
            "cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
        },
    )
    assert cpu_source(tmp_path, cgroup_file="self-cgroup").read() == {"cpu.online": 4, "cpu.quota": 0.5, "cpu.available": 0.5}


def test_cpu_absent_and_malformed(tmp_path: pathlib.Path) -> None:
    assert cpu_source(tmp_path).read() == {}
    write(tmp_path, {"online": "zero to three", "cgroup/cpu.max": "lots 100000", "self-cgroup": "garbage"})
    assert cpu_source(tmp_path, cgroup_file="self-cgroup").read() == {}
    write(tmp_path, {"cgroup/cpu.max": "100000 0"})
    assert cpu_source(tmp_path).read() == {}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no sched_getaffinity here")
def test_cpu_affinity_counts_this_process(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {"online": "0-511"})
    out = CpuSource(tmp_path / "online", tmp_path / "cgroup", tmp_path / "none").read()
    n = len(os.sched_getaffinity(0))
    assert out["cpu.affinity"] == n and out["cpu.available"] == min(512, n)


# ---------------------------------------------------------------------------- thermal


def test_thermal_zones(tmp_path: pathlib.Path) -> None:
    root = write(
        tmp_path,
        {
            "thermal_zone0/type": "x86_pkg_temp\n",
            "thermal_zone0/temp": "81500\n",
            "thermal_zone1/type": "acpitz",
            "thermal_zone1/temp": "45000",
            "thermal_zone2/type": "acpitz",
            "thermal_zone2/temp": "47000",
            "thermal_zone3/type": "cpu-thermal",
            "thermal_zone3/temp": "60000",
            "cooling_device0/type": "Processor",
            "cooling_device0/cur_state": "0",
        },
    )
    assert ThermalSource(root).read() == {
        "thermal.max_c": 81.5,
        "thermal.x86_pkg_temp_c": 81.5,
        "thermal.acpitz_c": 47.0,
        "thermal.cpu_thermal_c": 60.0,
    }


def test_thermal_absent_and_malformed(tmp_path: pathlib.Path) -> None:
    assert ThermalSource(tmp_path / "nothing").read() == {}
    root = write(
        tmp_path / "t",
        {
            "thermal_zone0/type": "broken",
            "thermal_zone0/temp": "hot",
            "thermal_zone1/type": "bogus",
            "thermal_zone1/temp": "-274000",
            "thermal_zone2/type": "ok",  # no temp file
        },
    )
    assert ThermalSource(root).read() == {}
    write(root, {"thermal_zone3/temp": "30000"})  # a zone without a type still counts for max
    assert ThermalSource(root).read() == {"thermal.max_c": 30.0}


# ---------------------------------------------------------------------------- pressure

MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    2097152 kB
Buffers:          100000 kB
"""


def test_pressure(tmp_path: pathlib.Path) -> None:
    root = write(
        tmp_path,
        {
            "pressure/memory": "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=4.25 avg60=1.00 avg300=0.10 total=45\n",
            "pressure/cpu": "some avg10=30.00 avg60=20.00 avg300=10.00 total=999\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            "meminfo": MEMINFO,
        },
    )
    assert PressureSource(root).read() == {
        "memory.psi_some_avg10": 12.5,
        "memory.psi_full_avg10": 4.25,
        "memory.available_bytes": 2097152 * 1024,
        "cpu.psi_some_avg10": 30.0,
    }


def test_pressure_without_psi_or_malformed(tmp_path: pathlib.Path) -> None:
    assert PressureSource(tmp_path).read() == {}
    write(tmp_path, {"meminfo": MEMINFO})  # a kernel without PSI
    assert PressureSource(tmp_path).read() == {"memory.available_bytes": 2097152 * 1024}
    write(
        tmp_path,
        {
            "meminfo": "MemTotal: 10 kB\nMemAvailable: many kB\n",
            "pressure/memory": "some avg10=x avg60=1\nfull\n",
            "pressure/cpu": "nonsense\n",
        },
    )
    assert PressureSource(tmp_path).read() == {}


# ---------------------------------------------------------------------------- scripted


def test_scripted_steps_merge_over_time() -> None:
    clock = ManualClock(100.0)
    src = ScriptedSource(
        [
            (0, {"battery.percent": 100, "battery.charging": False}),
            (2.0, {"battery.percent": 15}),
            (5.0, {"battery.charging": True, "battery.percent": None}),
        ],
        clock=clock,
    )
    assert src.read() == {"battery.percent": 100, "battery.charging": False}  # starts at first read
    clock.advance(1.999)
    assert src.read()["battery.percent"] == 100
    clock.advance(0.001)
    assert src.read() == {"battery.percent": 15, "battery.charging": False}
    src.advance(10)
    assert src.read() == {"battery.charging": True}  # None removes a signal
    src.start()
    assert src.read()["battery.percent"] == 100
    assert src.elapsed() == 0.0


def test_scripted_with_a_standing_clock_and_unsorted_timeline() -> None:
    src = ScriptedSource([(3, {"x": "c"}), (1, {"x": "b"}), (0, {"x": "a"})], clock=lambda: 7.0, name="demo")
    assert src.name == "demo"
    assert src.read() == {"x": "a"}
    src.advance(1)
    assert src.read() == {"x": "b"}
    src.advance(5)
    assert src.read() == {"x": "c"}
    assert ScriptedSource([(1.0, {"late": 1})], clock=lambda: 0.0).read() == {}


def test_scripted_starts_explicitly() -> None:
    clock = ManualClock()
    src = ScriptedSource([(0, {"a": 1}), (1, {"a": 2})], clock=clock)
    src.start()
    clock.advance(1.5)
    assert src.read() == {"a": 2}


@pytest.mark.parametrize(
    ("timeline", "match"),
    [
        ([(0, {"a": 1}), "oops"], "step 1"),
        ([(-1, {"a": 1})], "time must be"),
        ([(float("nan"), {"a": 1})], "time must be"),
        ([(0, [1, 2])], "values must be a mapping"),
        ([(0, {"a": [1]})], "signal 'a'"),
        ([(0, {3: 1})], "signal names"),
    ],
)
def test_scripted_rejects_bad_timelines(timeline: list, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ScriptedSource(timeline)


def test_scripted_advance_rejects_negative() -> None:
    with pytest.raises(InvalidArgumentError):
        ScriptedSource([]).advance(-1)
    with pytest.raises(InvalidArgumentError):
        ManualClock().advance(-1)


# ---------------------------------------------------------------------------- real machine


@pytest.mark.parametrize("source", [BatterySource(), CpuSource(), ThermalSource(), PressureSource()], ids=repr)
def test_real_machine_sources_run(source: SignalSource) -> None:
    assert isinstance(source, SignalSource)
    values = source.read()
    assert isinstance(values, dict)
    for key, value in values.items():
        assert key.startswith(("battery.", "cpu.", "thermal.", "memory."))
        assert isinstance(value, bool | int | float | str)
    # a machine without the files (a server: no battery; a VM: no thermal zones) gets no
    # signals from them, never made-up ones
    root = getattr(source, "root", None)
    if isinstance(source, (BatterySource, ThermalSource)) and root is not None and not any(pathlib.Path(root).glob("*")):
        assert values == {}


# The default roots' layout as a real machine has it (a laptop's /sys/class/power_supply with
# a battery and an adapter; /sys/class/thermal with zones and a cooling device), under
# tmp_path: what the real-machine test above can't check on a machine without them.
LAPTOP_POWER_SUPPLY = {
    "BAT0/type": "Battery\n", "BAT0/present": "1\n", "BAT0/status": "Discharging\n",
    "BAT0/energy_now": "30000000\n", "BAT0/energy_full": "60000000\n", "BAT0/capacity": "50\n",
    "BAT0/uevent": "POWER_SUPPLY_NAME=BAT0\n",
    "ADP1/type": "Mains\n", "ADP1/online": "0\n",
    "ucsi-source-psy-USBC000:001/type": "USB\n", "ucsi-source-psy-USBC000:001/online": "0\n",
}
LAPTOP_THERMAL = {
    "thermal_zone0/type": "acpitz\n", "thermal_zone0/temp": "52000\n", "thermal_zone0/mode": "enabled\n",
    "thermal_zone1/type": "x86_pkg_temp\n", "thermal_zone1/temp": "67500\n",
    "cooling_device0/type": "Processor\n", "cooling_device0/cur_state": "0\n", "cooling_device0/max_state": "3\n",
}


def test_battery_and_thermal_read_a_laptop_like_tree(tmp_path: pathlib.Path) -> None:
    battery = BatterySource(write(tmp_path / "power_supply", LAPTOP_POWER_SUPPLY))
    assert battery.read() == {"battery.present": True, "battery.percent": 50.0, "battery.charging": False}
    (tmp_path / "power_supply" / "ADP1" / "online").write_text("1\n")  # plugged in: the next read sees it
    assert battery.read()["battery.charging"] is True
    thermal = ThermalSource(write(tmp_path / "thermal", LAPTOP_THERMAL))
    assert thermal.read() == {"thermal.max_c": 67.5, "thermal.acpitz_c": 52.0, "thermal.x86_pkg_temp_c": 67.5}
    (tmp_path / "thermal" / "thermal_zone1" / "temp").write_text("91000\n")
    assert thermal.read()["thermal.max_c"] == 91.0


def test_real_cpu_source_reports_something_on_linux() -> None:
    if not pathlib.Path("/sys/devices/system/cpu/online").exists():
        pytest.skip("not Linux sysfs")
    out = CpuSource().read()
    assert out["cpu.online"] >= 1 and out["cpu.available"] >= 0
