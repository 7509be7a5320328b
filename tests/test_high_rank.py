"""Tensors of rank 5 and 6 as exporters emit them: 3-D convolutions and pools of video and volume
models (PyTorch's Conv3d, BatchNorm3d, MaxPool3d, AvgPool3d, AdaptiveAvgPool3d), elementwise ops
broadcasting over the axes a layout stores as one, reductions and softmax along each axis, and
the rank-6 reshapes of pixel shuffles, each against onnxruntime (the native runtime at several
tile and thread counts, and the numpy reference)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import coacto
from coacto import ir
from coacto.frontend import import_model
from test_ops_more import check, make, ops, rand


X5 = (2, 3, 5, 6, 7)  # (N, C, D, H, W): no two axes of one size, so a mixed-up axis shows


# ------------------------------------------------------------------------------ layouts

@pytest.mark.parametrize("shape", [(2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6)])
@pytest.mark.parametrize("layout", [ir.LAYOUT_CHANNELS, ir.LAYOUT_LAST])
def test_high_rank_storage_round_trips_in_each_layout(shape, layout):
    x = rand(*shape)
    s4 = ir.internal_shape(shape, layout)
    storage = ir.to_storage(x, layout)
    assert np.array_equal(ir.from_storage(storage, s4, shape, layout), x)
    assert np.array_equal(x.reshape(-1)[ir.storage_order(shape, layout)],
                          np.asarray(storage).reshape(-1))
    assert np.array_equal(ir.internal_to_storage(ir.internal_array(x, layout)),
                          np.asarray(storage).reshape(-1))


def test_rank_beyond_the_limit_is_refused_with_the_limit_named():
    shape = (1,) * (ir.MAX_RANK + 1)
    model = make([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, ["y"])
    with pytest.raises(coacto.UnsupportedOperatorError, match=f"rank 0 to {ir.MAX_RANK}"):
        import_model(model)


def test_scalars_in_and_out():
    """Rank-0 tensors: a scalar input scaling a tensor, a dot product of vectors, scalars
    added, as exporters write a loss or a temperature."""
    nodes = [helper.make_node("Mul", ["x", "t"], ["xt"]),
             helper.make_node("MatMul", ["v", "v"], ["dot"]),
             helper.make_node("Add", ["t", "dot"], ["y"])]
    model = make(nodes, {"x": (3, 4), "t": (), "v": (5,)}, ["xt", "dot", "y"])
    feeds = {"x": rand(3, 4), "t": np.array(1.5, np.float32), "v": rand(5, seed=1)}
    check(model, feeds, rel=1e-5, tiles=(1, None), threads=(2,))
    with coacto.Runtime(coacto.compile(model)) as rt:
        assert [(a.name, a.shape) for a in rt.get_inputs()] == [("x", [3, 4]), ("t", []),
                                                                ("v", [5])]
        assert rt.run(feeds)["y"].shape == ()


# ------------------------------------------------------------------------------ elementwise

@pytest.mark.parametrize("kshape", [(1, 3, 1, 1, 1), (1, 1, 5, 1, 1), (1, 1, 1, 6, 1),
                                    (5, 1, 7), (2, 1, 5, 6, 1), (1, 3, 5, 1, 7)])
def test_elementwise_with_constants_broadcasting_on_any_axes(kshape):
    k = rand(*kshape, seed=3) + 2.0
    nodes = [helper.make_node("Mul", ["x", "k"], ["m"]),
             helper.make_node("Sub", ["k", "m"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make(nodes, {"x": X5}, ["y"], {"k": k})
    check(model, {"x": rand(*X5)}, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("bshape", [X5, (1, 1, 5, 1, 7), (2, 3, 1, 6, 1), (1, 3, 5, 6, 1),
                                    (6, 7)])
def test_elementwise_of_two_inputs_broadcasting_on_merged_axes(bshape):
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Greater", ["s", "b"], ["g"]),
             helper.make_node("Where", ["g", "s", "b"], ["y"])]
    model = make(nodes, {"a": X5, "b": bshape}, ["y"])
    check(model, {"a": rand(*X5), "b": rand(*bshape, seed=1)}, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("axis", [1, -1])
def test_softmax_along_the_channels_or_the_last_axis_of_rank_5(axis):
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=axis),
             helper.make_node("ReduceMax", ["s"], ["m"], axes=[axis], keepdims=1),
             helper.make_node("Sub", ["s", "m"], ["y"])]
    model = make(nodes, {"x": X5}, ["y"])
    check(model, {"x": rand(*X5)}, tiles=(1, None), threads=(2,))


@pytest.mark.parametrize("axes", [[1], [2], [3], [4], [2, 3, 4]])
def test_reductions_over_any_axes_of_rank_5(axes):
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=1),
             helper.make_node("ReduceSum", ["x", "ax"], ["z"], keepdims=0)]
    model = make(nodes, {"x": X5}, ["y", "z"], {"ax": np.array(axes, np.int64)})
    check(model, {"x": rand(*X5)}, tiles=(1, None), threads=(2,))


def test_views_of_rank_5_transpose_slice_concat_and_unsqueeze():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 4, 3]),
             helper.make_node("Slice", ["t", "st", "en", "ax"], ["sl"]),
             helper.make_node("Concat", ["sl", "sl"], ["c"], axis=2),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "u"], ["y"])]
    inits = {"st": np.array([1, 2], np.int64), "en": np.array([4, 6], np.int64),
             "ax": np.array([1, 4], np.int64), "u": np.array([2], np.int64)}
    model = make(nodes, {"x": X5}, ["y"], inits)
    check(model, {"x": rand(*X5)}, tiles=(1, None), threads=(2,))


def test_pixel_shuffle_through_rank_6_as_exporters_spell_it():
    """x.view(N, C, r, r, H, W).permute(0, 1, 4, 2, 5, 3).reshape(N, C, H * r, W * r): what
    einops-style code and older exporters emit for PixelShuffle."""
    n, c, r, h, w = 1, 4, 2, 5, 6
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"]),
             helper.make_node("Reshape", ["conv", "s6"], ["v6"]),
             helper.make_node("Transpose", ["v6"], ["t6"], perm=[0, 1, 4, 2, 5, 3]),
             helper.make_node("Sigmoid", ["t6"], ["a6"]),
             helper.make_node("Reshape", ["a6", "s4"], ["y"])]
    inits = {"w": rand(c * r * r, 3, 1, 1, seed=2), "s6": np.array([n, c, r, r, h, w], np.int64),
             "s4": np.array([n, c, h * r, w * r], np.int64)}
    model = make(nodes, {"x": (n, 3, h, w)}, ["y"], inits)
    check(model, {"x": rand(n, 3, h, w)}, tiles=(1, None), threads=(2,))


def test_matmul_with_weights_over_the_last_axis_of_rank_5():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    model = make(nodes, {"x": X5}, ["y"], {"w": rand(7, 4, seed=1), "b": rand(4, seed=2)})
    check(model, {"x": rand(*X5)}, tiles=(1, None), threads=(2,))


# ------------------------------------------------------------------------------ 3-D windows

CONV3D = [  # (kernel, attributes): PyTorch Conv3d's forms
    ((3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1])),
    ((1, 1, 1), {}),
    ((1, 3, 3), dict(pads=[0, 1, 1, 0, 1, 1], strides=[1, 2, 2])),  # (2+1)-D: spatial
    ((3, 1, 1), dict(pads=[1, 0, 0, 1, 0, 0])),                     # and temporal
    ((2, 3, 2), dict(strides=[2, 1, 2], dilations=[2, 1, 1], pads=[1, 0, 2, 0, 1, 1])),
    ((3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2, 2])),
]


@pytest.mark.parametrize("kernel,attrs", CONV3D)
@pytest.mark.parametrize("group", [1, 3])
def test_conv3d_equals_onnxruntime(kernel, attrs, group):
    m = 6
    w = rand(m, 3 // group, *kernel, seed=1, scale=0.3)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(kernel),
                            group=group, **attrs)
    model = make([node], {"x": X5}, ["y"], {"w": w, "b": rand(m, seed=2)})
    check(model, {"x": rand(*X5)}, rel=1e-5, tiles=(1, None), threads=(2,))


POOL3D = [  # (op, attributes)
    ("MaxPool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2])),
    ("MaxPool", dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 2, 2], dilations=[2, 1, 2], ceil_mode=1, strides=[2, 1, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], ceil_mode=1,
                         count_include_pad=1, pads=[1, 0, 0, 0, 1, 1])),
    ("AveragePool", dict(kernel_shape=[2, 2, 3], dilations=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 2, 2], dilations=[1, 2, 2], ceil_mode=1,
                         strides=[2, 2, 1])),
]


@pytest.mark.parametrize("attrs", [dict(dilations=[2, 2]),
                                   dict(dilations=[1, 2], pads=[1, 1, 0, 1], count_include_pad=1),
                                   dict(dilations=[2, 1], strides=[2, 2], ceil_mode=1)])
def test_average_pool_with_dilations_in_2d(attrs):
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], **attrs)
    # dilations of AveragePool came with opset 19
    check(make([node], {"x": (2, 3, 9, 8)}, ["y"], opset=19), {"x": rand(2, 3, 9, 8)}, rel=1e-5)


@pytest.mark.parametrize("op,attrs", POOL3D)
def test_pool3d_equals_onnxruntime(op, attrs):
    model = make([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": X5}, ["y"], opset=19)
    check(model, {"x": rand(*X5)}, rel=1e-5, tiles=(1, None), threads=(2,))


def _video_net():
    """A small 3-D CNN as torch.onnx.export writes one (C3D / R(2+1)D style): Conv3d,
    BatchNorm3d, ReLU, MaxPool3d, a (2+1)-D block with a residual, AdaptiveAvgPool3d(1),
    flatten, Linear."""
    r = np.random.default_rng(7)

    def w(*s):
        return (r.standard_normal(s) * 0.2).astype(np.float32)

    def bn(name, c):
        return {f"{name}.{k}": v for k, v in (
            ("weight", 1 + 0.1 * w(c)), ("bias", w(c)), ("running_mean", w(c)),
            ("running_var", 1 + np.abs(w(c))))}

    nodes = [
        helper.make_node("Conv", ["x", "c1.w"], ["c1"], kernel_shape=[3, 3, 3],
                         pads=[1, 1, 1, 1, 1, 1], strides=[1, 2, 2], name="/stem/conv/Conv"),
        helper.make_node("BatchNormalization", ["c1"] + [f"bn1.{k}" for k in (
            "weight", "bias", "running_mean", "running_var")], ["b1"], name="/stem/bn/BN"),
        helper.make_node("Relu", ["b1"], ["r1"], name="/stem/relu/Relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[1, 2, 2], strides=[1, 2, 2],
                         name="/stem/pool/MaxPool"),
        helper.make_node("Conv", ["p1", "s.w", "s.b"], ["s"], kernel_shape=[1, 3, 3],
                         pads=[0, 1, 1, 0, 1, 1], name="/block/spatial/Conv"),
        helper.make_node("Relu", ["s"], ["sr"], name="/block/relu/Relu"),
        helper.make_node("Conv", ["sr", "t.w", "t.b"], ["t"], kernel_shape=[3, 1, 1],
                         pads=[1, 0, 0, 1, 0, 0], name="/block/temporal/Conv"),
        helper.make_node("Add", ["t", "p1"], ["res"], name="/block/Add"),
        helper.make_node("Relu", ["res"], ["rr"], name="/block/relu_1/Relu"),
        helper.make_node("GlobalAveragePool", ["rr"], ["g"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["g"], ["f"], axis=1, name="/Flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1, name="/fc/Gemm"),
    ]
    inits = {"c1.w": w(8, 3, 3, 3, 3), **bn("bn1", 8), "s.w": w(8, 8, 1, 3, 3), "s.b": w(8),
             "t.w": w(8, 8, 3, 1, 1), "t.b": w(8), "fc.w": w(5, 8), "fc.b": w(5)}
    return make(nodes, {"x": (1, 3, 6, 16, 16)}, ["y"], inits)


def test_a_video_network_as_pytorch_exports_it():
    graph = check(_video_net(), {"x": rand(1, 3, 6, 16, 16)}, rel=1e-5)
    assert ops(graph).count("CONV") == 4  # the three Conv3d (2-D each) and the Linear
    assert "AFFINE" not in ops(graph)  # the BatchNorm3d folded into its convolution
