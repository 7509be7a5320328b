"""Matrix products: MatMul, Gemm. A product with a constant matrix is a CONV over the last axis
(``fc``). A product of two activations is a MATMUL that reads its operands through strides from the
layers that hold them: the views in between (Reshape to heads, Transpose, Split of a fused QKV
projection, the transposed keys) cost no copy as long as each operand is an affine map of one
layer's storage, contiguous along the reduced axis (or, for B, along its columns).
"""
from __future__ import annotations

import math

import numpy as np

from ... import ir
from ...errors import ShapeError
from ..registry import op
from ..values import LAST, Unsupported, View, shape_of
from .elementwise import affine, binary_values, emit_binary_const


def transpose_last2(a: np.ndarray) -> np.ndarray:
    """``a`` with its last two axes swapped, contiguous. Copies tile by tile: numpy's own strided
    copy is an order of magnitude slower on weight-sized matrices."""
    *batch, m, k = a.shape
    out = np.empty((*batch, k, m), a.dtype)
    if m * k <= 4096:
        out[...] = np.swapaxes(a, -1, -2)
        return out
    for j in range(0, k, 1024):
        for i in range(0, m, 64):
            out[..., j:j + 1024, i:i + 64] = np.swapaxes(a[..., i:i + 64, j:j + 1024], -1, -2)
    return out


def fc(ctx, a, bmat: np.ndarray, bias):
    """``a @ bmat + bias`` with constant ``bmat`` (F, O): a CONV. Over the last axis of ``a``
    (a 1x1 convolution over its layer's columns), or, for the flatten of a whole layer, with a
    kernel covering that layer (the flatten folds into the weights)."""
    f, o = bmat.shape
    name = ctx.node_name
    conv = dict(sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1, group=1, act=ir.ACT_NONE,
                alpha=0.0, beta=0.0)
    flat = _flatten_of_layer(ctx, a, f)
    if flat is not None:
        src, perm = flat
        n, c, h, w = ctx.layers[src].shape
        wt = np.empty_like(bmat)
        wt[perm] = bmat  # weight rows in the storage order of a batch's block
        b = _bias_vector(bias, o)
        y = ctx.emit(name, "CONV", [src], (n, o), dict(conv, kh=h, kw=w),
                     {"w": np.ascontiguousarray(wt.reshape(1, h, w, c, o)), "b": b})
        n_rows = n
    else:
        shp = shape_of(a)
        x = ctx.act_rows(a)
        if shp[-1] != f:
            raise ShapeError(f"input of {shp[-1]} features for a weight matrix of shape "
                             f"{bmat.shape}")
        b = _bias_vector(bias, o)
        y = ctx.emit_rows(name, "CONV", x, o, shp[:-1] + (o,), dict(conv, kh=1, kw=1),
                          {"w": np.ascontiguousarray(bmat.reshape(1, 1, 1, f, o)), "b": b})
        n_rows = math.prod(shp[:-1])
    if bias is not None and _bias_vector(bias, o, strict=True) is None:
        # a bias that differs per row: an addition of a constant
        full = np.broadcast_to(np.asarray(bias, np.float32), (n_rows, o))
        added = emit_binary_const(ctx, ctx.act_as(y, (n_rows, o)), full, ir.BIN_ADD, False,
                                  (n_rows, o), name + "/bias")
        y = ctx.reshaped(added, y.shape)
    return y


def _bias_vector(bias, o: int, strict: bool = False):
    """The bias per output (zeros without one); strict: None when it differs per row."""
    if bias is None:
        return np.zeros(o, np.float32)
    b = np.asarray(bias, np.float64)
    if b.size == 1 or (b.ndim >= 1 and all(d == 1 for d in b.shape[:-1])):
        return np.broadcast_to(b.reshape(-1), (o,)).astype(np.float32)
    return None if strict else np.zeros(o, np.float32)


def _flatten_of_layer(ctx, a, f: int):
    """(layer, perm) when ``a`` is a rank-2 view holding whole layer blocks per row, one row per
    batch (a Flatten of a CNN feature map): perm[i] is the storage position, within its batch's
    block, of feature i."""
    if not (isinstance(a, View) and len(a.srcs) == 1 and isinstance(a.srcs[0], int)
            and a.index.ndim == 2 and (a.index >= 0).all()):
        return None
    src = a.srcs[0]
    layer = ctx.layers[src]
    n = layer.shape[0]
    block = layer.columns * layer.rows // n
    if a.index.shape != (n, block) or block != f or layer.columns == n:
        return None
    perm = a.index[0]
    if not np.array_equal(a.index, perm[None, :] + np.arange(n)[:, None] * block) or \
            not np.array_equal(np.sort(perm), np.arange(block)):
        return None
    return src, perm


