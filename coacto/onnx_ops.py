"""ONNX operators, one function each, for coacto.onnx_import.

Every function takes the importer and the node's input values and returns its output values.

- ``FOLD``: evaluated with numpy when every input is a constant.
- ``LAYOUT``: pure index mappings. They run on constants (folding) and on index arrays (views of
  layers): ``imp.indexing`` tells which, for the one case that differs (the fill of a Pad).
  ``LAYOUT_DATA`` names the inputs that carry data (the others are parameters).
- ``SHAPE_OPS`` / ``PASS_THROUGH``: accept any kind of input.
- ``COMPUTE``: emit layers (coacto.ir).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from . import ir
from .errors import ShapeError

# ---------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Act:
    """An activation: layer ``layer`` seen with ONNX shape ``shape`` (same 4-D storage shape)."""

    layer: int
    shape: tuple[int, ...]


@dataclass(eq=False)
class View:
    """An index mapping of layers: ``index`` has the value's ONNX shape; each entry is a flat
    ONNX-order index into the concatenation of ``srcs``' elements, or -1 for ``fill``."""

    srcs: list[int]
    index: np.ndarray
    fill: float = 0.0
    name: str = ""
    pad: tuple | None = None  # (Act, (pt, pl, pb, pr)) when a zero spatial Pad of a 4-D layer


class Unknown:
    """The value of a node that could not be imported (reported once, at its node)."""


UNKNOWN = Unknown()


class Unsupported(Exception):
    """The node (or this form of it) cannot be run; collected and reported together."""


def shape_of(v) -> tuple[int, ...]:
    if isinstance(v, np.ndarray):
        return tuple(v.shape)
    if isinstance(v, Act):
        return v.shape
    if isinstance(v, View):
        return tuple(v.index.shape)
    raise Unsupported("an input has no known shape")


def _axis(a: int, rank: int) -> int:
    if not -rank <= a < rank:
        raise ShapeError(f"axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _channel_axis(rank: int) -> int:
    return 1 if rank >= 2 else 0


# ------------------------------------------------------------------------------------- constants

def _constant(imp, ins):
    a = imp.attrs
    if "value" in a:
        return [np.asarray(a["value"])]
    if "value_float" in a:
        return [np.array(a["value_float"], dtype=np.float32)]
    if "value_floats" in a:
        return [np.array(a["value_floats"], dtype=np.float32)]
    if "value_int" in a:
        return [np.array(a["value_int"], dtype=np.int64)]
    if "value_ints" in a:
        return [np.array(a["value_ints"], dtype=np.int64)]
    raise Unsupported(f"Constant with {sorted(a)} is not supported")


def _constant_of_shape(imp, ins):
    value = imp.attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(imp._ints(ins[0], "shape"), value[0], dtype=value.dtype)]


def _range(imp, ins):
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins[:3])
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [(start + np.arange(n) * delta).astype(start.dtype)]


def _int_div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        q = np.abs(a) // np.abs(b)
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)
    return np.divide(a, b).astype(a.dtype)


