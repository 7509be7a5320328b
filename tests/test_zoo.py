"""coacto.zoo: every model, style and opset is valid ONNX, runs in onnxruntime with sane outputs, has
the original's parameter count and the operator forms the real exporters write."""
from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import coacto.zoo as zoo

from conftest import onnx_attrs as _attrs, onnx_ops as _ops, onnx_producers as _producers

#: image sizes that keep every layer of each architecture but run fast
SIZES = {"resnet18": 64, "resnet50": 64, "vgg16": 32, "mobilenetv2": 64, "squeezenet": 64,
         "densenet_block": 56, "inception_block": 56, "shufflenet_unit": 56,
         "mobilenetv3_block": 56}

#: the CNNs (the transformers have tests/test_zoo_transformers.py)
CNNS = [n for n in zoo.MODELS if n not in zoo.TRANSFORMERS]

CASES = (
    [(n, "default", o) for n in CNNS for o in zoo.OPSETS]
    + [(n, "zoo", o) for n in CNNS for o in (9, 13)]
    + [(n, "preact", o) for n in ("resnet18", "resnet50") for o in (9, 13)]
)

PARAMS_224 = {"resnet18": 11_689_512, "resnet50": 25_557_032, "vgg16": 138_357_544,
              "mobilenetv2": 3_504_872, "squeezenet": 1_235_496}


def _build(name: str, style: str = "default", opset: int | None = None, **kw) -> onnx.ModelProto:
    kw.setdefault("image_size", SIZES[name])
    return zoo.build(name, style=style, opset=opset, **kw)


#: small models reused by the structure tests (VGG is not cached: 100 MB even at 32 x 32)
_model = functools.lru_cache(maxsize=8)(_build)


def _run(model: onnx.ModelProto, seed: int = 0, data: bytes | None = None) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # zoo style lists initializers as inputs: ORT warns about it
    sess = ort.InferenceSession(data or model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, zoo.input_feeds(model, seed))
    return y


@functools.lru_cache(maxsize=None)
def _reference(name: str, family: str) -> np.ndarray:
    """The output of default style at opset 13 (or preact at 13): every style/opset of the same
    architecture must compute the same function."""
    return _run(_build(name, "preact" if family == "preact" else "default", 13))



def _check_signatures(model: onnx.ModelProto, opset: int) -> None:
    """The opset-dependent operator forms (attributes before, inputs after)."""
    for n in model.graph.node:
        a = _attrs(n)
        if n.op_type == "Clip":
            if opset < 11:
                assert {"min", "max"} <= set(a) and len(n.input) == 1, n.name
            else:
                assert not ({"min", "max"} & set(a)) and len(n.input) == 3, n.name
        elif n.op_type in ("Unsqueeze", "Squeeze"):
            assert ("axes" in a) == (opset < 13) and len(n.input) == (1 if opset < 13 else 2)
        elif n.op_type == "ReduceMean":
            assert ("axes" in a) == (opset < 18) and len(n.input) == (1 if opset < 18 else 2)
        elif n.op_type == "Split":
            assert ("split" in a) == (opset < 13) and len(n.input) == (1 if opset < 13 else 2)
        elif n.op_type == "Pad":
            assert ("pads" in a) == (opset < 11) and len(n.input) == (1 if opset < 11 else 2)
        elif n.op_type == "Dropout":
            assert ("ratio" in a) == (opset < 12)
        elif n.op_type == "Slice":
            assert ("starts" in a) == (opset < 10)
        elif n.op_type == "MaxPool" and opset < 10:
            assert "ceil_mode" not in a, n.name
        elif n.op_type == "BatchNormalization":
            assert "spatial" not in a and len(n.input) == 5
        elif n.op_type == "Gemm":
            assert a.get("transB") == 1


# ------------------------------------------------------------------------------------ the matrix
@pytest.mark.parametrize("name,style,opset", CASES, ids=[f"{n}-{s}-{o}" for n, s, o in CASES])
def test_model_valid_and_runs(name, style, opset):
    model = _build(name, style, opset)
    data = model.SerializeToString()
    assert [o.version for o in model.opset_import] == [opset]
    onnx.checker.check_model(data, full_check=True)  # includes strict shape inference
    _check_signatures(model, opset)
    declared = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    y = _run(model, data=data)
    assert list(y.shape) == declared
    assert np.isfinite(y).all()
    assert y.std() > 0.05, "collapsed output"
    assert np.abs(y).max() < 1e3, "exploding output"
    if y.ndim == 2:  # classifier logits stay of order one
        assert 0.1 < y.std() < 10, y.std()
    ref = _reference(name, "preact" if style == "preact" else "default")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("name", sorted(PARAMS_224))
def test_parameter_counts_match_originals(name):
    model = zoo.build(name)  # 224 x 224, not run
    assert zoo.DEFAULT_IMAGE_SIZE[name] == 224
    n = zoo.count_params(model)
    assert abs(n - PARAMS_224[name]) <= 0.01 * PARAMS_224[name], (n, PARAMS_224[name])


