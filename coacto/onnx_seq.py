"""ONNX operators of sequence models (transformers): matrix products of two activations, layer
normalisation, embedding lookups, selections, and the unary functions GELU is written with.

Like coacto.onnx_ops, every function takes the importer and the node's input values and returns its
output values; ``COMPUTE_SEQ`` maps op types to them. These ops keep the last ONNX axis as rows
(layout "last", coacto.ir): a (B, S, D) tensor is stored as ONNX lays it out, a column per token.

A matrix product of activations becomes a MATMUL that reads its operands through strides from the
layers that hold them: the views in between (Reshape to heads, Transpose, Split of a fused QKV
projection, the transposed keys) cost no copy as long as each operand is an affine map of one
layer's storage, contiguous along the reduced axis (or, for B, along its columns).
"""
from __future__ import annotations

import numpy as np

from . import ir
from .errors import ShapeError
from .onnx_layout import Unsupported, View, axis_index, shape_of
from .onnx_ops import _affine, _binary_values, _fc, transpose_last2

LAST = ir.LAYOUT_LAST


# ---------------------------------------------------------------------------------------- MatMul

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


def _matmul(imp, ins):
    a, b = ins[0], ins[1]
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [np.matmul(a, b)]
    if isinstance(b, np.ndarray):
        return [_matmul_const_b(imp, a, b)]
    if isinstance(a, np.ndarray):
        return [_matmul_const_a(imp, a, b)]
    return [_matmul_acts(imp, a, b)]


def _matrix(const: np.ndarray, what: str) -> np.ndarray:
    """A constant operand as a matrix (leading axes of size 1 dropped)."""
    m = np.asarray(const, np.float32)
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if m.ndim != 2:
        raise Unsupported(f"MatMul with a batched constant {what} of shape {const.shape}; coacto "
                          "multiplies by one matrix shared by the batch")
    return m


def _matmul_const_b(imp, a, b):
    """x @ W: a matrix product with weights, over the last axis of x (a CONV)."""
    out = matmul_shape(shape_of(a), np.shape(b))
    w = _matrix(b[:, None] if np.ndim(b) == 1 else b, "B")
    if len(shape_of(a)) == 1:
        a = imp._reshaped(a, (1,) + shape_of(a))
    y = _fc(imp, a, w, None)
    return y if y.shape == out else imp._reshaped(y, out)


def _matmul_const_a(imp, a, b):
    """W @ x = (x^T W^T)^T: the activation's last two axes swapped (a view), a matrix product
    with weights, swapped back (a view)."""
    out = matmul_shape(np.shape(a), shape_of(b))
    w = _matrix(a[None, :] if np.ndim(a) == 1 else a, "A")
    vb = imp._as_view(b)
    index = vb.index[:, None] if vb.index.ndim == 1 else vb.index
    bt = View(vb.srcs, np.swapaxes(index, -1, -2), vb.fill, vb.name)
    y = imp._as_view(_fc(imp, bt, np.ascontiguousarray(w.T), None))
    return View(y.srcs, np.swapaxes(y.index, -1, -2).reshape(out), y.fill, y.name)


def fit_strides(index: np.ndarray):
    """(offset, strides) with index[i0, i1, ...] == offset + sum(i_d * strides[d]), strides >= 0
    (0 on axes of size 1), or None when the index array is not such an affine map."""
    if index.size == 0 or index.min() < 0:
        return None
    off = int(index.reshape(-1)[0])
    strides, expected = [], np.full(index.shape, off, dtype=np.int64)
    for axis, size in enumerate(index.shape):
        if size == 1:
            strides.append(0)
            continue
        unit = [0] * index.ndim
        unit[axis] = 1
        s = int(index[tuple(unit)]) - off
        if s < 0:
            return None
        strides.append(s)
        shape = [1] * index.ndim
        shape[axis] = size
        expected = expected + np.arange(size, dtype=np.int64).reshape(shape) * s
    if not np.array_equal(index, expected):
        return None
    return off, strides


