"""coacto's own model zoo: real CNN architectures built with ``onnx.helper``, seeded random weights.

Nothing is downloaded: every model is generated in memory from its architecture (the exact layer
configuration of the original network) and a seed. The weights are random but *scaled* like a
trained network's, so that activations stay of order one through the whole depth and results can be
compared with onnxruntime at tight tolerances. While the graph is built, the per-channel mean and
variance that every activation has for ``N(0, 1)`` inputs are propagated through the layers with the
actual weights (exactly for the means of linear layers, including the padding's effect; with
independence assumptions for the variances; Gauss-Hermite quadrature for activations). Then:

* conv / fully connected weights are Kaiming-uniform (PyTorch's default family, variance
  ``2 / fan_in``), rescaled once so that the layer's predicted output second moment is one (the
  factor is close to 1 and rounded to a 2^(1/16) grid);
* BatchNormalization gets ``gamma ~ 1 +- 0.1``, ``beta ~ N(0, 0.05)`` and running statistics equal
  to its input's predicted per-channel mean (+ 0.1 std noise) and variance (x U(0.8, 1.2)) -- as
  after training, BN really normalises; the running variances stay near one;
* biases are small; final classifier logits have a standard deviation of about 1 (0.5 to 5).

Building is fast (ResNet-50 at 224: about 0.4 s; VGG-16, 553 MB of weights: about 2 s).

API::

    MODELS                     # name -> builder(**kw) -> onnx.ModelProto
    build(name, *, batch=1, image_size=None, opset=None, seed=0, style="default", softmax=False)
    save(name, path, **kw)     # -> pathlib.Path
    input_feeds(model, seed=0) # -> {input name: float32 array}
    count_params(model)        # trainable parameters, as torchvision counts them

Styles (``STYLES[name]`` lists those a model supports):

``"default"``
    What ``torch.onnx.export`` writes at the requested opset (13 unless given; 9, 11, 13, 17 and 18
    are tested): BatchNormalization nodes, ``Add`` for residuals, ``Flatten`` / torch-style shape
    subgraphs (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``), node names such as
    ``/layer1/layer1.0/conv1/Conv`` and initializer names such as ``layer1.0.conv1.weight``. Each
    operator uses the signature of its opset (Clip bounds, Squeeze/Unsqueeze/ReduceMean axes, Split
    sizes, Pad pads and Dropout ratio as attributes or inputs; MaxPool ``ceil_mode`` before opset 10
    is expressed with explicit end pads; HardSwish before opset 14 is HardSigmoid then Mul).
``"zoo"``
    The way the old ONNX model zoo files look (opset 9 unless given): BatchNormalization expressed
    as ``Mul`` / ``Add`` with per-channel constants passed through ``Unsqueeze`` nodes, residual
    additions as ``Sum``, ``Reshape`` with a shape initializer (or ``Flatten``) before ``Gemm``,
    explicit ``Pad`` nodes before strided convolutions, ``Slice`` for channel splits, and every
    initializer also listed as a graph input (as IR-version-3 exporters did).
``"preact"``
    (ResNets) pre-activation ResNet v2: BN-ReLU before each convolution, a final BN-ReLU.

Models (``DEFAULT_IMAGE_SIZE`` 224 for the classifiers, 56 for the blocks; any size from 32 up
works for all; an image too small for an architecture raises ``ValueError``):

``resnet18``
    torchvision ResNet-18 (11.69 M parameters): Conv, BatchNormalization, Relu,
    MaxPool, Add, GlobalAveragePool, Flatten, Gemm
``resnet50``
    torchvision ResNet-50 v1.5 (25.56 M; stride on the 3x3): as ResNet-18, flattened
    by torch's Shape -> Gather -> Unsqueeze -> Concat -> Reshape subgraph
``vgg16``
    torchvision VGG-16 (138.36 M at 224; the first FC follows the image size): Conv,
    Relu, MaxPool, Flatten, Gemm, Dropout
``mobilenetv2``
    torchvision MobileNetV2 (3.50 M): depthwise Conv, Clip (ReLU6), Add, ...
``squeezenet``
    torchvision SqueezeNet 1.1 (1.235 M): MaxPool ceil_mode, Concat (fire modules),
    Dropout, final Conv + Relu + GlobalAveragePool + Flatten
``densenet_block``
    DenseNet-121 stem + dense block 1 + transition 1: multi-input Concat (one-input
    Concat for the first layer), BatchNormalization on a Concat (a standalone
    per-channel affine), AveragePool 2x2
``inception_block``
    GoogLeNet stem with LRN, inception 3a (maxpool branch) and 3b (Inception-v3-style
    AveragePool count_include_pad=1 branch), AveragePool count_include_pad=0
``shufflenet_unit``
    ShuffleNetV2 1.0x stem + stage 2 (one stride-2 unit, three with channel Split /
    Slice) + conv5 + ReduceMean + Gemm; channel shuffle Reshape -> Transpose ->
    Reshape with torch's shape subgraphs
``mobilenetv3_block``
    MobileNetV3-Large stem + units 1-7: HardSwish (HardSigmoid + Mul before opset
    14), squeeze-excite GlobalAveragePool / ReduceMean -> Conv -> Relu -> Conv ->
    HardSigmoid / Sigmoid -> Mul (N,C,1,1) x (N,C,H,W), LeakyRelu, Swish (x *
    Sigmoid(x)), Squeeze -> Gemm -> HardSwish -> Dropout -> Gemm

``softmax=True`` appends a Softmax to the classifiers.

For one model, every style and opset computes the same function (up to float rounding), except
``preact`` which is another architecture.
"""
from __future__ import annotations

import math
import pathlib
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "MODELS", "STYLES", "OPSETS", "DEFAULT_IMAGE_SIZE", "build", "save", "input_feeds",
    "count_params",
]

#: opsets the builders are tested at (any opset in 9..18 is accepted).
OPSETS: tuple[int, ...] = (9, 11, 13, 17, 18)
_MIN_OPSET, _MAX_OPSET = 9, 18

_EPS = 1e-5


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


