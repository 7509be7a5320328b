"""coacto's own model zoo: real CNN and transformer architectures built with ``onnx.helper``,
seeded random weights.

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

The transformers (``bert``, ``gpt2``, ``vit``; listed in :data:`TRANSFORMERS`) have LayerNorm,
which keeps their activations of order one; their weights are normals scaled like a trained
network's (see :mod:`coacto.zoo._tlayers`).

Building is fast (ResNet-50 at 224: about 0.4 s; VGG-16, 553 MB of weights: about 2 s; BERT-base,
GPT-2 small, ViT-B/16: 1.5 - 2.5 s).

API::

    MODELS                     # name -> builder(**kw) -> onnx.ModelProto
    build(name, *, batch=1, image_size=None, opset=None, seed=0, style="default", softmax=False,
          num_classes=1000,
          seq_len=None, layers=None, hidden=None, heads=None, ffn=None, vocab=None,  # transformers
          pooler=True, lm_head=True)
    save(name, path, **kw)     # -> pathlib.Path
    input_feeds(model, seed=0) # -> {input name: array} (images N(0, 1), valid token ids and masks)
    count_params(model)        # trainable parameters, as torchvision / HuggingFace count them

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

The transformers have two styles, the two ways PyTorch exports a HuggingFace model:

``"default"`` (transformers)
    The TorchScript-based ``torch.onnx.export`` (opset 14 unless given; 11 to 18 accepted; 11,
    13, 14, 17 and 18 are tested): LayerNorm decomposed (``ReduceMean, Sub, Pow, ReduceMean,
    Add, Sqrt, Div, Mul, Add``), every size a module reads computed in the graph (``Shape ->
    Gather -> Unsqueeze -> Concat -> Reshape`` for the head split and merge, ``Shape -> Gather
    -> Range`` for GPT-2's positions), linear weights as ``[in, out]`` initializers named
    ``onnx::MatMul_<n>`` feeding ``MatMul``, GPT-2's ``Conv1D`` as ``Reshape -> Gemm ->
    Reshape``, node names such as ``/encoder/layer.0/attention/self/MatMul``.
``"fused"`` (transformers)
    The dynamo-based exporter (opset 18 unless given; 17 or 18, the opsets with
    ``LayerNormalization``): one ``LayerNormalization`` node per LayerNorm, sizes as
    ``Constant`` nodes, linear weights under their state-dict names in PyTorch's ``[out, in]``
    layout read through a ``Transpose``, GPT-2's ``Conv1D`` as ``MatMul`` + ``Add``, ViT's
    attention scaled the way ``scaled_dot_product_attention`` is decomposed (queries and
    transposed keys each multiplied by ``head_dim ** -0.25``).

Both keep GELU as ``Erf`` arithmetic (there is no ``Gelu`` operator before opset 20) and compute
the same function for the same seed.

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

Transformers (full size by default; ``layers``, ``hidden``, ``heads``, ``ffn`` (default
``4 * hidden``), ``vocab`` and ``seq_len`` / ``image_size`` build smaller instances of the same
architecture; :data:`CONFIGS` has the full-size values, :data:`DEFAULT_SEQ_LEN` the default
sequence lengths):

``bert``
    HuggingFace ``BertModel``, BERT-base (109.48 M parameters with the pooler): inputs
    ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 [B, 128]); outputs
    ``last_hidden_state`` [B, S, 768] and ``pooler_output`` [B, 768] (``pooler=False`` drops the
    pooler). Gather (embeddings), Slice (position ids), Unsqueeze / Cast / Sub / Mul (additive
    padding mask), MatMul, Add, Div, Softmax, Transpose, Reshape, Erf (GELU), Gemm + Tanh
    (pooler)
``gpt2``
    HuggingFace ``GPT2LMHeadModel``, GPT-2 small (124.44 M, the tied embedding counted once):
    input ``input_ids`` (int64 [B, 64]); output ``logits`` [B, S, 50257], the LM head reading
    the word embedding through a Transpose (``lm_head=False``: ``GPT2Model``, output
    ``last_hidden_state``). Range (positions), Split, Slice of a causal ``bool`` buffer + Where
    (causal mask), Pow + Tanh (GELU), Gemm or MatMul (Conv1D)
``vit``
    HuggingFace ``ViTForImageClassification``, ViT-B/16 (86.57 M): input ``pixel_values``
    [B, 3, 224, 224]; output ``logits`` [B, 1000]. Conv 16x16 stride 16 (patches), Reshape +
    Transpose to tokens, Expand (class token), Concat, Add (position embeddings), pre-LN blocks,
    Gather of the class token, Gemm

``softmax=True`` appends a Softmax to the classifiers (and to ViT).

For one model, every style and opset computes the same function (up to float rounding), except
``preact`` which is another architecture.

The package: :mod:`coacto.zoo._graph` (graph bookkeeping, layout operators, model assembly),
:mod:`coacto.zoo._layers` (weight initialisation, moment propagation, the layers),
:mod:`coacto.zoo.classic` (ResNets, VGG-16), :mod:`coacto.zoo.mobile` (MobileNetV2, SqueezeNet,
ShuffleNetV2, MobileNetV3), :mod:`coacto.zoo.blocks` (DenseNet, Inception),
:mod:`coacto.zoo._tlayers` (transformer layers in both exporter forms) and
:mod:`coacto.zoo.transformers` (BERT, GPT-2, ViT); this module holds the registry and the API.
"""
from __future__ import annotations

