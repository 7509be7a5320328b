"""Operators beyond the zoo's, as PyTorch's and TensorFlow's exporters emit them (opsets 17 and 18,
weights as initializers, node names like "/act/Elu"): the native runtime at 1, 3 and the default
tiles per layer, 1 and 2 threads, and the numpy reference, each against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import ir
from coacto.frontend import import_model
from coacto.reference import run_reference
from test_import import make as _make
from test_import import onnxruntime_run

F = TensorProto.FLOAT
TILES = (1, 3, None)
THREADS = (1, 2)


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make(nodes, inputs, outputs, inits=None, opset=17):
    """test_import's model builder at the opset PyTorch 2 exports by default."""
    return _make(nodes, inputs, outputs, inits, opset=opset)


def max_error(got: dict, ref: dict) -> float:
    """The largest |got - ref| relative to max |ref| over the finite values of the outputs;
    shapes, and where the reference is infinite or NaN, must agree exactly."""
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    worst = 0.0
    for k in ref:
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        finite = np.isfinite(ref[k])
        assert np.array_equal(got[k][~finite], ref[k][~finite], equal_nan=True), k
        g, r = got[k][finite].astype(np.float64), ref[k][finite]
        if r.size:
            scale = max(float(np.abs(r).max()), 1e-30)
            worst = max(worst, float(np.abs(g - r).max()) / scale)
    return worst


def check(model, feeds, rel=2e-6, tiles=TILES, threads=THREADS):
    """The reference and the native runtime (every tile and thread count) equal onnxruntime
    within ``rel`` * max |onnxruntime|; returns the imported graph."""
    ref = onnxruntime_run(model, feeds)
    graph = import_model(model)
    err = max_error(run_reference(graph, feeds), ref)
    assert err <= rel, f"reference: max |error| {err:.3g} * max |ref| > {rel}"
    for t in tiles:
        tg = coacto.compile(model, tiles_per_layer=t)
        for th in threads:
            with coacto.Runtime(tg, threads=th) as rt:
                err = max_error(rt.run(feeds, timeout=60), ref)
            assert err <= rel, f"tiles={t} threads={th}: max |error| {err:.3g} * max |ref| > {rel}"
    return graph


def ops(graph):
    return [layer.op for layer in graph.layers]


# --------------------------------------------------------------------------------- activations

# (op type, attributes, the IR activation): the defaults of the ONNX spec, then other values
ACTIVATIONS = [
    ("Elu", {}, ir.ACT_ELU),
    ("Elu", {"alpha": 0.3}, ir.ACT_ELU),
    ("Selu", {}, ir.ACT_SELU),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}, ir.ACT_SELU),
    ("Celu", {}, ir.ACT_CELU),
    ("Celu", {"alpha": 0.4}, ir.ACT_CELU),
    ("Celu", {"alpha": -0.7}, ir.ACT_CELU),  # a negative alpha: e^(x/alpha) grows as x falls
    ("Softplus", {}, ir.ACT_SOFTPLUS),
    ("Softsign", {}, ir.ACT_SOFTSIGN),
    ("ThresholdedRelu", {}, ir.ACT_THRESHOLDED_RELU),
    ("ThresholdedRelu", {"alpha": -0.25}, ir.ACT_THRESHOLDED_RELU),
]
ACT_IDS = [f"{op}-{'-'.join(f'{k}{v}' for k, v in attrs.items()) or 'default'}"
           for op, attrs, _ in ACTIVATIONS]


@pytest.mark.parametrize("op,attrs,act", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 5, 11, 6)])
def test_activation_after_conv(op, attrs, act, shape):
    """Conv -> activation: the activation fuses into the convolution's epilogue."""
    n, c, h, w = shape
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                              name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["/conv/Conv_output_0"], ["y"], name=f"/act/{op}", **attrs)]
    model = make(nodes, {"x": list(shape)}, ["y"],
                 {"conv.weight": rand(13, c, 3, 3, seed=1, scale=0.5),
                  "conv.bias": rand(13, seed=2)})
    # the convolution's sums round differently from onnxruntime's: a looser bound than alone
    graph = check(model, {"x": rand(*shape, seed=3, scale=3.0)}, rel=1e-5)
    assert ops(graph) == ["INPUT", "CONV"]
    assert graph.layers[1].attrs["act"] == act


