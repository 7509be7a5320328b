"""ONNX operators that compute: each emits layers of coacto.ir.

Every function takes the importer and the node's input values (constants, activations or views,
see coacto.onnx_layout) and returns its output values. ``COMPUTE`` maps op types to them.
"""
from __future__ import annotations

import math

import numpy as np

from . import ir
from .errors import ShapeError
from .onnx_layout import (
    Act, Unsupported, View, axis_index, channel_axis, clip_bounds, reduce_axes, shape_of,
)

# -------------------------------------------------------------------------------------- compute

def _window(imp, sizes, kernel, ceil_mode=False):
    """Strides, dilations, begin/end pads and output sizes of a conv / pool window."""
    d = len(sizes)
    strides = list(imp._attr("strides", [1] * d))
    dil = list(imp._attr("dilations", [1] * d))
    pads = list(imp._attr("pads", [0] * (2 * d)))
    auto = imp._attr("auto_pad", "NOTSET")
    begin, end, out = [], [], []
    for i in range(d):
        n, k, s, dl = sizes[i], kernel[i], strides[i], dil[i]
        eff = (k - 1) * dl + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + eff - n)
            b = total // 2 if auto == "SAME_UPPER" else total - total // 2
            e = total - b
        elif auto == "VALID":
            b = e = 0
            o = (n - eff) // s + 1
        elif auto == "NOTSET":
            b, e = pads[i], pads[i + d]
            span = n + b + e - eff
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= n + b:  # the last window must start inside the input
                    o -= 1
            else:
                o = span // s + 1
        else:
            raise Unsupported(f"auto_pad {auto!r}")
        if o <= 0 or s <= 0 or dl <= 0:
            raise ShapeError(f"window {kernel} (strides {strides}, dilations {dil}) does not fit "
                             f"the input size {sizes}")
        begin.append(b)
        end.append(e)
        out.append(o)
    return strides, dil, begin, end, out


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


def conv_weights(w: np.ndarray, group: int) -> np.ndarray:
    """ONNX conv weights (M, cin_g, kh, kw) -> coacto's (group, kh, kw, cin_g, cout_g), float32."""
    m, cin_g, kh, kw = w.shape
    cout_g = m // group
    t = transpose_last2(np.asarray(w, np.float32).reshape(group, cout_g, cin_g * kh * kw))
    if kh * kw == 1:
        return t.reshape(group, 1, 1, cin_g, cout_g)
    t = t.reshape(group, cin_g, kh * kw, cout_g).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t).reshape(group, kh, kw, cin_g, cout_g)


def _as_2d(vals, fill):
    """Window parameters of 1-D ops as 2-D ones (H = 1)."""
    return [fill] + list(vals) if len(vals) == 1 else list(vals)


def _conv(imp, ins):
    x = ins[0]
    w = np.asarray(imp._const(ins[1], "the weight input W"), dtype=np.float32)
    bias = ins[2] if len(ins) > 2 else None
    if w.ndim not in (3, 4):
        raise Unsupported(f"{w.ndim - 2}-D convolution; coacto runs 1-D and 2-D convolutions")
    extra = (0, 0, 0, 0)
    if isinstance(x, View) and x.pad is not None and w.ndim == 4:
        x, extra = x.pad  # a zero Pad folded into the convolution's padding
    x = imp._act(x)
    if len(x.shape) != w.ndim:
        raise ShapeError(f"input of shape {x.shape} for weights of shape {w.shape}")
    n, c = x.shape[:2]
    sizes = list(x.shape[2:])
    if w.ndim == 4:
        sizes = [sizes[0] + extra[0] + extra[2], sizes[1] + extra[1] + extra[3]]
    m, cin_g = w.shape[:2]
    kernel = list(w.shape[2:])
    if imp._attr("kernel_shape") not in (None, kernel):
        raise ShapeError(f"kernel_shape {imp._attr('kernel_shape')} differs from the weights' "
                         f"{kernel}")
    group = int(imp._attr("group", 1))
    if c != cin_g * group or m % group:
        raise ShapeError(f"{c} input channels, weights {w.shape} and group {group} do not match")
    strides, dil, begin, end, out = _window(imp, sizes, kernel)
    sh, sw = _as_2d(strides, 1)
    dh, dw = _as_2d(dil, 1)
    pt, pl = _as_2d(begin, 0)
    pb, pr = _as_2d(end, 0)
    kh, kw = _as_2d(kernel, 1)
    wt = conv_weights(w.reshape(m, cin_g, kh, kw), group)
    b = np.zeros(m, np.float32) if bias is None else \
        np.asarray(imp._const(bias, "the bias input B"), np.float32).reshape(m)
    attrs = dict(kh=kh, kw=kw, sh=sh, sw=sw, pt=pt + extra[0], pl=pl + extra[1],
                 pb=pb + extra[2], pr=pr + extra[3], dh=dh, dw=dw, group=group,
                 act=ir.ACT_NONE, alpha=0.0, beta=0.0)
    return [imp._emit(imp._node_name(), "CONV", [x.layer], (n, m, *out), attrs,
                      {"w": wt, "b": b.copy()})]