import pathlib
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._layers import _Graph
from ._tlayers import _SeqGraph
from .blocks import _densenet_block, _inception_block
from .classic import _resnet, _vgg16
from .mobile import _mobilenetv2, _mobilenetv3_block, _shufflenet_unit, _squeezenet
from .transformers import CONFIGS, _bert, _gpt2, _vit

__all__ = [
    "MODELS", "STYLES", "OPSETS", "DEFAULT_IMAGE_SIZE", "DEFAULT_SEQ_LEN", "TRANSFORMERS",
    "TRANSFORMER_OPSETS", "CONFIGS", "build", "save", "input_feeds", "count_params",
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

_SEQ_ARCH: dict[str, tuple[Callable, tuple[str, ...], tuple[str, ...], str]] = {
    # name: (body, styles, keyword arguments of the body besides the sizes, description)
    "bert": (_bert, ("default", "fused"), ("seq_len", "vocab", "pooler"),
             "BERT-base (HuggingFace BertModel)"),
    "gpt2": (_gpt2, ("default", "fused"), ("seq_len", "vocab", "lm_head"),
             "GPT-2 small (HuggingFace GPT2LMHeadModel)"),
    "vit": (_vit, ("default", "fused"), ("image_size", "num_classes", "softmax"),
            "ViT-B/16 (HuggingFace ViTForImageClassification)"),
}

#: the transformer models (inputs of their own, ``seq_len`` / size keywords, their own styles).
TRANSFORMERS: tuple[str, ...] = tuple(_SEQ_ARCH)
#: opsets the transformers are tested at, per style (``"fused"`` needs LayerNormalization: 17+).
TRANSFORMER_OPSETS: dict[str, tuple[int, ...]] = {"default": (11, 13, 14, 17, 18),
                                                  "fused": (17, 18)}
#: styles each model supports (the first is the default).
STYLES: dict[str, tuple[str, ...]] = {**{k: v[2] for k, v in _ARCH.items()},
                                      **{k: v[1] for k, v in _SEQ_ARCH.items()}}
#: default input image size (square) of each model that takes an image.
DEFAULT_IMAGE_SIZE: dict[str, int] = {**{k: v[1] for k, v in _ARCH.items()},
                                      "vit": CONFIGS["vit"]["image_size"]}
#: default sequence length of the models that take token ids.
DEFAULT_SEQ_LEN: dict[str, int] = {k: CONFIGS[k]["seq_len"] for k in ("bert", "gpt2")}


def build(name: str, *, batch: int = 1, image_size: int | None = None, opset: int | None = None,
          seed: int = 0, style: str = "default", softmax: bool = False,
          num_classes: int = 1000, seq_len: int | None = None, layers: int | None = None,
          hidden: int | None = None, heads: int | None = None, ffn: int | None = None,
          vocab: int | None = None, pooler: bool = True, lm_head: bool = True) -> onnx.ModelProto:
    """Build model ``name`` (a key of :data:`MODELS`) as an ``onnx.ModelProto``.

    ``opset`` defaults to 13 (9 for ``style="zoo"``; for the transformers 14, 18 for
    ``style="fused"``); ``image_size`` to ``DEFAULT_IMAGE_SIZE[name]``; ``softmax`` appends a
    Softmax to the classifiers. The transformers take the size keywords ``seq_len``, ``layers``,
    ``hidden``, ``heads``, ``ffn``, ``vocab`` (None: the full-size value of :data:`CONFIGS`;
    ``ffn`` defaults to ``4 * hidden``), ``pooler`` (BERT) and ``lm_head`` (GPT-2); a keyword a
    model does not have raises ``ValueError``. The same arguments always give the same bytes."""
    if name in _SEQ_ARCH:
        return _build_transformer(
            name, batch=batch, image_size=image_size, opset=opset, seed=seed, style=style,
            softmax=softmax, num_classes=num_classes, seq_len=seq_len, layers=layers,
            hidden=hidden, heads=heads, ffn=ffn, vocab=vocab, pooler=pooler, lm_head=lm_head)
    if name not in _ARCH:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    extra = [k for k, v in dict(seq_len=seq_len, layers=layers, hidden=hidden, heads=heads,
                                ffn=ffn, vocab=vocab).items() if v is not None]
    extra += [k for k, v in dict(pooler=pooler, lm_head=lm_head).items() if not v]
    if extra:
        raise ValueError(f"model {name!r} has no {', '.join(extra)} (transformer keywords)")
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


def _build_transformer(name: str, *, batch: int, image_size: int | None, opset: int | None,
                       seed: int, style: str, softmax: bool, num_classes: int,
                       pooler: bool, lm_head: bool, **sizes: int | None) -> onnx.ModelProto:
    body, styles, own, desc = _SEQ_ARCH[name]
    if style not in styles:
        raise ValueError(f"model {name!r} has no style {style!r}; it has {', '.join(styles)}")
    if opset is None:
        opset = 18 if style == "fused" else 14
    low = 17 if style == "fused" else 11
    if not low <= opset <= _MAX_OPSET:
        why = " (LayerNormalization exists from opset 17)" if style == "fused" else ""
        raise ValueError(f"opset {opset} is outside the range of {name!r} in style {style!r}: "
                         f"{low}..{_MAX_OPSET}{why}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1 (got {batch})")
    # keywords given to a model that does not have them
    given = {"image_size": image_size is not None, "softmax": softmax,
             "num_classes": num_classes != 1000, "seq_len": sizes["seq_len"] is not None,
             "vocab": sizes["vocab"] is not None, "pooler": not pooler, "lm_head": not lm_head}
    wrong = [k for k, v in given.items() if v and k not in own]
    if wrong:
        raise ValueError(f"model {name!r} has no {', '.join(wrong)}")
    cfg = dict(CONFIGS[name])
    cfg.update({k: int(v) for k, v in sizes.items() if v is not None})
    if sizes["ffn"] is None and sizes["hidden"] is not None:
        cfg["ffn"] = 4 * cfg["hidden"]
    if "image_size" in own:
        cfg.update(image_size=int(image_size or cfg["image_size"]), num_classes=num_classes,
                   softmax=softmax)
    elif "pooler" in own:
        cfg["pooler"] = pooler
    else:
        cfg["lm_head"] = lm_head
    g = _SeqGraph(f"{name}_{style}", opset=opset, style=style, seed=seed, batch=batch)
    body(g, **cfg)
    meta = {"coacto.zoo.model": name, "coacto.zoo.style": style, "coacto.zoo.seed": str(seed)}
    meta.update({f"coacto.zoo.{k}": str(int(v)) for k, v in sorted(cfg.items())})
    return g.model(f"{desc}, {style} style, opset {opset}, random weights (seed {seed})", meta)


def _builder(name: str, desc: str) -> Callable[..., onnx.ModelProto]:
    def b(**kw) -> onnx.ModelProto:
        return build(name, **kw)
    b.__name__ = f"build_{name}"
    b.__doc__ = f"{desc}: ``build({name!r}, **kw)``."
    return b


#: name -> builder; ``MODELS[name](**kw)`` is ``build(name, **kw)``.
MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    **{k: _builder(k, v[3]) for k, v in _ARCH.items()},
    **{k: _builder(k, v[3]) for k, v in _SEQ_ARCH.items()},
}


