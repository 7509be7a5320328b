"""The operator graph between ONNX import and tile partitioning.

Every activation is a 4-D tensor ``(N, C, H, W)`` stored position-major ("NHWC"):
``storage[n, h, w, c]``. A *column* is one position ``(n, h, w)`` (column index
``(n * H + h) * W + w``); the *rows* of a column are its ``C`` values, contiguous in memory.
``Layer.onnx_shape`` keeps the shape the ONNX graph gave the tensor, and ``Layer.layout`` says which
ONNX axis holds the rows:

``"channels"`` (``LAYOUT_CHANNELS``, CNNs)
    axis 1: ``(N, C, H, W)`` as is; rank 3 ``(N, C, L)`` is ``(N, C, 1, L)``; rank 2 ``(N, F)`` is
    ``(N, F, 1, 1)``; rank 1 ``(F,)`` is ``(1, F, 1, 1)``; rank 5 ``(N, C, D, H, W)`` (video,
    volumes) is ``(N, C, D * H, W)``: the axes between the channels and the last are one.
``"last"`` (``LAYOUT_LAST``, sequence models)
    the last axis: ``(d0, d1, d2, d3)`` is ``(d0, d3, d1, d2)``, rank 3 ``(B, S, D)`` is
    ``(B, D, 1, S)``, rank 5 ``(d0, d1, d2, d3, d4)`` is ``(d0, d4, d1 * d2, d3)``; ranks 1 and 2
    as above. The storage is then the ONNX tensor in row-major order, byte for byte: inputs and
    outputs need no copy, a column is one (batch, token) and the rows its hidden features, and
    reshapes that keep the last axis change nothing in memory.

Ranks up to ``MAX_RANK`` map the same way. Ops that compute on the rows of each column (element
by element, per channel, along the rows) are the same on the merged shape; ops with a spatial
window (CONV, POOL) see the merged axis as H, so the importer gives them 4-D layers only.

A graph is a list of layers in topological order; a layer names its producers by index. Weights are
float32 numpy arrays in the layouts below (the native runtime packs them further at load). A constant
given "in NCHW order" is a 4-D array broadcastable to the layer's ``(N, C, H, W)``.

Ops (``Layer.op``) and their attributes / weights:

``INPUT``
    A graph input. ``attrs = {}`` for float32; otherwise ``dtype``, the ONNX element type the caller
    feeds: float16 or float64 (computed in float32, as every tensor is), or an integer type (token
    ids, masks) with, when they index an embedding table, ``index_limit`` V: such values travel as
    float32 and must be integers in ``[-V, V)``.
``CONV``
    ``inputs = [x]`` or ``[x, residual]``. 2-D convolution, then ``+ bias``, then ``+ residual``
    (same shape as the output), then the activation. attrs: ``kh, kw, sh, sw, pt, pl, pb, pr, dh, dw,
    group, act, alpha, beta``. weights: ``w`` of shape ``(group, kh, kw, cin_g, cout_g)`` (the GEMM
    reduction index is ``(ky * kw + kx) * cin_g + ci``), ``b`` of shape ``(C_out,)``.
    Gemm / MatMul with constant weights / Flatten-then-Gemm are CONV with a kernel that covers the
    whole input (``kh = H_in, kw = W_in``, no padding; 1x1 for the rows of a sequence): the
    weights are permuted so the reduction index follows the NHWC storage order of the input.
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
    activation. attrs: ``kind`` (``BIN_ADD/SUB/MUL/DIV/POW/MAX/MIN``, and the comparisons
    ``BIN_EQUAL/LESS/GREATER/GREATER_EQUAL/LESS_EQUAL`` giving 1.0 or 0.0, 0.0 for NaN),
    ``act, alpha, beta``; with one input, ``b`` is
    the constant weight ``k`` (in NCHW order) and ``const_first`` (1 when the constant is the left
    operand: ``k OP a``). Activation inputs may broadcast too (each dim 1 or the output's).
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
    concatenation of the inputs' *storage* arrays followed by the optional weight ``const``
    (float32 values, e.g. a class token concatenated to a sequence), or ``-1`` for ``fill``.
``LRN``
    ``inputs = [x]``; across-channel local response normalisation. attrs: ``size, alpha, beta, bias``.
``SOFTMAX``
    ``inputs = [x]``; softmax over the rows of each column. attrs: ``log`` (0/1 for LogSoftmax).
``MATMUL``
    ``inputs = [a, b]`` or ``[a, b, mask]``: a batched matrix product of two activations,
    ``y[b0, b1, i, j] = scale * sum_k A[b0, b1, i, k] * B[b0, b1, k, j] (+ mask[b0, b1, i, j])``.
    The operands are read through strides from their producers' storage (so a head split or the
    transposed keys of ``Q K^T`` cost no copy; stride 0 broadcasts): ``A[b0, b1, i, k] =
    a[a_off + b0 * a_s0 + b1 * a_s1 + i * a_si + k]``, ``B[b0, b1, k, j] = b[b_off + b0 * b_s0 +
    b1 * b_s1 + k * b_sk + j * b_sj]`` with ``b_sk`` or ``b_sj`` equal to 1, the mask likewise with
    ``m_*`` (``m_sj`` 0 or 1). attrs: ``batch0, batch1, m, n, k``, those strides and offsets,
    ``has_mask``, ``scale``, ``out_mode`` (0: column ``(b0 * B1 + b1) * M + i``, row ``j``;
    1: column ``b0 * M + i``, row ``b1 * N + j``, the heads of an attention context side by side
    as the following Transpose + Reshape want them), ``causal`` with ``offset`` (1: outputs with
    ``j > i + offset`` are ``fill`` -- then the mask is added -- and never computed; 2: the sum
    runs over ``k <= i + offset`` only) and ``fill``.
``ATTENTION``
    ``inputs = [a, b, v]`` or ``[a, b, v, mask]``: ``y[b0, b1, i, d] = sum_j softmax_j(s[b0, b1,
    i, :])[j] * V[b0, b1, j, d]`` where ``s`` are the scores MATMUL computes from ``a, b`` (and the
    mask) with the same attrs, and ``V[b0, b1, j, d] = v[v_off + b0 * v_s0 + b1 * v_s1 + j * v_sk
    + d * v_sj]`` (``v_sk`` or ``v_sj`` equal to 1): a MATMUL of the scores, their SOFTMAX and the
    MATMUL of the probabilities by the values, as one layer (coacto.frontend.fuse) whose tiles
    never store the scores. attrs: MATMUL's (``n`` keys, ``k`` the query and key depth,
    ``out_mode`` for the context as MATMUL's with ``dv`` in place of ``n``), ``dv`` and the
    ``v_*`` strides; ``causal`` 1 with ``offset >= 0`` leaves out the keys ``j > i + offset``
    (probability 0: what a fill of -1e30 or less before the softmax gives when nothing is added
    to it; the fusion takes no causal scores that also have a mask).
``LAYERNORM``
    ``inputs = [x]``; ``y = (x - mean) / sqrt(var + eps) * scale[c] + shift[c]`` with the mean and
    the (biased) variance over the rows of each column. attrs: ``eps``; weights ``scale, shift``.
``ROW_REDUCE``
    ``inputs = [x]``; the ``kind`` (``REDUCE_MAX/MEAN/SUM/MIN``) of each column's rows; output
    ``C = 1``.
``WHERE``
    ``cond != 0 ? x : y`` with broadcasting. attrs: ``operands`` (bit 0 cond, 1 x, 2 y: which are
    inputs, in that order); weights ``cond``, ``x``, ``y`` for the constant ones (NCHW order).
``EMBED``
    ``inputs = [ids]`` holding one value per output column (in storage order): output column i is
    row ``ids[i]`` of the weight ``table`` (V, C); negative ids count from the end, ids outside
    ``[-V, V)`` give zeros (the runtime's input check rejects them first).

Activations (``attrs['act']``): ``ACT_NONE``, ``ACT_RELU``, ``ACT_CLIP`` (alpha = min, beta = max),
``ACT_LEAKY`` (alpha), ``ACT_SIGMOID``, ``ACT_HARDSIGMOID`` (alpha, beta: ``max(0, min(1, alpha * x
+ beta))``), ``ACT_HARDSWISH`` (``x * max(0, min(1, x / 6 + 1 / 2))``), ``ACT_TANH``, ``ACT_SQRT``,
``ACT_ERF``, ``ACT_GELU`` (``x * (1 + erf(x / sqrt 2)) / 2``), ``ACT_GELU_TANH`` (``x * (1 +
tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2``), ``ACT_RECIPROCAL``, ``ACT_EXP``, ``ACT_ISNAN``
(1.0 or 0.0), ``ACT_ELU`` (alpha: ``x > 0 ? x : alpha * (e^x - 1)``), ``ACT_SELU`` (alpha, beta:
``beta * elu(x)``, beta being ONNX's gamma), ``ACT_CELU`` (alpha: ``x > 0 ? x : alpha * (e^(x /
alpha) - 1)``), ``ACT_SOFTPLUS`` (``log(1 + e^x)``), ``ACT_SOFTSIGN`` (``x / (1 + |x|)``),
``ACT_THRESHOLDED_RELU`` (alpha: ``x > alpha ? x : 0``), ``ACT_ABS``, ``ACT_FLOOR``, ``ACT_CEIL``,
``ACT_ROUND`` (to the nearest integer, halves to even), ``ACT_SIGN`` (-1, 0 or 1; NaN stays NaN),
``ACT_LOG`` (natural; -inf at 0, NaN below). The numeric codes are shared with the native
runtime (``native/include/coacto.h``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import ShapeError

# Size limits, checked before anything of that size is allocated: by the ONNX importer (inputs,
# every folded constant and index map, every layer), the partitioner and the .ctg loader. A
# model is untrusted input (a server compiles what devices upload), and a declared dimension of
# 1e9 would otherwise become an allocation numpy attempts. Both limits are far above real models:
# the largest activation of the zoo is under 2^23 values, and a U-Net at 2048 x 2048 with 64
# channels is 2^28; ResNet-50's layers hold 2^23.6 values together. Tests and fuzzers lower them
# (they are read at each check).
#: Most elements one tensor may have: 2^28, 1 GiB as float32 (the importer's index maps of views
#: are int64, 2 GiB; the native runtime refuses layers beyond 2^31 values).
MAX_TENSOR_ELEMENTS = 1 << 28
#: Most elements all of a graph's layers may hold together: 2^31, 8 GiB as float32.
MAX_TOTAL_ELEMENTS = 1 << 31
#: Highest rank of an activation (layouts above: the axes between the first two and the last
#: are one). ONNX sets none; 3-D convolutions need 5, the pixel shuffles spelled as reshapes 6.
MAX_RANK = 8


def check_elements(shape, what: str, error: type[Exception] = ShapeError,
                   hint: str = "; check the model's dimensions and the input_shapes given") -> int:
    """The number of elements of ``shape``; raises ``error`` when it exceeds
    MAX_TENSOR_ELEMENTS (before anyone allocates it)."""
    size = math.prod(int(d) for d in shape)
    if size > MAX_TENSOR_ELEMENTS:
        raise error(f"{what} has shape {tuple(int(d) for d in shape)}, {size} elements: more "
                    f"than coacto's limit of {MAX_TENSOR_ELEMENTS} per tensor "
                    f"(coacto.ir.MAX_TENSOR_ELEMENTS){hint}")
    return size

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
OP_MATMUL = 11
OP_LAYERNORM = 12
OP_ROW_REDUCE = 13
OP_WHERE = 14
OP_EMBED = 15
OP_ATTENTION = 16



def _binary_kdims(layer: "Layer") -> list[int]:
    """BINARY's constant dims (n, c, h, w; each 1 or the output's), all 1 without one."""
    k = layer.weights.get("k")
    if k is None:
        return [1, 1, 1, 1]
    return list(nchw_shape(k.shape)) if k.ndim != 4 else list(k.shape)


def _where_dims(layer: "Layer") -> list[int]:
    """WHERE's constant cond / x / y dims (n, c, h, w each), 1s for operands that are inputs."""
    out: list[int] = []
    for key in ("cond", "x", "y"):
        k = layer.weights.get(key)
        out += [1, 1, 1, 1] if k is None else list(np.asarray(k).shape)
    return out


