"""Pointwise prologues (coacto.frontend.fuse.fuse_pointwise_prologues): a 1x1 expansion whose only
consumer is a depthwise convolution is computed inside it, row by row, in graphs for a local
Runtime. Checked against onnxruntime on inverted-residual blocks written the way PyTorch's and
TensorFlow's exporters write them, across strides, paddings, activations, batch, tilings and
thread counts; and refused where it would be wrong (offloading, malformed graphs)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import compiler
from coacto.errors import ModelError
from coacto.frontend import import_model
from coacto.frontend.fuse import PROLOGUE_MIN_MAP_BYTES
from coacto.reference import run_reference
from conftest import assert_native_refuses

ort = pytest.importorskip("onnxruntime")


def block(h=64, w=64, cin=16, mid=96, stride=1, act="relu6", pads=(1, 1, 1, 1), batch=1,
          bias=True, residual=True, seed=0, opset=13, kernel=3):
    """One inverted residual: Conv 1x1 -> act -> depthwise Conv kxk -> act -> Conv 1x1 (-> Add).
    act: "relu6" as PyTorch exports it (Clip with min / max inputs), "relu", "hardswish" (a
    non-clamp activation: the prologue applies it in a pass of its own). pads: ONNX order (top,
    left, bottom, right); TensorFlow's SAME at stride 2 pads only bottom and right."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    def conv(x, wname, warr, out, group=1, stride=1, pads=(0, 0, 0, 0), k=1, with_bias=True):
        ins = [x, const(wname, warr)]
        if with_bias:
            ins.append(const(wname + "_b", rng.normal(0, 0.1, warr.shape[0])))
        nodes.append(helper.make_node("Conv", ins, [out], kernel_shape=[k, k], group=group,
                                      strides=[stride, stride], pads=list(pads)))
        return out

    def activation(x, out):
        if act == "relu6":
            nodes.append(helper.make_node("Clip", [x, const(out + "_lo", 0.0),
                                                   const(out + "_hi", 6.0)], [out]))
        elif act == "relu":
            nodes.append(helper.make_node("Relu", [x], [out]))
        else:
            nodes.append(helper.make_node("HardSwish", [x], [out]))
        return out

    e = conv("x", "w_expand", rng.normal(0, (2 / cin) ** 0.5, (mid, cin, 1, 1)), "e",
             with_bias=bias)
    e = activation(e, "e_act")
    d = conv(e, "w_dw", rng.normal(0, (2 / kernel ** 2) ** 0.5, (mid, 1, kernel, kernel)), "d",
             group=mid, stride=stride, pads=pads, k=kernel)
    d = activation(d, "d_act")
    y = conv(d, "w_project", rng.normal(0, (1 / mid) ** 0.5, (cin, mid, 1, 1)), "p")
    ho = (h + pads[0] + pads[2] - kernel) // stride + 1
    wo = (w + pads[1] + pads[3] - kernel) // stride + 1
    if residual and stride == 1 and (ho, wo) == (h, w):
        nodes.append(helper.make_node("Add", ["x", y], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [y], ["y"]))
    graph = helper.make_graph(
        nodes, "inverted_residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cin, ho, wo])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _feeds(model, seed=1):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _prologues(tg):
    return [layer for layer in tg.graph.layers if layer.op == "CONV" and layer.attrs.get("pre")]


def _close(got, want):
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, err


VARIANTS = {
    "pytorch_stride1": dict(),
    "pytorch_stride2": dict(stride=2, residual=False),
    "tf_same_stride2": dict(stride=2, pads=(0, 0, 1, 1), act="relu", residual=False),
    "hardswish_no_bias": dict(act="hardswish", bias=False, opset=14),
    "batch2_nonsquare": dict(h=40, w=72, mid=144, batch=2),
    "kernel5_narrow": dict(h=33, w=130, cin=8, mid=64, kernel=5, pads=(2, 2, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("threads,tiles", [(1, None), (2, None), (2, 7)])
def test_fused_blocks_match_onnxruntime(name, threads, tiles):
    """tiles=7 cuts the depthwise layer's columns mid-row: tiles recompute the prologue rows
    they share and start and end inside an output row."""
    model = block(**VARIANTS[name])
    feeds = _feeds(model)
    tg = coacto.compile(model, threads=threads, tiles_per_layer=tiles)
    assert len(_prologues(tg)) == 1, "the block was not fused"
    assert len(tg.graph.layers) == len(import_model(model).layers) - 1
    with coacto.Runtime(tg, threads=threads) as rt:
        for _ in range(2):  # the second run reuses the arena and the scratch rings
            _close(rt.run(feeds)["y"], _ort(model, feeds))


def test_channel_tiles_compute_their_own_prologue_channels():
    """A depthwise layer with few columns is cut by rows (channels) too: each tile's prologue
    computes its own channels of the rows."""
    model = block(h=16, w=16, cin=24, mid=1024)
    feeds = _feeds(model)
    fused = next(i for i, layer in enumerate(coacto.compile(model, threads=2).graph.layers)
                 if layer.attrs.get("pre"))
    tg = coacto.compile(model, threads=2, layer_tiles={fused: 16})
    first, last = tg.plan.layer_first_tile[fused], tg.plan.layer_first_tile[fused + 1]
    rows = {tuple(int(v) for v in tg.plan.tile_bounds[t, 2:4]) for t in range(first, last)}
    assert len(rows) > 1, rows
    with coacto.Runtime(tg, threads=2) as rt:
        _close(rt.run(feeds)["y"], _ort(model, feeds))


def test_reference_oracle_computes_the_fused_graph():
    model = block(**VARIANTS["tf_same_stride2"])
    feeds = _feeds(model)
    tg = coacto.compile(model, threads=1)
    assert _prologues(tg)
    _close(run_reference(tg.graph, feeds)["y"].astype(np.float32), _ort(model, feeds))


def test_only_local_graphs_are_fused_and_their_ids_say_so():
    model = block()
    offload = coacto.compile(model)
    local = coacto.compile(model, threads=1)
    assert not _prologues(offload) and _prologues(local)
    assert "prologues" not in offload.params and local.params["prologues"] == 1
    assert local.graph_id != compiler.partition_graph(import_model(model), threads=1).graph_id
    # repartitioned (coacto tune's candidates), the graph keeps its layers and its marker
    again = compiler.repartition(local, tiles_per_layer=3, threads=1)
    assert again.params["prologues"] == 1 and len(_prologues(again)) == 1


def test_small_maps_stay_two_layers():
    """A map under PROLOGUE_MIN_MAP_BYTES stays in L2 between the layers anyway."""
    model = block(h=16, w=16, mid=96)
    assert 4 * 96 * 16 * 16 < PROLOGUE_MIN_MAP_BYTES
    assert not _prologues(coacto.compile(model, threads=1))


def test_expansions_with_other_readers_are_not_fused():
    """The 1x1 output is also a graph output: it must be written, so it stays a layer."""
    model = block()
    model.graph.output.append(helper.make_tensor_value_info("e_act", TensorProto.FLOAT, None))
    tg = coacto.compile(model, threads=1)
    assert not _prologues(tg)
    feeds = _feeds(model)
    with coacto.Runtime(tg, threads=1) as rt:
        _close(rt.run(feeds)["y"], _ort(model, feeds))


def test_saved_fused_graph_loads_and_runs(tmp_path):
    model = block(**VARIANTS["pytorch_stride2"])
    feeds = _feeds(model)
    tg = coacto.compile(model, threads=1)
    tg.save(tmp_path / "m.ctg")
    back = coacto.load(tmp_path / "m.ctg")
    assert back.graph_id == tg.graph_id and _prologues(back)
    with coacto.Runtime(back, threads=1) as rt:
        _close(rt.run(feeds)["y"], _ort(model, feeds))
        rows = rt.profile(feeds, 1)  # the profile names the layer that computes the 1x1 too
        assert [r["layer"] for r in rows if r["prologue"]] == [1]


def test_a_client_offloads_no_local_graph_but_runs_one_alone():
    """The server compiles the unfused graph: a Client refuses to offload a fused one, before
    it connects; alone (policy local, as `coacto-client --policy local` compiles) it runs it."""
    model = block()
    tg = coacto.compile(model, threads=1)
    with pytest.raises(ModelError, match="compiled for a local Runtime"):
        coacto.Client("127.0.0.1:9", tg)
    feeds = _feeds(model)
    with coacto.Client(None, tg, threads=1, policy="local") as client:
        _close(client.infer(feeds)["y"], _ort(model, feeds))


def test_one_channel_pairs_stay_two_layers():
    """A 1 -> 1 channel 1x1 convolution (the runtime computes it as a depthwise layer) before a
    one-channel 3x3 one, on a map of 1 MiB."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (1, 1, 1, 1)), ("w2", (1, 1, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3, 3], group=1,
                              pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "ones", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 512, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 512, 512])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    tg = coacto.compile(model, threads=1)
    assert not _prologues(tg)
    feeds = _feeds(model)
    with coacto.Runtime(tg, threads=1) as rt:
        _close(rt.run(feeds)["y"], _ort(model, feeds))


def test_native_runtime_refuses_malformed_prologues():
    model = block()
    tg = coacto.compile(model, threads=1)
    fused = next(i for i, layer in enumerate(tg.graph.layers) if layer.attrs.get("pre"))
    plain = next(i for i, layer in enumerate(tg.graph.layers)
                 if layer.op == "CONV" and not layer.attrs.get("pre"))
    pre_w = 2  # the array slot of the prologue's weights

    def short_weights(g):
        spec = g.arrays[fused][pre_w]
        g.arrays[fused][pre_w] = type(spec)(spec.key, spec.dtype, spec.shape, spec.offset,
                                            spec.size - 4)

    def moved_prologue(g):
        g.graph.layers[plain].attrs.update(pre=1, pre_act=0)
        g.arrays[plain][2:4] = g.arrays[fused][2:4]

    for mutate, what in [
        (lambda g: g.graph.layers[fused].attrs.__setitem__("pre", 2), "prologue 2"),
        (lambda g: g.graph.layers[fused].attrs.__setitem__("pre", 0), "must be absent"),
        (lambda g: g.graph.layers[fused].attrs.__setitem__("pre_act", 999), "prologue activation"),
        (short_weights, "prologue weights"),
        (moved_prologue, "pointwise prologue needs a depthwise"),
    ]:
        assert_native_refuses(tg, mutate, what)


def test_a_tf2onnx_style_block_with_a_pad_node_is_fused():
    """As tf2onnx writes a Keras MobileNetV2 block: NHWC input transposed, Relu6 as Clip, the
    stride-2 depthwise layer's SAME padding as a Pad node before a VALID convolution."""
    rng = np.random.default_rng(3)
    hw, cin, mid, cout = 96, 24, 144, 32

    def w(*shape):
        return (rng.standard_normal(shape) * (2 / np.prod(shape[1:])) ** 0.5).astype(np.float32)

    nodes = [helper.make_node("Transpose", ["x"], ["t0"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t0", "W1", "B1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Pad", ["r1", "pads"], ["p1"], mode="constant"),
             helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], kernel_shape=[3, 3],
                              strides=[2, 2], group=mid),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("Conv", ["r2", "W3", "B3"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("Transpose", ["c3"], ["y"], perm=[0, 2, 3, 1])]
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("W1", w(mid, cin, 1, 1)), ("B1", rng.normal(0, 0.1, mid).astype(np.float32)),
        ("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32)),
        ("pads", np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64)),
        ("W2", w(mid, 1, 3, 3)), ("B2", rng.normal(0, 0.1, mid).astype(np.float32)),
        ("W3", w(cout, mid, 1, 1)), ("B3", np.zeros(cout, np.float32))]]
    graph = helper.make_graph(
        nodes, "tf2onnx_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hw, hw, cin])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hw // 2, hw // 2, cout])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": rng.standard_normal((1, hw, hw, cin)).astype(np.float32)}
    for threads in (1, 2):
        tg = coacto.compile(model, threads=threads)
        (fused,) = _prologues(tg)
        assert (fused.attrs["pt"], fused.attrs["pb"], fused.attrs["sh"]) == (0, 1, 2)
        with coacto.Runtime(tg, threads=threads) as rt:
            _close(rt.run(feeds)["y"], _ort(model, feeds))


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenetv2_local_graphs_match_onnxruntime(threads):
    """The zoo's MobileNetV2 as `coacto bench` and `coacto run` compile it: its three blocks at
    112 x 112 and 56 x 56 get prologues, the rest stay two layers."""
    from coacto import zoo

    model = zoo.build("mobilenetv2")
    feeds = zoo.input_feeds(model)
    tg = coacto.compile(model, threads=threads)
    assert len(_prologues(tg)) == 3
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    with coacto.Runtime(tg, threads=threads) as rt:
        for got, ref in zip(rt.run(None, feeds), want):
            _close(got, ref)


def test_the_simulator_refuses_a_local_graph():
    from coacto.sim.simulate import SimError, resolve_graph

    with pytest.raises(SimError, match="compiled for a local Runtime"):
        resolve_graph(coacto.compile(block(), threads=1))
    assert not _prologues(resolve_graph(block()))
