"""Writes the seed corpora of the loader fuzzers: small valid ONNX models (fuzz/corpus/onnx/) and
their tile graphs (fuzz/corpus/ctg/, no .ctg suffix: that suffix is ignored by git).

    python fuzz/make_seeds.py            # rewrite both corpora
    python fuzz/make_seeds.py --check    # exit 1 if a seed is missing or differs

Each model is a few KB and uses the operator forms exporters write (PyTorch's Conv / BatchNorm
/ Relu / MaxPool / Flatten / Gemm, a residual Add, a Shape -> Gather -> Concat -> Reshape chain,
attention with MatMul / Softmax / LayerNormalization), so a mutation starts from inputs that reach
deep into the importer. The weights come from a fixed seed: the files are reproducible.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgpack
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
OPSET = 13


def _init(rng, name, shape, scale=0.5):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _model(nodes, inputs, outputs, inits, name, opset=OPSET):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="coacto-fuzz-seed")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def cnn(rng) -> onnx.ModelProto:
    """Conv + BatchNorm + Relu, MaxPool, a residual Add, GlobalAveragePool, Flatten, Gemm."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])
    inits = [_init(rng, "c1.w", (4, 3, 3, 3)), _init(rng, "c1.b", (4,)),
             _init(rng, "bn.scale", (4,)), _init(rng, "bn.bias", (4,)),
             _init(rng, "bn.mean", (4,)), numpy_helper.from_array(np.ones(4, np.float32), "bn.var"),
             _init(rng, "c2.w", (4, 4, 1, 1)), _init(rng, "fc.w", (5, 4)), _init(rng, "fc.b", (5,))]
    nodes = [
        helper.make_node("Conv", ["input", "c1.w", "c1.b"], ["c1"], name="/conv1/Conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                         ["bn"], name="/bn1/BatchNormalization", epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r1"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="/maxpool/MaxPool", kernel_shape=[2, 2],
                         strides=[2, 2], pads=[0, 0, 0, 0]),
        helper.make_node("Conv", ["p1", "c2.w"], ["c2"], name="/conv2/Conv", kernel_shape=[1, 1]),
        helper.make_node("Add", ["c2", "p1"], ["sum"], name="/Add"),
        helper.make_node("GlobalAveragePool", ["sum"], ["gap"], name="/avgpool/GlobalAveragePool"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="/Flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="/fc/Gemm",
                         alpha=1.0, beta=1.0, transB=1),
    ]
    return _model(nodes, [x], [y], inits, "cnn")