def _fc(imp, a, bmat: np.ndarray, bias, name=None):
    """``a @ bmat + bias`` with constant ``bmat`` (F, O): a CONV whose kernel covers its input."""
    f, o = bmat.shape
    src = None
    if isinstance(a, View) and len(a.srcs) == 1 and a.index.ndim == 2 and (a.index >= 0).all():
        layer = imp.layers[a.srcs[0]]
        ln, lc, lh, lw = layer.shape
        # Flatten of a whole layer in ONNX order: fold the flatten into the weights.
        if a.index.shape == (ln, lc * lh * lw) and \
                np.array_equal(a.index.reshape(-1), np.arange(a.index.size)):
            src = Act(a.srcs[0], layer.onnx_shape)
    if src is None:
        shp = shape_of(a)
        if len(shp) != 2:
            raise Unsupported(f"matrix product of a rank-{len(shp)} input; coacto multiplies "
                              "rank-2 inputs by constant matrices")
        src = imp._act_as(a, shp)
    n, c, h, w = imp.layers[src.layer].shape
    if c * h * w != f:
        raise ShapeError(f"input of {c * h * w} features for a weight matrix of shape {bmat.shape}")
    wt = bmat.reshape(c, h, w, o).transpose(1, 2, 0, 3)[None]
    attrs = dict(kh=h, kw=w, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1, group=1,
                 act=ir.ACT_NONE, alpha=0.0, beta=0.0)
    full_bias = None
    if bias is not None:
        bias = np.asarray(bias, np.float32)
        b2 = bias.reshape((1,) * (2 - bias.ndim) + bias.shape)
        if b2.shape[0] == 1:
            bias, full_bias = np.broadcast_to(b2.reshape(-1), (o,)), None
        else:
            bias, full_bias = None, np.broadcast_to(b2, (n, o))
    b = np.zeros(o, np.float32) if bias is None else np.array(bias, np.float32)
    y = imp._emit(name or imp._node_name(), "CONV", [src.layer], (n, o), attrs,
                  {"w": np.ascontiguousarray(wt, dtype=np.float32), "b": b})
    if full_bias is not None:  # a bias that differs per row: an addition of a constant
        y = _emit_binary_const(imp, y, full_bias, ir.BIN_ADD, False, (n, o),
                               imp._node_name() + "/bias")
    return y


def _gemm(imp, ins):
    if imp._attr("transA", 0):
        raise Unsupported("Gemm with transA=1; coacto multiplies untransposed inputs")
    bmat = np.asarray(imp._const(ins[1], "the matrix input B"), np.float32)
    if bmat.ndim != 2:
        raise ShapeError(f"B of shape {bmat.shape}")
    if imp._attr("transB", 0):
        bmat = transpose_last2(bmat)
    alpha = imp._attr("alpha", 1.0)
    if alpha != 1.0:
        bmat = bmat * np.float32(alpha)
    c = ins[2] if len(ins) > 2 else None
    if c is not None:
        c = np.asarray(imp._const(c, "the bias input C"), np.float64) * imp._attr("beta", 1.0)
    return [_fc(imp, ins[0], bmat, c)]


def _matmul(imp, ins):
    if not isinstance(ins[1], np.ndarray):
        raise Unsupported("MatMul of two computed tensors; coacto multiplies by constant matrices")
    bmat = np.asarray(ins[1], np.float32)
    if bmat.ndim != 2:
        raise Unsupported(f"MatMul by a rank-{bmat.ndim} constant; coacto multiplies by matrices")
    if isinstance(ins[0], np.ndarray):
        raise Unsupported("MatMul of a constant by a computed tensor")
    return [_fc(imp, ins[0], bmat, None)]


