"""coacto.zoo transformers (BERT, GPT-2, ViT): valid ONNX in both exporter forms at every opset,
the function a numpy implementation of the architecture computes, the masks doing what they
mean, the original parameter counts and operator forms, well-scaled activations and attention."""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import coacto.zoo as zoo

from conftest import onnx_attrs as _attrs, onnx_ops as _ops, onnx_producers as _producers

#: small instances: every kind of layer, same code path as the full models
SMALL = {
    "bert": dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=1000),
    "gpt2": dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=1000),
    "vit": dict(layers=2, hidden=64, heads=4, image_size=48),
}
CASES = [(n, s, o) for n in zoo.TRANSFORMERS for s in ("default", "fused")
         for o in zoo.TRANSFORMER_OPSETS[s]]
#: parameter counts of the HuggingFace models (BertModel with pooler; GPT2LMHeadModel with the
#: tied embedding counted once; ViTForImageClassification)
FULL_PARAMS = {"bert": 109_482_240, "gpt2": 124_439_808, "vit": 86_567_656}
F32_MIN = float(np.finfo(np.float32).min)


def _small(name: str, style: str = "default", opset: int | None = None, **kw) -> onnx.ModelProto:
    return zoo.build(name, style=style, opset=opset, **{**SMALL[name], **kw})


_model = functools.lru_cache(maxsize=32)(_small)


def _session(model: onnx.ModelProto, optimize: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    # the graph as written (no onnxruntime fusions) unless asked
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else
                                   ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: dict | None = None, optimize: bool = False) -> dict:
    sess = _session(model, optimize)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds or zoo.input_feeds(model))))


@functools.lru_cache(maxsize=None)
def _reference(name: str) -> dict:
    return _run(_model(name, "fused", 18))


def _close(got: np.ndarray, ref: np.ndarray, rel: float = 1e-4) -> None:
    assert got.shape == ref.shape
    scale = float(np.abs(ref).max())
    err = float(np.abs(got.astype(np.float64) - ref).max())
    assert err <= rel * scale, f"max |error| {err:.3g} > {rel} * max |ref| {scale:.3g}"



def _const(model: onnx.ModelProto, name: str) -> np.ndarray:
    """Value of a Constant node output or an initializer."""
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    node = _producers(model)[name]
    assert node.op_type == "Constant", node.name
    return numpy_helper.to_array(node.attribute[0].t)


# ------------------------------------------------------------------------------------ the matrix
@pytest.mark.parametrize("name,style,opset", CASES, ids=[f"{n}-{s}-{o}" for n, s, o in CASES])
def test_valid_runs_and_forms_agree(name, style, opset):
    model = _small(name, style, opset)
    data = model.SerializeToString()
    assert [o.version for o in model.opset_import] == [opset]
    onnx.checker.check_model(data, full_check=True)  # includes strict shape inference
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    declared = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim]
                for o in inferred.graph.output}
    out = _run(model)
    ref = _reference(name)
    assert set(out) == set(ref)
    for k, y in out.items():
        assert list(y.shape) == declared[k]
        assert np.isfinite(y).all()
        assert 0.3 < y.std() < 5, (k, y.std())
        # every form and opset computes the function of the fused opset-18 model
        _close(y, ref[k])


@pytest.mark.parametrize("name,style,opset", CASES, ids=[f"{n}-{s}-{o}" for n, s, o in CASES])
def test_operator_signatures_of_the_opset(name, style, opset):
    model = _model(name, style, opset)
    for n in model.graph.node:
        a = _attrs(n)
        if n.op_type in ("Unsqueeze", "Squeeze", "Split"):
            key = "split" if n.op_type == "Split" else "axes"
            assert (key in a) == (opset < 13) and len(n.input) == (1 if opset < 13 else 2), n.name
        elif n.op_type == "ReduceMean":
            assert ("axes" in a) == (opset < 18) and len(n.input) == (1 if opset < 18 else 2)
        elif n.op_type == "Softmax":  # over the keys of [B, heads, S, S] scores
            assert a["axis"] == (-1 if opset >= 13 else 3), n.name
        elif n.op_type == "Slice":
            assert len(n.input) >= 3 and not a
        elif n.op_type == "LayerNormalization":
            assert a["axis"] == -1 and len(n.input) == 3


