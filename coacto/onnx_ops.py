"""ONNX operators that compute: each emits layers of coacto.ir.

Every function takes the importer and the node's input values (constants, activations or views,
see coacto.onnx_layout) and returns its output values. ``COMPUTE`` maps op types to them; the
operators of sequence models are in coacto.onnx_seq.

Convolution-family ops read and write the channels layout; elementwise ops follow their input's
layout; matrix products with weights reduce over the last axis (see coacto.ir).
"""
from __future__ import annotations

import math

import numpy as np

from . import ir
from .errors import ShapeError
from .onnx_layout import (
    Act, Unsupported, View, axis_index, clip_bounds, reduce_axes, shape_of,
)

LAST, CHANNELS = ir.LAYOUT_LAST, ir.LAYOUT_CHANNELS


def row_axis(rank: int, layout: str) -> int:
    """The ONNX axis a layout stores as rows."""
    if rank <= 1:
        return 0
    return rank - 1 if layout == LAST else 1

# -------------------------------------------------------------------------------------- compute

def _window(imp, sizes, kernel, ceil_mode=False):
    """Strides, dilations, begin/end pads and output sizes of a conv / pool window."""
    d = len(sizes)
    strides = list(imp._attr("strides", [1] * d))
    dil = list(imp._attr("dilations", [1] * d))
    pads = list(imp._attr("pads", [0] * (2 * d)))
    auto = imp._attr("auto_pad", "NOTSET")
    _check_window(kernel, strides, dil, pads, d)
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


def _check_window(kernel, strides, dil, pads, d: int) -> None:
    """Refuses window attributes the runtime cannot compute with, naming the one at fault: at
    import, not at run time."""
    for what, vals, n, lo in (("kernel_shape", kernel, d, 1), ("strides", strides, d, 1),
                              ("dilations", dil, d, 1), ("pads", pads, 2 * d, 0)):
        if not isinstance(vals, (list, tuple)) or len(vals) != n or \
                not all(isinstance(v, (int, np.integer)) for v in vals):
            raise ShapeError(f"{what} {vals!r}: expected {n} integers for a {d}-D window")
        bad = [int(v) for v in vals if v < lo]
        if bad:
            noun = "pads must not be negative" if what == "pads" else f"{what} must be at least 1"
            raise ShapeError(f"{what} {list(vals)}: {noun}")
        if max(vals, default=0) > ir.MAX_TENSOR_ELEMENTS:
            raise ShapeError(f"{what} {list(vals)}: a value beyond coacto's size limit "
                             f"{ir.MAX_TENSOR_ELEMENTS}")


def _check_taps(n: int, out, kernel) -> None:
    """The partitioner lists every window tap of every output position: bound their number."""
    taps = n * math.prod(out) * math.prod(kernel)
    if taps > ir.MAX_TENSOR_ELEMENTS:
        raise ShapeError(f"its windows ({kernel} over an output of {list(out)}, batch {n}) read "
                         f"{taps} input positions, more than coacto's limit of "
                         f"{ir.MAX_TENSOR_ELEMENTS} (coacto.ir.MAX_TENSOR_ELEMENTS)")


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
    x = imp._act(x, CHANNELS)
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
    if group < 1:
        raise ShapeError(f"group {group} (must be at least 1)")
    if c != cin_g * group or m % group:
        raise ShapeError(f"{c} input channels, weights {w.shape} and group {group} do not match")
    strides, dil, begin, end, out = _window(imp, sizes, kernel)
    _check_taps(n, out, kernel)
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


