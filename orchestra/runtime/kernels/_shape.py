"""Shape and data-movement kernels: views as copies, cat/stack/split, slicing, indexing,
padding, dtype conversion copies."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from ._registry import kernel
from ._util import ALL, bad, check_fits, dest, finish, numel, result_dtype, wrap_dim

__all__ = ["permute_geometry"]

_I64 = np.dtype(np.int64)
# Signed integer itemsize -> the unsigned dtype of the same size (read-only).
_UNSIGNED = MappingProxyType({np.dtype(t).itemsize: np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)})


def resolve_shape(op: str, size: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = [int(s) for s in size]
    infer = [i for i, s in enumerate(shape) if s == -1]
    if len(infer) > 1 or any(s < -1 for s in shape):
        raise bad(op, f"invalid shape {shape}")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if infer:
        if known == 0 or numel % known:
            raise bad(op, f"shape {shape} is invalid for a tensor of {numel} elements")
        shape[infer[0]] = numel // known
    elif known != numel:
        raise bad(op, f"shape {shape} is invalid for a tensor of {numel} elements")
    return tuple(shape)


def _reshape_into(op: str, x: np.ndarray, size: Sequence[int], out: Any) -> np.ndarray:
    if type(out) is np.ndarray:
        # Fast path: ``size`` is ``out``'s shape already (no -1 to resolve).
        shape = out.shape
        if tuple(size) == shape and x.size == out.size:
            try:
                out[...] = x.reshape(shape)
                return out
            except ValueError:  # a read-only out
                pass
    target = resolve_shape(op, size, x.size)
    o = dest(out, target)
    if o is not None and o.flags.c_contiguous:
        # Copy straight from x (any strides) into out seen with x's shape: one pass.
        np.copyto(o.reshape(x.shape), x, casting="unsafe")
        return o
    return finish(np.reshape(x, target), out)


@kernel("aten::view_copy.out", dtypes=ALL)
def view_copy_out(self: np.ndarray, size: list[int], out: np.ndarray) -> np.ndarray:
    return _reshape_into("aten::view_copy.out", self, size, out)


@kernel("aten::_unsafe_view.out", dtypes=ALL)
def unsafe_view_out(self: np.ndarray, size: list[int], out: np.ndarray) -> np.ndarray:
    return _reshape_into("aten::_unsafe_view.out", self, size, out)


_PERMUTE_MAX_DIMS = 8  # the compiled copy's limit (after merging)
_PERMUTE_MIN_ELEMENTS = 64  # below this numpy's copy is as fast as the call


def permute_geometry(shape: Sequence[int], perm: Sequence[int]) -> np.ndarray | None:
    """What the compiled copy ``compiled().permute_4b(x, out, geometry)`` needs to copy
    ``x.transpose(perm)`` of a C-contiguous ``x`` of ``shape`` (4-byte elements) into a
    C-contiguous ``out``, bit for bit: int64 ``[sizes..., element strides...]`` of the
    result's dims, size-1 dims left out and dims adjacent in both orders merged (NCHW ->
    NHWC of an image is two dims: (H*W, C) read with strides (1, H*W)). Worked out once per
    shape, when a plan's step is built. None where the copy does not apply: fewer than 64
    elements (numpy's copy is as fast as the call), more than 8 dims after merging."""
    n = len(shape)
    if sorted(perm) != list(range(n)) or math.prod(shape) < _PERMUTE_MIN_ELEMENTS:
        return None
    strides = [1] * n
    for k in range(n - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    dims: list[list[int]] = []
    for p in perm:
        size, stride = shape[p], strides[p]
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:  # the previous dim is just outside this one in x too
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if not dims:
        dims = [[1, 1]]
    if len(dims) > _PERMUTE_MAX_DIMS:
        return None
    return np.array([d[0] for d in dims] + [d[1] for d in dims], _I64)


@kernel("aten::permute_copy.out", dtypes=ALL)
def permute_copy_out(self: np.ndarray, dims: list[int], out: np.ndarray) -> np.ndarray:
    if type(out) is np.ndarray:
        # Fast path: numpy validates the permutation (wrong length, repeats, range).
        try:
            t = self.transpose(dims)
            if t.shape == out.shape:
                out[...] = t
                return out
        except (ValueError, TypeError):
            pass
    op = "aten::permute_copy.out"
    axes = tuple(wrap_dim(int(d), self.ndim, op) for d in dims)
    if sorted(axes) != list(range(self.ndim)):
        raise bad(op, f"dims {list(dims)} is not a permutation of {self.ndim} dims")
    return finish(np.transpose(self, axes), out)


@kernel("aten::transpose_copy.int_out", dtypes=ALL)
def transpose_copy_int_out(self: np.ndarray, dim0: int, dim1: int, out: np.ndarray) -> np.ndarray:
    op = "aten::transpose_copy.int_out"
    if self.ndim == 0:
        return finish(self, out)
    return finish(np.swapaxes(self, wrap_dim(dim0, self.ndim, op), wrap_dim(dim1, self.ndim, op)), out)


@kernel("aten::t_copy.out", dtypes=ALL)
def t_copy_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    if self.ndim > 2:
        raise bad("aten::t_copy.out", f"expected a tensor with <= 2 dims, got {self.ndim}")
    return finish(self.T, out)


@kernel("aten::expand_copy.out", dtypes=ALL)
def expand_copy_out(self: np.ndarray, size: list[int], implicit: bool, out: np.ndarray) -> np.ndarray:
    op = "aten::expand_copy.out"
    size = [int(s) for s in size]
    lead = len(size) - self.ndim
    if lead < 0:
        raise bad(op, f"size {size} has fewer dims than the input {tuple(self.shape)}")
    target = []
    for i, s in enumerate(size):
        if s == -1:
            if i < lead:
                raise bad(op, f"-1 is not allowed for the new leading dim {i} in {size}")
            s = self.shape[i - lead]
        target.append(s)
    try:
        view = np.broadcast_to(self, tuple(target))
    except ValueError as exc:
        raise bad(op, f"cannot expand shape {tuple(self.shape)} to {size}") from exc
    return finish(view, out)


def _copy(self: np.ndarray, out: Any) -> Any:
    if type(out) is np.ndarray and out.shape == self.shape and out.dtype == self.dtype:
        try:
            out[...] = self
            return out
        except ValueError:  # a read-only out
            pass
    with np.errstate(invalid="ignore"):
        return finish(self, out)


@kernel("aten::clone.out", dtypes=ALL)
def clone_out(self: np.ndarray, memory_format: int | None, out: np.ndarray) -> np.ndarray:
    return _copy(self, out)


@kernel("aten::alias_copy.out", dtypes=ALL)
def alias_copy_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _copy(self, out)


@kernel("aten::alias", dtypes=ALL)
def alias(self: np.ndarray) -> np.ndarray:
    """A view op: returns the input itself, which the interpreter aliases."""
    return self


@kernel("aten::_to_copy.out", dtypes=ALL)
def to_copy_out(
    self: np.ndarray, non_blocking: bool, memory_format: int | None, out: np.ndarray
) -> np.ndarray:
    """Copies ``self`` converted to ``out``'s dtype (float -> int truncates, like torch)."""
    return _copy(self, out)


@kernel("dim_order_ops::_to_dim_order_copy.out", dtypes=ALL)
def to_dim_order_copy_out(
    self: np.ndarray, non_blocking: bool, dim_order: list[int] | None, out: np.ndarray
) -> np.ndarray:
    """Copies ``self`` converted to ``out``'s dtype; ``out``'s layout is the interpreter's."""
    return _copy(self, out)


@kernel("dim_order_ops::_clone_dim_order.out", dtypes=ALL)
def clone_dim_order_out(
    self: np.ndarray, non_blocking: bool, dim_order: list[int] | None, out: np.ndarray
) -> np.ndarray:
    return _copy(self, out)


@kernel("aten::copy.out", dtypes=ALL)
def copy_out(self: np.ndarray, src: np.ndarray, non_blocking: bool, out: np.ndarray) -> np.ndarray:
    """``src`` broadcast to ``self``'s shape, in ``self``'s dtype."""
    try:
        view = np.broadcast_to(src, self.shape)
    except ValueError as exc:
        raise bad("aten::copy.out", f"cannot broadcast {tuple(src.shape)} to {tuple(self.shape)}") from exc
    return _copy(view.astype(self.dtype, copy=False), out)


@kernel("aten::copy_", dtypes=ALL)
def copy_(self: np.ndarray, src: np.ndarray, non_blocking: bool) -> np.ndarray:
    """In place: writes ``src`` into ``self`` and returns ``self`` (ExecuTorch's scan uses it)."""
    try:
        np.copyto(self, src, casting="unsafe")
    except ValueError as exc:
        raise bad("aten::copy_", f"cannot broadcast {tuple(src.shape)} to {tuple(self.shape)}") from exc
    return self


@kernel("aten::select_copy.int_out", dtypes=ALL)
def select_copy_int_out(self: np.ndarray, dim: int, index: int, out: np.ndarray) -> np.ndarray:
    op = "aten::select_copy.int_out"
    if self.ndim == 0:
        raise bad(op, "cannot select from a 0-d tensor")
    d = wrap_dim(dim, self.ndim, op)
    n = self.shape[d]
    if not -n <= index < n:
        raise bad(op, f"index {index} is out of range for dim {dim} of size {n}")
    return finish(self[(slice(None),) * d + (int(index),)], out)


@kernel("aten::slice_copy.Tensor_out", dtypes=ALL)
def slice_copy_tensor_out(
    self: np.ndarray, dim: int, start: int | None, end: int | None, step: int, out: np.ndarray
) -> np.ndarray:
    op = "aten::slice_copy.Tensor_out"
    if self.ndim == 0:
        raise bad(op, "cannot slice a 0-d tensor")
    if step is None:
        step = 1
    if step <= 0:
        raise bad(op, f"step must be positive, got {step}")
    d = wrap_dim(dim, self.ndim, op)
    # Python slicing clamps start/end to the dim exactly as torch does.
    sl = slice(start, end, step)
    return finish(self[(slice(None),) * d + (sl,)], out)


@kernel("aten::unsqueeze_copy.out", dtypes=ALL)
def unsqueeze_copy_out(self: np.ndarray, dim: int, out: np.ndarray) -> np.ndarray:
    d = wrap_dim(dim, self.ndim + 1, "aten::unsqueeze_copy.out")
    return finish(np.expand_dims(self, d), out)


def _squeeze(op: str, x: np.ndarray, dims: Sequence[int] | None, out: Any) -> Any:
    if x.ndim == 0:
        if dims is not None:
            for d in dims:
                wrap_dim(int(d), 0, op)
        return finish(x, out)
    if dims is None:
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        axes = tuple(sorted({wrap_dim(int(d), x.ndim, op) for d in dims if x.shape[wrap_dim(int(d), x.ndim, op)] == 1}))
    return finish(np.squeeze(x, axis=axes) if axes else x, out)


@kernel("aten::squeeze_copy.dims_out", dtypes=ALL)
def squeeze_copy_dims_out(self: np.ndarray, dim: list[int], out: np.ndarray) -> np.ndarray:
    return _squeeze("aten::squeeze_copy.dims_out", self, list(dim), out)


@kernel("aten::squeeze_copy.dim_out", dtypes=ALL)
def squeeze_copy_dim_out(self: np.ndarray, dim: int, out: np.ndarray) -> np.ndarray:
    return _squeeze("aten::squeeze_copy.dim_out", self, [dim], out)


@kernel("aten::squeeze_copy.out", dtypes=ALL)
def squeeze_copy_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _squeeze("aten::squeeze_copy.out", self, None, out)


# --------------------------------------------------------------------------- cat / split


@kernel("aten::cat.out", dtypes=ALL)
def cat_out(tensors: list[np.ndarray], dim: int, out: np.ndarray) -> np.ndarray:
    op = "aten::cat.out"
    if not tensors:
        raise bad(op, "expected a non-empty list of tensors")
    # torch skips legacy empty 1-d tensors (shape (0,)) when concatenating others.
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    ref = ts[0]
    if ref.ndim == 0:
        raise bad(op, "zero-dimensional tensors cannot be concatenated")
    d = wrap_dim(dim, ref.ndim, op)
    for t in ts[1:]:
        if t.ndim != ref.ndim or t.shape[:d] != ref.shape[:d] or t.shape[d + 1 :] != ref.shape[d + 1 :]:
            raise bad(op, f"tensors of shapes {[tuple(t.shape) for t in ts]} cannot be concatenated on dim {dim}")
    shape = ref.shape[:d] + (sum(t.shape[d] for t in ts),) + ref.shape[d + 1 :]
    o = dest(out, shape)
    if o is not None and any(np.may_share_memory(o, t) for t in ts):
        o = None
    if o is not None:
        return np.concatenate(ts, axis=d, out=o, casting="unsafe")
    check_fits(op, shape, out)
    res = np.concatenate(ts, axis=d, dtype=result_dtype(*ts), casting="unsafe")
    return finish(res, out)


@kernel("aten::stack.out", dtypes=ALL)
def stack_out(tensors: list[np.ndarray], dim: int, out: np.ndarray) -> np.ndarray:
    op = "aten::stack.out"
    if not tensors:
        raise bad(op, "expected a non-empty list of tensors")
    if any(t.shape != tensors[0].shape for t in tensors):
        raise bad(op, f"stack expects equal shapes, got {[tuple(t.shape) for t in tensors]}")
    d = wrap_dim(dim, tensors[0].ndim + 1, op)
    shape = tensors[0].shape[:d] + (len(tensors),) + tensors[0].shape[d:]
    o = dest(out, shape)
    if o is not None and not any(np.may_share_memory(o, t) for t in tensors):
        return np.stack(tensors, axis=d, out=o, casting="unsafe")
    check_fits(op, shape, out)
    return finish(np.stack(tensors, axis=d, dtype=result_dtype(*tensors), casting="unsafe"), out)


def _split(op: str, x: np.ndarray, sizes: Sequence[int], d: int, out: Any) -> list[np.ndarray]:
    if not isinstance(out, (list, tuple)) or len(out) != len(sizes):
        n = len(out) if isinstance(out, (list, tuple)) else "no"
        raise bad(op, f"{len(sizes)} pieces but {n} out tensors")
    res = []
    start = 0
    lead = (slice(None),) * d
    for size, o in zip(sizes, out):
        piece = x[lead + (slice(start, start + size),)]
        start += size
        if type(o) is np.ndarray and o.shape == piece.shape:
            try:
                o[...] = piece
                res.append(o)
                continue
            except ValueError:  # a read-only out
                pass
        res.append(finish(piece, o))
    return res


@kernel("aten::split_with_sizes_copy.out", dtypes=ALL)
def split_with_sizes_copy_out(
    self: np.ndarray, split_sizes: list[int], dim: int, out: list[np.ndarray]
) -> list[np.ndarray]:
    """Returns the list of pieces (each written into its ``out`` entry when the shape fits)."""
    op = "aten::split_with_sizes_copy.out"
    d = wrap_dim(dim, self.ndim, op)
    sizes = [int(s) for s in split_sizes]
    if sum(sizes) != self.shape[d] or min(sizes, default=0) < 0:
        raise bad(op, f"split_sizes {sizes} do not add up to dim {dim} of size {self.shape[d]}")
    return _split(op, self, sizes, d, out)


@kernel("aten::split_copy.Tensor_out", dtypes=ALL)
def split_copy_tensor_out(
    self: np.ndarray, split_size: int, dim: int, out: list[np.ndarray]
) -> list[np.ndarray]:
    op = "aten::split_copy.Tensor_out"
    d = wrap_dim(dim, self.ndim, op)
    n = self.shape[d]
    if split_size < 0 or (split_size == 0 and n != 0):
        raise bad(op, f"split_size must be positive, got {split_size}")
    sizes = [split_size] * (n // split_size) if split_size else [0]
    if split_size and n % split_size:
        sizes.append(n % split_size)
    if not sizes:
        sizes = [0]
    return _split(op, self, sizes, d, out)


@kernel("aten::unbind_copy.int_out", dtypes=ALL)
def unbind_copy_int_out(self: np.ndarray, dim: int, out: list[np.ndarray]) -> list[np.ndarray]:
    op = "aten::unbind_copy.int_out"
    d = wrap_dim(dim, self.ndim, op)
    n = self.shape[d]
    if not isinstance(out, (list, tuple)) or len(out) != n:
        raise bad(op, f"dim {dim} has {n} entries but there are {len(out)} out tensors")
    return [finish(self[(slice(None),) * d + (i,)], o) for i, o in enumerate(out)]


# --------------------------------------------------------------------------- indexing


def _check_index(op: str, idx: np.ndarray, n: int) -> np.ndarray:
    if idx.dtype.kind not in "iu":
        raise bad(op, f"indices must be an integer tensor, got {idx.dtype}")
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise bad(op, f"index out of range for a dim of size {n}")
    return idx


@kernel("aten::index.Tensor_out", dtypes=ALL)
def index_tensor_out(self: np.ndarray, indices: list[np.ndarray | None], out: np.ndarray) -> np.ndarray:
    op = "aten::index.Tensor_out"
    if len(indices) > self.ndim:
        raise bad(op, f"too many indices ({len(indices)}) for a {self.ndim}-d tensor")
    key: list[Any] = []
    for i in indices:
        if i is None:
            key.append(slice(None))
        elif i.dtype == np.bool_ or i.dtype == np.uint8:
            key.append(i.astype(np.bool_, copy=False))
        elif i.dtype.kind in "iu":
            key.append(i)
        else:
            raise bad(op, f"indices must be integer or boolean tensors, got {i.dtype}")
    # The result's size before numpy builds it: the broadcast indices times the dims not indexed.
    shapes: list[tuple[int, ...]] = []
    pos, rest = 0, 1
    for k in key:
        if isinstance(k, np.ndarray):
            shapes.append((int(np.count_nonzero(k)),) if k.dtype == np.bool_ else k.shape)
            pos += k.ndim if k.dtype == np.bool_ else 1
        else:
            rest *= self.shape[pos] if pos < self.ndim else 1
            pos += 1
    if shapes:
        try:
            lead = np.broadcast_shapes(*shapes)
        except ValueError as exc:
            raise bad(op, f"indices of shapes {[tuple(k.shape) for k in key if isinstance(k, np.ndarray)]} "
                          f"do not broadcast") from exc
        check_fits(op, (numel(lead), rest * numel(self.shape[pos:])), out)
    try:
        res = self[tuple(key)]
    except IndexError as exc:
        raise bad(op, str(exc)) from exc
    return finish(res, out)


@kernel("aten::index_select.out", dtypes=ALL)
def index_select_out(self: np.ndarray, dim: int, index: np.ndarray, out: np.ndarray) -> np.ndarray:
    op = "aten::index_select.out"
    if self.ndim == 0:
        return finish(self, out)
    d = wrap_dim(dim, self.ndim, op)
    idx = _check_index(op, index.reshape(-1), self.shape[d])
    check_fits(op, self.shape[:d] + idx.shape + self.shape[d + 1:], out)
    return finish(np.take(self, idx, axis=d), out)


@kernel("aten::gather.out", dtypes=ALL)
def gather_out(
    self: np.ndarray, dim: int, index: np.ndarray, sparse_grad: bool, out: np.ndarray
) -> np.ndarray:
    op = "aten::gather.out"
    if self.ndim == 0:
        return finish(np.broadcast_to(self, index.shape), out)
    d = wrap_dim(dim, self.ndim, op)
    if index.ndim != self.ndim:
        raise bad(op, f"index has {index.ndim} dims but self has {self.ndim}")
    _check_index(op, index, self.shape[d])
    # torch allows index to be smaller than self in the other dims.
    src = self[tuple(slice(None) if i == d else slice(0, index.shape[i]) for i in range(self.ndim))]
    return finish(np.take_along_axis(src, index.astype(np.intp, copy=False), axis=d), out)


@kernel("aten::embedding.out", dtypes=ALL)
def embedding_out(
    weight: np.ndarray,
    indices: np.ndarray,
    padding_idx: int,
    scale_grad_by_freq: bool,
    sparse: bool,
    out: np.ndarray,
) -> np.ndarray:
    if (
        type(out) is np.ndarray
        and indices.dtype.kind == "i"
        and weight.ndim == 2
        and out.dtype == weight.dtype
        and out.shape == indices.shape + weight.shape[1:]
        and indices.size
    ):
        # Fast path: seen as unsigned, negative indices are huge, so one max checks both ends.
        unsigned = indices.view(_UNSIGNED[indices.dtype.itemsize])
        if int(np.maximum.reduce(unsigned, axis=None)) < weight.shape[0]:
            try:
                return weight.take(indices, axis=0, out=out, mode="clip")
            except ValueError:  # a read-only out
                pass
    op = "aten::embedding.out"
    if weight.ndim != 2:
        raise bad(op, f"weight must be 2-d, got shape {tuple(weight.shape)}")
    n = weight.shape[0]
    if indices.dtype.kind not in "iu":
        raise bad(op, f"indices must be an integer tensor, got {indices.dtype}")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise bad(op, f"index out of range for an embedding table of {n} rows")
    o = dest(out, indices.shape + weight.shape[1:], weight.dtype)
    if o is None:
        check_fits(op, indices.shape + weight.shape[1:], out)
    # Indices are checked, so mode="clip" (no clipping happens) avoids numpy's buffered copy.
    return finish(np.take(weight, indices, axis=0, out=o, mode="clip"), out)


@kernel("aten::constant_pad_nd.out", dtypes=ALL)
def constant_pad_nd_out(self: np.ndarray, pad: list[int], value: Any, out: np.ndarray) -> np.ndarray:
    """Pads (or, with negative pads, crops) the last ``len(pad) // 2`` dims, last dim first."""
    op = "aten::constant_pad_nd.out"
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise bad(op, f"pad {pad} must have an even length of at most {2 * self.ndim}")
    shape = list(self.shape)
    src: list[slice] = [slice(None)] * self.ndim
    dst: list[slice] = [slice(None)] * self.ndim
    for k in range(len(pad) // 2):
        d = self.ndim - 1 - k
        left, right = pad[2 * k], pad[2 * k + 1]
        n = self.shape[d]
        new = n + left + right
        if new < 0:
            raise bad(op, f"pad {pad} gives a negative size for dim {d} of size {n}")
        shape[d] = new
        s0, s1 = max(-left, 0), n - max(-right, 0)
        d0 = max(left, 0)
        if s1 <= s0:
            src[d] = slice(0, 0)
            dst[d] = slice(0, 0)
        else:
            src[d] = slice(s0, s1)
            dst[d] = slice(d0, d0 + (s1 - s0))
    tshape = tuple(shape)
    w = dest(out, tshape, self.dtype)
    if w is None or np.may_share_memory(w, self):
        check_fits(op, tshape, out if w is None else self)
        w = np.empty(tshape, self.dtype)
    w.fill(value)
    w[tuple(dst)] = self[tuple(src)]
    return finish(w, out)


@kernel("aten::repeat.out", dtypes=ALL)
def repeat_out(self: np.ndarray, repeats: list[int], out: np.ndarray) -> np.ndarray:
    reps = [int(r) for r in repeats]
    if len(reps) < self.ndim or any(r < 0 for r in reps):
        raise bad("aten::repeat.out", f"repeats {reps} must be >= 0 and cover {self.ndim} dims")
    shape = (1,) * (len(reps) - self.ndim) + self.shape
    check_fits("aten::repeat.out", tuple(s * r for s, r in zip(shape, reps)), out)
    return finish(np.tile(self, reps), out)


@kernel("aten::flip.out", dtypes=ALL)
def flip_out(self: np.ndarray, dims: list[int], out: np.ndarray) -> np.ndarray:
    axes = tuple(wrap_dim(int(d), self.ndim, "aten::flip.out") for d in dims)
    return finish(np.flip(self, axis=axes) if axes and self.ndim else self, out)


@kernel("aten::roll.out", dtypes=ALL)
def roll_out(self: np.ndarray, shifts: list[int], dims: list[int], out: np.ndarray) -> np.ndarray:
    op = "aten::roll.out"
    shifts = [int(s) for s in shifts]
    if not dims:
        if len(shifts) != 1:
            raise bad(op, f"without dims, shifts must have one entry, got {shifts}")
        return finish(np.roll(self.reshape(-1), shifts[0]).reshape(self.shape), out)
    if len(dims) != len(shifts):
        raise bad(op, f"shifts {shifts} and dims {list(dims)} differ in length")
    axes = tuple(wrap_dim(int(d), self.ndim, op) for d in dims)
    return finish(np.roll(self, shifts, axis=axes), out)


@kernel("aten::tril.out", dtypes=ALL)
def tril_out(self: np.ndarray, diagonal: int, out: np.ndarray) -> np.ndarray:
    if self.ndim < 2:
        raise bad("aten::tril.out", "expected a tensor with at least 2 dims")
    return finish(np.tril(self, int(diagonal)), out)


@kernel("aten::triu.out", dtypes=ALL)
def triu_out(self: np.ndarray, diagonal: int, out: np.ndarray) -> np.ndarray:
    if self.ndim < 2:
        raise bad("aten::triu.out", "expected a tensor with at least 2 dims")
    return finish(np.triu(self, int(diagonal)), out)


@kernel("aten::pixel_shuffle.out", dtypes=ALL)
def pixel_shuffle_out(self: np.ndarray, upscale_factor: int, out: np.ndarray) -> np.ndarray:
    op = "aten::pixel_shuffle.out"
    r = int(upscale_factor)
    if self.ndim < 3 or r <= 0 or self.shape[-3] % (r * r):
        raise bad(op, f"cannot pixel-shuffle shape {tuple(self.shape)} by {upscale_factor}")
    *lead, c, h, w = self.shape
    oc = c // (r * r)
    x = self.reshape(*lead, oc, r, r, h, w)
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2)
    return finish(x.transpose(perm).reshape(*lead, oc, h * r, w * r), out)


@kernel("aten::pixel_unshuffle.out", dtypes=ALL)
def pixel_unshuffle_out(self: np.ndarray, downscale_factor: int, out: np.ndarray) -> np.ndarray:
    op = "aten::pixel_unshuffle.out"
    r = int(downscale_factor)
    if self.ndim < 3 or r <= 0 or self.shape[-1] % r or self.shape[-2] % r:
        raise bad(op, f"cannot pixel-unshuffle shape {tuple(self.shape)} by {downscale_factor}")
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3)
    return finish(x.transpose(perm).reshape(*lead, c * r * r, h // r, w // r), out)
