"""Build configuration beyond pyproject.toml: orchestra's compiled kernels.

``orchestra.runtime.kernels._native`` (one C file, no numpy headers needed) is optional: where
no C compiler is available the install goes on without it and every kernel runs its numpy
path (``orchestra.runtime.kernels.NATIVE_KERNELS`` is then False)."""

import sys

from setuptools import Extension, setup

_posix = sys.platform != "win32"

setup(
    ext_modules=[
        Extension(
            "orchestra.runtime.kernels._native",
            sources=["orchestra/runtime/kernels/_native.c"],
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=fast", "-Wno-psabi"] + (["-pthread"] if _posix else []),
            extra_link_args=["-pthread"] if _posix else [],
            libraries=["m"] if _posix else [],
            optional=True,
        )
    ]
)