def _conv_transpose(imp, ins):
    """ConvTranspose (2-D, group 1, dilations 1) as what it equals: the input with stride - 1
    zeros between its values and k - 1 - pad zeros around them (one GATHER, a view of the
    input), then a stride-1 Conv with the kernel flipped and its in / out axes swapped. Exact;
    the Conv multiplies the inserted zeros too, stride^2 times the transposed convolution's
    work (4x at stride 2), which a dedicated op would save."""
    x = imp._resolve(ins[0])
    w = np.asarray(imp._const(ins[1], "the weight input W"), dtype=np.float32)
    if w.ndim != 4 or len(x.shape) != 4:
        raise Unsupported(f"{w.ndim - 2}-D ConvTranspose; coacto runs 2-D ones")
    if int(imp._attr("group", 1)) != 1:
        raise Unsupported("ConvTranspose with groups")
    if imp._attr("dilations", [1, 1]) != [1, 1]:
        raise Unsupported("ConvTranspose with dilations")
    if imp._attr("auto_pad", "NOTSET") != "NOTSET" or imp._attr("output_shape") is not None:
        raise Unsupported("ConvTranspose with auto_pad or output_shape; give pads instead")
    n, c, h, wd = x.shape
    cin, m, kh, kw = w.shape
    if c != cin:
        raise ShapeError(f"input of {c} channels for weights of shape {w.shape}")
    strides = list(imp._attr("strides", [1, 1]))
    pads = list(imp._attr("pads", [0, 0, 0, 0]))
    extra = list(imp._attr("output_padding", [0, 0]))
    _check_window([kh, kw], strides, [1, 1], pads, 2)
    if len(extra) != 2 or any(not 0 <= e < max(s, 1) for e, s in zip(extra, strides)):
        raise ShapeError(f"output_padding {extra} (each must be below its stride {strides})")
    maps = []
    for size, k, s, pb, pe, e in ((h, kh, strides[0], pads[0], pads[2], extra[0]),
                                  (wd, kw, strides[1], pads[1], pads[3], extra[1])):
        out = (size - 1) * s + k - pb - pe + e
        if out <= 0:
            raise ShapeError(f"ConvTranspose output size {out} from input size {size}")
        # position p of the zero-stuffed, padded input holds input (p - (k - 1 - pb)) / s
        q = np.arange(out + k - 1) - (k - 1 - pb)
        maps.append(np.where((q >= 0) & (q % s == 0) & (q // s < size), q // s, -1))
    _check_taps(n, [len(maps[0]) - kh + 1, len(maps[1]) - kw + 1], [kh, kw])
    view = imp._as_view(x)
    if (view.index < 0).any() and view.fill != 0.0:
        view = imp._as_view(imp._materialize(view))
    rows, cols = maps
    index = view.index[:, :, np.maximum(rows, 0)][:, :, :, np.maximum(cols, 0)]
    index = np.where((rows[:, None] >= 0) & (cols[None, :] >= 0), index, -1)
    stuffed = imp._act(View(view.srcs, np.ascontiguousarray(index), 0.0,
                            imp._node_name() + "/stuffed"), CHANNELS)
    wc = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    b = np.zeros(m, np.float32) if len(ins) < 3 or ins[2] is None else \
        np.asarray(imp._const(ins[2], "the bias input B"), np.float32).reshape(m)
    attrs = dict(kh=kh, kw=kw, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1, group=1,
                 act=ir.ACT_NONE, alpha=0.0, beta=0.0)
    out = (n, m, len(rows) - kh + 1, len(cols) - kw + 1)
    return [imp._emit(imp._node_name(), "CONV", [stuffed.layer], out, attrs,
                      {"w": conv_weights(wc, 1), "b": b.copy()})]


def _fc(imp, a, bmat: np.ndarray, bias, name=None):
    """``a @ bmat + bias`` with constant ``bmat`` (F, O): a CONV. Over the last axis of ``a``
    (a 1x1 convolution over its layer's columns), or, for the flatten of a whole layer, with a
    kernel covering that layer (the flatten folds into the weights)."""
    f, o = bmat.shape
    name = name or imp._node_name()
    conv = dict(sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1, group=1, act=ir.ACT_NONE,
                alpha=0.0, beta=0.0)
    y = None
    flat = _flatten_of_layer(imp, a, f)
    if flat is not None:
        src, perm = flat
        n, c, h, w = imp.layers[src].shape
        wt = np.empty_like(bmat)
        wt[perm] = bmat  # weight rows in the storage order of a batch's block
        b = _bias_vector(bias, o)
        y = imp._emit(name, "CONV", [src], (n, o), dict(conv, kh=h, kw=w),
                      {"w": np.ascontiguousarray(wt.reshape(1, h, w, c, o)), "b": b})
        n_rows = n
    else:
        shp = shape_of(a)
        if len(shp) < 1:
            raise Unsupported("matrix product of a scalar")
        x = imp._act_rows(a)
        if shp[-1] != f:
            raise ShapeError(f"input of {shp[-1]} features for a weight matrix of shape "
                             f"{bmat.shape}")
        b = _bias_vector(bias, o)
        y = imp._emit_rows(name, "CONV", x, o, shp[:-1] + (o,), dict(conv, kh=1, kw=1),
                           {"w": np.ascontiguousarray(bmat.reshape(1, 1, 1, f, o)), "b": b})
        n_rows = math.prod(shp[:-1])
    if bias is not None and _bias_vector(bias, o, strict=True) is None:
        # a bias that differs per row: an addition of a constant
        full = np.broadcast_to(np.asarray(bias, np.float32), (n_rows, o))
        shape = y.shape
        y = _emit_binary_const(imp, imp._act_as(y, (n_rows, o)), full, ir.BIN_ADD, False,
                               (n_rows, o), imp._node_name() + "/bias")
        y = imp._reshaped(y, shape)
    return y


def _bias_vector(bias, o: int, strict: bool = False):
    """The bias as one value per output (zeros without one); None (strict) when it differs per
    row, i.e. is not broadcast over the leading axes."""
    if bias is None:
        return np.zeros(o, np.float32)
    b = np.asarray(bias, np.float64)
    if b.size == 1 or (b.ndim >= 1 and all(d == 1 for d in b.shape[:-1])):
        return np.broadcast_to(b.reshape(-1), (o,)).astype(np.float32)
    return None if strict else np.zeros(o, np.float32)


def _flatten_of_layer(imp, a, f: int):
    """(layer, perm) when ``a`` is a rank-2 view holding whole layer blocks per row, one row per
    batch (a Flatten of a CNN feature map): perm[i] is the storage position, within its batch's
    block, of feature i."""
    if not (isinstance(a, View) and len(a.srcs) == 1 and isinstance(a.srcs[0], int)
            and a.index.ndim == 2 and (a.index >= 0).all()):
        return None
    src = a.srcs[0]
    layer = imp.layers[src]
    n = layer.shape[0]
    block = layer.columns * layer.rows // n
    if a.index.shape != (n, block) or block != f or layer.columns == n:
        return None
    perm = a.index[0]
    if not np.array_equal(a.index, perm[None, :] + np.arange(n)[:, None] * block) or \
            not np.array_equal(np.sort(perm), np.arange(block)):
        return None
    return src, perm


def _affine(imp, x, scale, shift, act=ir.ACT_NONE, alpha=0.0, beta=0.0, name=None):
    """``act(x * scale + shift)``: scalars apply to any activation as it is stored; vectors are
    per row (the channels of a CNN, the last axis of a sequence)."""
    scale = np.asarray(scale, np.float64).reshape(-1)
    shift = np.asarray(shift, np.float64).reshape(-1)
    attrs = dict(act=act, alpha=float(alpha), beta=float(beta))
    name = name or imp._node_name()
    if scale.size == 1 and shift.size == 1:
        pushed = _through_view(imp, x, name, attrs, scale[0], shift[0])
        if pushed is not None:
            return pushed
        x = imp._resolve(x)
        c = imp.layers[x.layer].rows
        return imp._emit_like(name, "AFFINE", x, attrs,
                              {"scale": np.full(c, scale[0], np.float32),
                               "shift": np.full(c, shift[0], np.float32)})
    x = _per_row_input(imp, x)
    c = imp.layers[x.layer].rows
    weights = {"scale": np.broadcast_to(scale, (c,)).astype(np.float32),
               "shift": np.broadcast_to(shift, (c,)).astype(np.float32)}
    return imp._emit_rows(name, "AFFINE", x, c, x.shape, attrs, weights)


def _through_view(imp, v, name, attrs, scale, shift):
    """A scalar affine of a view (the queries of attention scaled after their head split) as the
    same view of the scaled source: no copy, and the scale can fold into the source's producer.
    Only when the view covers most of its source (the work stays about the same)."""
    if not (isinstance(v, View) and len(v.srcs) == 1 and isinstance(v.srcs[0], int)
            and v.index.size and v.index.min() >= 0):
        return None
    src = imp.layers[v.srcs[0]]
    if 2 * v.index.size < src.columns * src.rows:
        return None
    c = src.rows
    y = imp._emit_like(name, "AFFINE", Act(v.srcs[0], src.onnx_shape, src.layout), attrs,
                       {"scale": np.full(c, scale, np.float32),
                        "shift": np.full(c, shift, np.float32)})
    return View([y.layer], v.index, v.fill, v.name)


def _per_row_input(imp, x):
    """x as an input whose rows are its row axis: channels (axis 1) in the channels layout, the
    last axis otherwise."""
    x = imp._resolve(x)
    if len(x.shape) > 2 and imp._layout_of(x) == CHANNELS:
        return imp._act(x, CHANNELS)
    return imp._act_rows(x)


def _batch_norm(imp, ins):
    if imp._attr("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    x = imp._act(ins[0], CHANNELS)
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
        x = ins[0]
        if isinstance(x, np.ndarray):
            raise Unsupported("its data input is a constant; coacto computes on inputs")
        a = imp._attr(alpha_attr, alpha) if alpha_attr else alpha
        b = imp._attr(beta_attr, beta) if beta_attr else beta
        return [_affine(imp, x, 1.0, 0.0, act, a, b)]
    return run


def _integer_preserving(act):
    """Abs, Floor, Ceil, Round, Sign: of integers they give integers, so a result of an integer
    input stays one (casts of it to integer types remain the identity)."""
    def run(imp, ins):
        x = ins[0]
        integer = imp._is_integer(x)
        y = _activation(act)(imp, ins)
        if integer:
            for li in (y[0].srcs if isinstance(y[0], View) else [y[0].layer]):
                imp.kinds[li] = "int"
        return y
    return run


def _celu(imp, ins):
    if imp._attr("alpha", 1.0) == 0.0:
        raise ShapeError("Celu with alpha 0 (it divides by alpha)")
    return _activation(ir.ACT_CELU, "alpha", 1.0)(imp, ins)


def _clip(imp, ins):
    x = ins[0]
    lo, hi = clip_bounds(imp, ins)
    if lo == 0.0 and hi == np.inf:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_RELU)]
    return [_affine(imp, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)]


def _prelu(imp, ins):
    slope = np.asarray(imp._const(ins[1], "slope"), np.float32).reshape(-1)
    if slope.size != 1 and not np.all(slope == slope[0]):
        raise Unsupported("PRelu with a slope per channel; coacto supports one slope")
    return [_affine(imp, ins[0], 1.0, 0.0, ir.ACT_LEAKY, float(slope[0]))]


def _min_max(imp, ins):
    """Max / Min of an activation and scalar constants (TF-style ReLU6): a clip."""
    consts = [v for v in ins if isinstance(v, np.ndarray)]
    acts = [v for v in ins if v is not None and not isinstance(v, np.ndarray)]
    kind = ir.BIN_MAX if imp.node.op_type == "Max" else ir.BIN_MIN
    if len(acts) != 1 or any(np.asarray(k).size != 1 for k in consts):
        vals = [v for v in ins if v is not None]
        acc = vals[0]
        for i, v in enumerate(vals[1:]):
            last = i == len(vals) - 2
            acc = _binary_values(imp, acc, v, kind,
                                 imp._node_name() if last else f"{imp._node_name()}/{i}")
        return [acc]
    x = imp._resolve(acts[0])
    bound = [float(np.asarray(k).reshape(())) for k in consts]
    if imp.node.op_type == "Max":
        lo, hi = (max(bound) if bound else -np.inf), np.inf
    else:
        lo, hi = -np.inf, (min(bound) if bound else np.inf)
    if lo == 0.0 and hi == np.inf:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_RELU)]
    return [_affine(imp, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)]


