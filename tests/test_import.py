"""ONNX import: every operator family and form, imported and run by the numpy reference, equals
onnxruntime (max |error| <= 1e-4 * max |reference|); fusions and foldings leave the expected layers;
bad models fail with the documented errors."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from coacto import ir
from coacto.errors import ModelError, ShapeError, UnsupportedOperatorError
from coacto.frontend import import_model, load_model
from coacto.reference import run_reference

F = TensorProto.FLOAT


# ------------------------------------------------------------------------------------- helpers

def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make(nodes, inputs, outputs, inits=None, opset=13, dtype=F):
    """A model; ``inputs``: {name: shape}, ``outputs``: names, ``inits``: {name: array}."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or f"{op}_{outs[0]}", **attrs)


def onnxruntime_run(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def check(model, feeds=None, input_shapes=None, rel=1e-4):
    """Imports ``model``, runs the reference and onnxruntime, compares; returns the graph."""
    graph = import_model(model, input_shapes=input_shapes)
    if feeds is None:
        feeds = {}
        for i, vi in enumerate(model.graph.input):
            if vi.name in {t.name for t in model.graph.initializer}:
                continue
            shape = (input_shapes or {}).get(vi.name) or \
                [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rand(*shape, seed=100 + i)
    got = run_reference(graph, feeds)
    ref = onnxruntime_run(model, feeds)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        scale = max(float(np.abs(ref[k]).max()), 1e-30)
        err = float(np.abs(got[k].astype(np.float64) - ref[k]).max())
        assert err <= rel * scale, f"{k}: max |error| {err:.3g} > {rel} * {scale:.3g}"
    return graph


def ops(graph):
    return [layer.op for layer in graph.layers]


def only(graph, op):
    found = [layer for layer in graph.layers if layer.op == op]
    assert len(found) == 1, ops(graph)
    return found[0]


# ---------------------------------------------------------------------------------- convolution

CONV_CASES = {
    "3x3": dict(cin=4, cout=6, k=(3, 3), pads=[1, 1, 1, 1]),
    "stride2_asym_pads": dict(cin=3, cout=5, k=(3, 3), strides=[2, 2], pads=[0, 1, 2, 1]),
    "dilation2": dict(cin=4, cout=4, k=(3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    "group2": dict(cin=4, cout=6, k=(3, 3), group=2, pads=[1, 1, 1, 1]),
    "depthwise": dict(cin=6, cout=6, k=(3, 3), group=6, strides=[2, 2], pads=[1, 1, 1, 1]),
    "depthwise_x2": dict(cin=3, cout=6, k=(5, 5), group=3, pads=[2, 2, 2, 2]),
    "no_bias": dict(cin=4, cout=6, k=(3, 3), bias=False),
    "1x1": dict(cin=8, cout=3, k=(1, 1)),
    "1x5_stride_2x1": dict(cin=2, cout=3, k=(1, 5), strides=[2, 1], pads=[0, 2, 0, 2]),
    "same_upper": dict(cin=3, cout=4, k=(4, 4), strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(cin=3, cout=4, k=(4, 4), strides=[2, 2], auto_pad="SAME_LOWER"),
    "valid": dict(cin=3, cout=4, k=(3, 3), strides=[2, 2], auto_pad="VALID"),
    "dilated_stride_group": dict(cin=4, cout=8, k=(3, 2), strides=[2, 3], dilations=[2, 1],
                                 group=4, pads=[1, 0, 2, 1]),
}


def conv_model(cin, cout, k, bias=True, group=1, hw=(9, 11), opset=13, **attrs):
    w = rand(cout, cin // group, *k, seed=1)
    inits = {"w": w}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rand(cout, seed=2)
        ins.append("b")
    nodes = [node("Conv", ins, ["y"], group=group, kernel_shape=list(k), **attrs)]
    return make(nodes, {"x": [2, cin, *hw]}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case):
    graph = check(conv_model(**CONV_CASES[case]))
    assert ops(graph) == ["INPUT", "CONV"]
    conv = graph.layers[1]
    assert conv.weights["w"].shape[0] == CONV_CASES[case].get("group", 1)


def test_conv_1d():
    w, b = rand(5, 3, 3, seed=1), rand(5, seed=2)
    model = make([node("Conv", ["x", "w", "b"], ["y"], pads=[1, 2], strides=[2])],
                 {"x": [2, 3, 17]}, ["y"], {"w": w, "b": b})
    graph = check(model)
    assert ops(graph) == ["INPUT", "CONV"] and graph.layers[1].onnx_shape == (2, 5, 9)


# ---------------------------------------------------------------------- BatchNorm and affine ops

def bn_inits(c, prefix="bn", seed=3):
    rng = np.random.default_rng(seed)
    return {f"{prefix}_s": rng.uniform(0.5, 1.5, c).astype(np.float32),
            f"{prefix}_b": rng.normal(size=c).astype(np.float32),
            f"{prefix}_m": rng.normal(size=c).astype(np.float32),
            f"{prefix}_v": rng.uniform(0.5, 2.0, c).astype(np.float32)}


def bn_node(x, y, prefix="bn", **attrs):
    return node("BatchNormalization", [x] + [f"{prefix}_{k}" for k in "sbmv"], [y], **attrs)


@pytest.mark.parametrize("opset,bias", [(9, True), (13, False), (15, True)])
def test_batchnorm_folds_into_conv(opset, bias):
    extra = {"training_mode": 0} if opset >= 14 else {}
    inits = {"w": rand(6, 4, 3, 3, seed=1), **bn_inits(6)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rand(6, seed=2)
        ins.append("b")
    nodes = [node("Conv", ins, ["c"], pads=[1, 1, 1, 1]), bn_node("c", "n", epsilon=1e-3, **extra),
             node("Relu", ["n"], ["y"])]
    graph = check(make(nodes, {"x": [1, 4, 8, 8]}, ["y"], inits, opset=opset))
    assert ops(graph) == ["INPUT", "CONV"]
    assert graph.layers[1].attrs["act"] == ir.ACT_RELU


def test_batchnorm_standalone_and_after_a_conv_that_is_an_output():
    inits = {"w": rand(4, 4, 1, 1, seed=1), **bn_inits(4), **bn_inits(4, "bn2", seed=5)}
    nodes = [bn_node("x", "a", "bn2"), node("Conv", ["a", "w"], ["c"]), bn_node("c", "y")]
    graph = check(make(nodes, {"x": [2, 4, 5, 5]}, ["c", "y"], inits))
    assert ops(graph) == ["INPUT", "AFFINE", "CONV", "AFFINE"]


def test_batchnorm_rank2():
    graph = check(make([bn_node("x", "y")], {"x": [3, 6]}, ["y"], bn_inits(6)))
    assert ops(graph) == ["INPUT", "AFFINE"]


def unsqueezed(c, name, seed, opset):
    """The old model zoo's per-channel constant: an (C,) initializer unsqueezed to (C, 1, 1)."""
    inits = {name: rand(c, seed=seed)}
    if opset >= 13:
        inits[name + "_axes"] = np.array([1, 2], np.int64)
        n = node("Unsqueeze", [name, name + "_axes"], [name + "_u"])
    else:
        n = node("Unsqueeze", [name], [name + "_u"], axes=[1, 2])
    return n, inits


@pytest.mark.parametrize("opset", [9, 13])
def test_zoo_style_mul_add_fold_into_conv(opset):
    us, i1 = unsqueezed(6, "scale", 4, opset)
    ub, i2 = unsqueezed(6, "shift", 5, opset)
    nodes = [us, ub, node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Mul", ["c", "scale_u"], ["m"]), node("Add", ["m", "shift_u"], ["a"]),
             node("Relu", ["a"], ["y"])]
    graph = check(make(nodes, {"x": [1, 3, 6, 6]}, ["y"], {"w": rand(6, 3, 3, 3), **i1, **i2},
                       opset=opset))
    assert ops(graph) == ["INPUT", "CONV"] and graph.layers[1].attrs["act"] == ir.ACT_RELU


@pytest.mark.parametrize("op,const_first", [("Add", False), ("Add", True), ("Sub", False),
                                            ("Sub", True), ("Mul", False), ("Div", False)])
def test_per_channel_constant_is_affine(op, const_first):
    k = np.abs(rand(1, 5, 1, 1, seed=7)) + 0.5
    ins = ["k", "x"] if const_first else ["x", "k"]
    graph = check(make([node(op, ins, ["y"])], {"x": [2, 5, 3, 4]}, ["y"], {"k": k}))
    assert ops(graph) == ["INPUT", "AFFINE"]


def test_scalar_and_rank2_affine_chain_folds():
    nodes = [node("Mul", ["x", "s"], ["a"]), node("Add", ["a", "t"], ["b"]),
             node("Sub", ["b", "u"], ["y"])]
    inits = {"s": np.array(1.5, np.float32), "t": rand(7, seed=1), "u": rand(1, 7, seed=2)}
    graph = check(make(nodes, {"x": [3, 7]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "AFFINE"]


def test_constant_first_division_and_broadcast_constants_are_binary():
    nodes = [node("Div", ["k", "x"], ["a"]), node("Add", ["a", "row"], ["b"]),
             node("Mul", ["b", "full"], ["y"])]
    inits = {"k": np.full((1, 3, 1, 1), 2.0, np.float32), "row": rand(5, seed=1),
             "full": rand(3, 4, 5, seed=2)}
    x = np.abs(rand(2, 3, 4, 5)) + 0.5
    graph = check(make(nodes, {"x": [2, 3, 4, 5]}, ["y"], inits), {"x": x})
    assert ops(graph) == ["INPUT", "BINARY", "BINARY", "BINARY"]
    assert graph.layers[1].attrs["const_first"] == 1


def test_constant_that_expands_the_activation():
    graph = check(make([node("Add", ["x", "k"], ["y"])], {"x": [2, 1, 4, 4]}, ["y"],
                       {"k": rand(1, 3, 1, 1, seed=1)}))
    assert ops(graph) == ["INPUT", "BINARY"] and graph.layers[1].shape == (2, 3, 4, 4)


# ----------------------------------------------------------------------------------- activations

ACTIVATIONS = {
    "relu": (13, lambda: [node("Relu", ["c"], ["y"])], {}, ir.ACT_RELU),
    "clip_attrs": (9, lambda: [node("Clip", ["c"], ["y"], min=-0.5, max=0.7)], {}, ir.ACT_CLIP),
    "clip_relu6": (13, lambda: [node("Clip", ["c", "lo", "hi"], ["y"])],
                   {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}, ir.ACT_CLIP),
    "clip_min_only": (11, lambda: [node("Clip", ["c", "lo"], ["y"])],
                      {"lo": np.array(-0.2, np.float32)}, ir.ACT_CLIP),
    "clip_max_only": (13, lambda: [node("Clip", ["c", "", "hi"], ["y"])],
                      {"hi": np.array(0.3, np.float32)}, ir.ACT_CLIP),
    "clip_as_relu": (13, lambda: [node("Clip", ["c", "lo"], ["y"])],
                     {"lo": np.array(0.0, np.float32)}, ir.ACT_RELU),
    "leaky": (13, lambda: [node("LeakyRelu", ["c"], ["y"], alpha=0.2)], {}, ir.ACT_LEAKY),
    "prelu_scalar": (13, lambda: [node("PRelu", ["c", "slope"], ["y"])],
                     {"slope": np.array([0.25], np.float32)}, ir.ACT_LEAKY),
    "sigmoid": (13, lambda: [node("Sigmoid", ["c"], ["y"])], {}, ir.ACT_SIGMOID),
    "hardsigmoid": (13, lambda: [node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)], {},
                    ir.ACT_HARDSIGMOID),
    "hardswish": (14, lambda: [node("HardSwish", ["c"], ["y"])], {}, ir.ACT_HARDSWISH),
    "tanh": (13, lambda: [node("Tanh", ["c"], ["y"])], {}, ir.ACT_TANH),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_fuses_into_conv(name):
    opset, tail, inits, act = ACTIVATIONS[name]
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])] + tail()
    inits = {"w": rand(4, 3, 3, 3, seed=1, scale=2.0), "b": rand(4, seed=2), **inits}
    graph = check(make(nodes, {"x": [1, 3, 6, 6]}, ["y"], inits, opset=opset))
    assert ops(graph) == ["INPUT", "CONV"] and graph.layers[1].attrs["act"] == act


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_standalone(name):
    opset, tail, inits, act = ACTIVATIONS[name]
    nodes = [node("Identity", ["x"], ["c"])] + tail()
    graph = check(make(nodes, {"x": [2, 3, 4, 5]}, ["y"], inits, opset=opset),
                  {"x": rand(2, 3, 4, 5, scale=4.0)})
    assert ops(graph) == ["INPUT", "AFFINE"] and graph.layers[1].attrs["act"] == act


def test_activation_not_fused_into_a_producer_with_two_consumers():
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]),
             node("Sigmoid", ["c"], ["s"]), node("Add", ["r", "s"], ["y"])]
    graph = check(make(nodes, {"x": [1, 3, 4, 4]}, ["y"], {"w": rand(3, 3, 1, 1)}))
    assert ops(graph) == ["INPUT", "CONV", "AFFINE", "AFFINE", "BINARY"]


def test_activation_fuses_into_binary_and_affine():
    nodes = [node("Add", ["x", "z"], ["a"]), node("Relu", ["a"], ["r"]),
             node("Mul", ["r", "k"], ["m"]), node("Tanh", ["m"], ["y"])]
    graph = check(make(nodes, {"x": [2, 3, 4, 4], "z": [2, 3, 4, 4]}, ["y"],
                       {"k": rand(1, 3, 1, 1, seed=3)}))
    assert ops(graph) == ["INPUT", "INPUT", "BINARY", "AFFINE"]
    assert graph.layers[2].attrs["act"] == ir.ACT_RELU
    assert graph.layers[3].attrs["act"] == ir.ACT_TANH


def test_hardswish_decomposed_and_swish():
    nodes = [node("Add", ["x", "three"], ["a"]), node("Clip", ["a", "zero", "six"], ["c"]),
             node("Div", ["c", "six"], ["d"]), node("Mul", ["x", "d"], ["hs"]),
             node("Sigmoid", ["hs"], ["s"]), node("Mul", ["hs", "s"], ["y"])]
    inits = {"three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32),
             "six": np.array(6.0, np.float32)}
    check(make(nodes, {"x": [1, 4, 5, 5]}, ["y"], inits), {"x": rand(1, 4, 5, 5, scale=4.0)})


def test_max_min_neg_and_clip_chains():
    """TF-style ReLU6 (Min(Max(x, 0), 6)) becomes one clip fused into the convolution."""
    inits = {"w": rand(4, 3, 3, 3, seed=1, scale=3.0), "zero": np.array(0.0, np.float32),
             "six": np.array(0.8, np.float32), "lo": np.array(-0.3, np.float32)}
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Max", ["c", "zero"], ["m"]),
             node("Min", ["m", "six"], ["r6"]), node("Neg", ["r6"], ["n"]),
             node("Max", ["n", "lo"], ["y"])]
    graph = check(make(nodes, {"x": [1, 3, 6, 6]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV", "AFFINE"]
    conv = graph.layers[1]
    assert conv.attrs["act"] == ir.ACT_CLIP and (conv.attrs["alpha"], conv.attrs["beta"]) == \
        (0.0, pytest.approx(0.8))


# ------------------------------------------------------------------------------------- residuals

@pytest.mark.parametrize("op", ["Add", "Sum"])
def test_residual_fuses_into_conv(op):
    inits = {"w": rand(4, 4, 3, 3, seed=1), "b": rand(4, seed=2), **bn_inits(4)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), bn_node("c", "n"),
             node(op, ["n", "x"], ["a"]), node("Relu", ["a"], ["y"])]
    graph = check(make(nodes, {"x": [2, 4, 5, 5]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV"]
    conv = graph.layers[1]
    assert conv.inputs == [0, 0] and conv.attrs["act"] == ir.ACT_RELU


def test_residual_of_two_convs_and_not_with_broadcast():
    nodes = [node("Conv", ["x", "w1"], ["a"]), node("Conv", ["x", "w2"], ["b"]),
             node("Add", ["a", "b"], ["s"]), node("GlobalAveragePool", ["s"], ["g"]),
             node("Conv", ["s", "w3"], ["c"]), node("Add", ["c", "g"], ["y"])]
    inits = {"w1": rand(4, 3, 1, 1, seed=1), "w2": rand(4, 3, 1, 1, seed=2),
             "w3": rand(4, 4, 1, 1, seed=3)}
    graph = check(make(nodes, {"x": [1, 3, 4, 4]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV", "CONV", "GLOBAL_POOL", "CONV", "BINARY"]
    assert graph.layers[2].inputs == [0, 1]


def test_sum_of_three():
    nodes = [node("Sum", ["x", "y", "z"], ["s"])]
    graph = check(make(nodes, {"x": [2, 3, 4, 4], "y": [2, 3, 4, 4], "z": [1, 3, 1, 4]}, ["s"]))
    assert ops(graph).count("BINARY") == 2


def test_mean_and_pow():
    nodes = [node("Mean", ["x", "y"], ["m"]), node("Pow", ["m", "two"], ["y2"])]
    check(make(nodes, {"x": [2, 3, 4], "y": [2, 3, 4]}, ["y2"], {"two": np.array(2.0, np.float32)}))


def test_se_style_gate_is_a_broadcasting_binary():
    nodes = [node("GlobalAveragePool", ["x"], ["g"]), node("Conv", ["g", "w"], ["s"]),
             node("HardSigmoid", ["s"], ["h"]), node("Mul", ["x", "h"], ["y"])]
    graph = check(make(nodes, {"x": [2, 4, 5, 6]}, ["y"], {"w": rand(4, 4, 1, 1, seed=1)}))
    assert ops(graph) == ["INPUT", "GLOBAL_POOL", "CONV", "BINARY"]


# --------------------------------------------------------------------------- matrix products

@pytest.mark.parametrize("trans_b,alpha,beta,bias_shape", [
    (0, 1.0, 1.0, (5,)), (1, 0.5, 2.0, (1, 5)), (1, 1.0, 1.0, None), (0, 1.5, 0.5, (3, 5))])
def test_gemm(trans_b, alpha, beta, bias_shape):
    b = rand(5, 7, seed=1) if trans_b else rand(7, 5, seed=1)
    inits = {"b": b}
    ins = ["x", "b"]
    if bias_shape:
        inits["c"] = rand(*bias_shape, seed=2)
        ins.append("c")
    graph = check(make([node("Gemm", ins, ["y"], transB=trans_b, alpha=alpha, beta=beta)],
                       {"x": [3, 7]}, ["y"], inits))
    assert ops(graph)[:2] == ["INPUT", "CONV"] and graph.layers[1].onnx_shape == (3, 5) or \
        bias_shape == (3, 5)


def test_matmul_then_bias_add_is_one_conv():
    nodes = [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])]
    inits = {"w": rand(6, 4, seed=1), "b": rand(4, seed=2)}
    graph = check(make(nodes, {"x": [2, 6]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV"]


@pytest.mark.parametrize("how", ["flatten", "reshape_const", "shape_subgraph"])
def test_flatten_then_gemm_folds_into_weights(how):
    x_shape = [2, 3, 4, 5]
    inits = {"w": rand(6, 60, seed=1), "b": rand(6, seed=2)}
    if how == "flatten":
        nodes = [node("Flatten", ["x"], ["f"], axis=1)]
    elif how == "reshape_const":
        inits["shape"] = np.array([2, -1], np.int64)
        nodes = [node("Reshape", ["x", "shape"], ["f"])]
    else:  # what torch.onnx writes for x.view(x.size(0), -1)
        inits.update(zero=np.array(0, np.int64), axes=np.array([0], np.int64),
                     minus1=np.array([-1], np.int64))
        nodes = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
                 node("Unsqueeze", ["n", "axes"], ["nu"]),
                 node("Concat", ["nu", "minus1"], ["shape"], axis=0),
                 node("Reshape", ["x", "shape"], ["f"])]
    nodes.append(node("Gemm", ["f", "w", "b"], ["y"], transB=1))
    graph = check(make(nodes, {"x": x_shape}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV"]
    conv = graph.layers[1]
    assert (conv.attrs["kh"], conv.attrs["kw"]) == (4, 5) and conv.onnx_shape == (2, 6)


def test_flatten_of_pooled_features_is_an_alias():
    nodes = [node("GlobalAveragePool", ["x"], ["g"]), node("Flatten", ["g"], ["y"])]
    graph = check(make(nodes, {"x": [2, 8, 3, 3]}, ["y"]))
    assert ops(graph) == ["INPUT", "GLOBAL_POOL"] and graph.layers[1].onnx_shape == (2, 8)


# ----------------------------------------------------------------------------------------- pools

POOLS = {
    "max_k3s2p1": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 11),
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), 11),
    "max_ceil_pads": ("MaxPool", dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1],
                                      ceil_mode=1), 13),
    "max_dilation": ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 3], strides=[1, 2]), 11),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                       auto_pad="SAME_UPPER"), 13),
    "avg_exclude_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                            pads=[1, 1, 1, 1]), 11),
    "avg_include_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 2, 0, 1],
                                            count_include_pad=1), 11),
    "avg_ceil_exclude": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
                                             pads=[1, 1, 1, 1]), 13),
    "avg_ceil_include": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
                                             pads=[1, 1, 1, 1], count_include_pad=1), 13),
    "avg_same_lower": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2],
                                           auto_pad="SAME_LOWER"), 13),
    "avg_opset9": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), 9),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool(name):
    op, attrs, opset = POOLS[name]
    graph = check(make([node(op, ["x"], ["y"], **attrs)], {"x": [2, 3, 8, 9]}, ["y"], opset=opset))
    assert ops(graph) == ["INPUT", "POOL"]


