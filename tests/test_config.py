"""orchestra.config: the TOML config, its one-line errors, and ``orchestra validate``.

Every invalid config is a real file written to ``tmp_path`` next to copies of the example
programs; each case asserts the exact lines ``validate_config`` returns (all of them, so a
case also proves nothing else is reported), and that ``load_config`` raises ConfigError with
the same lines.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Mapping

import numpy as np
import pytest

from orchestra import _cli
from orchestra.config import cameras as _cameras
from orchestra.config import (
    CameraConfig,
    Config,
    ConfigError,
    PolicyConfig,
    SignalConfig,
    load_config,
    validate_config,
)
from orchestra.errors import ConfigError as ErrorsConfigError
from orchestra.errors import ProgramError
from orchestra.pipeline import source_names as frame_source_names
from orchestra.policies import policy_names, source_names
from orchestra.program import load
from orchestra.runtime import registered_backends

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = EXAMPLES / "models"

PROGRAM = '[program]\npath = "models/convnet_npu.pte"\n'
PLAIN_PROGRAM = '[program]\npath = "models/convnet.pte"\n'
NPU4 = '[device.npu0]\nkind = "npu_sim"\ncores = 4\n'  # default links: front -> 0, rear -> 1
LINKS = 'links = { front = 0, rear = 1, left = 2, right = 3 }\n'
SYN = 'source = { kind = "synthetic", fps = 30, shape = [1, 3, 16, 16] }'


def camera(name: str, extra: str = "", source: str = SYN) -> str:
    return f'\n[[camera]]\nname = "{name}"\n{source}\n{extra}\n'


FOUR = "".join(camera(n, 'bind = { camera_link = "npu0" }') for n in ("front", "rear", "left", "right"))
VALID = PROGRAM + NPU4 + LINKS + FOUR


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "models").mkdir()
    for name in ("convnet.pte", "convnet_npu.pte"):
        shutil.copy(MODELS / name, tmp_path / "models" / name)
    return tmp_path


def write(folder: pathlib.Path, text: str, name: str = "config.toml") -> pathlib.Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def check(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    expected = [registries(line) for line in expected]
    path = write(folder, text)
    got = validate_config(path)
    assert got == expected
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert list(ei.value.errors) == expected
    assert all("\n" not in line for line in ei.value.errors)


# -- invalid configs: one case each, exact lines ----------------------------------------------

BATTERY_PARAMS = "parameters: low, high, low_options, normal_options, name, priority"
# Lists that grow when packages (entry points) or other tests register more: expected lines
# name them with a placeholder, filled from the registries when the case runs.
BACKENDS, POLICIES, SIGNAL_SOURCES, FRAME_SOURCES = "<backends>", "<policies>", "<signal sources>", "<frame sources>"


def registries(line: str) -> str:
    return (line.replace(BACKENDS, ", ".join(registered_backends()))
            .replace(POLICIES, ", ".join(policy_names()))
            .replace(SIGNAL_SOURCES, ", ".join(source_names()))
            .replace(FRAME_SOURCES, ", ".join(frame_source_names())))

CASES: list[tuple[str, str, list[str]]] = [
    ("unknown top-level key", "frobnicate = 1\n" + VALID,
     ["frobnicate: unknown key (known keys: program, device, camera, policy, signal, run, batch, cluster)"]),
    ("top-level key with a hint", VALID + "\n[[cameras]]\nname = 'x'\n",
     ["cameras: unknown key (known keys: program, device, camera, policy, signal, run, batch, cluster); did you mean 'camera'?"]),
    ("unknown key in a camera", PROGRAM + NPU4 + camera("front", 'bind = { camera_link = "npu0" }\nqeue = 3'),
     ["camera[0].qeue: unknown key (known keys: name, program, source, pre, bind, backend_options, queue, drop, "
      "deadline_ms, inflight, placement, post, sink, node); did you mean 'queue'?"]),
    ("process placement can't reach an npu_sim core", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }\nplacement = "process"'),
     ['camera[0].placement: "process" can\'t reach npu_sim device \'npu0\': simulated devices live in the orchestra '
      'process; use placement = "thread" for this camera']),
    ("process placement with an npu_sim program", PROGRAM + NPU4 + camera("front", 'placement = "process"'),
     ['camera[0].placement: "process" can\'t reach npu_sim devices: simulated devices live in the orchestra process; '
      'use placement = "thread" for this camera']),
    ("unknown placement", PLAIN_PROGRAM + camera("front", 'placement = "proces"'),
     ["camera[0].placement: 'proces' is not one of auto, thread, process; did you mean 'process'?"]),
    ("unknown key in a source", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "synthetic", fps = 30, sead = 1 }'),
     ["camera[0].source.sead: unknown key (known keys: kind, fps, shape, dtype, seed, count); did you mean 'seed'?"]),
    ("no program", NPU4 + LINKS + FOUR,
     ['program: missing (required): add [program] with path = "model.pte"']),
    ("program file missing", '[program]\npath = "models/x.pte"\n' + NPU4 + LINKS + FOUR,
     ["program.path: models/x.pte: no such file"]),
    ("method missing", PROGRAM + 'method = "fwd"\n' + NPU4 + LINKS + FOUR,
     ["program.method: no method 'fwd' in models/convnet_npu.pte (methods: forward)"]),
    ("wrong type for cores", PROGRAM + NPU4.replace("cores = 4", 'cores = "four"') + LINKS + FOUR,
     ['device.npu0.cores: must be a positive integer, got "four"']),
    ("core_memory unit", PROGRAM + NPU4 + LINKS + 'core_memory = "4XB"\n' + FOUR,
     ['device.npu0.core_memory: must be a size in bytes (an integer >= 0 or a string like "4MiB", units B, KB, MB, '
      'GB, KiB, MiB, GiB), got "4XB"']),
    ("device kind", PROGRAM + '[device.npu0]\nkind = "gpu"\n' + camera("front"),
     ["device.npu0.kind: 'gpu' is not one of npu_sim, cpu"]),
    ("unknown device key", PROGRAM + NPU4 + LINKS + "time_scal = 1.0\n" + FOUR,
     ["device.npu0.time_scal: unknown key (known keys: kind, cores, core_memory, clock_mhz, power_w, macs_per_cycle, "
      "links, time_scale, job_overhead_cycles, exclusive, capacity); did you mean 'time_scale'?"]),
    ("link to a core that doesn't exist", PROGRAM + NPU4 + LINKS.replace("right = 3", "right = 9") + FOUR,
     ["device.npu0.links.right: core 9 does not exist on device npu0 (cores 0-3)"]),
    ("link naming no camera", PROGRAM + NPU4 + LINKS + "".join(camera(n, 'bind = { camera_link = "npu0" }')
                                                        for n in ("front", "rear")),
     ["device.npu0.links.left: no camera named 'left' (cameras: front, rear)",
      "device.npu0.links.right: no camera named 'right' (cameras: front, rear)"]),
    ("core out of range", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 7 }'),
     ["camera[0].bind: core 7 does not exist on device npu0 (cores 0-3)"]),
    ("bind to an unknown device", PROGRAM + NPU4 + camera("front", 'bind = { "npu1.core" = 0 }'),
     ["camera[0].bind.\"npu1.core\": no device named 'npu1' (devices: npu0); did you mean 'npu0'?"]),
    ("camera_link without a link", PROGRAM + NPU4 + camera("top", 'bind = { camera_link = "npu0" }'),
     ["camera[0].bind: device npu0 has no link for camera 'top' (links: front, rear)"]),
    ("unknown binding", PROGRAM + NPU4 + camera("front", 'bind = { gpu = 0 }'),
     ['camera[0].bind.gpu: unknown binding (bind with "<device>.core" = N, "<device>.camera" = "<link>", '
      'camera_link = "<device>", cpu = N or cpu = [N, ...])']),
    ("two cameras on one exclusive core", PROGRAM + NPU4 + LINKS + FOUR + camera("extra", 'bind = { "npu0.core" = 1 }'),
     ["camera[4].bind: npu0.core 1 is already bound to camera 'rear'"]),
    ("shared core over capacity", PROGRAM + NPU4 + "exclusive = false\ncapacity = 1\n"
     + camera("front", 'bind = { "npu0.core" = 0 }') + camera("rear", 'bind = { "npu0.core" = 0 }'),
     ["camera[1].bind: npu0.core 0 is shared by at most 1 camera (capacity); already bound to 'front'"]),
    ("duplicate camera names", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }')
     + camera("front", 'bind = { "npu0.core" = 1 }'),
     ["camera[1].name: duplicate camera name 'front' (also camera[0])"]),
    ("drop policy", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }\ndrop = "drop_latest"'),
     ["camera[0].drop: 'drop_latest' is not one of drop_oldest, drop_newest, block; did you mean 'drop_oldest'?"]),
    ("source shape", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "synthetic", fps = 30, shape = [1, 3, 32, 32] }'),
     ["camera[0].source.shape: [1, 3, 32, 32] does not match input 0 of forward ([1, 3, 16, 16])"]),
    ("source dtype", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "synthetic", fps = 30, dtype = "uint8" }'),
     ["camera[0].source.dtype: uint8 does not match input 0 of forward (float32)"]),
    ("source fps", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "synthetic", fps = 0 }'),
     ["camera[0].source.fps: must be a positive number, got 0"]),
    ("source missing", PROGRAM + NPU4 + '\n[[camera]]\nname = "front"\nbind = { "npu0.core" = 0 }\n',
     ['camera[0].source: missing (required), e.g. source = { kind = "synthetic", fps = 30 }']),
    ("unknown source kind", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "webcam" }'),
     [f"camera[0].source.kind: no source kind 'webcam' (kinds: {FRAME_SOURCES}; or 'module:attr')"]),
    ("frames file missing", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }', 'source = { kind = "file", path = "clips/front.npy", fps = 30 }'),
     ["camera[0].source.path: clips/front.npy: no such file"]),
    ("queue and deadline", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }\nqueue = 0\ndeadline_ms = -5'),
     ["camera[0].queue: must be a positive integer, got 0",
      "camera[0].deadline_ms: must be a positive number, got -5"]),
    ("power_mode choice", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }\nbackend_options = { NpuSimBackend = { power_mode = "turbo" } }'),
     ["camera[0].backend_options.NpuSimBackend.power_mode: must be one of 'low', 'balanced', 'performance'; got 'turbo'"]),
    ("option type", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }\nbackend_options = { NpuSimBackend = { priority = "high" } }'),
     ['camera[0].backend_options.NpuSimBackend.priority: must be an int, got "high"']),
    ("unknown option", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }\nbackend_options = { NpuSimBackend = { power_mdoe = "low" } }'),
     ["camera[0].backend_options.NpuSimBackend.power_mdoe: backend 'NpuSimBackend' has no option 'power_mdoe' "
      "(options: device, core, power_mode, priority, label); did you mean 'power_mode'?"]),
    ("unknown backend", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }\nbackend_options = { Foo = { x = 1 } }'),
     [f"camera[0].backend_options.Foo: no backend named 'Foo' (backends: {BACKENDS})"]),
    ("options for a backend the method doesn't use", PLAIN_PROGRAM + camera(
        "front", 'backend_options = { NpuSimBackend = { power_mode = "low" } }'),
     ["camera[0].backend_options.NpuSimBackend: backend 'NpuSimBackend' is not used by method 'forward' of "
      "models/convnet.pte (it delegates to: no backend)"]),
    ("binding a core for a method without NpuSim delegates", PLAIN_PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }'),
     ["camera[0].bind: binds npu0.core 0 but method 'forward' of models/convnet.pte does not delegate to "
      "NpuSimBackend (it delegates to: no backend)"]),
    ("an option the binding sets", PROGRAM + NPU4 + camera(
        "front", 'bind = { "npu0.core" = 0 }\nbackend_options = { NpuSimBackend = { core = 2 } }'),
     ["camera[0].backend_options.NpuSimBackend.core: 2 conflicts with the binding (core = 0 from bind)"]),
    ("NpuSim method without a device", PROGRAM + camera("front"),
     ['camera[0].bind: method \'forward\' of models/convnet_npu.pte delegates to NpuSimBackend, which needs a '
      'device: bind the camera to a core (e.g. bind = { "npu0.core" = 0 }) or declare [device.npu0] with '
      'kind = "npu_sim"']),
    ("core memory too small", PROGRAM + NPU4 + 'core_memory = "1KiB"\n' + camera("front", 'bind = { "npu0.core" = 0 }'),
     ["camera[0].bind: npu0 core 0 has 1,024 bytes of memory: camera 'front' needs 35,352 (its NpuSimBackend "
      "working set)"]),
    ("cpu binding without a cpu device", PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0, cpu = 0 }'),
     ['camera[0].bind.cpu: no device of kind "cpu" is configured: add [device.cpu] with kind = "cpu"']),
    ("cpu not in the device", PROGRAM + NPU4 + '[device.cpu]\nkind = "cpu"\ncpus = [0, 1]\n'
     + camera("front", 'bind = { "npu0.core" = 0, cpu = 5 }'),
     ["camera[0].bind.cpu: cpu 5 does not exist on device cpu (cpus 0, 1)"]),
    ("several programs, camera names none", '[[program]]\nname = "a"\npath = "models/convnet_npu.pte"\n'
     '[[program]]\nname = "b"\npath = "models/convnet_npu.pte"\n' + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }'),
     ["camera[0]: missing key 'program': there are several programs (a, b)"]),
    ("camera names an unknown program", '[[program]]\nname = "a"\npath = "models/convnet_npu.pte"\n' + NPU4
     + camera("front", 'program = "b"\nbind = { "npu0.core" = 0 }'),
     ["camera[0].program: no program named 'b' (programs: a)"]),
    ("camera is not an array of tables", PROGRAM + NPU4 + '[camera]\nname = "front"\n',
     ["camera: must be an array of tables ([[camera]]), got a table"]),
    ("no cameras", PROGRAM + NPU4,
     ["camera: no cameras: add at least one [[camera]]"]),
    ("unknown policy", VALID + '\n[[policy]]\nuse = "battry"\n',
     [f"policy[0].use: no policy named 'battry' (policies: {POLICIES}; or 'module:attr'); did you mean 'battery'?"]),
    ("policy parameters it doesn't take", VALID + '\n[[policy]]\nuse = "battery"\nparams = { lwo = 20, hgh = 30 }\n',
     [f"policy[0].params.lwo: policy 'battery' has no parameter 'lwo' ({BATTERY_PARAMS})",
      f"policy[0].params.hgh: policy 'battery' has no parameter 'hgh' ({BATTERY_PARAMS}); did you mean 'high'?"]),
    ("policy rejects a value", VALID + '\n[[policy]]\nuse = "battery"\nparams = { low = 30, high = 20 }\n',
     ["policy[0].params.high: policy 'battery': BatteryPolicy: parameter 'high' (20) must be >= 'low' (30)"]),
    ("policy parameter type", VALID + '\n[[policy]]\nuse = "battery"\nparams = { low = "twenty" }\n',
     ["policy[0].params.low: policy 'battery': BatteryPolicy: parameter 'low' must be a number, got str 'twenty'"]),
    ("policy priority twice", VALID + '\n[[policy]]\nuse = "battery"\npriority = 1\nparams = { priority = 2 }\n',
     ["policy[0].priority: also given in params: give it once"]),
    ("policy module:attr", VALID + '\n[[policy]]\nuse = "no_such_module_xyz:Policy"\n',
     ["policy[0].use: policy 'no_such_module_xyz:Policy': can't import module 'no_such_module_xyz': "
      "No module named 'no_such_module_xyz'"]),
    ("policy options table", VALID + '\n[[policy]]\nuse = "battery"\n'
     'params = { low_options = { NpuSimBackend = { power_mode = "turbo" } } }\n',
     ["policy[0].params.low_options.NpuSimBackend.power_mode: must be one of 'low', 'balanced', 'performance'; "
      "got 'turbo'"]),
    ("unknown signal source", VALID + '\n[[signal]]\nuse = "batt"\n',
     [f"signal[0].use: no signal source named 'batt' (signal sources: {SIGNAL_SOURCES}; or 'module:attr'); "
      "did you mean 'battery'?"]),
    ("scripted timeline", VALID + '\n[[signal]]\nuse = "scripted"\nparams = { timeline = [["soon", {}]] }\n',
     ["signal[0].params.timeline: signal source 'scripted': ScriptedSource timeline step 0: time must be a "
      "number >= 0, got 'soon'"]),
    ("scripted timeline missing", VALID + '\n[[signal]]\nuse = "scripted"\n',
     ["signal[0].params: signal source 'scripted' needs parameter 'timeline' (parameters: timeline, clock, name)"]),
    ("run table", VALID + "\n[run]\nduration_s = -1\nspeed = 2\n",
     ["run.speed: unknown key (known keys: duration_s, engine_period_s, poll_interval_s)",
      "run.duration_s: must be a positive number, got -1"]),
    ("a value of the wrong kind for a table", VALID + '\n[[policy]]\nuse = "battery"\nparams = 3\n',
     ["policy[0].params: must be a table, got 3"]),
    ("TOML syntax error", PROGRAM + "\n[[camera]]\nname = \"front\"\nsource = { kind = \"synthetic\", fps = 30 \n",
     ["config.toml:6: Unclosed inline table (column 41)"]),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_config(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    check(folder, text, expected)


def test_there_are_many_distinct_cases() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 25
    assert len({tuple(c[2]) for c in CASES}) == len(CASES)


def test_an_invalid_program_file_gives_the_program_error(folder: pathlib.Path) -> None:
    (folder / "models" / "bad.pte").write_bytes(b"garbage!garbage!garbage!")
    with pytest.raises(ProgramError) as ei:
        load(str(folder / "models" / "bad.pte"))
    reason = str(ei.value).split(": ", 1)[1]  # the ProgramError's message after the file name
    check(folder, '[program]\npath = "models/bad.pte"\n' + camera("front"), [f"program.path: models/bad.pte: {reason}"])


def test_a_frames_file_is_checked_against_the_program(folder: pathlib.Path) -> None:
    (folder / "clips").mkdir()
    np.save(folder / "clips" / "front.npy", np.zeros((4, 1, 3, 8, 8), np.float32))
    np.save(folder / "clips" / "rear.npy", np.zeros((4, 1, 3, 16, 16), np.float32))
    text = PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }',
                                   'source = { kind = "file", path = "clips/front.npy", fps = 30 }')
    check(folder, text, ["camera[0].source.path: clips/front.npy holds frames of [1, 3, 8, 8] does not match "
                         "input 0 of forward ([1, 3, 16, 16])"])
    ok = write(folder, PROGRAM + NPU4 + camera("rear", 'bind = { "npu0.core" = 1 }',
                                               'source = { kind = "file", path = "clips/rear.npy", loop = true }'))
    cfg = load_config(ok)
    src = cfg.cameras[0].source
    assert src.kind == "file" and src.params["path"] == str(folder / "clips" / "rear.npy") and src.params["loop"] is True
    assert cfg.cameras[0].build_source().frame_shape == (1, 3, 16, 16)


def test_file_level_problems(folder: pathlib.Path) -> None:
    assert validate_config(folder / "nope.toml") == ["nope.toml: no such file"]
    assert validate_config(folder) == [f"{folder.name}: is a directory, not a TOML file"]
    (folder / "latin1.toml").write_bytes(b'[program]\npath = "caf\xe9"\n')
    assert validate_config(folder / "latin1.toml") == ["latin1.toml:2: not UTF-8 text (byte 21)"]
    with pytest.raises(ErrorsConfigError) as ei:  # the same class as orchestra.errors.ConfigError
        load_config(folder / "nope.toml")
    assert ei.value.errors == ("nope.toml: no such file",)


# -- all errors at once ---------------------------------------------------------------------


def test_every_problem_is_reported_not_just_the_first(folder: pathlib.Path) -> None:
    text = (PROGRAM + NPU4.replace("cores = 4", 'cores = "four"')
            + camera("front", 'drop = "drop_latest"', 'source = { kind = "synthetic", fps = 30 }')
            + '\n[[policy]]\nuse = "battery"\nparams = { lwo = 20 }\n')
    lines = validate_config(write(folder, text))
    assert lines == [
        'device.npu0.cores: must be a positive integer, got "four"',
        "camera[0].drop: 'drop_latest' is not one of drop_oldest, drop_newest, block; did you mean 'drop_oldest'?",
        f"policy[0].params.lwo: policy 'battery' has no parameter 'lwo' ({BATTERY_PARAMS})",
    ]
    with pytest.raises(ConfigError) as ei:
        load_config(folder / "config.toml")
    assert ei.value.errors == tuple(lines)
    assert ei.value.message.endswith("(and 2 more problems)")
    assert "\n" not in ei.value.message


def test_a_config_full_of_mistakes(folder: pathlib.Path) -> None:
    text = ("oops = 1\n" + '[program]\npath = "models/missing.pte"\nmethod = 3\n'
            + '[device.npu0]\nkind = "npu_sim"\ncores = 0\ntime_scale = -1\nmacs_per_cycle = 1.5\n'
            + camera("a", "queue = \"8\"\ninflight = 0", 'source = { kind = 3 }')
            + camera("a", 'bind = { camera_link = 5 }')
            + '\n[[policy]]\npriority = "high"\n[[signal]]\nparams = []\n[run]\nengine_period_s = "fast"\n')
    lines = validate_config(write(folder, text))
    assert len(lines) == 15, lines
    assert lines[0].startswith("oops: unknown key")
    assert "program.method: must be a non-empty string, got 3" in lines
    assert "device.npu0.cores: must be a positive integer, got 0" in lines
    assert "device.npu0.time_scale: must be a number >= 0, got -1" in lines
    assert "device.npu0.macs_per_cycle: must be a positive integer, got 1.5" in lines
    assert "camera[0].source.kind: must be a non-empty string, got 3" in lines
    assert 'camera[0].queue: must be a positive integer, got "8"' in lines
    assert "camera[1].name: duplicate camera name 'a' (also camera[0])" in lines
    assert "policy[0].use: missing (required)" in lines
    assert 'policy[0].priority: must be an integer, got "high"' in lines
    assert "signal[0].params: must be a table, got []" in lines
    assert 'run.engine_period_s: must be a positive number, got "fast"' in lines


def test_three_problems_three_lines_from_the_cli(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = VALID.replace('"npu_sim"', '"npu_sim"\nspeed = 1') + '\n[[policy]]\nuse = "battry"\n[run]\nduration_s = 0\n'
    path = write(folder, text)
    assert _cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [registries(line) for line in [
        f"{path}: device.npu0.speed: unknown key (known keys: kind, cores, core_memory, clock_mhz, power_w, "
        "macs_per_cycle, links, time_scale, job_overhead_cycles, exclusive, capacity)",
        f"{path}: policy[0].use: no policy named 'battry' (policies: {POLICIES}; or 'module:attr'); "
        "did you mean 'battery'?",
        f"{path}: run.duration_s: must be a positive number, got 0",
    ]]


# -- never a traceback --------------------------------------------------------------------------

WEIRD_VALUES = ['"x"', "-1", "0", "1.5", "inf", "nan", "true", "[]", "[1, [2]]", "{}", '{ a = { b = 1 } }',
                "1979-05-27T07:32:00Z", '""']
KEYS = ["program.path", "program.method", "program.name", "device.npu0.cores", "device.npu0.core_memory",
        "device.npu0.links", "device.npu0.clock_mhz", "device.npu0.exclusive", "device.npu0.capacity",
        "camera.name", "camera.source", "camera.bind", "camera.backend_options", "camera.queue", "camera.drop",
        "camera.deadline_ms", "camera.program", "policy.use", "policy.params", "policy.priority",
        "signal.use", "signal.params", "run.duration_s"]


def _mutated(key: str, value: str) -> str:
    section, _, field = key.rpartition(".")
    base = {
        "program": '[program]\npath = "models/convnet_npu.pte"\nmethod = "forward"\nname = "p"\n',
        "device.npu0": '[device.npu0]\nkind = "npu_sim"\ncores = 2\ncore_memory = "1MiB"\nlinks = { a = 0 }\n'
                       'clock_mhz = { low = 100, balanced = 500, performance = 1000 }\nexclusive = false\ncapacity = 1\n',
        "camera": '[[camera]]\nname = "a"\nsource = { kind = "synthetic", fps = 5 }\nbind = { camera_link = "npu0" }\n'
                  'backend_options = {}\nqueue = 1\ndrop = "block"\ndeadline_ms = 1\nprogram = "p"\n',
        "policy": '[[policy]]\nuse = "battery"\nparams = {}\npriority = 1\n',
        "signal": '[[signal]]\nuse = "cpu"\nparams = {}\n',
        "run": "[run]\nduration_s = 1\n",
    }
    out = []
    for sec, text in base.items():
        if sec == section:
            lines = [ln for ln in text.splitlines() if not ln.startswith(f"{field} =")]
            lines.append(f"{field} = {value}")
            text = "\n".join(lines) + "\n"
        out.append(text)
    return "\n".join(out)


def test_wrong_values_anywhere_never_raise(folder: pathlib.Path) -> None:
    for key in KEYS:
        for value in WEIRD_VALUES:
            path = write(folder, _mutated(key, value))
            lines = validate_config(path)  # must not raise
            assert all(isinstance(x, str) and x and "\n" not in x for x in lines), (key, value, lines)
            assert not any("internal error" in x for x in lines), (key, value, lines)
            try:
                load_config(path)
            except ConfigError as exc:
                assert list(exc.errors) == lines
            else:
                assert lines == []


def test_the_cli_never_prints_a_traceback(folder: pathlib.Path) -> None:
    path = write(folder, _mutated("camera.bind", '{ "npu0.core" = [1] }') + "\n[[policy]]\nuse = 'os:getcwd'\n")
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-m", "orchestra", "validate", str(path)], capture_output=True, text=True,
                       encoding="utf-8", env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith(f"{path}: ") for line in lines)
    assert f"{path}: camera[0].bind.\"npu0.core\": must be a core number (an integer >= 0), got [1]" in lines
    assert any(line.startswith(f"{path}: policy[1].use: policy 'os:getcwd'") for line in lines)


def test_cli_syntax_error_points_at_the_line(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(folder, '[program]\npath = "models/convnet_npu.pte"\n\n[[camera]]\nname = front\n')
    assert _cli.main(["validate", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err == f"{path}:5: Invalid value (column 8)\n"
    assert validate_config(path) == ["config.toml:5: Invalid value (column 8)"]
    assert _cli.main(["validate", str(folder / "none.toml")]) == 2
    assert capsys.readouterr().err == f"{folder / 'none.toml'}: no such file\n"


# -- valid configs ----------------------------------------------------------------------------


def test_cli_ok_line(folder: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(folder, VALID + '\n[[policy]]\nuse = "battery"\n[[signal]]\nuse = "battery"\n')
    assert _cli.main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"{path}: ok (4 cameras, 1 policy)\n", "")


@pytest.mark.parametrize("name, summary", [("cameras.toml", "4 cameras, 1 policy"),
                                           ("onnx_camera.toml", "1 camera, 1 policy"),
                                           ("cpu_cameras.toml", "2 cameras, 0 policies")])
def test_the_examples_validate(name: str, summary: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "onnx_camera.toml":
        pytest.importorskip("onnxruntime")
    path = EXAMPLES / name
    assert validate_config(path) == []
    assert _cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok ({summary})\n"


def test_the_main_example_in_a_subprocess() -> None:
    r = subprocess.run([sys.executable, "-m", "orchestra", "validate", "examples/cameras.toml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "examples/cameras.toml: ok (4 cameras, 1 policy)\n", "")


def test_the_main_example_loads(tmp_path: pathlib.Path) -> None:
    cfg = load_config(EXAMPLES / "cameras.toml")
    assert isinstance(cfg, Config)
    assert cfg.path == (EXAMPLES / "cameras.toml").resolve()
    (prog,) = cfg.programs
    assert (prog.name, prog.path, prog.method) == ("convnet", (MODELS / "convnet_npu.pte").resolve(), "forward")
    assert prog.path.is_absolute() and prog.path.exists()
    (npu,) = cfg.devices
    assert (npu.name, npu.kind, npu.exclusive) == ("npu0", "npu_sim", True)
    assert dict(npu.params["links"]) == {"front": 0, "rear": 1, "left": 2, "right": 3}
    assert npu.params["cores"] == 4 and npu.params["core_memory"] == 4 << 20 and npu.params["time_scale"] == 1.0
    assert [c.name for c in cfg.cameras] == ["front", "rear", "left", "right"]
    assert [c.core for c in cfg.cameras] == [("npu0", 0), ("npu0", 1), ("npu0", 2), ("npu0", 3)]
    front = cfg.cameras[0]
    assert dict(front.bind) == {"npu0.camera": "front"} and dict(cfg.cameras[2].bind) == {"npu0.core": 2}
    assert front.source.kind == "synthetic"
    assert dict(front.source.params) == {"fps": 30.0, "shape": (1, 3, 16, 16), "dtype": "float32", "seed": 1}
    assert front.deadline_s == pytest.approx(0.2) and front.drop == "drop_oldest" and front.queue == 8
    assert [p.use for p in cfg.policies] == ["battery"]
    assert cfg.policies[0].params["priority"] == 80
    assert [s.use for s in cfg.signals] == ["scripted"]
    assert (cfg.run.duration_s, cfg.run.engine_period_s) == (5.0, 0.5)
    # the scripted battery falls below the battery policy's low threshold mid-run
    timeline = cfg.signals[0].params["timeline"]
    low = cfg.policies[0].params["low"]
    drop_at = [t for t, values in timeline if values.get("battery.percent", 100) < low]
    assert drop_at and 0 < drop_at[0] < cfg.run.duration_s


def test_a_valid_config_resolves_relative_paths_and_fills_defaults(folder: pathlib.Path) -> None:
    sub = folder / "conf"
    sub.mkdir()
    (folder / "clips").mkdir()
    np.save(folder / "clips" / "c.npy", np.zeros((2, 1, 3, 16, 16), np.float32))
    text = ('[program]\npath = "../models/convnet_npu.pte"\n'
            '[device.npu0]\nkind = "npu_sim"\ncores = 2\ncore_memory = ["64KiB", 65536]\n'
            '[device.cpu]\nkind = "cpu"\ncpus = [0]\nexclusive = false\n'
            + camera("front", 'bind = { camera_link = "npu0", cpu = 0 }',
                     'source = { kind = "synthetic", fps = 10 }')
            + camera("rear", 'bind = { "npu0.camera" = "rear", cpu = [0] }\ninflight = 2',
                     'source = { kind = "file", path = "../clips/c.npy" }'))
    cfg = load_config(write(sub, text))
    assert cfg.program().path == (folder / "models" / "convnet_npu.pte").resolve()
    npu, cpu = cfg.devices
    assert npu.params["core_memory"] == (65536, 65536)
    assert dict(npu.params["links"]) == {"front": 0, "rear": 1}  # NpuDevice's default wiring
    assert (cpu.kind, cpu.params["cpus"], cpu.exclusive) == ("cpu", (0,), False)
    front, rear = cfg.cameras
    assert front.program == "convnet_npu"  # a single program is named after its file
    assert dict(front.source.params) == {"fps": 10.0, "shape": (1, 3, 16, 16), "dtype": "float32", "seed": 0}
    assert (front.queue, front.drop, front.deadline_s, front.inflight) == (8, "drop_oldest", None, 1)
    assert dict(front.bind) == {"npu0.camera": "front", "cpu": 0}
    assert dict(rear.bind) == {"npu0.camera": "rear", "cpu": (0,)} and rear.inflight == 2
    assert rear.source.params["path"] == str((folder / "clips" / "c.npy").resolve())
    assert cfg.run.duration_s is None and cfg.run.engine_period_s == 1.0
    with pytest.raises(AttributeError):
        front.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        front.bind["cpu"] = 1  # type: ignore[index]


def test_the_config_builds_what_it_describes(folder: pathlib.Path) -> None:
    from orchestra.backends.npu_sim import NpuDevice
    from orchestra.orchestrator import InstanceSpec, NpuSimResource
    from orchestra.policies import BatteryPolicy, ScriptedSource

    cfg = load_config(EXAMPLES / "cameras.toml")
    battery = cfg.policies[0].build()
    assert isinstance(battery, BatteryPolicy) and battery.priority == 80 and (battery.low, battery.high) == (20, 30)
    script = cfg.signals[0].build()
    assert isinstance(script, ScriptedSource) and [t for t, _ in script.timeline] == [0.0, 2.5]
    spec = cfg.cameras[1].instance_spec()
    assert isinstance(spec, InstanceSpec) and spec.name == "rear" and dict(spec.bind) == {"npu0.camera": "rear"}
    assert dict(spec.backend_options["NpuSimBackend"]) == {"power_mode": "balanced"}
    src = cfg.cameras[0].build_source()
    assert src.name == "front" and src.shape == (1, 3, 16, 16) and src.fps == 30
    npu = cfg.devices[0].build_npu_device()
    try:
        assert isinstance(npu, NpuDevice) and npu.cores == 4 and npu.core_for_link("right") == 3
        assert isinstance(cfg.devices[0].build_resource(npu), NpuSimResource)
    finally:
        npu.close()
    assert isinstance(cfg.cameras[0], CameraConfig) and isinstance(cfg.policies[0], PolicyConfig)
    assert isinstance(cfg.signals[0], SignalConfig) and isinstance(cfg.policies[0].params, Mapping)


def test_make_models_reproduces_the_committed_program() -> None:
    spec = importlib.util.spec_from_file_location("make_models", EXAMPLES / "make_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.convnet_npu() == (MODELS / "convnet_npu.pte").read_bytes()
    if importlib.util.find_spec("onnx") is not None:
        assert mod.tiny_onnx() == (MODELS / "tiny.onnx").read_bytes()


def test_placement_is_written_or_auto_and_reaches_the_instance_spec(folder: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (PLAIN_PROGRAM + camera("a", 'placement = "process"') + camera("b", 'placement = "thread"') + camera("c"))
    cfg = load_config(write(folder, text))
    assert [(c.placement, c.auto_placement) for c in cfg.cameras] == [("process", False), ("thread", False),
                                                                       ("process" if _cameras._usable_cpus() > 1 else "thread", True)]
    assert [c.instance_spec().placement for c in cfg.cameras] == [c.placement for c in cfg.cameras]
    # "auto" (the default): a CPU program goes to a worker process when there is more than one CPU
    # to use (threads of one process share about one core), a thread on one CPU
    monkeypatch.setattr(_cameras, "_usable_cpus", lambda: 2)
    assert load_config(write(folder, PLAIN_PROGRAM + camera("c"))).cameras[0].placement == "process"
    monkeypatch.setattr(_cameras, "_usable_cpus", lambda: 1)
    assert load_config(write(folder, PLAIN_PROGRAM + camera("c"))).cameras[0].placement == "thread"
    # ... and a camera on an NPU core, or a program delegating to npu_sim, stays on a thread
    monkeypatch.setattr(_cameras, "_usable_cpus", lambda: 8)
    cfg = load_config(write(folder, PROGRAM + NPU4 + camera("front", 'bind = { "npu0.core" = 0 }') + camera("rear")))
    assert [(c.placement, c.auto_placement) for c in cfg.cameras] == [("thread", True), ("thread", True)]


# -- audit regressions: a config can't run code, exhaust memory, block, or hide its failure ----


def test_validate_never_calls_a_function_named_by_module_attr(folder: pathlib.Path) -> None:
    """``use = "os:system"`` with a command must not run it (validate builds policies and
    signal sources to check their parameters: only classes implementing the protocol)."""
    marker = folder / "ran"
    touch = f'params = {{ command = "touch {marker}" }}'
    for section in ("policy", "signal"):
        path = write(folder, VALID + f'\n[[{section}]]\nuse = "os:system"\n{touch}\n')
        kind = "policy" if section == "policy" else "signal source"
        assert validate_config(path) == [f"{section}[0].use: {kind} 'os:system' is <built-in function system>, not a "
                                         f"class: 'module:attr' must name a {kind} class (one with "
                                         f"{'propose' if section == 'policy' else 'read'}()) or a built {kind} "
                                         f"object; other callables are never called"]
        assert _cli.main(["validate", str(path)]) == 2
    path = write(folder, PLAIN_PROGRAM + camera("front", source=f'source = {{ kind = "os:system", command = "touch {marker}" }}'))
    assert validate_config(path) == ["camera[0].source.kind: source 'os:system' is <built-in function system>, not a "
                                     "class: 'module:attr' must name a source class (one with frames()); other "
                                     "callables are never called"]
    assert not marker.exists()


@pytest.mark.parametrize("raise_", ["SystemExit(0)", "KeyboardInterrupt()"])
def test_a_module_that_exits_at_import_is_a_config_error(folder: pathlib.Path, raise_: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "orchestra_exits_at_import.py").write_text(f"raise {raise_}\n")
    monkeypatch.syspath_prepend(str(folder))
    name = raise_.split("(")[0]
    for extra, where in (('\n[[policy]]\nuse = "orchestra_exits_at_import:P"\n', "policy[0].use"),
                         ('\n[[signal]]\nuse = "orchestra_exits_at_import:S"\n', "signal[0].use")):
        (line,) = validate_config(write(folder, VALID + extra))
        assert line.startswith(f"{where}: ") and name in line, line
    (line,) = validate_config(write(folder, PLAIN_PROGRAM + camera(
        "front", source='source = { kind = "orchestra_exits_at_import:Cam" }')))
    assert line.startswith("camera[0].source.kind: source 'orchestra_exits_at_import:Cam' can't be imported: "
                           f"{name}"), line
    # the command: not "valid" (exit 0, nothing printed) nor 130, but the config error
    path = write(folder, VALID + '\n[[policy]]\nuse = "orchestra_exits_at_import:P"\n')
    r = subprocess.run([sys.executable, "-m", "orchestra", "validate", str(path)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(folder)), timeout=120)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith(f"{path}: policy[0].use: ") and name in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a=", "}")])
def test_deeply_nested_toml_is_one_line(folder: pathlib.Path, opener: str, closer: str) -> None:
    for depth in (40, 600, 5000):
        inner = "1" if opener == "{a=" else ""
        path = write(folder, "x = " + opener * depth + inner + closer * depth + "\n")
        (line,) = validate_config(path)
        assert line.startswith("config.toml: tables or arrays nested") and "ConfigLimits.max_depth" in line
        with pytest.raises(ConfigError):
            load_config(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_not_read(folder: pathlib.Path) -> None:
    os.mkfifo(folder / "models" / "pipe.pte")
    path = write(folder, '[program]\npath = "models/pipe.pte"\n' + camera("front"))
    assert validate_config(path) == ["program.path: models/pipe.pte: not a regular file"]
    os.mkfifo(folder / "pipe.toml")
    assert validate_config(folder / "pipe.toml") == ["pipe.toml: not a regular file"]


def test_sizes_and_rates_are_bounded(folder: pathlib.Path) -> None:
    plain = PLAIN_PROGRAM + camera("front", "queue = 10000000000\ninflight = 100000000",
                                   'source = { kind = "synthetic", fps = 1e308 }')
    check(folder, plain, ["camera[0].source.fps: 1e+308 is more than 10000 (ConfigLimits.max_fps)",
                          "camera[0].queue: 10000000000 is more than 4096 (ConfigLimits.max_queue)",
                          "camera[0].inflight: 100000000 is more than 64 (ConfigLimits.max_inflight)"])
    check(folder, PROGRAM + '[device.npu0]\nkind = "npu_sim"\ncores = 100000000\n' + camera("front", 'bind = { "npu0.core" = 0 }'),
          ["device.npu0.cores: 100000000 is more than 256 (ConfigLimits.max_npu_cores)"])
    # the limits are the caller's to raise
    from orchestra.config import ConfigLimits

    path = write(folder, PLAIN_PROGRAM + camera("front", "queue = 5000", 'source = { kind = "synthetic", fps = 20000 }'))
    assert validate_config(path, limits=ConfigLimits(max_fps=1e5, max_queue=10_000)) == []


def test_a_queue_holding_many_seconds_of_frames_is_a_warning(folder: pathlib.Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write(folder, PLAIN_PROGRAM + camera("front", "queue = 600"))  # 600 frames at 30 fps: 20 s
    assert validate_config(path) == []
    assert load_config(path).warnings == ("camera[0].queue: holds 20 s of frames at 30 fps (more than 5 s: stale "
                                          "frames and memory); a smaller queue keeps results fresh",)
    assert _cli.main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok (1 camera, 0 policies)\n"
    assert err == f"{path}: warning: camera[0].queue: holds 20 s of frames at 30 fps (more than 5 s: stale frames " \
                  "and memory); a smaller queue keeps results fresh\n"
    assert load_config(write(folder, PLAIN_PROGRAM + camera("front", "queue = 100"))).warnings == ()


@pytest.mark.parametrize("name, shown", [("a\\u0000b", '"a\\u0000b"'), ("a\\nb", '"a\\nb"'),
                                         ("\\u001b[2Jx", '"\\u001b[2Jx"')])
def test_camera_names_are_printable(folder: pathlib.Path, name: str, shown: str) -> None:
    check(folder, PLAIN_PROGRAM + f'\n[[camera]]\nname = "{name}"\n{SYN}\n',
          [f"camera[0].name: {shown} holds control characters (newlines, escapes, NUL, ...): use printable characters"])
