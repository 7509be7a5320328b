"""The graph walk (docs/ARCHITECTURE.md §2.1): each live node once, in topological order, handed
to its handlers; nodes that cannot be run are reported together, then the fusions run."""
from __future__ import annotations

import collections
import hashlib
import logging
import operator
import threading

import numpy as np
import onnx
from onnx import helper, inliner, numpy_helper

from .. import ir
from ..errors import CoactoError, ModelError, ShapeError, UnsupportedOperatorError
from . import folding, ops, registry  # noqa: F401  (folding and ops register their handlers)
from .context import Context
from .fuse import fuse_layers, fuse_sequence_ops
from .loader import check_names, load_model
from .values import UNKNOWN, Act, Unsupported, View

log = logging.getLogger(__name__)

SUPPORTED_OPSETS = (9, 18)  # tested range of the default ONNX domain
_OLDEST_OPSET = 7  # older opsets differ in broadcasting rules


def import_model(model, input_shapes: dict[str, tuple[int, ...]] | None = None) -> ir.Graph:
    """Imports an ONNX model (path, bytes or ModelProto) as a coacto operator graph.

    ``input_shapes`` fixes the shapes of inputs with dynamic dimensions, e.g.
    ``{"input": (1, 3, 224, 224)}``. Raises ModelError (unreadable model), ShapeError (unknown or
    inconsistent shapes) or UnsupportedOperatorError (listing every node that cannot be run)."""
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise ShapeError(f"input_shapes must be a dict {{input name: shape}}, not "
                         f"{type(input_shapes).__name__}")
    proto, data = load_model(model)
    # hashlib releases the GIL on large buffers: hash while importing.
    digest = hashlib.sha256()
    hasher = threading.Thread(target=digest.update, args=(data,), daemon=True)
    hasher.start()
    del data  # the hasher holds the bytes until it is done, not until the import is
    try:
        check_names(proto.graph)
        graph = Importer(proto, dict(input_shapes or {})).run()
    except CoactoError:
        raise
    except MemoryError as e:  # the size caps should have refused it first
        err = ShapeError(f"could not import the model: it needs more memory than there is ({e}); "
                         "check its dimensions and the input_shapes given")
        err.internal = True
        raise err from e
    except Exception as e:  # a check is missing: the model is still at fault, never the caller
        log.debug("import failed", exc_info=True)
        err = ModelError(f"could not import the model (internal error: {type(e).__name__}: {e}); "
                         "the model is malformed in a way coacto does not recognise: check it "
                         "with onnx.checker.check_model, and report it if it passes")
        err.internal = True
        raise err from e
    finally:
        hasher.join()
    graph.model_hash = digest.hexdigest()
    return graph


#: Input types besides float32, all computed as float32: float16, float64, integers (ids, masks).
_IO_TYPES = {*ir.INTEGER_NUMPY_TYPES, *ir.FLOAT_NUMPY_TYPES}
#: Operators that read axis 1 as channels: an input of rank 3 or 4 they consume keeps that layout.
_CHANNEL_OPS = {"Conv", "MaxPool", "AveragePool", "BatchNormalization", "GlobalAveragePool",
                "GlobalMaxPool", "LRN", "InstanceNormalization", "Resize", "Upsample",
                "DepthToSpace", "SpaceToDepth", "Pad", "ConvTranspose"}