def test_pool_1d():
    check(make([node("MaxPool", ["x"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 1])],
               {"x": [2, 3, 10]}, ["y"]))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    graph = check(make([node(op, ["x"], ["y"])], {"x": [2, 5, 4, 3]}, ["y"]))
    assert ops(graph) == ["INPUT", "GLOBAL_POOL"]


@pytest.mark.parametrize("op,opset,keepdims", [
    ("ReduceMean", 13, 1), ("ReduceMean", 13, 0), ("ReduceMean", 18, 0), ("ReduceMean", 9, 1),
    ("ReduceMax", 13, 0), ("ReduceMax", 18, 1), ("ReduceSum", 13, 1)])
def test_reduce_over_spatial_axes(op, opset, keepdims):
    inits = {}
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        inits["axes"] = np.array([-2, -1], np.int64)
        n = node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    else:
        n = node(op, ["x"], ["y"], axes=[2, 3], keepdims=keepdims)
    graph = check(make([n], {"x": [2, 5, 4, 3]}, ["y"], inits, opset=opset))
    assert ops(graph)[:2] == ["INPUT", "GLOBAL_POOL"]


@pytest.mark.parametrize("size", [5, 3, 1])  # onnxruntime needs odd sizes
def test_lrn(size):
    graph = check(make([node("LRN", ["x"], ["y"], size=size, alpha=1e-2, beta=0.75, bias=2.0)],
                       {"x": [2, 7, 3, 3]}, ["y"]))
    assert ops(graph) == ["INPUT", "LRN"]


