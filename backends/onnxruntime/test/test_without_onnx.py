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
