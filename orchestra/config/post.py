"""A camera's ``post`` table: ``kind = "topk"`` (``k``, ``labels``, ``softmax``, ``output``)
or a ``"module:attr"`` post-process class with its parameters."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OrchestraError
from ._base import _BAD, Checker, _any_bad, _freeze, _hint, _join, _show, _thaw

_TOPK_KEYS = ("kind", "k", "labels", "softmax", "output")
POST_KINDS = ("topk",)
MAX_TOPK = 100_000


@dataclass(frozen=True)
class PostConfig:
    """A camera's post-process: ``kind`` (``topk`` or ``module:attr``) and its parameters
    (a ``labels`` path is absolute)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self) -> Any:
        """The post-process (``orchestra.pipeline.load_post(kind, **params)``)."""
        from orchestra.pipeline import load_post

        return load_post(self.kind, **_thaw(self.params))

    def describe(self) -> str:
        """One line for the run summary: ``topk k=5 labels=/abs/labels.txt``."""
        return " ".join([self.kind, *(f"{k}={v}" for k, v in self.params.items())])


def import_class(checker: Checker, kp: str, spec: str, what: str, problem_of: Any) -> Any:
    """The class a ``module:attr`` names, or _BAD after reporting at ``kp`` (shared by the
    post and sink tables): importing runs the module's code; the object must pass
    ``problem_of`` (a class implementing the protocol) — nothing else is ever called."""
    from ..pipeline._plugin import import_attr

    try:
        obj = import_attr(spec, what)
    except OrchestraError as exc:
        checker.err(kp, exc.message)
        return _BAD
    problem = problem_of(obj)
    if problem is not None:
        checker.err(kp, f"{what} {spec!r} is {_show(obj)}, {problem}")
        return _BAD
    return obj


def _classes(prog: Any, output: Any) -> int | None:
    """How many scores output ``output`` of ``prog`` holds per frame (its last dimension,
    when every size before it is 1 or it is batched [B, N]); None when unknown (no program
    info, a dynamic or non-tensor output, or no such output)."""
    outs = getattr(prog, "outputs", None)
    if not outs or not isinstance(output, int) or isinstance(output, bool) or output >= len(outs):
        return None
    from ..program import TensorShapeDynamism

    o = outs[output]
    if o.dtype is None or not o.sizes or o.dynamism != TensorShapeDynamism.STATIC:
        return None
    return int(o.sizes[-1])


def check_params(checker: Checker, path: str, cls: type, params: Mapping[str, Any], what: str) -> bool:
    """Whether ``params`` fit ``cls``'s constructor (reported at ``path`` when not)."""
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as exc:
        checker.err(path, f"{what} {cls.__module__}:{cls.__qualname__} doesn't take {sorted(params)}: {exc}")
        return False
    except ValueError:
        pass
    return True


class PostChecks(Checker):
    """Checks a camera's ``post`` (:meth:`check_post`)."""

    def check_post(self, path: str, t: dict[str, Any], prog: Any = None) -> Any:
        """The camera's :class:`PostConfig`, None without a ``post`` key, or _BAD. ``prog``
        (the camera's program info, when known) lets a top-k's labels be counted against the
        classes its output holds."""
        if "post" not in t:
            return None
        sp = _join(path, "post")
        s = self.table(t["post"], sp)
        if s is None:
            return _BAD
        kind = self.get(s, "kind", sp, "string")
        if kind is _BAD:
            return _BAD
        if kind == "topk":
            return self.check_topk(sp, s, prog)
        kp = _join(sp, "kind")
        if ":" not in kind:
            self.err(kp, f"no post-process kind {kind!r} (kinds: {', '.join(POST_KINDS)}; or 'module:attr')"
                         f"{_hint(kind, POST_KINDS)}")
            return _BAD
        from ..pipeline._post import post_class_problem

        cls = import_class(self, kp, kind, "post", post_class_problem)
        if cls is _BAD:
            return _BAD
        params = {k: v for k, v in s.items() if k != "kind"}
        if not check_params(self, sp, cls, params, "post"):
            return _BAD
        return PostConfig(kind, params)

    def check_topk(self, sp: str, s: dict[str, Any], prog: Any = None) -> Any:
        self.known(s, sp, _TOPK_KEYS)
        k = self.get(s, "k", sp, "positive_int", 5)
        if k is not _BAD and k > MAX_TOPK:
            self.err(_join(sp, "k"), f"{k} is more than {MAX_TOPK}")
            k = _BAD
        softmax = self.get(s, "softmax", sp, "bool", False)
        output = self.get(s, "output", sp, "nonneg_int", 0)
        written = self.get(s, "labels", sp, "string", None)
        labels = None
        if written is not None and written is not _BAD:
            labels = Path(written) if Path(written).is_absolute() else (self.base / written).resolve()
            from ..pipeline import load_labels

            try:
                names = load_labels(labels)
            except OrchestraError as exc:
                self.err(_join(sp, "labels"), exc.message.replace(repr(str(labels)), repr(written)))
                written = _BAD
            else:
                classes = _classes(prog, output)
                if classes is not None and classes != len(names):
                    self.err(_join(sp, "labels"), f"{written} has {len(names)} labels; output {output} of "
                                                  f"{prog.where} holds {classes} classes per frame")
                    written = _BAD
        if _any_bad(k, softmax, output, written):
            return _BAD
        params: dict[str, Any] = {"k": k, "softmax": softmax, "output": output}
        if labels is not None:
            params["labels"] = str(labels)
        return PostConfig("topk", params)
