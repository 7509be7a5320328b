"""The API as onnxruntime's users know it: get_inputs() / get_outputs() describe a model as
onnxruntime does (on models shaped the way PyTorch's and TensorFlow's exporters write them),
run(output_names, feeds) returns onnxruntime's list, and Client.ainfer awaits inferences from
asyncio (concurrently, against a server on 127.0.0.1) and stops one whose task is cancelled."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import zoo
from coacto.server import Server

from conftest import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
from bench_cancel import long_model  # noqa: E402


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _init(rng, name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def torch_style_cnn() -> onnx.ModelProto:
    """As torch.onnx.export writes an image classifier with dynamic_axes={"input": {0:
    "batch_size"}, ...}: NCHW input, Conv, Relu, Flatten, Gemm (transB)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                              name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["/conv/Conv_output_0"], ["/relu/Relu_output_0"],
                              name="/relu/Relu"),
             helper.make_node("Flatten", ["/relu/Relu_output_0"], ["/Flatten_output_0"],
                              name="/Flatten", axis=1),
             helper.make_node("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["output"],
                              name="/fc/Gemm", alpha=1.0, beta=1.0, transB=1)]
    inits = [_init(rng, "conv.weight", (4, 3, 3, 3)), _init(rng, "conv.bias", (4,)),
             _init(rng, "fc.weight", (10, 4 * 8 * 8)), _init(rng, "fc.bias", (10,))]
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch_size", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch_size", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tf_style_cnn() -> onnx.ModelProto:
    """As tf2onnx writes a Keras model: NHWC input named "input_1" with an unknown batch
    dimension, a Transpose to NCHW in front of the Conv, outputs named after their layers."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Transpose", ["input_1"], ["conv2d__6:0"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["conv2d__6:0", "conv2d/kernel", "conv2d/bias"],
                              ["conv2d/Relu:0_pre"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv2d/Relu:0_pre"], ["conv2d/Relu:0"]),
             helper.make_node("GlobalAveragePool", ["conv2d/Relu:0"], ["gap:0"]),
             helper.make_node("Flatten", ["gap:0"], ["dense:0_in"], axis=1),
             helper.make_node("Gemm", ["dense:0_in", "dense/kernel", "dense/bias"], ["dense"])]
    inits = [_init(rng, "conv2d/kernel", (6, 3, 3, 3)), _init(rng, "conv2d/bias", (6,)),
             _init(rng, "dense/kernel", (6, 5)), _init(rng, "dense/bias", (5,))]
    graph = helper.make_graph(
        nodes, "tf2onnx",
        [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, ["unk__12", 8, 8, 3])],
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["unk__13", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def two_outputs() -> onnx.ModelProto:
    """One input, two heads: "a" (ReLU of a convolution) and "b" (its sigmoid, pooled)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["b"])]
    graph = helper.make_graph(
        nodes, "two_heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 6, 6]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 1, 1])],
        [_init(rng, "w", (4, 3, 1, 1))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def small_bert() -> onnx.ModelProto:
    """HuggingFace BertModel as exported: int64 input_ids / attention_mask / token_type_ids."""
    return zoo.build("bert", layers=1, hidden=32, heads=2, vocab=64, seq_len=8)


def _described(args, sizes: dict | None = None):
    """(name, shape, type) per NodeArg; symbolic dimensions become their compiled sizes."""
    return [(a.name, [d if isinstance(d, int) else sizes[d] for d in a.shape], a.type)
            for a in args]


@pytest.mark.parametrize("build, input_shapes, sizes", [
    (torch_style_cnn, {"input": [2, 3, 8, 8]}, {"batch_size": 2}),
    (tf_style_cnn, {"input_1": [1, 8, 8, 3]}, {"unk__12": 1, "unk__13": 1}),
    (two_outputs, None, None),
    (small_bert, None, None),
], ids=["torch-nchw", "tf-nhwc", "two-outputs", "bert-int64"])
def test_inputs_and_outputs_are_described_as_onnxruntime_does(build, input_shapes, sizes):
    model = build()
    sess = _session(model)
    tg = coacto.compile(model, input_shapes=input_shapes)
    with coacto.Runtime(tg, threads=1) as rt:
        got_in, got_out = rt.get_inputs(), rt.get_outputs()
    assert _described(got_in) == _described(sess.get_inputs(), sizes)
    assert _described(got_out) == _described(sess.get_outputs(), sizes)
    for a in got_in + got_out:
        assert all(type(d) is int for d in a.shape), a  # plain ints, as onnxruntime's
    feeds = {a.name: np.zeros(a.shape, a.dtype) for a in got_in}
    if build is small_bert:
        assert {a.dtype for a in got_in} == {np.dtype(np.int64)}
    with coacto.Runtime(tg, threads=1) as rt:
        rt.run(feeds)  # the described shapes and dtypes are what run() takes


@pytest.fixture(scope="module")
def heads():
    model = two_outputs()
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype(np.float32)}
    a, b = _session(model).run(["a", "b"], feeds)
    with coacto.Runtime(coacto.compile(model), threads=1) as rt:
        yield rt, feeds, {"a": a, "b": b}


def test_run_with_output_names_returns_onnxruntimes_list_in_that_order(heads):
    rt, feeds, ref = heads
    got = rt.run(["b", "a"], feeds)
    assert isinstance(got, list) and len(got) == 2
    assert_close({"b": got[0], "a": got[1]}, ref, rel=1e-5)
    every = rt.run(None, feeds)  # None: every output, in the model's order
    assert_close(dict(zip(["a", "b"], every)), ref, rel=1e-5)
    assert_close(dict(zip(["a", "b"], rt.run([], feeds))), ref, rel=1e-5)  # as onnxruntime
    assert_close(dict(zip(["b"], rt.run(("b",), feeds, timeout=60))), {"b": ref["b"]}, rel=1e-5)
    twice = rt.run(["a", "a"], feeds)
    assert twice[0] is not twice[1]  # each its own array, as onnxruntime gives them
    np.testing.assert_array_equal(twice[0], twice[1])


def test_run_with_feeds_alone_still_returns_the_dict(heads):
    rt, feeds, ref = heads
    for got in (rt.run(feeds), rt.run(feeds, 60), rt.run(feeds, timeout=60), rt.run(feeds=feeds)):
        assert isinstance(got, dict)
        assert_close(got, ref, rel=1e-5)


def test_unknown_output_names_are_refused_before_running(heads):
    rt, feeds, _ = heads
    with pytest.raises(coacto.InputError, match=r"unknown output name\(s\) \['c'\].*\['a', 'b'\]"):
        rt.run(["a", "c"], feeds)
    with pytest.raises(coacto.InputError, match="list of output names"):
        rt.run("a", feeds)
    with pytest.raises(coacto.InputError, match="a dict, then str"):
        rt.run(feeds, "a")
    with pytest.raises(coacto.InputError, match="takes a dict"):
        rt.run(["a"], None)


# ------------------------------------------------------------------------------ Client

@pytest.fixture(scope="module")
def squeezenet():
    model = zoo.build("squeezenet", image_size=32)
    feeds = zoo.input_feeds(model, seed=1)
    sess = _session(model)
    names = [o.name for o in sess.get_outputs()]
    return model, feeds, dict(zip(names, sess.run(names, feeds))), sess


@pytest.fixture(scope="module")
def server():
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv:
        yield srv


def test_client_describes_and_runs_as_onnxruntime(squeezenet):
    model, feeds, ref, sess = squeezenet
    with coacto.Client(None, model, threads=1, policy="local") as client:
        assert _described(client.get_inputs()) == _described(sess.get_inputs())
        assert _described(client.get_outputs()) == _described(sess.get_outputs())
        got = client.run(None, feeds)
        assert_close(dict(zip(ref, got)), ref)
        with pytest.raises(coacto.InputError, match="unknown output name"):
            client.run(["logits"], feeds)


def test_ainfer_awaits_several_inferences_at_once(squeezenet, server):
    model, feeds, ref, _ = squeezenet
    policies = ["cloud", "local", "dynamic", "cloud", "split"]

    async def main(client):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        beat = asyncio.create_task(ticker())
        try:
            results = await asyncio.gather(*(client.ainfer(feeds, policy=p) for p in policies))
        finally:
            beat.cancel()
        return results, ticks

    with coacto.Client(server.address, model, threads=1, timeout=30) as client:
        client.connect(timeout=60)
        results, ticks = asyncio.run(main(client))
    assert len(results) == len(policies)
    for got in results:
        assert_close(got, ref)
    assert ticks > 0  # the loop ran while the inferences were in flight


def _long_run(layers: int):
    model = long_model(layers=layers)
    tg = coacto.compile(model, tiles_per_layer=1)
    feeds = zoo.input_feeds(model, seed=1)
    with coacto.Runtime(tg, threads=1) as rt:
        ref = rt.run(feeds)
        t0 = time.perf_counter()
        rt.run(feeds)
        return tg, feeds, ref, time.perf_counter() - t0


def test_cancelling_the_awaiting_task_stops_the_inference():
    tg, feeds, ref, seconds = _long_run(1)
    if seconds < 1.0:  # a faster machine: more 512-channel layers
        tg, feeds, ref, seconds = _long_run(min(16, int(np.ceil(1.0 / seconds)) + 1))
    if seconds < 0.5:
        pytest.skip(f"the long model runs in {seconds:.2f} s here: too fast to stop mid-way")
    with coacto.Client(None, tg, threads=1, policy="local") as client:
        futures = []
        submit = client.infer_async

        def recording(*args, **kw):
            futures.append(submit(*args, **kw))
            return futures[-1]

        client.infer_async = recording

        async def main():
            task = asyncio.create_task(client.ainfer(feeds))
            await asyncio.sleep(min(0.3, seconds / 3))
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        (future,) = futures
        # the engine stopped the running inference, not just the awaiting task
        assert isinstance(future.exception(timeout=5), coacto.InferenceCancelled)
        del client.infer_async
        assert_close(client.infer(feeds), ref, rel=1e-5)  # the client goes on


def _integer_outputs_model():
    """A mask-style graph: token ids in, a comparison (bool), its cast (int64), the ids gathered
    by position (int64) and a float score out."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    outs = [helper.make_tensor_value_info("pad", TensorProto.BOOL, [2, 5]),
            helper.make_tensor_value_info("keep", TensorProto.INT64, [2, 5]),
            helper.make_tensor_value_info("firsts", TensorProto.INT64, [2, 2]),
            helper.make_tensor_value_info("score", TensorProto.FLOAT, [2, 5])]
    nodes = [
        helper.make_node("Equal", ["ids", "zero"], ["pad"]),
        helper.make_node("Not", ["pad"], ["keep_b"]),
        helper.make_node("Cast", ["keep_b"], ["keep"], to=TensorProto.INT64),
        helper.make_node("Slice", ["ids", "s0", "s1", "ax"], ["firsts"]),
        helper.make_node("Cast", ["keep"], ["keep_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "keep_f"], ["score"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([2], np.int64), "s1"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    g = helper.make_graph(nodes, "masks", [ids, x], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_integer_and_bool_outputs_come_back_in_their_type(tmp_path):
    """As onnxruntime returns them: the dtypes the model declares, equal values, described so by
    get_outputs(), and kept by a .ctg; a cast of computed floats to an integer type is still
    refused (coacto computes in float32 and cannot promise the rounding)."""
    import onnxruntime as ort

    model = _integer_outputs_model()
    ids = np.array([[5, 0, 7, 0, 1], [0, 3, 3, 9, 0]], np.int64)
    feeds = {"ids": ids, "x": np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)}
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    path = coacto.compile(model).save(tmp_path / "m.ctg")
    with coacto.Runtime(coacto.load(path), threads=1) as rt:
        got = rt.run(None, feeds)
        types = [o.type for o in rt.get_outputs()]
    assert types == ["tensor(bool)", "tensor(int64)", "tensor(int64)", "tensor(float)"]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape and np.array_equal(g, r)

    bad = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)], "b",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                            [helper.make_tensor_value_info("y", TensorProto.INT64, [2])])
    with pytest.raises(coacto.UnsupportedOperatorError, match="casts computed data to int64"):
        coacto.compile(helper.make_model(bad, opset_imports=[helper.make_opsetid("", 13)]))


def _half_cnn(dtype) -> onnx.ModelProto:
    """A CNN as ``model.half()`` (or ``.double()``) exports it: every tensor of that type, weights
    included, and a softmax computed in float32 between two Casts, as autocast writes it."""
    rng = np.random.default_rng(4)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def init(name, shape, scale=0.4):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(dtype), name)

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="/conv/Conv"),
        helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
        helper.make_node("Cast", ["logits"], ["l32"], to=TensorProto.FLOAT),
        helper.make_node("Softmax", ["l32"], ["s32"], axis=-1),
        helper.make_node("Cast", ["s32"], ["probs"], to=elem),
    ]
    g = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", elem, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("probs", elem, [1, 10]),
                           helper.make_tensor_value_info("logits", elem, [1, 10])],
                          [init("w", (6, 3, 3, 3)), init("b", (6,)), init("fw", (10, 96), 0.2),
                           init("fb", (10,))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_models_take_and_return_their_type(tmp_path, server, dtype):
    """Computed in float32: the result is onnxruntime's on the model's float32 twin (the same
    weights, widened), rounded to the declared type; described and fed as onnxruntime does, and
    the same when the server computes part or all of it."""
    model = _half_cnn(dtype)
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    for t in twin.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    for vi in (*twin.graph.input, *twin.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for n in twin.graph.node:
        for a in n.attribute:
            if a.name == "to":
                a.i = TensorProto.FLOAT
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(dtype)
    ref = _session(twin).run(None, {"x": x.astype(np.float32)})

    path = coacto.compile(model).save(tmp_path / "m.ctg")
    with coacto.Runtime(coacto.load(path), threads=2) as rt:
        name = {np.float16: "float16", np.float64: "double"}[dtype]
        assert [(a.type, a.dtype) for a in rt.get_inputs()] == [(f"tensor({name})", dtype)]
        assert [a.type for a in rt.get_outputs()] == [f"tensor({name})"] * 2
        got = rt.run(None, {"x": x})
        with pytest.raises(coacto.InputError, match=f"takes {np.dtype(dtype)}; convert it"):
            rt.run(None, {"x": x.astype(np.float32)})
    for g, r in zip(got, ref):
        assert g.dtype == dtype and g.shape == r.shape
        # float16: at most one rounding of the float32 result apart (its last bit)
        np.testing.assert_allclose(g, r.astype(dtype), rtol=2e-3 if dtype == np.float16 else 1e-5,
                                   atol=1e-6)
    with coacto.Client(server.address, model, threads=1, timeout=30) as client:
        client.connect(timeout=60)
        for policy in ("cloud", "dynamic"):
            out = client.infer({"x": x}, policy=policy)
            for g, name in zip(got, ("probs", "logits")):
                assert out[name].dtype == dtype and np.array_equal(out[name], g), policy
