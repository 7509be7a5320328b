"""The importer's values (docs/ARCHITECTURE.md §2.1: a constant, ``Act``, ``View``; ``UNKNOWN``
for a node that could not be imported), and their handling.

A view stays an index array until a real op consumes it. Then it becomes, in this order of
preference: its source's own storage read with another shape (no layer at all: a reshape that keeps
the storage order, such as a flatten of positions or the (B, S, D) -> (B, S, h, dh) head split of a
sequence); or a GATHER layer, in the layout whose storage order its reads follow most closely.

Ops that compute column by column over rows (activations, per-row affines, matrix products with
weights, softmax, normalisation) read an activation whose shape differs from its layer's as long as
the rows are the same: their output takes the input layer's columns (``emit_rows``). Ops that need
the layer's own (N, C, H, W) get a copy (``act``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import ir
from ..errors import ShapeError

LAST, CHANNELS = ir.LAYOUT_LAST, ir.LAYOUT_CHANNELS


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


def check_result(shape) -> tuple[int, ...]:
    """``shape`` when a result of that shape may be allocated (ir.MAX_TENSOR_ELEMENTS): the ops
    below whose result can be much larger than their inputs check it before computing."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ShapeError(f"its result would have shape {shape}, with a negative dimension")
    ir.check_elements(shape, "its result")
    return shape


