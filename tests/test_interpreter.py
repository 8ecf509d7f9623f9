"""The interpreter on hand-built programs: control flow, moves, aliasing, delegates, failures."""

from __future__ import annotations

import numpy as np
import pytest

from orchestra import BackendError, Error, OrchestraError
from orchestra.errors import InvalidArgumentError
from orchestra.program import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    Chain,
    CompileSpec,
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    FreeCall,
    Instruction,
    Int,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Operator,
    ProgramDef,
    ScalarType,
    Tensor,
    dumps,
)
from orchestra.runtime import (
    Backend,
    BackendInterface,
    Runtime,
    Session,
    load_program,
    register_backend,
)


def f32(shape: tuple[int, ...], offset: int | None = None) -> EValue:
    alloc = None if offset is None else AllocationDetails(1, offset)
    return EValue(Tensor(ScalarType.FLOAT, 0, shape, tuple(range(len(shape))), allocation_info=alloc))


def kernel(op: int, *args: int) -> Instruction:
    return Instruction(KernelCall(op, args))


def program(values, inputs, outputs, instructions, operators=(), delegates=(), inline=(), arena=256) -> ProgramDef:
    plan = ExecutionPlan(
        name="forward", container_meta_type=None, values=tuple(values), inputs=tuple(inputs),
        outputs=tuple(outputs), chains=(Chain(tuple(inputs), tuple(outputs), tuple(instructions)),),
        operators=tuple(Operator(*o.split(".")) for o in operators), delegates=tuple(delegates),
        non_const_buffer_sizes=(0, arena),
    )
    return ProgramDef(version=0, execution_plan=(plan,),
                      backend_delegate_data=tuple(BackendDelegateInlineData(memoryview(b)) for b in inline))


def branchy() -> ProgramDef:
    """y = relu(x) if cond else neg(x); z = move(y)."""
    values = [
        f32((4,), 0),  # 0 x
        EValue(Bool(False)),  # 1 cond (an input)
        f32((4,), 16),  # 2 y
        EValue(Bool(False)),  # 3 constant False: an unconditional jump
        f32((4,), 32),  # 4 z
    ]
    ins = [
        Instruction(JumpFalseCall(1, 3)),
        kernel(0, 0, 2, 2),  # relu.out(x, out=y) -> y
        Instruction(JumpFalseCall(3, 4)),
        kernel(1, 0, 2, 2),  # neg.out(x, out=y) -> y
        Instruction(MoveCall(2, 4)),
        Instruction(FreeCall(2)),
    ]
    return program(values, [0, 1], [4], ins, operators=["aten::relu.out", "aten::neg.out"])


def test_jump_false_takes_each_branch_and_move_copies() -> None:
    m = load_program(dumps(branchy())).load_method()  # also proves the writer/reader round trip
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    np.testing.assert_array_equal(m.execute([x, True])[0], np.maximum(x, 0))
    np.testing.assert_array_equal(m.execute([x, False])[0], -x)
    np.testing.assert_array_equal(m.execute([x, True])[0], np.maximum(x, 0))


def test_non_tensor_input_is_type_checked() -> None:
    m = load_program(branchy()).load_method()
    with pytest.raises(OrchestraError, match="input 1: expected bool, got int"):
        m.execute([np.zeros(4, np.float32), 1])


def test_a_loop_that_never_ends_hits_the_instruction_cap() -> None:
    values = [f32((2,), 0), EValue(Bool(False))]
    prog = program(values, [0], [0], [Instruction(JumpFalseCall(1, 0))])
    m = load_program(prog).load_method()
    m.instruction_cap = 1000
    with pytest.raises(OrchestraError, match="more than 1000 instructions in one execute") as ei:
        m.execute([np.zeros(2, np.float32)])
    assert ei.value.code is Error.InvalidState