class Importer:
    """One import: the ONNX graph's state (values by name, initializers, failures) around the
    handlers' context ``ctx``, which holds the layers."""

    def __init__(self, proto: onnx.ModelProto, input_shapes: dict):
        if proto.functions:  # model-local functions (as dynamo-based exporters write): inline them
            try:
                proto = inliner.inline_local_functions(proto)
            except Exception as e:
                raise ModelError(f"cannot inline the model's local functions: {e}") from e
        self.proto = proto
        self.g = proto.graph
        self.input_shapes = input_shapes
        self.opset = max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        self.ctx = Context(self.opset)  # what handlers are given: the layers, the node
        self.values: dict[str, object] = {}
        self.inits = {t.name: t for t in self.g.initializer}
        self.failures: list[tuple[str, str, str]] = []

    def run(self) -> ir.Graph:
        if self.opset < _OLDEST_OPSET:
            raise UnsupportedOperatorError(
                f"the model uses ONNX opset {self.opset}; coacto reads opsets 9 to 18: convert it "
                "with onnx.version_converter.convert_version(model, 13)",
                [("", f"opset {self.opset}")])
        if not SUPPORTED_OPSETS[0] <= self.opset <= SUPPORTED_OPSETS[1]:
            log.warning("ONNX opset %d is outside the tested range %d..%d", self.opset,
                        *SUPPORTED_OPSETS)
        inputs = self._inputs()
        self.output_dtypes: dict[str, int] = {}
        nodes, used = self._live_nodes()
        # Initializer arrays are dropped after their last reader: the layers hold their own
        # (re-laid, fused) copies, so the model's weights are not held twice more than needed.
        self.init_uses = collections.Counter(n for node in nodes for n in node.input
                                             if n in self.inits)
        for node in nodes:
            self._import_node(node, used)
        outputs = self._outputs()
        if self.failures:
            self._raise_failures()
        layers, inputs, outputs = fuse_layers(self.ctx.layers, inputs, outputs)
        layers, inputs, outputs = fuse_sequence_ops(layers, inputs, outputs)
        return ir.Graph(layers=layers, inputs=inputs, outputs=outputs,
                        output_dtypes=self.output_dtypes)

    def _raise_failures(self):
        lines = [f"  {name or '(unnamed)'} ({op}): {why}" for name, op, why in self.failures]
        n = len(self.failures)
        raise UnsupportedOperatorError(
            f"{n} node{'s' if n > 1 else ''} of the model cannot be run by coacto:\n"
            + "\n".join(lines)
            + "\nReplace these operators (or re-export the model without them) and import again.",
            [(name, op) for name, op, _ in self.failures])

    def _inputs(self) -> dict[str, int]:
        real = [i for i in self.g.input if i.name not in self.inits]
        unknown = set(self.input_shapes) - {i.name for i in real}
        if unknown:
            raise ShapeError(f"input_shapes names {sorted(unknown)}, which are not inputs of the "
                             f"model; its inputs are {[i.name for i in real]}")
        out = {}
        for vi in real:
            tt = vi.type.tensor_type
            elem = tt.elem_type if vi.type.HasField("tensor_type") else 0
            if elem != onnx.TensorProto.FLOAT and elem not in _IO_TYPES:
                dtype = _dtype_name(elem) if elem else "non-tensor"
                self.failures.append((vi.name, "Input", f"input of type {dtype}; coacto runs float "
                                      "and integer inputs (cast in the model's caller)"))
                self.values[vi.name] = UNKNOWN
                continue
            shape = self._input_shape(vi)
            if len(shape) > ir.MAX_RANK:
                self.failures.append((vi.name, "Input", f"input of rank {len(shape)}; coacto "
                                      f"runs inputs of rank 0 to {ir.MAX_RANK}"))
                self.values[vi.name] = UNKNOWN
                continue
            attrs = {} if elem == onnx.TensorProto.FLOAT else {"dtype": int(elem)}
            idx = self.ctx.emit(vi.name, "INPUT", [], shape, attrs,
                                layout=self._input_layout(vi.name, len(shape)))
            if elem in ir.INTEGER_NUMPY_TYPES:
                self.ctx.kinds[idx.layer] = "bool" if elem == onnx.TensorProto.BOOL else "int"
            self.values[vi.name] = idx
            out[vi.name] = idx.layer
        return out

    def _input_layout(self, name: str, rank: int) -> str:
        """Channels on axis 1 for images and what convolutions read; the last axis as rows for
        inputs of rank 3 or 4 that only sequence ops read."""
        if rank <= 2:
            return ir.LAYOUT_CHANNELS
        consumers = [n for n in self.g.node if name in n.input]
        if rank == 4 and any(self._to_channels_first(n) for n in consumers) and \
                all(self._to_channels_first(n) or n.op_type in ("Shape", "Size")
                    for n in consumers):  # (what reads only its static shape is folded)
            return ir.LAYOUT_LAST
        if any(n.op_type in _CHANNEL_OPS for n in consumers):
            return ir.LAYOUT_CHANNELS
        if any(self._reads_last_axis(n, rank) for n in consumers):
            return ir.LAYOUT_LAST
        return ir.LAYOUT_CHANNELS

    @staticmethod
    def _to_channels_first(node) -> bool:
        """Whether a node is the Transpose(perm=[0, 3, 1, 2]) that TensorFlow exporters put after
        an NHWC image input. Stored with its last axis as rows, such an input already holds the
        NCHW image in the channels layout, position by position: the Transpose costs nothing
        and each image row is a column block of its own, so a server starts on the first rows
        while the rest are on the way (stored with axis 1 as channels instead, every tile of
        the Transpose reads every input tile)."""
        if node.op_type != "Transpose":
            return False
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        return perm == [0, 3, 1, 2]

    def _reads_last_axis(self, node, rank: int) -> bool:
        """Whether a node computes along the last axis of its (rank >= 3) data input."""
        if node.op_type in ("MatMul", "LayerNormalization"):
            return True
        try:
            attrs = {a.name: _attr_value(a) for a in node.attribute}
        except Exception:
            return False  # reported where the node itself is imported
        if node.op_type in ("Softmax", "LogSoftmax"):
            return self.opset >= 13 and attrs.get("axis", -1) in (-1, rank - 1)
        if node.op_type.startswith("Reduce"):
            axes = attrs.get("axes")
            try:
                if axes is None and len(node.input) > 1 and node.input[1] in self.inits:
                    axes = numpy_helper.to_array(self.inits[node.input[1]]).reshape(-1).tolist()
                return axes is not None and [int(a) % rank for a in axes] == [rank - 1]
            except Exception:
                return False  # unreadable axes: reported where the node itself is imported
        return False

    def _input_shape(self, vi) -> tuple[int, ...]:
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        given = self.input_shapes.get(vi.name)
        if dims is None and given is None:
            raise ShapeError(f"input {vi.name!r} has no shape in the model; pass "
                             f"input_shapes={{{vi.name!r}: (...)}} to import_model")
        static = [d.dim_value if d.HasField("dim_value") else None for d in (dims or [])]
        if given is not None:
            try:
                given = tuple(operator.index(d) for d in given)
            except TypeError:
                raise ShapeError(f"input_shapes[{vi.name!r}] = {given!r}: a shape is a tuple of "
                                 "integers, e.g. (1, 3, 224, 224)") from None
            if dims is not None and len(given) != len(static):
                raise ShapeError(f"input_shapes[{vi.name!r}] = {given} has rank {len(given)} but "
                                 f"the model's input has rank {len(static)}")
            if any(d <= 0 for d in given):
                raise ShapeError(f"input_shapes[{vi.name!r}] = {given}: dimensions must be "
                                 "positive")
            for i, (s, g) in enumerate(zip(static, given)):
                if s is not None and s != g:
                    log.warning("input %r: dimension %d overridden from %d to %d", vi.name, i, s, g)
            ir.check_elements(given, f"input_shapes[{vi.name!r}]")
            return given
        for i, (d, s) in enumerate(zip(dims, static)):
            if s == 0:
                shown = tuple("?" if x is None else x for x in static)
                raise ShapeError(
                    f"input {vi.name!r} of shape {shown} has a dimension 0 (axis {i}): it holds "
                    "no elements, and coacto computes on tensors of at least one: fix the "
                    f"model's input shape or pass input_shapes={{{vi.name!r}: (...)}} to "
                    "import_model")
            if s is None or s < 0:  # old exporters write -1 for a dynamic dimension
                example = tuple(1 if x is None or x <= 0 else x for x in static)
                label = f" ({d.dim_param!r})" if d.dim_param else ""
                raise ShapeError(
                    f"input {vi.name!r} has a dynamic dimension {i}{label}; coacto needs static "
                    f"shapes: pass input_shapes={{{vi.name!r}: {example}}} (with the size you "
                    "will run) to import_model")
        ir.check_elements(static, f"input {vi.name!r}")
        return tuple(static)

    def _live_nodes(self):
        """Nodes that reach a graph output, in topological order, and the names they use."""
        producer = {}
        for i, node in enumerate(self.g.node):
            for o in node.output:
                if o:
                    producer[o] = i
        order, state = [], {}
        stack = [(producer[o.name], False) for o in reversed(self.g.output) if o.name in producer]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                state[i] = 2
                order.append(i)
                continue
            if state.get(i):
                continue
            state[i] = 1
            stack.append((i, True))
            for name in reversed(self.g.node[i].input):
                j = producer.get(name)
                if j is not None and not state.get(j):
                    stack.append((j, False))
                elif j is not None and state[j] == 1:
                    raise ModelError(f"the model's graph has a cycle through {name!r}")
        # Keep the model's own order when it is topological (it is in valid models).
        in_order = sorted(order)
        position = {i: k for k, i in enumerate(in_order)}
        if all(position[producer[n]] < position[i] for i in in_order
               for n in self.g.node[i].input if n in producer):
            order = in_order
        nodes = [self.g.node[i] for i in order]
        used = {o.name for o in self.g.output}
        for node in nodes:
            used.update(n for n in node.input if n)
        return nodes, used

    def _outputs(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for vo in self.g.output:
            name = vo.name
            v = self._value(name) if (name in self.values or name in self.inits) else None
            if v is None:
                raise ModelError(f"graph output {name!r} is not produced by any node or input "
                                 "(is the file truncated?)")
            if v is UNKNOWN:
                continue
            elem = vo.type.tensor_type.elem_type
            if elem not in (0, onnx.TensorProto.FLOAT):
                # float16 / float64 outputs are converted; integer and bool ones of values known
                # to be whole (integer inputs, comparisons, casts, views of them) are too.
                if elem in ir.FLOAT_NUMPY_TYPES or (elem in ir.INTEGER_NUMPY_TYPES and isinstance(
                        v, (Act, View)) and self.ctx.is_integer(v)):
                    self.output_dtypes[name] = int(elem)
                else:
                    self.failures.append((name, "Output", (
                        f"output {name!r} is {_dtype_name(elem)}; coacto computes float32 "
                        "tensors and returns integer or bool ones only where the values are "
                        "whole numbers by construction (integer inputs, comparisons, casts)")))
                    continue
            if isinstance(v, np.ndarray):
                raise ModelError(f"graph output {name!r} is a constant (it does not depend on "
                                 "any input); remove it from the model's outputs")
            if isinstance(v, View):
                if v.index.ndim > ir.MAX_RANK:
                    self.failures.append((v.name, "Output", f"output {name!r} has rank "
                                          f"{v.index.ndim}; coacto returns tensors of rank 0 to "
                                          f"{ir.MAX_RANK}"))
                    continue
                v = self.ctx.resolve(v)
            layer = self.ctx.layers[v.layer]
            lay = self.ctx.layout_of(v)
            if layer.onnx_shape != v.shape or not ir.same_layout(len(v.shape), layer.layout, lay):
                # The same storage seen with another ONNX shape (e.g. (N, C, 1, 1) flattened).
                if layer.op == "INPUT" or v.layer in out.values():
                    v = self.ctx.copy(v, name)
                else:
                    layer.onnx_shape, layer.layout = v.shape, lay
            out[name] = v.layer
        return out

    def _import_node(self, node, used: set[str]):
        self.ctx.node = node
        op = node.op_type
        name = self.ctx.node_name
        self.ctx.attrs = _node_attrs(node, name)
        ins = []
        for n in node.input:
            if not n:
                ins.append(None)
                continue
            v = self._value(n)
            if v is None:
                raise ModelError(f"node {name!r} ({op}) reads {n!r}, which no node, initializer or "
                                 "input produces (is the file truncated?)")
            ins.append(v)
        try:
            if node.domain not in ("", "ai.onnx"):
                raise Unsupported(f"operator of domain {node.domain!r} is not supported")
            if any(v is UNKNOWN for v in ins):
                h = registry.handlers(op)
                if not (h.fold or h.indexing or h.compute or h.pass_through):
                    raise Unsupported("operator is not supported")
                outs = []
            else:
                outs = self._dispatch(op, ins)
                for o in outs:  # so that no later node starts from a value over the limit
                    if isinstance(o, (np.ndarray, View)):
                        ir.check_elements(np.shape(o.index if isinstance(o, View) else o),
                                          "its result")
            for i, o in enumerate(node.output):
                if o and o in used and (i >= len(outs) or outs[i] is None):
                    if any(v is UNKNOWN for v in ins):
                        break
                    raise Unsupported(f"its output {i} ({o!r}) is used, which is not supported")
        except Unsupported as e:
            self.failures.append((name, op, str(e)))
            outs = []
        except ShapeError as e:
            raise ShapeError(f"node {name!r} ({op}): {e}") from e
        except ModelError:
            raise
        except MemoryError as e:  # a size check is missing: say so instead of failing later
            raise ShapeError(f"node {name!r} ({op}) needs more memory than there is ({e}); check "
                             "the model's dimensions and the input_shapes given") from e
        except (ValueError, IndexError, TypeError, KeyError, AttributeError, ArithmeticError,
                RecursionError) as e:
            # numpy's refusals of bad shapes, axes or attribute values the op functions read
            raise ShapeError(f"node {name!r} ({op}) has inconsistent inputs or attributes: "
                             f"{type(e).__name__}: {e}") from e
        for i, o in enumerate(node.output):
            if o:
                v = outs[i] if i < len(outs) and outs[i] is not None else UNKNOWN
                if isinstance(v, View) and not v.name:
                    v.name = name
                self.values[o] = v
        for n in node.input:
            if n in self.init_uses:
                self.init_uses[n] -= 1
                if self.init_uses[n] == 0 and n not in node.output:
                    self.values.pop(n, None)  # _value reads it again should anything ask

    def _dispatch(self, op, ins):
        """The op's handlers in the order coacto.frontend.registry states."""
        h, ctx = registry.handlers(op), self.ctx
        if h.pass_through:
            return h.pass_through(ctx, ins)
        if h.shape:
            return h.shape(ctx, ins)
        constant = all(v is None or isinstance(v, np.ndarray) for v in ins)
        if constant and (h.fold or h.indexing):
            fn = h.fold or h.indexing
            return [None if r is None else np.asarray(r) for r in fn(ctx, ins)]
        if h.compute:
            return h.compute(ctx, ins)
        if h.indexing:
            return ctx.index_map(op, ins)
        if h.fold:
            raise Unsupported("supported on constants only; here an input is computed from the "
                              "model's inputs")
        raise Unsupported("operator is not supported")

    def _value(self, name):
        v = self.values.get(name)
        if v is None and name in self.inits:
            try:
                v = numpy_helper.to_array(self.inits[name])
            except Exception as e:
                raise ModelError(f"initializer {name!r} cannot be read ({e}); the model file (or "
                                 "its external data) is truncated or corrupt") from e
            self.values[name] = v
        return v


def _dtype_name(elem: int) -> str:
    try:
        return helper.tensor_dtype_to_string(elem)
    except (KeyError, ValueError):
        return f"unknown element type {elem}"


def _node_attrs(node, name: str) -> dict:
    """A node's attributes as Python values; ModelError naming the node when one cannot be read
    (an unknown attribute type, a tensor whose data does not match its dims)."""
    out = {}
    for a in node.attribute:
        try:
            out[a.name] = _attr_value(a)
        except Exception as e:
            raise ModelError(f"node {name!r} ({node.op_type}): attribute {a.name!r} cannot be "
                             f"read ({type(e).__name__}: {e}); the model is corrupt or was "
                             "written by a broken exporter: export it again") from e
    return out


def _attr_value(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return v


__all__ = ["import_model", "SUPPORTED_OPSETS"]