# --------------------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("op,opset,shape,axis", [
    ("Softmax", 11, [3, 10], None), ("Softmax", 11, [3, 10, 1, 1], 1),
    ("Softmax", 13, [3, 10], None), ("Softmax", 13, [2, 6, 3, 4], 1),
    ("LogSoftmax", 11, [3, 10], 1), ("LogSoftmax", 13, [3, 10], -1), ("Softmax", 9, [2, 5], 1)])
def test_softmax(op, opset, shape, axis):
    attrs = {} if axis is None else {"axis": axis}
    graph = check(make([node(op, ["x"], ["y"], **attrs)], {"x": shape}, ["y"], opset=opset),
                  {"x": rand(*shape, scale=3.0)})
    assert ops(graph) == ["INPUT", "SOFTMAX"]


# ------------------------------------------------------------------------------- layout (GATHER)

def test_concat_channels_and_other_axes():
    nodes = [node("Concat", ["x", "z"], ["c"], axis=1), node("Concat", ["c", "c"], ["h"], axis=2),
             node("Relu", ["h"], ["y"])]
    graph = check(make(nodes, {"x": [2, 3, 4, 5], "z": [2, 2, 4, 5]}, ["y", "c"]))
    # the Relu runs on c (half the values of h) and the concatenation along H is read from it
    assert ops(graph) == ["INPUT", "INPUT", "CONCAT", "AFFINE", "GATHER"]


