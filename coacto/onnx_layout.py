"""ONNX operators that compute nothing: constant folding and index mappings (layout ops).

Every function takes the importer and the node's input values and returns its output values.

- ``FOLD``: evaluated with numpy when every input is a constant (Shape -> Gather -> Unsqueeze ->
  Concat -> Reshape subgraphs and the like vanish).
- ``LAYOUT``: pure index mappings. They run on constants (folding) and on index arrays (views of
  layers, see coacto.onnx_import): ``imp.indexing`` tells which, for the one case that differs
  (the fill of a constant Pad). ``LAYOUT_DATA`` names the inputs that carry data.
- ``SHAPE_OPS`` / ``PASS_THROUGH``: accept any kind of input.

Layers are emitted by coacto.onnx_ops and coacto.onnx_seq.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from . import ir
from .errors import ShapeError

# ---------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Act:
    """An activation: the storage of layer ``layer`` read as a tensor of ONNX shape ``shape`` in
    layout ``layout`` ("" for the layer's own). Usually the layer's own shape; a reshape that
    keeps the storage order (a flatten of positions, a view of a sequence's rows) gives another
    shape of the same storage, which ops computing row by row can read without a copy."""

    layer: int
    shape: tuple[int, ...]
    layout: str = ""


class Const:
    """Constant values taking part in an index mapping (a class token concatenated to a sequence of
    patch embeddings): ``values`` in row-major order. Compared by identity."""

    def __init__(self, values):
        self.values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


@dataclass(eq=False)
class View:
    """An index mapping of layers: ``index`` has the value's ONNX shape; each entry is a flat index
    into the concatenated *storage* of ``srcs`` (layer indices, or Const values), or -1 for
    ``fill``."""

    srcs: list
    index: np.ndarray
    fill: float = 0.0
    name: str = ""
    pad: tuple | None = None  # (Act, (pt, pl, pb, pr)) when a zero spatial Pad of a 4-D layer
    acts: dict = field(default_factory=dict)  # layout requested ("" for any) -> the Act it became


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


def axis_index(a: int, rank: int) -> int:
    if not -rank <= a < rank:
        raise ShapeError(f"axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def channel_axis(rank: int) -> int:
    return 1 if rank >= 2 else 0


def check_result(shape) -> tuple[int, ...]:
    """``shape`` when a result of that shape may be allocated (ir.MAX_TENSOR_ELEMENTS): the ops
    below whose result can be much larger than their inputs check it before computing."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ShapeError(f"its result would have shape {shape}, with a negative dimension")
    ir.check_elements(shape, "its result")
    return shape


def _broadcast(*arrays) -> tuple[int, ...]:
    return check_result(np.broadcast_shapes(*(np.shape(a) for a in arrays)))


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
    if value.size != 1:
        raise ShapeError(f"ConstantOfShape value has {value.size} elements, not 1")
    return [np.full(check_result(imp._ints(ins[0], "shape")), value[0], dtype=value.dtype)]


def _range(imp, ins):
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


def _elementwise(fn, keep_type=True):
    def run(imp, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        if fn is np.matmul:
            _matmul_result(*arrays)
        else:
            _broadcast(*arrays)
        r = fn(*arrays)
        return [r.astype(arrays[0].dtype) if keep_type else r]
    return run


def _variadic(fn):
    def run(imp, ins):
        arrays = [np.asarray(v) for v in ins if v is not None]
        _broadcast(*arrays)
        r = arrays[0]
        for a in arrays[1:]:
            r = fn(r, a)
        return [r.astype(arrays[0].dtype)]
    return run


def _mean_fold(imp, ins):
    arrays = [np.asarray(v) for v in ins if v is not None]
    _broadcast(*arrays)
    return [(sum(arrays) / len(arrays)).astype(arrays[0].dtype)]


def _matmul_result(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("MatMul of a scalar")
    am = a.shape if a.ndim > 1 else (1,) + a.shape
    bm = b.shape if b.ndim > 1 else b.shape + (1,)
    check_result(np.broadcast_shapes(am[:-2], bm[:-2]) + (am[-2], bm[-1]))


def _where(imp, ins):
    _broadcast(*ins[:3])
    return [np.where(ins[0], ins[1], ins[2])]


def _gather_elements(imp, ins):
    x, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
    axis = axis_index(imp._attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx, axis=axis)]


def _trilu(imp, ins):
    k = int(np.asarray(ins[1]).reshape(())) if len(ins) > 1 and ins[1] is not None else 0
    x = np.asarray(ins[0])
    return [np.triu(x, k) if imp._attr("upper", 1) else np.tril(x, k)]


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _clip_fold(imp, ins):
    lo, hi = clip_bounds(imp, ins)
    return [np.clip(ins[0], lo, hi).astype(np.asarray(ins[0]).dtype)]


def clip_bounds(imp, ins):
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


def reduce_axes(imp, ins, rank):
    axes = imp._input_or_attr(ins, 1, "axes")
    if axes is None or len(axes) == 0:
        if imp._attr("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    return tuple(sorted(axis_index(int(a), rank) for a in axes))


def _reduce_fold(fn):
    def run(imp, ins):
        x = np.asarray(ins[0])
        axes = reduce_axes(imp, ins, x.ndim)
        if not axes:
            return [x]
        r = fn(x, axis=axes, keepdims=bool(imp._attr("keepdims", 1)))
        return [np.asarray(r).astype(x.dtype)]
    return run


def _cast(imp, ins):
    """Computed data is float32 in coacto; integer and boolean inputs (ids, masks) travel as their
    float32 values. A cast to a float type keeps them; a cast of integer-valued data to an integer
    type is the identity; a cast to bool is ``x != 0``."""
    return _cast_to(imp, ins[0], np.dtype(helper.tensor_dtype_to_np_dtype(imp._attr("to"))))


def _cast_like(imp, ins):
    """Cast to the element type of the second input: a constant's own type, else what the
    activation holds (integer-valued inputs such as ids are int64 in the model, computed data
    float32). Exporters write it around constants (``CastLike(alpha, x)``) in the expanded forms
    of activations."""
    like = ins[1]
    if isinstance(like, np.ndarray):
        to = like.dtype
    else:
        to = np.dtype(np.int64) if imp._is_integer(like) else np.dtype(np.float32)
    return _cast_to(imp, ins[0], to)


def _cast_to(imp, x, to: np.dtype):
    if isinstance(x, np.ndarray):
        return [x.astype(to)]
    if to.kind == "f":
        return [x]
    if to == np.bool_:
        return [imp._as_bool(x)]
    if to.kind in "iu" and imp._is_integer(x):
        return [x]
    raise Unsupported(f"casts computed data to {to}; coacto computes in float32 (casts of integer "
                      "inputs and of comparisons are supported)")


def _identity(imp, ins):
    return [ins[0]]


def _dropout(imp, ins):
    training = len(ins) > 2 and ins[2] is not None and \
        bool(np.asarray(imp._const(ins[2], "training_mode")))
    if training:
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
    axes = tuple(axis_index(int(a), x.ndim) for a in axes)
    return [np.squeeze(x, axis=axes)]


def _unsqueeze(imp, ins):
    x = ins[0]
    axes = imp._input_or_attr(ins, 1, "axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(axis_index(int(a), rank) for a in axes)))]


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
        index[axis_index(a, x.ndim)] = slice(s, e, st)
    return [x[tuple(index)]]


def _split(imp, ins):
    x = ins[0]
    axis = axis_index(imp._attr("axis", 0), x.ndim)
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
    axis = axis_index(imp._attr("axis", 0), arrays[0].ndim)
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] if a.ndim == len(shape) else 0 for a in arrays)
    check_result(shape)
    return [np.concatenate(arrays, axis=axis)]


def _gather(imp, ins):
    x = ins[0]
    idx = np.asarray(imp._const(ins[1], "indices")).astype(np.int64)
    axis = axis_index(imp._attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        raise ShapeError(f"Gather index out of range for dimension {x.shape[axis]}")
    check_result(x.shape[:axis] + idx.shape + x.shape[axis + 1:])
    return [np.take(x, idx, axis=axis)]


def _expand(imp, ins):
    x = ins[0]
    shape = check_result(np.broadcast_shapes(x.shape, tuple(imp._ints(ins[1], "shape"))))
    return [np.ascontiguousarray(np.broadcast_to(x, shape))]


def _tile(imp, ins):
    x, repeats = ins[0], imp._ints(ins[1], "repeats")
    if len(repeats) != x.ndim or min(repeats, default=0) < 0:
        raise ShapeError(f"Tile repeats {repeats} for an input of shape {x.shape}")
    check_result([d * k for d, k in zip(x.shape, repeats)])
    return [np.tile(x, repeats)]


def _pad(imp, ins):
    x = ins[0]
    mode = imp._attr("mode", "constant")
    if len(ins) > 1 and ins[1] is not None:
        pads = imp._ints(ins[1], "pads")
        value = ins[2] if len(ins) > 2 and ins[2] is not None else None
        if value is not None:
            value = float(np.asarray(imp._const(value, "value")).reshape(-1)[0])
        value = 0.0 if value is None else value
        axes = imp._ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
    else:
        pads = imp._attr("pads", imp._attr("paddings"))
        value, axes = float(imp._attr("value", 0.0)), None
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
    y = x.reshape(b, c, h // bs, bs, w // bs, bs)
    # DCR (the only order before opset 28): the block offset outermost; CRD: the channel
    y = y.transpose(0, 1, 3, 5, 2, 4) if imp._attr("mode", "DCR") == "CRD" else \
        y.transpose(0, 3, 5, 1, 2, 4)
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
    axes = [axis_index(a, r) for a in imp._attr("axes", list(range(r)))]
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
    "Where": _where, "Trilu": _trilu, "GatherElements": _gather_elements,
    "IsNaN": _elementwise(np.isnan, False), "Erf": _elementwise(_erf),
    "Min": _variadic(np.minimum), "Max": _variadic(np.maximum), "Sum": _variadic(np.add),
    "Mean": _mean_fold,
    "MatMul": _elementwise(np.matmul),
    "ReduceSum": _reduce_fold(np.sum), "ReduceProd": _reduce_fold(np.prod),
    "ReduceMean": _reduce_fold(np.mean), "ReduceMax": _reduce_fold(np.max),
    "ReduceMin": _reduce_fold(np.min),
}

SHAPE_OPS = {"Shape": _shape, "Size": _size}

PASS_THROUGH = {"Identity": _identity, "Dropout": _dropout, "Cast": _cast,
                "CastLike": _cast_like}

LAYOUT = {
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Slice": _slice, "Split": _split, "Concat": _concat_arrays,
    "Gather": _gather, "Expand": _expand, "Tile": _tile, "Pad": _pad,
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "Resize": _resize, "Upsample": _resize,
}
LAYOUT_DATA = {"Concat": "all"}  # default: input 0 only