def _segments_in_columns(off, strides, dims, seg_axis, rows) -> bool:
    """Whether every run along ``seg_axis`` (stride 1) lies inside one column of the producer:
    the partitioner then maps reads to tiles by row intervals."""
    starts = np.full([d if a != seg_axis else 1 for a, d in enumerate(dims)], off, np.int64)
    for axis, (size, s) in enumerate(zip(dims, strides)):
        if axis == seg_axis or size == 1:
            continue
        shape = [1] * len(dims)
        shape[axis] = size
        starts = starts + np.arange(size, dtype=np.int64).reshape(shape) * s
    return bool(((starts % rows) + dims[seg_axis] <= rows).all())


def _operand(imp, v, dims4, contiguous):
    """(layer, offset, strides) reading the value v as a (B0, B1, R, C) operand from its layer's
    storage; ``contiguous``: the axes of which one must have stride 1 (2 or 3). Views that are not
    such a strided read of one layer become a layer first."""
    for attempt in range(2):
        view = imp._as_view(v)
        layer = view.srcs[0] if len(view.srcs) == 1 else None
        if isinstance(layer, int):
            index = view.index.reshape((1,) * (4 - view.index.ndim) + view.index.shape)
            index = np.broadcast_to(index, dims4)
            fit = fit_strides(index)
            if fit is not None:
                off, strides = fit
                for axis in contiguous:
                    if dims4[axis] == 1:
                        strides[axis] = 1
                    if strides[axis] == 1 and _segments_in_columns(
                            off, strides, dims4, axis, imp.layers[layer].rows):
                        return layer, off, strides
        # not a strided read of one layer: copy it into one (row-major) and read that
        v = imp._act(v, LAST)
    raise AssertionError("a row-major layer is always a strided operand")


def _matmul_acts(imp, a, b, scale: float = 1.0):
    """MATMUL: a batched product of two activations, times ``scale``."""
    sa, sb = shape_of(a), shape_of(b)
    out = matmul_shape(sa, sb)
    if len(sa) == 1:
        a, sa = imp._reshaped(a, (1,) + sa), (1,) + sa
    if len(sb) == 1:
        b, sb = imp._reshaped(b, sb + (1,)), sb + (1,)
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    if len(batch) > 2:
        raise Unsupported(f"MatMul with {len(batch)} batch axes; coacto multiplies with at most 2")
    b0, b1 = (1,) * (2 - len(batch)) + batch
    m, k, n = sa[-2], sa[-1], sb[-1]
    if k == 0:
        raise Unsupported("MatMul over an empty axis")
    la, a_off, a_st = _operand(imp, a, (b0, b1, m, k), (3,))
    lb, b_off, b_st = _operand(imp, b, (b0, b1, k, n), (2, 3))
    attrs = dict(batch0=b0, batch1=b1, m=m, n=n, k=k, a_off=a_off, a_s0=a_st[0], a_s1=a_st[1],
                 a_si=a_st[2], b_off=b_off, b_s0=b_st[0], b_s1=b_st[1], b_sk=b_st[2],
                 b_sj=b_st[3], out_mode=0, causal=0, offset=0, has_mask=0, m_off=0, m_s0=0,
                 m_s1=0, m_si=0, m_sj=0, scale=float(scale), fill=0.0)
    y = imp._emit(imp._node_name(), "MATMUL", [la, lb], batch + (m, n), attrs, layout=LAST)
    return y if y.shape == out else imp._reshaped(y, out)


# ------------------------------------------------------------------------------- normalisation

def _layer_norm(imp, ins):
    x = ins[0]
    shp = shape_of(x)
    r = len(shp)
    axis = axis_index(imp._attr("axis", -1), r)
    if any(shp[i] != 1 for i in range(axis, r - 1)):
        raise Unsupported(f"LayerNormalization over axes {list(range(axis, r))} of shape {shp}; "
                          "coacto normalises over the last axis")
    d = shp[-1]
    scale = np.asarray(imp._const(ins[1], "the scale input"), np.float32).reshape(-1)
    bias = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(1, np.float32)
    bias = np.asarray(imp._const(bias, "the bias input B"), np.float32).reshape(-1)
    if scale.size not in (1, d) or bias.size not in (1, d):
        raise ShapeError(f"scale of {scale.size} and bias of {bias.size} values for {d} features")
    xr = imp._act_rows(x)
    weights = {"scale": np.broadcast_to(scale, (d,)).copy(),
               "shift": np.broadcast_to(bias, (d,)).copy()}
    return [imp._emit_rows(imp._node_name(), "LAYERNORM", xr, d, shp,
                           {"eps": float(imp._attr("epsilon", 1e-5))}, weights)]


