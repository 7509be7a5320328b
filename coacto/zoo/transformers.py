"""Transformers as HuggingFace's models are exported to ONNX: BERT-base (``BertModel``), GPT-2
small (``GPT2LMHeadModel`` / ``GPT2Model``) and ViT-B/16 (``ViTForImageClassification``), eager
attention, inference mode (no dropout, no key / value cache).

Every size is a parameter (layers, hidden size, heads, FFN size, vocabulary, sequence length or
image size): a two-layer model of hidden size 64 goes through the same code as the full one. The
two exporter forms are described in :mod:`coacto.zoo._tlayers`; the masks are:

* BERT's padding mask, as ``BertModel.get_extended_attention_mask`` computes it,
  ``(1 - attention_mask[:, None, None, :].float()) * finfo(float32).min``: ``Unsqueeze(axis 1),
  Unsqueeze(axis 2), Cast(float), Sub(1.0, .), Mul(., -3.4028235e38)``, added to the scaled
  scores of every layer;
* GPT-2's causal mask, from each layer's lower-triangular ``bool`` buffer ``attn.bias`` of
  ``[1, 1, 1024, 1024]``: ``Slice`` rows ``key_len - query_len : key_len`` (axis 2), ``Slice``
  columns ``: key_len`` (axis 3), then ``Where(mask, scores, -3.4028235e38)``; the lengths come
  from ``Shape -> Gather`` of the query and key in the traced form, from constants in the fused
  form.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from ._tlayers import _ATTN_OUT_GAIN, _FFN_OUT_GAIN, _FLOAT_MIN, _QK_GAIN, _SeqGraph, _hf_scope

#: full-size hyperparameters; ``build(name, layers=..., hidden=..., ...)`` overrides them
CONFIGS: dict[str, dict[str, int]] = {
    "bert": dict(layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, seq_len=128),
    "gpt2": dict(layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, seq_len=64),
    "vit": dict(layers=12, hidden=768, heads=12, ffn=3072, image_size=224, num_classes=1000),
}

_BERT_MAX_POSITIONS, _BERT_TYPE_VOCAB, _BERT_EPS = 512, 2, 1e-12
_GPT2_POSITIONS, _GPT2_EPS = 1024, 1e-5
_VIT_PATCH, _VIT_EPS = 16, 1e-12
_INT64 = TensorProto.INT64


def _check(name: str, *, hidden: int, heads: int, layers: int, ffn: int, **sizes: int) -> None:
    if heads < 1 or hidden % heads:
        raise ValueError(f"{name}: hidden size {hidden} is not a multiple of heads ({heads})")
    for k, v in dict(layers=layers, ffn=ffn, **sizes).items():
        if v < 1:
            raise ValueError(f"{name}: {k} must be >= 1 (got {v})")


# ================================================================================== attention
def _self_attention(g: _SeqGraph, x: str, m: str, heads: int, mask: str | None,
                    sdpa: bool = False) -> str:
    """BERT / ViT self-attention (module ``m`` holds ``query``, ``key``, ``value``), up to the
    merged heads [B, S, hidden]. ``sdpa``: scale as ``scaled_dot_product_attention`` is
    decomposed -- ``Mul`` of the queries and of the transposed keys by ``head_dim ** -0.25`` --
    instead of ``Div`` of the scores by ``sqrt(head_dim)``."""
    scope = _hf_scope(m)
    hidden = g.shape[x][-1]
    hd = hidden // heads
    q = g.linear(x, f"{m}.query", hidden, _QK_GAIN)
    k = g.split_heads(g.linear(x, f"{m}.key", hidden, _QK_GAIN), scope, heads, [0, 2, 3, 1])
    v = g.split_heads(g.linear(x, f"{m}.value", hidden), scope, heads, [0, 2, 1, 3])
    q = g.split_heads(q, scope, heads, [0, 2, 1, 3])
    if sdpa:
        s = g.fconst(scope, hd ** -0.25)
        scores = g.matmul(g.binary("Mul", q, s, scope), g.binary("Mul", k, s, scope), scope)
    else:
        scores = g.binary("Div", g.matmul(q, k, scope), g.fconst(scope, math.sqrt(hd)), scope)
    if mask is not None:
        scores = g.binary("Add", scores, mask, scope)
    probs = g.softmax_last(scores, scope)
    return g.merge_heads(g.matmul(probs, v, scope), scope)


def _gpt2_attention(g: _SeqGraph, x: str, m: str, heads: int) -> str:
    """GPT-2 attention: ``c_attn`` (one projection to q, k, v) -> ``Split`` -> heads -> scores
    ``/ sqrt(head_dim)`` -> causal ``Where`` -> Softmax -> context -> ``c_proj``."""
    scope = _hf_scope(m)
    b, s, hidden = g.shape[x]
    hd = hidden // heads
    causal = np.tril(np.ones((_GPT2_POSITIONS, _GPT2_POSITIONS), dtype=bool))[None, None]
    bias = g.init(f"{m}.bias", causal)
    gains = np.repeat([_QK_GAIN, _QK_GAIN, 1.0], hidden)
    q, k, v = g.split_last(g.conv1d(x, f"{m}.c_attn", 3 * hidden, gains), scope, [hidden] * 3)
    q = g.split_heads(q, scope, heads, [0, 2, 1, 3])
    k = g.heads_view(k, scope, heads)
    # the traced graph keeps the permuted key for key.size(-2); q @ k^T reads the key through
    # the permute fused with the transpose
    k_perm = g.permute(k, scope, [0, 2, 1, 3]) if g.traced else None
    v = g.split_heads(v, scope, heads, [0, 2, 1, 3])
    kt = g.permute(k, scope, [0, 2, 3, 1])
    scores = g.binary("Div", g.matmul(q, kt, scope), g.fconst(scope, math.sqrt(hd)), scope)
    # causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
    if g.traced:
        q_len = g.size(q, scope, 2)
        k_len = g.size(k_perm, scope, 2)
        start = g.unsqueeze(g.binary("Sub", k_len, q_len, scope), scope, [0])
        rows = g.slice(bias, scope, start, g.unsqueeze(k_len, scope, [0]), 2, s)
        mask = g.slice(rows, scope, g.constant(scope, [0]), g.unsqueeze(k_len, scope, [0]), 3, s)
    else:
        rows = g.slice(bias, scope, g.constant(scope, [0]), g.constant(scope, [s]), 2, s)
        mask = g.slice(rows, scope, g.constant(scope, [0]), g.constant(scope, [s]), 3, s)
    scores = g.op("Where", [mask, scores, g.fconst(scope, _FLOAT_MIN)], scope, g.shape[scores])
    ctx = g.merge_heads(g.matmul(g.softmax_last(scores, scope), v, scope), scope)
    return g.conv1d(ctx, f"{m}.c_proj", hidden, _ATTN_OUT_GAIN)


# ====================================================================================== BERT
def _bert(g: _SeqGraph, *, seq_len: int, layers: int, hidden: int, heads: int, ffn: int,
          vocab: int, pooler: bool = True) -> None:
    """``BertModel``: inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64
    [B, S]); outputs ``last_hidden_state`` [B, S, hidden] and ``pooler_output`` [B, hidden]
    (``pooler=False``: the first only)."""
    _check("bert", hidden=hidden, heads=heads, layers=layers, ffn=ffn, vocab=vocab,
           seq_len=seq_len)
    if seq_len > _BERT_MAX_POSITIONS:
        raise ValueError(f"bert: seq_len {seq_len} exceeds the {_BERT_MAX_POSITIONS} positions")
    b = g.batch
    ids = g.graph_input("input_ids", (b, seq_len), _INT64)
    attention_mask = g.graph_input("attention_mask", (b, seq_len), _INT64)
    token_types = g.graph_input("token_type_ids", (b, seq_len), _INT64)
    word = g.param("embeddings.word_embeddings.weight", (vocab, hidden), 0.02)
    pos = g.param("embeddings.position_embeddings.weight", (_BERT_MAX_POSITIONS, hidden), 0.02)
    typ = g.param("embeddings.token_type_embeddings.weight", (_BERT_TYPE_VOCAB, hidden), 0.02)
    pos_ids = g.i64("embeddings.position_ids", np.arange(_BERT_MAX_POSITIONS)[None])

    # get_extended_attention_mask: (1.0 - mask[:, None, None, :].to(float)) * finfo.min
    m = g.unsqueeze(g.unsqueeze(attention_mask, "", [1]), "", [2])
    m = g.op("Cast", [m], "", g.shape[m], to=TensorProto.FLOAT)
    m = g.binary("Sub", g.fconst("", 1.0), m, "")
    mask = g.binary("Mul", m, g.fconst("", _FLOAT_MIN), "")

    # embeddings: position_ids = self.position_ids[:, :seq_length]
    sc = "/embeddings"
    end = g.size1(ids, sc, 1) if g.traced else g.constant(sc, [seq_len])
    pids = g.slice(pos_ids, sc, g.constant(sc, [0]), end, 1, seq_len)
    x = g.gather(word, ids, f"{sc}/word_embeddings")
    x = g.binary("Add", x, g.gather(typ, token_types, f"{sc}/token_type_embeddings"), sc)
    x = g.binary("Add", x, g.gather(pos, pids, f"{sc}/position_embeddings"), sc)
    x = g.layernorm(x, "embeddings.LayerNorm", _BERT_EPS)

    for i in range(layers):
        lm = f"encoder.layer.{i}"
        a = _self_attention(g, x, f"{lm}.attention.self", heads, mask)
        a = g.linear(a, f"{lm}.attention.output.dense", hidden, _ATTN_OUT_GAIN)
        a = g.binary("Add", a, x, _hf_scope(f"{lm}.attention.output"))
        a = g.layernorm(a, f"{lm}.attention.output.LayerNorm", _BERT_EPS)
        h = g.gelu_erf(g.linear(a, f"{lm}.intermediate.dense", ffn),
                       f"{lm}.intermediate.intermediate_act_fn")
        h = g.linear(h, f"{lm}.output.dense", hidden, _FFN_OUT_GAIN)
        h = g.binary("Add", h, a, _hf_scope(f"{lm}.output"))
        x = g.layernorm(h, f"{lm}.output.LayerNorm", _BERT_EPS)

    pooled = None
    if pooler:  # tanh(dense(hidden_states[:, 0]))
        first = g.gather(x, g.constant("/pooler", 0), "/pooler", axis=1)
        p = g.linear2d(first, "pooler.dense", hidden)
        pooled = g.op("Tanh", [p], "/pooler/activation", g.shape[p])
    g.graph_output(x, "last_hidden_state")
    if pooled is not None:
        g.graph_output(pooled, "pooler_output")


# ===================================================================================== GPT-2
def _gpt2(g: _SeqGraph, *, seq_len: int, layers: int, hidden: int, heads: int, ffn: int,
          vocab: int, lm_head: bool = True) -> None:
    """``GPT2LMHeadModel`` (output ``logits`` [B, S, vocab], the LM head being the transposed
    word embedding, stored once) or, with ``lm_head=False``, ``GPT2Model`` (output
    ``last_hidden_state`` [B, S, hidden]); input ``input_ids`` (int64 [B, S])."""
    _check("gpt2", hidden=hidden, heads=heads, layers=layers, ffn=ffn, vocab=vocab,
           seq_len=seq_len)
    if seq_len > _GPT2_POSITIONS:
        raise ValueError(f"gpt2: seq_len {seq_len} exceeds the {_GPT2_POSITIONS} positions")
    b = g.batch
    pre = "transformer." if lm_head else ""
    top = _hf_scope(pre.rstrip("."))
    ids = g.graph_input("input_ids", (b, seq_len), _INT64)
    # token embeddings large enough that the tied LM head gives logits of std ~ 2
    wte = g.param(f"{pre}wte.weight", (vocab, hidden), 2.0 / math.sqrt(hidden))
    wpe = g.param(f"{pre}wpe.weight", (_GPT2_POSITIONS, hidden), 1.0 / math.sqrt(hidden))

    if g.traced:
        # input_ids.view(-1, input_shape[-1]); position_ids = arange(input_shape[-1]).unsqueeze(0)
        seq = g.size(ids, top, 1)
        flat_ids = g.view(ids, top, [-1, g.unsqueeze(seq, top, [0])], (b, seq_len))
        pids = g.op("Range", [g.constant(top, 0), seq, g.constant(top, 1)], top, (seq_len,))
        pids = g.unsqueeze(pids, top, [0])
    else:
        flat_ids = ids
        pids = g.constant(top, np.arange(seq_len)[None])
    x = g.binary("Add", g.gather(wte, flat_ids, f"{top}/wte"), g.gather(wpe, pids, f"{top}/wpe"),
                 top)

    for i in range(layers):
        m = f"{pre}h.{i}"
        a = _gpt2_attention(g, g.layernorm(x, f"{m}.ln_1", _GPT2_EPS), f"{m}.attn", heads)
        x = g.binary("Add", a, x, _hf_scope(m))
        f = g.conv1d(g.layernorm(x, f"{m}.ln_2", _GPT2_EPS), f"{m}.mlp.c_fc", ffn)
        f = g.conv1d(g.gelu_tanh(f, f"{m}.mlp.act"), f"{m}.mlp.c_proj", hidden, _FFN_OUT_GAIN)
        x = g.binary("Add", x, f, _hf_scope(m))
    x = g.layernorm(x, f"{pre}ln_f", _GPT2_EPS)
    if g.traced:  # hidden_states.view((-1,) + input_shape[1:] + (hidden_states.size(-1),))
        x = g.view(x, top, [-1, g.unsqueeze(seq, top, [0]), g.size1(x, top, 2)],
                   (b, seq_len, hidden))
    if not lm_head:
        g.graph_output(x, "last_hidden_state")
        return
    # tied LM head: lm_head.weight is wte.weight; one tensor, read through a Transpose
    y = g.matmul(x, g.permute(wte, "/lm_head", [1, 0]), "/lm_head")
    g.graph_output(y, "logits")


# ======================================================================================= ViT
def _vit(g: _SeqGraph, *, image_size: int, layers: int, hidden: int, heads: int, ffn: int,
         num_classes: int, softmax: bool = False) -> None:
    """``ViTForImageClassification``: input ``pixel_values`` (float [B, 3, H, W]), output
    ``logits`` [B, num_classes] from the class token (``softmax=True`` appends a Softmax)."""
    _check("vit", hidden=hidden, heads=heads, layers=layers, ffn=ffn, num_classes=num_classes)
    if image_size < _VIT_PATCH:
        raise ValueError(f"vit: image_size must be >= {_VIT_PATCH} (got {image_size})")
    b = g.batch
    grid = image_size // _VIT_PATCH
    n = grid * grid
    px = g.graph_input("pixel_values", (b, 3, image_size, image_size))
    cls = g.param("vit.embeddings.cls_token", (1, 1, hidden), 0.02)
    fan_in = 3 * _VIT_PATCH * _VIT_PATCH
    w = g.param("vit.embeddings.patch_embeddings.projection.weight",
                (hidden, 3, _VIT_PATCH, _VIT_PATCH), 1.0 / math.sqrt(fan_in))
    bias = g.param("vit.embeddings.patch_embeddings.projection.bias", (hidden,), 0.02)
    pos = g.param("vit.embeddings.position_embeddings", (1, n + 1, hidden), 0.02)

    # patch embeddings: projection(pixel_values).flatten(2).transpose(1, 2)
    sc = "/vit/embeddings"
    pe_sc = f"{sc}/patch_embeddings"
    pe = g.op("Conv", [px, w, bias], f"{pe_sc}/projection", (b, hidden, grid, grid),
              dilations=[1, 1], group=1, kernel_shape=[_VIT_PATCH, _VIT_PATCH], pads=[0, 0, 0, 0],
              strides=[_VIT_PATCH, _VIT_PATCH])
    if g.traced:  # flatten(2) -> Reshape to Concat(Shape(x)[0:2], [-1])
        lead = g.op("Slice", [g.shape_of(pe, pe_sc), g.constant(pe_sc, [0]),
                              g.constant(pe_sc, [2]), g.constant(pe_sc, [0])], pe_sc, (2,))
        flat = g.view(pe, pe_sc, [lead, -1], (b, hidden, n))
    else:
        flat = g.view(pe, pe_sc, [], (b, hidden, n))
    tokens = g.permute(flat, pe_sc, [0, 2, 1])
    # cls_token.expand(batch_size, -1, -1): torch writes the -1 as 1 through Equal / Where
    if g.traced:
        size = g.op("Concat", [g.size1(px, sc, 0), g.constant(sc, [-1]), g.constant(sc, [-1])],
                    sc, (3,), axis=0)
        is_keep = g.op("Equal", [size, g.constant(sc, [-1, -1, -1])], sc, (3,))
        size = g.op("Where", [is_keep, g.constant(sc, [1, 1, 1]), size], sc, (3,))
    else:
        size = g.constant(sc, [b, 1, 1])
    cls_tokens = g.op("Expand", [cls, size], sc, (b, 1, hidden))
    x = g.op("Concat", [cls_tokens, tokens], sc, (b, n + 1, hidden), axis=1)
    x = g.binary("Add", x, pos, sc)

    for i in range(layers):
        m = f"vit.encoder.layer.{i}"
        a = g.layernorm(x, f"{m}.layernorm_before", _VIT_EPS)
        a = _self_attention(g, a, f"{m}.attention.attention", heads, None, sdpa=not g.traced)
        a = g.linear(a, f"{m}.attention.output.dense", hidden, _ATTN_OUT_GAIN)
        x = g.binary("Add", a, x, _hf_scope(m))
        f = g.layernorm(x, f"{m}.layernorm_after", _VIT_EPS)
        f = g.gelu_erf(g.linear(f, f"{m}.intermediate.dense", ffn),
                       f"{m}.intermediate.intermediate_act_fn")
        f = g.linear(f, f"{m}.output.dense", hidden, _FFN_OUT_GAIN)
        x = g.binary("Add", f, x, _hf_scope(f"{m}.output"))
    x = g.layernorm(x, "vit.layernorm", _VIT_EPS)
    first = g.gather(x, g.constant("", 0), "", axis=1)  # sequence_output[:, 0, :]
    y = g.linear2d(first, "classifier", num_classes)
    if softmax:
        y = g.softmax_last(y, "")
    g.graph_output(y, "logits")