def test_concat_of_many_inputs():
    names = [f"x{i}" for i in range(11)]
    nodes = [node("Relu", [n], [n + "r"]) for n in names]
    nodes += [node("Concat", [n + "r" for n in names], ["c"], axis=1),
              node("Concat", [n + "r" for n in names], ["w"], axis=3)]
    graph = check(make(nodes, {n: [1, 2, 3, 3] for n in names}, ["c", "w"]))
    assert all(len(layer.inputs) <= 8 for layer in graph.layers)


def test_channel_shuffle():
    inits = {"s1": np.array([1, 2, 3, 4, 5], np.int64), "s2": np.array([1, 6, 4, 5], np.int64),
             "w": rand(6, 6, 1, 1, seed=1)}
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Reshape", ["c", "s1"], ["r"]),
             node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["t", "s2"], ["s"]), node("Conv", ["s", "w"], ["y"])]
    inits["s1"] = np.array([1, 2, 3, 4, 5], np.int64)
    graph = check(make(nodes, {"x": [1, 6, 4, 5]}, ["y"], inits))
    assert ops(graph) == ["INPUT", "CONV", "GATHER", "CONV"]


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split(opset):
    if opset == 18:
        inits, n = {}, node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)
    elif opset == 13:
        inits = {"split": np.array([2, 3, 1], np.int64)}
        n = node("Split", ["x", "split"], ["a", "b", "c"], axis=1)
    else:
        inits, n = {}, node("Split", ["x"], ["a", "b", "c"], axis=1, split=[1, 4, 1])
    nodes = [n, node("Relu", ["a"], ["ra"]), node("Sigmoid", ["c"], ["rc"])]
    graph = check(make(nodes, {"x": [2, 6, 3, 4]}, ["ra", "b", "rc"], inits, opset=opset))
    assert ops(graph).count("GATHER") == 3


