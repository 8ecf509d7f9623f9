"""Post-processing: turning an executor's outputs into a value a sink can write.

:class:`TopK` (classification: the k best classes with labels and scores) and
:func:`load_post` (a post-process by name: ``"topk"`` or a user's ``"module:attr"`` class).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InvalidArgumentError, NotFoundError
from ._frame import Frame
from ._plugin import construct, defines, import_attr

__all__ = ["MAX_LABEL_CHARS", "MAX_LABELS_BYTES", "TopK", "load_labels", "load_post", "post_names"]

MAX_LABELS_BYTES = 4 << 20  # a labels file larger than this is refused
MAX_LABEL_CHARS = 1024  # one label longer than this is refused


def load_labels(path: str | os.PathLike[str], *, max_bytes: int = MAX_LABELS_BYTES) -> tuple[str, ...]:
    """Reads a labels file: UTF-8 text, one label per line (line N = class N-1), ``\\n`` or
    ``\\r\\n`` line ends; a final newline is optional. Surrounding spaces are stripped.

    Raises:
        NotFoundError: the file does not exist.
        InvalidArgumentError: it can't be read, is larger than ``max_bytes``, has no labels,
            is not UTF-8, or has an empty or overlong line (the message names the file and
            the line).
    """
    p = Path(path)
    where = f"labels file {str(p)!r}"
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise NotFoundError(f"{where} does not exist") from None
    except OSError as exc:
        raise InvalidArgumentError(f"{where}: can't read it: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise InvalidArgumentError(f"{where} is larger than {max_bytes} bytes (a labels file has one short line per class)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidArgumentError(f"{where} line {line}: not UTF-8 text (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    labels = []
    for n, raw in enumerate(lines, 1):
        label = raw.strip()
        if not label:
            raise InvalidArgumentError(f"{where} line {n}: empty (one label per line, line N names class N-1)")
        if len(label) > MAX_LABEL_CHARS:
            raise InvalidArgumentError(f"{where} line {n}: longer than {MAX_LABEL_CHARS} characters")
        if any(ord(c) < 32 and c != "\t" for c in label):
            raise InvalidArgumentError(f"{where} line {n}: has control characters")
        labels.append(label)
    if not labels:
        raise InvalidArgumentError(f"{where} has no labels")
    return tuple(labels)


class TopK:
    """The ``k`` highest-scoring classes of one frame: a post-process for classifiers.

    ``TopK(k)(frame, outputs)`` reads ``outputs[output]`` — the scores of one frame, shape
    ``[N]`` or with leading 1s (``[1, N]``) — and returns a JSON-able list, best first
    (ties: the lower index first)::

        [{"index": 281, "label": "tabby cat", "score": 0.62}, ...]

    Args:
        k: how many classes (at most N are returned).
        labels: None (``"label"`` is null), a labels file path (see :func:`load_labels`;
            read once, here), or a sequence of strings; there must be one per class.
        softmax: turn the scores into probabilities first (for a model that outputs
            logits); False (default) reports the scores as the model returned them.
        output: which executor output holds the scores.

    Raises:
        InvalidArgumentError / NotFoundError: bad ``k``/``output``, or a bad labels file.
        InvalidArgumentError (per frame, failing that frame): the output is not one row of
        scores, or the number of labels differs from the number of classes.
    """

    def __init__(self, k: int = 5, labels: str | os.PathLike[str] | Sequence[str] | None = None, *,
                 softmax: bool = False, output: int = 0) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"TopK: k must be an int >= 1, got {k!r}")
        if isinstance(output, bool) or not isinstance(output, int) or output < 0:
            raise InvalidArgumentError(f"TopK: output must be an int >= 0, got {output!r}")
        if not isinstance(softmax, bool):
            raise InvalidArgumentError(f"TopK: softmax must be true or false, got {softmax!r}")
        self.k = k
        self.softmax = softmax
        self.output = output
        self.labels_path: str | None = None
        if labels is None:
            self.labels: tuple[str, ...] | None = None
        elif isinstance(labels, (str, os.PathLike)):
            self.labels_path = str(labels)
            self.labels = load_labels(labels)
        elif isinstance(labels, Sequence) and all(isinstance(s, str) for s in labels) and len(labels) > 0:
            self.labels = tuple(labels)
        else:
            raise InvalidArgumentError(f"TopK: labels must be a file path or a non-empty list of strings, got "
                                       f"{type(labels).__name__}")

    def scores(self, frame: Frame, outputs: Sequence[Any]) -> np.ndarray:
        """The one row of scores ``__call__`` ranks (after the softmax, when asked)."""
        where = f"TopK: camera {frame.camera!r} frame {frame.index}"
        if self.output >= len(outputs):
            raise InvalidArgumentError(f"{where}: output {self.output} asked, the executor returned {len(outputs)}")
        a = np.asarray(outputs[self.output])
        if a.dtype.kind not in "biuf" or a.size == 0:
            raise InvalidArgumentError(f"{where}: output {self.output} is {a.dtype} {list(a.shape)}, not scores")
        shape = a.shape
        while a.ndim > 1 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 1:
            raise InvalidArgumentError(f"{where}: output {self.output} is {list(shape)}; expected one row of scores "
                                       f"([N] or [1, N]) per frame")
        if self.labels is not None and len(self.labels) != a.shape[0]:
            src = f"labels file {self.labels_path!r}" if self.labels_path else "labels"
            raise InvalidArgumentError(f"{where}: {src} has {len(self.labels)} labels, output {self.output} has "
                                       f"{a.shape[0]} classes")
        a = a.astype(np.float64, copy=False)
        if np.isnan(a).any():  # NaN ranks last
            a = np.where(np.isnan(a), -np.inf, a)
        if self.softmax:
            e = np.exp(a - a.max())
            a = e / e.sum()
        return a

    def __call__(self, frame: Frame, outputs: Sequence[Any]) -> list[dict[str, Any]]:
        a = self.scores(frame, outputs)
        k = min(self.k, a.shape[0])
        # stable sort on -score: equal scores keep index order
        if k < a.shape[0]:
            part = np.argpartition(-a, k - 1)[:k]
            # the k-th score may tie with ones left out: take every index at least that good
            kth = a[part].min()
            part = np.flatnonzero(a >= kth)
        else:
            part = np.arange(a.shape[0])
        best = part[np.argsort(-a[part], kind="stable")][:k]
        labels = self.labels
        return [{"index": int(i), "label": None if labels is None else labels[i], "score": float(a[i])} for i in best]

    def __repr__(self) -> str:
        extra = f", labels={self.labels_path!r}" if self.labels_path else ""
        return f"TopK(k={self.k}{extra}, softmax={self.softmax})"


_BUILTIN = {"topk": TopK}


def post_names() -> tuple[str, ...]:
    """The built-in post-process names (besides ``"module:attr"``)."""
    return tuple(sorted(_BUILTIN))


def post_class_problem(obj: Any) -> str | None:
    """Why ``obj`` (what a ``"module:attr"`` post names) may not be used, or None: it must
    be a class whose instances are callable ``(frame, outputs) -> value``; other callables
    are never called (a config must not be able to call ``os:system``)."""
    if not isinstance(obj, type):
        return "not a class: 'module:attr' must name a post-process class (instances called as (frame, outputs))"
    if not defines(obj, "__call__"):
        return "a class whose instances are not callable (it defines no __call__(frame, outputs))"
    return None


def load_post(spec: str, **params: Any) -> Any:
    """A post-process by name: ``load_post("topk", k=5, labels="labels.txt")``, or
    ``"module:attr"`` naming a class, built with ``params``, whose instances are called as
    ``post(frame, outputs) -> value`` (importing ``module`` runs its code).

    Raises:
        NotFoundError: an unknown name, module or attribute.
        ConfigError: the class is not a post-process class, or its module failed to import.
        InvalidArgumentError: ``params`` don't fit (the message names them), or a value is bad.
    """
    if not isinstance(spec, str) or not spec:
        raise InvalidArgumentError(f"post must be 'topk' or 'module:attr', got {spec!r}")
    if spec in _BUILTIN:
        cls: Any = _BUILTIN[spec]
    elif ":" in spec:
        cls = import_attr(spec, "post")
        problem = post_class_problem(cls)
        if problem is not None:
            raise ConfigError(f"post {spec!r} is {cls!r}, {problem}")
    else:
        raise NotFoundError(f"no post-process {spec!r} (built-in: {', '.join(post_names())}; or 'module:attr')")
    post = construct(cls, spec, "post", params)
    if not callable(post):
        raise ConfigError(f"post {spec!r}: {cls!r} made {post!r}, which is not callable")
    return post
