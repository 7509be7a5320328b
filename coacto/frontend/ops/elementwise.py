"""Elementwise operators: arithmetic, comparisons, logic, activations, unary functions, Where."""
from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import ShapeError
from ..folding import clip_bounds
from ..registry import op, register
from ..values import CHANNELS, Act, Unsupported, View, const_operand, row_axis, shape_of


def affine(ctx, x, scale, shift, act=ir.ACT_NONE, alpha=0.0, beta=0.0, name=None):
    """``act(x * scale + shift)``: scalars apply to any activation as it is stored; vectors are
    per row (the channels of a CNN, the last axis of a sequence)."""
    scale = np.asarray(scale, np.float64).reshape(-1)
    shift = np.asarray(shift, np.float64).reshape(-1)
    attrs = dict(act=act, alpha=float(alpha), beta=float(beta))
    name = name or ctx.node_name
    if scale.size == 1 and shift.size == 1:
        pushed = _through_view(ctx, x, name, attrs, scale[0], shift[0])
        if pushed is not None:
            return pushed
        x = ctx.resolve(x)
        c = ctx.layers[x.layer].rows
        return ctx.emit_like(name, "AFFINE", x, attrs,
                             {"scale": np.full(c, scale[0], np.float32),
                              "shift": np.full(c, shift[0], np.float32)})
    x = ctx.resolve(x)  # per row: the channels (axis 1) in the channels layout, else the last axis
    channels = len(x.shape) > 2 and ctx.layout_of(x) == CHANNELS
    x = ctx.act_channels(x) if channels else ctx.act_rows(x)
    c = ctx.layers[x.layer].rows
    weights = {"scale": np.broadcast_to(scale, (c,)).astype(np.float32),
               "shift": np.broadcast_to(shift, (c,)).astype(np.float32)}
    return ctx.emit_rows(name, "AFFINE", x, c, x.shape, attrs, weights)


def _through_view(ctx, v, name, attrs, scale, shift):
    """A scalar affine of a view (the queries of attention scaled after their head split) as the
    same view of the scaled source: no copy, and the scale can fold into the source's producer.
    Only when the view covers most of its source (the work stays about the same)."""
    if not (isinstance(v, View) and len(v.srcs) == 1 and isinstance(v.srcs[0], int)
            and v.index.size and v.index.min() >= 0):
        return None
    src = ctx.layers[v.srcs[0]]
    if 2 * v.index.size < src.columns * src.rows:
        return None
    c = src.rows
    y = ctx.emit_like(name, "AFFINE", Act(v.srcs[0], src.onnx_shape, src.layout), attrs,
                      {"scale": np.full(c, scale, np.float32),
                       "shift": np.full(c, shift, np.float32)})
    return View([y.layer], v.index, v.fill, v.name)


def _activation(act, alpha_attr=None, alpha=0.0, beta_attr=None, beta=0.0, kind=None):
    """``kind`` "bool": the result is one (IsNaN); "int": the result of an integer input is one
    (Abs, Floor, Ceil, Round, Sign give integers of integers, so casts of it to integer types
    remain the identity)."""
    def run(ctx, ins):
        if isinstance(ins[0], np.ndarray):  # refused before the attributes are read
            raise Unsupported("its data input is a constant; coacto computes on inputs")
        mark = kind == "bool" or (kind == "int" and ctx.is_integer(ins[0]))
        a = ctx.attr(alpha_attr, alpha) if alpha_attr else alpha
        b = ctx.attr(beta_attr, beta) if beta_attr else beta
        y = affine(ctx, ins[0], 1.0, 0.0, act, a, b)
        if mark:  # y may be a view of the layer computed (see _through_view)
            for li in (y.srcs if isinstance(y, View) else [y.layer]):
                ctx.kinds[li] = kind
        return [y]
    return run


def _clip_act(ctx, x, lo, hi):
    """``clip(x, lo, hi)``: a ReLU when that is what it is."""
    if lo == 0.0 and hi == np.inf:
        return affine(ctx, x, 1.0, 0.0, ir.ACT_RELU)
    return affine(ctx, x, 1.0, 0.0, ir.ACT_CLIP, lo, hi)