def _affine(imp, x: Act, scale, shift, act=ir.ACT_NONE, alpha=0.0, beta=0.0, name=None):
    c = imp.layers[x.layer].shape[1]
    scale = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (c,)).copy()
    shift = np.broadcast_to(np.asarray(shift, np.float32).reshape(-1), (c,)).copy()
    return imp._emit(name or imp._node_name(), "AFFINE", [x.layer], x.shape,
                     dict(act=act, alpha=float(alpha), beta=float(beta)),
                     {"scale": scale, "shift": shift})


def _batch_norm(imp, ins):
    if imp._attr("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    x = imp._act(ins[0])
    params = [np.asarray(imp._const(v, what), np.float64).reshape(-1)
              for v, what in zip(ins[1:5], ("scale", "B", "mean", "var"))]
    c = imp.layers[x.layer].shape[1]
    if any(p.size not in (1, c) for p in params):
        raise Unsupported("BatchNormalization with per-position statistics (spatial=0)")
    gamma, beta, mean, var = params
    scale = gamma / np.sqrt(var + imp._attr("epsilon", 1e-5))
    return [_affine(imp, x, scale, beta - mean * scale)]


def _activation(act, alpha_attr=None, alpha=0.0, beta_attr=None, beta=0.0):
    def run(imp, ins):
        x = imp._act(ins[0])
        a = imp._attr(alpha_attr, alpha) if alpha_attr else alpha
        b = imp._attr(beta_attr, beta) if beta_attr else beta
        return [_affine(imp, x, 1.0, 0.0, act, a, b)]
    return run


def _clip(imp, ins):
    x = imp._act(ins[0])
    lo, hi = clip_bounds(imp, ins)
    if lo == 0.0 and hi == np.inf:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_RELU)]
    return [_affine(imp, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)]


def _prelu(imp, ins):
    slope = np.asarray(imp._const(ins[1], "slope"), np.float32).reshape(-1)
    if slope.size != 1 and not np.all(slope == slope[0]):
        raise Unsupported("PRelu with a slope per channel; coacto supports one slope")
    return [_affine(imp, imp._act(ins[0]), 1.0, 0.0, ir.ACT_LEAKY, float(slope[0]))]


def _min_max(imp, ins):
    """Max / Min of an activation and scalar constants (TF-style ReLU6): a clip."""
    consts = [v for v in ins if isinstance(v, np.ndarray)]
    acts = [v for v in ins if v is not None and not isinstance(v, np.ndarray)]
    if len(acts) != 1 or any(np.asarray(k).size != 1 for k in consts):
        raise Unsupported("Max / Min of computed tensors; coacto supports a tensor and scalars")
    x = imp._act(acts[0])
    bound = [float(np.asarray(k).reshape(())) for k in consts]
    if imp.node.op_type == "Max":
        lo, hi = (max(bound) if bound else -np.inf), np.inf
    else:
        lo, hi = -np.inf, (min(bound) if bound else np.inf)
    if lo == 0.0 and hi == np.inf:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_RELU)]
    return [_affine(imp, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)]


def _neg(imp, ins):
    return [_affine(imp, imp._act(ins[0]), -1.0, 0.0)]


_BIN_KIND = {"Add": ir.BIN_ADD, "Sub": ir.BIN_SUB, "Mul": ir.BIN_MUL, "Div": ir.BIN_DIV}


def _emit_binary_const(imp, x: Act, k, kind, const_first, out_shape, name):
    r = len(out_shape)
    k = np.asarray(k, np.float32)
    k = k.reshape((1,) * (r - k.ndim) + k.shape)
    x = imp._act_as(x, (1,) * (r - len(x.shape)) + tuple(x.shape))
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=int(const_first))
    return imp._emit(name, "BINARY", [x.layer], out_shape, attrs,
                     {"k": np.ascontiguousarray(k.reshape(ir.nchw_shape(k.shape)))})