@pytest.mark.parametrize("op,attrs,act", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("shape", [(2, 7, 13), (1, 37)])
def test_activation_standalone(op, attrs, act, shape):
    """An activation of a graph input (an AFFINE layer), over values from -30 to 30 so that the
    saturated ends of e^x are reached too."""
    model = make([helper.make_node(op, ["x"], ["y"], name=f"/act/{op}", **attrs)],
                 {"x": list(shape)}, ["y"], opset=18)
    x = rand(*shape, seed=4, scale=3.0)
    x.reshape(-1)[:4] = [-30.0, 30.0, 0.0, -1e-3]
    graph = check(model, {"x": x})
    assert ops(graph) == ["INPUT", "AFFINE"]
    assert graph.layers[1].attrs["act"] == act


def test_activation_in_a_sequence_model():
    """Softplus between two matrix products with weights, on (B, S, D) activations."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["/fc1/MatMul_output_0"], name="/fc1/MatMul"),
             helper.make_node("Softplus", ["/fc1/MatMul_output_0"], ["/act/Softplus_output_0"],
                              name="/act/Softplus"),
             helper.make_node("MatMul", ["/act/Softplus_output_0", "w2"], ["y"],
                              name="/fc2/MatMul")]
    model = make(nodes, {"x": [2, 9, 17]}, ["y"],
                 {"w1": rand(17, 23, seed=5, scale=0.5), "w2": rand(23, 11, seed=6, scale=0.3)})
    check(model, {"x": rand(2, 9, 17, seed=7)}, rel=1e-5)


def test_celu_alpha_zero_is_refused():
    model = make([helper.make_node("Celu", ["x"], ["y"], alpha=0.0)], {"x": [1, 4]}, ["y"])
    with pytest.raises(coacto.CoactoError, match="alpha 0"):
        import_model(model)


# ------------------------------------------------------------------ element-wise unary functions

UNARY = [("Abs", ir.ACT_ABS), ("Floor", ir.ACT_FLOOR), ("Ceil", ir.ACT_CEIL),
         ("Round", ir.ACT_ROUND), ("Sign", ir.ACT_SIGN), ("Log", ir.ACT_LOG)]


def quarters(*shape, seed):
    """Multiples of 1/4 in [-4, 4]: sums of their products with small integers are exact in
    float32, so Floor, Round and Sign of a convolution see the values onnxruntime sees."""
    return (np.random.default_rng(seed).integers(-16, 17, shape) / 4).astype(np.float32)


def _conv_then(op, c):
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                              name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["/conv/Conv_output_0"], ["y"], name=f"/act/{op}")]
    weight = np.random.default_rng(1).integers(-1, 2, (13, c, 3, 3)).astype(np.float32)
    return nodes, {"conv.weight": weight, "conv.bias": quarters(13, seed=2)}


@pytest.mark.parametrize("op,act", UNARY, ids=[op for op, _ in UNARY])
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 5, 11, 6)])
def test_unary_after_conv(op, act, shape):
    """Conv -> Floor (etc.): the function fuses into the convolution's epilogue. Integer weights
    and quarter inputs make the sums exact: Round meets exact halves, Sign exact zeros, Log
    exact zeros (-inf) and negatives (NaN)."""
    feeds = {"x": quarters(*shape, seed=3)}
    conv = onnxruntime_run(make(*_conv_then("Identity", shape[1])[:1], {"x": list(shape)}, ["y"],
                                _conv_then("Identity", shape[1])[1]), feeds)["y"]
    assert np.any(conv == 0.0) and np.any(np.abs(conv % 1) == 0.5)  # the edges are reached
    nodes, inits = _conv_then(op, shape[1])
    graph = check(make(nodes, {"x": list(shape)}, ["y"], inits), feeds, rel=1e-6)
    assert ops(graph) == ["INPUT", "CONV"]
    assert graph.layers[1].attrs["act"] == act


# halves of both parities (Round to even), signed zeros, tiny values, both ends, NaN
EDGES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0, np.nan, 7.25]


@pytest.mark.parametrize("op,act", UNARY, ids=[op for op, _ in UNARY])
@pytest.mark.parametrize("shape", [(2, 7, 13), (1, 37), (2, 3, 5, 7)])
def test_unary_standalone(op, act, shape):
    """The function of a graph input (an AFFINE layer), with the edge values among normal ones;
    Log gives -inf at 0 and NaN below, as onnxruntime does."""
    model = make([helper.make_node(op, ["x"], ["y"], name=f"/act/{op}")],
                 {"x": list(shape)}, ["y"], opset=18)
    x = rand(*shape, seed=4, scale=3.0)
    x.reshape(-1)[:len(EDGES)] = EDGES
    graph = check(model, {"x": x})
    assert ops(graph) == ["INPUT", "AFFINE"]
    assert graph.layers[1].attrs["act"] == act


def test_unary_in_a_sequence_model():
    """log(|x W1| + 1) rounded, between matrix products on (B, S, D) activations."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["/fc1/MatMul_output_0"], name="/fc1/MatMul"),
             helper.make_node("Abs", ["/fc1/MatMul_output_0"], ["/Abs_output_0"], name="/Abs"),
             helper.make_node("Add", ["/Abs_output_0", "one"], ["/Add_output_0"], name="/Add"),
             helper.make_node("Log", ["/Add_output_0"], ["/Log_output_0"], name="/Log"),
             helper.make_node("Mul", ["/Log_output_0", "four"], ["/Mul_output_0"], name="/Mul"),
             helper.make_node("Round", ["/Mul_output_0"], ["/Round_output_0"], name="/Round"),
             helper.make_node("MatMul", ["/Round_output_0", "w2"], ["y"], name="/fc2/MatMul")]
    model = make(nodes, {"x": [2, 9, 17]}, ["y"],
                 {"w1": rand(17, 23, seed=5, scale=0.5), "w2": rand(23, 11, seed=6, scale=0.3),
                  "one": np.float32(1.0), "four": np.float32(4.0)})
    # the first product's sums round differently from onnxruntime's; a value that lands on the
    # other side of a half would change Round's result by 1: the data here has none that close
    check(model, {"x": rand(2, 9, 17, seed=7)}, rel=1e-5)


