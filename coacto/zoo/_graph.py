"""Graph bookkeeping for the zoo builders.

:class:`_GraphCore` holds what every layer needs: the tensors with their shapes and per-channel
moments, the initializers (written straight into the final ``onnx.ModelProto``), node naming after
torch.onnx's scopes, ``Constant`` nodes, the layout operators (Pad, Unsqueeze / Squeeze, Concat,
Split / Slice, Transpose, Reshape with torch's shape subgraphs, Flatten) in the form their opset
and style call for, and assembling the model. The layers that create weights and propagate
moments through nonlinear maps are in :mod:`coacto.zoo._layers`.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _torch_scope(module: str) -> str:
    """``layer1.0.conv1`` -> ``/layer1/layer1.0/conv1`` (how torch.onnx names node scopes)."""
    if not module:
        return ""
    out: list[str] = []
    run: list[str] = []
    for p in module.split("."):
        if p.isdigit() and run:
            run.append(p)
            out.append(".".join(run))
        else:
            run = [p]
            out.append(p)
    return "/" + "/".join(out)


class _GraphCore:
    """A small graph builder that tracks real shapes and per-channel activation moments."""

    def __init__(self, name: str, *, opset: int, style: str, seed: int, batch: int):
        self.name = name
        self.opset = opset
        self.style = style
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        # initializers go straight into the final ModelProto (no copies of large weights)
        self.proto = onnx.ModelProto()
        self.inits = self.proto.graph.initializer
        self.init_names: set[str] = set()
        self.node_names: set[str] = set()
        self.shape: dict[str, tuple[int, ...]] = {}
        # per-channel (axis 1) mean and variance of an activation tensor, and, for the output of a
        # monotone activation f of a Gaussian, (pre-activation mean, variance, f) -- for max pools
        self.mom: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.pre: dict[str, tuple[np.ndarray, np.ndarray, str] | None] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    # ----------------------------------------------------------------------------------- basics
    @property
    def zoo(self) -> bool:
        return self.style == "zoo"

    def input(self, name: str, shape: tuple[int, ...]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        c = shape[1]
        return self._set(name, shape, np.zeros(c), np.ones(c))

    def _rename(self, x: str, name: str) -> None:
        """Every use and definition of tensor ``x`` now says ``name``."""
        for node in self.nodes:
            for i, o in enumerate(node.output):
                if o == x:
                    node.output[i] = name
            for i, o in enumerate(node.input):
                if o == x:
                    node.input[i] = name

    def output(self, x: str, name: str = "output") -> str:
        """Rename tensor ``x`` (produced by the last node) to the graph output ``name``."""
        self._rename(x, name)
        self._set(name, self.shape[x], *self.mom[x])
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                          list(self.shape[name])))
        return name

    def init(self, name: str, arr: np.ndarray) -> str:
        if name in self.init_names:
            raise ValueError(f"duplicate initializer {name}")
        self.init_names.add(name)
        arr = np.asarray(arr)
        t = self.inits.add()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.dims.extend(arr.shape)
        t.raw_data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"),
                                                      copy=False).tobytes()
        self.shape[name] = tuple(np.shape(arr))
        return name

    def i64(self, name: str, values) -> str:
        return self.init(name, np.asarray(values, dtype=np.int64))

    def scalar(self, name: str, value: float) -> str:
        if name in self.init_names:
            return name
        return self.init(name, np.asarray(value, dtype=np.float32))

    def node(self, op: str, inputs: list[str], scope: str, *, n_out: int = 1,
             name: str | None = None, **attrs) -> list[str]:
        base = f"{scope}/{name or op}"
        nname = base
        k = 1
        while nname in self.node_names:
            nname = f"{base}_{k}"
            k += 1
        self.node_names.add(nname)
        outs = [f"{nname}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=nname, **attrs))
        return outs

    def constant(self, scope: str, values, dtype=np.int64) -> str:
        """A torch-style ``Constant`` node (``/Constant_output_0``)."""
        arr = np.asarray(values, dtype=dtype)
        (out,) = self.node("Constant", [], scope, value=numpy_helper.from_array(arr, ""))
        self.shape[out] = arr.shape
        return out

    def _set(self, y: str, shape, mean, var, pre=None) -> str:
        self.shape[y] = tuple(int(s) for s in shape)
        self.mom[y] = (np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64))
        self.pre[y] = pre
        return y

    # layout / structural ------------------------------------------------------------------------
    def pad(self, x: str, scope: str, pads: list[int]) -> str:
        if self.opset < 11:
            (y,) = self.node("Pad", [x], scope, mode="constant", pads=pads, value=0.0)
        else:
            pname = self.constant(scope, pads) if not self.zoo else \
                self.i64(f"{scope.strip('/').replace('/', '.')}.pads", pads)
            (y,) = self.node("Pad", [x, pname], scope, mode="constant")
        r = len(pads) // 2
        shape = [d + pads[i] + pads[i + r] for i, d in enumerate(self.shape[x])]
        return self._set(y, shape, *self.mom[x])  # (moments of the non-padded part)

    def unsqueeze(self, x: str, scope: str, axes: list[int]) -> str:
        if self.opset < 13:
            (y,) = self.node("Unsqueeze", [x], scope, axes=axes)
        else:
            a = self.constant(scope, axes) if not self.zoo else \
                self.i64(f"{x}.unsqueeze_axes", axes)
            (y,) = self.node("Unsqueeze", [x, a], scope)
        shape = list(self.shape[x])
        for ax in sorted(axes):
            shape.insert(ax, 1)
        self.shape[y] = tuple(shape)
        return y

    def squeeze(self, x: str, scope: str, axes: list[int]) -> str:
        if self.opset < 13:
            (y,) = self.node("Squeeze", [x], scope, axes=axes)
        else:
            (y,) = self.node("Squeeze", [x, self.constant(scope, axes)], scope)
        shape = [d for i, d in enumerate(self.shape[x]) if i not in axes]
        return self._set(y, shape, *self.mom[x])

    def concat(self, xs: list[str], module: str, axis: int = 1) -> str:
        assert axis == 1
        (y,) = self.node("Concat", xs, _torch_scope(module), axis=axis)
        shape = list(self.shape[xs[0]])
        shape[axis] = sum(self.shape[t][axis] for t in xs)
        mean = np.concatenate([self.mom[t][0] for t in xs])
        var = np.concatenate([self.mom[t][1] for t in xs])
        pres = [self.pre[t] for t in xs]
        pre = None
        if all(p is not None and p[2] == pres[0][2] for p in pres):
            pre = (np.concatenate([p[0] for p in pres]), np.concatenate([p[1] for p in pres]),
                   pres[0][2])
        return self._set(y, shape, mean, var, pre)

    def split(self, x: str, module: str, sizes: list[int], axis: int = 1) -> list[str]:
        """Channel split: ``Split`` (default style) or one ``Slice`` per part (zoo style)."""
        assert axis == 1
        scope = _torch_scope(module)
        outs: list[str] = []
        if not self.zoo:
            if self.opset < 13:
                outs = self.node("Split", [x], scope, n_out=len(sizes), axis=axis, split=sizes)
            else:
                outs = self.node("Split", [x, self.constant(scope, sizes)], scope,
                                 n_out=len(sizes), axis=axis)
        else:
            start = 0
            for sz in sizes:
                if self.opset < 10:
                    (o,) = self.node("Slice", [x], scope, axes=[axis], starts=[start],
                                     ends=[start + sz])
                else:
                    stem = f"{module}.slice{start}"
                    (o,) = self.node("Slice", [x, self.i64(f"{stem}.starts", [start]),
                                               self.i64(f"{stem}.ends", [start + sz]),
                                               self.i64(f"{stem}.axes", [axis])], scope)
                outs.append(o)
                start += sz
        start = 0
        mean, var = self.mom[x]
        for o, sz in zip(outs, sizes):
            shape = list(self.shape[x])
            shape[axis] = sz
            self._set(o, shape, mean[start:start + sz], var[start:start + sz])
            start += sz
        return outs

    def transpose(self, x: str, module: str, perm: list[int]) -> str:
        (y,) = self.node("Transpose", [x], _torch_scope(module), perm=perm)
        shape = [self.shape[x][p] for p in perm]
        return self._set(y, shape, *self.mom[x])  # caller fixes the channel order if it moves

    def batch_dim(self, x: str, scope: str) -> str:
        """torch's ``x.size(0)`` as a 1-element int64 tensor: Shape -> Gather(0) -> Unsqueeze."""
        (shp,) = self.node("Shape", [x], scope)
        self.shape[shp] = (len(self.shape[x]),)
        idx = self.constant(scope, 0)
        (n,) = self.node("Gather", [shp, idx], scope, axis=0)
        self.shape[n] = ()
        return self.unsqueeze(n, scope, [0])

    def reshape(self, x: str, module: str, shape: list[int], dynamic_batch: bool = False) -> str:
        """Reshape to ``shape`` (``shape[0]`` is the batch; -1 allowed once). The caller sets the
        moments of the result when the channel axis changes meaning.

        ``dynamic_batch``: build the target like torch does for ``x.view(x.size(0), ...)``,
        ``Shape -> Gather -> Unsqueeze -> Concat`` (constant-foldable); else a constant target
        (a ``Constant`` node in default style, an initializer in zoo style)."""
        scope = _torch_scope(module)
        if dynamic_batch:
            n = self.batch_dim(x, scope)
            rest = self.constant(scope, list(shape[1:]))
            (target,) = self.node("Concat", [n, rest], scope, axis=0)
            self.shape[target] = (len(shape),)
        elif self.zoo:
            stem = module or "reshape"
            k = 0
            while f"{stem}.shape{k}" in self.init_names:
                k += 1
            target = self.i64(f"{stem}.shape{k}", shape)
        else:
            target = self.constant(scope, shape)
        (y,) = self.node("Reshape", [x, target], scope)
        total = int(np.prod(self.shape[x]))
        known = int(np.prod([d for d in shape if d != -1]))
        out = [total // known if d == -1 else d for d in shape]
        return self._set(y, out, *self.mom[x])

    def flatten_to_2d(self, x: str, mode: str = "flatten") -> str:
        """(N, C, H, W) -> (N, C*H*W): ``Flatten``, ``Reshape`` to a constant ``[N, -1]``,
        the torch shape subgraph (``"dynamic"``) or ``Squeeze`` (H = W = 1 only)."""
        n, c, h, w = self.shape[x]
        if mode == "squeeze":
            return self.squeeze(x, "", [2, 3])
        if mode == "flatten":
            (y,) = self.node("Flatten", [x], "", axis=1)
        else:
            y = self.reshape(x, "", [n, -1], dynamic_batch=mode == "dynamic")
        mean, var = self.mom[x]
        return self._set(y, (n, c * h * w), np.repeat(mean, h * w), np.repeat(var, h * w))

    # --------------------------------------------------------------------------------- finish
    def model(self, doc: str, meta: dict[str, str]) -> onnx.ModelProto:
        model = self.proto
        graph = model.graph
        graph.name = self.name
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        if self.zoo:  # old exporters listed every initializer as a graph input as well
            graph.input.extend(
                helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in self.inits)
        graph.output.extend(self.outputs)
        opsets = [helper.make_opsetid("", self.opset)]
        model.opset_import.extend(opsets)
        model.ir_version = helper.find_min_ir_version_for(opsets)
        model.producer_name = "coacto.zoo"
        model.producer_version = "1"
        model.doc_string = doc
        helper.set_model_props(model, meta)
        return model
