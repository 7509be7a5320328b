"""A numpy interpreter of the operator graph: the executable definition of coacto.ir's semantics.

Computes in float64 on each layer's (N, C, H, W) array (the storage order only matters to the ops
that index storage: GATHER, MATMUL, EMBED). The native runtime is tested against this and against
onnxruntime.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

try:
    from scipy.special import erf as _erf
except ImportError:  # scipy is optional: math.erf elementwise
    import math

    _erf = np.vectorize(math.erf, otypes=[np.float64])

from . import ir
from .errors import InputError


def run_reference(graph: ir.Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs ``graph`` on ``feeds`` ({input name: array in its ONNX shape}); returns
    {output name: float32 array in its ONNX shape}."""
    missing = set(graph.inputs) - set(feeds)
    if missing:
        raise InputError(f"missing inputs {sorted(missing)}; the graph's inputs are "
                         f"{sorted(graph.inputs)}")
    values: list[np.ndarray | None] = [None] * len(graph.layers)
    for name, i in graph.inputs.items():
        layer = graph.layers[i]
        x = np.asarray(feeds[name])
        if tuple(x.shape) != tuple(layer.onnx_shape):
            raise InputError(f"input {name!r} has shape {tuple(x.shape)}, the graph expects "
                             f"{tuple(layer.onnx_shape)}")
        if ir.integer_input(layer):
            check_integer_input(name, layer, x)
        values[i] = ir.storage_to_internal(
            ir.to_storage(x.astype(np.float64), layer.layout), layer.shape)
    last_use = list(range(len(graph.layers)))
    for j, layer in enumerate(graph.layers):
        for p in layer.inputs:
            last_use[p] = j
    keep = set(graph.outputs.values())
    for j, layer in enumerate(graph.layers):
        if layer.op == "INPUT":
            continue
        xs = [values[p] for p in layer.inputs]
        y = _OPS[layer.op](layer, xs)
        if y.shape != tuple(layer.shape):
            raise AssertionError(f"layer {layer.name}: computed {y.shape}, expected {layer.shape}")
        values[j] = y
        for p in set(layer.inputs):
            if last_use[p] == j and p not in keep:
                values[p] = None
    out = {}
    for name, i in graph.outputs.items():
        layer = graph.layers[i]
        flat = ir.internal_to_storage(values[i])
        out[name] = ir.from_storage(flat, layer.shape, layer.onnx_shape,
                                    layer.layout).astype(np.float32)
    return out


def check_integer_input(name: str, layer: ir.Layer, x: np.ndarray) -> None:
    """Integer inputs (token ids, masks) travel as float32: they must be integers that float32
    holds exactly, and ids for an embedding table must lie in [-V, V)."""
    if not np.issubdtype(x.dtype, np.integer) and x.dtype != np.bool_:
        raise InputError(f"input {name!r} takes integers, got dtype {x.dtype}")
    if x.size == 0:
        return
    lo, hi = int(x.min()), int(x.max())
    limit = layer.attrs.get("index_limit")
    if limit is not None and (lo < -limit or hi >= limit):
        raise InputError(f"input {name!r} holds ids from {lo} to {hi}; the model's table has "
                         f"{limit} rows, so ids must lie in [{-limit}, {limit})")
    if max(abs(lo), abs(hi)) > 1 << 24:
        raise InputError(f"input {name!r} holds integers up to {max(abs(lo), abs(hi))}; coacto "
                         "carries integer inputs as float32, exact up to 2^24")


def activation(x: np.ndarray, act: int, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    if act == ir.ACT_NONE:
        return x
    if act == ir.ACT_RELU:
        return np.maximum(x, 0.0)
    if act == ir.ACT_CLIP:
        return np.minimum(np.maximum(x, alpha), beta)
    if act == ir.ACT_LEAKY:
        return np.where(x >= 0, x, x * alpha)
    if act == ir.ACT_SIGMOID:
        return 0.5 * (np.tanh(0.5 * x) + 1.0)  # = 1 / (1 + exp(-x)), without overflow
    if act == ir.ACT_HARDSIGMOID:
        return np.clip(alpha * x + beta, 0.0, 1.0)
    if act == ir.ACT_HARDSWISH:
        return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)
    if act == ir.ACT_TANH:
        return np.tanh(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if act == ir.ACT_SQRT:
            return np.sqrt(x)
        if act == ir.ACT_ERF:
            return _erf(x)
        if act == ir.ACT_GELU:
            return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
        if act == ir.ACT_GELU_TANH:
            return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
        if act == ir.ACT_RECIPROCAL:
            return 1.0 / x
        if act == ir.ACT_EXP:
            return np.exp(x)
        if act == ir.ACT_ISNAN:
            return np.isnan(x).astype(np.float64)
        if act == ir.ACT_ELU:
            return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
        if act == ir.ACT_SELU:
            return beta * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
        if act == ir.ACT_CELU:
            return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0) / alpha))
        if act == ir.ACT_SOFTPLUS:
            return np.logaddexp(0.0, x)
        if act == ir.ACT_SOFTSIGN:
            return x / (1.0 + np.abs(x))
        if act == ir.ACT_THRESHOLDED_RELU:
            return np.where(x > alpha, x, 0.0)
        if act == ir.ACT_ABS:
            return np.abs(x)
        if act == ir.ACT_FLOOR:
            return np.floor(x)
        if act == ir.ACT_CEIL:
            return np.ceil(x)
        if act == ir.ACT_ROUND:  # numpy's rounds halves to even, as ONNX's Round
            return np.round(x)
        if act == ir.ACT_SIGN:
            return np.sign(x)
        if act == ir.ACT_LOG:
            return np.log(x)
    raise ValueError(f"unknown activation {act}")