@pytest.mark.parametrize("name", zoo.TRANSFORMERS)
def test_onnxruntime_optimizers_agree(name):
    """onnxruntime's own fusions (LayerNorm, GELU, attention patterns) accept both forms."""
    ref = _reference(name)
    for style in ("default", "fused"):
        for k, y in _run(_model(name, style), optimize=True).items():
            _close(y, ref[k], 1e-3)


# ------------------------------------------------------------------- numpy implementations
def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT}


def _ln(x, w, m, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[f"{m}.weight"] + w[f"{m}.bias"]


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _heads(x, h):
    b, s, d = x.shape
    return x.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)


def _merge(c):
    b, h, s, hd = c.shape
    return c.transpose(0, 2, 1, 3).reshape(b, s, h * hd)


def _attend(q, k, v, heads, bias=None):
    q, k, v = _heads(q, heads), _heads(k, heads), _heads(v, heads)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    return _merge(_softmax(s) @ v)


def _numpy_bert(w, feeds, layers, heads):
    lin = lambda x, m: x @ w[f"{m}.weight"].T + w[f"{m}.bias"]  # noqa: E731
    ids, mask, types = feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.token_type_embeddings.weight"][types]
         + w["embeddings.position_embeddings.weight"][np.arange(ids.shape[1])][None])
    x = _ln(x, w, "embeddings.LayerNorm", 1e-12)
    bias = (1.0 - mask[:, None, None, :]) * F32_MIN
    for i in range(layers):
        m = f"encoder.layer.{i}"
        s = f"{m}.attention.self"
        a = _attend(lin(x, f"{s}.query"), lin(x, f"{s}.key"), lin(x, f"{s}.value"), heads, bias)
        a = _ln(lin(a, f"{m}.attention.output.dense") + x, w, f"{m}.attention.output.LayerNorm",
                1e-12)
        f = lin(_gelu(lin(a, f"{m}.intermediate.dense")), f"{m}.output.dense")
        x = _ln(f + a, w, f"{m}.output.LayerNorm", 1e-12)
    return {"last_hidden_state": x, "pooler_output": np.tanh(lin(x[:, 0], "pooler.dense"))}


def _numpy_gpt2(w, feeds, layers, heads):
    conv1d = lambda x, m: x @ w[f"{m}.weight"] + w[f"{m}.bias"]  # noqa: E731
    ids = feeds["input_ids"]
    s = ids.shape[1]
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][np.arange(s)][None]
    causal = np.where(np.tril(np.ones((s, s), bool)), 0.0, -np.inf)
    for i in range(layers):
        m = f"transformer.h.{i}"
        q, k, v = np.split(conv1d(_ln(x, w, f"{m}.ln_1", 1e-5), f"{m}.attn.c_attn"), 3, axis=-1)
        x = x + conv1d(_attend(q, k, v, heads, causal), f"{m}.attn.c_proj")
        f = _gelu_tanh(conv1d(_ln(x, w, f"{m}.ln_2", 1e-5), f"{m}.mlp.c_fc"))
        x = x + conv1d(f, f"{m}.mlp.c_proj")
    x = _ln(x, w, "transformer.ln_f", 1e-5)
    return {"logits": x @ w["transformer.wte.weight"].T}


