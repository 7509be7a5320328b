"""Transformers on the tile runtime: every operator form PyTorch's exporters write for them, fused
as coacto fuses them, equals onnxruntime (max |error| <= 1e-4 * max |reference|) in the numpy
reference and in the native runtime across tile and thread counts; the zoo's BERT, GPT-2 and ViT in
both exporter forms likewise (small instances for every tiling, one full-size run each).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import ir
from coacto.errors import InputError, UnsupportedOperatorError
from coacto.frontend import import_model
from coacto.reference import run_reference

from conftest import assert_close, assert_native_matches

F, I64 = TensorProto.FLOAT, TensorProto.INT64
TILES = (1, 7, 64, None)
THREADS = (1, 2, 4)
FLOAT_MIN = float(np.finfo(np.float32).min)


# ------------------------------------------------------------------------------------- helpers

def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or f"{op}_{outs[0]}", **attrs)


def make(nodes, inputs, outputs, inits=None, opset=14):
    """inputs: {name: (shape, elem_type)}; inits: {name: array}."""
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def ort_run(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def check(model, feeds, tiles=(1, 7, None), threads=(1, 2)):
    """Reference and native runtime against onnxruntime; returns the imported graph."""
    ref = ort_run(model, feeds)
    graph = import_model(model)
    assert_close(run_reference(graph, feeds), ref)
    assert_native_matches(model, feeds, ref, tiles, threads, timeout=60)
    return graph


def ops(graph):
    return [layer.op for layer in graph.layers]


# ------------------------------------------------------------------------- MatMul of activations

MATMUL_CASES = {
    # name: (shape a, shape b, transpose of b before the product or None)
    "batched heads": ((2, 3, 5, 4), (2, 3, 4, 6), None),
    "transposed keys": ((1, 4, 6, 8), (1, 4, 6, 8), (0, 1, 3, 2)),
    "broadcast batch": ((2, 3, 5, 4), (3, 4, 7), None),
    "broadcast leading one": ((1, 2, 5, 4), (3, 1, 4, 2), None),
    "rank 3 x rank 2": ((2, 5, 4), (4, 6), None),
    "vector x matrix": ((4,), (2, 4, 3), None),
    "matrix x vector": ((2, 5, 4), (4,), None),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_of_two_activations(case):
    sa, sb, perm = MATMUL_CASES[case]
    nodes, b = [], "b"
    if perm is not None:
        nodes.append(node("Transpose", ["b"], ["bt"], perm=list(perm)))
        b = "bt"
    nodes.append(node("MatMul", ["a", b], ["y"]))
    model = make(nodes, {"a": (list(sa), F), "b": (list(sb), F)}, ["y"])
    graph = check(model, {"a": rand(*sa, seed=1), "b": rand(*sb, seed=2)})
    assert "MATMUL" in ops(graph)


def test_matmul_with_a_constant_on_either_side():
    w, v = rand(6, 4, seed=3), rand(5, 3, seed=4)
    nodes = [node("MatMul", ["w", "x"], ["wx"]), node("MatMul", ["x", "v"], ["xv"]),
             node("Relu", ["wx"], ["y1"]), node("Relu", ["xv"], ["y2"])]
    model = make(nodes, {"x": ([2, 4, 5], F)}, ["y1", "y2"], {"w": w, "v": v})
    graph = check(model, {"x": rand(2, 4, 5, seed=1)})
    assert ops(graph).count("CONV") == 2 and "MATMUL" not in ops(graph)


def test_head_split_and_merge_cost_no_copy():
    """Q K^T and P V read a (B, S, h*dh) projection per head through strides, and the context is
    written with the heads side by side: no GATHER between the projections and the output one.
    The scores, their softmax and the context are one ATTENTION layer."""
    b, s, d, h = 1, 6, 8, 2
    dh = d // h
    inits = {f"w{k}": rand(d, d, seed=i, scale=0.3) for i, k in enumerate("qkvo")}
    inits.update(split=np.array([b, s, h, dh], np.int64), merge=np.array([b, s, d], np.int64),
                 scale=np.array(np.sqrt(dh), np.float32))
    nodes = []
    for k in "qkv":
        nodes += [node("MatMul", ["x", f"w{k}"], [f"{k}p"]),
                  node("Reshape", [f"{k}p", "split"], [f"{k}r"])]
    nodes += [node("Transpose", ["qr"], ["qt"], perm=[0, 2, 1, 3]),
              node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
              node("Transpose", ["vr"], ["vt"], perm=[0, 2, 1, 3]),
              node("MatMul", ["qt", "kt"], ["sc"]), node("Div", ["sc", "scale"], ["ss"]),
              node("Softmax", ["ss"], ["p"], axis=-1), node("MatMul", ["p", "vt"], ["ctx"]),
              node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
              node("Reshape", ["ct", "merge"], ["cm"]), node("MatMul", ["cm", "wo"], ["y"])]
    model = make(nodes, {"x": ([b, s, d], F)}, ["y"], inits)
    graph = check(model, {"x": rand(b, s, d, seed=9)}, tiles=(1, 3, 64, None), threads=(1, 3))
    assert ops(graph) == ["INPUT", "CONV", "CONV", "CONV", "ATTENTION", "CONV"]
    att = graph.layers[4]
    assert att.attrs["scale"] == pytest.approx(1 / np.sqrt(dh)) and att.attrs["out_mode"] == 1
    assert att.inputs == [1, 2, 3] and (att.attrs["dv"], att.attrs["v_sk"]) == (dh, d)


def test_attention_whose_probabilities_are_an_output_stays_three_layers():
    """Attention weights asked for as an output (output_attentions=True) are computed and kept:
    no ATTENTION layer, the scores, softmax and context as MATMUL, SOFTMAX, MATMUL."""
    b, h, s, dh = 1, 2, 7, 4
    nodes = [node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], ["sc"]), node("Softmax", ["sc"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["y"])]
    shape = [b, h, s, dh]
    model = make(nodes, {"q": (shape, F), "k": (shape, F), "v": (shape, F)}, ["y", "p"])
    graph = check(model, {"q": rand(*shape, seed=1), "k": rand(*shape, seed=2),
                          "v": rand(*shape, seed=3)})
    assert ops(graph).count("MATMUL") == 2 and "SOFTMAX" in ops(graph)
    assert "ATTENTION" not in ops(graph)


# ------------------------------------------------------------------------------ normalisation

def layernorm_nodes(x, y, prefix, form):
    """LayerNorm of x over its last axis as TorchScript (opset < 17) or the fused node writes."""
    if form == "fused":
        return [node("LayerNormalization", [x, f"{prefix}g", f"{prefix}b"], [y], axis=-1,
                     epsilon=1e-5)]
    return [node("ReduceMean", [x], [f"{prefix}m"], axes=[-1]),
            node("Sub", [x, f"{prefix}m"], [f"{prefix}d"]),
            node("Pow", [f"{prefix}d", f"{prefix}two"], [f"{prefix}q"]),
            node("ReduceMean", [f"{prefix}q"], [f"{prefix}v"], axes=[-1]),
            node("Add", [f"{prefix}v", f"{prefix}eps"], [f"{prefix}ve"]),
            node("Sqrt", [f"{prefix}ve"], [f"{prefix}s"]),
            node("Div", [f"{prefix}d", f"{prefix}s"], [f"{prefix}n"]),
            node("Mul", [f"{prefix}n", f"{prefix}g"], [f"{prefix}ng"]),
            node("Add", [f"{prefix}ng", f"{prefix}b"], [y])]


def layernorm_inits(prefix, d, seed=0):
    rng = np.random.default_rng(seed)
    return {f"{prefix}g": rng.uniform(0.5, 1.5, d).astype(np.float32),
            f"{prefix}b": rng.normal(size=d).astype(np.float32),
            f"{prefix}two": np.array(2.0, np.float32), f"{prefix}eps": np.array(1e-5, np.float32)}


@pytest.mark.parametrize("form,opset", [("decomposed", 13), ("decomposed", 14),
                                        ("fused", 17), ("fused", 18)])
def test_layer_normalization_is_one_layer(form, opset):
    model = make(layernorm_nodes("x", "y", "ln", form), {"x": ([2, 5, 12], F)}, ["y"],
                 layernorm_inits("ln", 12), opset=opset)
    graph = check(model, {"x": rand(2, 5, 12, seed=1, scale=3.0) + 10.0})
    assert ops(graph) == ["INPUT", "LAYERNORM"]


def test_rms_norm_runs_unfused():
    """A normalisation of another form runs as its parts (ROW_REDUCE, BINARY, AFFINE)."""
    nodes = [node("Mul", ["x", "x"], ["sq"]), node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             node("Add", ["ms", "eps"], ["mse"]), node("Sqrt", ["mse"], ["r"]),
             node("Reciprocal", ["r"], ["ri"]), node("Mul", ["x", "ri"], ["y"])]
    model = make(nodes, {"x": ([1, 4, 16], F)}, ["y"], {"eps": np.array(1e-6, np.float32)})
    graph = check(model, {"x": rand(1, 4, 16, seed=2)})
    assert "ROW_REDUCE" in ops(graph) and "LAYERNORM" not in ops(graph)


# ----------------------------------------------------------------------------------------- GELU

def gelu_erf_nodes(x, y, order):
    if order == "torchscript":  # x * 0.5 * (1 + erf(x / sqrt 2)) as torch.onnx writes F.gelu
        return [node("Div", [x, "sqrt2"], ["g1"]), node("Erf", ["g1"], ["g2"]),
                node("Add", ["g2", "one"], ["g3"]), node("Mul", [x, "g3"], ["g4"]),
                node("Mul", ["g4", "half"], [y])]
    return [node("Mul", [x, "half"], ["g0"]), node("Div", [x, "sqrt2"], ["g1"]),  # HF BERT
            node("Erf", ["g1"], ["g2"]), node("Add", ["one", "g2"], ["g3"]),
            node("Mul", ["g0", "g3"], [y])]


def gelu_tanh_nodes(x, y):
    """GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))."""
    return [node("Mul", ["half", x], ["t0"]), node("Pow", [x, "three"], ["t1"]),
            node("Mul", ["c", "t1"], ["t2"]), node("Add", [x, "t2"], ["t3"]),
            node("Mul", ["k", "t3"], ["t4"]), node("Tanh", ["t4"], ["t5"]),
            node("Add", ["one", "t5"], ["t6"]), node("Mul", ["t0", "t6"], [y])]


GELU_CONSTS = {"sqrt2": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32),
               "half": np.array(0.5, np.float32), "three": np.array(3.0, np.float32),
               "c": np.array(0.044715, np.float32),
               "k": np.array(np.sqrt(2 / np.pi), np.float32)}


@pytest.mark.parametrize("form", ["torchscript", "hf", "tanh", "op_none", "op_tanh"])
def test_gelu_fuses_into_the_linear_layer(form):
    w, bias = rand(8, 16, seed=1, scale=0.5), rand(16, seed=2)
    nodes = [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "bias"], ["h"])]
    opset = 14
    if form in ("torchscript", "hf"):
        nodes += gelu_erf_nodes("h", "y", form)
    elif form == "tanh":
        nodes += gelu_tanh_nodes("h", "y")
    else:
        nodes.append(node("Gelu", ["h"], ["y"], approximate=form[3:]))
        opset = 20
    model = make(nodes, {"x": ([1, 6, 8], F)}, ["y"], dict(GELU_CONSTS, w=w, bias=bias),
                 opset=opset)
    graph = check(model, {"x": rand(1, 6, 8, seed=3, scale=2.0)})
    assert ops(graph) == ["INPUT", "CONV"]
    want = ir.ACT_GELU_TANH if "tanh" in form else ir.ACT_GELU
    assert graph.layers[1].attrs["act"] == want


def test_erf_alone_is_an_activation():
    model = make([node("Erf", ["x"], ["y"])], {"x": ([3, 7], F)}, ["y"])
    graph = check(model, {"x": rand(3, 7, seed=1, scale=2.0)})
    assert graph.layers[1].attrs["act"] == ir.ACT_ERF


# ------------------------------------------------------------------------------- masks, guards

def test_padding_mask_from_int64_input_is_a_matmul_input():
    """BERT's extended mask: (1 - mask[:, None, None, :].float()) * finfo.min, added to the
    scaled scores; fused into the scores' MATMUL."""
    b, h, s, dh = 2, 2, 5, 4
    nodes = [node("Unsqueeze", ["mask", "ax12"], ["m4"]),
             node("Cast", ["m4"], ["mf"], to=F), node("Sub", ["one", "mf"], ["inv"]),
             node("Mul", ["inv", "fmin"], ["add"]),
             node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], ["sc"]), node("Div", ["sc", "scale"], ["ss"]),
             node("Add", ["ss", "add"], ["sm"]), node("Softmax", ["sm"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["y"])]
    inits = {"ax12": np.array([1, 2], np.int64), "one": np.array(1.0, np.float32),
             "fmin": np.array(FLOAT_MIN, np.float32), "scale": np.array(2.0, np.float32)}
    shape = [b, h, s, dh]
    model = make(nodes, {"q": (shape, F), "k": (shape, F), "v": (shape, F),
                         "mask": ([b, s], I64)}, ["y"], inits)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    feeds = {"q": rand(*shape, seed=1), "k": rand(*shape, seed=2), "v": rand(*shape, seed=3),
             "mask": mask}
    graph = check(model, feeds)
    att = next(layer for layer in graph.layers if layer.op == "ATTENTION")
    assert att.attrs["has_mask"] == 1 and att.attrs["scale"] == 0.5
    assert "BINARY" not in ops(graph)