def test_floor_of_integers_can_index():
    """Abs and Floor of integers (an int64 input cast to float) keep the importer's integer
    kind: the Cast back to int64 is the identity and the result can index a Gather."""
    nodes = [helper.make_node("Cast", ["ids"], ["/Cast_output_0"], to=F, name="/Cast"),
             helper.make_node("Floor", ["/Cast_output_0"], ["/Floor_output_0"], name="/Floor"),
             helper.make_node("Abs", ["/Floor_output_0"], ["/Abs_output_0"], name="/Abs"),
             helper.make_node("Cast", ["/Abs_output_0"], ["/Cast_1_output_0"],
                              to=TensorProto.INT64, name="/Cast_1"),
             helper.make_node("Gather", ["table", "/Cast_1_output_0"], ["y"], name="/Gather")]
    graph = helper.make_graph(
        nodes, "torch_jit", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[numpy_helper.from_array(rand(7, 3, seed=12), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ids = np.array([[0, -3, 6, -6, 2], [5, -1, 1, 0, 4]], np.int64)
    check(model, {"ids": ids})


# ---------------------------------------------------------------------------------- reductions

def _reduce_model(op, shape, axis, keepdims, opset):
    """ReduceMean / ReduceSum / ReduceMax / ReduceMin over one axis: axes an attribute up to
    opset 17 (ReduceSum: 12), an input from opset 18 (ReduceSum: 13), as the exporters write
    them."""
    inits = {}
    if op == "ReduceSum" and opset >= 13 or opset >= 18:
        inits["/reduce/Constant_output_0"] = np.array([axis], np.int64)
        n = helper.make_node(op, ["x", "/reduce/Constant_output_0"], ["y"], name=f"/reduce/{op}",
                             keepdims=keepdims)
    else:
        n = helper.make_node(op, ["x"], ["y"], name=f"/reduce/{op}", axes=[axis],
                             keepdims=keepdims)
    return make([n], {"x": list(shape)}, ["y"], inits, opset=opset)


REDUCTIONS = [  # (shape, axis): every axis of ranks 2 to 4, negative axes, odd sizes
    ((2, 5, 7, 9), 0), ((2, 5, 7, 9), 1), ((1, 5, 7, 9), 2), ((2, 5, 7, 9), -1),
    ((2, 3, 11, 1), 2), ((2, 9, 13), 1), ((1, 9, 13), -3), ((3, 9, 13), 2), ((7, 13), 0),
    ((7, 13), -1),
]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape,axis", REDUCTIONS, ids=[f"{s}-{a}" for s, a in REDUCTIONS])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_one_axis(op, shape, axis, keepdims, opset):
    model = _reduce_model(op, shape, axis, keepdims, opset)
    check(model, {"x": rand(*shape, seed=8)}, rel=1e-5)


def test_reduce_over_height_of_a_conv_output():
    """ReduceMean over H of a feature map (a pooling over rows, as in CRNN text recognisers),
    then a Conv over the result: the reduction reads a computed layer."""
    nodes = [
        helper.make_node("Conv", ["x", "c1.weight"], ["/c1/Conv_output_0"], name="/c1/Conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["/c1/Conv_output_0", "axes"], ["/ReduceMean_output_0"],
                         name="/ReduceMean", keepdims=1),
        helper.make_node("Relu", ["/ReduceMean_output_0"], ["y"], name="/act/Relu")]
    model = make(nodes, {"x": [2, 3, 10, 13]}, ["y"],
                 {"c1.weight": rand(6, 3, 3, 3, seed=9), "axes": np.array([2], np.int64)},
                 opset=18)
    check(model, {"x": rand(2, 3, 10, 13, seed=10)}, rel=1e-5)


def test_reduce_min_with_nans_and_over_two_axes():
    x = rand(2, 5, 7, seed=13)
    x[0, 1, 3] = np.nan
    check(_reduce_model("ReduceMin", (2, 5, 7), -1, 1, 18), {"x": x}, rel=0.0)
    n = helper.make_node("ReduceMin", ["x"], ["y"], name="/reduce/ReduceMin", axes=[2, 3])
    check(make([n], {"x": [1, 3, 4, 5]}, ["y"], opset=13), {"x": rand(1, 3, 4, 5)}, rel=0.0)


MULTI_AXES = [  # (shape, axes, keepdims): every axis, pairs apart, the batch with others
    ((2, 5, 7, 9), None, 0), ((2, 5, 7, 9), [0, 2], 1), ((2, 5, 7, 9), [1, 3], 0),
    ((2, 5, 7, 9), [0, 1, 2], 1), ((3, 9, 13), [0, 2], 0), ((7, 13), [0, 1], 1), ((11,), [0], 0),
]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape,axes,keepdims", MULTI_AXES)
def test_reduce_over_several_axes_and_to_a_scalar(op, shape, axes, keepdims):
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    n = helper.make_node(op, ["x"] + list(inits), ["y"], keepdims=keepdims)
    model = make([n], {"x": list(shape)}, ["y"], inits, opset=18)
    check(model, {"x": rand(*shape, seed=14)}, rel=1e-5, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("shape,axis,opset", [((2, 5, 7, 9), 2, 13), ((2, 5, 7, 9), 0, 13),
                                              ((3, 9, 13), 1, 13), ((2, 5, 7, 9), 1, 11),
                                              ((2, 5, 7, 9), 2, 11)])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_along_a_middle_axis_and_over_trailing_axes(op, shape, axis, opset):
    """Softmax over H of a feature map (opset 13), and before opset 13 over every axis from
    ``axis`` on (the input coerced to 2-D)."""
    n = helper.make_node(op, ["x"], ["s"], axis=axis)
    model = make([n, helper.make_node("Relu", ["s"], ["y"])], {"x": list(shape)}, ["y"],
                 opset=opset)
    check(model, {"x": rand(*shape, seed=15)}, rel=1e-5, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("shape,axis,opset", [((3, 2), 0, 13), ((3, 1), 0, 11), ((1, 3), 0, 13)])
def test_softmax_along_the_first_of_two_axes(shape, axis, opset):
    model = make([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {"x": list(shape)},
                 ["y"], opset=opset)
    check(model, {"x": rand(*shape, seed=19)}, rel=1e-5, tiles=(1, None), threads=(2,))


def test_a_ceil_mode_window_longer_than_the_input_is_refused_at_import():
    n = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[3, 3],
                         ceil_mode=1)
    with pytest.raises(coacto.UnsupportedOperatorError, match="longer than the input"):
        coacto.compile(make([n], {"x": [1, 1, 2, 2]}, ["y"]))


@pytest.mark.parametrize("axis,scale_shape", [(1, (5, 7, 9)), (2, (7, 9)), (1, (1, 1, 9)),
                                              (-3, (5, 1, 1)), (2, (1, 1, 9))])
def test_layer_norm_over_several_trailing_axes(axis, scale_shape):
    """nn.LayerNorm([C, H, W]) on a feature map, as exporters write it (opset 17), and scales
    that broadcast over some of the normalised axes."""
    n = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis, epsilon=1e-5)
    inits = {"g": 1 + rand(*scale_shape, seed=16, scale=0.1), "b": rand(*scale_shape, seed=17)}
    model = make([n], {"x": [2, 5, 7, 9]}, ["y"], inits)
    check(model, {"x": rand(2, 5, 7, 9, seed=18)}, rel=1e-5, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("scale_shape", [(9, 7), (63,)])
def test_layer_norm_scales_that_do_not_broadcast_are_refused(scale_shape):
    n = helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=2)
    model = make([n], {"x": [2, 5, 7, 9]}, ["y"], {"g": rand(*scale_shape)})
    with pytest.raises(coacto.ShapeError, match="the scale input of shape"):
        import_model(model)


def test_reduce_over_axes_of_size_one_is_the_input():
    model = _reduce_model("ReduceMean", (2, 1, 5), 1, 0, 18)
    graph = check(model, {"x": rand(2, 1, 5, seed=11)})
    assert ops(graph) == ["INPUT", "GATHER"]  # the copy every graph output that is an input gets


# ------------------------------------------------------------------------ Gemm of activations

GEMMS = [  # (M, K, N, transA, transB, alpha, beta, C: None, "row", "full", "scalar" or "act")
    (1, 7, 5, 0, 0, 1.0, 1.0, None),
    (2, 13, 9, 0, 1, 1.0, 1.0, "row"),
    (5, 8, 11, 1, 0, 0.5, 1.0, "full"),
    (7, 3, 6, 1, 1, -1.25, 0.75, "scalar"),
    (3, 17, 4, 0, 1, 2.0, -0.5, "act"),
]


def _c_value(kind, m, n):
    return {"row": rand(n, seed=12), "full": rand(m, n, seed=12), "scalar": rand(1, seed=12),
            "act": None, None: None}[kind]


@pytest.mark.parametrize("m,k,n,ta,tb,alpha,beta,ckind", GEMMS,
                         ids=[f"{g[0]}x{g[1]}x{g[2]}-tA{g[3]}-tB{g[4]}-C{g[7]}" for g in GEMMS])
def test_gemm_with_computed_b(m, k, n, ta, tb, alpha, beta, ckind):
    """Gemm whose B is an activation: a Relu of a second input (so B is a computed layer)."""
    sa = [k, m] if ta else [m, k]
    sb = [n, k] if tb else [k, n]
    inputs = {"a": sa, "b": sb}
    inits = {}
    ins = ["a", "/act/Relu_output_0"]
    if ckind == "act":
        inputs["c"] = [m, n]
        ins.append("c")
    elif ckind is not None:
        inits["fc.bias"] = _c_value(ckind, m, n)
        ins.append("fc.bias")
    nodes = [helper.make_node("Relu", ["b"], ["/act/Relu_output_0"], name="/act/Relu"),
             helper.make_node("Gemm", ins, ["y"], name="/fc/Gemm", alpha=alpha, beta=beta,
                              transA=ta, transB=tb)]
    model = make(nodes, inputs, ["y"], inits)
    feeds = {name: rand(*shape, seed=13 + i) for i, (name, shape) in enumerate(inputs.items())}
    graph = check(model, feeds, rel=1e-5)
    assert "MATMUL" in ops(graph)


def test_gemm_with_constant_a_and_computed_b():
    nodes = [helper.make_node("Sigmoid", ["b"], ["/Sigmoid_output_0"], name="/Sigmoid"),
             helper.make_node("Gemm", ["w", "/Sigmoid_output_0", "bias"], ["y"], name="/Gemm",
                              alpha=0.5, transA=1)]
    model = make(nodes, {"b": [6, 5]}, ["y"],
                 {"w": rand(6, 4, seed=14), "bias": rand(4, 5, seed=15)})
    check(model, {"b": rand(6, 5, seed=16)}, rel=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_gemm_with_weights_and_transposed_a(batch):
    """transA with constant B (it was refused): A's transpose is a view read by the CONV."""
    nodes = [helper.make_node("Gemm", ["a", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm",
                              transA=1, transB=1)]
    model = make(nodes, {"a": [10, batch]}, ["y"],
                 {"fc.weight": rand(7, 10, seed=17), "fc.bias": rand(7, seed=18)})
    check(model, {"a": rand(10, batch, seed=19)}, rel=1e-5)


# ------------------------------------------------------------------------------ ConvTranspose

CONV_TRANSPOSES = [  # (input shape, C_out, kernel, strides, pads, output_padding, bias)
    ((1, 3, 5, 7), 4, (3, 3), (1, 1), (0, 0, 0, 0), (0, 0), True),
    ((2, 4, 6, 5), 3, (4, 4), (2, 2), (1, 1, 1, 1), (0, 0), True),  # DCGAN / U-Net upsampling
    ((1, 5, 7, 6), 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 2, 4, 9), 5, (2, 3), (2, 3), (0, 1, 0, 2), (1, 2), True),
    ((1, 3, 3, 4), 2, (5, 3), (3, 1), (4, 2, 3, 0), (0, 0), True),  # pads beyond k - 1: a crop
    ((1, 16, 9, 9), 8, (2, 2), (2, 2), (0, 0, 0, 0), (0, 0), True),
]


@pytest.mark.parametrize("shape,m,k,s,p,op,bias", CONV_TRANSPOSES,
                         ids=[f"{c[0]}-k{c[2]}-s{c[3]}-p{c[4]}-op{c[5]}" for c in CONV_TRANSPOSES])
def test_conv_transpose(shape, m, k, s, p, op, bias):
    c = shape[1]
    inits = {"up.weight": rand(c, m, *k, seed=20, scale=0.5)}
    ins = ["/act/Relu_output_0", "up.weight"]
    if bias:
        inits["up.bias"] = rand(m, seed=21)
        ins.append("up.bias")
    nodes = [helper.make_node("Relu", ["x"], ["/act/Relu_output_0"], name="/act/Relu"),
             helper.make_node("ConvTranspose", ins, ["y"], name="/up/ConvTranspose",
                              kernel_shape=list(k), strides=list(s), pads=list(p),
                              output_padding=list(op), dilations=[1, 1], group=1)]
    model = make(nodes, {"x": list(shape)}, ["y"], inits)
    graph = check(model, {"x": rand(*shape, seed=22)}, rel=1e-5)
    assert ops(graph)[-2:] == ["GATHER", "CONV"]


def test_conv_transpose_with_groups_is_refused():
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2, kernel_shape=[3, 3])]
    model = make(nodes, {"x": [1, 4, 5, 5]}, ["y"], {"w": rand(4, 2, 3, 3)})
    with pytest.raises(coacto.CoactoError, match="ConvTranspose with groups"):
        import_model(model)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_modes_against_onnx_reference(mode):
    """SpaceToDepth's mode (opset 28; DCR before): the block offset or the channel outermost."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode=mode)
    g = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 28)])
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 6)).astype(np.float32)
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = coacto.Runtime(coacto.compile(m.SerializeToString()), threads=1).run({"x": x})["z"]
    np.testing.assert_array_equal(got, ref)


def test_castlike_to_the_type_of_an_activation_is_read_as_exporters_write_it():
    """CastLike(alpha, x), as the expanded forms of activations write their constants: cast to
    x's float32, then used against x; against onnxruntime."""
    import onnxruntime as ort

    alpha = numpy_helper.from_array(np.array(0.25, np.float64), "alpha")
    nodes = [helper.make_node("CastLike", ["alpha", "x"], ["a32"], name="/act/CastLike"),
             helper.make_node("Mul", ["x", "a32"], ["ax"], name="/act/Mul"),
             helper.make_node("Max", ["x", "ax"], ["y"], name="/act/Max")]
    g = helper.make_graph(nodes, "leaky", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [2, 5, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [alpha])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    x = np.random.default_rng(2).standard_normal((2, 5, 7)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = coacto.Runtime(coacto.compile(data), threads=1).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ comparisons and bool logic


@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual", "Greater", "Less", "Equal"])
def test_comparisons_of_computed_values_with_nans_and_ties(op):
    """x OP y, both computed, as a float mask (Where), with ties and NaNs: an ordered comparison
    is false where either side is NaN (GreaterOrEqual is not 1 - Less)."""
    x = rand(1, 3, 8, seed=1).round(0)
    y = rand(1, 3, 8, seed=2).round(0)  # rounded: many ties
    x[0, 0, :3] = np.nan
    y[0, 1, 2] = np.nan
    nodes = [helper.make_node("Relu", ["x"], ["rx"], name="/rx/Relu"),
             helper.make_node("Add", ["x", "rx"], ["a"], name="/a/Add"),
             helper.make_node(op, ["a", "y"], ["m"], name=f"/m/{op}"),
             helper.make_node("Where", ["m", "one", "zero"], ["out"], name="/Where")]
    model = make(nodes, {"x": [1, 3, 8], "y": [1, 3, 8]}, ["out"],
                 {"one": np.ones(1, np.float32), "zero": np.zeros(1, np.float32)})
    check(model, {"x": x, "y": y}, rel=0.0)


@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual"])
def test_ordered_comparison_with_a_constant(op):
    x = rand(1, 4, 6, seed=3)
    nodes = [helper.make_node(op, ["x", "t"], ["m"], name=f"/m/{op}"),
             helper.make_node("Cast", ["m"], ["out"], to=F, name="/Cast")]
    model = make(nodes, {"x": [1, 4, 6]}, ["out"], {"t": np.array([0.25], np.float32)})
    check(model, {"x": x}, rel=0.0)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_bool_logic_of_computed_masks_as_an_attention_mask(op):
    """What exporters emit for masks: two comparisons combined, one with a constant mask, and
    the result selecting between the scores and a large negative, as attention does."""
    x = rand(1, 2, 4, 4, seed=4)
    const_mask = np.tril(np.ones((4, 4), bool)).reshape(1, 1, 4, 4)
    nodes = [helper.make_node("Greater", ["x", "lo"], ["p"], name="/p/Greater"),
             helper.make_node("Less", ["x", "hi"], ["q"], name="/q/Less"),
             helper.make_node(op, ["p", "q"], ["pq"], name=f"/pq/{op}"),
             helper.make_node(op, ["pq", "causal"], ["m"], name=f"/m/{op}"),
             helper.make_node("Where", ["m", "x", "neg"], ["out"], name="/Where")]
    model = make(nodes, {"x": [1, 2, 4, 4]}, ["out"],
                 {"lo": np.array([-0.5], np.float32), "hi": np.array([0.8], np.float32),
                  "causal": const_mask, "neg": np.array([-1e4], np.float32)})
    check(model, {"x": x}, rel=0.0)