def _numpy_vit(w, feeds, layers, heads):
    lin = lambda x, m: x @ w[f"{m}.weight"].T + w[f"{m}.bias"]  # noqa: E731
    px = feeds["pixel_values"].astype(np.float64)
    b, _, hgt, _ = px.shape
    g = hgt // 16
    kernel = w["vit.embeddings.patch_embeddings.projection.weight"]
    patches = px[:, :, :g * 16, :g * 16].reshape(b, 3, g, 16, g, 16).transpose(0, 2, 4, 1, 3, 5)
    tok = patches.reshape(b, g * g, -1) @ kernel.reshape(kernel.shape[0], -1).T \
        + w["vit.embeddings.patch_embeddings.projection.bias"]
    cls = np.broadcast_to(w["vit.embeddings.cls_token"], (b, 1, tok.shape[-1]))
    x = np.concatenate([cls, tok], axis=1) + w["vit.embeddings.position_embeddings"]
    for i in range(layers):
        m = f"vit.encoder.layer.{i}"
        s = f"{m}.attention.attention"
        a = _ln(x, w, f"{m}.layernorm_before", 1e-12)
        a = _attend(lin(a, f"{s}.query"), lin(a, f"{s}.key"), lin(a, f"{s}.value"), heads)
        x = x + lin(a, f"{m}.attention.output.dense")
        f = _gelu(lin(_ln(x, w, f"{m}.layernorm_after", 1e-12), f"{m}.intermediate.dense"))
        x = x + lin(f, f"{m}.output.dense")
    x = _ln(x, w, "vit.layernorm", 1e-12)
    return {"logits": lin(x[:, 0], "classifier")}


_NUMPY = {"bert": _numpy_bert, "gpt2": _numpy_gpt2, "vit": _numpy_vit}


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", zoo.TRANSFORMERS)
def test_computes_the_architecture(name, batch):
    """The fused model (state-dict names) equals a numpy implementation of the HuggingFace
    module, in float64; the default form equals the fused one (matrix above)."""
    model = _small(name, "fused", batch=batch, layers=3)
    feeds = zoo.input_feeds(model, seed=3)
    got = _run(model, feeds)
    ref = _NUMPY[name](_weights(model), feeds, 3, SMALL[name]["heads"])
    assert set(got) == set(ref)
    for k in ref:
        _close(got[k], ref[k])


@pytest.mark.parametrize("name", zoo.TRANSFORMERS)
def test_batch_rows_are_independent(name):
    """Row 1 of a batch-2 run equals a batch-1 run on that row (the shape chains follow B)."""
    m2 = _model(name, "default", batch=2)
    feeds = zoo.input_feeds(m2, seed=5)
    both = _run(m2, feeds)
    one = _run(_model(name, "default", batch=1), {k: v[1:] for k, v in feeds.items()})
    for k in one:
        _close(both[k][1:], one[k])
        assert not np.allclose(both[k][0], both[k][1], atol=1e-3)


# ------------------------------------------------------------------------------------- masks
@pytest.mark.parametrize("style", ["default", "fused"])
def test_bert_padding_is_masked(style):
    model = _model("bert", style)
    feeds = zoo.input_feeds(model, seed=2)
    real = feeds["attention_mask"][0] == 1
    assert 0 < (~real).sum() < real.sum()
    base = _run(model, feeds)
    # other tokens at padded positions: nothing at real positions changes
    f2 = {k: v.copy() for k, v in feeds.items()}
    f2["input_ids"][0, ~real] = 7
    f2["token_type_ids"][0, ~real] = 1
    out = _run(model, f2)
    _close(out["last_hidden_state"][0, real], base["last_hidden_state"][0, real], 1e-6)
    _close(out["pooler_output"], base["pooler_output"], 1e-6)
    # unmasking the padding changes the real positions
    f3 = {k: v.copy() for k, v in f2.items()}
    f3["attention_mask"][:] = 1
    out = _run(model, f3)["last_hidden_state"][0, real]
    assert np.abs(out - base["last_hidden_state"][0, real]).max() > 1e-2


@pytest.mark.parametrize("style", ["default", "fused"])
def test_gpt2_is_causal(style):
    model = _model("gpt2", style)
    feeds = zoo.input_feeds(model, seed=2)
    base = _run(model, feeds)["logits"]
    t = 9
    f2 = {"input_ids": feeds["input_ids"].copy()}
    f2["input_ids"][0, t] = (f2["input_ids"][0, t] + 1) % 999 + 1
    out = _run(model, f2)["logits"]
    np.testing.assert_array_equal(out[0, :t], base[0, :t])
    assert (np.abs(out[0, t:] - base[0, t:]).max(axis=-1) > 1e-2).all()