def _neg(imp, ins):
    return [_affine(imp, ins[0], -1.0, 0.0)]


_BIN_KIND = {"Add": ir.BIN_ADD, "Sub": ir.BIN_SUB, "Mul": ir.BIN_MUL, "Div": ir.BIN_DIV,
             "Equal": ir.BIN_EQUAL, "Less": ir.BIN_LESS, "Greater": ir.BIN_GREATER,
             "GreaterOrEqual": ir.BIN_GREATER_EQUAL, "LessOrEqual": ir.BIN_LESS_EQUAL,
             "Pow": ir.BIN_POW}
#: Kinds whose result is 1.0 / 0.0.
_COMPARISONS = (ir.BIN_EQUAL, ir.BIN_LESS, ir.BIN_GREATER, ir.BIN_GREATER_EQUAL,
                ir.BIN_LESS_EQUAL)


def _emit_binary_const(imp, x, k, kind, const_first, out_shape, name):
    r = len(out_shape)
    k = np.asarray(k, np.float32)
    k = k.reshape((1,) * (r - k.ndim) + k.shape)
    x = imp._resolve(x)
    lay = imp._layout_of(x)
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=int(const_first))
    if k.size == 1 and tuple(out_shape) == tuple(x.shape):  # a scalar: any storage will do
        return imp._emit_like(name, "BINARY", x, attrs, {"k": k.reshape(1, 1, 1, 1)})
    x = imp._act_as(x, (1,) * (r - len(x.shape)) + tuple(x.shape), lay)
    return imp._emit(name, "BINARY", [x.layer], out_shape, attrs,
                     {"k": np.ascontiguousarray(ir.internal_array(k, lay))}, layout=lay)