def shapes(rng) -> onnx.ModelProto:
    """PyTorch's view(): Shape -> Gather -> Unsqueeze -> Concat -> Reshape, then Transpose, Pad,
    Resize (nearest), Concat, Slice, AveragePool and Softmax over the channels."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 3, 3])
    inits = [_ints("zero", 0), _ints("minus1", [-1]), _ints("axes0", [0]),
             numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "scales"),
             _ints("pads", [0, 0, 1, 1, 0, 0, 1, 1]), _ints("starts", [1]), _ints("ends", [7]),
             _ints("axes2", [2]), _ints("axes3", [3])]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="/Gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"], name="/Unsqueeze"),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], name="/Concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="/Reshape"),
        helper.make_node("Reshape", ["flat", "shape"], ["back"], name="/Reshape_1"),
        helper.make_node("Transpose", ["back"], ["t"], name="/Transpose", perm=[0, 1, 3, 2]),
        helper.make_node("Pad", ["t", "pads"], ["padded"], name="/Pad", mode="constant"),
        helper.make_node("Resize", ["x", "", "scales"], ["up"], name="/Resize", mode="nearest"),
        helper.make_node("Slice", ["up", "starts", "ends", "axes2"], ["cut"], name="/Slice"),
        helper.make_node("Slice", ["cut", "starts", "ends", "axes3"], ["cut2"],
                         name="/Slice_1"),
        helper.make_node("Concat", ["cut2", "padded"], ["cat"], name="/Concat_1", axis=1),
        helper.make_node("AveragePool", ["cat"], ["pool"], name="/AveragePool",
                         kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=0),
        helper.make_node("Softmax", ["pool"], ["y"], name="/Softmax", axis=1),
    ]
    return _model(nodes, [x], [y], inits, "shapes")


def attention(rng) -> onnx.ModelProto:
    """One attention block over (B, S, D) = (1, 4, 8) as transformers exporters write it: token ids
    through an embedding Gather, LayerNormalization, MatMul + Add projections, a head split by
    Reshape + Transpose, scaled Q K^T, Softmax over the last axis, and a Gelu-free MLP."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])
    y = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, 4, 8])
    d, h = 8, 2
    inits = [_init(rng, "emb", (16, d)), _init(rng, "ln.g", (d,)), _init(rng, "ln.b", (d,)),
             _init(rng, "q.w", (d, d)), _init(rng, "k.w", (d, d)), _init(rng, "v.w", (d, d)),
             _init(rng, "q.b", (d,)), _init(rng, "o.w", (d, d)), _init(rng, "fc.w", (d, d)),
             _ints("heads", [1, 4, h, d // h]), _ints("merged", [1, 4, d]),
             numpy_helper.from_array(np.asarray(1.0 / np.sqrt(d // h), np.float32), "scale")]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["x"], name="/embeddings/Gather", axis=0),
        helper.make_node("LayerNormalization", ["x", "ln.g", "ln.b"], ["xn"],
                         name="/ln/LayerNormalization", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["xn", "q.w"], ["q0"], name="/q/MatMul"),
        helper.make_node("Add", ["q0", "q.b"], ["q1"], name="/q/Add"),
        helper.make_node("MatMul", ["xn", "k.w"], ["k0"], name="/k/MatMul"),
        helper.make_node("MatMul", ["xn", "v.w"], ["v0"], name="/v/MatMul"),
        helper.make_node("Reshape", ["q1", "heads"], ["q2"], name="/Reshape"),
        helper.make_node("Transpose", ["q2"], ["q"], name="/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k0", "heads"], ["k2"], name="/Reshape_1"),
        helper.make_node("Transpose", ["k2"], ["kt"], name="/Transpose_1", perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["v0", "heads"], ["v2"], name="/Reshape_2"),
        helper.make_node("Transpose", ["v2"], ["v"], name="/Transpose_2", perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"], name="/MatMul"),
        helper.make_node("Mul", ["s0", "scale"], ["s1"], name="/Mul"),
        helper.make_node("Softmax", ["s1"], ["p"], name="/Softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c0"], name="/MatMul_1"),
        helper.make_node("Transpose", ["c0"], ["c1"], name="/Transpose_3", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "merged"], ["c"], name="/Reshape_3"),
        helper.make_node("MatMul", ["c", "o.w"], ["o"], name="/o/MatMul"),
        helper.make_node("Add", ["o", "x"], ["res"], name="/Add"),
        helper.make_node("MatMul", ["res", "fc.w"], ["f"], name="/fc/MatMul"),
        helper.make_node("Tanh", ["f"], ["hidden"], name="/Tanh"),
    ]
    return _model(nodes, [ids], [y], inits, "attention", opset=17)  # LayerNormalization


MODELS = {"cnn": cnn, "shapes": shapes, "attention": attention}


def seeds() -> dict[str, bytes]:
    """{relative path: bytes} of every seed."""
    import coacto
    from coacto.tilegraph import frame

    out = {}
    for i, (name, build) in enumerate(MODELS.items()):
        model = build(np.random.default_rng(i))
        data = model.SerializeToString()
        out[f"corpus/onnx/{name}.onnx"] = data
        graph = coacto.compile(data, tiles_per_layer=2)
        header = msgpack.packb(graph._header(), use_bin_type=True)
        out[f"corpus/ctg/{name}"] = frame(header, graph.blob)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    stale = []
    for rel, data in seeds().items():
        path = HERE / rel
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"{rel}: {len(data)} bytes")
    if stale:
        print("stale seeds (run python fuzz/make_seeds.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
