"""Operators of convolutional networks, in the channels layout: Conv, ConvTranspose, pooling,
BatchNormalization (an AFFINE, folded into the convolution before it), LRN.
"""
from __future__ import annotations

import math

import numpy as np

from ... import ir
from ...errors import ShapeError
from ..registry import op, register
from ..values import CHANNELS, Unsupported, View
from .elementwise import affine
from .matmul import transpose_last2


def _window(ctx, sizes, kernel, ceil_mode=False):
    """A conv / pool window's attributes over its last two axes (kh, kw, sh, sw, pt, pl, pb, pr,
    dh, dw; 1-D windows as 2-D ones, H = 1), its output sizes, and its first axis's window
    (begin pad, end pad, stride, dilation): the depth of a 3-D window."""
    d = len(sizes)
    strides = list(ctx.attr("strides", [1] * d))
    dil = list(ctx.attr("dilations", [1] * d))
    pads = list(ctx.attr("pads", [0] * (2 * d)))
    auto = ctx.attr("auto_pad", "NOTSET")
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
            if ceil_mode and span < 0:  # ONNX gives one window; the runtime's check refuses it
                raise Unsupported(f"a ceil_mode window of {eff} taps over {n + b + e} padded "
                                  "positions (longer than the input); pad the input to the window")
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
    kh, kw = _as_2d(kernel, 1)
    sh, sw = _as_2d(strides, 1)
    dh, dw = _as_2d(dil, 1)
    pt, pl = _as_2d(begin, 0)
    pb, pr = _as_2d(end, 0)
    return (dict(kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr, dh=dh, dw=dw), out,
            (begin[0], end[0], strides[0], dil[0]))


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
    """Window parameters of 1-D ops as 2-D ones (H = 1); of 3-D ops, their last two axes'."""
    return [fill] + list(vals) if len(vals) == 1 else list(vals)[-2:]


@op("Conv")
def _conv(ctx, ins):
    x = ins[0]
    w = np.asarray(ctx.const(ins[1], "the weight input W"), dtype=np.float32)
    if w.ndim not in (3, 4, 5):
        raise Unsupported(f"{w.ndim - 2}-D convolution; coacto runs 1-D, 2-D and 3-D ones")
    extra = (0, 0, 0, 0)
    if isinstance(x, View) and x.pad is not None and w.ndim == 4:
        x, extra = x.pad  # a zero Pad folded into the convolution's padding
    x = ctx.resolve(x) if w.ndim == 5 else ctx.act(x, CHANNELS)
    if len(x.shape) != w.ndim:
        raise ShapeError(f"input of shape {x.shape} for weights of shape {w.shape}")
    n, c = x.shape[:2]
    sizes = list(x.shape[2:])
    if w.ndim == 4:
        sizes = [sizes[0] + extra[0] + extra[2], sizes[1] + extra[1] + extra[3]]
    m, cin_g = w.shape[:2]
    kernel = list(w.shape[2:])
    if ctx.attr("kernel_shape") not in (None, kernel):
        raise ShapeError(f"kernel_shape {ctx.attr('kernel_shape')} differs from the weights' "
                         f"{kernel}")
    group = int(ctx.attr("group", 1))
    if group < 1:
        raise ShapeError(f"group {group} (must be at least 1)")
    if c != cin_g * group or m % group:
        raise ShapeError(f"{c} input channels, weights {w.shape} and group {group} do not match")
    attrs, out, depth = _window(ctx, sizes, kernel)
    _check_taps(n, out, kernel)
    for key, e in zip(("pt", "pl", "pb", "pr"), extra):
        attrs[key] += e
    attrs.update(group=group, act=ir.ACT_NONE, alpha=0.0, beta=0.0)
    if w.ndim == 5:
        return [_conv3d(ctx, x, w, attrs, out, depth, _bias(ctx, ins, m))]
    wt = conv_weights(w.reshape(m, cin_g, attrs["kh"], attrs["kw"]), group)
    return [ctx.emit(ctx.node_name, "CONV", [x.layer], (n, m, *out), attrs,
                     {"w": wt, "b": _bias(ctx, ins, m)})]