def test_determinism():
    a = zoo.build("mobilenetv3_block", seed=3).SerializeToString()
    b = zoo.build("mobilenetv3_block", seed=3).SerializeToString()
    c = zoo.build("mobilenetv3_block", seed=4).SerializeToString()
    assert a == b
    assert a != c
    assert zoo.build("resnet18", image_size=32).SerializeToString() == \
        zoo.build("resnet18", image_size=32).SerializeToString()
    x = zoo.input_feeds(_model("squeezenet"), seed=5)
    y = zoo.input_feeds(_model("squeezenet"), seed=5)
    assert all(np.array_equal(x[k], y[k]) for k in x)


def test_registry_and_builders():
    assert set(CNNS) == set(SIZES)
    assert set(zoo.MODELS) == set(zoo.STYLES)
    assert set(zoo.TRANSFORMERS) <= set(zoo.MODELS)
    for name, styles in zoo.STYLES.items():
        assert styles[0] == "default"
        assert ("zoo" in styles) == (name in CNNS)
    m = zoo.MODELS["squeezenet"](image_size=32)
    assert m.SerializeToString() == zoo.build("squeezenet", image_size=32).SerializeToString()
    assert zoo.DEFAULT_IMAGE_SIZE["densenet_block"] < 224


def test_errors():
    with pytest.raises(KeyError):
        zoo.build("alexnet")
    with pytest.raises(ValueError):
        zoo.build("vgg16", style="preact")
    with pytest.raises(ValueError):
        zoo.build("squeezenet", opset=8)
    with pytest.raises(ValueError, match="too small"):
        zoo.build("vgg16", image_size=24)


def test_save_and_input_feeds(tmp_path):
    path = zoo.save("squeezenet", tmp_path / "sub" / "sq.onnx", image_size=32, style="zoo")
    assert path.exists()
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == zoo.build("squeezenet", image_size=32,
                                                   style="zoo").SerializeToString()
    feeds = zoo.input_feeds(loaded)
    assert list(feeds) == ["input"]  # initializers listed as inputs are not feeds
    assert feeds["input"].dtype == np.float32 and feeds["input"].shape == (1, 3, 32, 32)


def test_softmax_option():
    model = zoo.build("shufflenet_unit", softmax=True, image_size=32)
    assert model.graph.node[-1].op_type == "Softmax"
    y = _run(model)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert "Softmax" not in _ops(_model("shufflenet_unit"))


def test_batch_and_torch_shape_subgraph():
    model = zoo.build("resnet50", batch=2, image_size=32)
    ops = _ops(model)
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape"} <= ops
    prod = _producers(model)
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
    assert prod[reshape.input[1]].op_type == "Concat"
    y = _run(model)
    assert y.shape == (2, 1000) and not np.allclose(y[0], y[1])


# ------------------------------------------------------------------------- architecture details
def test_resnet_names_and_v1_5_stride():
    model = _model("resnet50")
    names = {n.name for n in model.graph.node}
    inits = {t.name for t in model.graph.initializer}
    assert "/layer1/layer1.0/conv1/Conv" in names
    assert {"layer1.0.conv1.weight", "layer1.0.bn1.running_var", "fc.weight", "fc.bias"} <= inits
    convs = {n.name: _attrs(n) for n in model.graph.node if n.op_type == "Conv"}
    assert convs["/layer2/layer2.0/conv1/Conv"]["strides"] == [1, 1]
    assert convs["/layer2/layer2.0/conv2/Conv"]["strides"] == [2, 2]  # v1.5
    assert convs["/layer2/layer2.0/downsample/downsample.0/Conv"]["strides"] == [2, 2]
    assert "Add" in _ops(model) and "Flatten" not in _ops(model)
    assert "Flatten" in _ops(_model("resnet18"))


def test_preact_resnet():
    model = _model("resnet18", "preact")
    prod = _producers(model)
    for n in model.graph.node:
        if n.op_type == "Conv" and n.name != "/conv1/Conv":
            assert prod[n.input[0]].op_type == "Relu", n.name  # BN-ReLU before each conv
            assert prod[prod[n.input[0]].input[0]].op_type == "BatchNormalization"


def test_zoo_style_forms():
    for name in ("resnet18", "mobilenetv2", "densenet_block"):
        model = _model(name, "zoo")
        ops = _ops(model)
        assert "BatchNormalization" not in ops
        assert {"Mul", "Add", "Unsqueeze", "Pad"} <= ops
        inits = {t.name for t in model.graph.initializer}
        assert inits <= {i.name for i in model.graph.input}
        prod = _producers(model)
        for n in model.graph.node:
            if n.op_type == "Unsqueeze":
                assert n.input[0] in inits  # per-channel constants unsqueezed
            if n.op_type == "Pad":
                assert any(c.op_type == "Conv" and c.input[0] == n.output[0]
                           for c in model.graph.node)
        if name.startswith("resnet"):
            assert sum(n.op_type == "Sum" for n in model.graph.node) == 8  # residuals
            for n in model.graph.node:  # every Add is a batch norm's shift
                if n.op_type == "Add":
                    assert prod[n.input[1]].op_type == "Unsqueeze", n.name
            reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
            assert reshape.input[1] in inits