def _binary_values(imp, a, b, kind, name):
    """``a OP b`` for values of which at least one is computed."""
    out = tuple(np.broadcast_shapes(shape_of(a), shape_of(b)))
    if not 1 <= len(out) <= 4:
        raise Unsupported(f"elementwise operation of rank {len(out)}; coacto computes tensors of "
                          "rank 1 to 4")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        const_first = isinstance(a, np.ndarray)
        k, x = (a, b) if const_first else (b, a)
        k = np.asarray(k, np.float64)
        if k.size == 1 and out == shape_of(x) and kind <= ir.BIN_DIV and \
                not (kind == ir.BIN_DIV and const_first):  # a scalar: an affine of any storage
            v = float(k.reshape(-1)[0])
            scale, shift = {ir.BIN_ADD: (1.0, v), ir.BIN_SUB: (-1.0, v) if const_first else
                            (1.0, -v), ir.BIN_MUL: (v, 0.0), ir.BIN_DIV: (np.float64(1.0) / np.float64(v), 0.0)}[kind]
            return _affine(imp, x, scale, shift, name=name)
        x = imp._resolve(x)
        if out == x.shape and k.ndim <= len(out) and kind <= ir.BIN_DIV:
            vec = _per_row(k, len(out), row_axis(len(out), imp._layout_of(x)))
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
        y = _emit_binary_const(imp, x, k, kind, const_first, out, name)
    else:
        y = _binary_acts(imp, a, b, kind, out, name)
    if kind in _COMPARISONS:
        imp.kinds[y.layer] = "bool"
    return y


