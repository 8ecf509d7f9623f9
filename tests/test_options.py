"""Runtime-derived backend arguments: the RFC's five goals, per Method instance."""

from __future__ import annotations

import ast
import itertools
import pathlib
import threading

import numpy as np
import pytest

from orchestra import InvalidArgumentError
from orchestra.aot import (
    BackendDetails,
    CompileSpec,
    PreprocessResult,
    ProgramBuilder,
    aot_backends,
    register_aot_backend,
)
from orchestra.program import ProgramDef
from orchestra.runtime import (
    Backend,
    BackendInterface,
    OptionSpec,
    load_program,
    register_backend,
    registered_backends,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
_ids = itertools.count()


class Recorder(BackendInterface):
    """A real backend that adds its blob's float to its input and records what it saw.

    Each handle is a dict; init and every execute append the runtime specs they observed.
    """

    def __init__(self) -> None:
        self.handles: list[dict] = []  # every handle ever made, in order

    def init(self, context, processed, compile_specs):
        h = {"id": next(_ids), "add": float(np.frombuffer(processed, np.float32)[0]),
             "init": dict(context.runtime_specs), "executes": [], "destroyed": 0,
             "thread": threading.get_ident(), "delegate": context.delegate_index}
        self.handles.append(h)
        return h

    def execute(self, context, handle, args):
        handle["executes"].append(dict(context.runtime_specs))
        np.add(args[0], handle["add"], out=args[1])

    def destroy(self, handle) -> None:
        handle["destroyed"] += 1


class BackendA(Recorder):
    option_specs = (
        OptionSpec("threads", int, 1, hot=True, doc="worker threads"),
        OptionSpec("mode", str, "fast", choices=("fast", "exact"), doc="init-only"),
    )


class BackendB(Recorder):
    option_specs = (
        OptionSpec("core", int, 0, doc="init-only: the core"),
        OptionSpec("gain", float, 1.0, hot=True),
        OptionSpec("gain_check", float, 1.0, hot=True, doc="must always equal gain"),
    )


class Plain(Recorder):
    """Declares nothing: accepts nothing."""


A, B, P = BackendA(), BackendB(), Plain()
for _name, _b in (("RfcA", A), ("RfcB", B), ("RfcPlain", P)):
    if _name not in registered_backends():
        register_backend(Backend(_name, _b))


class AddDetails(BackendDetails):
    """AOT side of the test backends: the blob is the float the subgraph adds."""

    @staticmethod
    def preprocess(program, compile_specs):
        specs = {c.key: c.value for c in compile_specs}
        return PreprocessResult(np.float32(float(specs["add"].decode())).tobytes())


for _name in ("RfcA", "RfcB", "RfcPlain"):
    if _name not in aot_backends():
        register_aot_backend(_name, AddDetails)


def _adder(k: float) -> ProgramBuilder:
    sub = ProgramBuilder()
    f = sub.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), k))
    return sub


def two_backend_program(first="RfcA", second="RfcB") -> ProgramDef:
    """forward(x) = delegate_second(delegate_first(x)): adds 1 then 10, built with ProgramBuilder."""
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (4,))
    (y,) = f.delegate(first, _adder(1), [x], compile_specs=[CompileSpec("add", b"1")])
    (z,) = f.delegate(second, _adder(10), [y], compile_specs=[CompileSpec("add", b"10")])
    f.output(z)
    return b.build()


X = np.arange(4, dtype=np.float32)


def _handle_of(method, backend):
    return next(h for b, h in method._handles if b is backend)


def test_rfc_matrix_four_independent_option_sets() -> None:
    prog = load_program(two_backend_program())
    sets = {
        "1-A": {"threads": 2, "mode": "exact"}, "1-B": {"core": 1, "gain": 0.5},
        "2-A": {"threads": 3}, "2-B": {"core": 2},
    }
    m1 = prog.load_method(backend_options={"RfcA": sets["1-A"], "RfcB": sets["1-B"]})
    m2 = prog.load_method(backend_options={"RfcA": sets["2-A"], "RfcB": sets["2-B"]})
    seen = {
        "1-A": _handle_of(m1, A), "1-B": _handle_of(m1, B), "2-A": _handle_of(m2, A), "2-B": _handle_of(m2, B),
    }
    want = {
        "1-A": {"threads": 2, "mode": "exact"}, "1-B": {"core": 1, "gain": 0.5, "gain_check": 1.0},
        "2-A": {"threads": 3, "mode": "fast"}, "2-B": {"core": 2, "gain": 1.0, "gain_check": 1.0},
    }
    for _ in range(3):
        np.testing.assert_array_equal(m1.execute([X])[0], X + 11)
        np.testing.assert_array_equal(m2.execute([X])[0], X + 11)
    for key, h in seen.items():
        assert h["init"] == want[key], key
        assert h["executes"] == [want[key]] * 3, key
    assert len({id(h) for h in seen.values()}) == 4
    assert m1.options()["RfcB"] == want["1-B"]


