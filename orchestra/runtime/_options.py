"""Runtime-derived backend options: declarations, validation and immutable snapshots.

A backend declares the options it accepts as :class:`OptionSpec`s. Values reach it only
through its contexts, as a :class:`RuntimeSpecs` snapshot: an immutable mapping holding a
value for every declared option (declared defaults fill what the user did not set).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["OptionSpec", "RuntimeSpecs", "validate_option_specs"]

_TYPES = (bool, int, float, str)


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option a backend accepts.

    Attributes:
        name: the key users pass.
        type: ``bool``, ``int``, ``float`` or ``str``.
        default: the value when none is given.
        choices: allowed values (for ``str`` mostly), or None for any value of ``type``.
        hot: True when the value may change between any two executes (it reaches the
            backend in ``BackendExecutionContext.runtime_specs``); False for init-only
            options, whose change re-initialises the backend's delegates.
        doc: one line for users.
    """

    name: str
    type: type
    default: Any
    choices: tuple[Any, ...] | None = None
    hot: bool = False
    doc: str = ""

    def check(self, value: Any, backend: str) -> Any:
        """Returns ``value`` converted to this option's type, or raises naming the problem."""
        t = self.type
        ok = isinstance(value, t) and not (t is int and isinstance(value, bool))
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise InvalidArgumentError(
                f"backend {backend!r} option {self.name!r} must be {t.__name__}, got {type(value).__name__} {value!r}"
            )
        if self.choices is not None and value not in self.choices:
            raise InvalidArgumentError(
                f"backend {backend!r} option {self.name!r} must be one of {', '.join(map(repr, self.choices))}; got {value!r}"
            )
        return value


def validate_option_specs(backend: str, specs: Any) -> tuple[OptionSpec, ...]:
    """Checks a backend's declarations (at registration)."""
    specs = tuple(specs or ())
    seen: set[str] = set()
    for s in specs:
        if not isinstance(s, OptionSpec):
            raise InvalidArgumentError(f"backend {backend!r}: option_specs must hold OptionSpec, got {s!r}")
        if s.type not in _TYPES:
            raise InvalidArgumentError(f"backend {backend!r} option {s.name!r}: type must be bool, int, float or str")
        if s.name in seen:
            raise InvalidArgumentError(f"backend {backend!r} declares option {s.name!r} twice")
        seen.add(s.name)
        s.check(s.default, backend)
    return specs


class RuntimeSpecs(Mapping[str, Any]):
    """An immutable snapshot of one backend's option values (every declared option)."""

    __slots__ = ("_backend", "_specs", "_values", "_init")

    def __init__(self, backend: str, specs: tuple[OptionSpec, ...], values: Mapping[str, Any] | None = None) -> None:
        self._backend = backend
        self._specs = {s.name: s for s in specs}  # shared by every snapshot derived from this one
        merged = {s.name: s.default for s in specs}
        if values:
            merged.update(values)
        self._values = merged
        self._init: tuple[tuple[str, Any], ...] | None = None

    @property
    def backend(self) -> str:
        return self._backend

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        """The value of ``key``; a key the backend doesn't declare is an error."""
        try:
            return self._values[key]
        except KeyError:
            raise InvalidArgumentError(
                f"backend {self._backend!r} has no option {key!r} (options: {', '.join(self._values) or 'none'})"
            ) from None

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RuntimeSpecs):
            return self._backend == other._backend and self._values == other._values
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._backend, tuple(self._values.items())))

    def __repr__(self) -> str:
        return f"RuntimeSpecs({self._backend!r}, {self._values!r})"

    def init_values(self) -> tuple[tuple[str, Any], ...]:
        """The init-only part, comparable: a change here re-initialises delegates."""
        init = self._init
        if init is None:
            init = self._init = tuple((n, self._values[n]) for n, s in self._specs.items() if not s.hot)
        return init

    def replace(self, updates: Mapping[str, Any], *, hot_only: bool = False) -> RuntimeSpecs:
        """A new snapshot with ``updates`` applied after validation."""
        if not updates:
            return self
        specs = self._specs
        clean = {}
        for key, value in updates.items():
            spec = specs.get(key)
            if spec is None:
                raise InvalidArgumentError(
                    f"backend {self._backend!r} has no option {key!r} (options: {', '.join(specs) or 'none'})"
                )
            if hot_only and not spec.hot:
                hot = [n for n, s in specs.items() if s.hot]
                raise InvalidArgumentError(
                    f"backend {self._backend!r} option {key!r} is init-only and can't be overridden per call "
                    f"(hot options: {', '.join(hot) or 'none'})"
                )
            clean[key] = spec.check(value, self._backend)
        values = dict(self._values)
        values.update(clean)
        new = RuntimeSpecs.__new__(RuntimeSpecs)
        new._backend, new._specs, new._values = self._backend, self._specs, values
        new._init = self._init if all(specs[k].hot for k in clean) else None
        return new