def _binary_acts(imp, a, b, kind, out, name):
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
    xa, xb = imp._resolve(a), imp._resolve(b)
    la, lb = imp.layers[xa.layer], imp.layers[xb.layer]
    if xa.shape == xb.shape == out and la.shape == lb.shape and \
            ir.same_layout(len(out), imp._layout_of(xa), imp._layout_of(xb)) and \
            (la.layout == lb.layout or len(out) <= 2):
        # the same storage order on both sides: elementwise over the storage as it is
        return imp._emit_like(name, "BINARY", xa, attrs, inputs=[xa.layer, xb.layer])
    r = len(out)
    lay = imp._layout_of(xa) if len(xa.shape) >= len(xb.shape) else imp._layout_of(xb)
    xa = imp._act_as(xa, (1,) * (r - len(xa.shape)) + xa.shape, lay)
    xb = imp._act_as(xb, (1,) * (r - len(xb.shape)) + xb.shape, lay)
    return imp._emit(name, "BINARY", [xa.layer, xb.layer], out, attrs, layout=lay)


def _per_row(k: np.ndarray, rank: int, axis: int):
    """The per-row vector of a constant broadcast over every axis but the row axis."""
    kp = k.reshape((1,) * (rank - k.ndim) + k.shape)
    if all(d == 1 for i, d in enumerate(kp.shape) if i != axis):
        return kp.reshape(-1)
    return None


def _binary(imp, ins):
    with np.errstate(divide="ignore"):
        return [_binary_values(imp, ins[0], ins[1], _BIN_KIND[imp.node.op_type], imp._node_name())]