def _embed_vocab(layer: "Layer") -> list[int]:
    return [int(layer.weights["table"].shape[0])]


#: MATMUL's int attrs in native order (ATTENTION's begin with them).
MATMUL_IPARAMS = ("batch0", "batch1", "m", "n", "k", "a_off", "a_s0", "a_s1", "a_si", "b_off",
                  "b_s0", "b_s1", "b_sk", "b_sj", "out_mode", "causal", "offset", "has_mask",
                  "m_off", "m_s0", "m_s1", "m_si", "m_sj")
_WINDOW = ("kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", ("dh", 1), ("dw", 1))
_ACT_F = (("alpha", 0.0), ("beta", 0.0))


@dataclass(frozen=True)
class OpContract:
    """An op as the native runtime takes it, written once: its code, how many inputs, its arrays
    (weight keys in the native array slots' order), and how its attrs pack into the native
    iparams / fparams. native/src/ops.c holds the C side's table (coacto_op_contract), which
    tests/test_structure.py checks against this one; native/src/ops.h says what each slot means.

    A parameter entry is an attr name (required), (name, default), an int (a constant slot), or
    (width, function of the layer returning that many values)."""

    name: str
    code: int
    inputs: tuple[int, int]
    arrays: tuple[str, ...] = ()
    iparams: tuple = ()
    fparams: tuple = ()

    @staticmethod
    def _width(entry) -> int:
        return entry[0] if isinstance(entry, tuple) and callable(entry[1]) else 1

    @property
    def n_iparams(self) -> int:
        return sum(self._width(e) for e in self.iparams)

    @property
    def n_fparams(self) -> int:
        return sum(self._width(e) for e in self.fparams)

    def pack(self, layer: "Layer") -> tuple[list, list]:
        """(iparams, fparams) of ``layer`` in the native order."""
        def values(entries):
            out: list = []
            for e in entries:
                if isinstance(e, str):
                    out.append(layer.attrs[e])
                elif isinstance(e, int):
                    out.append(e)
                elif callable(e[1]):
                    got = e[1](layer)
                    assert len(got) == e[0], (self.name, e, got)
                    out += got
                else:
                    out.append(layer.attrs.get(e[0], e[1]))
            return out
        return values(self.iparams), values(self.fparams)