@pytest.mark.parametrize("form", ["where", "add_min", "add_inf"])
def test_causal_mask_removes_work(form):
    """GPT-2's Where(tril, scores, finfo.min) -- or an additive constant mask -- becomes a causal
    ATTENTION that sums over earlier tokens only: a query tile depends only on the key and value
    tiles of tokens up to its last."""
    s, d = 96, 8
    tril = np.tril(np.ones((1, 1, 128, 128), bool))
    inits = {"wq": rand(d, d, seed=1), "wk": rand(d, d, seed=2), "wv": rand(d, d, seed=3),
             "tril": tril, "st": np.array([0, 0], np.int64), "en": np.array([s, s], np.int64),
             "ax": np.array([2, 3], np.int64), "fill": np.array(FLOAT_MIN, np.float32),
             "add": np.where(np.tril(np.ones((s, s), bool)), 0.0,
                             -np.inf if form == "add_inf" else FLOAT_MIN).astype(np.float32)}
    nodes = [node("MatMul", ["x", "wq"], ["q"]), node("MatMul", ["x", "wk"], ["k"]),
             node("MatMul", ["x", "wv"], ["v"]), node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             node("MatMul", ["q", "kt"], ["sc"])]
    if form == "where":
        nodes += [node("Slice", ["tril", "st", "en", "ax"], ["cm"]),
                  node("Squeeze", ["cm", "sq"], ["c2"]),
                  node("Where", ["c2", "sc", "fill"], ["sm"])]
        inits["sq"] = np.array([0], np.int64)
    else:
        nodes.append(node("Add", ["sc", "add"], ["sm"]))
    nodes += [node("Softmax", ["sm"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["y"])]
    model = make(nodes, {"x": ([1, s, d], F)}, ["y"], inits)
    graph = check(model, {"x": rand(1, s, d, seed=5, scale=0.5)}, tiles=(1, 4, None))
    att = next(layer for layer in graph.layers if layer.op == "ATTENTION")
    assert att.attrs["causal"] == 1 and att.attrs["offset"] == 0
    # A tile of queries [c0, c1) needs the key and value tokens below c1 only: the first query
    # tile does not wait for the keys and values of later tokens.
    tg = coacto.compile(model, tiles_per_layer=4)
    plan = tg.plan
    li = next(i for i, layer in enumerate(tg.graph.layers) if layer.op == "ATTENTION")
    fewer = 0
    for source in tg.graph.layers[li].inputs[1:3]:
        n_tiles = plan.layer_first_tile[source + 1] - plan.layer_first_tile[source]
        for t in range(plan.layer_first_tile[li], plan.layer_first_tile[li + 1]):
            c0, c1, r0, r1 = plan.tile_bounds[t]
            read = [p for p in tg.dependencies(t) if plan.tile_layer[p] == source]
            assert read and all(plan.tile_bounds[p][0] < c1 for p in read)
            fewer += len(read) < n_tiles
    assert fewer > 0


def test_causal_scores_with_a_padding_mask_stay_three_layers():
    """GPT-2 with an attention mask on left padding: Where(tril, scores, finfo.min) plus
    (1 - mask) * finfo.min. A padded query's kept keys then score as low as the left-out ones and
    the softmax counts both, so no ATTENTION (which would leave the later keys out): outputs
    equal onnxruntime's on every query, the padded ones included."""
    b, h, s, dh = 1, 2, 5, 4
    nodes = [node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], ["sc"]), node("Where", ["tril", "sc", "fmin"], ["sw"]),
             node("Unsqueeze", ["mask", "ax12"], ["m4"]), node("Cast", ["m4"], ["mf"], to=F),
             node("Sub", ["one", "mf"], ["inv"]), node("Mul", ["inv", "fmin"], ["add"]),
             node("Add", ["sw", "add"], ["sm"]), node("Softmax", ["sm"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["y"])]
    inits = {"ax12": np.array([1, 2], np.int64), "one": np.array(1.0, np.float32),
             "fmin": np.array(FLOAT_MIN, np.float32), "tril": np.tril(np.ones((s, s), bool))}
    shape = [b, h, s, dh]
    model = make(nodes, {"q": (shape, F), "k": (shape, F), "v": (shape, F),
                         "mask": ([b, s], I64)}, ["y"], inits)
    feeds = {"q": rand(*shape, seed=1), "k": rand(*shape, seed=2), "v": rand(*shape, seed=3),
             "mask": np.array([[0, 0, 1, 1, 1]], np.int64)}
    graph = check(model, feeds)
    assert "ATTENTION" not in ops(graph)
    scores = next(layer for layer in graph.layers if layer.op == "MATMUL")
    assert scores.attrs["causal"] == 1 and scores.attrs["has_mask"] == 1