def _logical(imp, ins):
    """And, Or, Xor of bool tensors, at least one computed. Bools are 1.0 / 0.0 here (what the
    comparisons and a Cast to bool compute): And is their product, Or their maximum, Xor their
    inequality."""
    def as_bool(v):
        if isinstance(v, np.ndarray):
            return np.asarray(v != 0, np.float32)
        return imp._as_bool(imp._resolve(v))

    op = imp.node.op_type
    a, b = as_bool(ins[0]), as_bool(ins[1])
    name = imp._node_name()
    if op == "Xor":
        eq = _binary_values(imp, a, b, ir.BIN_EQUAL, f"{name}/eq")
        y = _affine(imp, eq, -1.0, 1.0, name=name)
    else:
        y = _binary_values(imp, a, b, ir.BIN_MUL if op == "And" else ir.BIN_MAX, name)
    imp.kinds[y.layer] = "bool"
    return [y]


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
    """x ** e: e = 1 is x, 2 is x * x, 0.5 a square root, others BINARY POW."""
    if not isinstance(ins[1], np.ndarray):
        return _binary(imp, ins)
    e = np.asarray(ins[1], np.float64).reshape(-1)
    if e.size != 1 or isinstance(ins[0], np.ndarray):
        return _binary(imp, ins)
    x = imp._resolve(ins[0])
    if e[0] == 1.0:
        return [x]
    if e[0] == 0.5:
        return [_affine(imp, x, 1.0, 0.0, ir.ACT_SQRT)]
    if e[0] == 2.0:
        attrs = dict(kind=ir.BIN_MUL, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
        return [imp._emit_like(imp._node_name(), "BINARY", x, attrs, inputs=[x.layer, x.layer])]
    return _binary(imp, ins)


def _pool(kind):
    def run(imp, ins):
        x = imp._act(ins[0], CHANNELS)
        if len(x.shape) not in (3, 4):
            raise Unsupported(f"pooling of a rank-{len(x.shape)} tensor")
        kernel = imp._attr("kernel_shape")
        if not isinstance(kernel, list):
            raise ShapeError(f"{imp.node.op_type} without a kernel_shape attribute (a list of "
                             "integers)")
        if len(kernel) != len(x.shape) - 2:
            raise ShapeError(f"kernel_shape {kernel} for an input of shape {x.shape}")
        if kind == ir.POOL_AVG and imp._attr("dilations", None) not in (None, [1] * len(kernel)):
            raise Unsupported("AveragePool with dilations")
        strides, dil, begin, end, out = _window(imp, list(x.shape[2:]), kernel,
                                                bool(imp._attr("ceil_mode", 0)))
        _check_taps(x.shape[0], out, kernel)
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
        x = imp._act(ins[0], CHANNELS)
        if len(x.shape) not in (3, 4):
            raise Unsupported(f"global pooling of a rank-{len(x.shape)} tensor")
        out = x.shape[:2] + (1,) * (len(x.shape) - 2)
        return [imp._emit(imp._node_name(), "GLOBAL_POOL", [x.layer], out, {"kind": kind})]
    return run


#: ReduceMin's kind: a row reduction only (GLOBAL_POOL has no minimum)
REDUCE_MIN_ONLY = "min"
_ROW_REDUCE = {ir.POOL_AVG: ir.REDUCE_MEAN, ir.POOL_MAX: ir.REDUCE_MAX,
               REDUCE_MIN_ONLY: ir.REDUCE_MIN}


def _reduce(kind, total=False):
    def run(imp, ins):
        v = imp._resolve(ins[0])
        r = len(v.shape)
        axes = set(reduce_axes(imp, ins, r))
        keep = bool(imp._attr("keepdims", 1))
        out = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keep or i not in axes)
        rows = {i for i in axes if v.shape[i] != 1}
        if not rows:  # over axes of size 1 only (or none, noop_with_empty_axes): the input
            return [imp._reshaped(v, out)]
        if len(rows) == 1 and r >= 2:
            # over one axis: the rows of a sequence's last axis, or a CNN's channels
            axis = rows.pop()
            if axis in (r - 1, 1):
                return [_row_reduce(imp, v, axis, kind, total, out)]
            return [_reduce_moved(imp, v, axis, kind, total, out)]
        if kind == REDUCE_MIN_ONLY:
            raise Unsupported(f"ReduceMin over axes {sorted(axes)} of a rank-{r} tensor; coacto "
                              "reduces the minimum over one axis (of size above 1)")
        x = imp._act(v, CHANNELS)
        spatial = set(range(2, r))
        ones = {i for i in spatial if x.shape[i] == 1}
        if r < 3 or not axes or (axes | ones) != spatial or not axes <= spatial:
            raise Unsupported(f"reduction over axes {sorted(axes)} of a rank-{r} tensor; coacto "
                              "reduces over all spatial axes ([2, 3]), the channels (1) or the "
                              "last axis")
        y = imp._emit(imp._node_name(), "GLOBAL_POOL", [x.layer], out, {"kind": kind})
        if total:  # ReduceSum: the mean times the number of positions
            y = _affine(imp, y, float(math.prod(x.shape[2:])), 0.0, name=imp._node_name() + "/sum")
        return [y]
    return run