def _q_pos(a):
    """Round positive values to a 2^(1/16) grid (keeps BLAS rounding out of the model bytes)."""
    a = np.asarray(a, dtype=np.float64)
    return np.exp2(np.round(np.log2(np.maximum(a, 1e-30)) * 16.0) / 16.0)


def _q_abs(a):
    return np.round(np.asarray(a, dtype=np.float64) * 256.0) / 256.0


# ------------------------------------------------------------ moment propagation (per channel)
# Every activation tensor carries, per channel, the mean and variance its values have for
# N(0, 1) inputs, propagated through each layer with the actual weights (exact for the means of
# linear layers, independence assumptions for the variances). Batch normalisation statistics and
# weight scales are set from them, so activations stay of order one without running anything.
_GH_Z, _GH_W = np.polynomial.hermite_e.hermegauss(64)
_GH_W = _GH_W / _GH_W.sum()

_ACTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda a: np.maximum(a, 0.0),
    "relu6": lambda a: np.clip(a, 0.0, 6.0),
    "leakyrelu": lambda a: np.where(a > 0, a, 0.1 * a),
    "hardsigmoid": lambda a: np.clip(a / 6.0 + 0.5, 0.0, 1.0),
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "hardswish": lambda a: a * np.clip(a / 6.0 + 0.5, 0.0, 1.0),
    "swish": lambda a: a / (1.0 + np.exp(-a)),
}
_MONOTONE = {"relu", "relu6", "leakyrelu", "hardsigmoid", "sigmoid"}


def _gauss_moments(f, mean, var):
    """Mean and variance of f(y), y ~ N(mean, var) per channel (Gauss-Hermite quadrature)."""
    y = f(mean[:, None] + np.sqrt(np.maximum(var, 0.0))[:, None] * _GH_Z[None, :])
    m = y @ _GH_W
    return m, np.maximum((y * y) @ _GH_W - m * m, 1e-12)


def _max_of_normals(n: int) -> tuple[float, float]:
    """Mean and variance of the maximum of n iid N(0, 1)."""
    z = np.linspace(-12.0, 12.0, 24001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = n * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)
    dz = z[1] - z[0]
    m = float((z * pdf).sum() * dz)
    return m, float((z * z * pdf).sum() * dz - m * m)


_MAX_TABLE: dict[int, tuple[float, float]] = {}


def _valid_fraction(size: int, out: int, k: int, s: int, p: int, d: int = 1) -> np.ndarray:
    """Per kernel tap, the fraction of output positions whose input position is not padding."""
    i = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return ((i >= 0) & (i < size)).mean(axis=0)


def _valid_patterns(size: int, out: int, k: int, s: int, p: int, d: int = 1):
    """The distinct masks of valid kernel taps along one axis, with their share of positions."""
    i = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    masks, counts = np.unique((i >= 0) & (i < size), axis=0, return_counts=True)
    return masks.astype(np.float64), counts / out


