"""Every way a model or tile graph file can be malformed ends in a CoactoError that says what is
wrong, raised at load or compile time (never a KeyError, an IndexError or numpy's MemoryError, and
never at run time). The ONNX models are built as exporters write them (PyTorch's node names and
attribute forms); the .ctg files are real ones with one part of the header changed."""
from __future__ import annotations

import copy

import msgpack
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import ir
from coacto.errors import CoactoError, GraphFileError, ModelError, ShapeError
from coacto.runtime import native_graph
from coacto.tilegraph import TileGraph, frame

# ------------------------------------------------------------------------------------------- ONNX


def _model(nodes, inits=(), x_shape=(1, 3, 8, 8), y_shape=None, opset=13, x_dims=None):
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, x_dims or list(x_shape))
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, y_shape)
    graph = helper.make_graph(nodes, "torch_jit", [x], [y], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(name, shape):
    return numpy_helper.from_array(np.full(shape, 0.1, np.float32), name)


def _conv_model(w_shape=(4, 3, 3, 3), x_shape=(1, 3, 8, 8), **attrs):
    node = helper.make_node("Conv", ["input", "conv1.weight"], ["output"], name="/conv1/Conv",
                            **attrs)
    return _model([node], [_weights("conv1.weight", w_shape)], x_shape=x_shape)


def _compile_error(model, error=CoactoError, internal=False, **kw):
    with pytest.raises(error) as e:
        coacto.compile(model, **kw)
    assert e.value.internal == internal, f"refused by the safety net? {e.value}"
    return str(e.value)


def test_an_input_dimension_of_1e9_is_refused_before_any_allocation():
    msg = _compile_error(_conv_model(x_shape=(1, 3, 10**9, 8)), ShapeError)
    assert "'input'" in msg and "MAX_TENSOR_ELEMENTS" in msg


def test_input_shapes_beyond_the_limit_are_refused():
    msg = _compile_error(_conv_model(x_dims=None), ShapeError,
                         input_shapes={"input": (1, 3, 100_000, 100_000)})
    assert "input_shapes['input']" in msg and "MAX_TENSOR_ELEMENTS" in msg


@pytest.mark.parametrize("shapes, fragment", [
    ({"input": ("1", 3, 8, 8)}, "a shape is a tuple of integers"),
    ({"input": (1, 3, 8.5, 8)}, "a shape is a tuple of integers"),
    ([(1, 3, 8, 8)], "input_shapes must be a dict"),
])
def test_input_shapes_that_are_not_shapes_are_refused(shapes, fragment):
    assert fragment in _compile_error(_conv_model(), ShapeError, input_shapes=shapes)


def test_a_dimension_0_is_reported_as_such_not_as_dynamic():
    msg = _compile_error(_conv_model(x_shape=(1, 3, 0, 8)), ShapeError)
    assert "dimension 0" in msg and "axis 2" in msg and "dynamic" not in msg


def test_the_total_of_all_activations_is_bounded(monkeypatch):
    monkeypatch.setattr(ir, "MAX_TOTAL_ELEMENTS", 1000)
    nodes = [helper.make_node("Relu", ["input"], ["r0"], name="/relu0/Relu")]
    nodes += [helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"], name=f"/relu{i + 1}/Relu")
              for i in range(8)]
    nodes.append(helper.make_node("Sigmoid", ["r8"], ["output"], name="/Sigmoid"))
    msg = _compile_error(_model(nodes), ShapeError)
    assert "MAX_TOTAL_ELEMENTS" in msg and "/relu" in msg


@pytest.mark.parametrize("attrs, fragment", [
    (dict(strides=[0, 1]), "strides [0, 1]: strides must be at least 1"),
    (dict(pads=[-1, 0, 0, 0]), "pads must not be negative"),
    (dict(dilations=[1, 0]), "dilations must be at least 1"),
    (dict(strides=[1]), "expected 2 integers"),
    (dict(group=0), "group 0"),
    (dict(group=2), "group 2 do not match"),
    (dict(kernel_shape=[5, 5]), "kernel_shape [5, 5] differs"),
])
def test_bad_convolution_attributes_are_refused_at_compile_time_naming_the_node(attrs, fragment):
    msg = _compile_error(_conv_model(**attrs), ShapeError)
    assert "/conv1/Conv" in msg and fragment in msg, msg


def test_a_convolution_kernel_of_size_zero_is_refused():
    msg = _compile_error(_conv_model(w_shape=(4, 3, 0, 3)), ShapeError)
    assert "/conv1/Conv" in msg and "kernel_shape must be at least 1" in msg, msg


@pytest.mark.parametrize("op, attrs, fragment", [
    ("MaxPool", dict(kernel_shape=[0, 2]), "kernel_shape must be at least 1"),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 0]), "strides must be at least 1"),
    ("AveragePool", dict(kernel_shape=[2, 2], pads=[0, -2, 0, 0]), "pads must not be negative"),
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[0, 1]), "dilations must be at least 1"),
    ("MaxPool", {}, "without a kernel_shape"),
    ("MaxPool", dict(kernel_shape=[20_000, 20_000], pads=[10_000] * 4), "input positions"),
    ("LRN", dict(size=0), "LRN size 0"),
])
def test_bad_pooling_attributes_are_refused_naming_the_node(op, attrs, fragment):
    node = helper.make_node(op, ["input"], ["output"], name=f"/pool/{op}", **attrs)
    msg = _compile_error(_model([node]), ShapeError)
    assert f"/pool/{op}" in msg and fragment in msg, msg