# ------------------------------------------------------------------------------------------- MatMul

def matmul_shape(sa, sb) -> tuple[int, ...]:
    """The output shape of ONNX (numpy) MatMul."""
    a = (1,) + tuple(sa) if len(sa) == 1 else tuple(sa)
    b = tuple(sb) + (1,) if len(sb) == 1 else tuple(sb)
    if a[-1] != b[-2]:
        raise ShapeError(f"MatMul of shapes {tuple(sa)} and {tuple(sb)}")
    out = tuple(np.broadcast_shapes(a[:-2], b[:-2])) + (a[-2], b[-1])
    if len(sa) == 1:
        out = out[:-2] + out[-1:]
    if len(sb) == 1:
        out = out[:-1]
    return out


@op("MatMul")
def _matmul(ctx, ins):
    a, b = ins[0], ins[1]  # not both constants: MatMul folds first
    if isinstance(b, np.ndarray):
        return [_matmul_const_b(ctx, a, b)]
    if isinstance(a, np.ndarray):
        return [_matmul_const_a(ctx, a, b)]
    return [_matmul_acts(ctx, a, b)]


def _matrix(const: np.ndarray, what: str) -> np.ndarray:
    """A constant operand as a matrix (leading axes of size 1 dropped)."""
    m = np.asarray(const, np.float32)
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if m.ndim != 2:
        raise Unsupported(f"MatMul with a batched constant {what} of shape {const.shape}; coacto "
                          "multiplies by one matrix shared by the batch")
    return m


def _matmul_const_b(ctx, a, b):
    """x @ W: a matrix product with weights, over the last axis of x (a CONV)."""
    out = matmul_shape(shape_of(a), np.shape(b))
    w = _matrix(b[:, None] if np.ndim(b) == 1 else b, "B")
    if len(shape_of(a)) == 1:
        a = ctx.reshaped(a, (1,) + shape_of(a))
    y = fc(ctx, a, w, None)
    return y if y.shape == out else ctx.reshaped(y, out)


def _matmul_const_a(ctx, a, b):
    """W @ x = (x^T W^T)^T: the activation's last two axes swapped (a view), a matrix product
    with weights, swapped back (a view)."""
    out = matmul_shape(np.shape(a), shape_of(b))
    w = _matrix(a[None, :] if np.ndim(a) == 1 else a, "A")
    vb = ctx.as_view(b)
    index = vb.index[:, None] if vb.index.ndim == 1 else vb.index
    bt = View(vb.srcs, np.swapaxes(index, -1, -2), vb.fill, vb.name)
    y = ctx.as_view(fc(ctx, bt, np.ascontiguousarray(w.T), None))
    return View(y.srcs, np.swapaxes(y.index, -1, -2).reshape(out), y.fill, y.name)


def fit_strides(index: np.ndarray):
    """(offset, strides) with index[i0, i1, ...] == offset + sum(i_d * strides[d]), strides >= 0
    (0 on axes of size 1), or None when the index array is not such an affine map."""
    if index.size == 0 or index.min() < 0:
        return None
    off = int(index.reshape(-1)[0])
    strides, expected = [], np.full(index.shape, off, dtype=np.int64)
    for axis, size in enumerate(index.shape):
        s = int(index[(0,) * axis + (1,) + (0,) * (index.ndim - 1 - axis)]) - off if size > 1 else 0
        if s < 0:
            return None
        strides.append(s)
        expected = expected + _along(axis, size, index.ndim) * s
    return (off, strides) if np.array_equal(index, expected) else None


def _along(axis: int, size: int, ndim: int) -> np.ndarray:
    """0, 1, ..., size - 1 along ``axis`` of an ``ndim``-D array (size 1 on the others)."""
    return np.arange(size, dtype=np.int64).reshape([size if a == axis else 1 for a in range(ndim)])


def _segments_in_columns(off, strides, dims, seg_axis, rows) -> bool:
    """Whether every run along ``seg_axis`` (stride 1) lies inside one column of the producer:
    the partitioner then maps reads to tiles by row intervals."""
    starts = np.full([d if a != seg_axis else 1 for a, d in enumerate(dims)], off, np.int64)
    for axis, (size, s) in enumerate(zip(dims, strides)):
        if axis == seg_axis or size == 1:
            continue
        starts = starts + _along(axis, size, len(dims)) * s
    return bool(((starts % rows) + dims[seg_axis] <= rows).all())