# ------------------------------------------------------------------------------------ embedding

def _gather(imp, ins):
    """Gather: rows of a constant table picked by computed ids is an embedding (EMBED); anything
    with constant indices is an index mapping."""
    data, ids = ins[0], ins[1]
    if isinstance(data, np.ndarray) and not isinstance(ids, np.ndarray):
        return [_embed(imp, data, ids)]
    return imp._layout("Gather", ins)


def _embed(imp, table, ids):
    if axis_index(imp._attr("axis", 0), max(table.ndim, 1)) != 0:
        raise Unsupported("Gather of a constant along an axis other than 0 by computed indices")
    if not imp._is_integer(ids):
        raise Unsupported("Gather by indices computed from float data; coacto looks up ids given "
                          "as integer inputs")
    v = table.shape[0]
    if not 1 <= v <= 1 << 24:
        raise Unsupported(f"an embedding table of {v} rows; coacto carries ids as float32 "
                          "(exact up to 2^24 rows)")
    tbl = np.ascontiguousarray(np.asarray(table, np.float32).reshape(v, -1))
    ids_shape = shape_of(ids)
    out = tuple(ids_shape) + tuple(table.shape[1:])
    if not 1 <= len(out) <= 4:
        raise Unsupported(f"an embedding lookup of rank {len(out)}; coacto computes tensors of "
                          "rank 1 to 4")
    x = imp._resolve(ids)
    if len(x.shape) > 2 and imp._layout_of(x) != LAST:
        x = imp._act(x, LAST)  # one id per output column, in row-major order
    _note_index_limit(imp, x.layer, v)
    rows = tbl.shape[1]
    shape = out if table.ndim == 2 else tuple(ids_shape) + (1,)
    y = imp._emit(imp._node_name(), "EMBED", [x.layer], shape, {}, {"table": tbl}, layout=LAST)
    return y if y.shape == out and rows == y.shape[-1] else imp._reshaped(y, out)


def _note_index_limit(imp, layer: int, v: int) -> None:
    """Tells the integer inputs the ids come from the table size, for the runtime's check."""
    todo = [layer]
    while todo:
        li = todo.pop()
        lay = imp.layers[li]
        if lay.op == "INPUT":
            lay.attrs["index_limit"] = min(int(lay.attrs.get("index_limit", v)), int(v))
        elif lay.op == "GATHER":
            todo.extend(lay.inputs)


# ------------------------------------------------------------------------------------ selection

def _where(imp, ins):
    cond, x, y = ins[0], ins[1], ins[2]
    out = tuple(np.broadcast_shapes(*(shape_of(v) for v in (cond, x, y))))
    if not 1 <= len(out) <= 4:
        raise Unsupported(f"Where of rank {len(out)}; coacto computes tensors of rank 1 to 4")
    if isinstance(cond, np.ndarray):
        c = np.asarray(cond).astype(bool)
        for pick, v in ((c.all(), x), ((~c).all(), y)):
            if pick and shape_of(v) == out and not isinstance(v, np.ndarray):
                return [v]
    vals = [cond, x, y]
    first = next(v for v in vals if not isinstance(v, np.ndarray))
    lay = imp._layout_of(imp._resolve(first))
    r = len(out)
    which, inputs, weights = 0, [], {}
    for o, (key, v) in enumerate(zip(("cond", "x", "y"), vals)):
        if isinstance(v, np.ndarray):
            k = np.asarray(v).astype(np.float32)
            k = k.reshape((1,) * (r - k.ndim) + k.shape)
            weights[key] = np.ascontiguousarray(ir.internal_array(k, lay))
        else:
            a = imp._act_as(v, (1,) * (r - len(shape_of(v))) + tuple(shape_of(v)), lay)
            which |= 1 << o
            inputs.append(a.layer)
    res = imp._emit(imp._node_name(), "WHERE", inputs, out, {"operands": which}, weights,
                    layout=lay)
    if all(imp._is_integer(v) if not isinstance(v, np.ndarray) else
           np.array_equal(v, np.round(v)) for v in (x, y)):
        imp.kinds[res.layer] = "int"
    return [res]