def _conv3d(ctx, x, w, attrs, out, depth, bias) -> View:
    """A 3-D convolution as one 2-D one: the kd input depths each output depth reads, stacked
    along the channels (one GATHER: the depth's im2col, kd / stride times the input), make a
    batch of N * Do images that the 2-D kernel slices, side by side, convolve. The (N * Do, M,
    Ho, Wo) layer is the (N, M, Do, Ho, Wo) result's storage, read through a view."""
    n, (m, cin_g, kd, kh, kw), group, do = x.shape[0], w.shape, attrs["group"], out[0]
    view = ctx.as_view(x)
    if (view.index < 0).any() and view.fill != 0.0:
        view = ctx.as_view(ctx.materialize(view))
    begin, _, stride, dil = depth
    z = np.arange(do)[:, None] * stride - begin + np.arange(kd)[None, :] * dil  # input depths
    inside = ((z >= 0) & (z < x.shape[2]))[None, None, :, :, None, None]
    idx = np.where(inside, view.index[:, :, np.clip(z, 0, x.shape[2] - 1)], -1)
    # channels in (group, tap, channel of the group) order: each 2-D group sees its whole group
    idx = idx.reshape(n, group, cin_g, do, kd, *x.shape[3:]).transpose(0, 3, 1, 4, 2, 5, 6)
    taps = ctx.act(View(view.srcs, np.ascontiguousarray(idx).reshape(
        n * do, group * kd * cin_g, *x.shape[3:]), 0.0, ctx.node_name + "/taps"), CHANNELS)
    w2 = w.transpose(0, 2, 1, 3, 4).reshape(m, kd * cin_g, kh, kw)
    y = ctx.emit(ctx.node_name, "CONV", [taps.layer], (n * do, m, *out[1:]), attrs,
                 {"w": conv_weights(w2, group), "b": bias})
    index = ctx.as_view(y).index.reshape(n, do, m, *out[1:]).transpose(0, 2, 1, 3, 4)
    return View([y.layer], np.ascontiguousarray(index), name=ctx.node_name)


def _bias(ctx, ins, m: int) -> np.ndarray:
    """A convolution's bias (input 2; zeros without one), float32."""
    if len(ins) < 3 or ins[2] is None:
        return np.zeros(m, np.float32)
    return np.asarray(ctx.const(ins[2], "the bias input B"), np.float32).reshape(m).copy()


@op("ConvTranspose")
def _conv_transpose(ctx, ins):
    """ConvTranspose (2-D, group 1, dilations 1) as what it equals: the input with stride - 1
    zeros between its values and k - 1 - pad zeros around them (one GATHER, a view of the
    input), then a stride-1 Conv with the kernel flipped and its in / out axes swapped. Exact;
    the Conv multiplies the inserted zeros too, stride^2 times the transposed convolution's
    work (4x at stride 2), which a dedicated op would save."""
    x = ctx.resolve(ins[0])
    w = np.asarray(ctx.const(ins[1], "the weight input W"), dtype=np.float32)
    if w.ndim != 4 or len(x.shape) != 4:
        raise Unsupported(f"{w.ndim - 2}-D ConvTranspose; coacto runs 2-D ones")
    if int(ctx.attr("group", 1)) != 1:
        raise Unsupported("ConvTranspose with groups")
    if ctx.attr("dilations", [1, 1]) != [1, 1]:
        raise Unsupported("ConvTranspose with dilations")
    if ctx.attr("auto_pad", "NOTSET") != "NOTSET" or ctx.attr("output_shape") is not None:
        raise Unsupported("ConvTranspose with auto_pad or output_shape; give pads instead")
    n, c, h, wd = x.shape
    cin, m, kh, kw = w.shape
    if c != cin:
        raise ShapeError(f"input of {c} channels for weights of shape {w.shape}")
    strides = list(ctx.attr("strides", [1, 1]))
    pads = list(ctx.attr("pads", [0, 0, 0, 0]))
    extra = list(ctx.attr("output_padding", [0, 0]))
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
    view = ctx.as_view(x)
    if (view.index < 0).any() and view.fill != 0.0:
        view = ctx.as_view(ctx.materialize(view))
    rows, cols = maps
    index = view.index[:, :, np.maximum(rows, 0)][:, :, :, np.maximum(cols, 0)]
    index = np.where((rows[:, None] >= 0) & (cols[None, :] >= 0), index, -1)
    stuffed = ctx.act(View(view.srcs, np.ascontiguousarray(index), 0.0,
                           ctx.node_name + "/stuffed"), CHANNELS)
    wc = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    b = _bias(ctx, ins, m)
    attrs = dict(kh=kh, kw=kw, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1, group=1,
                 act=ir.ACT_NONE, alpha=0.0, beta=0.0)
    out = (n, m, len(rows) - kh + 1, len(cols) - kw + 1)
    return [ctx.emit(ctx.node_name, "CONV", [stuffed.layer], out, attrs,
                     {"w": conv_weights(wc, 1), "b": b})]


def _image(ctx, v, what: str, ranks=(3, 4)):
    """v in the channels layout, of rank 3 or 4 (a 1-D or 2-D image) or another of ``ranks``."""
    x = ctx.act(v, CHANNELS)
    if len(x.shape) not in ranks:
        raise Unsupported(f"{what} of a rank-{len(x.shape)} tensor")
    return x