def _row_reduce(imp, v, axis, kind, total, out):
    """A reduction over the row axis of a layout (the last axis, or a CNN's channels): one value
    per column. The result keeps the input's columns."""
    shape = shape_of(v)
    r = len(shape)
    lay = LAST if axis == r - 1 else CHANNELS
    x = imp._act_rows(v) if lay == LAST else imp._act(v, CHANNELS)
    red = ir.REDUCE_SUM if total else _ROW_REDUCE[kind]
    kept = tuple(1 if i == axis else d for i, d in enumerate(shape))
    y = imp._emit_rows(imp._node_name(), "ROW_REDUCE", x, 1, kept, {"kind": red})
    return y if tuple(out) == kept else imp._reshaped(y, out)


def _reduce_moved(imp, v, axis, kind, total, out):
    """A reduction over another single axis (a CNN's height or width, the batch, a sequence's
    tokens): that axis moved last, which copies the tensor once through a GATHER, then reduced
    as rows. The copy costs about what the reduction does, and one ROW_REDUCE then serves every
    axis (a POOL window over H or W alone would need none, but only for those two axes)."""
    view = imp._as_view(v)
    index = np.ascontiguousarray(np.moveaxis(view.index, axis, -1))
    # one copy straight into rows, not a copy in the input's layout and another into rows
    moved = imp._act(View(view.srcs, index, view.fill, view.name), LAST)
    kept = index.shape[:-1] + (1,)
    y = _row_reduce(imp, moved, index.ndim - 1, kind, total, kept)
    # the reduced axis has size 1 now: moving it back changes no element's place
    return imp._reshaped(y, out)


def _lrn(imp, ins):
    x = imp._act(ins[0], CHANNELS)
    if len(x.shape) not in (3, 4):
        raise Unsupported(f"LRN of a rank-{len(x.shape)} tensor")
    if not isinstance(imp._attr("size"), int) or imp._attr("size") < 1:
        raise ShapeError(f"LRN size {imp._attr('size')!r} (must be an integer of at least 1)")
    attrs = dict(size=int(imp._attr("size")), alpha=float(imp._attr("alpha", 1e-4)),
                 beta=float(imp._attr("beta", 0.75)), bias=float(imp._attr("bias", 1.0)))
    return [imp._emit(imp._node_name(), "LRN", [x.layer], x.shape, attrs)]


def _softmax(log):
    def run(imp, ins):
        v = imp._resolve(ins[0])
        r = len(v.shape)
        axis = axis_index(imp._attr("axis", 1 if imp.opset < 13 else -1), r)
        # Before opset 13 the input is coerced to 2-D: softmax over every axis from `axis` on.
        reduced = range(axis, r) if imp.opset < 13 else [axis]
        big = [i for i in reduced if v.shape[i] != 1]
        if len(big) > 1:
            raise Unsupported(f"softmax over axes {list(reduced)} of shape {v.shape}; coacto "
                              "computes softmax over one axis")
        row = big[0] if big else axis
        if r <= 2 or row == r - 1:
            x = imp._act_rows(v)
        elif row == 1:
            x = imp._act(v, CHANNELS)
        else:
            raise Unsupported(f"softmax over axis {axis} of shape {v.shape}; coacto computes "
                              "softmax over the channels (axis 1) or the last axis")
        c = imp.layers[x.layer].rows
        return [imp._emit_rows(imp._node_name(), "SOFTMAX", x, c, x.shape, {"log": int(log)})]
    return run