#: Every op, by name (see OpContract).
OPS = {c.name: c for c in (
    OpContract("INPUT", OP_INPUT, (0, 0)),
    OpContract("CONV", OP_CONV, (1, 2), ("w", "b", "pre_w", "pre_b"),
               _WINDOW + ("group", ("act", 0), ("pre", 0), ("pre_act", 0)),
               _ACT_F + (("pre_alpha", 0.0), ("pre_beta", 0.0))),
    OpContract("POOL", OP_POOL, (1, 1), (), _WINDOW + ("kind", ("count_include_pad", 0))),
    OpContract("GLOBAL_POOL", OP_GLOBAL_POOL, (1, 1), (), ("kind",)),
    OpContract("BINARY", OP_BINARY, (1, 2), ("k",),
               ("kind", ("act", 0), ("const_first", 0), 0, (4, _binary_kdims)), _ACT_F),
    OpContract("AFFINE", OP_AFFINE, (1, 1), ("scale", "shift"), (("act", 0),), _ACT_F),
    OpContract("CONCAT", OP_CONCAT, (1, 8)),
    OpContract("GATHER", OP_GATHER, (1, 8), ("index", "const"), (), (("fill", 0.0),)),
    OpContract("LRN", OP_LRN, (1, 1), (), ("size",), ("alpha", "beta", "bias")),
    OpContract("SOFTMAX", OP_SOFTMAX, (1, 1), (), (("log", 0),)),
    OpContract("NOP", OP_NOP, (0, 8)),
    OpContract("MATMUL", OP_MATMUL, (2, 3), (), tuple((k, 0) for k in MATMUL_IPARAMS),
               (("scale", 1.0), ("fill", 0.0))),
    OpContract("LAYERNORM", OP_LAYERNORM, (1, 1), ("scale", "shift"), (), ("eps",)),
    OpContract("ROW_REDUCE", OP_ROW_REDUCE, (1, 1), (), ("kind",)),
    OpContract("WHERE", OP_WHERE, (1, 3), ("cond", "x", "y"),
               ("operands", 0, 0, 0, (12, _where_dims))),
    OpContract("EMBED", OP_EMBED, (1, 1), ("table",), ((1, _embed_vocab),)),
    OpContract("ATTENTION", OP_ATTENTION, (3, 4), (),
               tuple((k, 0) for k in MATMUL_IPARAMS + ("dv", "v_off", "v_s0", "v_s1", "v_sk",
                                                        "v_sj")),
               (("scale", 1.0),)),
)}
OP_NAMES = {c.code: c.name for c in OPS.values()}
OP_CODES = {v: k for k, v in OP_NAMES.items()}