def test_attributes_of_the_wrong_type_are_refused_naming_the_node():
    node = helper.make_node("MaxPool", ["input"], ["output"], name="/pool/MaxPool",
                            kernel_shape="3x3")
    msg = _compile_error(_model([node]), ShapeError)
    assert "/pool/MaxPool" in msg and "kernel_shape" in msg


def _constant_then_add(const_node):
    """PyTorch's torch.zeros(...) + x: a folded constant that an Add broadcasts."""
    add = helper.make_node("Add", ["input", "big"], ["output"], name="/Add")
    return _model([*const_node, add])


@pytest.mark.parametrize("nodes", [
    [helper.make_node("Constant", [], ["shape"], name="/Constant",
                      value=numpy_helper.from_array(np.asarray([100_000, 100_000], np.int64))),
     helper.make_node("ConstantOfShape", ["shape"], ["big"], name="/ConstantOfShape")],
    [helper.make_node("Constant", [], ["one"], name="/Constant",
                      value=numpy_helper.from_array(np.ones((1, 1), np.float32))),
     helper.make_node("Constant", [], ["shape"], name="/Constant_1",
                      value=numpy_helper.from_array(np.asarray([100_000, 100_000], np.int64))),
     helper.make_node("Expand", ["one", "shape"], ["big"], name="/Expand")],
    [helper.make_node("Constant", [], ["col"], name="/Constant",
                      value=numpy_helper.from_array(np.ones((100_000, 1), np.float32))),
     helper.make_node("Constant", [], ["row"], name="/Constant_1",
                      value=numpy_helper.from_array(np.ones((1, 100_000), np.float32))),
     helper.make_node("Mul", ["col", "row"], ["big"], name="/Mul")],
    [helper.make_node("Constant", [], ["zero"], name="/Constant",
                      value=numpy_helper.from_array(np.asarray(0, np.int64))),
     helper.make_node("Constant", [], ["limit"], name="/Constant_1",
                      value=numpy_helper.from_array(np.asarray(10**12, np.int64))),
     helper.make_node("Constant", [], ["step"], name="/Constant_2",
                      value=numpy_helper.from_array(np.asarray(1, np.int64))),
     helper.make_node("Range", ["zero", "limit", "step"], ["big"], name="/Range")],
], ids=["ConstantOfShape", "Expand", "broadcast", "Range"])
def test_folded_constants_beyond_the_limit_are_refused_before_they_are_computed(nodes):
    msg = _compile_error(_constant_then_add(nodes), ShapeError)
    assert nodes[-1].name in msg and "MAX_TENSOR_ELEMENTS" in msg, msg


def test_a_resize_beyond_the_limit_is_refused():
    scales = numpy_helper.from_array(np.asarray([1, 1, 10_000, 10_000], np.float32), "scales")
    node = helper.make_node("Resize", ["input", "", "scales"], ["output"], name="/Resize",
                            mode="nearest")
    msg = _compile_error(_model([node], [scales]), ShapeError)
    assert "/Resize" in msg and "MAX_TENSOR_ELEMENTS" in msg


def test_an_initializer_whose_data_does_not_match_its_dims_is_refused():
    w = _weights("conv1.weight", (4, 3, 3, 3))
    w.raw_data = w.raw_data[:-8]
    node = helper.make_node("Conv", ["input", "conv1.weight"], ["output"], name="/conv1/Conv")
    msg = _compile_error(_model([node], [w]), ModelError)
    assert "'conv1.weight'" in msg and "truncated or corrupt" in msg