def test_isnan_of_a_view_casts_to_bool():
    """IsNaN of a transposed tensor (computed on its source, read through the view), then Cast to
    bool and back: comparisons stay 0 / 1 values without extra layers."""
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), node("IsNaN", ["t"], ["n"]),
             node("Cast", ["n"], ["b"], to=TensorProto.BOOL), node("Cast", ["b"], ["y"], to=F)]
    model = make(nodes, {"x": ([1, 3, 4], F)}, ["y"])
    x = rand(1, 3, 4, seed=1)
    x[0, 2, 1] = np.nan
    graph = check(model, {"x": x})
    assert ops(graph).count("AFFINE") == 1


def test_softmax_guarded_by_where_isnan():
    """Where(IsNaN(p), 0, p) after a softmax, and Equal / Not / Where on a mask: elementwise ops."""
    nodes = [node("Softmax", ["x"], ["p"], axis=-1), node("IsNaN", ["p"], ["nan"]),
             node("Where", ["nan", "zero", "p"], ["g"]), node("Equal", ["m", "zero_i"], ["eq"]),
             node("Not", ["eq"], ["keep"]), node("Unsqueeze", ["keep", "ax"], ["k3"]),
             node("Where", ["k3", "g", "zero"], ["y"])]
    inits = {"zero": np.array(0.0, np.float32), "zero_i": np.array(0, np.int64),
             "ax": np.array([1], np.int64)}
    model = make(nodes, {"x": ([2, 3, 5], F), "m": ([2, 5], I64)}, ["y"], inits)
    x = rand(2, 3, 5, seed=1)
    x[0, 1, 2] = np.nan
    feeds = {"x": x, "m": np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], np.int64)}
    ref = ort_run(model, feeds)
    graph = import_model(model)
    assert {"WHERE", "BINARY"} <= set(ops(graph))
    np.testing.assert_array_equal(np.isnan(run_reference(graph, feeds)["y"]), np.isnan(ref["y"]))
    with coacto.Runtime(coacto.compile(model, tiles_per_layer=3), threads=2) as rt:
        got = rt.run(feeds)["y"]
    np.testing.assert_allclose(got, ref["y"], rtol=1e-5, atol=1e-6)