def _act(layer, y):
    a = layer.attrs
    return activation(y, a.get("act", ir.ACT_NONE), a.get("alpha", 0.0), a.get("beta", 0.0))


def _windows(x, layer, pad_value, extra=(0, 0)):
    """(N, C, Ho, Wo, kh, kw) windows of x padded by the layer's pads (plus ``extra`` more rows
    and columns at the bottom and right, for windows that reach past the end pads)."""
    a = layer.attrs
    kh, kw, sh, sw, dh, dw = a["kh"], a["kw"], a["sh"], a["sw"], a["dh"], a["dw"]
    _, _, ho, wo = layer.shape
    xp = np.pad(x, ((0, 0), (0, 0), (a["pt"], a["pb"] + extra[0]), (a["pl"], a["pr"] + extra[1])),
                constant_values=pad_value)
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw][:, :, :ho, :wo][..., ::dh, ::dw]


def _conv(layer, xs):
    a = layer.attrs
    x = xs[0]
    if a.get("pre"):  # a pointwise prologue (coacto.frontend.fuse.fuse_pointwise_prologues)
        pre_w = layer.weights["pre_w"].astype(np.float64)  # (cin, c)
        x = np.einsum("nchw,cd->ndhw", x, pre_w)
        if "pre_b" in layer.weights:
            x = x + layer.weights["pre_b"].astype(np.float64).reshape(1, -1, 1, 1)
        x = activation(x, a["pre_act"], a.get("pre_alpha", 0.0), a.get("pre_beta", 0.0))
    w = layer.weights["w"].astype(np.float64)
    g, kh, kw, cin_g, cout_g = w.shape
    n, _, ho, wo = layer.shape
    win = _windows(x, layer, 0.0)  # (N, C, Ho, Wo, kh, kw)
    win = win.reshape(n, g, cin_g, ho, wo, kh, kw).transpose(1, 0, 3, 4, 5, 6, 2)
    cols = win.reshape(g, n * ho * wo, kh * kw * cin_g)
    y = np.matmul(cols, w.reshape(g, kh * kw * cin_g, cout_g))  # (g, N*Ho*Wo, cout_g)
    y = y.reshape(g, n, ho, wo, cout_g).transpose(1, 0, 4, 2, 3).reshape(n, g * cout_g, ho, wo)
    y = y + layer.weights["b"].astype(np.float64).reshape(1, -1, 1, 1)
    if len(xs) > 1:
        y = y + xs[1]
    return _act(layer, y)


def _pool(layer, xs):
    """Windows are clipped to the input. Max: the largest element inside the input. Average: the
    sum over the input divided by the number of window positions inside the input or, with
    count_include_pad, inside the input extended by the pads (not beyond them, where a window of a
    ceil_mode output may reach). A window without any input element gives 0."""
    a = layer.attrs
    x = xs[0]
    _, _, h, w = x.shape
    _, _, ho, wo = layer.shape
    need_h = (ho - 1) * a["sh"] + (a["kh"] - 1) * a["dh"] + 1
    need_w = (wo - 1) * a["sw"] + (a["kw"] - 1) * a["dw"] + 1
    extra = (max(0, need_h - (h + a["pt"] + a["pb"])), max(0, need_w - (w + a["pl"] + a["pr"])))
    inside = _windows(np.ones((1, 1, h, w)), layer, 0.0, extra)[0, 0]
    count = inside.sum(axis=(-2, -1))
    if a["kind"] == ir.POOL_MAX:
        y = _windows(x, layer, -np.inf, extra).max(axis=(-2, -1))
        return np.where(count > 0, y, 0.0)
    s = _windows(x, layer, 0.0, extra).sum(axis=(-2, -1))
    if a.get("count_include_pad"):
        padded = np.ones((1, 1, h + a["pt"] + a["pb"], w + a["pl"] + a["pr"]))
        shifted = ir.Layer(layer.name, "POOL", [], layer.shape,
                           dict(a, pt=0, pl=0, pb=0, pr=0))
        count = _windows(padded, shifted, 0.0, extra)[0, 0].sum(axis=(-2, -1))
    return s / np.maximum(count, 1)