@pytest.mark.parametrize("opset", [9, 13])
def test_slice(opset):
    if opset == 9:
        n1 = node("Slice", ["x"], ["a"], starts=[1, 0], ends=[3, -1], axes=[1, 3])
        inits = {}
    else:
        inits = {"st": np.array([4, -1], np.int64), "en": np.array([0, -100], np.int64),
                 "ax": np.array([1, 2], np.int64), "sp": np.array([-2, -2], np.int64)}
        n1 = node("Slice", ["x", "st", "en", "ax", "sp"], ["a"])
    nodes = [n1, node("Relu", ["a"], ["y"])]
    check(make(nodes, {"x": [2, 5, 6, 7]}, ["y"], inits, opset=opset))


def test_transpose_output_and_squeeze_unsqueeze():
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             node("Unsqueeze", ["t"], ["u"], axes=[0]), node("Squeeze", ["u"], ["s"], axes=[0]),
             node("Relu", ["s"], ["y"])]
    graph = check(make(nodes, {"x": [2, 3, 4, 5]}, ["y", "t"], opset=11))
    assert graph.layers[graph.outputs["t"]].onnx_shape == (2, 4, 5, 3)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_signatures(opset):
    if opset >= 13:
        inits = {"a0": np.array([2, 3], np.int64)}
        nodes = [node("Squeeze", ["x", "a0"], ["s"]), node("Relu", ["s"], ["r"]),
                 node("Unsqueeze", ["r", "a0"], ["y"])]
    else:
        inits = {}
        nodes = [node("Squeeze", ["x"], ["s"], axes=[2, 3]), node("Relu", ["s"], ["r"]),
                 node("Unsqueeze", ["r"], ["y"], axes=[2, 3])]
    graph = check(make(nodes, {"x": [2, 5, 1, 1]}, ["y"], inits, opset=opset))
    assert ops(graph) == ["INPUT", "AFFINE"]  # both reshapes are storage identities


