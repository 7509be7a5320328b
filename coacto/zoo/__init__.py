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

The package: :mod:`coacto.zoo._graph` (graph bookkeeping, layout operators, model assembly),
:mod:`coacto.zoo._layers` (weight initialisation, moment propagation, the layers),
:mod:`coacto.zoo.classic` (ResNets, VGG-16), :mod:`coacto.zoo.mobile` (MobileNetV2, SqueezeNet,
ShuffleNetV2, MobileNetV3) and :mod:`coacto.zoo.blocks` (DenseNet, Inception); this module holds
the registry and the API.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._layers import _Graph
from .blocks import _densenet_block, _inception_block
from .classic import _resnet, _vgg16
from .mobile import _mobilenetv2, _mobilenetv3_block, _shufflenet_unit, _squeezenet

__all__ = [
    "MODELS", "STYLES", "OPSETS", "DEFAULT_IMAGE_SIZE", "build", "save", "input_feeds",
    "count_params",
]

#: opsets the builders are tested at (any opset in 9..18 is accepted).
OPSETS: tuple[int, ...] = (9, 11, 13, 17, 18)
_MIN_OPSET, _MAX_OPSET = 9, 18


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