@op("Celu")
def _celu(ctx, ins):
    if ctx.attr("alpha", 1.0) == 0.0:
        raise ShapeError("Celu with alpha 0 (it divides by alpha)")
    return _activation(ir.ACT_CELU, "alpha", 1.0)(ctx, ins)


@op("Clip")
def _clip(ctx, ins):
    return [_clip_act(ctx, ins[0], *clip_bounds(ctx, ins))]


@op("PRelu")
def _prelu(ctx, ins):
    slope = np.asarray(ctx.const(ins[1], "slope"), np.float32).reshape(-1)
    if slope.size != 1 and not np.all(slope == slope[0]):
        raise Unsupported("PRelu with a slope per channel; coacto supports one slope")
    return [affine(ctx, ins[0], 1.0, 0.0, ir.ACT_LEAKY, float(slope[0]))]


@op("Max", "Min")
def _min_max(ctx, ins):
    """Max / Min of an activation and scalar constants (TF-style ReLU6): a clip."""
    consts = [v for v in ins if isinstance(v, np.ndarray)]
    acts = [v for v in ins if v is not None and not isinstance(v, np.ndarray)]
    kind = ir.BIN_MAX if ctx.node.op_type == "Max" else ir.BIN_MIN
    if len(acts) != 1 or any(np.asarray(k).size != 1 for k in consts):
        return [_chain(ctx, [v for v in ins if v is not None], kind, "")]
    x = ctx.resolve(acts[0])
    bound = [float(np.asarray(k).reshape(())) for k in consts]
    if ctx.node.op_type == "Max":
        lo, hi = (max(bound) if bound else -np.inf), np.inf
    else:
        lo, hi = -np.inf, (min(bound) if bound else np.inf)
    return [_clip_act(ctx, x, lo, hi)]


def _chain(ctx, vals, kind, prefix, last_named=True):
    """``vals[0] OP vals[1] OP ...``: the layers named ``node/<prefix><i>``, the last one after
    the node itself unless ``last_named`` is False."""
    acc = vals[0]
    for i, v in enumerate(vals[1:]):
        last = last_named and i == len(vals) - 2
        acc = binary_values(ctx, acc, v, kind,
                            ctx.node_name if last else f"{ctx.node_name}/{prefix}{i}")
    return acc


@op("Neg")
def _neg(ctx, ins):
    return [affine(ctx, ins[0], -1.0, 0.0)]


@op("Gelu")
def _gelu(ctx, ins):
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approx!r}")
    act = ir.ACT_GELU_TANH if approx == "tanh" else ir.ACT_GELU
    return [affine(ctx, ins[0], 1.0, 0.0, act)]


@op("Not")
def _not(ctx, ins):
    y = affine(ctx, ctx.as_bool(ctx.resolve(ins[0])), -1.0, 1.0)
    ctx.kinds[y.layer] = "bool"
    return [y]


_BIN_KIND = {"Add": ir.BIN_ADD, "Sub": ir.BIN_SUB, "Mul": ir.BIN_MUL, "Div": ir.BIN_DIV,
             "Equal": ir.BIN_EQUAL, "Less": ir.BIN_LESS, "Greater": ir.BIN_GREATER,
             "GreaterOrEqual": ir.BIN_GREATER_EQUAL, "LessOrEqual": ir.BIN_LESS_EQUAL,
             "Pow": ir.BIN_POW}


#: Kinds whose result is 1.0 / 0.0.
_COMPARISONS = (ir.BIN_EQUAL, ir.BIN_LESS, ir.BIN_GREATER, ir.BIN_GREATER_EQUAL,
                ir.BIN_LESS_EQUAL)


def emit_binary_const(ctx, x, k, kind, const_first, out_shape, name):
    k = np.asarray(k, np.float32)
    x = ctx.resolve(x)
    lay = ctx.layout_of(x)
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=int(const_first))
    if k.size == 1 and tuple(out_shape) == tuple(x.shape):  # a scalar: any storage will do
        return ctx.emit_like(name, "BINARY", x, attrs, {"k": k.reshape(1, 1, 1, 1)})
    x = ctx.operand(x, out_shape, lay)
    return ctx.emit(name, "BINARY", [x.layer], out_shape, attrs,
                    {"k": const_operand(k, out_shape, lay)}, layout=lay)


