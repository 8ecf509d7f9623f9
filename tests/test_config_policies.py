"""orchestra.config: policy and signal-source parameters reported all at once (issue 15 item 8),
and warnings for settings that are valid but can never do anything (issue 15 item 6).

Every config is a real file next to copies of the example programs; each case asserts every
line ``validate_config`` returns (errors) or every ``Config.warnings`` line.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from orchestra import _cli
from orchestra.config import ConfigError, load_config, validate_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"

NPU = '[program]\npath = "models/convnet_npu.pte"\n[device.npu0]\nkind = "npu_sim"\n'
PLAIN = '[program]\npath = "models/convnet.pte"\n'
SYN = 'source = { kind = "synthetic", fps = 30, shape = [1, 3, 16, 16] }'
FRONT = f'\n[[camera]]\nname = "front"\n{SYN}\nbind = {{ "npu0.core" = 0 }}\n'
PLAIN_FRONT = f'\n[[camera]]\nname = "front"\n{SYN}\n'
BATTERY_FEED = ('\n[[signal]]\nuse = "scripted"\n'
                'params = { timeline = [[0, { "battery.percent" = 100 }], [1, { "battery.percent" = 10 }]] }\n')
BATTERY_PARAMS = "parameters: low, high, low_options, normal_options, name, priority"
LATENCY_PARAMS = "parameters: target_p95_s, backend, option, ladder, band, min_interval_s, measure, name, priority"


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "models").mkdir()
    for name in ("convnet.pte", "convnet_npu.pte"):
        shutil.copy(MODELS / name, tmp_path / "models" / name)
    return tmp_path


def write(folder: pathlib.Path, text: str) -> pathlib.Path:
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def errors(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    path = write(folder, text)
    assert validate_config(path) == expected
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert list(ei.value.errors) == expected


def warnings(folder: pathlib.Path, text: str) -> tuple[str, ...]:
    path = write(folder, text)
    assert validate_config(path) == []  # warnings are never errors
    return load_config(path).warnings


# -- item 8: every parameter problem at once ----------------------------------------------------


def test_every_policy_parameter_problem_at_once(folder: pathlib.Path) -> None:
    """Unknown parameters, a bad options table and two values the constructor rejects: before,
    only the unknown parameter was reported; fixing it showed the options table, then 'low',
    then 'high'."""
    params = ('{ lwo = 1, low = "twenty", high = -1, '
              'normal_options = { NpuSimBackend = { power_mode = "turbo" } } }')
    errors(folder, NPU + FRONT + f'\n[[policy]]\nuse = "battery"\nparams = {params}\n' + BATTERY_FEED, [
        f"policy[0].params.lwo: policy 'battery' has no parameter 'lwo' ({BATTERY_PARAMS})",
        "policy[0].params.normal_options.NpuSimBackend.power_mode: must be one of 'low', 'balanced', "
        "'performance'; got 'turbo'",
        "policy[0].params.low: policy 'battery': BatteryPolicy: parameter 'low' must be a number, got str 'twenty'",
        "policy[0].params.high: policy 'battery': BatteryPolicy: parameter 'high' must be >= 0, got -1",
    ])
    # fixing exactly what was reported leaves nothing: no next stage appears
    fixed = '{ low = 20, high = 30, normal_options = { NpuSimBackend = { power_mode = "balanced" } } }'
    assert validate_config(write(folder, NPU + FRONT + f'\n[[policy]]\nuse = "battery"\nparams = {fixed}\n'
                                 + BATTERY_FEED)) == []


def test_missing_required_parameters_and_bad_values_together(folder: pathlib.Path) -> None:
    """Required parameters that are missing don't hide the values given wrong."""
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "latency_target"\n'
           'params = { ladder = [], band = 2, min_interval_s = -1 }\n', [
               f"policy[0].params: policy 'latency_target' needs parameter 'target_p95_s' ({LATENCY_PARAMS})",
               f"policy[0].params: policy 'latency_target' needs parameter 'backend' ({LATENCY_PARAMS})",
               f"policy[0].params: policy 'latency_target' needs parameter 'option' ({LATENCY_PARAMS})",
               "policy[0].params.ladder: policy 'latency_target': LatencyTargetPolicy: parameter 'ladder' must be a "
               "non-empty list of values, got []",
               "policy[0].params.band: policy 'latency_target': LatencyTargetPolicy: parameter 'band' must be < 1, got 2",
               "policy[0].params.min_interval_s: policy 'latency_target': LatencyTargetPolicy: parameter "
               "'min_interval_s' must be >= 0, got -1",
           ])