def _node_chain(model, tensor, ops):
    """Follow the first input back through nodes of types ``ops`` (last first)."""
    prod = _producers(model)
    nodes = []
    for op in ops:
        n = prod[tensor]
        assert n.op_type == op, (n.name, n.op_type, op)
        nodes.append(n)
        tensor = n.input[0] if op != "Sub" else n.input[1]
    return nodes, tensor


@pytest.mark.parametrize("style", ["default", "fused"])
def test_bert_additive_mask_nodes(style):
    model = _model("bert", style)
    prod = _producers(model)
    adds = [n for n in model.graph.node
            if n.op_type == "Add" and n.name.endswith("attention/self/Add")]
    assert len(adds) == SMALL["bert"]["layers"]
    masks = {n.input[1] for n in adds}
    assert len(masks) == 1  # one extended mask shared by every layer
    (mul, sub, cast, u2, u1), src = _node_chain(
        model, masks.pop(), ["Mul", "Sub", "Cast", "Unsqueeze", "Unsqueeze"])
    assert src == "attention_mask"
    assert _const(model, mul.input[1]) == np.float32(F32_MIN)
    assert _const(model, sub.input[0]) == 1.0
    assert _attrs(cast)["to"] == onnx.TensorProto.FLOAT
    assert [int(_const(model, u1.input[1])[0]), int(_const(model, u2.input[1])[0])] == [1, 2]
    # added to the scaled scores: Div(MatMul(q, k^T), sqrt(head_dim))
    div = prod[adds[0].input[0]]
    assert div.op_type == "Div" and _const(model, div.input[1]) == 4.0  # head_dim 16


@pytest.mark.parametrize("style", ["default", "fused"])
def test_gpt2_causal_mask_nodes(style):
    model = _model("gpt2", style)
    wheres = [n for n in model.graph.node if n.op_type == "Where"]
    assert len(wheres) == SMALL["gpt2"]["layers"]
    s = SMALL["gpt2"]["seq_len"]
    for wh in wheres:
        assert _const(model, wh.input[2]) == np.float32(F32_MIN)
        (cols, rows), buf = _node_chain(model, wh.input[0], ["Slice", "Slice"])
        bias = _const(model, buf)
        assert bias.dtype == bool and bias.shape == (1, 1, 1024, 1024)
        np.testing.assert_array_equal(bias[0, 0], np.tril(np.ones((1024, 1024), bool)))
        axes = [int(_const(model, n.input[3])[0]) for n in (rows, cols)]
        assert axes == [2, 3]
        if style == "fused":
            assert int(_const(model, rows.input[2])[0]) == s
        else:  # key_len from Shape -> Gather of the key
            assert _producers(model)[rows.input[2]].op_type == "Unsqueeze"
    feeds = zoo.input_feeds(model)
    # the mask it computes: the first layer's sliced buffer is tril(S x S)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(
        wheres[0].input[0], onnx.TensorProto.BOOL, None))
    mask = _run(probe, feeds)[wheres[0].input[0]]
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((s, s), bool)))


# ------------------------------------------------------------------------------ structure
EXPECTED_OPS = {
    # present in every form
    "bert": {"Gather", "Slice", "Unsqueeze", "Cast", "Sub", "Mul", "MatMul", "Add", "Div", "Erf",
             "Softmax", "Transpose", "Reshape", "Gemm", "Tanh"},
    "gpt2": {"Gather", "Split", "Slice", "Where", "Pow", "Tanh", "MatMul", "Add", "Div",
             "Softmax", "Transpose", "Reshape"},
    "vit": {"Conv", "Reshape", "Transpose", "Expand", "Concat", "Add", "MatMul", "Mul", "Div",
            "Erf", "Softmax", "Gather", "Gemm"},
}
DECOMPOSED_LN = {"ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Mul", "Add"}