@pytest.mark.parametrize("opset", [9, 11, 18])
def test_zero_pad_folds_into_conv(opset):
    pads = [0, 0, 1, 2, 0, 0, 3, 0]
    if opset == 9:
        inits, n = {}, node("Pad", ["x"], ["p"], pads=pads)
    elif opset == 11:
        inits = {"pads": np.array(pads, np.int64)}
        n = node("Pad", ["x", "pads"], ["p"])
    else:
        inits = {"pads": np.array([1, 2, 3, 0], np.int64), "axes": np.array([2, 3], np.int64)}
        n = node("Pad", ["x", "pads", "", "axes"], ["p"])
    inits["w"] = rand(4, 3, 3, 3, seed=1)
    nodes = [n, node("Conv", ["p", "w"], ["y"], strides=[2, 2], pads=[1, 0, 0, 1])]
    graph = check(make(nodes, {"x": [1, 3, 7, 8]}, ["y"], inits, opset=opset))
    assert ops(graph) == ["INPUT", "CONV"]
    a = graph.layers[1].attrs
    assert (a["pt"], a["pl"], a["pb"], a["pr"]) == (2, 2, 3, 1)


@pytest.mark.parametrize("mode", ["reflect", "edge", "constant"])
def test_pad_modes(mode):
    inits = {"pads": np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64),
             "v": np.array(1.5, np.float32), "w": rand(4, 3, 3, 3, seed=1)}
    ins = ["x", "pads", "v"] if mode == "constant" else ["x", "pads"]
    nodes = [node("Pad", ins, ["p"], mode=mode), node("Conv", ["p", "w"], ["y"])]
    graph = check(make(nodes, {"x": [1, 3, 5, 6]}, ["y", "p"], inits))
    assert ops(graph) == ["INPUT", "GATHER", "CONV"]


def test_negative_pad_crops():
    inits = {"pads": np.array([0, 0, -1, 1, 0, 0, 2, -2], np.int64)}
    check(make([node("Pad", ["x", "pads"], ["y"])], {"x": [1, 3, 5, 6]}, ["y"], inits))


def test_depth_space_and_resize():
    inits = {"scales": np.array([1, 1, 2, 2], np.float32), "roi": np.array([], np.float32),
             "sizes": np.array([1, 2, 5, 7], np.int64)}
    nodes = [node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
             node("SpaceToDepth", ["d"], ["s"], blocksize=2),
             node("DepthToSpace", ["s"], ["d2"], blocksize=2),
             node("Resize", ["d2", "roi", "scales"], ["r"], mode="nearest"),
             node("Resize", ["d2", "roi", "", "sizes"], ["r2"], mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    check(make(nodes, {"x": [1, 8, 3, 4]}, ["r", "r2"], inits))


def test_upsample_opset9():
    nodes = [node("Upsample", ["x", "scales"], ["y"], mode="nearest")]
    check(make(nodes, {"x": [1, 2, 3, 4]}, ["y"], {"scales": np.array([1, 1, 2, 3], np.float32)},
               opset=9))


def test_expand_tile_gather_on_activations():
    inits = {"shape": np.array([2, 3, 4, 5], np.int64), "reps": np.array([1, 1, 2, 1], np.int64),
             "idx": np.array([2, 0, -1], np.int64)}
    nodes = [node("Expand", ["x", "shape"], ["e"]), node("Tile", ["e", "reps"], ["t"]),
             node("Gather", ["t", "idx"], ["y"], axis=3)]
    check(make(nodes, {"x": [1, 3, 1, 5]}, ["y"], inits))


@pytest.mark.parametrize("opset,ratio_input", [(9, False), (13, True)])
def test_dropout_removed(opset, ratio_input):
    if ratio_input:
        inits = {"ratio": np.array(0.3, np.float32)}
        d = node("Dropout", ["c", "ratio"], ["d"])
    else:
        inits, d = {}, node("Dropout", ["c"], ["d"], ratio=0.3)
    nodes = [node("Conv", ["x", "w"], ["c"]), d, node("Relu", ["d"], ["y"])]
    graph = check(make(nodes, {"x": [1, 3, 4, 4]}, ["y"], {"w": rand(2, 3, 1, 1), **inits},
                       opset=opset))
    assert ops(graph) == ["INPUT", "CONV"]


def test_constant_folding_of_shape_arithmetic():
    """Constant, ConstantOfShape, Range, Cast, Div, Slice, Concat on shapes: all folded away."""
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes = [node("Shape", ["x"], ["s"]), node("Constant", [], ["two"], value_ints=[2]),
             node("Slice", ["s", "z1", "two"], ["nc"]),
             node("ConstantOfShape", ["two"], ["ones"], value=one),
             node("Range", ["z0", "ten", "three"], ["r"]),
             node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             node("Div", ["s", "ones4"], ["s2"]), node("Mul", ["s2", "ones4"], ["s3"]),
             node("Slice", ["s3", "two", "four"], ["hw"]),
             node("ReduceProd", ["hw"], ["p"], keepdims=1),
             node("Concat", ["nc", "p"], ["shape3"], axis=0),
             node("Reshape", ["x", "shape3"], ["y3"]), node("Relu", ["y3"], ["y"])]
    inits = {"z1": np.array([0], np.int64), "z0": np.array(0, np.int64),
             "ten": np.array(10, np.int64), "three": np.array(3, np.int64),
             "ones4": np.ones(4, np.int64), "four": np.array([4], np.int64)}
    graph = check(make(nodes, {"x": [2, 3, 4, 5]}, ["y"], inits))
    # (2, 3, 20) is stored like (2, 3, 4, 5): the activation reads the input's storage as is
    assert ops(graph) == ["INPUT", "AFFINE"] and graph.layers[1].onnx_shape == (2, 3, 20)


def test_views_with_different_fills_and_a_gemm_on_a_transposed_input():
    inits = {"p1": np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64), "v1": np.array(1.5, np.float32),
             "p2": np.array([0, 0, 0, 1, 0, 0, 1, 0], np.int64),
             "w": rand(12, 4, seed=1)}
    nodes = [node("Pad", ["x", "p1", "v1"], ["a"]), node("Pad", ["x", "p2"], ["b"]),
             node("Concat", ["a", "b"], ["c"], axis=3),
             node("Pad", ["a", "p2"], ["d"]),  # zeros around a view filled with 1.5
             node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             node("Reshape", ["t", "shape"], ["f"]), node("MatMul", ["f", "w"], ["m"])]
    inits["shape"] = np.array([8, 3], np.int64)
    inits["w"] = rand(3, 4, seed=1)
    check(make(nodes, {"x": [2, 3, 2, 2]}, ["c", "d", "m"], inits))


def test_batchnorm_opset7_spatial_attribute():
    model = make([bn_node("x", "y", spatial=1, epsilon=1e-4, momentum=0.9)], {"x": [2, 4, 3, 3]},
                 ["y"], bn_inits(4), opset=7)
    graph = check(model)
    assert ops(graph) == ["INPUT", "AFFINE"]


def test_input_shapes_override_a_static_shape():
    model = make([node("Relu", ["x"], ["y"])], {"x": [1, 3, 4, 4]}, ["y"])
    graph = import_model(model, input_shapes={"x": (2, 3, 5, 4)})
    assert graph.layers[0].onnx_shape == (2, 3, 5, 4)
    x = rand(2, 3, 5, 4)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], np.maximum(x, 0))