def test_hot_change_takes_effect_at_the_next_execute_of_that_instance_only() -> None:
    prog = load_program(two_backend_program())
    m1, m2 = prog.load_method(), prog.load_method()
    m1.execute([X])
    m1.set_options({"RfcA": {"threads": 4}})
    assert m1.options()["RfcA"]["threads"] == 1  # not yet: between executes
    m1.execute([X])
    m2.execute([X])
    assert _handle_of(m1, A)["executes"] == [{"threads": 1, "mode": "fast"}, {"threads": 4, "mode": "fast"}]
    assert _handle_of(m2, A)["executes"] == [{"threads": 1, "mode": "fast"}]
    assert m1.options()["RfcA"]["threads"] == 4


def test_per_call_override_is_for_that_call_only() -> None:
    m = load_program(two_backend_program()).load_method(backend_options={"RfcB": {"gain": 2.0}})
    m.execute([X], backend_options={"RfcB": {"gain": 3.0, "gain_check": 3.0}})
    m.execute([X])
    got = [e["gain"] for e in _handle_of(m, B)["executes"]]
    assert got == [3.0, 2.0]


def test_init_only_change_reinitialises_build_swap_destroy() -> None:
    m = load_program(two_backend_program()).load_method()
    m.execute([X])
    old_b, old_a = _handle_of(m, B), _handle_of(m, A)
    m.set_options({"RfcB": {"core": 3}})
    assert old_b["destroyed"] == 0  # nothing happens until the next execute
    np.testing.assert_array_equal(m.execute([X])[0], X + 11)
    new_b = _handle_of(m, B)
    assert new_b is not old_b and new_b["init"]["core"] == 3
    assert old_b["destroyed"] == 1 and new_b["destroyed"] == 0
    assert len(old_b["executes"]) == 1 and len(new_b["executes"]) == 1  # none lost, none doubled
    assert _handle_of(m, A) is old_a  # the other backend's delegate is untouched
    assert m.statistics().reinits == 1
    m.close()
    assert new_b["destroyed"] == 1 and old_b["destroyed"] == 1 and old_a["destroyed"] == 1


def test_prepare_builds_handles_ahead_on_the_calling_thread() -> None:
    m = load_program(two_backend_program()).load_method()
    m.execute([X])
    made = []
    t = threading.Thread(target=lambda: (m.prepare_backend_options("RfcA", {"mode": "exact"}), made.append(A.handles[-1])))
    t.start()
    t.join()
    prepared = made[0]
    assert prepared["init"]["mode"] == "exact" and prepared["thread"] == t.ident
    n = len(A.handles)
    m.execute([X])
    assert len(A.handles) == n  # the swap built nothing: it used the prepared handle
    assert _handle_of(m, A) is prepared and len(prepared["executes"]) == 1


def test_superseded_preparation_is_destroyed_exactly_once() -> None:
    m = load_program(two_backend_program()).load_method()
    m.prepare_backend_options("RfcA", {"mode": "exact"})
    first = A.handles[-1]
    m.prepare_backend_options("RfcA", {"mode": "fast"})  # back to what is in force: nothing to build
    assert first["destroyed"] == 1
    m.execute([X])
    assert first["destroyed"] == 1 and len(first["executes"]) == 0
    m.prepare_backend_options("RfcA", {"mode": "exact"})
    kept = A.handles[-1]
    m.set_options({"RfcA": {"threads": 7}})  # a hot change keeps the prepared handle
    m.execute([X])
    assert _handle_of(m, A) is kept and kept["executes"][-1] == {"threads": 7, "mode": "exact"}
    m.prepare_backend_options("RfcA", {"mode": "fast"})
    unused = A.handles[-1]
    m.close()  # a preparation never swapped in is destroyed on close
    assert unused["destroyed"] == 1 and kept["destroyed"] == 1


def test_concurrent_executes_see_one_consistent_snapshot_each() -> None:
    """Two instances execute 10,000 times each on two threads while a third keeps changing
    their options; 'gain' and 'gain_check' always change together."""
    prog = load_program(two_backend_program())
    ms = [prog.load_method(), prog.load_method()]
    N = 10_000
    stop = threading.Event()
    published: list[list[tuple[int, float]]] = [[], []]  # (executions completed after publishing, value)
    errors: list[BaseException] = []

    def run(m):
        try:
            for _ in range(N):
                m.execute([X])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def control():
        k = 0
        while not stop.is_set():
            i = k % 2
            value = float(k + 1) * (1 if i == 0 else -1)  # instance 0 positive, 1 negative
            ms[i].set_options({"RfcB": {"gain": value, "gain_check": value}})
            # Read after publishing: the execute in flight may predate the change; the one
            # after it can only start after this read, so it must see the change.
            published[i].append((ms[i].statistics().executions, value))
            k += 1

    workers = [threading.Thread(target=run, args=(m,)) for m in ms]
    ctl = threading.Thread(target=control)
    ctl.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    ctl.join()
    assert not errors, errors
    for i, m in enumerate(ms):
        seen = [e for h in B.handles if h in [hh for _, hh in m._handles] for e in h["executes"]]
        assert len(seen) == N
        gains = [e["gain"] for e in seen]
        assert all(e["gain"] == e["gain_check"] for e in seen), "an execute saw a torn snapshot"
        other_sign = -1 if i == 0 else 1
        assert not any(g * other_sign > 0 for g in gains if g != 1.0), "a change leaked to the other instance"
        # Each change took effect no later than the execute after the one in flight.
        magnitude = [abs(g) for g in gains]
        assert magnitude == sorted(magnitude), "values went backwards"
        for done, value in published[i]:
            if done + 1 < N:
                assert magnitude[done + 1] >= abs(value), (done, value)


