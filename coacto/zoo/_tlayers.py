"""The zoo's transformer layers, in the two forms PyTorch's ONNX exporters write.

:class:`_SeqGraph` adds to :class:`coacto.zoo._graph._GraphCore` what BERT, GPT-2 and ViT are made
of -- embedding tables, linear layers, LayerNorm, the GELUs, head split / merge, attention scores --
each in one of two forms:

``"default"`` (:attr:`_SeqGraph.traced`)
    the TorchScript-based ``torch.onnx.export`` at opsets 11 to 16 (the zoo also writes this form
    at 17 and 18, where torch would use ``LayerNormalization``): every size a module reads is a
    ``Shape -> Gather -> Unsqueeze`` chain feeding the ``Concat`` that builds a ``Reshape``
    target, LayerNorm decomposed into ``ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add``, linear weights constant-folded to ``[in, out]`` initializers named ``onnx::MatMul_<n>``
    with the bias added in front (``Add(bias, MatMul(x, W))``);
``"fused"``
    the dynamo-based exporter at opsets 17-18: sizes are constants, LayerNorm is one
    ``LayerNormalization`` node, linear weights keep their state-dict names and PyTorch layout
    ``[out, in]`` and reach ``MatMul`` through a ``Transpose``.

Weights are seeded normals. Their scale follows trained networks rather than the ``std = 0.02``
initialisation: a matrix with ``fan_in`` inputs gets ``std = gain / sqrt(fan_in)`` (0.036 for
``gain = 1`` at hidden size 768, the order of trained BERT-base's dense matrices), so the layers
contribute alike whatever the model size. Embedding tables are ``N(0, 0.02)`` as HuggingFace
initialises them (LayerNorm follows, or the patch embedding dominates), except GPT-2's word
embedding, which is also its LM head (``std = 2 / sqrt(hidden)``: logits of std about 2), and
its position table (``1 / sqrt(hidden)``). The query / key gain puts the attention scores at a
standard deviation of about 1.5: softmax spreads attention over several tokens, neither uniform
nor one-hot. Two choices keep the tokens apart through twelve layers, as in trained networks
(random ones otherwise collapse every token onto one direction, after which attention is uniform):
the attention output projection has gain 0.5, and the bias of the second FFN matrix cancels the
mean its input has after the GELU (``b = noise - W E[GELU(h)]``, with ``E`` over the
pre-activation's distribution, estimated from the weights) -- else each layer adds the same
vector to every token.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from ._graph import _GraphCore
from ._layers import _gauss_moments

#: torch.finfo(torch.float32).min: the masked-score value of HuggingFace's models
_FLOAT_MIN = float(np.finfo(np.float32).min)
_INT64_MAX = int(np.iinfo(np.int64).max)
_SQRT2 = 1.4142135623730951
#: gain of query / key weights: scores q.k / sqrt(head_dim) get a standard deviation of about 1.5
_QK_GAIN = math.sqrt(1.5)
#: gain of the second FFN matrix: GELU of a unit normal has an RMS of about 0.65
_FFN_OUT_GAIN = 1.5
#: gain of the attention output projection
_ATTN_OUT_GAIN = 0.5
_BIAS_STD = 0.02


def _gelu(a: np.ndarray) -> np.ndarray:
    """GELU (tanh form; within 1e-3 of the exact one -- used for statistics only)."""
    return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))


def _hf_scope(module: str) -> str:
    """``encoder.layer.0.attention.self`` -> ``/encoder/layer.0/attention/self``: how torch.onnx
    names the scope of a module held in a ``ModuleList`` (the list itself has no scope)."""
    if not module:
        return ""
    out: list[str] = []
    for p in module.split("."):
        if p.isdigit() and out:
            out[-1] = f"{out[-1]}.{p}"
        else:
            out.append(p)
    return "/" + "/".join(out)


class _SeqGraph(_GraphCore):
    """Graph builder for the transformers: tensors carry static shapes (no moment tracking)."""

    def __init__(self, name: str, *, opset: int, style: str, seed: int, batch: int):
        super().__init__(name, opset=opset, style=style, seed=seed, batch=batch)
        self._folded = 0
        # per output feature of a linear layer: (mean, variance) for unit-variance inputs; per
        # output of an activation: its mean (see _center)
        self._lin_stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._act_mean: dict[str, np.ndarray] = {}

    @property
    def traced(self) -> bool:
        """True for the TorchScript exporter's form (shape chains, decomposed LayerNorm)."""
        return self.style == "default"

    # ---------------------------------------------------------------------- inputs and outputs
    def graph_input(self, name: str, shape: tuple[int, ...],
                    elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        self.shape[name] = tuple(shape)
        return name

    def graph_output(self, x: str, name: str) -> str:
        """Rename tensor ``x`` to the (float) graph output ``name``."""
        self._rename(x, name)
        self.shape[name] = self.shape[x]
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                          list(self.shape[name])))
        return name

    # ------------------------------------------------------------------------------ parameters
    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(std)
        return w

    def param(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.init(name, self.normal(shape, std))

    def _record(self, y: str, w_out_in: np.ndarray, bias: np.ndarray) -> str:
        """Remember the pre-activation statistics of linear output ``y`` (inputs: LayerNorm
        outputs, taken as zero-mean, unit-variance)."""
        self._lin_stats[y] = (bias.astype(np.float64),
                              np.einsum("oi,oi->o", w_out_in, w_out_in, dtype=np.float64))
        return y

    def _activation(self, y: str, x: str) -> str:
        if x in self._lin_stats:
            self._act_mean[y] = _gauss_moments(_gelu, *self._lin_stats[x])[0]
        return y

    def _center(self, x: str, w_out_in: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """``bias - W E[x]`` when the mean of input ``x`` is known, else ``bias``."""
        if x not in self._act_mean:
            return bias
        return (bias - w_out_in.astype(np.float64) @ self._act_mean[x]).astype(np.float32)

    def _folded_name(self, op: str) -> str:
        """Name of a constant the TorchScript exporter folded (``onnx::MatMul_1234``)."""
        while True:
            self._folded += 1
            name = f"onnx::{op}_{1000 + self._folded}"
            if name not in self.init_names:
                return name

    # ------------------------------------------------------------------------------ node helpers
    def op(self, op_type: str, inputs: list[str], scope: str, shape, **attrs) -> str:
        (y,) = self.node(op_type, inputs, scope, **attrs)
        self.shape[y] = tuple(int(d) for d in shape)
        return y

    def binary(self, op_type: str, a: str, b: str, scope: str) -> str:
        return self.op(op_type, [a, b], scope, np.broadcast_shapes(self.shape[a], self.shape[b]))

    def fconst(self, scope: str, value: float) -> str:
        """A float32 scalar ``Constant`` (how torch writes Python numbers in expressions)."""
        return self.constant(scope, value, np.float32)

    def matmul(self, a: str, b: str, scope: str) -> str:
        sa, sb = self.shape[a], self.shape[b]
        lead = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.op("MatMul", [a, b], scope, tuple(lead) + (sa[-2], sb[-1]))

    def permute(self, x: str, scope: str, perm: list[int]) -> str:
        return self.op("Transpose", [x], scope, [self.shape[x][p] for p in perm], perm=perm)

    def squeeze0(self, x: str, scope: str) -> str:
        if self.opset < 13:
            return self.op("Squeeze", [x], scope, self.shape[x][1:], axes=[0])
        return self.op("Squeeze", [x, self.constant(scope, [0])], scope, self.shape[x][1:])

    def slice(self, x: str, scope: str, starts: str, ends: str, axis: int,
              out_len: int) -> str:
        """``x[..., start:end, ...]`` on one axis; ``starts`` / ``ends`` are 1-d int64 tensors."""
        shape = list(self.shape[x])
        shape[axis] = out_len
        ins = [x, starts, ends, self.constant(scope, [axis]), self.constant(scope, [1])]
        return self.op("Slice", ins, scope, shape)

    def softmax_last(self, x: str, scope: str) -> str:
        # below opset 13 Softmax coerces to 2-D at ``axis``: the last axis gives the same result,
        # and torch writes it as a positive index there
        axis = -1 if self.opset >= 13 else len(self.shape[x]) - 1
        return self.op("Softmax", [x], scope, self.shape[x], axis=axis)

    def reduce_mean_last(self, x: str, scope: str) -> str:
        shape = self.shape[x][:-1] + (1,)
        if self.opset < 18:
            return self.op("ReduceMean", [x], scope, shape, axes=[-1], keepdims=1)
        return self.op("ReduceMean", [x, self.constant(scope, [-1])], scope, shape, keepdims=1)

    def gather(self, data: str, indices: str, scope: str, axis: int = 0) -> str:
        sd, si = self.shape[data], self.shape[indices]
        shape = sd[:axis] + si + sd[axis + 1:]
        return self.op("Gather", [data, indices], scope, shape, axis=axis)

    # ---------------------------------------------------------------------- shape computations
    def shape_of(self, x: str, scope: str) -> str:
        return self.op("Shape", [x], scope, (len(self.shape[x]),))

    def size(self, x: str, scope: str, dim: int, shp: str | None = None) -> str:
        """torch's ``x.size(dim)`` as a 0-d int64 tensor: ``Shape -> Gather`` (one ``Shape`` per
        call unless ``shp`` is given)."""
        shp = shp or self.shape_of(x, scope)
        return self.gather(shp, self.constant(scope, dim), scope)

    def size1(self, x: str, scope: str, dim: int, shp: str | None = None) -> str:
        """``x.size(dim)`` as a 1-element list entry: ``Shape -> Gather -> Unsqueeze``."""
        return self.unsqueeze(self.size(x, scope, dim, shp), scope, [0])

    def view(self, x: str, scope: str, parts: list, shape: tuple[int, ...]) -> str:
        """Reshape ``x`` to the static ``shape``. Traced form: the target is the ``Concat`` of
        ``parts`` (1-element int64 tensors from shape chains, or ints, written as ``Constant``
        nodes); fused form: one ``Constant``."""
        if self.traced:
            ins = [p if isinstance(p, str) else self.constant(scope, [p]) for p in parts]
            target = self.op("Concat", ins, scope, (len(ins),), axis=0)
        else:
            target = self.constant(scope, list(shape))
        return self.op("Reshape", [x, target], scope, shape)

    # ---------------------------------------------------------------------------------- layers
    def layernorm(self, x: str, module: str, eps: float) -> str:
        """LayerNorm over the last axis (``gamma ~ 1 +- 0.1``, ``beta ~ N(0, 0.02)``)."""
        c = self.shape[x][-1]
        gamma = 1.0 + self.normal((c,), 0.1)
        beta = self.normal((c,), 0.02)
        w = self.init(f"{module}.weight", gamma)
        b = self.init(f"{module}.bias", beta)
        scope = _hf_scope(module)
        if not self.traced:
            return self.op("LayerNormalization", [x, w, b], scope, self.shape[x], axis=-1,
                           epsilon=eps)
        # torch's decomposition (symbolic_opset9.native_layer_norm)
        mean = self.reduce_mean_last(x, scope)
        d = self.binary("Sub", x, mean, scope)
        var = self.reduce_mean_last(self.binary("Pow", d, self.fconst(scope, 2.0), scope), scope)
        std = self.op("Sqrt", [self.binary("Add", var, self.fconst(scope, eps), scope)], scope,
                      self.shape[var])
        y = self.binary("Div", d, std, scope)
        return self.binary("Add", self.binary("Mul", y, w, scope), b, scope)

    def linear(self, x: str, module: str, cout: int, gain: float = 1.0) -> str:
        """``nn.Linear`` on a [B, S, in] activation: ``MatMul`` + bias ``Add``."""
        cin = self.shape[x][-1]
        w = self.normal((cout, cin), gain / math.sqrt(cin))   # PyTorch's layout [out, in]
        bias = self._center(x, w, self.normal((cout,), _BIAS_STD))
        scope = _hf_scope(module)
        out_shape = self.shape[x][:-1] + (cout,)
        if self.traced:
            wt = self.init(self._folded_name("MatMul"), np.ascontiguousarray(w.T))
            y = self.op("MatMul", [x, wt], scope, out_shape)
            y = self.binary("Add", self.init(f"{module}.bias", bias), y, scope)
        else:
            wt = self.permute(self.init(f"{module}.weight", w), scope, [1, 0])
            y = self.op("MatMul", [x, wt], scope, out_shape)
            y = self.binary("Add", y, self.init(f"{module}.bias", bias), scope)
        return self._record(y, w, bias)

    def linear2d(self, x: str, module: str, cout: int, gain: float = 1.0) -> str:
        """``nn.Linear`` on a [B, in] activation: ``Gemm`` with ``transB=1`` (both exporters)."""
        n, cin = self.shape[x]
        w = self.normal((cout, cin), gain / math.sqrt(cin))
        bias = self.normal((cout,), _BIAS_STD)
        ins = [x, self.init(f"{module}.weight", w), self.init(f"{module}.bias", bias)]
        return self.op("Gemm", ins, _hf_scope(module), (n, cout), alpha=1.0, beta=1.0, transB=1)

    def conv1d(self, x: str, module: str, cout: int, gain=1.0) -> str:
        """GPT-2's ``Conv1D`` (weight stored ``[in, out]``; ``torch.addmm`` on a 2-D view).

        Traced form: ``Reshape`` to ``[-1, in]`` (``x.size(-1)`` as ``Shape -> Slice -> Squeeze``),
        ``Gemm`` (``transB=0``), ``Reshape`` back to ``x.size()[:-1] + (out,)``; fused form:
        ``MatMul`` by the ``[in, out]`` weight and ``Add`` of the bias. ``gain`` may be one value
        per output column (GPT-2's fused query / key / value projection)."""
        b, s, cin = self.shape[x]
        w = self.normal((cin, cout), 1.0 / math.sqrt(cin))
        w *= np.asarray(gain, dtype=np.float32)
        bias = self._center(x, w.T, self.normal((cout,), _BIAS_STD))
        wn = self.init(f"{module}.weight", w)
        bn = self.init(f"{module}.bias", bias)
        scope = _hf_scope(module)
        if not self.traced:
            y = self.op("MatMul", [x, wn], scope, (b, s, cout))
            return self._record(self.binary("Add", y, bn, scope), w.T, bias)
        shp = self.shape_of(x, scope)
        d0 = self.size1(x, scope, 0, shp)
        d1 = self.size1(x, scope, 1, shp)
        ends = self.constant(scope, [_INT64_MAX])
        last = self.op("Slice", [shp, self.constant(scope, [-1]), ends, self.constant(scope, [0])],
                       scope, (1,))
        last = self.unsqueeze(self.squeeze0(last, scope), scope, [0])
        flat = self.view(x, scope, [-1, last], (b * s, cin))
        y = self.op("Gemm", [flat, wn, bn], scope, (b * s, cout), alpha=1.0, beta=1.0)
        return self._record(self.view(y, scope, [d0, d1, cout], (b, s, cout)), w.T, bias)

    def gelu_erf(self, x: str, module: str) -> str:
        """``nn.functional.gelu`` (exact): ``x * (1 + erf(x / sqrt(2))) * 0.5`` -- torch's
        ``Div, Erf, Add, Mul, Mul`` (no ``Gelu`` operator before opset 20)."""
        scope = _hf_scope(module)
        t = self.op("Erf", [self.binary("Div", x, self.fconst(scope, _SQRT2), scope)], scope,
                    self.shape[x])
        t = self.binary("Add", t, self.fconst(scope, 1.0), scope)
        y = self.binary("Mul", self.binary("Mul", x, t, scope), self.fconst(scope, 0.5), scope)
        return self._activation(y, x)

    def gelu_tanh(self, x: str, module: str) -> str:
        """GPT-2's ``NewGELUActivation``:
        ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``, node by node as traced."""
        scope = _hf_scope(module)
        half = self.binary("Mul", x, self.fconst(scope, 0.5), scope)
        cube = self.binary("Pow", x, self.fconst(scope, 3.0), scope)
        t = self.binary("Mul", cube, self.fconst(scope, 0.044715), scope)
        t = self.binary("Add", x, t, scope)
        t = self.binary("Mul", t, self.fconst(scope, math.sqrt(2.0 / math.pi)), scope)
        t = self.op("Tanh", [t], scope, self.shape[t])
        t = self.binary("Add", t, self.fconst(scope, 1.0), scope)
        return self._activation(self.binary("Mul", half, t, scope), x)

    # ------------------------------------------------------------------------------- attention
    def heads_view(self, x: str, scope: str, heads: int) -> str:
        """[B, S, hidden] -> [B, S, heads, head_dim]: ``x.view(x.size()[:-1] + (heads, hd))``."""
        b, s, hidden = self.shape[x]
        hd = hidden // heads
        parts = [self.size1(x, scope, 0), self.size1(x, scope, 1)] if self.traced else []
        return self.view(x, scope, parts + [heads, hd], (b, s, heads, hd))

    def split_heads(self, x: str, scope: str, heads: int, perm: list[int]) -> str:
        """:meth:`heads_view` then ``Transpose(perm)``: ``[0, 2, 1, 3]`` for queries and values,
        ``[0, 2, 3, 1]`` for keys (torch fuses the ``permute`` with the ``transpose(-1, -2)`` of
        ``q @ k^T``)."""
        return self.permute(self.heads_view(x, scope, heads), scope, perm)

    def split_last(self, x: str, scope: str, sizes: list[int]) -> list[str]:
        """``x.split(size, dim=-1)``: ``Split`` (sizes as an attribute before opset 13)."""
        axis = len(self.shape[x]) - 1
        if self.opset < 13:
            outs = self.node("Split", [x], scope, n_out=len(sizes), axis=axis, split=sizes)
        else:
            outs = self.node("Split", [x, self.constant(scope, sizes)], scope, n_out=len(sizes),
                             axis=axis)
        for o, sz in zip(outs, sizes):
            self.shape[o] = self.shape[x][:-1] + (sz,)
        return outs

    def merge_heads(self, ctx: str, scope: str) -> str:
        """[B, heads, S, head_dim] -> ``Transpose [0, 2, 1, 3]`` -> [B, S, hidden]."""
        b, heads, s, hd = self.shape[ctx]
        t = self.permute(ctx, scope, [0, 2, 1, 3])
        parts = [self.size1(t, scope, 0), self.size1(t, scope, 1)] if self.traced else []
        return self.view(t, scope, parts + [heads * hd], (b, s, heads * hd))