def _concat(imp, ins):
    vals = [v for v in ins if v is not None]
    r = len(shape_of(vals[0]))
    axis = axis_index(imp._attr("axis", 0), r)
    first = next((v for v in vals if not isinstance(v, np.ndarray)), None)
    lay = imp._layout_of(imp._resolve(first)) if isinstance(first, (Act, View)) else CHANNELS
    if r > 4 or any(isinstance(v, np.ndarray) for v in vals) or axis != row_axis(r, lay):
        return imp._layout("Concat", ins)
    acts = [imp._act(v, lay) for v in vals]
    name = imp._node_name()
    while len(acts) > 8:  # the runtime concatenates at most 8 inputs at once
        part = acts[:8]
        c = sum(a.shape[axis] for a in part)
        shape = list(part[0].shape)
        shape[axis] = c
        first = imp._emit(f"{name}/part", "CONCAT", [a.layer for a in part], shape, layout=lay)
        acts = [first] + acts[8:]
    if len(acts) == 1:
        return [acts[0]]
    shape = list(acts[0].shape)
    for a in acts:
        if len(a.shape) != r or any(a.shape[i] != shape[i] for i in range(r) if i != axis):
            raise ShapeError(f"concatenation of shapes {[x.shape for x in acts]}")
    shape[axis] = sum(a.shape[axis] for a in acts)
    return [imp._emit(name, "CONCAT", [a.layer for a in acts], shape, layout=lay)]


COMPUTE = {
    "Conv": _conv, "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary, "Sum": _sum, "Mean": _sum,
    "Equal": _binary, "Less": _binary, "Greater": _binary,
    "GreaterOrEqual": _binary, "LessOrEqual": _binary,
    "And": _logical, "Or": _logical, "Xor": _logical,
    "Pow": _pow, "Neg": _neg, "Max": _min_max, "Min": _min_max,
    "Relu": _activation(ir.ACT_RELU), "Clip": _clip,
    "LeakyRelu": _activation(ir.ACT_LEAKY, "alpha", 0.01), "PRelu": _prelu,
    "Sigmoid": _activation(ir.ACT_SIGMOID), "Tanh": _activation(ir.ACT_TANH),
    "HardSigmoid": _activation(ir.ACT_HARDSIGMOID, "alpha", 0.2, "beta", 0.5),
    "HardSwish": _activation(ir.ACT_HARDSWISH),
    "Elu": _activation(ir.ACT_ELU, "alpha", 1.0), "Celu": _celu,
    # the defaults are the ONNX spec's float32 values of the self-normalising constants
    "Selu": _activation(ir.ACT_SELU, "alpha", 1.67326319217681884765625, "gamma",
                        1.05070102214813232421875),
    "Softplus": _activation(ir.ACT_SOFTPLUS), "Softsign": _activation(ir.ACT_SOFTSIGN),
    "ThresholdedRelu": _activation(ir.ACT_THRESHOLDED_RELU, "alpha", 1.0),
    "Abs": _integer_preserving(ir.ACT_ABS), "Floor": _integer_preserving(ir.ACT_FLOOR),
    "Ceil": _integer_preserving(ir.ACT_CEIL), "Round": _integer_preserving(ir.ACT_ROUND),
    "Sign": _integer_preserving(ir.ACT_SIGN), "Log": _activation(ir.ACT_LOG),
    "MaxPool": _pool(ir.POOL_MAX), "AveragePool": _pool(ir.POOL_AVG),
    "GlobalAveragePool": _global_pool(ir.POOL_AVG), "GlobalMaxPool": _global_pool(ir.POOL_MAX),
    "ReduceMean": _reduce(ir.POOL_AVG), "ReduceMax": _reduce(ir.POOL_MAX),
    "ReduceSum": _reduce(ir.POOL_AVG, total=True), "ReduceMin": _reduce(REDUCE_MIN_ONLY),
    "LRN": _lrn, "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "Concat": _concat,
}