def test_rejections_name_the_bad_thing() -> None:
    prog = load_program(two_backend_program())
    m = prog.load_method()
    cases = [
        (lambda: m.set_options({"Xnn": {}}), r"backend 'Xnn' is not used by this method \(it delegates to: RfcA, RfcB\)"),
        (lambda: m.set_options({"RfcA": {"thread": 2}}), r"backend 'RfcA' has no option 'thread' \(options: threads, mode\)"),
        (lambda: m.set_options({"RfcA": {"threads": "2"}}), r"backend 'RfcA' option 'threads' must be int, got str '2'"),
        (lambda: m.set_options({"RfcA": {"threads": True}}), r"option 'threads' must be int, got bool True"),
        (lambda: m.set_options({"RfcA": {"mode": "slow"}}), r"option 'mode' must be one of 'fast', 'exact'; got 'slow'"),
        (lambda: m.execute([X], backend_options={"RfcB": {"core": 1}}), r"backend 'RfcB' option 'core' is init-only and can't be overridden per call \(hot options: gain, gain_check\)"),
        (lambda: prog.load_method(backend_options={"RfcC": {}}), r"backend 'RfcC' is not used by this method"),
        (lambda: prog.load_method(backend_options={"RfcB": {"gain": "x"}}), r"option 'gain' must be float, got str 'x'"),
    ]
    for fn, pattern in cases:
        with pytest.raises(InvalidArgumentError, match=pattern):
            fn()
    # Nothing was applied by any rejected call.
    m.execute([X])
    assert m.options()["RfcA"] == {"threads": 1, "mode": "fast"}
    assert m.options()["RfcB"] == {"core": 0, "gain": 1.0, "gain_check": 1.0}


def test_backend_declaring_nothing_accepts_nothing() -> None:
    m = load_program(two_backend_program("RfcPlain", "RfcB")).load_method()
    m.execute([X])
    assert _handle_of(m, P)["init"] == {} and _handle_of(m, P)["executes"] == [{}]
    with pytest.raises(InvalidArgumentError, match=r"backend 'RfcPlain' has no option 'x' \(options: none\)"):
        m.set_options({"RfcPlain": {"x": 1}})


def test_bad_declarations_are_rejected_at_registration() -> None:
    class Dup(Recorder):
        option_specs = (OptionSpec("a", int, 0), OptionSpec("a", int, 1))

    class WrongDefault(Recorder):
        option_specs = (OptionSpec("a", int, "zero"),)

    with pytest.raises(InvalidArgumentError, match="declares option 'a' twice"):
        register_backend(Backend("RfcDup", Dup()))
    with pytest.raises(InvalidArgumentError, match="option 'a' must be int, got str 'zero'"):
        register_backend(Backend("RfcWrong", WrongDefault()))


def _options_path_modules() -> list[pathlib.Path]:
    files = sorted((ROOT / "orchestra" / "runtime").glob("*.py"))
    files += [p for p in (ROOT / "backends").rglob("*.py") if "test" not in p.parts]
    return files


def test_no_module_or_class_mutable_state_thread_locals_or_locks_on_the_options_path() -> None:
    """The RFC's constraints by construction: options live in the Method only."""
    mutable_calls = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque"}
    registries = {"_REGISTRY", "_DISCOVERED"}  # filled at import/discovery time (DESIGN)
    problems = []
    for path in _options_path_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("local", "Lock", "RLock", "Condition", "Semaphore"):
                problems.append(f"{path.name}:{node.lineno}: uses {ast.unparse(node)}")
            if isinstance(node, ast.Name) and node.id in ("Lock", "RLock", "local"):
                problems.append(f"{path.name}:{node.lineno}: uses {node.id}")
        scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for scope in scopes:
            for stmt in scope.body:
                targets, value = [], None
                if isinstance(stmt, ast.Assign):
                    targets, value = stmt.targets, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    targets, value = [stmt.target], stmt.value
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if not names or set(names) <= registries or names in (["__slots__"], ["__all__"]):
                    continue
                mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in mutable_calls)
                if mutable:
                    where = "module" if scope is tree else f"class {scope.name}"
                    problems.append(f"{path.name}:{stmt.lineno}: {where}-level mutable {', '.join(names)}")
    assert not problems, "\n".join(problems)