UNSUPPORTED_FORMS = {
    "maxpool_indices": ([node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2])],
                        ["y", "idx"], {}),
    "conv_computed_weights": ([node("Conv", ["x", "x"], ["y"])], ["y"], {}),
    "matmul_batched_constant": ([node("MatMul", ["x", "m"], ["y"])], ["y"],
                                {"m": rand(3, 4, 5, seed=1)}),
    "prelu_per_channel": ([node("PRelu", ["x", "s"], ["y"])], ["y"],
                          {"s": rand(3, 1, 1, seed=1)}),
    "resize_linear": ([node("Resize", ["x", "", "sc"], ["y"], mode="linear")], ["y"],
                      {"sc": np.array([1, 1, 2, 2], np.float32)}),
    "custom_domain": ([helper.make_node("Foo", ["x"], ["y"], name="Foo_y", domain="com.example")],
                      ["y"], {}),
    "sin_of_activation": ([node("Sin", ["x"], ["y"])], ["y"], {}),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED_FORMS))
def test_unsupported_forms(case):
    nodes, outputs, inits = UNSUPPORTED_FORMS[case]
    model = make(nodes, {"x": [1, 3, 4, 4]}, outputs, inits)
    with pytest.raises(UnsupportedOperatorError) as e:
        import_model(model)
    assert e.value.nodes == [(nodes[0].name, nodes[0].op_type)]


def test_opset_too_old():
    model = make([node("Relu", ["x"], ["y"])], {"x": [1, 3]}, ["y"], opset=6)
    with pytest.raises(UnsupportedOperatorError, match="opset 6"):
        import_model(model)


# ---------------------------------------------------------------------------- graph structure

def test_value_with_two_consumers_that_is_also_an_output():
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]),
             node("Sigmoid", ["c"], ["s"])]
    graph = check(make(nodes, {"x": [1, 3, 4, 4]}, ["c", "r", "s"], {"w": rand(3, 3, 1, 1)}))
    assert ops(graph) == ["INPUT", "CONV", "AFFINE", "AFFINE"]


def test_outputs_that_are_inputs_or_share_a_layer():
    nodes = [node("Identity", ["x"], ["i"]), node("Relu", ["x"], ["r"]),
             node("Identity", ["r"], ["r2"]), node("Flatten", ["g"], ["f"]),
             node("GlobalMaxPool", ["x"], ["g"])]
    graph = check(make(nodes, {"x": [2, 3, 4, 4]}, ["x", "i", "r", "r2", "g", "f"]))
    assert graph.outputs["x"] == graph.outputs["i"] == graph.inputs["x"]
    assert graph.outputs["r"] == graph.outputs["r2"]
    assert graph.layers[graph.outputs["f"]].onnx_shape == (2, 3)
    assert graph.layers[graph.outputs["g"]].onnx_shape == (2, 3, 1, 1)


def test_dead_nodes_are_dropped_even_if_unsupported():
    nodes = [node("Relu", ["x"], ["y"]), node("Erf", ["x"], ["dead"]),
             node("Conv", ["x", "w"], ["dead2"])]
    graph = check(make(nodes, {"x": [1, 3, 4, 4]}, ["y"], {"w": rand(2, 3, 1, 1)}))
    assert ops(graph) == ["INPUT", "AFFINE"]


def test_initializers_listed_as_inputs_are_constants():
    model = make([node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 4, 4]}, ["y"],
                 {"w": rand(2, 3, 1, 1)})
    model.graph.input.append(helper.make_tensor_value_info("w", F, [2, 3, 1, 1]))
    graph = check(model, {"x": rand(1, 3, 4, 4)})
    assert list(graph.inputs) == ["x"]


def test_layer_names_and_shapes():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="/features/conv"),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = import_model(make(nodes, {"x": [1, 3, 4, 4]}, ["y"], {"w": rand(2, 3, 1, 1)}))
    assert [layer.name for layer in graph.layers] == ["x", "/features/conv"]
    assert all(layer.onnx_shape is not None for layer in graph.layers)


def test_a_view_above_the_highest_rank_as_output_is_refused():
    nodes = [node("Reshape", ["x", "s"], ["y"])]
    shape = [1, 2, 3, 2, 2] + [1] * (ir.MAX_RANK - 4)
    model = make(nodes, {"x": [1, 6, 2, 2]}, ["y"], {"s": np.array(shape, np.int64)})
    with pytest.raises(UnsupportedOperatorError, match=f"rank {ir.MAX_RANK + 1}"):
        import_model(model)


