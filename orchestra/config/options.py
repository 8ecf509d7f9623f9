"""Backend option tables (a camera's ``backend_options``, a policy's ``*_options``
parameters), checked against each backend's declared options."""

from __future__ import annotations

from typing import Any

from ._base import Checker, _hint, _is_int, _join, _kind_of, _names
from .programs import _ProgramInfo


class OptionChecks(Checker):
    def check_options_table(self, path: str, value: Any, used_by: _ProgramInfo | None
                            ) -> tuple[dict[str, dict[str, Any]] | None, bool]:
        """backend -> {option: value}, checked against each backend's OptionSpecs. With
        ``used_by``, every backend must be one the program's method delegates to. Returns
        the valid entries (None when ``value`` is not a table) and whether all were valid."""
        t = self.table(value, path)
        if t is None:
            return None, False
        out: dict[str, dict[str, Any]] = {}
        ok = True
        for backend, opts in t.items():
            bp = _join(path, backend)
            if backend not in self.backend_names():
                self.err(bp, f"no backend named {backend!r} (backends: {_names(self.backend_names())})"
                             f"{_hint(backend, self.backend_names())}")
                ok = False
                continue
            if used_by is not None and used_by.inputs is not None and backend not in used_by.backends:
                self.err(bp, f"backend {backend!r} is not used by {used_by.where} (it delegates to: "
                             f"{_names(list(used_by.backends)) if used_by.backends else 'no backend'})")
                ok = False
                continue
            ot = self.table(opts, bp)
            if ot is None:
                ok = False
                continue
            specs = self.option_specs(backend)
            if specs is None:
                ok = False
                continue
            clean: dict[str, Any] = {}
            for key, v in ot.items():
                op = _join(bp, key)
                spec = specs.get(key)
                if spec is None:
                    self.err(op, f"backend {backend!r} has no option {key!r} (options: {_names(list(specs))})"
                                 f"{_hint(key, list(specs))}")
                    ok = False
                    continue
                typ = spec.type
                good = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
                if typ is float and _is_int(v):
                    v, good = float(v), True
                if not good:
                    self.err(op, f"must be {'a' if typ.__name__[0] not in 'aeiou' else 'an'} {typ.__name__}, got {_kind_of(v)}")
                    ok = False
                    continue
                if spec.choices is not None and v not in spec.choices:
                    self.err(op, f"must be one of {', '.join(map(repr, spec.choices))}; got {v!r}")
                    ok = False
                    continue
                clean[key] = v
            out[backend] = clean
        return out, ok
