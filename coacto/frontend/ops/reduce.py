"""Operators along axes: the reductions (Reduce*; a ROW_REDUCE over the rows of a layout, a
GLOBAL_POOL over all spatial axes, other axes moved last first), Softmax, LogSoftmax and
LayerNormalization (along the rows, or other axes moved last).
"""
from __future__ import annotations

import math

import numpy as np

from ... import ir
from ...errors import ShapeError
from ..folding import reduce_axes
from ..registry import op, register
from ..values import CHANNELS, LAST, View, axis_index, shape_of
from .elementwise import affine


#: ReduceMin's kind: a row reduction only (GLOBAL_POOL has no minimum)
REDUCE_MIN_ONLY = "min"
_ROW_REDUCE = {ir.POOL_AVG: ir.REDUCE_MEAN, ir.POOL_MAX: ir.REDUCE_MAX,
               REDUCE_MIN_ONLY: ir.REDUCE_MIN}


def _reduce(kind, total=False):
    def run(ctx, ins):
        v = ctx.resolve(ins[0])
        r = len(v.shape)
        axes = set(reduce_axes(ctx, ins, r))
        keep = bool(ctx.attr("keepdims", 1))
        out = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keep or i not in axes)
        rows = [i for i in sorted(axes) if v.shape[i] != 1]
        if not rows:  # over axes of size 1 only (or none, noop_with_empty_axes): the input
            return [ctx.reshaped(v, out)]
        if len(rows) == 1 and r >= 2 and rows[0] in (r - 1, 1):
            # the rows of a sequence's last axis, or a CNN's channels
            return [_row_reduce(ctx, v, rows[0], kind, total, out)]
        if kind == REDUCE_MIN_ONLY or rows != [i for i in range(2, r) if v.shape[i] != 1]:
            return [_reduce_moved(ctx, v, rows, kind, total, out)]
        x = ctx.act(v, CHANNELS)  # over every spatial axis: one GLOBAL_POOL, no copy
        y = ctx.emit(ctx.node_name, "GLOBAL_POOL", [x.layer], out, {"kind": kind})
        if total:  # ReduceSum: the mean times the number of positions
            y = affine(ctx, y, float(math.prod(x.shape[2:])), 0.0, name=ctx.node_name + "/sum")
        return [y]
    return run


def _row_reduce(ctx, v, axis, kind, total, out):
    """A reduction over the row axis of a layout (the last axis, or a CNN's channels): one value
    per column. The result keeps the input's columns."""
    shape = shape_of(v)
    lay = LAST if axis == len(shape) - 1 else CHANNELS
    x = ctx.act_rows(v) if lay == LAST else ctx.act(v, CHANNELS)
    red = ir.REDUCE_SUM if total else _ROW_REDUCE[kind]
    kept = tuple(1 if i == axis else d for i, d in enumerate(shape))
    y = ctx.emit_rows(ctx.node_name, "ROW_REDUCE", x, 1, kept, {"kind": red})
    return y if tuple(out) == kept else ctx.reshaped(y, out)


def _reduce_moved(ctx, v, axes, kind, total, out):
    """A reduction over other axes (a CNN's height or width, the batch, a sequence's tokens,
    several at once): those axes moved last as one, which copies the tensor once through a
    GATHER, then reduced as rows. The copy costs about what the reduction does, and one
    ROW_REDUCE then serves every set of axes (a POOL window would need none, but only for H, W)."""
    # one copy straight into rows, not a copy in the input's layout and another into rows
    x = ctx.act(_axes_last(ctx, v, axes)[0], LAST)
    y = _row_reduce(ctx, x, len(x.shape) - 1, kind, total, x.shape[:-1] + (1,))
    # the reduced axes have size 1 now: moving them back changes no element's place
    return ctx.reshaped(y, out)


def _softmax(log):
    def run(ctx, ins):
        v = ctx.resolve(ins[0])
        r = len(v.shape)
        axis = axis_index(ctx.attr("axis", 1 if ctx.opset < 13 else -1), r)
        # Before opset 13 the input is coerced to 2-D: softmax over every axis from `axis` on.
        reduced = range(axis, r) if ctx.opset < 13 else [axis]
        big = [i for i in reduced if v.shape[i] != 1]
        row = big[0] if big else axis
        attrs = {"log": int(log)}
        if len(big) > 1 or row != r - 1 and not (r > 2 and row == 1):
            return [_on_moved_axes(ctx, v, big or [row], lambda x: ctx.emit_rows(
                ctx.node_name, "SOFTMAX", x, x.shape[-1], x.shape, attrs))]
        x = ctx.act_rows(v) if row == r - 1 else ctx.act(v, CHANNELS)
        c = ctx.layers[x.layer].rows
        return [ctx.emit_rows(ctx.node_name, "SOFTMAX", x, c, x.shape, attrs)]
    return run


def _on_moved_axes(ctx, v, axes, emit) -> View:
    """``emit(x)`` for an op along the rows, on ``axes`` of ``v`` instead: those axes moved last
    as one (a GATHER unless they are last already), the result moved back (a view)."""
    moved, order = _axes_last(ctx, v, axes)
    y = ctx.as_view(emit(ctx.act_rows(moved)))
    back = y.index.reshape([shape_of(v)[i] for i in order]).transpose(np.argsort(order))
    return View(y.srcs, np.ascontiguousarray(back), name=ctx.node_name)


def _axes_last(ctx, v, axes):
    """``v`` with ``axes`` moved last as one (a view), and the order that moved them."""
    view = ctx.as_view(v)
    order = [i for i in range(view.index.ndim) if i not in axes] + list(axes)
    index = view.index.transpose(order)
    merged = index.reshape(index.shape[:view.index.ndim - len(axes)] + (-1,))
    return View(view.srcs, np.ascontiguousarray(merged), view.fill, view.name), order


@op("LayerNormalization")
def _layer_norm(ctx, ins):
    x = ins[0]
    shp = shape_of(x)
    axis = axis_index(ctx.attr("axis", -1), len(shp))
    d = math.prod(shp[axis:])

    def per_feature(v, what):
        p = np.asarray(ctx.const(v, what), np.float32)
        p = p.reshape(p.shape[next((i for i, n in enumerate(p.shape) if n != 1), p.ndim):])
        try:  # (leading axes of size 1 dropped: a (1, d) scale is a (d,) one)
            return np.broadcast_to(p, shp[axis:]).reshape(-1).copy()
        except ValueError:
            raise ShapeError(f"{what} of shape {p.shape} for features of shape "
                             f"{shp[axis:]}") from None

    bias = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(1, np.float32)
    weights = {"scale": per_feature(ins[1], "the scale input"),
               "shift": per_feature(bias, "the bias input B")}
    attrs = {"eps": float(ctx.attr("epsilon", 1e-5))}
    if any(shp[i] != 1 for i in range(axis, len(shp) - 1)):  # over several axes: merged
        return [_on_moved_axes(ctx, x, range(axis, len(shp)), lambda xr: ctx.emit_rows(
            ctx.node_name, "LAYERNORM", xr, d, xr.shape, attrs, weights))]
    return [ctx.emit_rows(ctx.node_name, "LAYERNORM", ctx.act_rows(x), d, shp, attrs, weights)]


register("compute", {
    "ReduceMean": _reduce(ir.POOL_AVG), "ReduceMax": _reduce(ir.POOL_MAX),
    "ReduceSum": _reduce(ir.POOL_AVG, total=True), "ReduceMin": _reduce(REDUCE_MIN_ONLY),
    "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
})