def test_views_at_the_same_offset_alias() -> None:
    """Memory planning may give a static view no instruction: it shares its source's bytes."""
    values = [
        f32((2, 3), 0),  # 0 x
        f32((2, 3), 32),  # 1 y = relu(x)
        f32((6,), 32),  # 2 a view of y (same offset, other shape), the output
    ]
    prog = program(values, [0], [2], [kernel(0, 0, 1, 1)], operators=["aten::relu.out"])
    m = load_program(prog).load_method()
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(m.execute([x])[0], np.maximum(x, 0).reshape(6))


def test_kernel_failure_names_the_instruction_and_operator() -> None:
    values = [f32((2, 3), 0), f32((4, 5), 32), f32((2, 5), 128)]
    prog = program(values, [0, 1], [2], [kernel(0, 0, 1, 2, 2)], operators=["aten::mm.out"])
    m = load_program(prog).load_method()
    with pytest.raises(OrchestraError, match=r"instruction 0 \(aten::mm\.out\) failed|aten::mm"):
        m.execute([np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)])
    assert m.statistics().failures == 1


class _Scale(BackendInterface):
    """A tiny real backend: multiplies its input by the float in its blob."""

    def __init__(self) -> None:
        self.inits: list[tuple[str, int, bytes, dict[str, bytes]]] = []
        self.destroyed: list[object] = []
        self.available = True

    def is_available(self) -> bool:
        return self.available

    def init(self, context, processed, compile_specs):
        self.inits.append((context.method_name, context.delegate_index, bytes(processed), {c.key: c.value for c in compile_specs}))
        return {"factor": float(np.frombuffer(processed, np.float32)[0])}

    def execute(self, context, handle, args):
        x, out = args[0], args[1]
        np.multiply(x, handle["factor"], out=out)

    def destroy(self, handle) -> None:
        self.destroyed.append(handle)


_SCALE = _Scale()
try:  # (not registered_backends(): that would load every plugin at import)
    register_backend(Backend("TestScale", _SCALE))
except InvalidArgumentError:  # this module imported a second time under another name
    pass


def delegated(backend: str = "TestScale") -> ProgramDef:
    values = [f32((3,), 0), f32((3,), 16)]
    d = BackendDelegate(backend, BackendDelegateDataReference(DataLocation.INLINE, 0), (CompileSpec("k", b"v"),))
    return program(values, [0], [1], [Instruction(DelegateCall(0, (0, 1)))], delegates=[d],
                   inline=[np.float32(2.5).tobytes()])


def test_delegate_is_initialised_once_per_method_and_destroyed_on_close() -> None:
    prog = load_program(dumps(delegated(), delegate_data="segment"))
    n0, d0 = len(_SCALE.inits), len(_SCALE.destroyed)
    with prog.load_method() as m1, prog.load_method() as m2:
        x = np.array([1, 2, 3], np.float32)
        for _ in range(3):
            np.testing.assert_array_equal(m1.execute([x])[0], x * 2.5)
            np.testing.assert_array_equal(m2.execute([x])[0], x * 2.5)
        assert len(_SCALE.inits) == n0 + 2
        assert _SCALE.inits[-1][2:] == (np.float32(2.5).tobytes(), {"k": b"v"})
    assert len(_SCALE.destroyed) == d0 + 2


def test_unavailable_backend_fails_at_load_with_delegate_invalid_compatibility() -> None:
    prog = load_program(delegated())
    _SCALE.available = False
    try:
        with pytest.raises(BackendError, match="backend 'TestScale' is not available") as ei:
            prog.load_method()
        assert ei.value.code is Error.DelegateInvalidCompatibility
    finally:
        _SCALE.available = True


def test_duplicate_backend_name_is_rejected() -> None:
    with pytest.raises(OrchestraError, match="backend 'TestScale' is already registered"):
        register_backend(Backend("TestScale", _Scale()))