def test_vgg_dropout_and_flatten_size():
    model = _build("vgg16")
    prod = _producers(model)
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 3
    assert [prod[g.input[0]].op_type for g in gemms] == ["Flatten", "Dropout", "Dropout"]
    w = {t.name: list(t.dims) for t in model.graph.initializer}
    assert w["classifier.0.weight"] == [4096, 512 * (SIZES["vgg16"] // 32) ** 2]
    assert w["classifier.0.weight"] != list(
        next(t.dims for t in zoo.build("vgg16", image_size=64).graph.initializer
             if t.name == "classifier.0.weight"))


def test_squeezenet_ceil_mode_and_head():
    for opset, has_ceil in ((9, False), (13, True)):
        model = _model("squeezenet", "default", opset)
        pools = [_attrs(n) for n in model.graph.node if n.op_type == "MaxPool"]
        assert len(pools) == 3
        assert all(("ceil_mode" in p) == has_ceil for p in pools)
    model = _model("squeezenet")
    tail = [n.op_type for n in model.graph.node[-5:]]
    assert tail == ["Dropout", "Conv", "Relu", "GlobalAveragePool", "Flatten"]
    assert sum(n.op_type == "Concat" for n in model.graph.node) == 8


def test_mobilenetv2_relu6_and_depthwise():
    model = _model("mobilenetv2")
    assert "Clip" in _ops(model)
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    dw = [n for n in model.graph.node if n.op_type == "Conv" and _attrs(n)["group"] > 1]
    assert len(dw) == 17
    for n in dw:
        assert shapes[n.input[1]][1] == 1 and shapes[n.input[1]][0] == _attrs(n)["group"]


def test_densenet_standalone_bn_and_concat():
    model = _model("densenet_block")
    prod = _producers(model)
    bn_inputs = [prod[n.input[0]].op_type for n in model.graph.node
                 if n.op_type == "BatchNormalization"]
    assert "Concat" in bn_inputs and "Conv" in bn_inputs  # pre-activation BN on a Concat
    concats = [len(n.input) for n in model.graph.node if n.op_type == "Concat"]
    assert concats == [1, 2, 3, 4, 5, 6, 7]
    assert "AveragePool" in _ops(model)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == \
        [1, 128, 7, 7]


def test_inception_lrn_and_avgpool_variants():
    model = _model("inception_block")
    ops = _ops(model)
    assert {"LRN", "Concat", "MaxPool", "AveragePool"} <= ops
    cip = {_attrs(n)["count_include_pad"] for n in model.graph.node if n.op_type == "AveragePool"}
    assert cip == {0, 1}
    assert any(len(n.input) == 4 for n in model.graph.node if n.op_type == "Concat")
    assert any(_attrs(n)["strides"] == [1, 1] and _attrs(n)["pads"] == [1, 1, 1, 1]
               for n in model.graph.node if n.op_type == "MaxPool")


@pytest.mark.parametrize("style,split_op", [("default", "Split"), ("zoo", "Slice")])
def test_shufflenet_split_and_shuffle(style, split_op):
    model = _model("shufflenet_unit", style, 13)
    ops = _ops(model)
    assert split_op in ops and "ReduceMean" in ops
    perms = [_attrs(n)["perm"] for n in model.graph.node if n.op_type == "Transpose"]
    assert perms == [[0, 2, 1, 3, 4]] * 4
    dw_s2 = [n for n in model.graph.node if n.op_type == "Conv" and _attrs(n)["group"] > 1
             and _attrs(n)["strides"] == [2, 2]]
    assert len(dw_s2) == 2  # the stride-2 unit's two branches
    if style == "default":
        assert "Shape" in ops and "Gather" in ops  # torch-style shape subgraphs


@pytest.mark.parametrize("opset", [13, 14, 18])
def test_mobilenetv3_activations(opset):
    model = zoo.build("mobilenetv3_block", opset=opset, image_size=32)
    ops = _ops(model)
    assert {"HardSigmoid", "Sigmoid", "LeakyRelu", "ReduceMean", "GlobalAveragePool",
            "Mul", "Squeeze"} <= ops
    assert ("HardSwish" in ops) == (opset >= 14)
    # the squeeze-excite product broadcasts (N, C, 1, 1) x (N, C, H, W)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in inferred.graph.value_info}
    se = [n for n in model.graph.node if n.op_type == "Mul" and n.input[0] in shapes
          and shapes[n.input[0]][2:] == [1, 1] and shapes.get(n.input[1], [0, 0, 1])[2] > 1]
    assert len(se) == 3
    y = _run(model)
    np.testing.assert_allclose(y, _run(zoo.build("mobilenetv3_block", opset=13, image_size=32)),
                               rtol=1e-4, atol=1e-4)