def _uniform(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """Uniform weights of standard deviation ``std`` (fast: 16-bit draws)."""
    w = rng.integers(0, 65536, size=shape, dtype=np.uint16).astype(np.float32)
    w -= np.float32(32767.5)
    w *= np.float32(math.sqrt(3.0) * std / 32767.5)
    return w


class _Graph:
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

    def output(self, x: str, name: str = "output") -> str:
        """Rename tensor ``x`` (produced by the last node) to the graph output ``name``."""
        for node in self.nodes:
            for i, o in enumerate(node.output):
                if o == x:
                    node.output[i] = name
            for i, o in enumerate(node.input):
                if o == x:
                    node.input[i] = name
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

    def _check_size(self, module: str, ho: int, wo: int) -> None:
        if ho < 1 or wo < 1:
            raise ValueError(f"image size too small for {self.name}: layer {module!r} would have "
                             f"an empty ({ho}x{wo}) output")

    def _scale(self, mean: np.ndarray, var: np.ndarray, gain: float) -> float:
        """Factor that brings the predicted second moment of a layer's output to ``gain``."""
        m2 = float(np.mean(mean * mean + var))
        return float(_q_pos(math.sqrt(gain / m2))) if m2 > 0 else 1.0

    # ------------------------------------------------------------------------------ layers
    def conv(self, x: str, module: str, cout: int, k: int | tuple[int, int], s: int = 1, p: int = 0,
             g: int = 1, bias: bool = False, dilation: int = 1, explicit_pad: bool | None = None,
             gain: float = 1.0) -> str:
        """Conv (Kaiming-uniform weights, rescaled so the output's second moment is ``gain``)."""
        n, cin, h, w = self.shape[x]
        kh, kw = (k, k) if isinstance(k, int) else k
        cg, og = cin // g, cout // g
        ho = (h + 2 * p - dilation * (kh - 1) - 1) // s + 1
        wo = (w + 2 * p - dilation * (kw - 1) - 1) // s + 1
        self._check_size(module, ho, wo)
        wt = _uniform(self.rng, (cout, cg, kh, kw), math.sqrt(2.0 / (cg * kh * kw)))
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32) if bias else None
        # moments: exact per-channel means (with the padding's share of each tap), variances
        # assuming independent inputs
        frac = np.outer(_valid_fraction(h, ho, kh, s, p, dilation),
                        _valid_fraction(w, wo, kw, s, p, dilation)).astype(np.float32)
        w2f = (wt * wt * frac).sum(axis=(2, 3), dtype=np.float64)     # (cout, cg)
        mi, vi = self.mom[x]
        mi, vi = mi.reshape(g, cg), vi.reshape(g, cg)
        var = np.einsum("goc,gc->go", w2f.reshape(g, og, cg), vi).reshape(cout)
        # per output channel and tap, the input means times the weights; positions near the
        # border miss some taps, so the mean varies over positions: that adds to the variance
        tap = np.einsum("gockl,gc->gokl", wt.reshape(g, og, cg, kh, kw).astype(np.float64),
                        mi).reshape(cout, kh, kw)
        rows, rw = _valid_patterns(h, ho, kh, s, p, dilation)
        cols, cw = _valid_patterns(w, wo, kw, s, p, dilation)
        pm = np.einsum("okl,ak,bl->oab", tap, rows, cols)                # (cout, rows, cols)
        share = np.outer(rw, cw)
        mean = np.einsum("oab,ab->o", pm, share)
        var = var + np.einsum("oab,ab->o", (pm - mean[:, None, None]) ** 2, share)
        scale = self._scale(mean, var, gain)
        wt *= np.float32(scale)
        mean, var = mean * scale, var * scale * scale
        inputs = [x, self.init(f"{module}.weight", wt)]
        if bias:
            inputs.append(self.init(f"{module}.bias", b))
            mean = mean + b
        scope = _torch_scope(module)
        pads = [p, p, p, p]
        if explicit_pad is None:
            explicit_pad = self.zoo and s > 1 and p > 0
        if explicit_pad and p > 0:
            inputs[0] = self.pad(x, scope, [0, 0, p, p, 0, 0, p, p])
            pads = [0, 0, 0, 0]
        (y,) = self.node("Conv", inputs, scope, kernel_shape=[kh, kw], strides=[s, s], pads=pads,
                         dilations=[dilation] * 2, group=g)
        return self._set(y, (n, cout, ho, wo), mean, var)

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

    def bn(self, x: str, module: str) -> str:
        c = self.shape[x][1]
        rng = self.rng
        gamma = (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32)
        beta = (0.05 * rng.standard_normal(c)).astype(np.float32)
        noise_m = rng.standard_normal(c)
        noise_v = rng.uniform(0.8, 1.2, c)
        # running statistics as after training: the input's own per-channel moments, plus noise
        mi, vi = self.mom[x]
        mean = _q_abs(mi + 0.1 * np.sqrt(vi) * noise_m).astype(np.float32)
        var = _q_pos(vi * noise_v).astype(np.float32)
        scope = _torch_scope(module)
        scale = (gamma / np.sqrt(var + np.float32(_EPS))).astype(np.float32)
        shift = (beta - mean * scale).astype(np.float32)
        out_mean = mi * scale + shift
        out_var = vi * scale.astype(np.float64) ** 2
        if not self.zoo:
            ins = [x, self.init(f"{module}.weight", gamma), self.init(f"{module}.bias", beta),
                   self.init(f"{module}.running_mean", mean),
                   self.init(f"{module}.running_var", var)]
            (y,) = self.node("BatchNormalization", ins, scope, epsilon=_EPS, momentum=0.9)
        else:
            s_u = self.unsqueeze(self.init(f"{module}.scale", scale), scope, [1, 2])
            b_u = self.unsqueeze(self.init(f"{module}.shift", shift), scope, [1, 2])
            (t,) = self.node("Mul", [x, s_u], scope)
            self._set(t, self.shape[x], mi * scale, out_var)
            (y,) = self.node("Add", [t, b_u], scope)
        return self._set(y, self.shape[x], out_mean, out_var)

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

    # activations -----------------------------------------------------------------------------
    def _act(self, y: str, x: str, kind: str) -> str:
        mi, vi = self.mom[x]
        mean, var = _gauss_moments(_ACTS[kind], mi, vi)
        pre = (mi, vi, kind) if kind in _MONOTONE else None
        return self._set(y, self.shape[x], mean, var, pre)

    def relu(self, x: str, module: str) -> str:
        (y,) = self.node("Relu", [x], _torch_scope(module))
        return self._act(y, x, "relu")

    def relu6(self, x: str, module: str) -> str:
        scope = _torch_scope(module)
        if self.opset < 11:
            (y,) = self.node("Clip", [x], scope, min=0.0, max=6.0)
        else:
            lo, hi = self.scalar("relu6.min", 0.0), self.scalar("relu6.max", 6.0)
            (y,) = self.node("Clip", [x, lo, hi], scope)
        return self._act(y, x, "relu6")

    def leaky_relu(self, x: str, module: str, alpha: float = 0.1) -> str:
        assert alpha == 0.1
        (y,) = self.node("LeakyRelu", [x], _torch_scope(module), alpha=alpha)
        return self._act(y, x, "leakyrelu")

    def hardsigmoid(self, x: str, module: str) -> str:
        (y,) = self.node("HardSigmoid", [x], _torch_scope(module), alpha=1.0 / 6.0, beta=0.5)
        return self._act(y, x, "hardsigmoid")

    def sigmoid(self, x: str, module: str) -> str:
        (y,) = self.node("Sigmoid", [x], _torch_scope(module))
        return self._act(y, x, "sigmoid")

    def hardswish(self, x: str, module: str) -> str:
        scope = _torch_scope(module)
        if self.opset >= 14:
            (y,) = self.node("HardSwish", [x], scope)
        else:  # what torch exports below opset 14
            t = self.hardsigmoid(x, module)
            (y,) = self.node("Mul", [x, t], scope)
        return self._act(y, x, "hardswish")

    def swish(self, x: str, module: str) -> str:
        t = self.sigmoid(x, module)
        (y,) = self.node("Mul", [x, t], _torch_scope(module))
        return self._act(y, x, "swish")

    # element-wise / structural ------------------------------------------------------------------
    def add(self, a: str, b: str, module: str) -> str:
        op = "Sum" if self.zoo else "Add"
        (y,) = self.node(op, [a, b], _torch_scope(module))
        shape = np.broadcast_shapes(self.shape[a], self.shape[b])
        (ma, va), (mb, vb) = self.mom[a], self.mom[b]
        return self._set(y, shape, ma + mb, va + vb)

    def mul(self, a: str, b: str, module: str) -> str:
        """Product of independent tensors (e.g. a squeeze-excite gate and the features)."""
        (y,) = self.node("Mul", [a, b], _torch_scope(module))
        shape = np.broadcast_shapes(self.shape[a], self.shape[b])
        (ma, va), (mb, vb) = self.mom[a], self.mom[b]
        mean = ma * mb
        return self._set(y, shape, mean, np.maximum((ma * ma + va) * (mb * mb + vb) - mean * mean,
                                                    1e-12))

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

    # pooling ------------------------------------------------------------------------------------
    @staticmethod
    def _pool_out(h, k, s, p, ceil):
        num = h + 2 * p - k
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and (o - 1) * s >= h + p:  # the last window must start inside input / left pad
            o -= 1
        return o

    def maxpool(self, x: str, module: str, k: int, s: int, p: int = 0, ceil: bool = False) -> str:
        n, c, h, w = self.shape[x]
        ho, wo = self._pool_out(h, k, s, p, ceil), self._pool_out(w, k, s, p, ceil)
        self._check_size(module, ho, wo)
        attrs = dict(kernel_shape=[k, k], strides=[s, s])
        if ceil and self.opset < 10:  # no ceil_mode yet: the same windows via explicit end pads
            eh = max(0, (ho - 1) * s + k - h - 2 * p)
            ew = max(0, (wo - 1) * s + k - w - 2 * p)
            attrs["pads"] = [p, p, p + eh, p + ew]
        else:
            attrs["pads"] = [p, p, p, p]
            if ceil:
                attrs["ceil_mode"] = 1
        (y,) = self.node("MaxPool", [x], _torch_scope(module), **attrs)
        # max of a window of (spatially correlated: counted as half as many) independent values;
        # max(f(y_i)) = f(max(y_i)) for a monotone activation f of Gaussian y
        n_eff = k * k if k <= 2 else (2 * k * k) // 3
        if n_eff not in _MAX_TABLE:
            _MAX_TABLE[n_eff] = _max_of_normals(n_eff)
        em, ev = _MAX_TABLE[n_eff]
        pre = self.pre[x]
        if pre is not None:
            pm, pv, kind = pre
            pm2, pv2 = pm + np.sqrt(pv) * em, pv * ev
            mean, var = _gauss_moments(_ACTS[kind], pm2, pv2)
            return self._set(y, (n, c, ho, wo), mean, var, (pm2, pv2, kind))
        mi, vi = self.mom[x]
        return self._set(y, (n, c, ho, wo), mi + np.sqrt(vi) * em, vi * ev)

    def avgpool(self, x: str, module: str, k: int, s: int, p: int = 0,
                count_include_pad: int = 1) -> str:
        n, c, h, w = self.shape[x]
        ho, wo = self._pool_out(h, k, s, p, False), self._pool_out(w, k, s, p, False)
        self._check_size(module, ho, wo)
        (y,) = self.node("AveragePool", [x], _torch_scope(module), kernel_shape=[k, k],
                         strides=[s, s], pads=[p, p, p, p], count_include_pad=count_include_pad)
        mi, vi = self.mom[x]
        frac = float(_valid_fraction(h, ho, k, s, p).mean() * _valid_fraction(w, wo, k, s, p).mean())
        mf = frac if count_include_pad else 1.0
        # neighbouring values are correlated: the variance drops by less than 1/k^2
        return self._set(y, (n, c, ho, wo), mi * mf, vi * mf * mf * 2.0 / (k * k + 1))

    def _spatial_mean(self, x: str, keep_var: float = 0.25):
        mi, vi = self.mom[x]
        return mi, vi * keep_var  # correlated positions: the mean keeps part of the variance

    def global_avgpool(self, x: str, module: str) -> str:
        n, c, _, _ = self.shape[x]
        (y,) = self.node("GlobalAveragePool", [x], _torch_scope(module))
        return self._set(y, (n, c, 1, 1), *self._spatial_mean(x))

    def reduce_mean(self, x: str, module: str, axes: list[int], keepdims: int) -> str:
        assert sorted(axes) == [2, 3]
        scope = _torch_scope(module)
        if self.opset < 18:
            (y,) = self.node("ReduceMean", [x], scope, axes=axes, keepdims=keepdims)
        else:
            (y,) = self.node("ReduceMean", [x, self.constant(scope, axes)], scope,
                             keepdims=keepdims)
        if keepdims:
            shape = [1 if i in axes else d for i, d in enumerate(self.shape[x])]
        else:
            shape = [d for i, d in enumerate(self.shape[x]) if i not in axes]
        return self._set(y, shape, *self._spatial_mean(x))

    def lrn(self, x: str, module: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
            bias: float = 1.0) -> str:
        (y,) = self.node("LRN", [x], _torch_scope(module), size=size, alpha=alpha, beta=beta,
                         bias=bias)
        mi, vi = self.mom[x]
        f = (bias + alpha * float(np.mean(mi * mi + vi))) ** -beta
        return self._set(y, self.shape[x], mi * f, vi * f * f)

    def dropout(self, x: str, module: str, ratio: float = 0.5) -> str:
        scope = _torch_scope(module)
        if self.opset < 12:
            (y,) = self.node("Dropout", [x], scope, ratio=ratio)
        else:
            (y,) = self.node("Dropout", [x, self.scalar(f"{module}.ratio", ratio)], scope)
        return self._set(y, self.shape[x], *self.mom[x], self.pre[x])

    def gemm(self, x: str, module: str, cout: int, gain: float = 1.0) -> str:
        """Gemm with transB=1 (PyTorch's Linear); output second moment ``gain``."""
        n, cin = self.shape[x]
        std = math.sqrt(2.0 / cin)
        wt = _uniform(self.rng, (cout, cin), std)
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32)
        mi, vi = self.mom[x]
        mean = (wt @ mi.astype(np.float32)).astype(np.float64)
        var = np.full(cout, std * std * float(vi.sum()))
        scale = self._scale(mean, var, gain)
        wt *= np.float32(scale)
        w = self.init(f"{module}.weight", wt)
        bn = self.init(f"{module}.bias", b)
        (y,) = self.node("Gemm", [x, w, bn], _torch_scope(module), alpha=1.0, beta=1.0, transB=1)
        return self._set(y, (n, cout), mean * scale + b, var * scale * scale)

    def softmax(self, x: str) -> str:
        (y,) = self.node("Softmax", [x], "", axis=1)
        c = self.shape[x][1]
        return self._set(y, self.shape[x], np.full(c, 1.0 / c), np.full(c, 1.0 / c ** 2))

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