def test_session_caches_functions_and_trim_frees_methods() -> None:
    rt = Runtime()
    with rt.session() as s:
        name = s.append_program(delegated(), name="scale")
        fn = s.lookup_function("scale.forward")
        assert s.lookup_function("scale.forward") is fn
        x = np.ones(3, np.float32)
        np.testing.assert_array_equal(s.call(fn, [x])[0], x * 2.5)
        np.testing.assert_array_equal(s.call_by_name("scale.forward", [x])[0], x * 2.5)
        d0 = len(_SCALE.destroyed)
        assert s.statistics().live_methods == 1
        assert s.trim() == 1
        assert len(_SCALE.destroyed) == d0 + 1 and s.statistics().live_methods == 0
        np.testing.assert_array_equal(s.call(fn, [x])[0], x * 2.5)  # reloaded on demand
        st = s.statistics()
        assert (st.programs, st.functions, st.calls, st.trims) == (1, 1, 3, 1)
        with pytest.raises(OrchestraError, match=r"no program 'nope' in this session \(programs: scale\)"):
            s.lookup_function("nope.forward")
        with pytest.raises(OrchestraError, match=r"program 'scale' has no method 'back' \(methods: forward\)"):
            s.lookup_function("scale.back")
        assert name == "scale"


def test_sessions_are_isolated() -> None:
    a, b = Session(), Session()
    a.append_program(branchy(), name="p")
    with pytest.raises(OrchestraError, match="no program 'p'"):
        b.lookup_function("p.forward")
    fa = a.lookup_function("p.forward")
    with pytest.raises(OrchestraError, match="belongs to another session"):
        b.call(fa, [])


def test_runtime_backend_view_limits_programs() -> None:
    rt = Runtime(backends=[])
    with pytest.raises(BackendError, match="delegates to backend 'TestScale', which this runtime does not allow"):
        rt.session().append_program(delegated())
    with pytest.raises(BackendError, match="backend\\(s\\) 'Nope' not registered"):
        Runtime(backends=["Nope"])


def test_backends_are_discovered_through_entry_points(tmp_path) -> None:
    import subprocess
    import sys
    import textwrap

    (tmp_path / "ep_backend.py").write_text(textwrap.dedent("""
        import numpy as np
        from orchestra.runtime import BackendInterface

        class Doubler(BackendInterface):
            def init(self, context, processed, compile_specs):
                return None
            def execute(self, context, handle, args):
                np.multiply(args[0], 2, out=args[1])
    """))
    dist = tmp_path / "ep_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchestra.backends]\nEpDoubler = ep_backend:Doubler\n")
    code = textwrap.dedent("""
        import numpy as np
        from orchestra.runtime import registered_backends, load_program
        import test_interpreter as t
        assert "EpDoubler" in registered_backends(), registered_backends()
        m = load_program(t.delegated("EpDoubler")).load_method()
        print(m.execute([np.ones(3, np.float32)])[0].tolist())
    """)
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.dirname(__file__)]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2.0, 2.0, 2.0]"


def test_a_programs_backend_is_loaded_without_importing_the_other_plugins(tmp_path) -> None:
    """Finding a delegate's backend loads the entry points of that name only: a first load
    does not import every installed plugin, and a broken plugin breaks only the programs (and
    the listing) that need it."""
    import os
    import subprocess
    import sys
    import textwrap

    (tmp_path / "ep_good.py").write_text(textwrap.dedent("""
        import numpy as np
        from orchestra.runtime import BackendInterface

        class Doubler(BackendInterface):
            def init(self, context, processed, compile_specs):
                return None
            def execute(self, context, handle, args):
                np.multiply(args[0], 2, out=args[1])
    """))
    (tmp_path / "ep_broken.py").write_text("raise ImportError('this plugin is broken')\n")
    dist = tmp_path / "ep_two-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-two\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchestra.backends]\nEpGood = ep_good:Doubler\nEpBroken = ep_broken:X\n")
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from orchestra.errors import BackendError
        from orchestra.runtime import registered_backends, load_program
        import test_interpreter as t
        m = load_program(t.delegated("EpGood")).load_method()
        print(m.execute([np.ones(3, np.float32)])[0].tolist(), "ep_broken" in sys.modules)
        try:
            registered_backends()
        except BackendError as exc:
            print("listing:", exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.dirname(__file__)]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "[2.0, 2.0, 2.0] False"
    assert "EpBroken" in second and "this plugin is broken" in second
