"""The backend package imports, and says what is missing, without the onnx extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_package_imports_without_onnx_and_onnxruntime() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["onnx"] = None          # makes `import onnx` raise ImportError
        sys.modules["onnxruntime"] = None
        from orchestra.errors import InvalidArgumentError
        from orchestra.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeBackendDetails, import_onnx
        assert OnnxRuntimeBackend().is_available() is False
        for call in (lambda: import_onnx(b"x"), lambda: OnnxRuntimeBackendDetails.preprocess(b"x", [])):
            try:
                call()
            except InvalidArgumentError as exc:
                assert "needs the 'onnx' package" in str(exc), exc
            else:
                raise AssertionError("no error")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_program_delegating_to_onnxruntime_names_the_extra_to_install() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["onnxruntime"] = None   # not installed
        from orchestra.errors import BackendError
        from orchestra.runtime import load_program
        program = load_program(sys.argv[1])
        try:
            program.load_method("forward")
        except BackendError as exc:
            print(exc)
        else:
            raise AssertionError("no error")
    """)
    import pathlib

    pte = pathlib.Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny_onnx.pte"
    out = subprocess.run([sys.executable, "-c", code, str(pte)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "backend 'OnnxRuntimeBackend' is not available" in out.stdout
    assert "pip install 'orchestra[onnx]'" in out.stdout, out.stdout