def _elementwise(fn, keep_type=True):
    def run(imp, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        r = fn(*arrays)
        return [r.astype(arrays[0].dtype) if keep_type else r]
    return run


def _variadic(fn):
    def run(imp, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        r = arrays[0]
        for a in arrays[1:]:
            r = fn(r, a)
        return [r.astype(arrays[0].dtype)]
    return run


def _mean_fold(imp, ins):
    arrays = [np.asarray(v) for v in ins if v is not None]
    return [(sum(arrays) / len(arrays)).astype(arrays[0].dtype)]


def _where(imp, ins):
    return [np.where(ins[0], ins[1], ins[2])]


def _clip_fold(imp, ins):
    lo, hi = _clip_bounds(imp, ins)
    return [np.clip(ins[0], lo, hi).astype(ins[0].dtype)]


def _reduce_axes(imp, ins, rank):
    axes = imp._input_or_attr(ins, 1, "axes")
    if axes is None or len(axes) == 0:
        if imp._attr("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    return tuple(sorted(_axis(int(a), rank) for a in axes))


def _reduce_fold(fn):
    def run(imp, ins):
        x = np.asarray(ins[0])
        axes = _reduce_axes(imp, ins, x.ndim)
        if not axes:
            return [x]
        r = fn(x, axis=axes, keepdims=bool(imp._attr("keepdims", 1)))
        return [np.asarray(r).astype(x.dtype)]
    return run


def _cast(imp, ins):
    to = helper.tensor_dtype_to_np_dtype(imp._attr("to"))
    x = ins[0]
    if isinstance(x, np.ndarray):
        return [x.astype(to)]
    if to != np.float32:
        raise Unsupported(f"casts computed data to {to}; coacto computes in float32")
    return [x]


def _identity(imp, ins):
    return [ins[0]]


def _dropout(imp, ins):
    if len(ins) > 2 and ins[2] is not None and bool(np.asarray(imp._const(ins[2], "training_mode"))):
        raise Unsupported("Dropout in training mode")
    return [ins[0]]


def _shape(imp, ins):
    s = shape_of(ins[0])
    start, end = imp._attr("start", 0), imp._attr("end", None)
    return [np.array(s[start:end], dtype=np.int64)]


def _size(imp, ins):
    return [np.array(math.prod(shape_of(ins[0])), dtype=np.int64)]


# ---------------------------------------------------------------------------- layout (index maps)

def _reshape(imp, ins):
    x = ins[0]
    shape = imp._input_or_attr(ins, 1, "shape")
    if shape is None:
        raise Unsupported("Reshape without a shape")
    if not imp._attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(imp, ins):
    x = ins[0]
    a = imp._attr("axis", 1)
    a = a + x.ndim if a < 0 else a  # axis is in [-r, r]
    if not 0 <= a <= x.ndim:
        raise ShapeError(f"Flatten axis {imp._attr('axis')} for rank {x.ndim}")
    return [x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))]


def _transpose(imp, ins):
    perm = imp._attr("perm")
    return [np.transpose(ins[0], perm)]


def _squeeze(imp, ins):
    x = ins[0]
    axes = imp._input_or_attr(ins, 1, "axes")
    if axes is None:
        return [x.reshape([d for d in x.shape if d != 1])]
    axes = tuple(_axis(int(a), x.ndim) for a in axes)
    return [np.squeeze(x, axis=axes)]


def _unsqueeze(imp, ins):
    x = ins[0]
    axes = imp._input_or_attr(ins, 1, "axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(_axis(int(a), rank) for a in axes)))]


def _slice(imp, ins):
    x = ins[0]
    if len(ins) > 1:
        starts, ends = imp._ints(ins[1], "starts"), imp._ints(ins[2], "ends")
        axes = imp._ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = imp._ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    else:
        starts, ends, axes, steps = imp._attr("starts"), imp._attr("ends"), imp._attr("axes"), None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ShapeError("Slice step 0")
        index[_axis(a, x.ndim)] = slice(s, e, st)
    return [x[tuple(index)]]


def _split(imp, ins):
    x = ins[0]
    axis = _axis(imp._attr("axis", 0), x.ndim)
    n_out = len(imp.node.output)
    split = imp._input_or_attr(ins, 1, "split")
    dim = x.shape[axis]
    if split is None:
        n = imp._attr("num_outputs", n_out)
        chunk = -(-dim // n)
        split = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(split) != dim:
        raise ShapeError(f"Split sizes {split} do not add up to {dim}")
    return np.split(x, np.cumsum(split)[:-1].tolist(), axis=axis)


def _concat_arrays(imp, ins):
    arrays = [v for v in ins if v is not None]
    axis = _axis(imp._attr("axis", 0), arrays[0].ndim)
    return [np.concatenate(arrays, axis=axis)]


def _gather(imp, ins):
    x = ins[0]
    idx = np.asarray(imp._const(ins[1], "indices")).astype(np.int64)
    axis = _axis(imp._attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        raise ShapeError(f"Gather index out of range for dimension {x.shape[axis]}")
    return [np.take(x, idx, axis=axis)]


def _expand(imp, ins):
    x = ins[0]
    shape = np.broadcast_shapes(x.shape, tuple(imp._ints(ins[1], "shape")))
    return [np.ascontiguousarray(np.broadcast_to(x, shape))]


def _tile(imp, ins):
    return [np.tile(ins[0], imp._ints(ins[1], "repeats"))]


def _pad(imp, ins):
    x = ins[0]
    mode = imp._attr("mode", "constant")
    if len(ins) > 1 and ins[1] is not None:
        pads = imp._ints(ins[1], "pads")
        value = ins[2] if len(ins) > 2 and ins[2] is not None else None
        value = 0.0 if value is None else float(np.asarray(imp._const(value, "value")).reshape(-1)[0])
        axes = imp._ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
    else:
        pads = imp._attr("pads", imp._attr("paddings"))
        value, axes = float(imp._attr("value", 0.0)), None
    r = x.ndim
    if axes is not None:
        full = [0] * (2 * r)
        for i, a in enumerate(axes):
            a = _axis(a, r)
            full[a], full[a + r] = pads[i], pads[i + len(axes)]
        pads = full
    if len(pads) != 2 * r:
        raise ShapeError(f"Pad has {len(pads)} pads for rank {r}")
    width = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    if mode == "constant":
        y = np.pad(x, width, constant_values=-1 if imp.indexing else value)
    elif mode in ("reflect", "edge", "wrap"):
        y = np.pad(x, width, mode=mode)
    else:
        raise Unsupported(f"Pad mode {mode!r}")
    crop = tuple(slice(max(-pads[i], 0), y.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    imp.last_pad = (mode, pads, value)
    return [y[crop]]


def _depth_to_space(imp, ins):
    x = ins[0]
    bs = imp._attr("blocksize")
    b, c, h, w = x.shape
    if imp._attr("mode", "DCR") == "CRD":
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    return [y.reshape(b, c // (bs * bs), h * bs, w * bs)]


def _space_to_depth(imp, ins):
    x = ins[0]
    bs = imp._attr("blocksize")
    b, c, h, w = x.shape
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).transpose(0, 3, 5, 1, 2, 4)
    return [y.reshape(b, c * bs * bs, h // bs, w // bs)]


_NEAREST = {
    "round_prefer_floor": lambda v: np.ceil(v - 0.5),
    "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _resize(imp, ins):
    """Nearest-neighbour Resize / Upsample: a copy, hence an index mapping."""
    x = ins[0]
    if imp._attr("mode", "nearest") != "nearest":
        raise Unsupported(f"mode {imp._attr('mode')!r}; coacto resizes with mode 'nearest' only")
    r = x.ndim
    scales = sizes = None
    if imp.node.op_type == "Upsample" or imp.opset < 11:
        scales = ins[1] if len(ins) > 1 else np.array(imp._attr("scales"), np.float32)
        scales = np.asarray(imp._const(scales, "scales"), np.float64).reshape(-1)
        ctm, nearest = "asymmetric", "floor"
    else:
        if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size:
            scales = np.asarray(imp._const(ins[2], "scales"), np.float64).reshape(-1)
        elif len(ins) > 3 and ins[3] is not None:
            sizes = imp._ints(ins[3], "sizes")
        else:
            raise Unsupported("Resize without scales or sizes")
        ctm = imp._attr("coordinate_transformation_mode", "half_pixel")
        nearest = imp._attr("nearest_mode", "round_prefer_floor")
        if sizes is not None and imp._attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise Unsupported("keep_aspect_ratio_policy other than 'stretch'")
    axes = [_axis(a, r) for a in imp._attr("axes", list(range(r)))]
    if nearest not in _NEAREST:
        raise Unsupported(f"nearest_mode {nearest!r}")
    for i, a in enumerate(axes):
        n_in = x.shape[a]
        if sizes is not None:
            n_out = sizes[i]
            s = n_out / n_in
        else:
            s = float(scales[i])
            n_out = int(math.floor(n_in * s))
        if n_out == n_in and s == 1.0:
            continue
        o = np.arange(n_out, dtype=np.float64)
        if ctm in ("half_pixel", "pytorch_half_pixel"):
            src = (o + 0.5) / s - 0.5
            if ctm == "pytorch_half_pixel" and n_out == 1:
                src = np.zeros(1)
        elif ctm == "asymmetric":
            src = o / s
        elif ctm == "align_corners":
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(1)
        elif ctm == "tf_half_pixel_for_nn":
            src = (o + 0.5) / s
        else:
            raise Unsupported(f"coordinate_transformation_mode {ctm!r}")
        idx = np.clip(_NEAREST[nearest](src), 0, n_in - 1).astype(np.int64)
        x = np.take(x, idx, axis=a)
    return [x]


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


def _clip_bounds(imp, ins):
    if imp.opset < 11 or len(ins) == 1:
        lo, hi = imp._attr("min", -np.inf), imp._attr("max", np.inf)
    else:
        lo = -np.inf if len(ins) < 2 or ins[1] is None else \
            float(np.asarray(imp._const(ins[1], "min")).reshape(-1)[0])
        hi = np.inf if len(ins) < 3 or ins[2] is None else \
            float(np.asarray(imp._const(ins[2], "max")).reshape(-1)[0])
    f32max = float(np.finfo(np.float32).max)
    lo = -np.inf if lo <= -f32max else float(lo)
    hi = np.inf if hi >= f32max else float(hi)
    return lo, hi


def _activation(act, alpha_attr=None, alpha=0.0, beta_attr=None, beta=0.0):
    def run(imp, ins):
        x = imp._act(ins[0])
        a = imp._attr(alpha_attr, alpha) if alpha_attr else alpha
        b = imp._attr(beta_attr, beta) if beta_attr else beta
        return [_affine(imp, x, 1.0, 0.0, act, a, b)]
    return run


def _clip(imp, ins):
    x = imp._act(ins[0])
    lo, hi = _clip_bounds(imp, ins)
    if lo == 0.0 and hi == np.inf:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_RELU)]
    return [_affine(imp, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)]


def _prelu(imp, ins):
    slope = np.asarray(imp._const(ins[1], "slope"), np.float32).reshape(-1)
    if slope.size != 1 and not np.all(slope == slope[0]):
        raise Unsupported("PRelu with a slope per channel; coacto supports one slope")
    return [_affine(imp, imp._act(ins[0]), 1.0, 0.0, ir.ACT_LEAKY, float(slope[0]))]


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
    ch = _channel_axis(rank)
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
        axes = set(_reduce_axes(imp, ins, r))
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
        axis = _axis(imp._attr("axis", 1 if imp.opset < 13 else -1), r)
        ch = _channel_axis(r)
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
    axis = _axis(imp._attr("axis", 0), r)
    if axis != _channel_axis(r) or r > 4:
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


# ------------------------------------------------------------------------------------------ tables

FOLD = {
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Add": _elementwise(np.add), "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply), "Div": _elementwise(_int_div),
    "Pow": _elementwise(np.power), "Mod": _elementwise(np.mod),
    "Sqrt": _elementwise(np.sqrt), "Neg": _elementwise(np.negative), "Abs": _elementwise(np.abs),
    "Exp": _elementwise(np.exp), "Log": _elementwise(np.log), "Sign": _elementwise(np.sign),
    "Reciprocal": _elementwise(np.reciprocal), "Floor": _elementwise(np.floor),
    "Ceil": _elementwise(np.ceil), "Round": _elementwise(np.round),
    "Relu": _elementwise(lambda x: np.maximum(x, 0)),
    "Sigmoid": _elementwise(lambda x: 1.0 / (1.0 + np.exp(-x))), "Tanh": _elementwise(np.tanh),
    "Clip": _clip_fold,
    "Equal": _elementwise(np.equal, False), "Less": _elementwise(np.less, False),
    "Greater": _elementwise(np.greater, False),
    "LessOrEqual": _elementwise(np.less_equal, False),
    "GreaterOrEqual": _elementwise(np.greater_equal, False),
    "Not": _elementwise(np.logical_not, False), "And": _elementwise(np.logical_and, False),
    "Or": _elementwise(np.logical_or, False), "Xor": _elementwise(np.logical_xor, False),
    "Where": _where,
    "Min": _variadic(np.minimum), "Max": _variadic(np.maximum), "Sum": _variadic(np.add),
    "Mean": _mean_fold,
    "MatMul": _elementwise(np.matmul),
    "ReduceSum": _reduce_fold(np.sum), "ReduceProd": _reduce_fold(np.prod),
    "ReduceMean": _reduce_fold(np.mean), "ReduceMax": _reduce_fold(np.max),
    "ReduceMin": _reduce_fold(np.min),
}

SHAPE_OPS = {"Shape": _shape, "Size": _size}

PASS_THROUGH = {"Identity": _identity, "Dropout": _dropout, "Cast": _cast}

LAYOUT = {
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Slice": _slice, "Split": _split, "Concat": _concat_arrays,
    "Gather": _gather, "Expand": _expand, "Tile": _tile, "Pad": _pad,
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "Resize": _resize, "Upsample": _resize,
}
LAYOUT_DATA = {"Concat": "all"}  # default: input 0 only

COMPUTE = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "BatchNormalization": _batch_norm,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary, "Sum": _sum, "Mean": _sum,
    "Pow": _pow, "Neg": _neg,
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