ACT_NONE = 0
ACT_RELU = 1
ACT_CLIP = 2
ACT_LEAKY = 3
ACT_SIGMOID = 4
ACT_HARDSIGMOID = 5
ACT_HARDSWISH = 6
ACT_TANH = 7
ACT_SQRT = 8
ACT_ERF = 9
ACT_GELU = 10
ACT_GELU_TANH = 11
ACT_RECIPROCAL = 12
ACT_EXP = 13
ACT_ISNAN = 14
ACT_ELU = 15
ACT_SELU = 16
ACT_CELU = 17
ACT_SOFTPLUS = 18
ACT_SOFTSIGN = 19
ACT_THRESHOLDED_RELU = 20
ACT_ABS = 21
ACT_FLOOR = 22
ACT_CEIL = 23
ACT_ROUND = 24
ACT_SIGN = 25
ACT_LOG = 26

POOL_MAX = 0
POOL_AVG = 1

BIN_ADD = 0
BIN_SUB = 1
BIN_MUL = 2
BIN_DIV = 3
BIN_EQUAL = 4
BIN_LESS = 5
BIN_GREATER = 6
BIN_POW = 7
BIN_MAX = 8
BIN_MIN = 9
BIN_GREATER_EQUAL = 10
BIN_LESS_EQUAL = 11

