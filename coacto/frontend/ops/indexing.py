"""Indexing operators: pure index mappings (Reshape, Transpose, Slice, Gather, Pad, Concat, ...).
Their handlers run on constants (folding) and on index arrays (``Context.index_map``: views of
layers); ``ctx.indexing`` tells which. Concat along the rows and Gather of a constant table by
computed ids (an embedding) compute.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ..registry import op, register
from ..values import CHANNELS, LAST, Act, Unsupported, View, axis_index, check_result, row_axis
from ..values import shape_of


def _reshape(ctx, ins):
    x = ins[0]
    shape = ctx.input_or_attr(ins, 1, "shape")
    if shape is None:
        raise Unsupported("Reshape without a shape")
    if not ctx.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(ctx, ins):
    x = ins[0]
    a = ctx.attr("axis", 1)
    a = a + x.ndim if a < 0 else a  # axis is in [-r, r]
    if not 0 <= a <= x.ndim:
        raise ShapeError(f"Flatten axis {ctx.attr('axis')} for rank {x.ndim}")
    return [x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))]


def _transpose(ctx, ins):
    return [np.transpose(ins[0], ctx.attr("perm"))]


def _squeeze(ctx, ins):
    x = ins[0]
    axes = ctx.input_or_attr(ins, 1, "axes")
    if axes is None:
        return [x.reshape([d for d in x.shape if d != 1])]
    axes = tuple(axis_index(int(a), x.ndim) for a in axes)
    return [np.squeeze(x, axis=axes)]


def _unsqueeze(ctx, ins):
    x = ins[0]
    axes = ctx.input_or_attr(ins, 1, "axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(axis_index(int(a), rank) for a in axes)))]


def _slice(ctx, ins):
    x = ins[0]
    if len(ins) > 1:
        starts, ends = ctx.ints(ins[1], "starts"), ctx.ints(ins[2], "ends")
        axes = ctx.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = ctx.ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    else:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ShapeError("Slice step 0")
        index[axis_index(a, x.ndim)] = slice(s, e, st)
    return [x[tuple(index)]]


def _split(ctx, ins):
    x = ins[0]
    axis = axis_index(ctx.attr("axis", 0), x.ndim)
    split = ctx.input_or_attr(ins, 1, "split")
    dim = x.shape[axis]
    if split is None:
        n = ctx.attr("num_outputs", len(ctx.node.output))
        chunk = -(-dim // n)
        split = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(split) != dim:
        raise ShapeError(f"Split sizes {split} do not add up to {dim}")
    return np.split(x, np.cumsum(split)[:-1].tolist(), axis=axis)


@op("Concat", kind="indexing", data="all")
def _concat_arrays(ctx, ins):
    arrays = [v for v in ins if v is not None]
    axis = axis_index(ctx.attr("axis", 0), arrays[0].ndim)
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] if a.ndim == len(shape) else 0 for a in arrays)
    check_result(shape)
    return [np.concatenate(arrays, axis=axis)]


def _gather(ctx, ins):
    x = ins[0]
    idx = np.asarray(ctx.const(ins[1], "indices")).astype(np.int64)
    axis = axis_index(ctx.attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        raise ShapeError(f"Gather index out of range for dimension {x.shape[axis]}")
    check_result(x.shape[:axis] + idx.shape + x.shape[axis + 1:])
    return [np.take(x, idx, axis=axis)]


def _expand(ctx, ins):
    x = ins[0]
    shape = check_result(np.broadcast_shapes(x.shape, tuple(ctx.ints(ins[1], "shape"))))
    return [np.ascontiguousarray(np.broadcast_to(x, shape))]


def _tile(ctx, ins):
    x, repeats = ins[0], ctx.ints(ins[1], "repeats")
    if len(repeats) != x.ndim or min(repeats, default=0) < 0:
        raise ShapeError(f"Tile repeats {repeats} for an input of shape {x.shape}")
    check_result([d * k for d, k in zip(x.shape, repeats)])
    return [np.tile(x, repeats)]


def _pad(ctx, ins):
    x = ins[0]
    mode = ctx.attr("mode", "constant")
    if len(ins) > 1 and ins[1] is not None:
        pads = ctx.ints(ins[1], "pads")
        value = 0.0 if len(ins) < 3 or ins[2] is None else \
            float(np.asarray(ctx.const(ins[2], "value")).reshape(-1)[0])
        axes = ctx.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
    else:
        pads = ctx.attr("pads", ctx.attr("paddings"))
        value, axes = float(ctx.attr("value", 0.0)), None
    r = x.ndim
    if axes is not None:
        full = [0] * (2 * r)
        for i, a in enumerate(axes):
            a = axis_index(a, r)
            full[a], full[a + r] = pads[i], pads[i + len(axes)]
        pads = full
    if len(pads) != 2 * r:
        raise ShapeError(f"Pad has {len(pads)} pads for rank {r}")
    width = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    check_result([d + b + e for d, (b, e) in zip(x.shape, width)])
    if mode == "constant":
        y = np.pad(x, width, constant_values=-1 if ctx.indexing else value)
    elif mode in ("reflect", "edge", "wrap"):
        y = np.pad(x, width, mode=mode)
    else:
        raise Unsupported(f"Pad mode {mode!r}")
    crop = tuple(slice(max(-pads[i], 0), y.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    ctx.last_pad = (mode, pads, value)
    return [y[crop]]


def _depth_to_space(ctx, ins):
    x = ins[0]
    bs = ctx.attr("blocksize")
    b, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "CRD":
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    return [y.reshape(b, c // (bs * bs), h * bs, w * bs)]


def _space_to_depth(ctx, ins):
    x = ins[0]
    bs = ctx.attr("blocksize")
    b, c, h, w = x.shape
    y = x.reshape(b, c, h // bs, bs, w // bs, bs)
    # DCR (the only order before opset 28): the block offset outermost; CRD: the channel
    y = y.transpose(0, 1, 3, 5, 2, 4) if ctx.attr("mode", "DCR") == "CRD" else \
        y.transpose(0, 3, 5, 1, 2, 4)
    return [y.reshape(b, c * bs * bs, h // bs, w // bs)]


_NEAREST = {"round_prefer_floor": lambda v: np.ceil(v - 0.5),
            "round_prefer_ceil": lambda v: np.floor(v + 0.5), "floor": np.floor, "ceil": np.ceil}


def _resize(ctx, ins):
    """Nearest-neighbour Resize / Upsample: a copy, hence an index mapping."""
    x = ins[0]
    if ctx.attr("mode", "nearest") != "nearest":
        raise Unsupported(f"mode {ctx.attr('mode')!r}; coacto resizes with mode 'nearest' only")
    scales = sizes = None
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        scales = ins[1] if len(ins) > 1 else np.array(ctx.attr("scales"), np.float32)
        scales = np.asarray(ctx.const(scales, "scales"), np.float64).reshape(-1)
        ctm, nearest = "asymmetric", "floor"
    else:
        if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size:
            scales = np.asarray(ctx.const(ins[2], "scales"), np.float64).reshape(-1)
        elif len(ins) > 3 and ins[3] is not None:
            sizes = ctx.ints(ins[3], "sizes")
        else:
            raise Unsupported("Resize without scales or sizes")
        ctm = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest = ctx.attr("nearest_mode", "round_prefer_floor")
        if sizes is not None and ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise Unsupported("keep_aspect_ratio_policy other than 'stretch'")
    axes = [axis_index(a, x.ndim) for a in ctx.attr("axes", list(range(x.ndim)))]
    if nearest not in _NEAREST:
        raise Unsupported(f"nearest_mode {nearest!r}")
    plan, shape = [], list(x.shape)
    for i, a in enumerate(axes):
        n_in = x.shape[a]
        if sizes is not None:
            n_out = sizes[i]
            s = n_out / n_in
        else:
            s = float(scales[i])
            n_out = int(math.floor(n_in * s))
        if not (n_out > 0 and s > 0):
            raise ShapeError(f"Resize of axis {a} from {n_in} to {n_out} (scale {s})")
        plan.append((a, n_in, n_out, s))
        shape[a] = n_out
    check_result(shape)
    for a, n_in, n_out, s in plan:
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


register("indexing", {
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Slice": _slice, "Split": _split,
    "Gather": _gather, "Expand": _expand, "Tile": _tile, "Pad": _pad,
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "Resize": _resize, "Upsample": _resize,
})


# ---------------------------------------------------------------------------------- computing forms

@op("Concat")
def _concat(ctx, ins):
    vals = [v for v in ins if v is not None]
    r = len(shape_of(vals[0]))
    axis = axis_index(ctx.attr("axis", 0), r)
    first = next((v for v in vals if not isinstance(v, np.ndarray)), None)
    lay = ctx.layout_of(ctx.resolve(first)) if isinstance(first, (Act, View)) else CHANNELS
    if r > 4 or any(isinstance(v, np.ndarray) for v in vals) or axis != row_axis(r, lay):
        return ctx.index_map("Concat", ins)
    acts = [ctx.act(v, lay) for v in vals]
    name = ctx.node_name
    while len(acts) > 8:  # the runtime concatenates at most 8 inputs at once
        part = acts[:8]
        shape = list(part[0].shape)
        shape[axis] = sum(a.shape[axis] for a in part)
        first = ctx.emit(f"{name}/part", "CONCAT", [a.layer for a in part], shape, layout=lay)
        acts = [first] + acts[8:]
    if len(acts) == 1:
        return [acts[0]]
    shape = list(acts[0].shape)
    for a in acts:
        if len(a.shape) != r or any(a.shape[i] != shape[i] for i in range(r) if i != axis):
            raise ShapeError(f"concatenation of shapes {[x.shape for x in acts]}")
    shape[axis] = sum(a.shape[axis] for a in acts)
    return [ctx.emit(name, "CONCAT", [a.layer for a in acts], shape, layout=lay)]


@op("Gather")
def _gather_compute(ctx, ins):
    """Gather: rows of a constant table picked by computed ids is an embedding (EMBED); anything
    with constant indices is an index mapping."""
    table, ids = ins[0], ins[1]
    if not isinstance(table, np.ndarray) or isinstance(ids, np.ndarray):
        return ctx.index_map("Gather", ins)
    if axis_index(ctx.attr("axis", 0), max(table.ndim, 1)) != 0:
        raise Unsupported("Gather of a constant along an axis other than 0 by computed indices")
    if not ctx.is_integer(ids):
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
    x = ctx.resolve(ids)
    if len(x.shape) > 2 and ctx.layout_of(x) != LAST:
        x = ctx.act(x, LAST)  # one id per output column, in row-major order
    _note_index_limit(ctx, x.layer, v)
    shape = out if table.ndim == 2 else tuple(ids_shape) + (1,)
    y = ctx.emit(ctx.node_name, "EMBED", [x.layer], shape, {}, {"table": tbl}, layout=LAST)
    return [y if y.shape == out and tbl.shape[1] == y.shape[-1] else ctx.reshaped(y, out)]


def _note_index_limit(ctx, layer: int, v: int) -> None:
    """Tells the integer inputs the ids come from the table size, for the runtime's check."""
    todo = [layer]
    while todo:
        li = todo.pop()
        lay = ctx.layers[li]
        if lay.op == "INPUT":
            lay.attrs["index_limit"] = min(int(lay.attrs.get("index_limit", v)), int(v))
        elif lay.op == "GATHER":
            todo.extend(lay.inputs)