# ------------------------------------------------------------------------------------ model files

def test_external_data(tmp_path):
    inits = {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2)}
    model = make([node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": [1, 3, 6, 6]},
                 ["y"], inits)
    feeds = {"x": rand(1, 3, 6, 6)}
    expected = onnxruntime_run(model, feeds)["y"]
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.data", size_threshold=0)
    assert (tmp_path / "model.data").exists() and path.stat().st_size < 1000
    graph = import_model(path)
    got = run_reference(graph, feeds)["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert graph.model_hash == import_model(load_model(path)[1]).model_hash

    # a truncated data file is a ModelError that says what to do
    data = (tmp_path / "model.data").read_bytes()
    (tmp_path / "model.data").write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelError, match="external data"):
        import_model(path)


def test_path_bytes_and_proto_agree(tmp_path):
    model = make([node("Relu", ["x"], ["y"])], {"x": [1, 3, 4, 4]}, ["y"])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    hashes = {import_model(m).model_hash for m in (path, str(path), path.read_bytes())}
    assert len(hashes) == 1 and len(hashes.pop()) == 64
    proto, data = load_model(model)
    assert isinstance(proto, onnx.ModelProto) and data == model.SerializeToString()


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        import_model(tmp_path / "nope.onnx")


def test_truncated_file(tmp_path):
    model = make([node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 4, 4]}, ["y"],
                 {"w": rand(16, 3, 3, 3)})
    data = model.SerializeToString()
    path = tmp_path / "t.onnx"
    for cut in (len(data) // 3, len(data) - 7, 10):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError):
            import_model(path)


def test_random_bytes(tmp_path):
    path = tmp_path / "r.onnx"
    for seed in range(5):
        path.write_bytes(np.random.default_rng(seed).bytes(1000))
        with pytest.raises(ModelError):
            import_model(path)
    with pytest.raises(ModelError):
        import_model(b"")


# ------------------------------------------------------------------------------ unsupported forms

def test_every_unsupported_node_is_listed():
    nodes = [node("Cos", ["x"], ["a"], name="cos1"), node("Relu", ["a"], ["b"]),
             node("Sin", ["b"], ["c"], name="sin1"), node("Conv", ["x", "w3"], ["d"], name="c3d"),
             node("Acos", ["f"], ["e"], name="acos1"),
             node("Flatten", ["x"], ["f"]), node("Hardmax", ["x"], ["s"], axis=-1, name="hm"),
             node("Add", ["c", "x"], ["y"])]
    inits = {"w3": rand(2, 3, 1, 1, 1, 1)}  # a 4-D convolution
    model = make(nodes, {"x": [1, 3, 4, 4]}, ["y", "d", "e", "s"], inits)
    with pytest.raises(UnsupportedOperatorError) as e:
        import_model(model)
    assert e.value.nodes == [("cos1", "Cos"), ("sin1", "Sin"), ("c3d", "Conv"),
                             ("acos1", "Acos"), ("hm", "Hardmax")]
    for name in ("cos1", "sin1", "c3d", "acos1", "hm"):
        assert name in str(e.value)


def test_two_unsupported_nodes():
    nodes = [node("Cos", ["x"], ["a"], name="first"), node("Relu", ["x"], ["r"]),
             node("Einsum", ["r"], ["b"], name="second", equation="ij->ji")]
    model = make(nodes, {"x": [3, 4]}, ["a", "b"])
    with pytest.raises(UnsupportedOperatorError) as e:
        import_model(model)
    assert e.value.nodes == [("first", "Cos"), ("second", "Einsum")]
    assert "first" in str(e.value) and "second" in str(e.value)


def test_bfloat16_input_is_unsupported():
    model = make([node("Cast", ["x"], ["y"], to=F)], {"x": [2, 3]}, ["y"],
                 dtype=TensorProto.BFLOAT16)
    with pytest.raises(UnsupportedOperatorError, match="BFLOAT16; coacto runs float and") as e:
        import_model(model)
    assert e.value.nodes == [("x", "Input")]


def test_dynamic_batch_needs_input_shapes():
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Flatten", ["c"], ["f"]),
             node("Gemm", ["f", "g"], ["y"])]
    model = make(nodes, {"x": ["batch", 3, 4, 4]}, ["y"],
                 {"w": rand(2, 3, 3, 3, seed=1), "g": rand(32, 5, seed=2)})
    with pytest.raises(ShapeError, match=r"'x'.*dimension 0.*input_shapes=\{'x': \(1, 3, 4, 4\)\}"):
        import_model(model)
    graph = check(model, input_shapes={"x": (3, 3, 4, 4)})
    assert graph.layers[graph.inputs["x"]].onnx_shape == (3, 3, 4, 4)
    with pytest.raises(ShapeError):
        import_model(model, input_shapes={"x": (3, 3, 4)})
    with pytest.raises(ShapeError, match="not inputs"):
        import_model(model, input_shapes={"y": (3, 3, 4, 4)})


# ------------------------------------------------------------------------------------ zoo models

def _zoo_cases():
    from coacto import zoo

    cases = []
    for name in zoo.MODELS:
        if name in zoo.TRANSFORMERS:
            continue  # tests/test_transformers.py
        for style in zoo.STYLES[name]:
            if name in ("resnet50", "vgg16") and style != "default":
                continue  # their other styles are the same code paths as resnet18's
            cases.append((name, style))
    return cases


@pytest.mark.parametrize("name,style", _zoo_cases())
def test_zoo_model_reference_matches_onnxruntime(name, style):
    from coacto import zoo
    from conftest import zoo_model

    model = zoo_model(name) if style == "default" else \
        zoo.build(name, style=style, image_size=32 if name.startswith("resnet") else None)
    feeds = zoo.input_feeds(model, seed=3)
    graph = check(model, feeds)
    assert "INPUT" == graph.layers[0].op and graph.model_hash