REDUCE_MAX = 0
REDUCE_MEAN = 1
REDUCE_SUM = 2
REDUCE_MIN = 3

LAYOUT_CHANNELS = "channels"
LAYOUT_LAST = "last"


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
    layout: str = LAYOUT_CHANNELS  # which ONNX axis holds the rows (see the module docstring)

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
    #: ONNX element type of the outputs the model declares as integers or bool (the layers hold
    #: exact integers; callers get that type back, as from onnxruntime); others are float32.
    output_dtypes: dict[str, int] = field(default_factory=dict)

    def consumers(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.layers]
        for i, layer in enumerate(self.layers):
            for p in layer.inputs:
                out[p].append(i)
        return out


def internal_shape(onnx_shape, layout: str = LAYOUT_CHANNELS) -> tuple[int, int, int, int]:
    """The (N, C, H, W) of an ONNX shape of rank 0..MAX_RANK in a layout."""
    s = tuple(int(d) for d in onnx_shape)
    if layout == LAYOUT_LAST and len(s) >= 3:
        return (s[0], s[-1], math.prod(s[1:-2]), s[-2])
    return nchw_shape(s)


def internal_array(x: np.ndarray, layout: str = LAYOUT_CHANNELS) -> np.ndarray:
    """An ONNX-shaped array (dims may be 1 where it broadcasts) as its (N, C, H, W) array. Above
    rank 4 the merged axes must be all 1 or all full (``broadcast_merged``)."""
    x = np.asarray(x)
    if layout == LAYOUT_LAST and x.ndim >= 3:
        r = x.ndim
        return x.transpose(0, r - 1, *range(1, r - 1)).reshape(internal_shape(x.shape, layout))
    return as_nchw(x)


def merged_axes(rank: int, layout: str = LAYOUT_CHANNELS) -> range:
    """The ONNX axes a layout stores as one internal H (several from rank 5 on)."""
    if rank < 3:
        return range(0)
    return range(1, rank - 2) if layout == LAYOUT_LAST else range(2, rank - 1)


def broadcast_merged(shape, out, layout: str = LAYOUT_CHANNELS) -> tuple[int, ...]:
    """The shape an operand of ``shape`` (of ``out``'s rank) broadcast to ``out`` needs so that
    its internal shape broadcasts to ``out``'s: the merged axes all 1 or all ``out``'s."""
    shape = tuple(int(d) for d in shape)
    axes = merged_axes(len(out), layout)
    if all(shape[a] == 1 for a in axes) or all(shape[a] == out[a] for a in axes):
        return shape
    return tuple(int(out[a]) if a in axes else d for a, d in enumerate(shape))


def storage_order(onnx_shape, layout: str = LAYOUT_CHANNELS) -> np.ndarray:
    """For each storage position of a tensor, the flat (row-major) ONNX index of its element."""
    size = int(np.prod(onnx_shape, dtype=np.int64))
    if layout == LAYOUT_LAST or len(onnx_shape) <= 2:
        return np.arange(size, dtype=np.int64)
    n, c, h, w = nchw_shape(onnx_shape)
    return np.arange(size, dtype=np.int64).reshape(n, c, h, w).transpose(0, 2, 3, 1).ravel()