def _operand(ctx, v, dims4, contiguous):
    """(layer, offset, strides) reading the value v as a (B0, B1, R, C) operand from its layer's
    storage; ``contiguous``: the axes of which one must have stride 1 (2 or 3). Views that are not
    such a strided read of one layer become a layer first."""
    for attempt in range(2):
        view = ctx.as_view(v)
        layer = view.srcs[0] if len(view.srcs) == 1 else None
        if isinstance(layer, int):
            fit = fit_strides(np.broadcast_to(view.index, dims4))
            if fit is not None:
                off, strides = fit
                for axis in contiguous:
                    if dims4[axis] == 1:
                        strides[axis] = 1
                    if strides[axis] == 1 and _segments_in_columns(
                            off, strides, dims4, axis, ctx.layers[layer].rows):
                        return layer, off, strides
        # not a strided read of one layer: copy it into one (row-major) and read that
        v = ctx.act(v, LAST)
    raise AssertionError("a row-major layer is always a strided operand")


def _matmul_acts(ctx, a, b, scale: float = 1.0):
    """MATMUL: a batched product of two activations, times ``scale``."""
    sa, sb = shape_of(a), shape_of(b)
    out = matmul_shape(sa, sb)
    if len(sa) == 1:
        a, sa = ctx.reshaped(a, (1,) + sa), (1,) + sa
    if len(sb) == 1:
        b, sb = ctx.reshaped(b, sb + (1,)), sb + (1,)
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    if len(batch) > 2:
        raise Unsupported(f"MatMul with {len(batch)} batch axes; coacto multiplies with at most 2")
    b0, b1 = (1,) * (2 - len(batch)) + batch
    m, k, n = sa[-2], sa[-1], sb[-1]
    if k == 0:
        raise Unsupported("MatMul over an empty axis")
    la, a_off, a_st = _operand(ctx, a, (b0, b1, m, k), (3,))
    lb, b_off, b_st = _operand(ctx, b, (b0, b1, k, n), (2, 3))
    attrs = dict(batch0=b0, batch1=b1, m=m, n=n, k=k, a_off=a_off, a_s0=a_st[0], a_s1=a_st[1],
                 a_si=a_st[2], b_off=b_off, b_s0=b_st[0], b_s1=b_st[1], b_sk=b_st[2],
                 b_sj=b_st[3], out_mode=0, causal=0, offset=0, has_mask=0, m_off=0, m_s0=0,
                 m_s1=0, m_si=0, m_sj=0, scale=float(scale), fill=0.0)
    y = ctx.emit(ctx.node_name, "MATMUL", [la, lb], batch + (m, n), attrs, layout=LAST)
    return y if y.shape == out else ctx.reshaped(y, out)


# --------------------------------------------------------------------------------------------- Gemm

@op("Gemm")
def _gemm(ctx, ins):
    """alpha * A' B' + beta * C. With constant B: a CONV (weights), C folded into its bias where
    it is one per output. With a computed B (a product of two activations, e.g. of a linear
    layer whose weights come from another branch): a MATMUL scaled by alpha, read through
    strides when transposed (no copy), C added after."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    for v, what in ((a, "A"), (b, "B")):
        if len(shape_of(v)) != 2:
            raise ShapeError(f"Gemm input {what} of shape {shape_of(v)} (must be a matrix)")
    if ctx.attr("transA", 0):
        a = _transposed(ctx, a)
    name = ctx.node_name
    if isinstance(b, np.ndarray):
        bmat = np.asarray(b, np.float32)
        if ctx.attr("transB", 0):
            bmat = transpose_last2(bmat)
        if alpha != 1.0:
            bmat = bmat * np.float32(alpha)
        bias = np.asarray(c, np.float64) * beta if isinstance(c, np.ndarray) else None
        y = fc(ctx, a, bmat, bias)
    else:
        if ctx.attr("transB", 0):
            b = _transposed(ctx, b)
        if isinstance(a, np.ndarray):
            y = _matmul_const_a(ctx, np.asarray(a, np.float32) * np.float32(alpha), b)
        else:
            y = _matmul_acts(ctx, a, b, scale=alpha)
        if isinstance(c, np.ndarray):
            y = binary_values(ctx, y, np.asarray(c, np.float64) * beta, ir.BIN_ADD, name + "/bias")
    if c is not None and not isinstance(c, np.ndarray):
        if beta != 1.0:
            c = affine(ctx, c, beta, 0.0, name=name + "/beta")
        y = binary_values(ctx, y, c, ir.BIN_ADD, name + "/bias")
    return [y]


def _transposed(ctx, v):
    """A matrix value transposed: a view (or the transposed constant)."""
    if isinstance(v, np.ndarray):
        return np.ascontiguousarray(np.asarray(v).T)
    view = ctx.as_view(v)
    return View(view.srcs, np.ascontiguousarray(view.index.T), view.fill, view.name)
