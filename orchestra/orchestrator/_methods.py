"""Instances that load several methods of one program together (a program instance).

A pool loaded with ``methods=("prefill", "decode")`` gives each instance one
:class:`~orchestra.runtime.ProgramInstance`: its methods share the program's mutable state
(a KV cache), and each instance has its own. Workers hold a :class:`MethodSet` where they
would hold a Method: same calls (``execute``, option changes, ``close``), and an execute
whose inputs are a :class:`Routed` runs the method it names instead of the pool's default.
Plain inputs keep the worker's hot path exactly as it is for a single Method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..errors import InvalidArgumentError
from ..runtime import Method, MethodMeta, Program, ProgramInstance

__all__ = ["MethodSet", "Routed", "load_for_worker"]


class Routed:
    """Inputs for a named method of a program instance (not the pool's default method)."""

    __slots__ = ("method", "inputs")

    def __init__(self, method: str, inputs: Sequence[Any]) -> None:
        self.method = method
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return f"Routed({self.method!r}, {len(self.inputs)} inputs)"


class MethodSet:
    """A ProgramInstance seen as a worker's Method: executes go to ``default`` unless the
    inputs are :class:`Routed`; option changes reach every method using that backend."""

    __slots__ = ("instance", "default", "meta", "_methods")

    def __init__(self, instance: ProgramInstance, default: str) -> None:
        self.instance = instance
        self.default = instance.method(default)
        self._methods = {n: instance.method(n) for n in instance.method_names}
        backends = tuple(dict.fromkeys(b for m in self._methods.values() for b in m.meta.backends))
        # the default method's meta, with every backend the instance uses
        self.meta: MethodMeta = dataclasses.replace(self.default.meta, backends=backends)

    def method(self, name: str) -> Method:
        m = self._methods.get(name)
        if m is None:
            raise InvalidArgumentError(f"method {name!r} is not loaded in this instance "
                                       f"(methods: {', '.join(self._methods)})")
        return m

    def execute(self, inputs: Any, backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Any]:
        if type(inputs) is Routed:
            m = self.method(inputs.method)
            if backend_options:
                backend_options = {b: v for b, v in backend_options.items() if b in m.meta.backends}
            return m.execute(inputs.inputs, backend_options or None)
        return self.default.execute(inputs, backend_options)

    def _users(self, backend_id: str) -> list[Method]:
        users = [m for m in self._methods.values() if backend_id in m.meta.backends]
        if not users:
            raise InvalidArgumentError(f"backend {backend_id!r} is used by no method of this instance")
        return users

    def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        for b in options:
            self._users(b)
        for m in self._methods.values():
            mine = {b: v for b, v in options.items() if b in m.meta.backends}
            if mine:
                m.set_options(mine)

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        out: dict[str, Mapping[str, Any]] = {}
        for m in self._methods.values():
            for b, v in m.options().items():
                out.setdefault(b, v)
        return MappingProxyType(out)

    def commit_options(self) -> None:
        for m in self._methods.values():
            m.commit_options()

    def prepare_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        for m in self._users(backend_id):
            m.prepare_backend_options(backend_id, values)

    def statistics(self) -> Any:
        return self.instance.statistics()

    def close(self) -> None:
        self.instance.close()


def load_for_worker(program: Program, method: str, methods: Sequence[str],
                    options: Mapping[str, Mapping[str, Any]]) -> Method | MethodSet:
    """What a worker executes: a lone Method, or (``methods`` given) a MethodSet over a new
    program instance holding ``methods``, defaulting to ``method``."""
    if not methods:
        return program.load_method(method, backend_options=options)
    names = tuple(dict.fromkeys((method, *methods)))
    inst = program.load_methods(names, backend_options=options)
    try:
        return MethodSet(inst, method)
    except BaseException:
        inst.close()
        raise