def _global_pool(layer, xs):
    if layer.attrs["kind"] == ir.POOL_MAX:
        return xs[0].max(axis=(2, 3), keepdims=True)
    return xs[0].mean(axis=(2, 3), keepdims=True)


_BIN = {ir.BIN_ADD: np.add, ir.BIN_SUB: np.subtract, ir.BIN_MUL: np.multiply,
        ir.BIN_DIV: np.divide, ir.BIN_POW: np.power, ir.BIN_MAX: np.maximum,
        ir.BIN_MIN: np.minimum,
        ir.BIN_EQUAL: lambda a, b: np.equal(a, b).astype(np.float64),
        ir.BIN_LESS: lambda a, b: np.less(a, b).astype(np.float64),
        ir.BIN_GREATER: lambda a, b: np.greater(a, b).astype(np.float64),
        ir.BIN_GREATER_EQUAL: lambda a, b: np.greater_equal(a, b).astype(np.float64),
        ir.BIN_LESS_EQUAL: lambda a, b: np.less_equal(a, b).astype(np.float64)}


def _binary(layer, xs):
    fn = _BIN[layer.attrs["kind"]]
    if len(xs) == 2:
        a, b = xs
    else:
        k = layer.weights["k"].astype(np.float64)
        a, b = (k, xs[0]) if layer.attrs.get("const_first") else (xs[0], k)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = fn(a, b)
    return _act(layer, np.broadcast_to(y, layer.shape))


def _affine(layer, xs):
    scale = layer.weights["scale"].astype(np.float64).reshape(1, -1, 1, 1)
    shift = layer.weights["shift"].astype(np.float64).reshape(1, -1, 1, 1)
    return _act(layer, xs[0] * scale + shift)


def _concat(layer, xs):
    return np.concatenate(xs, axis=1)


def _gather(layer, xs):
    parts = [ir.internal_to_storage(x) for x in xs]
    if "const" in layer.weights:
        parts.append(np.asarray(layer.weights["const"], np.float64).reshape(-1))
    storage = np.concatenate(parts)
    index = layer.weights["index"].astype(np.int64)
    y = np.where(index >= 0, storage[np.maximum(index, 0)], layer.attrs.get("fill", 0.0))
    n, c, h, w = layer.shape
    return y.reshape(n, h, w, c).transpose(0, 3, 1, 2)


