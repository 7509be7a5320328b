"""The operator graph between ONNX import and tile partitioning.

Every activation is a 4-D tensor ``(N, C, H, W)`` in ONNX terms, stored position-major ("NHWC"):
``storage[n, h, w, c]``. A *column* is one position ``(n, h, w)`` (column index
``(n * H + h) * W + w``); the *rows* of a column are its ``C`` channels, contiguous in memory.
Rank-2 ONNX tensors ``(N, F)`` are ``(N, F, 1, 1)`` here; ``Layer.onnx_shape`` keeps the shape the
ONNX graph gave the tensor so outputs go back to users in that shape.

A graph is a list of layers in topological order; a layer names its producers by index. Weights are
float32 numpy arrays in the layouts below (the native runtime packs them further at load).

Ops (``Layer.op``) and their attributes / weights:

``INPUT``
    A graph input. ``attrs = {}``.
``CONV``
    ``inputs = [x]`` or ``[x, residual]``. 2-D convolution, then ``+ bias``, then ``+ residual``
    (same shape as the output), then the activation. attrs: ``kh, kw, sh, sw, pt, pl, pb, pr, dh, dw,
    group, act, alpha, beta``. weights: ``w`` of shape ``(group, kh, kw, cin_g, cout_g)`` (the GEMM
    reduction index is ``(ky * kw + kx) * cin_g + ci``), ``b`` of shape ``(C_out,)``.
    Gemm / MatMul with constant weights / Flatten-then-Gemm are CONV with a kernel that covers the
    whole input (``kh = H_in, kw = W_in``, no padding): the weights are permuted so the reduction
    index follows the NHWC storage order of the flattened input.
``POOL``
    ``inputs = [x]``. attrs: ``kind`` (``POOL_MAX`` / ``POOL_AVG``), ``kh, kw, sh, sw, pt, pl, pb, pr,
    dh, dw, count_include_pad``. The output size is given by the layer shape (ceil_mode already
    resolved by the importer); windows are clipped to the input. For average pooling the divisor is
    the number of window elements inside the input, or, with ``count_include_pad``, inside the
    input extended by the pads (ONNX semantics).
``GLOBAL_POOL``
    ``inputs = [x]``; attrs: ``kind``. Reduces over H, W; output ``(N, C, 1, 1)``.
``BINARY``
    ``inputs = [a]`` or ``[a, b]``; elementwise ``a OP b`` with ONNX (numpy) broadcasting, then the
    activation. attrs: ``kind`` (``BIN_ADD/SUB/MUL/DIV``), ``act, alpha, beta``; with one input,
    ``b`` is the constant weight ``k`` (a 4-D array broadcastable to the output, in NCHW order as
    ONNX gives it) and ``const_first`` (1 when the constant is the left operand: ``k OP a``).
    Activation inputs may broadcast too (shape of each producer broadcasts to the output).
``AFFINE``
    ``inputs = [x]``; ``y = act(x * scale[c] + shift[c])``. weights ``scale, shift`` (shape ``(C,)``).
    Standalone activations are AFFINE with scale 1, shift 0; BatchNormalization that cannot be
    folded into a preceding CONV becomes AFFINE.
``CONCAT``
    ``inputs = [x1, ..., xk]`` with equal N, H, W; concatenation over channels.
``GATHER``
    ``inputs = [x1, ..., xk]``; a pure index mapping (Transpose, Reshape, Flatten, Slice, Split,
    Pad, channel shuffle, DepthToSpace, concatenation along non-channel axes...). weights: ``index``
    (int32, shape ``(N*H*W*C,)`` in output *storage* order): each entry is a flat index into the
    concatenation of the inputs' *storage* arrays, or ``-1`` for ``fill`` (attr, a float).
``LRN``
    ``inputs = [x]``; across-channel local response normalisation. attrs: ``size, alpha, beta, bias``.
``SOFTMAX``
    ``inputs = [x]``; softmax over channels within each column. attrs: ``log`` (0/1 for LogSoftmax).

Activations (``attrs['act']``): ``ACT_NONE``, ``ACT_RELU``, ``ACT_CLIP`` (alpha = min, beta = max),
``ACT_LEAKY`` (alpha), ``ACT_SIGMOID``, ``ACT_HARDSIGMOID`` (alpha, beta: ``max(0, min(1, alpha * x
+ beta))``), ``ACT_HARDSWISH`` (``x * max(0, min(1, x / 6 + 1 / 2))``), ``ACT_TANH``. The numeric
codes are shared with the native runtime (``native/include/coacto.h``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Op codes: shared with native/include/coacto.h (COACTO_OP_*).
OP_INPUT = 0
OP_CONV = 1
OP_POOL = 2
OP_GLOBAL_POOL = 3
OP_BINARY = 4
OP_AFFINE = 5
OP_CONCAT = 6
OP_GATHER = 7
OP_LRN = 8
OP_SOFTMAX = 9
OP_NOP = 10  # native tests and overhead benchmarks only

OP_NAMES = {
    OP_INPUT: "INPUT", OP_CONV: "CONV", OP_POOL: "POOL", OP_GLOBAL_POOL: "GLOBAL_POOL",
    OP_BINARY: "BINARY", OP_AFFINE: "AFFINE", OP_CONCAT: "CONCAT", OP_GATHER: "GATHER",
    OP_LRN: "LRN", OP_SOFTMAX: "SOFTMAX", OP_NOP: "NOP",
}
OP_CODES = {v: k for k, v in OP_NAMES.items()}

ACT_NONE = 0
ACT_RELU = 1
ACT_CLIP = 2
ACT_LEAKY = 3
ACT_SIGMOID = 4
ACT_HARDSIGMOID = 5
ACT_HARDSWISH = 6
ACT_TANH = 7

POOL_MAX = 0
POOL_AVG = 1

BIN_ADD = 0
BIN_SUB = 1
BIN_MUL = 2
BIN_DIV = 3


@dataclass
class Layer:
    """One operator of the imported graph; its output is one (N, C, H, W) activation."""

    name: str
    op: str  # one of OP_NAMES' values
    inputs: list[int]
    shape: tuple[int, int, int, int]  # (N, C, H, W)
    attrs: dict = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    onnx_shape: tuple[int, ...] | None = None  # the ONNX tensor shape of this output

    @property
    def columns(self) -> int:
        n, _, h, w = self.shape
        return n * h * w

    @property
    def rows(self) -> int:
        return self.shape[1]


@dataclass
class Graph:
    """Imported operator graph: layers in topological order, named inputs and outputs."""

    layers: list[Layer]
    inputs: dict[str, int]  # ONNX input name -> layer index (op INPUT)
    outputs: dict[str, int]  # ONNX output name -> layer index
    model_hash: str = ""  # sha256 (hex) of the serialized ONNX model

    def consumers(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.layers]
        for i, layer in enumerate(self.layers):
            for p in layer.inputs:
                out[p].append(i)
        return out


def to_storage(x: np.ndarray) -> np.ndarray:
    """An ONNX-shaped activation -> contiguous NHWC storage (rank 2 means (N, F, 1, 1))."""
    x4 = as_nchw(x)
    return np.ascontiguousarray(x4.transpose(0, 2, 3, 1))


def from_storage(s: np.ndarray, shape4: tuple[int, int, int, int], onnx_shape) -> np.ndarray:
    """NHWC storage (any shape holding N*H*W*C values) -> the ONNX-shaped array."""
    n, c, h, w = shape4
    x = np.asarray(s).reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x.reshape(onnx_shape if onnx_shape is not None else shape4))


def as_nchw(x: np.ndarray) -> np.ndarray:
    """View an ONNX activation of rank 1..4 as (N, C, H, W)."""
    if x.ndim == 4:
        return x
    if x.ndim == 2:
        return x.reshape(x.shape[0], x.shape[1], 1, 1)
    if x.ndim == 3:
        return x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
    if x.ndim == 1:
        return x.reshape(1, x.shape[0], 1, 1)
    raise ValueError(f"activations of rank {x.ndim} are not supported")


def nchw_shape(onnx_shape) -> tuple[int, int, int, int]:
    s = tuple(int(d) for d in onnx_shape)
    if len(s) == 4:
        return s  # type: ignore[return-value]
    if len(s) == 2:
        return (s[0], s[1], 1, 1)
    if len(s) == 3:
        return (s[0], s[1], 1, s[2])
    if len(s) == 1:
        return (1, s[0], 1, 1)
    raise ValueError(f"activations of rank {len(s)} are not supported")