def _binary_values(imp, a, b, kind, name):
    """``a OP b`` for values of which at least one is computed."""
    out = tuple(np.broadcast_shapes(shape_of(a), shape_of(b)))
    if not 1 <= len(out) <= 4:
        raise Unsupported(f"elementwise operation of rank {len(out)}; coacto computes tensors of "
                          "rank 1 to 4")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        const_first = isinstance(a, np.ndarray)
        k, x = (a, b) if const_first else (b, a)
        x = imp._act(x)
        k = np.asarray(k, np.float64)
        if out == x.shape and k.ndim <= len(out):
            vec = _per_channel(k, len(out))
            if vec is not None and not (kind == ir.BIN_DIV and const_first):
                if kind == ir.BIN_ADD:
                    scale, shift = 1.0, vec
                elif kind == ir.BIN_SUB:
                    scale, shift = (-1.0, vec) if const_first else (1.0, -vec)
                elif kind == ir.BIN_MUL:
                    scale, shift = vec, 0.0
                else:
                    scale, shift = 1.0 / vec, 0.0
                return _affine(imp, x, scale, shift, name=name)
        return _emit_binary_const(imp, x, k, kind, const_first, out, name)
    xa, xb = imp._act(a), imp._act(b)
    r = len(out)
    xa = imp._act_as(xa, (1,) * (r - len(xa.shape)) + xa.shape)
    xb = imp._act_as(xb, (1,) * (r - len(xb.shape)) + xb.shape)
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
    return imp._emit(name, "BINARY", [xa.layer, xb.layer], out, attrs)


def _per_channel(k: np.ndarray, rank: int):
    """The per-channel vector of a constant broadcast over every axis but the channel axis."""
    kp = k.reshape((1,) * (rank - k.ndim) + k.shape)
    ch = channel_axis(rank)
    if all(d == 1 for i, d in enumerate(kp.shape) if i != ch):
        return kp.reshape(-1)
    return None


def _binary(imp, ins):
    with np.errstate(divide="ignore"):
        return [_binary_values(imp, ins[0], ins[1], _BIN_KIND[imp.node.op_type], imp._node_name())]


def _sum(imp, ins):
    vals = [v for v in ins if v is not None]
    name = imp._node_name()
    acc = vals[0]
    for i, v in enumerate(vals[1:]):
        last = i == len(vals) - 2 and imp.node.op_type == "Sum"
        acc = _binary_values(imp, acc, v, ir.BIN_ADD, name if last else f"{name}/add{i}")
    if imp.node.op_type == "Mean" and len(vals) > 1:
        acc = _affine(imp, acc, 1.0 / len(vals), 0.0, name=name)
    return [acc]