@pytest.mark.parametrize("name", zoo.TRANSFORMERS)
def test_operator_forms(name):
    d, f = _model(name, "default", 14), _model(name, "fused", 18)
    od, of = _ops(d), _ops(f)
    assert EXPECTED_OPS[name] <= od and EXPECTED_OPS[name] <= of
    # decomposed LayerNorm and torch's shape chains vs LayerNormalization and constants
    assert "LayerNormalization" not in od and DECOMPOSED_LN <= od
    assert "LayerNormalization" in of and not {"ReduceMean", "Sqrt", "Shape"} & of
    assert {"Shape", "Gather", "Unsqueeze", "Concat"} <= od
    n_ln = {"bert": 2 * 2 + 1, "gpt2": 2 * 2 + 1, "vit": 2 * 2 + 1}[name]
    assert sum(n.op_type == "LayerNormalization" for n in f.graph.node) == n_ln
    assert sum(n.op_type == "Sqrt" for n in d.graph.node) == n_ln
    # scores: MatMul between two activations, keys transposed [0, 2, 3, 1]
    inits = {t.name for t in d.graph.initializer}
    for m in (d, f):
        prod = _producers(m)
        sm = [n for n in m.graph.node if n.op_type == "Softmax"]
        assert len(sm) == 2
        for s in sm:
            pv = [n for n in m.graph.node if n.op_type == "MatMul" and n.input[0] == s.output[0]]
            assert len(pv) == 1 and pv[0].input[1] not in inits
            qk = prod[s.input[0]]  # Softmax <- Add (mask) | Where (causal) <- Div <- MatMul
            while qk.op_type != "MatMul":
                assert qk.op_type in ("Add", "Where", "Div"), qk.name
                qk = prod[qk.input[1 if qk.op_type == "Where" else 0]]
            assert not set(qk.input) & inits
        perms = [_attrs(n)["perm"] for n in m.graph.node if n.op_type == "Transpose"]
        assert perms.count([0, 2, 3, 1]) == 2 and perms.count([0, 2, 1, 3]) >= 6
    if name == "gpt2":
        assert {"Range", "Gemm"} <= od and not {"Range", "Gemm"} & of
    if name == "vit":  # SDPA-style scaling in the fused form
        assert sum(n.op_type == "Mul" and n.name.endswith("attention/attention/Mul")
                   for n in f.graph.node) == 2
    # node names and initializer names as torch.onnx writes them
    names = {n.name for n in d.graph.node}
    scope = {"bert": "/encoder/layer.0/attention/self/MatMul",
             "gpt2": "/transformer/h.0/attn/c_attn/Gemm",
             "vit": "/vit/encoder/layer.0/attention/attention/MatMul"}[name]
    assert scope in names
    assert any(t.startswith("onnx::MatMul_") for t in inits) == (name != "gpt2")


def test_linear_weights_are_the_same_in_both_forms():
    """Default form stores W^T under onnx::MatMul_<n>, fused form W under its state-dict name:
    the same seeded numbers."""
    d, f = _model("bert", "default", 14), _model("bert", "fused", 18)
    wd = {t.name: numpy_helper.to_array(t) for t in d.graph.initializer}
    wf = {t.name: numpy_helper.to_array(t) for t in f.graph.initializer}
    q = wf["encoder.layer.1.attention.self.query.weight"]
    matches = [k for k, v in wd.items() if k.startswith("onnx::MatMul_") and v.shape == q.T.shape
               and np.array_equal(v, q.T)]
    assert len(matches) == 1
    assert zoo.count_params(d) == zoo.count_params(f)


def test_deterministic():
    for name in zoo.TRANSFORMERS:
        a = _small(name).SerializeToString()
        assert a == _small(name).SerializeToString()
        assert a != _small(name, seed=1).SerializeToString()


def test_seq_len_changes_no_weight():
    a, b = _small("bert", seq_len=16), _small("bert", seq_len=24)
    wa = {t.name: t.raw_data for t in a.graph.initializer}
    wb = {t.name: t.raw_data for t in b.graph.initializer}
    assert wa == wb


# ---------------------------------------------------------------------------- full size
@pytest.fixture(scope="module", params=list(zoo.TRANSFORMERS))
def full(request):
    return request.param, zoo.build(request.param)