def binary_values(ctx, a, b, kind, name):
    """``a OP b`` for values of which at least one is computed."""
    out = tuple(np.broadcast_shapes(shape_of(a), shape_of(b)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        const_first = isinstance(a, np.ndarray)
        k, x = (a, b) if const_first else (b, a)
        k = np.asarray(k, np.float64)
        as_affine = kind <= ir.BIN_DIV and not (kind == ir.BIN_DIV and const_first)
        if as_affine and k.size == 1 and out == shape_of(x):  # a scalar: an affine of any storage
            return affine(ctx, x, *_affine_of(kind, k.reshape(-1)[0], const_first), name=name)
        x = ctx.resolve(x)
        if as_affine and out == x.shape and k.ndim <= len(out):
            vec = _per_row(k, len(out), row_axis(len(out), ctx.layout_of(x)))
            if vec is not None:
                return affine(ctx, x, *_affine_of(kind, vec, const_first), name=name)
        y = emit_binary_const(ctx, x, k, kind, const_first, out, name)
    else:
        y = _binary_acts(ctx, a, b, kind, out, name)
    if kind in _COMPARISONS:
        ctx.kinds[y.layer] = "bool"
    return y


def _binary_acts(ctx, a, b, kind, out, name):
    attrs = dict(kind=kind, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
    xa, xb = ctx.resolve(a), ctx.resolve(b)
    la, lb = ctx.layers[xa.layer], ctx.layers[xb.layer]
    if xa.shape == xb.shape == out and la.shape == lb.shape and \
            ir.same_layout(len(out), ctx.layout_of(xa), ctx.layout_of(xb)) and \
            (la.layout == lb.layout or len(out) <= 2):
        # the same storage order on both sides: elementwise over the storage as it is
        return ctx.emit_like(name, "BINARY", xa, attrs, inputs=[xa.layer, xb.layer])
    lay = ctx.layout_of(xa) if len(xa.shape) >= len(xb.shape) else ctx.layout_of(xb)
    xa, xb = ctx.operand(xa, out, lay), ctx.operand(xb, out, lay)
    return ctx.emit(name, "BINARY", [xa.layer, xb.layer], out, attrs, layout=lay)


def _affine_of(kind, k, const_first):
    """(scale, shift) of ``x OP k`` (``k OP x`` when const_first) for Add, Sub, Mul, Div; k a
    float64 scalar or per-row vector."""
    if kind == ir.BIN_ADD:
        return 1.0, k
    if kind == ir.BIN_SUB:
        return (-1.0, k) if const_first else (1.0, -k)
    if kind == ir.BIN_MUL:
        return k, 0.0
    return 1.0 / k, 0.0


def _per_row(k: np.ndarray, rank: int, axis: int):
    """The per-row vector of a constant broadcast over every axis but the row axis."""
    kp = k.reshape((1,) * (rank - k.ndim) + k.shape)
    if all(d == 1 for i, d in enumerate(kp.shape) if i != axis):
        return kp.reshape(-1)
    return None


@op("Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "GreaterOrEqual",
    "LessOrEqual")
def _binary(ctx, ins):
    with np.errstate(divide="ignore"):
        return [binary_values(ctx, ins[0], ins[1], _BIN_KIND[ctx.node.op_type], ctx.node_name)]


@op("And", "Or", "Xor")
def _logical(ctx, ins):
    """And, Or, Xor of bool tensors, at least one computed. Bools are 1.0 / 0.0 here (what the
    comparisons and a Cast to bool compute): And is their product, Or their maximum, Xor their
    inequality."""
    def as_bool(v):
        if isinstance(v, np.ndarray):
            return np.asarray(v != 0, np.float32)
        return ctx.as_bool(ctx.resolve(v))

    op = ctx.node.op_type
    a, b = as_bool(ins[0]), as_bool(ins[1])
    name = ctx.node_name
    if op == "Xor":
        eq = binary_values(ctx, a, b, ir.BIN_EQUAL, f"{name}/eq")
        y = affine(ctx, eq, -1.0, 1.0, name=name)
    else:
        y = binary_values(ctx, a, b, ir.BIN_MUL if op == "And" else ir.BIN_MAX, name)
    ctx.kinds[y.layer] = "bool"
    return [y]


@op("Sum", "Mean")
def _sum(ctx, ins):
    vals = [v for v in ins if v is not None]
    acc = _chain(ctx, vals, ir.BIN_ADD, "add", ctx.node.op_type == "Sum")
    if ctx.node.op_type == "Mean" and len(vals) > 1:
        acc = affine(ctx, acc, 1.0 / len(vals), 0.0, name=ctx.node_name)
    return [acc]


@op("Pow")
def _pow(ctx, ins):
    """x ** e: e = 1 is x, 2 is x * x, 0.5 a square root, others BINARY POW."""
    if not isinstance(ins[1], np.ndarray) or ins[1].size != 1 or isinstance(ins[0], np.ndarray):
        return _binary(ctx, ins)
    e = np.asarray(ins[1], np.float64).reshape(-1)
    x = ctx.resolve(ins[0])
    if e[0] == 1.0:
        return [x]
    if e[0] == 0.5:
        return [affine(ctx, x, 1.0, 0.0, ir.ACT_SQRT)]
    if e[0] == 2.0:
        attrs = dict(kind=ir.BIN_MUL, act=ir.ACT_NONE, alpha=0.0, beta=0.0, const_first=0)
        return [ctx.emit_like(ctx.node_name, "BINARY", x, attrs, inputs=[x.layer, x.layer])]
    return _binary(ctx, ins)


@op("Where")
def _where(ctx, ins):
    cond, x, y = vals = ins[:3]
    out = tuple(np.broadcast_shapes(*(shape_of(v) for v in vals)))
    if isinstance(cond, np.ndarray):
        c = np.asarray(cond).astype(bool)
        for pick, v in ((c.all(), x), ((~c).all(), y)):
            if pick and shape_of(v) == out and not isinstance(v, np.ndarray):
                return [v]
    lay = ctx.layout_of(ctx.resolve(next(v for v in vals if not isinstance(v, np.ndarray))))
    which, inputs, weights = 0, [], {}
    for o, (key, v) in enumerate(zip(("cond", "x", "y"), vals)):
        if isinstance(v, np.ndarray):
            weights[key] = const_operand(v, out, lay)
        else:
            which |= 1 << o
            inputs.append(ctx.operand(v, out, lay).layer)
    res = ctx.emit(ctx.node_name, "WHERE", inputs, out, {"operands": which}, weights,
                   layout=lay)
    if all(ctx.is_integer(v) if not isinstance(v, np.ndarray) else  # (an infinity is no integer)
           np.isfinite(v).all() and np.array_equal(v, np.round(v)) for v in (x, y)):
        ctx.kinds[res.layer] = "int"
    return [res]


register("compute", {
    "Relu": _activation(ir.ACT_RELU),
    "LeakyRelu": _activation(ir.ACT_LEAKY, "alpha", 0.01),
    "Sigmoid": _activation(ir.ACT_SIGMOID), "Tanh": _activation(ir.ACT_TANH),
    "HardSigmoid": _activation(ir.ACT_HARDSIGMOID, "alpha", 0.2, "beta", 0.5),
    "HardSwish": _activation(ir.ACT_HARDSWISH),
    "Elu": _activation(ir.ACT_ELU, "alpha", 1.0),
    # the defaults are the ONNX spec's float32 values of the self-normalising constants
    "Selu": _activation(ir.ACT_SELU, "alpha", 1.67326319217681884765625, "gamma",
                        1.05070102214813232421875),
    "Softplus": _activation(ir.ACT_SOFTPLUS), "Softsign": _activation(ir.ACT_SOFTSIGN),
    "ThresholdedRelu": _activation(ir.ACT_THRESHOLDED_RELU, "alpha", 1.0),
    "Abs": _activation(ir.ACT_ABS, kind="int"), "Floor": _activation(ir.ACT_FLOOR, kind="int"),
    "Ceil": _activation(ir.ACT_CEIL, kind="int"), "Round": _activation(ir.ACT_ROUND, kind="int"),
    "Sign": _activation(ir.ACT_SIGN, kind="int"), "Log": _activation(ir.ACT_LOG),
    "Erf": _activation(ir.ACT_ERF), "Sqrt": _activation(ir.ACT_SQRT),
    "Reciprocal": _activation(ir.ACT_RECIPROCAL), "Exp": _activation(ir.ACT_EXP),
    "IsNaN": _activation(ir.ACT_ISNAN, kind="bool"),
})