def _pow(imp, ins):
    e = np.asarray(imp._const(ins[1], "the exponent"), np.float64).reshape(-1)
    if e.size != 1 or e[0] not in (1.0, 2.0):
        raise Unsupported("Pow with an exponent other than 1 or 2")
    x = imp._act(ins[0])
    if e[0] == 1.0:
        return [x]
    attrs = dict(kind=ir.BIN_MUL, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
    return [imp._emit(imp._node_name(), "BINARY", [x.layer, x.layer], x.shape, attrs)]


def _pool(kind):
    def run(imp, ins):
        x = imp._act(ins[0])
        if len(x.shape) not in (3, 4):
            raise Unsupported(f"pooling of a rank-{len(x.shape)} tensor")
        kernel = list(imp._attr("kernel_shape"))
        if len(kernel) != len(x.shape) - 2:
            raise ShapeError(f"kernel_shape {kernel} for an input of shape {x.shape}")
        if kind == ir.POOL_AVG and imp._attr("dilations", None) not in (None, [1] * len(kernel)):
            raise Unsupported("AveragePool with dilations")
        strides, dil, begin, end, out = _window(imp, list(x.shape[2:]), kernel,
                                                bool(imp._attr("ceil_mode", 0)))
        kh, kw = _as_2d(kernel, 1)
        sh, sw = _as_2d(strides, 1)
        dh, dw = _as_2d(dil, 1)
        pt, pl = _as_2d(begin, 0)
        pb, pr = _as_2d(end, 0)
        attrs = dict(kind=kind, kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr, dh=dh,
                     dw=dw, count_include_pad=int(imp._attr("count_include_pad", 0)))
        return [imp._emit(imp._node_name(), "POOL", [x.layer], (*x.shape[:2], *out), attrs)]
    return run


def _global_pool(kind):
    def run(imp, ins):
        x = imp._act(ins[0])
        if len(x.shape) not in (3, 4):
            raise Unsupported(f"global pooling of a rank-{len(x.shape)} tensor")
        out = x.shape[:2] + (1,) * (len(x.shape) - 2)
        return [imp._emit(imp._node_name(), "GLOBAL_POOL", [x.layer], out, {"kind": kind})]
    return run


def _reduce(kind, total=False):
    def run(imp, ins):
        x = imp._act(ins[0])
        r = len(x.shape)
        axes = set(reduce_axes(imp, ins, r))
        spatial = set(range(2, r))
        ones = {i for i in spatial if x.shape[i] == 1}
        if r < 3 or not axes or (axes | ones) != spatial or not axes <= spatial:
            raise Unsupported(f"reduction over axes {sorted(axes)} of a rank-{r} tensor; coacto "
                              "reduces over all spatial axes ([2, 3])")
        keep = bool(imp._attr("keepdims", 1))
        out = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        y = imp._emit(imp._node_name(), "GLOBAL_POOL", [x.layer], out, {"kind": kind})
        if total:  # ReduceSum: the mean times the number of positions
            y = _affine(imp, y, float(math.prod(x.shape[2:])), 0.0, name=imp._node_name() + "/sum")
        return [y]
    return run


def _lrn(imp, ins):
    x = imp._act(ins[0])
    if len(x.shape) not in (3, 4):
        raise Unsupported(f"LRN of a rank-{len(x.shape)} tensor")
    attrs = dict(size=int(imp._attr("size")), alpha=float(imp._attr("alpha", 1e-4)),
                 beta=float(imp._attr("beta", 0.75)), bias=float(imp._attr("bias", 1.0)))
    return [imp._emit(imp._node_name(), "LRN", [x.layer], x.shape, attrs)]


def _softmax(log):
    def run(imp, ins):
        x = imp._act(ins[0])
        r = len(x.shape)
        axis = axis_index(imp._attr("axis", 1 if imp.opset < 13 else -1), r)
        ch = channel_axis(r)
        # Before opset 13 the input is coerced to 2-D: softmax over every axis from `axis` on.
        reduced = range(axis, r) if imp.opset < 13 else [axis]
        if ch not in reduced or any(x.shape[i] != 1 for i in reduced if i != ch):
            raise Unsupported(f"softmax over axis {axis} of shape {x.shape}; coacto computes "
                              "softmax over the channel axis")
        return [imp._emit(imp._node_name(), "SOFTMAX", [x.layer], x.shape, {"log": int(log)})]
    return run


def _concat(imp, ins):
    vals = [v for v in ins if v is not None]
    r = len(shape_of(vals[0]))
    axis = axis_index(imp._attr("axis", 0), r)
    if axis != channel_axis(r) or r > 4:
        return imp._layout("Concat", ins)
    acts = [imp._act(v) if not isinstance(v, np.ndarray) else v for v in vals]
    if any(isinstance(v, np.ndarray) for v in acts):
        raise Unsupported("concatenation of constants and computed tensors")
    name = imp._node_name()
    while len(acts) > 8:  # the runtime concatenates at most 8 inputs at once
        part = acts[:8]
        c = sum(a.shape[axis] for a in part)
        shape = list(part[0].shape)
        shape[axis] = c
        first = imp._emit(f"{name}/part", "CONCAT", [a.layer for a in part], shape)
        acts = [first] + acts[8:]
    if len(acts) == 1:
        return [acts[0]]
    shape = list(acts[0].shape)
    for a in acts:
        if len(a.shape) != r or any(a.shape[i] != shape[i] for i in range(r) if i != axis):
            raise ShapeError(f"concatenation of shapes {[x.shape for x in acts]}")
    shape[axis] = sum(a.shape[axis] for a in acts)
    return [imp._emit(name, "CONCAT", [a.layer for a in acts], shape)]


COMPUTE = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "BatchNormalization": _batch_norm,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary, "Sum": _sum, "Mean": _sum,
    "Pow": _pow, "Neg": _neg, "Max": _min_max, "Min": _min_max,
    "Relu": _activation(ir.ACT_RELU), "Clip": _clip,
    "LeakyRelu": _activation(ir.ACT_LEAKY, "alpha", 0.01), "PRelu": _prelu,
    "Sigmoid": _activation(ir.ACT_SIGMOID), "Tanh": _activation(ir.ACT_TANH),
    "HardSigmoid": _activation(ir.ACT_HARDSIGMOID, "alpha", 0.2, "beta", 0.5),
    "HardSwish": _activation(ir.ACT_HARDSWISH),
    "MaxPool": _pool(ir.POOL_MAX), "AveragePool": _pool(ir.POOL_AVG),
    "GlobalAveragePool": _global_pool(ir.POOL_AVG), "GlobalMaxPool": _global_pool(ir.POOL_MAX),
    "ReduceMean": _reduce(ir.POOL_AVG), "ReduceMax": _reduce(ir.POOL_MAX),
    "ReduceSum": _reduce(ir.POOL_AVG, total=True),
    "LRN": _lrn, "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "Concat": _concat,
}
