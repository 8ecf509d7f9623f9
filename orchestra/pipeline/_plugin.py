"""Loading a ``"module:attr"`` class (a user's post-process or sink) by name."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ..errors import ConfigError, InvalidArgumentError, NotFoundError


def import_attr(spec: str, what: str) -> Any:
    """The object ``"module:attr"`` names (``attr`` may be dotted); imports ``module``, so
    its code runs.

    Raises:
        NotFoundError: no such module or attribute.
        ConfigError: importing the module raised (or exited).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise NotFoundError(f"{what} {spec!r}: expected 'module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise NotFoundError(f"{what} {spec!r}: can't import module {module_name!r}: {exc}") from exc
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code: exiting at import is an error too
        raise ConfigError(f"{what} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise NotFoundError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def defines(cls: type, method: str) -> bool:
    """Whether instances of ``cls`` have ``method`` from a class other than ``object``
    (``callable(cls)`` is true of every class, so ``__call__`` needs this)."""
    return any(method in vars(k) for k in cls.__mro__ if k is not object)


def construct(cls: Any, spec: str, what: str, params: dict[str, Any]) -> Any:
    """``cls(**params)``, after checking that ``params`` fit its signature, so a misspelled
    parameter is an :class:`InvalidArgumentError` naming ``what`` and ``spec`` rather than a
    TypeError from inside user code."""
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as exc:
        raise InvalidArgumentError(f"{what} {spec!r}: bad parameters {sorted(params)}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): let the call say
        pass
    return cls(**params)