def save(name: str, path: str | pathlib.Path, **kw) -> pathlib.Path:
    """Build model ``name`` with ``build(name, **kw)`` and write it to ``path``."""
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(build(name, **kw).SerializeToString())
    return p


def input_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input of ``model`` that is not an initializer.

    Float inputs are ``N(0, 1)``. Integer inputs are what a tokenizer would give, judged by what
    they feed and by their names (HuggingFace's): indices of an embedding table (a ``Gather`` on
    an initializer, directly or through Reshape / Unsqueeze / Squeeze / Cast) are uniform in
    ``1 .. rows - 1``; an ``*attention_mask*`` is ones with the last ``max(1, S // 8)``
    positions of each row padded (one more per further batch row; at least one token stays);
    ``*token_type*`` ids mark a sentence pair (0 on the first half of the positions, 1 on the
    second); ``*position_ids*`` count ``0 .. S - 1``. Padded positions get token id 0 and
    type 0. Other integer inputs are 0 or 1. Symbolic dimensions become 1."""
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
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
            arr = _int_feed(model, inits, vi.name, shape, rng).astype(dtype)
        feeds[vi.name] = arr
    masks = [v for k, v in feeds.items() if "attention_mask" in k.lower()]
    if masks:
        pad = masks[0] == 0
        for k, v in feeds.items():
            if v.shape == pad.shape and not np.issubdtype(v.dtype, np.floating) and \
                    "mask" not in k.lower() and "position" not in k.lower():
                v[pad] = 0
    return feeds


def _table_rows(model: onnx.ModelProto, inits: dict, name: str) -> int | None:
    """Rows of the embedding table that tensor ``name`` indexes, if any."""
    consumers = defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(n)
    frontier, seen = [name], {name}
    while frontier:
        t = frontier.pop()
        for n in consumers[t]:
            if n.op_type == "Gather" and n.input[1] == t and n.input[0] in inits:
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                return int(inits[n.input[0]].dims[axis])
            if n.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Cast", "Flatten", "Identity") \
                    and n.input[0] == t and n.output[0] not in seen:
                seen.add(n.output[0])
                frontier.append(n.output[0])
    return None


def _int_feed(model: onnx.ModelProto, inits: dict, name: str, shape: list[int],
              rng: np.random.Generator) -> np.ndarray:
    key = name.lower()
    seq = shape[-1] if shape else 1
    lead = shape[:-1] if shape else []
    rows = int(np.prod(lead)) if lead else 1
    if "attention_mask" in key:
        mask = np.ones((rows, seq), dtype=np.int64)
        for r in range(rows):
            mask[r, seq - min(seq - 1, max(1, seq // 8) + r):] = 0
        return mask.reshape(shape)
    if "position" in key:
        return np.broadcast_to(np.arange(seq, dtype=np.int64), shape).copy()
    table = _table_rows(model, inits, name)
    if "token_type" in key or "segment" in key:
        second = (np.arange(seq) >= seq // 2) & (table is None or table > 1)
        return np.broadcast_to(second.astype(np.int64), (rows, seq)).reshape(shape).copy()
    if table is not None and table > 1:
        return rng.integers(1, table, shape)
    return rng.integers(0, 2, shape)


def count_params(model: onnx.ModelProto) -> int:
    """Trainable parameters as torchvision (and HuggingFace) count them: float initializers with
    at least one dimension, less BatchNormalization running statistics (buffers in PyTorch). A
    tied weight (GPT-2's embedding and LM head) is one initializer, counted once; the integer
    and boolean buffers (position ids, causal masks) are not parameters."""
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