def test_full_size_models(full):
    name, model = full
    assert zoo.count_params(model) == FULL_PARAMS[name]
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input}
    outputs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim]
               for o in model.graph.output}
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    if name == "bert":
        assert inputs == {k: [1, 128] for k in ("input_ids", "attention_mask", "token_type_ids")}
        assert outputs == {"last_hidden_state": [1, 128, 768], "pooler_output": [1, 768]}
        assert inits["embeddings.word_embeddings.weight"] == [30522, 768]
        assert inits["embeddings.position_embeddings.weight"] == [512, 768]
        assert ops.count("Erf") == 12 and ops.count("Softmax") == 12
        assert ops.count("Sqrt") == 25  # 2 LayerNorms per layer + embeddings
    elif name == "gpt2":
        assert inputs == {"input_ids": [1, 64]}
        assert outputs == {"logits": [1, 64, 50257]}
        assert inits["transformer.wte.weight"] == [50257, 768]
        assert inits["transformer.wpe.weight"] == [1024, 768]
        # the tied embedding: one initializer, read by the Gather and the LM head's Transpose
        users = [n.op_type for n in model.graph.node if "transformer.wte.weight" in n.input]
        assert sorted(users) == ["Gather", "Transpose"]
        assert ops.count("Where") == 12 and ops.count("Gemm") == 48 and ops.count("Sqrt") == 25
    else:
        assert inputs == {"pixel_values": [1, 3, 224, 224]}
        assert outputs == {"logits": [1, 1000]}
        assert inits["vit.embeddings.position_embeddings"] == [1, 197, 768]
        assert inits["vit.embeddings.patch_embeddings.projection.weight"] == [768, 3, 16, 16]
        assert ops.count("Conv") == 1 and ops.count("Softmax") == 12 and ops.count("Sqrt") == 25
    assert model.metadata_props


# ------------------------------------------------------------------------ well-scaled values
def _softmax_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [n.output[0] for n in probe.graph.node if n.op_type == "Softmax"]
    for t in names:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT,
                                                                     None))
    out = _run(probe, feeds)
    return [out[t] for t in names]


@pytest.mark.parametrize("name", zoo.TRANSFORMERS)
def test_attention_is_neither_uniform_nor_one_hot(name):
    """Six layers of a mid-size model: every layer's attention rows are spread over several
    keys but far from uniform, and the output is not dominated by one token."""
    kw = dict(layers=6, hidden=128, heads=4)
    kw.update({"vit": dict(image_size=96)}.get(name, dict(seq_len=48, vocab=2000)))
    model = zoo.build(name, style="fused", **kw)
    feeds = zoo.input_feeds(model)
    for i, p in enumerate(_softmax_outputs(model, feeds)):
        if name == "bert":
            p = p[..., feeds["attention_mask"][0] == 1]  # keys that are not padding
            n_keys = np.full(p.shape[:-1], p.shape[-1])
        elif name == "gpt2":
            p = p[:, :, 8:, :]  # queries that see at least 9 keys
            n_keys = np.arange(9, p.shape[-1] + 1)[None, None, :]
        else:
            n_keys = np.full(p.shape[:-1], p.shape[-1])
        ent = -(p * np.log(np.maximum(p, 1e-30))).sum(-1)
        top = p.max(-1)
        assert 0.02 < top.mean() < 0.6, (i, top.mean())
        assert (ent / np.log(n_keys)).mean() < 0.97, (i, (ent / np.log(n_keys)).mean())
    out = _run(model, feeds)
    y = next(iter(out.values()))
    if y.ndim == 3:  # tokens stay distinct: mean cosine between positions is well below 1
        z = y[0] - y[0].mean(-1, keepdims=True)
        z /= np.linalg.norm(z, axis=-1, keepdims=True)
        c = z @ z.T
        assert (c.sum() - len(c)) / (len(c) ** 2 - len(c)) < 0.8


def test_outputs_of_order_one():
    for name in zoo.TRANSFORMERS:
        for k, y in _reference(name).items():
            assert 0.3 < y.std() < 5 and np.abs(y).max() < 50, (name, k, y.std())