def test_required_parameters_given_wrong_dont_hide_the_others(folder: pathlib.Path) -> None:
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "latency_target"\n'
           'params = { target_p95_s = -1, backend = "", option = "power_mode", ladder = [1, 1], band = -0.5 }\n', [
               "policy[0].params.target_p95_s: policy 'latency_target': LatencyTargetPolicy: parameter "
               "'target_p95_s' must be > 0, got -1",
               "policy[0].params.backend: policy 'latency_target': LatencyTargetPolicy: parameter 'backend' must be "
               "a non-empty string, got ''",
               "policy[0].params.ladder: policy 'latency_target': LatencyTargetPolicy: parameter 'ladder' has "
               "duplicate values: [1, 1]",
               "policy[0].params.band: policy 'latency_target': LatencyTargetPolicy: parameter 'band' must be >= 0, "
               "got -0.5",
           ])


def test_a_comparison_between_parameters_does_not_stop_the_checks(folder: pathlib.Path) -> None:
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "thermal"\nparams = { hot_c = 50, cool_c = 60, backend = 3 }\n', [
        "policy[0].params.cool_c: policy 'thermal': ThermalPolicy: parameter 'cool_c' (60) must be <= 'hot_c' (50)",
        "policy[0].params.backend: policy 'thermal': ThermalPolicy: parameter 'backend' must be a non-empty string, "
        "got 3",
    ])


def test_no_problem_is_made_up_by_leaving_a_rejected_value_out(folder: pathlib.Path) -> None:
    """'low' is rejected; checking on with low's default (20) would make 'high = 10' wrong, which
    it is not with any valid 'low' the user might mean: it is not reported."""
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "battery"\nparams = { low = -5, high = 10 }\n', [
        "policy[0].params.low: policy 'battery': BatteryPolicy: parameter 'low' must be >= 0, got -5",
    ])


def test_priority_twice_still_checks_the_parameters(folder: pathlib.Path) -> None:
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "battery"\npriority = 1\nparams = { priority = 2, low = "x" }\n', [
        "policy[0].priority: also given in params: give it once",
        "policy[0].params.low: policy 'battery': BatteryPolicy: parameter 'low' must be a number, got str 'x'",
    ])


def test_signal_source_parameters_at_once(folder: pathlib.Path) -> None:
    errors(folder, NPU + FRONT + '\n[[signal]]\nuse = "scripted"\nparams = { timelin = [], nam = "s" }\n', [
        "signal[0].params.timelin: signal source 'scripted' has no parameter 'timelin' (parameters: timeline, "
        "clock, name); did you mean 'timeline'?",
        "signal[0].params.nam: signal source 'scripted' has no parameter 'nam' (parameters: timeline, clock, name); "
        "did you mean 'name'?",
        "signal[0].params: signal source 'scripted' needs parameter 'timeline' (parameters: timeline, clock, name)",
    ])