def _pool(kind):
    def run(ctx, ins):
        x = ctx.resolve(ins[0])
        if len(x.shape) != 5:
            x = _image(ctx, x, "pooling")
        kernel = ctx.attr("kernel_shape")
        if not isinstance(kernel, list):
            raise ShapeError(f"{ctx.node.op_type} without a kernel_shape attribute (a list of "
                             "integers)")
        if len(kernel) != len(x.shape) - 2:
            raise ShapeError(f"kernel_shape {kernel} for an input of shape {x.shape}")
        window, out, depth = _window(ctx, x.shape[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
        _check_taps(x.shape[0], out, kernel)
        attrs = dict(kind=kind, **window, count_include_pad=int(ctx.attr("count_include_pad", 0)))
        if len(x.shape) == 5:
            return [_pool3d(ctx, x, attrs, out, depth, kernel[0])]
        return [ctx.emit(ctx.node_name, "POOL", [x.layer], (*x.shape[:2], *out), attrs)]
    return run


def _pool3d(ctx, x, attrs, out, depth, kd: int):
    """A 3-D pool as two 2-D ones, exact as its window is a box (the maximum of maxima; the
    average of averages, each divisor counting its own axes' taps): over (H, W) of each depth
    slice, a (N * D, C, H, W) view (a Conv3D's own storage), then a (kd, 1) window over (N, C, D,
    Ho * Wo), the same storage copied to that shape."""
    n, c, d, h, w = x.shape
    view = ctx.as_view(x)
    slices = ctx.act(View(view.srcs, np.ascontiguousarray(view.index.transpose(0, 2, 1, 3, 4))
                          .reshape(n * d, c, h, w), view.fill, ctx.node_name + "/slices"),
                     CHANNELS)
    p = ctx.emit(ctx.node_name + "/hw", "POOL", [slices.layer], (n * d, c, *out[1:]), attrs)
    hw = out[1] * out[2]
    index = ctx.as_view(p).index.reshape(n, d, c, hw).transpose(0, 2, 1, 3)
    planes = ctx.act(View([p.layer], np.ascontiguousarray(index), name=ctx.node_name + "/depth"),
                     CHANNELS)
    begin, end, stride, dil = depth
    attrs = dict(attrs, kh=kd, kw=1, sh=stride, sw=1, pt=begin, pl=0, pb=end, pr=0, dh=dil, dw=1)
    y = ctx.emit(ctx.node_name, "POOL", [planes.layer], (n, c, out[0], hw), attrs)
    return ctx.reshaped(y, (n, c, *out))


def _global_pool(kind):
    def run(ctx, ins):
        x = _image(ctx, ins[0], "global pooling", (3, 4, 5))
        out = x.shape[:2] + (1,) * (len(x.shape) - 2)
        return [ctx.emit(ctx.node_name, "GLOBAL_POOL", [x.layer], out, {"kind": kind})]
    return run


@op("BatchNormalization")
def _batch_norm(ctx, ins):
    if ctx.attr("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    x = ctx.act_channels(ins[0])
    params = [np.asarray(ctx.const(v, what), np.float64).reshape(-1)
              for v, what in zip(ins[1:5], ("scale", "B", "mean", "var"))]
    c = ctx.layers[x.layer].shape[1]
    if any(p.size not in (1, c) for p in params):
        raise Unsupported("BatchNormalization with per-position statistics (spatial=0)")
    gamma, beta, mean, var = params
    scale = gamma / np.sqrt(var + ctx.attr("epsilon", 1e-5))
    return [affine(ctx, x, scale, beta - mean * scale)]


@op("LRN")
def _lrn(ctx, ins):
    x = _image(ctx, ins[0], "LRN", (3, 4, 5))
    if not isinstance(ctx.attr("size"), int) or ctx.attr("size") < 1:
        raise ShapeError(f"LRN size {ctx.attr('size')!r} (must be an integer of at least 1)")
    attrs = dict(size=int(ctx.attr("size")), alpha=float(ctx.attr("alpha", 1e-4)),
                 beta=float(ctx.attr("beta", 0.75)), bias=float(ctx.attr("bias", 1.0)))
    return [ctx.emit(ctx.node_name, "LRN", [x.layer], x.shape, attrs)]


register("compute", {
    "MaxPool": _pool(ir.POOL_MAX), "AveragePool": _pool(ir.POOL_AVG),
    "GlobalAveragePool": _global_pool(ir.POOL_AVG), "GlobalMaxPool": _global_pool(ir.POOL_MAX),
})
