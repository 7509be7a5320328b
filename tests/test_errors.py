"""Bad input gives a CoactoError subclass whose message says what to do: never a crash or a hang."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import coacto
from coacto import zoo
from coacto.errors import (GraphFileError, InputError, ModelError, ShapeError,
                           UnsupportedOperatorError)

from conftest import assert_native_refuses


@pytest.fixture(scope="module")
def small():
    model = zoo.build("squeezenet", image_size=32)
    return model, coacto.compile(model, tiles_per_layer=3)


def test_missing_truncated_and_corrupt_onnx(tmp_path, small):
    model, _ = small
    with pytest.raises(ModelError, match="no such file|not found|does not exist"):
        coacto.compile(tmp_path / "absent.onnx")
    data = model.SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError):
        coacto.compile(tmp_path / "trunc.onnx")
    (tmp_path / "noise.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelError):
        coacto.compile(tmp_path / "noise.onnx")


def test_unsupported_ops_all_listed():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("Einsum", ["a", "a"], ["b"], name="weird1", equation="nchw,nchw->nchw"),
             helper.make_node("Relu", ["b"], ["c"], name="ok2"),
             helper.make_node("NonMaxSuppression", ["c"], ["y"], name="weird2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOperatorError) as e:
        coacto.compile(model)
    names = {name for name, _ in e.value.nodes}
    assert {"weird1", "weird2"} <= names
    assert "Einsum" in str(e.value) and "NonMaxSuppression" in str(e.value)


def test_dynamic_dimension_needs_input_shapes():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ShapeError, match="input_shapes"):
        coacto.compile(model)
    graph = coacto.compile(model, input_shapes={"x": (2, 3, 8, 8)})
    x_val = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with coacto.Runtime(graph, threads=1) as rt:
        np.testing.assert_array_equal(rt.run({"x": x_val})["y"], np.maximum(x_val, 0))


def test_wrong_inputs_at_run(small):
    model, graph = small
    feeds = zoo.input_feeds(model)
    (name, value), = feeds.items()
    with coacto.Runtime(graph, threads=1) as rt:
        with pytest.raises(InputError, match="unknown input.*the model's inputs"):
            rt.run({"nope": value})
        with pytest.raises(InputError, match="missing input"):
            rt.run({})
        with pytest.raises(InputError, match="astype"):
            rt.run({name: value.astype(np.float64)})
        with pytest.raises(InputError, match="shape"):
            rt.run({name: value[:, :, :-1]})
        with pytest.raises(InputError, match="numpy array"):
            rt.run({name: value.tolist()})
        with pytest.raises(InputError):
            rt.run([value])
        rt.run(feeds)  # still usable afterwards


def test_bad_parameters():
    with pytest.raises(coacto.CoactoError, match="tiles_per_layer"):
        coacto.compile(zoo.build("squeezenet", image_size=32), tiles_per_layer=0)
    with pytest.raises(coacto.CoactoError, match="threads"):
        coacto.Runtime(coacto.compile(zoo.build("squeezenet", image_size=32)), threads=0)
    with pytest.raises(coacto.CoactoError, match="TileGraph"):
        coacto.Runtime("model.onnx")


def test_corrupt_and_truncated_tile_graph_files(tmp_path, small):
    _, graph = small
    path = graph.save(tmp_path / "g.ctg")
    data = bytearray(path.read_bytes())
    with pytest.raises(GraphFileError, match="no such"):
        coacto.load(tmp_path / "absent.ctg")
    (tmp_path / "t.ctg").write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphFileError, match="truncated"):
        coacto.load(tmp_path / "t.ctg")
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    (tmp_path / "f.ctg").write_bytes(flipped)
    with pytest.raises(GraphFileError, match="corrupt"):
        coacto.load(tmp_path / "f.ctg")
    (tmp_path / "m.ctg").write_bytes(b"not a tile graph at all" * 10)
    with pytest.raises(GraphFileError, match="magic"):
        coacto.load(tmp_path / "m.ctg")


def test_native_runtime_refuses_inconsistent_graphs(small):
    """A header that passes the checksum but lies (e.g. crafted on purpose) is refused in C."""
    _, graph = small
    for mutate, what in [
        (lambda g: g.plan.tile_bounds.__setitem__((5, 1), 10**6), "outside layer"),
        (lambda g: g.plan.parents.__setitem__(0, g.n_tiles + 7), "parent"),
        (lambda g: g.graph.layers[3].attrs.__setitem__("kh", 99), "layer 3"),
        (lambda g: g.arrays[1].__setitem__(0, type(g.arrays[1][0])("w", "float32", (1,), 1 << 40, 64)),
         "outside the blob"),
        (lambda g: g.arrays[1].__setitem__(1, type(g.arrays[1][1])("b", "float32", (1,), 0, 8)),
         "bias"),
    ]:
        assert_native_refuses(graph, mutate, what)


def test_timeout_is_reported_and_runtime_stays_usable():
    model = zoo.build("resnet50", image_size=128)  # about 40 ms on one thread
    graph = coacto.compile(model)
    feeds = zoo.input_feeds(model)
    with coacto.Runtime(graph, threads=1) as rt:
        with pytest.raises(coacto.InferenceTimeout, match="raise the timeout"):
            rt.run(feeds, timeout=0.001)
        assert rt.run(feeds, timeout=60)  # the cancelled inference left nothing behind
