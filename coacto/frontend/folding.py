"""Handlers of ONNX operators on constants (``fold``: numpy, when every input is a constant) and of
those that compute nothing (``shape``: Shape, Size; ``pass_through``: Identity, Dropout, Cast,
CastLike). ``clip_bounds`` and ``reduce_axes`` serve the computing forms too (coacto.frontend.ops).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from onnx import helper

from ..errors import ShapeError
from .registry import register
from .values import Unsupported, axis_index, check_result, shape_of


def _broadcast(*arrays) -> tuple[int, ...]:
    return check_result(np.broadcast_shapes(*(np.shape(a) for a in arrays)))


def _constant(ctx, ins):
    a = ctx.attrs
    if "value" in a:
        return [np.asarray(a["value"])]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return [np.array(a[key], dtype=dtype)]
    raise Unsupported(f"Constant with {sorted(a)} is not supported")


def _constant_of_shape(ctx, ins):
    value = ctx.attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if value.size != 1:
        raise ShapeError(f"ConstantOfShape value has {value.size} elements, not 1")
    return [np.full(check_result(ctx.ints(ins[0], "shape")), value[0], dtype=value.dtype)]


def _range(ctx, ins):
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins[:3])
    if float(delta) == 0:
        raise ShapeError("Range with delta 0")
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    check_result((n,))
    return [(start + np.arange(n) * delta).astype(start.dtype)]


def _int_div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        q = np.abs(a) // np.abs(b)
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)
    return np.divide(a, b).astype(a.dtype)


def _elementwise(fn, keep_type=True, result=_broadcast):
    """``fn`` of the inputs given, once ``result`` checked that its result may be allocated."""
    def run(ctx, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        result(*arrays)
        r = fn(*arrays)
        return [r.astype(arrays[0].dtype) if keep_type else r]
    return run


def _variadic(fn):
    def run(ctx, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        _broadcast(*arrays)
        return [functools.reduce(fn, arrays[1:], arrays[0]).astype(arrays[0].dtype)]
    return run


def _matmul_result(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("MatMul of a scalar")
    am = a.shape if a.ndim > 1 else (1,) + a.shape
    bm = b.shape if b.ndim > 1 else b.shape + (1,)
    check_result(np.broadcast_shapes(am[:-2], bm[:-2]) + (am[-2], bm[-1]))


def _where(ctx, ins):
    _broadcast(*ins[:3])
    return [np.where(ins[0], ins[1], ins[2])]


def _gather_elements(ctx, ins):
    x, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
    axis = axis_index(ctx.attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx, axis=axis)]


def _trilu(ctx, ins):
    k = int(np.asarray(ins[1]).reshape(())) if len(ins) > 1 and ins[1] is not None else 0
    x = np.asarray(ins[0])
    return [np.triu(x, k) if ctx.attr("upper", 1) else np.tril(x, k)]


def _clip_fold(ctx, ins):
    lo, hi = clip_bounds(ctx, ins)
    return [np.clip(ins[0], lo, hi).astype(np.asarray(ins[0]).dtype)]


def clip_bounds(ctx, ins):
    if ctx.opset < 11 or len(ins) == 1:
        lo, hi = ctx.attr("min", -np.inf), ctx.attr("max", np.inf)
    else:
        lo = -np.inf if len(ins) < 2 or ins[1] is None else \
            float(np.asarray(ctx.const(ins[1], "min")).reshape(-1)[0])
        hi = np.inf if len(ins) < 3 or ins[2] is None else \
            float(np.asarray(ctx.const(ins[2], "max")).reshape(-1)[0])
    f32max = float(np.finfo(np.float32).max)
    lo = -np.inf if lo <= -f32max else float(lo)
    hi = np.inf if hi >= f32max else float(hi)
    return lo, hi


def reduce_axes(ctx, ins, rank):
    axes = ctx.input_or_attr(ins, 1, "axes")
    if axes is None or len(axes) == 0:
        if ctx.attr("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    return tuple(sorted(axis_index(int(a), rank) for a in axes))


def _reduce_fold(fn):
    def run(ctx, ins):
        x = np.asarray(ins[0])
        axes = reduce_axes(ctx, ins, x.ndim)
        if not axes:
            return [x]
        r = fn(x, axis=axes, keepdims=bool(ctx.attr("keepdims", 1)))
        return [np.asarray(r).astype(x.dtype)]
    return run


def _cast(ctx, ins):
    """Computed data is float32 in coacto; integer and boolean inputs (ids, masks) travel as their
    float32 values. A cast to a float type keeps them; a cast of integer-valued data to an integer
    type is the identity; a cast to bool is ``x != 0``."""
    return _cast_to(ctx, ins[0], np.dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("to"))))


def _cast_like(ctx, ins):
    """Cast to the element type of the second input (of an activation: int64 when it holds integers,
    as ids do in the model, else float32). Exporters write it around constants
    (``CastLike(alpha, x)``) in the expanded forms of activations."""
    like = ins[1]
    if isinstance(like, np.ndarray):
        return _cast_to(ctx, ins[0], like.dtype)
    return _cast_to(ctx, ins[0], np.dtype(np.int64 if ctx.is_integer(like) else np.float32))


def _cast_to(ctx, x, to: np.dtype):
    if isinstance(x, np.ndarray):
        return [x.astype(to)]
    if to.kind == "f":
        return [x]
    if to == np.bool_:
        return [ctx.as_bool(x)]
    if to.kind in "iu" and ctx.is_integer(x):
        return [x]
    raise Unsupported(f"casts computed data to {to}; coacto computes in float32 (casts of integer "
                      "inputs and of comparisons are supported)")


def _identity(ctx, ins):
    return [ins[0]]


def _dropout(ctx, ins):
    if len(ins) > 2 and ins[2] is not None and \
            bool(np.asarray(ctx.const(ins[2], "training_mode"))):
        raise Unsupported("Dropout in training mode")
    return [ins[0]]


def _shape(ctx, ins):
    s = shape_of(ins[0])
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [np.array(s[start:end], dtype=np.int64)]


def _size(ctx, ins):
    return [np.array(math.prod(shape_of(ins[0])), dtype=np.int64)]


register("fold", {
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Add": _elementwise(np.add), "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply), "Div": _elementwise(_int_div),
    "Pow": _elementwise(np.power), "Mod": _elementwise(np.mod),
    "Sqrt": _elementwise(np.sqrt), "Neg": _elementwise(np.negative), "Abs": _elementwise(np.abs),
    "Exp": _elementwise(np.exp), "Log": _elementwise(np.log), "Sign": _elementwise(np.sign),
    "Reciprocal": _elementwise(np.reciprocal), "Floor": _elementwise(np.floor),
    "Ceil": _elementwise(np.ceil), "Round": _elementwise(np.round),
    "Relu": _elementwise(lambda x: np.maximum(x, 0)), "Clip": _clip_fold,
    "Sigmoid": _elementwise(lambda x: 1.0 / (1.0 + np.exp(-x))), "Tanh": _elementwise(np.tanh),
    "Equal": _elementwise(np.equal, False), "Less": _elementwise(np.less, False),
    "Greater": _elementwise(np.greater, False), "LessOrEqual": _elementwise(np.less_equal, False),
    "GreaterOrEqual": _elementwise(np.greater_equal, False),
    "Not": _elementwise(np.logical_not, False), "And": _elementwise(np.logical_and, False),
    "Or": _elementwise(np.logical_or, False), "Xor": _elementwise(np.logical_xor, False),
    "Where": _where, "Trilu": _trilu, "GatherElements": _gather_elements,
    "IsNaN": _elementwise(np.isnan, False),
    "Erf": _elementwise(np.vectorize(math.erf, otypes=[np.float64])),
    "Min": _variadic(np.minimum), "Max": _variadic(np.maximum), "Sum": _variadic(np.add),
    "Mean": _elementwise(lambda *arrays: sum(arrays) / len(arrays)),
    "MatMul": _elementwise(np.matmul, result=_matmul_result),
    "ReduceSum": _reduce_fold(np.sum), "ReduceProd": _reduce_fold(np.prod),
    "ReduceMean": _reduce_fold(np.mean), "ReduceMax": _reduce_fold(np.max),
    "ReduceMin": _reduce_fold(np.min),
})

register("shape", {"Shape": _shape, "Size": _size})

register("pass_through", {"Identity": _identity, "Dropout": _dropout, "Cast": _cast,
                          "CastLike": _cast_like})