def test_a_module_attr_policy_gets_every_problem_too(folder: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``module:attr`` classes are checked by the registry one parameter at a time: all of them
    are still reported."""
    (folder / "cfgpol_every_problem.py").write_text(textwrap.dedent("""
        from orchestra.errors import InvalidArgumentError


        class Night:
            signals = ()

            def __init__(self, level: int = 1, *, name: str = "night", priority: int = 0) -> None:
                if not isinstance(level, int):
                    raise InvalidArgumentError(f"Night: parameter 'level' must be an int, got {level!r}")
                self.name, self.priority = name, priority

            def propose(self, signals, instances):
                raise AssertionError("never run by validation")
        """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    errors(folder, NPU + FRONT + '\n[[policy]]\nuse = "cfgpol_every_problem:Night"\n'
           'params = { level = "high", colour = 1, mood = 2 }\n', [
               "policy[0].params.colour: policy 'cfgpol_every_problem:Night' has no parameter 'colour' (parameters: "
               "level, name, priority)",
               "policy[0].params.mood: policy 'cfgpol_every_problem:Night' has no parameter 'mood' (parameters: "
               "level, name, priority)",
               "policy[0].params.level: policy 'cfgpol_every_problem:Night': Night: parameter 'level' must be an "
               "int, got 'high'",
           ])


def test_the_cli_prints_them_all_in_one_run(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(folder, NPU + FRONT + '\n[[policy]]\nuse = "battery"\nparams = { low = "x", high = "y" }\n')
    assert _cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"{path}: policy[0].params.low: policy 'battery': BatteryPolicy: parameter 'low' must be a number, got str 'x'\n"
        f"{path}: policy[0].params.high: policy 'battery': BatteryPolicy: parameter 'high' must be a number, got str 'y'\n")


# -- item 6: silent no-ops are warnings -------------------------------------------------------------


def test_a_policy_no_signal_source_feeds(folder: pathlib.Path) -> None:
    policy = '\n[[policy]]\nuse = "battery"\n'
    assert warnings(folder, NPU + FRONT + policy) == (
        "policy[0]: policy 'battery' reads battery.percent, battery.charging, which no signal source provides "
        "(there are no [[signal]] sources): it never acts; add a [[signal]] with use = \"battery\"",)
    assert warnings(folder, NPU + FRONT + policy + '\n[[signal]]\nuse = "cpu"\n') == (
        "policy[0]: policy 'battery' reads battery.percent, battery.charging, which no signal source provides "
        "(sources: cpu): it never acts; add a [[signal]] with use = \"battery\"",)
    thermal = '\n[[policy]]\nuse = "thermal"\nparams = { signal = "thermal.gpu_c" }\n'
    assert warnings(folder, NPU + FRONT + thermal + BATTERY_FEED) == (
        "policy[0]: policy 'thermal' reads thermal.gpu_c, which no signal source provides (sources: scripted): it "
        "never acts; add a [[signal]] with use = \"thermal\"",)
    # fed: by the source that reads them, or by a script that names one of them
    assert warnings(folder, NPU + FRONT + policy + '\n[[signal]]\nuse = "battery"\n') == ()
    assert warnings(folder, NPU + FRONT + policy + BATTERY_FEED) == ()
    assert warnings(folder, NPU + FRONT + thermal + '\n[[signal]]\nuse = "thermal"\n') == ()


def test_a_policy_for_a_backend_no_camera_uses(folder: pathlib.Path) -> None:
    # the battery policy's default options are for NpuSimBackend; this method delegates to nothing
    assert warnings(folder, PLAIN + PLAIN_FRONT + '\n[[policy]]\nuse = "battery"\n' + BATTERY_FEED) == (
        "policy[0]: policy 'battery' sets options of backend 'NpuSimBackend' (its default low_options, "
        "normal_options), which no camera's method delegates to (the cameras' methods delegate to: no backend): "
        "it never acts",)
    cores = '\n[[policy]]\nuse = "core_availability"\nparams = { backend = "OnnxRuntimeBackend", option = "x" }\n'
    assert warnings(folder, NPU + FRONT + cores + '\n[[signal]]\nuse = "cpu"\n') == (
        "policy[0].params.backend: policy 'core_availability' sets options of backend 'OnnxRuntimeBackend', which "
        "no camera's method delegates to (the cameras' methods delegate to: NpuSimBackend): it never acts",)
    both = ('\n[[policy]]\nuse = "battery"\nparams = { low_options = { NpuSimBackend = { power_mode = "low" }, '
            'NumpyCpuBackend = { num_threads = 1 } } }\n')
    assert warnings(folder, NPU + FRONT + both + BATTERY_FEED) == (
        "policy[0].params.low_options.NumpyCpuBackend: policy 'battery' sets options of backend 'NumpyCpuBackend', "
        "which no camera's method delegates to (the cameras' methods delegate to: NpuSimBackend): those options "
        "never apply",)
    thermal = '\n[[policy]]\nuse = "thermal"\nparams = { option = "speed" }\n[[signal]]\nuse = "thermal"\n'
    assert warnings(folder, NPU + FRONT + thermal) == (
        "policy[0].params.option: policy 'thermal' sets option 'speed' of backend 'NpuSimBackend', which has no such "
        "option (options: device, core, power_mode, priority, label): it never acts",)


def test_thread_options_for_a_backend_no_bound_camera_uses(folder: pathlib.Path) -> None:
    cpu = '[device.cpu]\nkind = "cpu"\ncpus = [0]\nthread_options = { NumpyCpuBackend = "num_threads" }\n'
    bound = f'\n[[camera]]\nname = "front"\n{SYN}\nbind = {{ cpu = 0 }}\n'
    assert warnings(folder, PLAIN + cpu + bound) == (
        "device.cpu.thread_options.NumpyCpuBackend: no camera bound to device cpu runs a method that delegates to "
        "backend 'NumpyCpuBackend' (they delegate to: no backend): this entry never sets anything",)
    assert warnings(folder, PLAIN + cpu + PLAIN_FRONT) == (
        "device.cpu.thread_options: no camera binds to device cpu (bind = { cpu = N }): thread_options never applies",)
    # not given: the resource's default is nobody's mistake
    assert warnings(folder, PLAIN + '[device.cpu]\nkind = "cpu"\ncpus = [0]\n' + bound) == ()


LATENCY = '\n[[policy]]\nuse = "latency_target"\nparams = {{ target_p95_s = 0.03, backend = "NpuSimBackend", {rest} }}\n'


def test_a_latency_target_that_can_never_act(folder: pathlib.Path) -> None:
    def lt(rest: str, run: str = "") -> tuple[str, ...]:
        return warnings(folder, NPU + FRONT + LATENCY.format(rest=rest) + run)

    assert lt('option = "power_mode", ladder = ["low", "balanced", "performance"]') == ()
    assert lt('option = "power_mode", ladder = ["slow", "fast"]') == (
        "policy[0].params.ladder: policy 'latency_target': no value of its ladder is a valid NpuSimBackend power_mode "
        "(must be one of 'low', 'balanced', 'performance'): it never acts",)
    assert lt('option = "power_mode", ladder = ["low", "fast", 3]') == (
        "policy[0].params.ladder: policy 'latency_target': [\"fast\", 3] are not valid NpuSimBackend power_mode "
        "values (must be one of 'low', 'balanced', 'performance'): those rungs never apply",)
    assert lt('option = "power_mode", ladder = ["low"]') == (
        "policy[0].params.ladder: policy 'latency_target' has a one-value ladder: it only ever sets power_mode = "
        "\"low\" and never steps",)
    assert lt('option = "threads", ladder = [1, 2]') == (
        "policy[0].params.option: policy 'latency_target' sets option 'threads' of backend 'NpuSimBackend', which has "
        "no such option (options: device, core, power_mode, priority, label): it never acts",)
    assert lt('option = "power_mode", ladder = ["low", "balanced"]', "\n[run]\nduration_s = 2\nengine_period_s = 2\n") == (
        "policy[0]: policy 'latency_target' reads no signals, so only the policy engine's periodic run "
        "(run.engine_period_s = 2 s) acts on latency, and run.duration_s = 2 s ends the run first (unless "
        "--duration says otherwise): it never acts",)
    assert lt('option = "power_mode", ladder = ["low", "balanced"]', "\n[run]\nduration_s = 5\nengine_period_s = 2\n") == ()


def test_warnings_are_printed_by_validate_and_exit_0(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(folder, NPU + FRONT + '\n[[policy]]\nuse = "battery"\n')
    assert _cli.main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok (1 camera, 1 policy)\n"
    assert err == (f"{path}: warning: policy[0]: policy 'battery' reads battery.percent, battery.charging, which no "
                   f"signal source provides (there are no [[signal]] sources): it never acts; add a [[signal]] with "
                   f"use = \"battery\"\n")


def test_orchestra_run_prints_them_at_start(folder: pathlib.Path) -> None:
    path = write(folder, PLAIN + PLAIN_FRONT.replace("fps = 30", "fps = 30, count = 3")
                 + '\n[[policy]]\nuse = "battery"\n' + BATTERY_FEED + "\n[run]\nduration_s = 0.5\n")
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard"], capture_output=True,
                       text=True, timeout=120, cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stderr.splitlines()[0]
    assert first == (f"{path}: warning: policy[0]: policy 'battery' sets options of backend 'NpuSimBackend' (its "
                     f"default low_options, normal_options), which no camera's method delegates to (the cameras' "
                     f"methods delegate to: no backend): it never acts")
    assert re.search(r"^result: ", r.stdout, re.M), r.stdout


NODE_FRONT = FRONT + 'node = "edge-a"\n'
NODE_REAR = f'\n[[camera]]\nname = "rear"\n{SYN}\nbind = {{ "npu0.core" = 1 }}\nnode = "edge-b"\n'
CLUSTER = '\n[cluster]\naddress = "auto"\n'


def test_policy_and_signal_node_must_be_a_camera_node(folder: pathlib.Path) -> None:
    base = NPU + 'cores = 2\n' + NODE_FRONT + NODE_REAR
    cfg = load_config(write(folder, base + '\n[[policy]]\nuse = "battery"\nnode = "edge-b"\n' + BATTERY_FEED
                           + 'node = "edge-b"\n' + CLUSTER))
    assert (cfg.policies[0].node, cfg.signals[0].node) == ("edge-b", "edge-b")
    assert cfg.warnings == ()
    errors(folder, base + '\n[[policy]]\nuse = "battery"\nnode = "edge-c"\n' + BATTERY_FEED + 'node = "edge c"\n'
           + '\n[[signal]]\nuse = "battery"\nnode = 3\n' + CLUSTER, [
               "signal[0].node: \"edge c\" is not a node name: use letters, digits, '.', '_' and '-'",
               "signal[1].node: must be a non-empty string, got 3",
               "policy[0].node: no camera runs on node \"edge-c\" (camera nodes: edge-a, edge-b): set a camera's "
               "node, or fix the name; did you mean 'edge-b'?",
           ])


def test_policy_node_without_a_cluster_is_a_warning(folder: pathlib.Path) -> None:
    w = warnings(folder, NPU + 'cores = 2\n' + NODE_FRONT + '\n[[policy]]\nuse = "battery"\nnode = "edge-a"\n'
                 + BATTERY_FEED + 'node = "edge-a"\n')
    assert "policy[0].node: has no effect without a [cluster] table (the policy runs on this machine)" in w
    assert "signal[0].node: has no effect without a [cluster] table (the signal runs on this machine)" in w
