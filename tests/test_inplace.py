"""In-place residuals: a 1x1 convolution whose sum with a residual input is fused into it writes
its output into the residual's buffer when nothing else still reads that part of it
(coacto_inference_set_inplace; graph.c's derive_aliases decides which layers may)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import coacto
from coacto.errors import CoactoError
from coacto.inference import NativeInference, native_graph
from coacto.native import lib
from coacto.runtime import Runtime

rng = np.random.default_rng(11)
C, HW = 32, 12


def _conv(name, x, cin, cout, k, inits, nodes, relu=True, stride=1):
    w = helper.make_tensor(f"{name}.w", TensorProto.FLOAT, [cout, cin, k, k],
                           (rng.standard_normal(cout * cin * k * k) / np.sqrt(cin * k * k))
                           .astype(np.float32))
    b = helper.make_tensor(f"{name}.b", TensorProto.FLOAT, [cout],
                           rng.standard_normal(cout).astype(np.float32) * 0.1)
    inits += [w, b]
    out = f"/{name}/Conv_output_0"
    nodes.append(helper.make_node("Conv", [x, w.name, b.name], [out], name=f"/{name}/Conv",
                                  kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride] * 2))
    if not relu:
        return out
    nodes.append(helper.make_node("Relu", [out], [f"/{name}/Relu_output_0"], name=f"/{name}/Relu"))
    return f"/{name}/Relu_output_0"


def _add_relu(name, a, b, nodes):
    nodes.append(helper.make_node("Add", [a, b], [f"/{name}/Add_output_0"], name=f"/{name}/Add"))
    nodes.append(helper.make_node("Relu", [f"/{name}/Add_output_0"], [f"/{name}/Relu_output_0"],
                                  name=f"/{name}/Relu"))
    return f"/{name}/Relu_output_0"


def _model(kind: str, cin_deep: int = 0):
    """Bottlenecks as PyTorch exports them (Conv, Relu, Add nodes; the importer fuses the Add
    and Relu into the last convolution). kind: 'chain' (two blocks, safe), 'branch' (the
    residual is also read by a 3x3 convolution the block does not wait for), 'self' (the sum
    reads the convolution's own input), 'output' (the residual is a graph output), 'downsample'
    (the sum of a 1x1 convolution and a strided 1x1 shortcut), 'deep' (the
    1x1 reduces over cin_deep channels, more than one K block)."""
    nodes, inits = [], []
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, HW, HW])
    outputs = []
    width = cin_deep or C
    r = _conv("stem", "x", 3, width, 3, inits, nodes)
    if kind == "chain":
        for blk in ("b1", "b2"):
            a = _conv(f"{blk}.c1", r, width, 8, 1, inits, nodes)
            a = _conv(f"{blk}.c2", a, 8, 8, 3, inits, nodes)
            r = _add_relu(blk, _conv(f"{blk}.c3", a, 8, width, 1, inits, nodes, relu=False), r, nodes)
        y = r
    elif kind == "branch":
        a = _conv("c1", r, width, 8, 1, inits, nodes)
        main = _add_relu("blk", _conv("c3", a, 8, width, 1, inits, nodes, relu=False), r, nodes)
        side = _conv("side", r, width, width, 3, inits, nodes)
        y = _add_relu("join", main, side, nodes)
    elif kind == "self":
        y = _add_relu("blk", _conv("c3", r, width, width, 1, inits, nodes, relu=False), r, nodes)
    elif kind == "output":
        a = _conv("c1", r, width, 8, 1, inits, nodes)
        y = _add_relu("blk", _conv("c3", a, 8, width, 1, inits, nodes, relu=False), r, nodes)
        outputs.append(helper.make_tensor_value_info(r, TensorProto.FLOAT, None))
    elif kind == "downsample":  # torchvision's first bottleneck of a stage: Add(main, shortcut)
        a = _conv("c1", r, width, 8, 1, inits, nodes)
        a = _conv("c2", a, 8, 8, 3, inits, nodes, stride=2)
        main = _conv("c3", a, 8, 2 * width, 1, inits, nodes, relu=False)
        shortcut = _conv("ds", r, width, 2 * width, 1, inits, nodes, relu=False, stride=2)
        y = _add_relu("blk", main, shortcut, nodes)
    elif kind == "deep":
        a = _conv("c1", r, width, width, 1, inits, nodes)
        y = _add_relu("blk", _conv("c3", a, width, width, 1, inits, nodes, relu=False), r, nodes)
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    outputs.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "residual", [x], outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                             producer_name="pytorch")


def _aliases(tg) -> dict[str, str]:
    ng = native_graph(tg)
    layers = tg.graph.layers
    out = {}
    for li, layer in enumerate(layers):
        r = lib.coacto_graph_layer_alias(ng.handle, li)
        assert r >= -1
        if r >= 0:
            out[layer.name] = layers[r].name
    return out


def _check(model, tiles, threads):
    feed = {"x": rng.standard_normal((1, 3, HW, HW)).astype(np.float32)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    tg = coacto.compile(model, tiles_per_layer=tiles)
    with Runtime(tg, threads=threads) as rt:
        for _ in range(3):  # buffers come back from the arena in other places
            got = rt.run(feed)
            for k, v in ref.items():
                np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-4 * np.abs(v).max(),
                                           err_msg=f"{k}, {tiles} tiles, {threads} threads")
    return tg


@pytest.mark.parametrize("tiles", [1, 3, 7])
@pytest.mark.parametrize("threads", [1, 2])
def test_bottlenecks_write_into_their_residual_and_match_onnxruntime(tiles, threads):
    tg = _check(_model("chain"), tiles, threads)
    got = _aliases(tg)
    assert set(got) == {"/b1.c3/Conv", "/b2.c3/Conv"}, got
    assert got["/b2.c3/Conv"] == "/b1.c3/Conv"  # a chain of two: one buffer for both sums


@pytest.mark.parametrize("tiles", [1, 4])
def test_a_downsampling_block_sums_into_its_shortcut(tiles):
    """The Add is fused into the stride-1 convolution, whose output can then go into the
    shortcut's buffer (fused into the strided shortcut, it could not: only 1x1 convolutions with
    stride 1 sum in place)."""
    tg = _check(_model("downsample"), tiles, threads=2)
    assert _aliases(tg) == {"/c3/Conv": "/ds/Conv"}


def test_in_place_sums_take_less_activation_memory():
    model = _model("chain")
    tg = coacto.compile(model, tiles_per_layer=1)
    feed = {"x": rng.standard_normal((1, 3, HW, HW)).astype(np.float32)}
    with Runtime(tg, threads=1) as rt:
        rt.run(feed)
        peak_inplace = rt.last_stats["peak_activation_bytes"]
        with NativeInference(rt._rt, tg) as ni:  # the same graph, buffers of its own
            ni.set_inputs(feed)
            ni.wait()
            peak_apart = ni.stats()["peak_activation_bytes"]
    # one thread, one tile per layer: apart, the peak is at a sum (its residual, its input and
    # its output); in place, the sum adds nothing, and the peak is at a bottleneck's 3x3
    # (the residual and two 8-channel buffers)
    big, small = HW * HW * C * 4, HW * HW * 8 * 4
    assert (peak_apart, peak_inplace) == (2 * big + small, big + 2 * small)


@pytest.mark.parametrize("kind", ["branch", "self", "output"])
@pytest.mark.parametrize("tiles", [1, 4])
def test_a_residual_still_read_elsewhere_is_not_overwritten(kind, tiles):
    tg = _check(_model(kind), tiles, threads=2)
    assert _aliases(tg) == {}


def test_a_reduction_of_more_than_one_k_block_keeps_its_own_buffer():
    tg = _check(_model("deep", cin_deep=1024), 1, threads=1)
    assert _aliases(tg) == {}


def test_an_in_place_inference_takes_no_tiles_from_outside():
    tg = coacto.compile(_model("chain"), tiles_per_layer=2)
    with Runtime(tg, threads=1) as rt:
        with NativeInference(rt._rt, tg) as ni:
            ni.set_inplace()
            data = np.zeros(tg.plan.tile_bytes[5] // 4, np.float32)
            with pytest.raises(CoactoError):
                ni.put_tiles(np.array([5], np.int32), data)
        with NativeInference(rt._rt, tg) as ni:
            ni.set_plan(report=np.zeros(tg.n_tiles, np.uint8))  # a plan turns it off
            ni.set_inplace()
            ni.put_tiles(np.array([5], np.int32), np.zeros(tg.plan.tile_bytes[5] // 4, np.float32))
