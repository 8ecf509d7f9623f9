"""Build configuration beyond pyproject.toml: orchestra's five optional C extensions.

``orchestra.runtime.kernels._native`` (the compiled kernels), ``orchestra.runtime._uses`` (the
hot loops of a plan's analysis: its use analysis, the memory proofs and the matchers of the plan
rewrites), ``orchestra.runtime._plan`` (the loops over a plan's values when
it is compiled and when a Method is made), ``orchestra.program._decode`` (the program reader's
decoding of values and instructions, and its verifier's checks of each) and
``orchestra.backends.xnnpack._xdecode`` (the XNNPACK delegate blob's values, nodes and
constants) are one C file each, need no numpy headers, and are optional: where no C compiler is
available the install goes on without them, every kernel runs its numpy path
(``orchestra.runtime.kernels.NATIVE_KERNELS`` is then False), the plan analysis and the value
loops run in Python (``orchestra.runtime._optimize._uses`` and ``orchestra.runtime._method._plan``
are then None) and the readers decode in Python (``orchestra.program._reader._native_decode``
and ``orchestra.backends.xnnpack._blob._native_xdecode`` are then None)."""

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
        ),
        Extension(
            "orchestra.runtime._uses",
            sources=["orchestra/runtime/_uses.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
        Extension(
            "orchestra.runtime._plan",
            sources=["orchestra/runtime/_plan.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
        Extension(
            "orchestra.program._decode",
            sources=["orchestra/program/_decode.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
        Extension(
            "orchestra.backends.xnnpack._xdecode",
            sources=["backends/xnnpack/_xdecode.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
    ]
)