# ==================================================================================== classifiers
def _classifier_tail(g: _Graph, x: str, module: str, num_classes: int, *, softmax: bool,
                     flatten: str = "flatten") -> str:
    """(N, C, 1, 1) pooled features -> (N, C) -> Gemm [-> Softmax]."""
    x = g.flatten_to_2d(x, flatten)
    y = g.gemm(x, module, num_classes)
    if softmax:
        y = g.softmax(y)
    return y


def _resnet_stem(g: _Graph, x: str, *, preact: bool) -> str:
    x = g.conv(x, "conv1", 64, 7, 2, 3)
    if not preact:
        x = g.bn(x, "bn1")
        x = g.relu(x, "relu")
    return g.maxpool(x, "maxpool", 3, 2, 1)


def _basic_block(g: _Graph, x: str, mod: str, cout: int, stride: int, preact: bool) -> str:
    cin = g.shape[x][1]
    down = stride != 1 or cin != cout
    if preact:
        a = g.relu(g.bn(x, f"{mod}.bn1"), f"{mod}.relu")
        shortcut = g.conv(a, f"{mod}.downsample.0", cout, 1, stride) if down else x
        y = g.conv(a, f"{mod}.conv1", cout, 3, stride, 1)
        y = g.relu(g.bn(y, f"{mod}.bn2"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv2", cout, 3, 1, 1)
        return g.add(y, shortcut, mod)
    y = g.conv(x, f"{mod}.conv1", cout, 3, stride, 1)
    y = g.relu(g.bn(y, f"{mod}.bn1"), f"{mod}.relu")
    y = g.conv(y, f"{mod}.conv2", cout, 3, 1, 1)
    y = g.bn(y, f"{mod}.bn2")
    if down:
        shortcut = g.bn(g.conv(x, f"{mod}.downsample.0", cout, 1, stride), f"{mod}.downsample.1")
    else:
        shortcut = x
    return g.relu(g.add(y, shortcut, mod), f"{mod}.relu")


def _bottleneck(g: _Graph, x: str, mod: str, width: int, stride: int, preact: bool) -> str:
    cin = g.shape[x][1]
    cout = width * 4
    down = stride != 1 or cin != cout
    if preact:
        a = g.relu(g.bn(x, f"{mod}.bn1"), f"{mod}.relu")
        shortcut = g.conv(a, f"{mod}.downsample.0", cout, 1, stride) if down else x
        y = g.conv(a, f"{mod}.conv1", width, 1)
        y = g.relu(g.bn(y, f"{mod}.bn2"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv2", width, 3, stride, 1)
        y = g.relu(g.bn(y, f"{mod}.bn3"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv3", cout, 1)
        return g.add(y, shortcut, mod)
    y = g.relu(g.bn(g.conv(x, f"{mod}.conv1", width, 1), f"{mod}.bn1"), f"{mod}.relu")
    # torchvision v1.5: the stride sits on the 3x3
    y = g.relu(g.bn(g.conv(y, f"{mod}.conv2", width, 3, stride, 1), f"{mod}.bn2"), f"{mod}.relu")
    y = g.bn(g.conv(y, f"{mod}.conv3", cout, 1), f"{mod}.bn3")
    if down:
        shortcut = g.bn(g.conv(x, f"{mod}.downsample.0", cout, 1, stride), f"{mod}.downsample.1")
    else:
        shortcut = x
    return g.relu(g.add(y, shortcut, mod), f"{mod}.relu")


def _resnet(g: _Graph, x: str, *, bottleneck: bool, layers: list[int], softmax: bool,
            num_classes: int, dynamic_flatten: bool) -> str:
    preact = g.style == "preact"
    x = _resnet_stem(g, x, preact=preact)
    widths = [64, 128, 256, 512]
    for li, (width, nblocks) in enumerate(zip(widths, layers)):
        for b in range(nblocks):
            stride = 2 if (li > 0 and b == 0) else 1
            mod = f"layer{li + 1}.{b}"
            if bottleneck:
                x = _bottleneck(g, x, mod, width, stride, preact)
            else:
                x = _basic_block(g, x, mod, width, stride, preact)
    if preact:  # ResNet v2 ends with a final BN-ReLU
        x = g.relu(g.bn(x, "bn_final"), "relu_final")
    x = g.global_avgpool(x, "avgpool")
    if g.zoo:
        flatten = "reshape"
    else:
        flatten = "dynamic" if dynamic_flatten else "flatten"
    return _classifier_tail(g, x, "fc", num_classes, softmax=softmax, flatten=flatten)


def _vgg16(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    i = 0
    for v in cfg:
        if v == "M":
            x = g.maxpool(x, f"features.{i}", 2, 2)
            i += 1
        else:
            x = g.conv(x, f"features.{i}", v, 3, 1, 1, bias=True)
            x = g.relu(x, f"features.{i + 1}")
            i += 2
    # torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224; the flatten size follows the
    # image size here instead (512 * (S/32)^2).
    x = g.flatten_to_2d(x, "reshape" if g.zoo else "flatten")
    x = g.relu(g.gemm(x, "classifier.0", 4096), "classifier.1")
    x = g.dropout(x, "classifier.2")
    x = g.relu(g.gemm(x, "classifier.3", 4096), "classifier.4")
    x = g.dropout(x, "classifier.5")
    x = g.gemm(x, "classifier.6", num_classes)
    return g.softmax(x) if softmax else x


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _mobilenetv2(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    x = g.relu6(g.bn(g.conv(x, "features.0.0", 32, 3, 2, 1), "features.0.1"), "features.0.2")
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    idx = 1
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            mod = f"features.{idx}.conv"
            cin = g.shape[x][1]
            hidden = cin * t
            y = x
            j = 0
            if t != 1:
                y = g.relu6(g.bn(g.conv(y, f"{mod}.0.0", hidden, 1), f"{mod}.0.1"), f"{mod}.0.2")
                j = 1
            y = g.conv(y, f"{mod}.{j}.0", hidden, 3, stride, 1, g=hidden)
            y = g.relu6(g.bn(y, f"{mod}.{j}.1"), f"{mod}.{j}.2")
            y = g.bn(g.conv(y, f"{mod}.{j + 1}", c, 1), f"{mod}.{j + 2}")
            if stride == 1 and cin == c:
                y = g.add(x, y, f"features.{idx}")
            x = y
            idx += 1
    x = g.relu6(g.bn(g.conv(x, f"features.{idx}.0", 1280, 1), f"features.{idx}.1"),
                f"features.{idx}.2")
    x = g.global_avgpool(x, "")
    return _classifier_tail(g, x, "classifier.1", num_classes, softmax=softmax,
                            flatten="reshape" if g.zoo else "flatten")


def _squeezenet(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    x = g.relu(g.conv(x, "features.0", 64, 3, 2, 0, bias=True), "features.1")
    x = g.maxpool(x, "features.2", 3, 2, ceil=True)

    def fire(x: str, i: int, sq: int, e1: int, e3: int) -> str:
        m = f"features.{i}"
        s = g.relu(g.conv(x, f"{m}.squeeze", sq, 1, bias=True), f"{m}.squeeze_activation")
        a = g.relu(g.conv(s, f"{m}.expand1x1", e1, 1, bias=True), f"{m}.expand1x1_activation")
        b = g.relu(g.conv(s, f"{m}.expand3x3", e3, 3, 1, 1, bias=True,
                          explicit_pad=g.zoo), f"{m}.expand3x3_activation")
        return g.concat([a, b], m)

    x = fire(x, 3, 16, 64, 64)
    x = fire(x, 4, 16, 64, 64)
    x = g.maxpool(x, "features.5", 3, 2, ceil=True)
    x = fire(x, 6, 32, 128, 128)
    x = fire(x, 7, 32, 128, 128)
    x = g.maxpool(x, "features.8", 3, 2, ceil=True)
    x = fire(x, 9, 48, 192, 192)
    x = fire(x, 10, 48, 192, 192)
    x = fire(x, 11, 64, 256, 256)
    x = fire(x, 12, 64, 256, 256)
    x = g.dropout(x, "classifier.0")
    x = g.relu(g.conv(x, "classifier.1", num_classes, 1, bias=True, gain=2.0),
               "classifier.2")
    x = g.global_avgpool(x, "classifier.3")
    x = g.flatten_to_2d(x, "reshape" if g.zoo else "flatten")
    return g.softmax(x) if softmax else x


# ========================================================================================= blocks
def _densenet_block(g: _Graph, x: str, *, growth: int = 32, bn_size: int = 4, layers: int = 6,
                    **_) -> str:
    """DenseNet-121 stem, dense block 1 (6 layers) and transition 1, as torchvision writes it."""
    x = g.conv(x, "features.conv0", 64, 7, 2, 3)
    x = g.relu(g.bn(x, "features.norm0"), "features.relu0")
    x = g.maxpool(x, "features.pool0", 3, 2, 1)
    feats = [x]
    for i in range(1, layers + 1):
        m = f"features.denseblock1.denselayer{i}"
        cat = g.concat(feats, m)  # torch.cat(prev_features, 1), one input for the first layer
        # pre-activation BN: its input is a Concat (or a MaxPool), not a conv
        y = g.relu(g.bn(cat, f"{m}.norm1"), f"{m}.relu1")
        y = g.conv(y, f"{m}.conv1", bn_size * growth, 1)
        y = g.relu(g.bn(y, f"{m}.norm2"), f"{m}.relu2")
        y = g.conv(y, f"{m}.conv2", growth, 3, 1, 1)
        feats.append(y)
    x = g.concat(feats, "features.denseblock1")
    c = g.shape[x][1]
    x = g.relu(g.bn(x, "features.transition1.norm"), "features.transition1.relu")
    x = g.conv(x, "features.transition1.conv", c // 2, 1)
    return g.avgpool(x, "features.transition1.pool", 2, 2)


def _inception_module(g: _Graph, x: str, m: str, c1: int, c3r: int, c3: int, c5r: int, c5: int,
                      pp: int, pool: str) -> str:
    b1 = g.relu(g.conv(x, f"{m}.1x1", c1, 1, bias=True), f"{m}.relu_1x1")
    b2 = g.relu(g.conv(x, f"{m}.3x3_reduce", c3r, 1, bias=True), f"{m}.relu_3x3_reduce")
    b2 = g.relu(g.conv(b2, f"{m}.3x3", c3, 3, 1, 1, bias=True), f"{m}.relu_3x3")
    b3 = g.relu(g.conv(x, f"{m}.5x5_reduce", c5r, 1, bias=True), f"{m}.relu_5x5_reduce")
    b3 = g.relu(g.conv(b3, f"{m}.5x5", c5, 5, 1, 2, bias=True), f"{m}.relu_5x5")
    if pool == "max":
        b4 = g.maxpool(x, f"{m}.pool", 3, 1, 1)
    else:  # Inception-v3 style: F.avg_pool2d(x, 3, 1, 1), count_include_pad=True
        b4 = g.avgpool(x, f"{m}.pool", 3, 1, 1, count_include_pad=1)
    b4 = g.relu(g.conv(b4, f"{m}.pool_proj", pp, 1, bias=True), f"{m}.relu_pool_proj")
    return g.concat([b1, b2, b3, b4], f"{m}.output")


def _inception_block(g: _Graph, x: str, **_) -> str:
    """GoogLeNet (BVLC) stem with LRN, inception 3a (exact), inception 3b with an Inception-v3
    style average-pool branch (count_include_pad=1), then a TF-"SAME"-style average pool
    (count_include_pad=0)."""
    x = g.relu(g.conv(x, "conv1.7x7_s2", 64, 7, 2, 3, bias=True), "conv1.relu_7x7")
    x = g.maxpool(x, "pool1.3x3_s2", 3, 2, ceil=True)
    x = g.lrn(x, "pool1.norm1")
    x = g.relu(g.conv(x, "conv2.3x3_reduce", 64, 1, bias=True), "conv2.relu_3x3_reduce")
    x = g.relu(g.conv(x, "conv2.3x3", 192, 3, 1, 1, bias=True), "conv2.relu_3x3")
    x = g.lrn(x, "conv2.norm2")
    x = g.maxpool(x, "pool2.3x3_s2", 3, 2, ceil=True)
    x = _inception_module(g, x, "inception_3a", 64, 96, 128, 16, 32, 32, pool="max")
    x = _inception_module(g, x, "inception_3b", 128, 128, 192, 32, 96, 64, pool="avg")
    return g.avgpool(x, "pool3.3x3_s2", 3, 2, 1, count_include_pad=0)


def _channel_shuffle(g: _Graph, x: str, m: str, groups: int = 2) -> str:
    n, c, h, w = g.shape[x]
    dyn = g.style != "zoo"
    mean, var = g.mom[x]
    x = g.reshape(x, m, [n, groups, c // groups, h, w], dynamic_batch=dyn)
    x = g.transpose(x, m, [0, 2, 1, 3, 4])
    y = g.reshape(x, m, [n, -1, h, w], dynamic_batch=dyn)
    perm = np.arange(c).reshape(groups, c // groups).T.reshape(-1)
    g.mom[y] = (mean[perm], var[perm])
    return y


def _shufflenet_unit(g: _Graph, x: str, *, softmax: bool = False, num_classes: int = 1000,
                     **_) -> str:
    """ShuffleNetV2 1.0x: stem, stage 2 (one stride-2 unit, three stride-1 units), conv5,
    mean over H, W (ReduceMean) and the classifier -- torchvision's layers."""
    x = g.relu(g.bn(g.conv(x, "conv1.0", 24, 3, 2, 1), "conv1.1"), "conv1.2")
    x = g.maxpool(x, "maxpool", 3, 2, 1)
    out = 116
    bf = out // 2
    for u in range(4):
        m = f"stage2.{u}"
        if u == 0:
            cin = g.shape[x][1]
            b1 = g.bn(g.conv(x, f"{m}.branch1.0", cin, 3, 2, 1, g=cin), f"{m}.branch1.1")
            b1 = g.relu(g.bn(g.conv(b1, f"{m}.branch1.2", bf, 1), f"{m}.branch1.3"),
                        f"{m}.branch1.4")
            src = x
        else:
            b1, src = g.split(x, m, [bf, bf])
        stride = 2 if u == 0 else 1
        y = g.relu(g.bn(g.conv(src, f"{m}.branch2.0", bf, 1), f"{m}.branch2.1"), f"{m}.branch2.2")
        y = g.bn(g.conv(y, f"{m}.branch2.3", bf, 3, stride, 1, g=bf), f"{m}.branch2.4")
        y = g.relu(g.bn(g.conv(y, f"{m}.branch2.5", bf, 1), f"{m}.branch2.6"), f"{m}.branch2.7")
        x = _channel_shuffle(g, g.concat([b1, y], m), m)
    x = g.relu(g.bn(g.conv(x, "conv5.0", 1024, 1), "conv5.1"), "conv5.2")
    x = g.reduce_mean(x, "", [2, 3], keepdims=0)  # x.mean([2, 3])
    y = g.gemm(x, "fc", num_classes)
    return g.softmax(y) if softmax else y


def _se(g: _Graph, x: str, m: str, squeeze: int, kind: str) -> str:
    """Squeeze-excite: pool -> Conv -> Relu -> Conv -> gate -> Mul (N,C,1,1) x (N,C,H,W).

    ``kind="hard"``: GlobalAveragePool + HardSigmoid (MobileNetV3); ``"sigmoid"``: ReduceMean
    (keepdims) + Sigmoid (EfficientNet)."""
    c = g.shape[x][1]
    if kind == "hard":
        s = g.global_avgpool(x, f"{m}.avgpool")
    else:
        s = g.reduce_mean(x, f"{m}", [2, 3], keepdims=1)
    s = g.relu(g.conv(s, f"{m}.fc1", squeeze, 1, bias=True), f"{m}.relu")
    s = g.conv(s, f"{m}.fc2", c, 1, bias=True)
    s = g.hardsigmoid(s, f"{m}.scale_activation") if kind == "hard" else \
        g.sigmoid(s, f"{m}.scale_activation")
    return g.mul(s, x, m)


def _mobilenetv3_block(g: _Graph, x: str, *, softmax: bool = False, num_classes: int = 1000,
                       **_) -> str:
    """MobileNetV3-Large stem and first inverted-residual units (torchvision configuration), with
    activation variants so that every activation the importer knows appears: ReLU, LeakyReLU,
    HardSwish, HardSigmoid / Sigmoid gates; then last conv, pooling and the classifier."""
    def act(y: str, kind: str, m: str) -> str:
        if kind == "RE":
            return g.relu(y, m)
        if kind == "LR":
            return g.leaky_relu(y, m, 0.1)
        if kind == "SW":
            return g.swish(y, m)
        return g.hardswish(y, m)

    x = act(g.bn(g.conv(x, "features.0.0", 16, 3, 2, 1), "features.0.1"), "HS", "features.0.2")
    # (kernel, expanded, out, se, activation, stride) -- MobileNetV3-Large units 1-7, with unit 3
    # using LeakyReLU and unit 5 an EfficientNet-style sigmoid SE and Swish activation
    conf = [(3, 16, 16, None, "RE", 1), (3, 64, 24, None, "RE", 2), (3, 72, 24, None, "LR", 1),
            (5, 72, 40, "hard", "RE", 2), (5, 120, 40, "sigmoid", "SW", 1),
            (5, 120, 40, "hard", "HS", 1), (3, 240, 80, None, "HS", 2)]
    for i, (k, exp, out, se, a, s) in enumerate(conf, start=1):
        m = f"features.{i}.block"
        cin = g.shape[x][1]
        y = x
        j = 0
        if exp != cin:
            y = act(g.bn(g.conv(y, f"{m}.0.0", exp, 1), f"{m}.0.1"), a, f"{m}.0.2")
            j = 1
        y = act(g.bn(g.conv(y, f"{m}.{j}.0", exp, k, s, (k - 1) // 2, g=exp), f"{m}.{j}.1"), a,
                f"{m}.{j}.2")
        j += 1
        if se:
            y = _se(g, y, f"{m}.{j}", _make_divisible(exp // 4, 8), se)
            j += 1
        y = g.bn(g.conv(y, f"{m}.{j}.0", out, 1), f"{m}.{j}.1")
        if s == 1 and cin == out:
            y = g.add(y, x, f"features.{i}")
        x = y
    last = 6 * g.shape[x][1]
    n = len(conf) + 1
    x = act(g.bn(g.conv(x, f"features.{n}.0", last, 1), f"features.{n}.1"), "HS", f"features.{n}.2")
    x = g.global_avgpool(x, "avgpool")
    x = g.flatten_to_2d(x, "flatten" if g.zoo else "squeeze")
    x = g.hardswish(g.gemm(x, "classifier.0", 1280), "classifier.1")
    x = g.dropout(x, "classifier.2", 0.2)
    y = g.gemm(x, "classifier.3", num_classes)
    return g.softmax(y) if softmax else y


# ======================================================================================= registry
_ARCH: dict[str, tuple[Callable, int, tuple[str, ...], str]] = {
    # name: (body, default image size, styles, description)
    "resnet18": (lambda g, x, **kw: _resnet(g, x, bottleneck=False, layers=[2, 2, 2, 2],
                                             dynamic_flatten=False, **kw),
                 224, ("default", "zoo", "preact"), "ResNet-18 (torchvision)"),
    "resnet50": (lambda g, x, **kw: _resnet(g, x, bottleneck=True, layers=[3, 4, 6, 3],
                                             dynamic_flatten=True, **kw),
                 224, ("default", "zoo", "preact"), "ResNet-50 v1.5 (torchvision)"),
    "vgg16": (_vgg16, 224, ("default", "zoo"), "VGG-16 (torchvision, configuration D)"),
    "mobilenetv2": (_mobilenetv2, 224, ("default", "zoo"), "MobileNetV2 1.0 (torchvision)"),
    "squeezenet": (_squeezenet, 224, ("default", "zoo"), "SqueezeNet 1.1 (torchvision)"),
    "densenet_block": (_densenet_block, 56, ("default", "zoo"),
                       "DenseNet-121 stem + dense block 1 + transition 1"),
    "inception_block": (_inception_block, 56, ("default", "zoo"),
                        "GoogLeNet stem (LRN) + inception 3a/3b + average pools"),
    "shufflenet_unit": (_shufflenet_unit, 56, ("default", "zoo"),
                        "ShuffleNetV2 1.0x stem + stage 2 + conv5 + classifier"),
    "mobilenetv3_block": (_mobilenetv3_block, 56, ("default", "zoo"),
                          "MobileNetV3-Large stem + units 1-7 (SE, HardSwish, ...) + classifier"),
}

#: styles each model supports (the first is the default).
STYLES: dict[str, tuple[str, ...]] = {k: v[2] for k, v in _ARCH.items()}
#: default input image size (square) of each model.
DEFAULT_IMAGE_SIZE: dict[str, int] = {k: v[1] for k, v in _ARCH.items()}


def build(name: str, *, batch: int = 1, image_size: int | None = None, opset: int | None = None,
          seed: int = 0, style: str = "default", softmax: bool = False,
          num_classes: int = 1000) -> onnx.ModelProto:
    """Build model ``name`` (a key of :data:`MODELS`) as an ``onnx.ModelProto``.

    ``opset`` defaults to 13 (9 for ``style="zoo"``); ``image_size`` to
    ``DEFAULT_IMAGE_SIZE[name]``; ``softmax`` appends a Softmax to the classifiers. The same
    arguments always give the same bytes."""
    if name not in _ARCH:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(sorted(_ARCH))}")
    body, default_size, styles, desc = _ARCH[name]
    if style not in styles:
        raise ValueError(f"model {name!r} has no style {style!r}; it has {', '.join(styles)}")
    if opset is None:
        opset = 9 if style == "zoo" else 13
    if not _MIN_OPSET <= opset <= _MAX_OPSET:
        raise ValueError(f"opset {opset} is outside the supported range "
                         f"{_MIN_OPSET}..{_MAX_OPSET}")
    size = int(image_size or default_size)
    if size < 16 or batch < 1:
        raise ValueError(f"image_size must be >= 16 and batch >= 1 (got {size}, {batch})")
    g = _Graph(f"{name}_{style}", opset=opset, style=style, seed=seed, batch=batch)
    x = g.input("input", (batch, 3, size, size))
    y = body(g, x, softmax=softmax, num_classes=num_classes)
    g.output(y)
    meta = {"coacto.zoo.model": name, "coacto.zoo.style": style, "coacto.zoo.seed": str(seed),
            "coacto.zoo.image_size": str(size)}
    return g.model(f"{desc}, {style} style, opset {opset}, random weights (seed {seed})", meta)


def _builder(name: str) -> Callable[..., onnx.ModelProto]:
    def b(**kw) -> onnx.ModelProto:
        return build(name, **kw)
    b.__name__ = f"build_{name}"
    b.__doc__ = f"{_ARCH[name][3]}: ``build({name!r}, **kw)``."
    return b


#: name -> builder; ``MODELS[name](**kw)`` is ``build(name, **kw)``.
MODELS: dict[str, Callable[..., onnx.ModelProto]] = {k: _builder(k) for k in _ARCH}


def save(name: str, path: str | pathlib.Path, **kw) -> pathlib.Path:
    """Build model ``name`` with ``build(name, **kw)`` and write it to ``path``."""
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(build(name, **kw).SerializeToString())
    return p


def input_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ``N(0, 1)`` inputs for every graph input of ``model`` that is not an initializer.

    Symbolic dimensions become 1."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                 for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape).astype(dtype)
        else:
            arr = rng.integers(0, 2, shape).astype(dtype)
        feeds[vi.name] = arr
    return feeds


def count_params(model: onnx.ModelProto) -> int:
    """Trainable parameters as torchvision counts them: float initializers with at least one
    dimension, less BatchNormalization running statistics (buffers in PyTorch)."""
    buffers = set()
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            buffers.update(n.input[3:5])
    total = 0
    for t in model.graph.initializer:
        if t.name in buffers or len(t.dims) == 0:
            continue
        if t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            continue
        total += int(np.prod(t.dims))
    return total
