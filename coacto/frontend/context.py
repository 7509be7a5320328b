"""The handler API: what an ONNX op handler (coacto.frontend.ops, folding) is given.

A handler is ``fn(ctx, ins) -> outs``: the node's input values in order (a numpy array for a
constant, an ``Act`` or a ``View``, None for an input left out; coacto.frontend.values), and its
output values (None for an output it does not give). It raises ``Unsupported`` for what coacto
cannot run (collected and reported together) and ``ShapeError`` for inconsistent shapes or
attributes (the node's name is added). It reads only these public names of ``ctx`` (a test checks):

- the node: ``node`` (its NodeProto), ``node_name``, ``opset``, ``attrs`` (its attributes as Python
  values), ``attr(name, default)``; ``const(v, what)`` and ``ints(v, what)`` for inputs that must
  be constants (``what`` names them in the message); ``input_or_attr(ins, pos, attr, default)``
  for parameters that are inputs in new opsets and attributes in old ones;
- values: ``layout_of(act)``, ``is_integer(v)``, ``as_bool(v)``, ``as_view(v)``, ``reshaped(v,
  shape)`` (a View); ``resolve(v)`` (an Act, no copy where its storage exists), ``act(v, layout)``
  (an Act reading its layer as the layer's own (N, C, H, W)), ``act_as(v, shape, layout)``,
  ``act_rows(v)`` / ``act_channels(v)`` (rows are the last axis / the channels), ``operand(v,
  out, layout)`` (an elementwise input broadcasting to ``out``), ``materialize(view, layout)``;
- layers: ``emit(name, op, inputs, onnx_shape, attrs, weights, layout)`` (a new ir.Layer, as an
  Act), ``emit_like`` (the input layer's (N, C, H, W)), ``emit_rows`` (column by column);
  ``layers`` (emitted so far), ``kinds`` (layer -> "int" / "bool" for integer-valued layers);
- indexing: ``index_map(op, ins)`` runs ``op``'s indexing handler on index arrays (a View);
  ``indexing`` is True while it does (they fold constants too); Pad sets ``last_pad``.
"""
from __future__ import annotations

import numpy as np

from . import registry
from .values import Act, Unsupported, Values, View


class Context(Values):
    """What handlers are given (this module's docstring); the importer sets ``node`` and ``attrs``
    before each node."""

    def __init__(self, opset: int):
        super().__init__()
        self.opset = opset
        self.node = None  # the node being imported
        self.attrs: dict = {}
        self.indexing = False
        self.last_pad = None

    @property
    def node_name(self) -> str:
        return self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def const(self, v, what: str) -> np.ndarray:
        if isinstance(v, np.ndarray):
            return v
        if v is None:
            raise Unsupported(f"{what} is missing")
        raise Unsupported(f"{what} must be a constant (computed from initializers and static "
                          "shapes only)")

    def ints(self, v, what: str) -> list[int]:
        return [int(x) for x in np.asarray(self.const(v, what)).reshape(-1)]

    def input_or_attr(self, ins, pos: int, attr: str, default=None):
        """Opset-dependent parameters: an input in new opsets, an attribute in old ones."""
        if len(ins) > pos and ins[pos] is not None:
            return self.ints(ins[pos], attr)
        return self.attr(attr, default)

    def index_map(self, op, ins):
        """Applies an indexing op to index arrays: the result is a view of layers."""
        entry = registry.handlers(op)
        data_pos = entry.data if entry.data != "all" else \
            tuple(i for i, v in enumerate(ins) if v is not None)
        views = [self.as_view(ins[i]) for i in data_pos]
        srcs, indices, fill = self._combine(views)
        args = list(ins)
        for p, idx in zip(data_pos, indices):
            args[p] = idx
        self.indexing, self.last_pad = True, None
        try:
            outs = entry.indexing(self, args)
        finally:
            self.indexing = False
        pad = None
        if op == "Pad" and self.last_pad[0] == "constant":
            _, pads, value = self.last_pad
            if (views[0].index < 0).any() and views[0].fill != value:
                # one fill value per view: make the input a layer first
                return self.index_map(op, [self.materialize(views[0])] + list(ins[1:]))
            fill = value
            src = ins[0]
            if isinstance(src, Act) and len(src.shape) == 4 and value == 0.0 and \
                    not any(p < 0 for p in pads) and not (pads[0] or pads[1] or pads[4] or pads[5]):
                # a zero pad of H and W only: a convolution reading it can pad instead
                pad = (src, (pads[2], pads[3], pads[6], pads[7]))
        return [None if r is None else View(srcs, np.asarray(r), fill, pad=pad) for r in outs]