def test_a_constant_node_whose_tensor_does_not_match_its_dims_is_refused_naming_it():
    t = numpy_helper.from_array(np.ones((2, 3), np.float32))
    t.raw_data = t.raw_data[:5]
    nodes = [helper.make_node("Constant", [], ["k"], name="/Constant", value=t),
             helper.make_node("Mul", ["input", "k"], ["output"], name="/Mul")]
    msg = _compile_error(_model(nodes), ModelError)
    assert "'/Constant'" in msg and "attribute 'value'" in msg


def test_a_node_reading_a_value_nothing_produces_is_refused():
    node = helper.make_node("Add", ["input", "onnx::Add_7"], ["output"], name="/Add")
    msg = _compile_error(_model([node]), ModelError)
    assert "'onnx::Add_7'" in msg and "/Add" in msg


def test_unexpected_failures_inside_the_importer_become_a_model_error(monkeypatch):
    import coacto.frontend.importer as imp

    def broken(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(imp, "fuse_layers", broken)
    msg = _compile_error(_conv_model(), ModelError, internal=True)
    assert "could not import the model (internal error: RuntimeError: boom)" in msg


def test_unexpected_failures_inside_the_partitioner_become_a_model_error(monkeypatch):
    import coacto.partition.rules as part

    monkeypatch.setattr(part, "choose_splits", lambda *a, **kw: 1 / 0)
    msg = _compile_error(_conv_model(), ModelError, internal=True)
    assert "could not partition the model (internal error: ZeroDivisionError" in msg


# -------------------------------------------------------------------------------------------- .ctg


@pytest.fixture(scope="module")
def ctg():
    """(header, blob) of a small real tile graph: conv, pooling, residual, fully connected."""
    nodes = [
        helper.make_node("Conv", ["input", "c.w"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="/pool/MaxPool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
        helper.make_node("Gemm", ["f", "fc.w"], ["output"], name="/fc/Gemm", transB=1),
    ]
    model = _model(nodes, [_weights("c.w", (4, 3, 3, 3)), _weights("fc.w", (5, 64))])
    graph = coacto.compile(model, tiles_per_layer=2)
    return graph._header(), bytes(graph.blob)


def _load(header, blob, error=GraphFileError) -> str:
    data = frame(msgpack.packb(header, use_bin_type=True), blob)
    with pytest.raises(error) as e:
        native_graph(TileGraph.from_bytes(data, "g.ctg"))
    assert not e.value.internal, f"refused only by the safety net: {e.value}"
    msg = str(e.value)
    assert "g.ctg" in msg and "coacto compile" in msg, msg
    return msg


def _changed(ctg, change):
    header, blob = ctg
    h = copy.deepcopy(header)
    change(h)
    return h, blob


def _layer(h, op):
    return next(ld for ld in h["layers"] if ld["op"] == op)


def test_an_unchanged_file_loads(ctg):
    header, blob = ctg
    graph = TileGraph.from_bytes(frame(msgpack.packb(header, use_bin_type=True), blob))
    native_graph(graph)
    assert graph.outputs == {"output": (1, 5)}


@pytest.mark.parametrize("change, fragment", [
    (lambda h: _layer(h, "CONV").__setitem__("op", "CONV3D"), "unknown op 'CONV3D'"),
    (lambda h: h["outputs"].__setitem__("output", 99), "output 'output' refers to layer 99"),
    (lambda h: h["inputs"].__setitem__("input", 2), "not an INPUT"),
    (lambda h: _layer(h, "POOL")["inputs"].__setitem__(0, 7), "inputs = [7] has a value outside"),
    (lambda h: _layer(h, "POOL")["inputs"].__setitem__(0, -1), "has a value outside"),
    (lambda h: _layer(h, "CONV")["attrs"].pop("kh"), "without attributes ['kh']"),
    (lambda h: _layer(h, "CONV")["attrs"].__setitem__("group", 0), "group 0"),
    (lambda h: _layer(h, "CONV")["attrs"].__setitem__("kh", "3"), "is not a number"),
    (lambda h: _layer(h, "CONV")["attrs"].__setitem__("sh", 2**31), "not a 32-bit integer"),
    (lambda h: _layer(h, "CONV")["attrs"].__setitem__("sh", float("nan")),
     "not a 32-bit integer"),
    (lambda h: _layer(h, "INPUT")["attrs"].__setitem__("dtype", 999), "input element type 999"),
    (lambda h: _layer(h, "INPUT")["attrs"].__setitem__("dtype", 16), "input element type 16"),
    (lambda h: h.__setitem__("output_dtypes", {"output": 16}), "output_dtypes {'output': 16}"),
    (lambda h: h.__setitem__("output_dtypes", {"nothing": 10}), "each must name an output"),
    (lambda h: _layer(h, "CONV")["arrays"].pop(), "3 weight arrays, a CONV layer has 4"),
    (lambda h: _layer(h, "CONV")["arrays"][0].__setitem__(3, 1 << 40), "lies outside"),
    (lambda h: _layer(h, "CONV")["arrays"][0].__setitem__(2, [9, 9]), "does not match its shape"),
    (lambda h: _layer(h, "CONV")["arrays"][0].__setitem__(1, "float64"), "dtype 'float64'"),
    (lambda h: _layer(h, "CONV").__setitem__("shape", [1, 10**9, 10**9, 1]),
     "MAX_TENSOR_ELEMENTS"),
    (lambda h: _layer(h, "CONV").__setitem__("shape", [1, 4, 0, 8]), "has a value outside"),
    (lambda h: _layer(h, "CONV").__setitem__("onnx_shape", [1, 4, 8, 9]), "does not hold"),
    (lambda h: _layer(h, "CONV").__setitem__("layout", "diagonal"), "unknown layout"),
    (lambda h: _layer(h, "INPUT").__setitem__("onnx_shape", None), "has no onnx_shape"),
    (lambda h: h.pop("layers"), "has no 'layers'"),
    (lambda h: h.__setitem__("layers", {}), "'layers' is a dict"),
    (lambda h: h["tiles"]["col_bounds"].pop(), "splits 3 and 4 layers"),
    (lambda h: h["tiles"].__setitem__("parents", h["tiles"]["parents"][:-4]),
     "parent offsets"),
    (lambda h: h["tiles"].__setitem__("flops", b""), "disagree with the layer splits"),
    (lambda h: h["tiles"]["col_bounds"].__setitem__(
        1, np.asarray([0, 70, 64], "<i8").tobytes()), "must rise strictly from 0 to 64"),
    (lambda h: h["tiles"].__setitem__("parents", np.full(
        len(h["tiles"]["parents"]) // 4, 10**6, "<i4").tobytes()), "not an earlier tile"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_inconsistent_headers_are_refused_at_load(ctg, change, fragment):
    msg = _load(*_changed(ctg, change))
    assert fragment in msg, msg


def test_a_tile_count_beyond_the_limit_is_refused_before_the_tile_arrays_exist(ctg, monkeypatch):
    import coacto.tilegraph as tgm

    monkeypatch.setattr(tgm, "MAX_TILES", 50)

    def split_finely(h):
        layer = _layer(h, "CONV")
        cols = layer["shape"][0] * layer["shape"][2] * layer["shape"][3]
        li = h["layers"].index(layer)
        h["tiles"]["col_bounds"][li] = np.arange(cols + 1, dtype="<i8").tobytes()

    msg = _load(*_changed(ctg, split_finely))
    assert "more than 50 tiles" in msg


def test_truncated_oversized_and_foreign_files_are_refused(ctg):
    header, blob = ctg
    data = frame(msgpack.packb(header, use_bin_type=True), blob)
    for bad, fragment in [(data[:-1], "truncated"), (data + b"\0", "trailing bytes"),
                          (data[:20], "bad magic"), (b"PK\3\4" + data[4:], "bad magic")]:
        with pytest.raises(GraphFileError, match=fragment):
            TileGraph.from_bytes(bad)
    with pytest.raises(GraphFileError, match="unreadable header"):
        TileGraph.from_bytes(frame(b"\xc1", blob))
    with pytest.raises(GraphFileError, match="not a map"):
        TileGraph.from_bytes(frame(msgpack.packb([1, 2]), blob))


def test_a_bad_file_on_disk_names_itself(ctg, tmp_path):
    header, blob = _changed(ctg, lambda h: h["outputs"].__setitem__("output", 99))
    path = tmp_path / "bad.ctg"
    path.write_bytes(frame(msgpack.packb(header, use_bin_type=True), blob))
    with pytest.raises(GraphFileError, match="bad.ctg is inconsistent: output 'output'"):
        coacto.load(path)
