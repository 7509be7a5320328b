"""One model cut into two tile graphs on one set of packed weights (TileGraph.retiled,
coacto.compiler.repartition, coacto_graph_create_sharing): a device's client offloads with one
graph and computes alone on the other. On a model shaped as PyTorch's exporter writes it (named
/layer/Conv nodes, opset 17, a residual Add, Flatten + Gemm head): each graph's outputs equal
onnxruntime's; the second graph costs no second copy of the weights; it outlives the graph
that packed them, also one read from a .ctg file; and a plan of another model is refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import coacto
from coacto.compiler import partition_graph, repartition
from coacto.errors import CoactoError
from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS
from coacto.tilegraph import TileGraph

from conftest import assert_close

WIDTH = 384  # 3x3 convolutions of 384 -> 384 channels: 5.3 MB of weights each
SIDE = 24


def torch_style_model(width: int = WIDTH, side: int = SIDE) -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def w(*s):
        return (rng.standard_normal(s) * (2 / np.prod(s[1:])) ** 0.5).astype(np.float32)

    nodes = [h.make_node("Conv", ["input", "stem.weight", "stem.bias"], ["/stem/Conv_output_0"],
                         name="/stem/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["/stem/Conv_output_0"], ["/stem/Relu_output_0"],
                         name="/stem/Relu")]
    inits = [nh.from_array(w(width, 3, 3, 3), "stem.weight"),
             nh.from_array(np.zeros(width, np.float32), "stem.bias")]
    x = "/stem/Relu_output_0"
    for i in range(3):
        p = f"/layer{i}"
        nodes += [h.make_node("Conv", [x, f"layer{i}.conv.weight", f"layer{i}.conv.bias"],
                              [f"{p}/conv/Conv_output_0"], name=f"{p}/conv/Conv",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  h.make_node("Add", [f"{p}/conv/Conv_output_0", x], [f"{p}/Add_output_0"],
                              name=f"{p}/Add"),
                  h.make_node("Relu", [f"{p}/Add_output_0"], [f"{p}/Relu_output_0"],
                              name=f"{p}/Relu")]
        inits += [nh.from_array(w(width, width, 3, 3), f"layer{i}.conv.weight"),
                  nh.from_array((rng.standard_normal(width) * 0.1).astype(np.float32),
                                f"layer{i}.conv.bias")]
        x = f"{p}/Relu_output_0"
    nodes += [h.make_node("GlobalAveragePool", [x], ["/pool/GlobalAveragePool_output_0"],
                          name="/pool/GlobalAveragePool"),
              h.make_node("Flatten", ["/pool/GlobalAveragePool_output_0"], ["/Flatten_output_0"],
                          name="/Flatten", axis=1),
              h.make_node("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["output"],
                          name="/fc/Gemm", alpha=1.0, beta=1.0, transB=1)]
    inits += [nh.from_array(w(10, width), "fc.weight"), nh.from_array(np.zeros(10, np.float32), "fc.bias")]
    g = h.make_graph(nodes, "main_graph",
                     [h.make_tensor_value_info("input", T.FLOAT, [1, 3, side, side])],
                     [h.make_tensor_value_info("output", T.FLOAT, [1, 10])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], producer_name="pytorch",
                     producer_version="2.3.0")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def case():
    import onnxruntime as ort

    model = torch_style_model()
    x = np.random.default_rng(3).standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, {"input": x}, {"output": sess.run(None, {"input": x})[0]}


@pytest.mark.parametrize("threads", [1, 2])
def test_both_graphs_match_onnxruntime_and_the_second_outlives_the_first(case, threads):
    model, feeds, ref = case
    off = coacto.compile(model, min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)
    loc = repartition(off, threads=threads)
    # what coacto.compile(model, threads=threads) would cut, under its own graph id
    assert loc.graph_id == coacto.compile(model, threads=threads).graph_id != off.graph_id
    assert loc.n_tiles < off.n_tiles and loc.blob is off.blob
    first = coacto.Runtime(off, threads=threads)
    second = coacto.Runtime(loc, share=first)
    # a graph cut from the retiled one shares the same packed weights (the owner's)
    third = coacto.Runtime(repartition(loc, tiles_per_layer=3), share=second)
    assert_close(first.run(feeds), ref)
    assert_close(second.run(feeds), ref)
    first.close()
    # The packing graph's handle is destroyed now (loc's TileGraph would keep it until it
    # goes): the native graph that holds the packed weights lives on in the sharing graphs.
    off._native._finalizer()
    assert_close(second.run(feeds), ref)
    assert_close(third.run(feeds), ref)


MEMORY_SCRIPT = r"""
import ctypes, gc, sys, numpy as np, psutil, coacto
sys.path.insert(0, sys.argv[1])
from test_retile import torch_style_model
from coacto.compiler import repartition
libc = ctypes.CDLL(None)
def rss():
    gc.collect()
    libc.malloc_trim(0)  # what was freed goes back: packing into it would not show
    return psutil.Process().memory_info().rss
off = coacto.compile(torch_style_model(), min_column_blocks=32)
weights = sum(s.size for specs in off.arrays for s in specs)
feeds = off.example_feeds()
before = rss()
first = coacto.Runtime(off, threads=1)
packed = rss() - before
mid = rss()
second = coacto.Runtime(repartition(off, threads=1), share=first)
second.run(feeds)
print(weights, packed, rss() - mid)
"""


def test_the_second_graph_holds_no_second_copy_of_the_weights():
    """In a process of its own: memory another test freed would hide a copy."""
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    weights, packed, grown = (int(v) for v in out.stdout.split())
    assert weights > 15e6
    # the packing graph holds them (packed) once: the yardstick of a copy
    assert packed > 0.8 * weights, (packed, weights)
    assert grown < 0.2 * weights, f"the retiled graph took {grown / 1e6:.1f} MB more (weights " \
                                  f"{weights / 1e6:.1f} MB, packed {packed / 1e6:.1f} MB)"


def test_a_graph_read_from_a_file_is_retiled(case, tmp_path):
    model, feeds, ref = case
    path = tmp_path / "m.ctg"
    coacto.compile(model, min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS).save(path)
    off = coacto.load(path)  # its blob is a file mapping, its pages dropped once packed
    with coacto.Runtime(off, threads=1) as rt:
        assert_close(rt.run(feeds), ref)
        with coacto.Runtime(repartition(off, threads=1), share=rt) as rt2:
            off._native._finalizer()  # the owner's handle first, as above
            assert_close(rt2.run(feeds), ref)


def test_a_plan_of_another_model_is_refused(case):
    model, _, _ = case
    off = coacto.compile(model)
    # same ops and layer count, other dims: the native runtime compares each layer
    other = coacto.compile(torch_style_model(width=64))
    forged = TileGraph(graph=other.graph, plan=other.plan, params={}, graph_id="0" * 64,
                       blob=b"", arrays=other.arrays, _weights_of=off)
    with pytest.raises(CoactoError, match="differs from layer"):
        coacto.Runtime(forged, threads=1, warmup=False)
    fewer = partition_graph(coacto.compile(one_layer_model()).graph)
    with pytest.raises(ValueError, match="not one of this graph's layers"):
        off.retiled(fewer.plan, {})


def one_layer_model() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 4, 4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