def test_fully_masked_rows_are_zeroed_as_onnx_attention_spells_it():
    """ONNX's Attention function: a bool mask becomes a bias Where(mask, 0, -inf), and rows whose
    bias is all -inf (ReduceMax equals CastLike(-inf, bias)) get zero weights instead of the
    softmax's NaN. A Where with an infinite branch holds no integers: the CastLike stays -inf."""
    nodes = [node("Where", ["mask", "zero", "ninf"], ["bias"]),
             node("Add", ["x", "bias"], ["s"]), node("Softmax", ["s"], ["p"], axis=-1),
             node("ReduceMax", ["bias"], ["rmax"], axes=[-1], keepdims=1),
             node("CastLike", ["ninf", "bias"], ["ninf_t"]),
             node("Equal", ["rmax", "ninf_t"], ["dead"]),
             node("Where", ["dead", "zero", "p"], ["y"])]
    inits = {"zero": np.array(0.0, np.float32), "ninf": np.array(-np.inf, np.float32)}
    model = make(nodes, {"x": ([2, 3, 4], F), "mask": ([3, 4], TensorProto.BOOL)}, ["y"], inits,
                 opset=17)
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], bool)
    feeds = {"x": rand(2, 3, 4, seed=2), "mask": mask}
    ref = ort_run(model, feeds)
    assert np.isfinite(ref["y"]).all() and not ref["y"][:, 1].any()
    with coacto.Runtime(coacto.compile(model, tiles_per_layer=3), threads=2) as rt:
        got = rt.run(feeds)["y"]
    np.testing.assert_allclose(got, ref["y"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------- embeddings

def embedding_model():
    v, d, s = 11, 6, 5
    nodes = [node("Gather", ["table", "ids"], ["e"]),
             node("Gather", ["pos", "positions"], ["p"]),  # a constant lookup: folded
             node("Add", ["e", "p"], ["y"])]
    inits = {"table": rand(v, d, seed=1), "pos": rand(8, d, seed=2),
             "positions": np.arange(s, dtype=np.int64)[None]}
    return make(nodes, {"ids": ([2, s], I64)}, ["y"], inits)


def test_constant_gathers_fold():
    """Gather / GatherElements on constants (position tables, relative offsets) fold away."""
    nodes = [node("GatherElements", ["table", "gi"], ["g"], axis=1),
             node("Gather", ["g", "row"], ["r"], axis=0), node("Add", ["x", "r"], ["y"])]
    inits = {"table": rand(3, 4, seed=1), "gi": np.array([[3, 2, 1, 0]] * 3, np.int64),
             "row": np.array(1, np.int64)}
    model = make(nodes, {"x": ([2, 4], F)}, ["y"], inits)
    graph = check(model, {"x": rand(2, 4, seed=2)})
    assert ops(graph) == ["INPUT", "AFFINE"]


def test_embedding_of_int64_ids():
    model = embedding_model()
    ids = np.array([[0, 10, -1, 3, -11], [5, 5, 2, 9, 1]], np.int64)
    graph = check(model, {"ids": ids})
    assert ops(graph) == ["INPUT", "EMBED", "BINARY"]
    assert graph.layers[0].attrs["index_limit"] == 11


@pytest.mark.parametrize("bad", [11, -12, 1 << 40])
def test_out_of_range_ids_are_an_input_error(bad):
    tg = coacto.compile(embedding_model())
    ids = np.zeros((2, 5), np.int64)
    ids[1, 3] = bad
    with coacto.Runtime(tg, threads=1) as rt:
        with pytest.raises(InputError, match="ids"):
            rt.run({"ids": ids})
        with pytest.raises(InputError, match="integers"):
            rt.run({"ids": ids.astype(np.float32)})


def test_class_token_concatenated_to_patches():
    """ViT's embedding: Conv patches -> Flatten(2) -> Transpose -> Concat(cls, .) -> + pos."""
    w = rand(8, 3, 4, 4, seed=1, scale=0.2)
    nodes = [node("Conv", ["img", "w"], ["c"], strides=[4, 4]),
             node("Reshape", ["c", "fshape"], ["f"]),  # x.flatten(2)
             node("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
             node("Concat", ["cls", "t"], ["x"], axis=1), node("Add", ["x", "pos"], ["y"])]
    inits = {"w": w, "fshape": np.array([1, 8, 4], np.int64), "cls": rand(1, 1, 8, seed=2),
             "pos": rand(1, 5, 8, seed=3)}
    model = make(nodes, {"img": ([1, 3, 8, 8], F)}, ["y"], inits)
    graph = check(model, {"img": rand(1, 3, 8, 8, seed=4)})
    gathers = [layer for layer in graph.layers if layer.op == "GATHER"]
    assert len(gathers) == 1 and "const" in gathers[0].weights


def test_folded_shape_arithmetic_and_expand():
    """Shape -> Gather -> Range / ConstantOfShape / Expand on sizes fold at compile time."""
    nodes = [node("Shape", ["x"], ["sh"]), node("Gather", ["sh", "one"], ["s"]),
             node("Range", ["zero", "s", "step"], ["r"]), node("Unsqueeze", ["r", "ax"], ["r2"]),
             node("Cast", ["r2"], ["rf"], to=F), node("ConstantOfShape", ["sh"], ["z"],
                                                      value=helper.make_tensor("v", F, [1], [0.5])),
             node("Expand", ["rf", "sh2"], ["e"]), node("Add", ["x", "e"], ["a"]),
             node("Add", ["a", "z"], ["y"])]
    inits = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64),
             "step": np.array(1, np.int64), "ax": np.array([-1], np.int64),
             "sh2": np.array([2, 4, 3], np.int64)}
    model = make(nodes, {"x": ([2, 4, 3], F)}, ["y"], inits)
    graph = check(model, {"x": rand(2, 4, 3, seed=1)})
    assert ops(graph) == ["INPUT", "BINARY", "BINARY"]  # x + positions, + 0.5 everywhere


# --------------------------------------------------------------------------------------- errors

def test_unsupported_sequence_forms_are_listed():
    nodes = [node("Reshape", ["a", "s5"], ["a5"]), node("Reshape", ["b", "s5"], ["b5"]),
             node("MatMul", ["a5", "b5"], ["m"], name="batch3"),
             node("Gather", ["x", "idx"], ["gx"], name="gather_computed"),
             node("Relu", ["m"], ["y1"])]
    model = make(nodes, {"a": ([4, 2, 3, 3], F), "b": ([4, 2, 3, 3], F),
                         "x": ([2, 3, 4], F), "idx": ([2], I64)},
                 ["y1", "gx"], {"s5": np.array([2, 2, 2, 3, 3], np.int64)}, opset=17)
    with pytest.raises(UnsupportedOperatorError) as e:
        import_model(model)
    names = [n for n, _ in e.value.nodes]
    assert names == ["batch3", "gather_computed"]


# ----------------------------------------------------------------------------------- zoo models

SMALL = {"bert": dict(layers=2, hidden=32, heads=4, ffn=64, vocab=50, seq_len=12),
         "gpt2": dict(layers=2, hidden=32, heads=4, ffn=64, vocab=50, seq_len=12),
         "vit": dict(layers=2, hidden=32, heads=4, ffn=64, image_size=32, num_classes=10)}


def zoo_case(name, style, **kw):
    from coacto import zoo

    model = zoo.build(name, style=style, **kw)
    feeds = zoo.input_feeds(model, seed=1)
    return model, feeds, ort_run(model, feeds)


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
@pytest.mark.parametrize("style", ["default", "fused"])
def test_zoo_transformer_matches_onnxruntime(name, style):
    model, feeds, ref = zoo_case(name, style, **SMALL[name])
    graph = import_model(model)
    assert_close(run_reference(graph, feeds), ref)
    n_layers = SMALL[name]["layers"]
    assert ops(graph).count("ATTENTION") == n_layers  # scores, softmax and context
    assert ops(graph).count("LAYERNORM") >= 2 * n_layers
    assert "MATMUL" not in ops(graph) and "SOFTMAX" not in ops(graph)
    assert_native_matches(model, feeds, ref, TILES, THREADS, f"{name}/{style}")


@pytest.mark.parametrize("name,opset", [("bert", 11), ("bert", 13), ("gpt2", 17), ("vit", 18)])
def test_zoo_transformer_opsets(name, opset):
    model, feeds, ref = zoo_case(name, "default", opset=opset, **SMALL[name])
    with coacto.Runtime(coacto.compile(model), threads=2) as rt:
        assert_close(rt.run(feeds, timeout=120), ref)


def test_bert_padding_mask_with_padded_tokens():
    from coacto import zoo

    model = zoo.build("bert", **SMALL["bert"])
    feeds = zoo.input_feeds(model, seed=2)
    feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    feeds["attention_mask"][0, 7:] = 0
    ref = ort_run(model, feeds)
    with coacto.Runtime(coacto.compile(model, tiles_per_layer=5), threads=2) as rt:
        assert_close(rt.run(feeds), ref)


def test_transformer_tile_graph_file_round_trip(tmp_path):
    model, feeds, ref = zoo_case("gpt2", "default", **SMALL["gpt2"])
    tg = coacto.compile(model, tiles_per_layer=7)
    path = tg.save(tmp_path / "gpt2.ctg")
    back = coacto.load(path)
    assert back.graph_id == tg.graph_id and back.n_tiles == tg.n_tiles
    assert [layer.layout for layer in back.graph.layers] == [layer.layout
                                                            for layer in tg.graph.layers]
    with coacto.Runtime(back, threads=2) as rt:
        assert_close(rt.run(feeds), ref)


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
def test_full_size_transformer(name):
    """The full-size model once, default tiles, two threads (under ~20 s each here)."""
    t0 = time.perf_counter()
    model, feeds, ref = zoo_case(name, "default")
    tg = coacto.compile(model)
    with coacto.Runtime(tg, threads=2) as rt:
        assert_close(rt.run(feeds, timeout=120), ref)
    assert time.perf_counter() - t0 < 60


def test_onnx_model_with_local_functions_is_inlined():
    """Exporters may wrap ops in model-local functions; they are inlined at import."""
    fn = helper.make_function("custom", "Scale", ["x"], ["y"],
                              [helper.make_node("Mul", ["x", "x"], ["y"])],
                              [helper.make_opsetid("", 18)])
    nodes = [helper.make_node("Scale", ["x"], ["y"], domain="custom", name="scale")]
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, functions=[fn],
                              opset_imports=[helper.make_opsetid("", 18),
                                             helper.make_opsetid("custom", 1)])
    model.ir_version = 8
    assert model.functions and import_model(model).layers[1].op == "BINARY"
    check(model, {"x": rand(2, 3, seed=1)})


@pytest.mark.parametrize("policy", ["local", "cloud", "split", "fl", "dynamic"])
def test_offloaded_transformer_matches_onnxruntime(policy):
    """GPT-2 through a server over ZeroMQ: token ids travel as the input layer's float tiles,
    the server computes attention tiles; every policy gives onnxruntime's logits."""
    from coacto.mobile import Client
    from coacto.server import Server

    model, feeds, ref = zoo_case("gpt2", "default", **SMALL["gpt2"])
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv:
        with Client(srv.address, model, threads=1, policy=policy, tiles_per_layer=5,
                    timeout=10) as client:
            if policy != "local":
                client.connect(10)
            assert_close(client.infer(feeds), ref)
            assert not client.last_stats["fallback"], client.last_stats
            if policy == "cloud":
                assert client.last_stats["tiles_from_server"] > 0