# ---------------------------------------------------------------------------------------- unary

def _unary(act, kind=None):
    def run(imp, ins):
        y = _affine(imp, ins[0], 1.0, 0.0, act)
        if kind:  # y may be a view of the layer computed (see onnx_ops._through_view)
            for li in (y.srcs if isinstance(y, View) else [y.layer]):
                imp.kinds[li] = kind
        return [y]
    return run


def _gelu(imp, ins):
    approx = imp._attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approx!r}")
    act = ir.ACT_GELU_TANH if approx == "tanh" else ir.ACT_GELU
    return [_affine(imp, ins[0], 1.0, 0.0, act)]


def _not(imp, ins):
    y = _affine(imp, imp._as_bool(imp._resolve(ins[0])), -1.0, 1.0)
    imp.kinds[y.layer] = "bool"
    return [y]


# ------------------------------------------------------------------------------------------ Gemm
# Here rather than with the other layers of weights (onnx_ops) because a Gemm whose B is computed
# is a product of two activations, which this module builds.

def _gemm(imp, ins):
    """alpha * A' B' + beta * C. With constant B: a CONV (weights), C folded into its bias where
    it is one per output. With a computed B (a product of two activations, e.g. of a linear
    layer whose weights come from another branch): a MATMUL scaled by alpha, read through
    strides when transposed (no copy), C added after."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = float(imp._attr("alpha", 1.0)), float(imp._attr("beta", 1.0))
    for v, what in ((a, "A"), (b, "B")):
        if len(shape_of(v)) != 2:
            raise ShapeError(f"Gemm input {what} of shape {shape_of(v)} (must be a matrix)")
    if imp._attr("transA", 0):
        a = _transposed(imp, a)
    name = imp._node_name()
    if isinstance(b, np.ndarray):
        bmat = np.asarray(b, np.float32)
        if imp._attr("transB", 0):
            bmat = transpose_last2(bmat)
        if alpha != 1.0:
            bmat = bmat * np.float32(alpha)
        bias = np.asarray(c, np.float64) * beta if isinstance(c, np.ndarray) else None
        y = _fc(imp, a, bmat, bias)
    else:
        if imp._attr("transB", 0):
            b = _transposed(imp, b)
        if isinstance(a, np.ndarray):
            y = _matmul_const_a(imp, np.asarray(a, np.float32) * np.float32(alpha), b)
        else:
            y = _matmul_acts(imp, a, b, scale=alpha)
        if isinstance(c, np.ndarray):
            y = _binary_values(imp, y, np.asarray(c, np.float64) * beta, ir.BIN_ADD,
                               name + "/bias")
    if c is not None and not isinstance(c, np.ndarray):
        if beta != 1.0:
            c = _affine(imp, c, beta, 0.0, name=name + "/beta")
        y = _binary_values(imp, y, c, ir.BIN_ADD, name + "/bias")
    return [y]


def _transposed(imp, v):
    """A matrix value transposed: a view (or the transposed constant)."""
    if isinstance(v, np.ndarray):
        return np.ascontiguousarray(np.asarray(v).T)
    view = imp._as_view(v)
    return View(view.srcs, np.ascontiguousarray(view.index.T), view.fill, view.name)


COMPUTE_SEQ = {
    "MatMul": _matmul, "Gemm": _gemm, "LayerNormalization": _layer_norm, "Gather": _gather, "Where": _where,
    "Erf": _unary(ir.ACT_ERF), "Gelu": _gelu, "Sqrt": _unary(ir.ACT_SQRT),
    "Reciprocal": _unary(ir.ACT_RECIPROCAL), "Exp": _unary(ir.ACT_EXP),
    "IsNaN": _unary(ir.ACT_ISNAN, "bool"), "Not": _not,
}