# --------------------------------------------------------------------------- input feeds
def test_input_feeds_look_tokenized():
    m = _small("bert", batch=3, seq_len=24, vocab=500)
    f = zoo.input_feeds(m, seed=4)
    assert {k: v.dtype for k, v in f.items()} == {k: np.dtype(np.int64) for k in
                                                 ("input_ids", "attention_mask", "token_type_ids")}
    mask, ids, types = f["attention_mask"], f["input_ids"], f["token_type_ids"]
    np.testing.assert_array_equal((mask == 0).sum(1), [3, 4, 5])  # 24 // 8, one more per row
    assert (mask[:, :-5] == 1).all() and (mask[:, -3:] == 0).all()
    assert (ids[mask == 1] >= 1).all() and (ids < 500).all() and (ids[mask == 0] == 0).all()
    assert len(np.unique(ids[mask == 1])) > 40
    assert set(np.unique(types)) == {0, 1} and (types[:, :12] == 0).all()
    assert (types[mask == 0] == 0).all() and (types[0, 12:21] == 1).all()
    g = zoo.input_feeds(_small("gpt2", vocab=300), seed=1)["input_ids"]
    assert g.min() >= 1 and g.max() < 300  # through the Reshape to the Gather
    assert zoo.input_feeds(m, seed=4)["input_ids"].tobytes() == ids.tobytes()


def test_input_feeds_of_images_unchanged():
    """Float inputs keep the N(0, 1) stream they always had (results of the CNNs unchanged)."""
    m = zoo.build("squeezenet", image_size=32)
    (x,) = zoo.input_feeds(m, seed=7).values()
    np.testing.assert_array_equal(x, np.random.default_rng(7).standard_normal((1, 3, 32, 32))
                                  .astype(np.float32))
    (p,) = zoo.input_feeds(_small("vit"), seed=7).values()
    np.testing.assert_array_equal(p, np.random.default_rng(7).standard_normal((1, 3, 48, 48))
                                  .astype(np.float32))


# ------------------------------------------------------------------------------------ API
def test_registry():
    for name in ("bert", "gpt2", "vit"):
        assert name in zoo.MODELS and name in zoo.TRANSFORMERS
        assert zoo.STYLES[name] == ("default", "fused")
        assert zoo.MODELS[name](**SMALL[name]).graph.name == f"{name}_default"
    assert zoo.DEFAULT_IMAGE_SIZE["vit"] == 224
    assert zoo.DEFAULT_SEQ_LEN == {"bert": 128, "gpt2": 64}
    assert zoo.CONFIGS["gpt2"]["vocab"] == 50257
    assert [o.version for o in _small("bert").opset_import] == [14]
    assert [o.version for o in _small("bert", "fused").opset_import] == [18]


def test_size_keywords():
    m = _small("bert", ffn=96)
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    assert dims["encoder.layer.0.intermediate.dense.bias"] == [96]
    m = zoo.build("gpt2", layers=1, hidden=32, heads=2, seq_len=8, vocab=50, lm_head=False)
    assert [o.name for o in m.graph.output] == ["last_hidden_state"]
    assert "wte.weight" in {t.name for t in m.graph.initializer}
    assert "Tanh" not in _ops(zoo.build("bert", **SMALL["bert"], pooler=False))
    m = zoo.build("vit", **SMALL["vit"], num_classes=10, softmax=True)
    y = _run(m)["logits"]
    assert y.shape == (1, 10) and abs(float(y.sum()) - 1) < 1e-5


@pytest.mark.parametrize("name,kw", [
    ("resnet18", dict(seq_len=8)), ("resnet18", dict(lm_head=False)),
    ("bert", dict(style="fused", opset=16)), ("bert", dict(opset=10)), ("bert", dict(style="zoo")),
    ("bert", dict(image_size=64)), ("bert", dict(lm_head=False)), ("gpt2", dict(pooler=False)),
    ("gpt2", dict(num_classes=10)), ("vit", dict(seq_len=16)), ("vit", dict(vocab=100)),
    ("bert", dict(hidden=66, heads=4)), ("bert", dict(seq_len=513)), ("gpt2", dict(seq_len=1025)),
    ("vit", dict(image_size=8)), ("gpt2", dict(layers=0)),
])
def test_rejects_what_a_model_does_not_have(name, kw):
    with pytest.raises(ValueError):
        zoo.build(name, **kw)