def same_layout(rank: int, a: str, b: str) -> bool:
    """Whether two layouts store a tensor of this rank identically (ranks 1, 2: always)."""
    return rank <= 2 or a == b


def to_storage(x: np.ndarray, layout: str = LAYOUT_CHANNELS) -> np.ndarray:
    """An ONNX-shaped activation -> contiguous NHWC storage, in the tensor's layout."""
    if layout == LAYOUT_LAST or x.ndim <= 2:
        return np.ascontiguousarray(x).reshape(-1)
    x4 = as_nchw(x)
    return np.ascontiguousarray(x4.transpose(0, 2, 3, 1))


#: ONNX element type -> numpy dtype of the integer and bool types inputs and outputs may have.
INTEGER_NUMPY_TYPES = {7: np.int64, 6: np.int32, 5: np.int16, 3: np.int8, 2: np.uint8,
                       4: np.uint16, 12: np.uint32, 9: np.bool_}
#: The float types inputs and outputs may have besides float32. Computation is float32 all the same:
#: float16 inputs widen exactly, float64 ones round to float32; outputs are converted back.
FLOAT_NUMPY_TYPES = {10: np.float16, 11: np.float64}


def integer_input(layer: "Layer") -> bool:
    """Whether an INPUT layer takes integers (ids, masks), which travel exactly."""
    return layer.attrs.get("dtype") in INTEGER_NUMPY_TYPES


def output_as(values: np.ndarray, elem: int) -> np.ndarray:
    """A computed float32 tensor as ONNX type ``elem``: float16 / float64 converted; integer types
    from exact integers (what integer-valued layers hold: rounded, they are whole already); bool
    is non-zero."""
    if int(elem) in FLOAT_NUMPY_TYPES:
        return values.astype(FLOAT_NUMPY_TYPES[int(elem)])
    dtype = INTEGER_NUMPY_TYPES[int(elem)]
    return values != 0 if dtype is np.bool_ else np.rint(values).astype(dtype)


def from_storage(s: np.ndarray, shape4: tuple[int, int, int, int], onnx_shape,
                 layout: str = LAYOUT_CHANNELS) -> np.ndarray:
    """NHWC storage (any shape holding the tensor's values) -> the ONNX-shaped array.

    ``shape4`` is the layer's (N, C, H, W); the storage order follows ``onnx_shape`` and
    ``layout`` when ``onnx_shape`` is given."""
    if onnx_shape is not None and (layout == LAYOUT_LAST or len(onnx_shape) <= 2):
        return np.ascontiguousarray(s).reshape(onnx_shape)  # (a scalar stays 0-d)
    n, c, h, w = nchw_shape(onnx_shape) if onnx_shape is not None else shape4
    x = np.asarray(s).reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x.reshape(onnx_shape if onnx_shape is not None else shape4))


def storage_to_internal(s: np.ndarray, shape4) -> np.ndarray:
    """NHWC storage -> the (N, C, H, W) array."""
    n, c, h, w = shape4
    return np.asarray(s).reshape(n, h, w, c).transpose(0, 3, 1, 2)


def internal_to_storage(x4: np.ndarray) -> np.ndarray:
    """The (N, C, H, W) array -> flat NHWC storage."""
    return np.ascontiguousarray(x4.transpose(0, 2, 3, 1)).reshape(-1)


def as_nchw(x: np.ndarray) -> np.ndarray:
    """View an ONNX activation of rank 0..MAX_RANK as (N, C, H, W) in the channels layout."""
    return x.reshape(nchw_shape(x.shape))


def nchw_shape(onnx_shape) -> tuple[int, int, int, int]:
    """The (N, C, H, W) of an ONNX shape of rank 0..MAX_RANK in the channels layout."""
    s = tuple(int(d) for d in onnx_shape)
    if not 0 <= len(s) <= MAX_RANK:
        raise ValueError(f"activations of rank {len(s)} are not supported")
    if len(s) <= 2:  # a scalar is (1, 1, 1, 1)
        return ((1, 1) + s)[-2:] + (1, 1)  # type: ignore[return-value]
    return (s[0], s[1], math.prod(s[2:-1]), s[-1])
