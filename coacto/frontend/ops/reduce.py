"""Operators over one axis: the reductions (Reduce*; a ROW_REDUCE over the rows of a layout, a
GLOBAL_POOL over all spatial axes, another axis moved last first), Softmax, LogSoftmax and
LayerNormalization.
"""
from __future__ import annotations

import math

import numpy as np

from ... import ir
from ...errors import ShapeError
from ..folding import reduce_axes
from ..registry import op, register
from ..values import CHANNELS, LAST, Unsupported, View, axis_index, shape_of
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
        rows = {i for i in axes if v.shape[i] != 1}
        if not rows:  # over axes of size 1 only (or none, noop_with_empty_axes): the input
            return [ctx.reshaped(v, out)]
        if len(rows) == 1 and r >= 2:
            # over one axis: the rows of a sequence's last axis, or a CNN's channels
            axis = rows.pop()
            if axis in (r - 1, 1):
                return [_row_reduce(ctx, v, axis, kind, total, out)]
            return [_reduce_moved(ctx, v, axis, kind, total, out)]
        if kind == REDUCE_MIN_ONLY:
            raise Unsupported(f"ReduceMin over axes {sorted(axes)} of a rank-{r} tensor; coacto "
                              "reduces the minimum over one axis (of size above 1)")
        x = ctx.act(v, CHANNELS)
        spatial = set(range(2, r))
        ones = {i for i in spatial if x.shape[i] == 1}
        if r < 3 or not axes or (axes | ones) != spatial or not axes <= spatial:
            raise Unsupported(f"reduction over axes {sorted(axes)} of a rank-{r} tensor; coacto "
                              "reduces over all spatial axes ([2, 3]), the channels (1) or the "
                              "last axis")
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


def _reduce_moved(ctx, v, axis, kind, total, out):
    """A reduction over another single axis (a CNN's height or width, the batch, a sequence's
    tokens): that axis moved last, which copies the tensor once through a GATHER, then reduced
    as rows. The copy costs about what the reduction does, and one ROW_REDUCE then serves every
    axis (a POOL window over H or W alone would need none, but only for those two axes)."""
    view = ctx.as_view(v)
    index = np.ascontiguousarray(np.moveaxis(view.index, axis, -1))
    # one copy straight into rows, not a copy in the input's layout and another into rows
    moved = ctx.act(View(view.srcs, index, view.fill, view.name), LAST)
    kept = index.shape[:-1] + (1,)
    y = _row_reduce(ctx, moved, index.ndim - 1, kind, total, kept)
    # the reduced axis has size 1 now: moving it back changes no element's place
    return ctx.reshaped(y, out)


def _softmax(log):
    def run(ctx, ins):
        v = ctx.resolve(ins[0])
        r = len(v.shape)
        axis = axis_index(ctx.attr("axis", 1 if ctx.opset < 13 else -1), r)
        # Before opset 13 the input is coerced to 2-D: softmax over every axis from `axis` on.
        reduced = range(axis, r) if ctx.opset < 13 else [axis]
        big = [i for i in reduced if v.shape[i] != 1]
        if len(big) > 1:
            raise Unsupported(f"softmax over axes {list(reduced)} of shape {v.shape}; coacto "
                              "computes softmax over one axis")
        row = big[0] if big else axis
        if r <= 2 or row == r - 1:
            x = ctx.act_rows(v)
        elif row == 1:
            x = ctx.act(v, CHANNELS)
        else:
            raise Unsupported(f"softmax over axis {axis} of shape {v.shape}; coacto computes "
                              "softmax over the channels (axis 1) or the last axis")
        c = ctx.layers[x.layer].rows
        return [ctx.emit_rows(ctx.node_name, "SOFTMAX", x, c, x.shape, {"log": int(log)})]
    return run


@op("LayerNormalization")
def _layer_norm(ctx, ins):
    x = ins[0]
    shp = shape_of(x)
    r = len(shp)
    axis = axis_index(ctx.attr("axis", -1), r)
    if any(shp[i] != 1 for i in range(axis, r - 1)):
        raise Unsupported(f"LayerNormalization over axes {list(range(axis, r))} of shape {shp}; "
                          "coacto normalises over the last axis")
    d = shp[-1]
    scale = np.asarray(ctx.const(ins[1], "the scale input"), np.float32).reshape(-1)
    bias = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(1, np.float32)
    bias = np.asarray(ctx.const(bias, "the bias input B"), np.float32).reshape(-1)
    if scale.size not in (1, d) or bias.size not in (1, d):
        raise ShapeError(f"scale of {scale.size} and bias of {bias.size} values for {d} features")
    xr = ctx.act_rows(x)
    weights = {"scale": np.broadcast_to(scale, (d,)).copy(),
               "shift": np.broadcast_to(bias, (d,)).copy()}
    return [ctx.emit_rows(ctx.node_name, "LAYERNORM", xr, d, shp,
                          {"eps": float(ctx.attr("epsilon", 1e-5))}, weights)]


register("compute", {
    "ReduceMean": _reduce(ir.POOL_AVG), "ReduceMax": _reduce(ir.POOL_MAX),
    "ReduceSum": _reduce(ir.POOL_AVG, total=True), "ReduceMin": _reduce(REDUCE_MIN_ONLY),
    "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
})