def _lrn(layer, xs):
    """ONNX LRN: y = x / (bias + alpha / size * sum of x^2 over channels
    [c - (size - 1) // 2, c + size // 2] clipped to the tensor) ** beta."""
    a = layer.attrs
    x = xs[0]
    size = a["size"]
    sq = np.pad(x * x, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    csum = np.concatenate([np.zeros_like(sq[:, :1]), np.cumsum(sq, axis=1)], axis=1)
    window = csum[:, size:] - csum[:, :-size]
    return x / (a["bias"] + a["alpha"] / size * window) ** a["beta"]


def _softmax(layer, xs):
    x = xs[0]
    z = x - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z - lse if layer.attrs.get("log") else np.exp(z - lse)


def _nop(layer, xs):
    return np.zeros(layer.shape)


def _strided(storage: np.ndarray, off: int, strides, dims) -> np.ndarray:
    """storage[off + sum(i_d * stride_d)] over the grid ``dims``."""
    index = np.full(dims, off, dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(dims, strides)):
        shape = [1] * len(dims)
        shape[axis] = size
        index = index + np.arange(size, dtype=np.int64).reshape(shape) * stride
    return storage[index]


def _matmul(layer, xs):
    a = layer.attrs
    b0, b1, m, n, k = a["batch0"], a["batch1"], a["m"], a["n"], a["k"]
    sa, sb = ir.internal_to_storage(xs[0]), ir.internal_to_storage(xs[1])
    A = _strided(sa, a["a_off"], (a["a_s0"], a["a_s1"], a["a_si"], 1), (b0, b1, m, k))
    B = _strided(sb, a["b_off"], (a["b_s0"], a["b_s1"], a["b_sk"], a["b_sj"]), (b0, b1, k, n))
    i = np.arange(m)[:, None]
    if a.get("causal") == 2:  # the sum runs over k <= i + offset
        keep_k = np.arange(k)[None, :] <= i + a["offset"]
        A = np.where(keep_k, A, 0.0)
    y = a["scale"] * np.matmul(A, B)
    if a.get("causal") == 1:
        y = np.where(np.arange(n)[None, :] <= i + a["offset"], y, a["fill"])
    if a.get("has_mask"):
        sm = ir.internal_to_storage(xs[2])
        y = y + _strided(sm, a["m_off"], (a["m_s0"], a["m_s1"], a["m_si"], a["m_sj"]),
                         (b0, b1, m, n))
    if a.get("out_mode"):
        y = y.transpose(0, 2, 1, 3)  # columns (b0, i), rows (b1, j)
    return ir.storage_to_internal(y.reshape(-1), layer.shape)


def _attention(layer, xs):
    a = layer.attrs
    b0, b1, m, n, k, dv = a["batch0"], a["batch1"], a["m"], a["n"], a["k"], a["dv"]
    sa, sb, sv = (ir.internal_to_storage(x) for x in xs[:3])
    A = _strided(sa, a["a_off"], (a["a_s0"], a["a_s1"], a["a_si"], 1), (b0, b1, m, k))
    B = _strided(sb, a["b_off"], (a["b_s0"], a["b_s1"], a["b_sk"], a["b_sj"]), (b0, b1, k, n))
    V = _strided(sv, a["v_off"], (a["v_s0"], a["v_s1"], a["v_sk"], a["v_sj"]), (b0, b1, n, dv))
    s = a["scale"] * np.matmul(A, B)
    if a.get("has_mask"):
        sm = ir.internal_to_storage(xs[3])
        s = s + _strided(sm, a["m_off"], (a["m_s0"], a["m_s1"], a["m_si"], a["m_sj"]),
                         (b0, b1, m, n))
    if a.get("causal"):  # keys past the diagonal are left out
        s = np.where(np.arange(n)[None, :] <= np.arange(m)[:, None] + a["offset"], s, -np.inf)
    z = np.exp(s - s.max(axis=-1, keepdims=True))
    y = np.matmul(z / z.sum(axis=-1, keepdims=True), V)
    if a.get("out_mode"):
        y = y.transpose(0, 2, 1, 3)  # columns (b0, i), rows (b1, d)
    return ir.storage_to_internal(y.reshape(-1), layer.shape)


def _layernorm(layer, xs):
    x = xs[0]
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    scale = layer.weights["scale"].astype(np.float64).reshape(1, -1, 1, 1)
    shift = layer.weights["shift"].astype(np.float64).reshape(1, -1, 1, 1)
    return (x - mean) / np.sqrt(var + layer.attrs["eps"]) * scale + shift


_REDUCE = {ir.REDUCE_MAX: np.max, ir.REDUCE_MEAN: np.mean, ir.REDUCE_SUM: np.sum,
           ir.REDUCE_MIN: np.min}


def _row_reduce(layer, xs):
    return _REDUCE[layer.attrs["kind"]](xs[0], axis=1, keepdims=True)


def _where(layer, xs):
    which = layer.attrs["operands"]
    ops, inputs = [], iter(xs)
    for o, key in enumerate(("cond", "x", "y")):
        ops.append(next(inputs) if which >> o & 1 else layer.weights[key].astype(np.float64))
    return np.broadcast_to(np.where(ops[0] != 0, ops[1], ops[2]), layer.shape)


def _embed(layer, xs):
    ids = ir.internal_to_storage(xs[0])
    table = layer.weights["table"].astype(np.float64)
    v = table.shape[0]
    valid = (ids >= -v) & (ids < v) & (ids == np.floor(ids))
    rows = np.where(valid, ids, 0).astype(np.int64) % v
    out = np.where(valid[:, None], table[rows], 0.0)
    return ir.storage_to_internal(out.reshape(-1), layer.shape)


_OPS = {
    "CONV": _conv, "POOL": _pool, "GLOBAL_POOL": _global_pool, "BINARY": _binary,
    "AFFINE": _affine, "CONCAT": _concat, "GATHER": _gather, "LRN": _lrn, "SOFTMAX": _softmax,
    "NOP": _nop, "MATMUL": _matmul, "ATTENTION": _attention, "LAYERNORM": _layernorm, "ROW_REDUCE": _row_reduce,
    "WHERE": _where, "EMBED": _embed,
}

__all__ = ["run_reference", "activation"]