def check_rank(shape, what: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if len(shape) > ir.MAX_RANK:
        raise Unsupported(f"{what} has rank {len(shape)}; coacto computes tensors of rank 0 to "
                          f"{ir.MAX_RANK}")
    return shape


def row_axis(rank: int, layout: str) -> int:
    """The ONNX axis a layout stores as rows."""
    if rank <= 1:
        return 0
    return rank - 1 if layout == LAST else 1


class Values:
    """The layers emitted so far and the values over them; the base of the handlers' context
    (coacto.frontend.context, which gives ``node_name``)."""

    def __init__(self):
        self.layers: list[ir.Layer] = []
        self.names: set[str] = set()
        self.tables: dict[tuple, np.ndarray] = {}
        self.kinds: dict[int, str] = {}  # layer -> "int" / "bool" for integer-valued layers
        self.total_elements = 0  # of the layers emitted so far (ir.MAX_TOTAL_ELEMENTS)

    # -- facts about values
    def layout_of(self, a: Act) -> str:
        return a.layout or self.layers[a.layer].layout

    def _size(self, src) -> int:
        if isinstance(src, Const):
            return int(src.values.size)
        layer = self.layers[src]
        return layer.columns * layer.rows

    def _is_canonical(self, a: Act, layout: str | None = None) -> bool:
        """Whether ``a`` reads its layer exactly as the layer's own (N, C, H, W)."""
        lay = self.layout_of(a)
        if layout is not None and not ir.same_layout(len(a.shape), lay, layout):
            return False
        return ir.internal_shape(a.shape, lay) == self.layers[a.layer].shape

    def is_integer(self, v) -> bool:
        """Whether a computed value holds integers only (integer inputs, comparisons, views of
        them): casts of it to integer types are the identity."""
        srcs = v.srcs if isinstance(v, View) else [v.layer] if isinstance(v, Act) else []
        return bool(srcs) and all(isinstance(s, int) and self.kinds.get(s) in ("int", "bool")
                                  for s in srcs)

    def as_bool(self, v):
        """``v != 0`` as 1.0 / 0.0 (what a Cast to bool computes)."""
        srcs = v.srcs if isinstance(v, View) else [v.layer]
        if all(isinstance(s, int) and self.kinds.get(s) == "bool" for s in srcs):
            return v
        x = self.resolve(v)
        eq = self.emit_like(self.node_name + "/eq0", "BINARY", x,
                            dict(kind=ir.BIN_EQUAL, act=ir.ACT_NONE, alpha=0.0, beta=0.0,
                                 const_first=0),
                            {"k": np.zeros((1, 1, 1, 1), np.float32)})
        out = self.emit_like(self.node_name, "AFFINE", eq, dict(act=ir.ACT_NONE, alpha=0.0,
                                                                beta=0.0),
                             {"scale": np.full(self.layers[eq.layer].rows, -1.0, np.float32),
                              "shift": np.ones(self.layers[eq.layer].rows, np.float32)})
        self.kinds[out.layer] = "bool"
        return out

    # -- views
    def _storage_index(self, shape, layout) -> np.ndarray:
        """For each element of a tensor (ONNX order, shaped), its position in storage."""
        shape = tuple(int(d) for d in shape)
        if layout == LAST or len(shape) <= 2:
            return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        shape4 = ir.nchw_shape(shape)
        t = self.tables.get(shape4)
        if t is None:
            n, c, h, w = shape4
            storage = np.arange(n * c * h * w, dtype=np.int64).reshape(n, h, w, c)
            t = self.tables[shape4] = storage.transpose(0, 3, 1, 2).ravel()
        return t.reshape(shape)

    def as_view(self, v) -> View:
        if isinstance(v, View):
            return v
        if isinstance(v, Act):
            return View([v.layer], self._storage_index(v.shape, self.layout_of(v)))
        if isinstance(v, np.ndarray):
            return View([Const(v)], np.arange(v.size, dtype=np.int64).reshape(v.shape))
        raise Unsupported("input has no known value")

    def _combine(self, views: list[View]):
        """Re-bases several views on one list of sources (each source once)."""
        if len(views) == 1:
            return views[0].srcs, [views[0].index], views[0].fill
        fills = {v.fill for v in views if (v.index < 0).any()}
        fill = next(iter(fills)) if fills else 0.0
        if len(fills) > 1:  # only one fill value per view: make the others layers first
            views = [self.as_view(self.materialize(v)) if (v.index < 0).any() and v.fill != fill
                     else v for v in views]
        srcs: list = []
        for v in views:
            srcs.extend(s for s in v.srcs if not any(_same(s, t) for t in srcs))
        sizes = [self._size(s) for s in srcs]
        offsets = np.cumsum([0] + sizes[:-1]).tolist()
        indices = []
        for v in views:
            new_off = [offsets[next(i for i, t in enumerate(srcs) if _same(t, s))] for s in v.srcs]
            indices.append(_rebase(v.index, [self._size(s) for s in v.srcs], new_off))
        return srcs, indices, fill

    # -- views -> activations
    def _zero_copy(self, v: View, layouts) -> Act | None:
        """The view as its single source's storage read with the view's shape, when that is what
        it is (the view's storage order is the source's)."""
        if len(v.srcs) != 1 or not isinstance(v.srcs[0], int):
            return None
        flat = v.index.reshape(-1)
        if flat.size != self._size(v.srcs[0]) or flat.size == 0 or flat.min() < 0:
            return None
        shape = tuple(int(d) for d in v.index.shape)
        for lay in layouts:
            if np.array_equal(flat[ir.storage_order(shape, lay)], np.arange(flat.size)):
                return Act(v.srcs[0], shape, lay)
        return None

    def _pick_layout(self, v: View) -> str:
        """For a new GATHER: the layout in which consecutive outputs read consecutive inputs most
        often (copies run in longer stretches); ties go to the first source's layout."""
        shape = tuple(v.index.shape)
        if len(shape) <= 2:
            return CHANNELS
        flat = v.index.reshape(-1)
        scores = {}
        for lay in (LAST, CHANNELS):
            idx = flat[ir.storage_order(shape, lay)]
            scores[lay] = int(np.count_nonzero((np.diff(idx) == 1) & (idx[1:] > 0)))
        if scores[LAST] != scores[CHANNELS]:
            return max(scores, key=scores.get)
        first = next((s for s in v.srcs if isinstance(s, int)), None)
        return self.layers[first].layout if first is not None else LAST

    def materialize(self, v: View, layout: str | None = None) -> Act:
        """The view as a layer read with its own (N, C, H, W), in ``layout`` (None: either)."""
        key = layout or ""
        for a in v.acts.values():  # made already, in a layout that will do
            if self._is_canonical(a, layout):
                return a
        shape = check_rank(v.index.shape, "its input")
        tries = [layout] if layout else ([LAST, CHANNELS] if len(shape) > 2 else [CHANNELS])
        a = self._zero_copy(v, tries)
        if a is not None and self._is_canonical(a):
            v.acts[key] = a
            return a
        lay = layout or self._pick_layout(v)
        index = v.index.reshape(-1)[ir.storage_order(shape, lay)]
        v.acts[key] = self._gather(v.name or self.node_name, list(v.srcs), index, shape, v.fill,
                                   lay)
        return v.acts[key]

    def resolve(self, v) -> Act:
        """A value as an activation, without a copy whenever its storage exists already."""
        if isinstance(v, Act):
            return v
        if isinstance(v, View):
            if v.acts:
                return next(iter(v.acts.values()))
            a = self._zero_copy(v, [LAST, CHANNELS] if v.index.ndim > 2 else [CHANNELS])
            if a is not None:
                v.acts[""] = a
                return a
            return self.materialize(v)
        if isinstance(v, np.ndarray):
            raise Unsupported("its data input is a constant; coacto computes on inputs")
        raise Unsupported("input has no known value")

    def reshaped(self, v, shape):
        """The value with the same elements in ONNX order and another shape (a view)."""
        view = self.as_view(v)
        return View(view.srcs, view.index.reshape(tuple(int(d) for d in shape)), view.fill,
                    view.name)

    def act(self, v, layout: str | None = None) -> Act:
        """The value as a layer input read with the layer's own (N, C, H, W), in ``layout``
        (None: the value's own); copies through a GATHER when the storage does not fit."""
        if isinstance(v, View):
            return self.materialize(v, layout)
        if isinstance(v, Act):
            want = layout or self.layout_of(v)
            if self._is_canonical(v, want):
                return v
            return self.materialize(self.as_view(v), want)
        return self.resolve(v)  # neither: refused there

    def act_as(self, v, shape, layout: str | None = None) -> Act:
        """The value (same elements, ONNX order) as a layer input of ONNX shape ``shape``."""
        shape = tuple(int(d) for d in shape)
        if layout is None and isinstance(v, Act):
            layout = self.layout_of(v)
        view = self.as_view(v)
        return self.act(View(view.srcs, view.index.reshape(shape), view.fill,
                             view.name or self.node_name), layout)

    def operand(self, v, out, layout: str) -> Act:
        """The value as an input of an elementwise layer of ONNX shape ``out`` it broadcasts to:
        of out's rank, and above rank 4 expanded where the layout merges axes it broadcasts on."""
        shape = (1,) * (len(out) - len(shape_of(v))) + tuple(shape_of(v))
        full = ir.broadcast_merged(shape, out, layout)
        if full == shape:
            return self.act_as(v, shape, layout)
        view = self.as_view(v)
        index = np.ascontiguousarray(np.broadcast_to(view.index.reshape(shape), full))
        return self.act(View(view.srcs, index, view.fill, view.name or self.node_name), layout)

    def act_channels(self, v) -> Act:
        """The value for an op computing per channel (axis 1 of a "channels" value): its storage
        as it is when its layer's rows are those channels (a Conv3D's output read as rank 5),
        else a copy."""
        a = self.resolve(v)
        if len(a.shape) > 1 and self.layout_of(a) == CHANNELS and \
                self.layers[a.layer].rows == a.shape[1]:
            return a
        return self.act(a, CHANNELS)

    def act_rows(self, v) -> Act:
        """The value for an op that computes column by column over its last axis: an activation
        in row-major storage (layout "last") whose layer's rows are that axis."""
        a = self.resolve(v)
        rank = len(a.shape)
        lay = self.layout_of(a)
        if (rank <= 2 or lay == LAST) and self.layers[a.layer].rows == a.shape[-1]:
            return Act(a.layer, a.shape, LAST if rank > 2 else lay)
        return self.act(a, LAST)

    # -- layers
    def emit(self, name, op, inputs, onnx_shape, attrs=None, weights=None,
             layout: str = CHANNELS) -> Act:
        onnx_shape = check_rank(onnx_shape, "its output")
        if any(d <= 0 for d in onnx_shape):
            raise ShapeError(f"its output shape {onnx_shape} has a dimension 0 (no elements); "
                             "coacto computes tensors of at least one element")
        self.total_elements += ir.check_elements(onnx_shape, f"its output {name!r}")
        if self.total_elements > ir.MAX_TOTAL_ELEMENTS:
            raise ShapeError(f"the layers up to {name!r} hold {self.total_elements} values "
                             f"together, more than coacto's limit of {ir.MAX_TOTAL_ELEMENTS} "
                             "(coacto.ir.MAX_TOTAL_ELEMENTS); check the model's dimensions and "
                             "the input_shapes given")
        base, k = name, 1
        while name in self.names:
            k += 1
            name = f"{base}#{k}"
        self.names.add(name)
        self.layers.append(ir.Layer(name=name, op=op, inputs=list(inputs),
                                    shape=ir.internal_shape(onnx_shape, layout),
                                    attrs=dict(attrs or {}), weights=dict(weights or {}),
                                    onnx_shape=onnx_shape, layout=layout))
        return Act(len(self.layers) - 1, onnx_shape, layout)

    def emit_like(self, name, op, x: Act, attrs=None, weights=None, inputs=None) -> Act:
        """A layer with exactly the (N, C, H, W) of x's layer (elementwise ops); the value keeps x's
        shape and layout."""
        layer = self.layers[x.layer]
        out = self.emit(name, op, inputs if inputs is not None else [x.layer], layer.onnx_shape,
                        attrs, weights, layout=layer.layout)
        return Act(out.layer, x.shape, self.layout_of(x))

    def emit_rows(self, name, op, x: Act, rows: int, shape, attrs=None, weights=None,
                  inputs=None) -> Act:
        """A layer computing each column of x's layer into ``rows`` rows; the value has ONNX shape
        ``shape`` (x's shape with the row axis resized) in x's layout."""
        lay = self.layout_of(x)
        shape = tuple(int(d) for d in shape)
        inputs = inputs if inputs is not None else [x.layer]
        if self._is_canonical(x):
            return self.emit(name, op, inputs, shape, attrs, weights, layout=lay)
        if lay == CHANNELS and len(shape) > 2 and rows == self.layers[x.layer].rows:
            return self.emit_like(name, op, x, attrs, weights, inputs)
        n, _, h, w = self.layers[x.layer].shape
        own = (n, h, w, rows) if h > 1 else (n, w, rows)
        out = self.emit(name, op, inputs, own, attrs, weights, layout=LAST)
        return Act(out.layer, shape, LAST)

    def _gather(self, name, srcs, index, shape, fill, layout: str = CHANNELS) -> Act:
        """A GATHER of ``srcs`` (layers and Const values; ``index`` into their concatenated
        storage, in output storage order)."""
        layers = [s for s in srcs if isinstance(s, int)]
        consts = [s for s in srcs if isinstance(s, Const)]
        if not layers:
            raise Unsupported("its result is a constant; coacto computes on inputs")
        index = np.asarray(index, dtype=np.int64)
        if consts or srcs != layers:  # layers first, then the constants
            order = layers + consts
            sizes = [self._size(s) for s in srcs]
            new_off = np.cumsum([0] + [self._size(s) for s in order[:-1]]).tolist()
            index = _rebase(index, sizes, [new_off[next(i for i, t in enumerate(order)
                                                         if _same(t, s))] for s in srcs])
        if len(layers) > 8:  # the runtime reads at most 8 inputs: concatenate storages in groups
            groups = []
            for i in range(0, len(layers), 8):
                part = layers[i:i + 8]
                size = sum(self._size(s) for s in part)
                groups.append(self._gather(f"{name}/part{i // 8}", part,
                                           np.arange(size, dtype=np.int64), (1, size), 0.0).layer)
            layers = groups
        weights = {"index": np.ascontiguousarray(index, dtype=np.int32)}
        if consts:
            weights["const"] = np.concatenate([c.values for c in consts])
        return self.emit(name, "GATHER", layers, shape, {"fill": float(fill)}, weights,
                         layout=layout)

    def copy(self, v: Act, name: str) -> Act:
        """A GATHER that copies the value ``v`` to a new layer of its ONNX shape and layout."""
        lay = self.layout_of(v)
        index = self._storage_index(v.shape, lay).reshape(-1)[ir.storage_order(v.shape, lay)]
        return self._gather(name, [v.layer], index, v.shape, 0.0, lay)


def const_operand(k, out, layout: str) -> np.ndarray:
    """A constant operand of an elementwise layer of ONNX shape ``out`` (as ``Values.operand``),
    as the layer's (N, C, H, W) weight."""
    k = np.asarray(k, np.float32)
    k = k.reshape((1,) * (len(out) - k.ndim) + k.shape)
    k = np.broadcast_to(k, ir.broadcast_merged(k.shape, out, layout))
    return np.ascontiguousarray(ir.internal_array(k, layout))


def _same(a, b) -> bool:
    """Same source: the same layer index, or the same Const object."""
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _rebase(index: np.ndarray, sizes, new_offsets) -> np.ndarray:
    """Indices into sources of ``sizes`` laid end to end, moved to the sources' ``new_offsets``."""
    old = np.cumsum([0] + list(sizes)).astype(np.int64)
    shift = np.asarray(new_offsets, dtype=np.int64) - old[:-1]
    if not shift.any():
        return index
    which = np.clip(np.searchsorted(old, index, side="right") - 1, 0, len(sizes) - 1)
    return np.where(index >= 0, index + shift[which], -1)
