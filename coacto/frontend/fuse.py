"""Fusions on an imported layer list, before partitioning. ``fuse_layers``:

- AFFINE (BatchNormalization, per-channel Mul / Add) into the preceding CONV: scaled weights and
  bias; into a preceding AFFINE without activation or a LAYERNORM: one affine;
- activations (AFFINE with scale 1, shift 0) into their CONV / BINARY / AFFINE producer;
- ``Add(conv, other)`` of equal shapes into the CONV as its residual input.

A producer is fused only when the fused layer is its single consumer and it is not a graph output.
Then dead layers (not reaching an output; inputs stay) are dropped and indices renumbered.

``fuse_sequence_ops`` (after ``fuse_layers``, and ending with it again), for sequence models:

- layer normalisation written out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add, as
  exporters before opset 17 write it) -> one LAYERNORM;
- GELU written out (with Erf, or the tanh approximation, in any order of its products): any chain
  of elementwise layers with scalar constants that reads one tensor and *computes* GELU of it,
  checked numerically on probe values, becomes one GELU activation (then fused into the
  producing layer by ``fuse_layers``);
- attention epilogues into the MATMUL of the scores: a scalar scale, a constant causal selection
  (``Where(tril, scores, fill)``, or the addition of a constant that is 0 on and below a diagonal
  and a huge negative value above), the additive mask;
- a Transpose + Reshape that puts the heads of an attention context side by side (a GATHER of the
  whole MATMUL output) -> the MATMUL writes that arrangement itself (out_mode 1);
- a context MATMUL whose probabilities are the softmax of causal scores sums over the kept keys
  only (causal 2): the other probabilities are exactly zero, so its tiles need only the values of
  earlier tokens, and half the work goes;
- the scores MATMUL, their SOFTMAX and the context MATMUL -> one ATTENTION layer, whose tiles keep
  a row block's scores in cache instead of writing every head's (B, H, S, S) scores out and
  reading them back twice (the softmax, the context);
- a GATHER that only copies (the same storage under another grouping of columns, as a
  ``Reshape(-1, D) -> Gemm -> Reshape(B, S, D)`` leaves before a residual addition): the layers
  computing its input take its grouping of columns instead, when all they compute is per column.

Each pattern's final layer is replaced in place (its consumers keep their references); the layers it
absorbed lose their consumers and are pruned.
"""
from __future__ import annotations

import heapq

import numpy as np

from .. import ir

#: A constant added to scores counts as a causal mask when its masked value is at most this: x + c
#: then rounds to c for every |x| below 1e22, so filling with c is exact for any real score.
HUGE_NEGATIVE = -1e30


def fuse_layers(layers: list[ir.Layer], inputs: dict[str, int], outputs: dict[str, int]):
    n = len(layers)
    alive = [True] * n
    redirect = list(range(n))
    consumers = [0] * n
    for layer in layers:
        for p in set(layer.inputs):
            consumers[p] += 1
    outs = set(outputs.values())
    is_output = [i in outs for i in range(n)]

    def resolve(i):
        while redirect[i] != i:
            i = redirect[i]
        return i

    def single(i):
        return consumers[i] == 1 and not is_output[i]

    for j, layer in enumerate(layers):
        layer.inputs = [resolve(i) for i in layer.inputs]
        if layer.op == "AFFINE" and single(layer.inputs[0]):
            p = layer.inputs[0]
            if _fold_affine(layers[p], layer):  # layer j disappears into its producer p
                alive[j] = False
                redirect[j] = p
                consumers[p], is_output[p] = consumers[j], is_output[j]
                layers[p].onnx_shape, layers[p].layout = layer.onnx_shape, layer.layout
        elif layer.op == "BINARY" and len(layer.inputs) == 2 and \
                layer.attrs["kind"] == ir.BIN_ADD and layer.inputs[0] != layer.inputs[1]:
            a, b = layer.inputs
            # into a 1x1 convolution with stride 1 rather than the other (a downsampling
            # shortcut): the runtime can write that one's sum into its residual's buffer
            for c, other in sorted(((b, a), (a, b)), key=lambda co: not _pointwise(layers[co[0]])):
                conv = layers[c]
                if conv.op == "CONV" and single(c) and len(conv.inputs) == 1 and \
                        conv.attrs["act"] == ir.ACT_NONE and conv.shape == layer.shape and \
                        layers[other].shape == layer.shape:
                    fused = ir.Layer(name=conv.name, op="CONV", inputs=[conv.inputs[0], other],
                                     shape=conv.shape, attrs=dict(conv.attrs),
                                     weights=conv.weights, onnx_shape=layer.onnx_shape,
                                     layout=layer.layout)
                    _set_act(fused, layer)
                    layers[j] = fused
                    alive[c] = False
                    break

    outputs = {name: resolve(i) for name, i in outputs.items()}
    return prune_layers(layers, inputs, outputs, alive)


def _pointwise(layer) -> bool:
    at = layer.attrs
    return layer.op == "CONV" and all(at.get(k) == 1 for k in ("kh", "kw", "sh", "sw")) and \
        not any(at.get(k) for k in ("pt", "pl", "pb", "pr")) and at.get("group", 1) == 1


def prune_layers(layers, inputs, outputs, alive=None):
    """Keeps the layers an output reaches (and every input), except those marked not ``alive``
    (fused away), renumbering them and the input / output maps."""
    n = len(layers)
    alive = [True] * n if alive is None else alive
    roots = {*outputs.values(), *inputs.values()}
    needed = [j in roots for j in range(n)]
    for j in range(n - 1, -1, -1):
        if needed[j] and alive[j]:
            for p in layers[j].inputs:
                needed[p] = True
    keep = [j for j in range(n) if needed[j] and alive[j]]
    new_index = {old: k for k, old in enumerate(keep)}
    for old in keep:
        layers[old].inputs = [new_index[p] for p in layers[old].inputs]
    return ([layers[old] for old in keep], {k: new_index[v] for k, v in inputs.items()},
            {k: new_index[v] for k, v in outputs.items()})


def _set_act(producer: ir.Layer, affine: ir.Layer) -> None:
    for key in ("act", "alpha", "beta"):
        producer.attrs[key] = affine.attrs[key]


def _clip_range(attrs):
    if attrs["act"] == ir.ACT_RELU:
        return 0.0, np.inf
    if attrs["act"] == ir.ACT_CLIP:
        return attrs["alpha"], attrs["beta"]
    return None


def _fold_affine(producer: ir.Layer, affine: ir.Layer) -> bool:
    """Folds ``affine`` into ``producer`` when possible (returns whether it did)."""
    scale = affine.weights["scale"].astype(np.float64)
    shift = affine.weights["shift"].astype(np.float64)
    if producer.op == "LAYERNORM" and affine.attrs["act"] == ir.ACT_NONE:
        _compose(producer, scale, shift)
        return True
    if producer.op not in ("CONV", "AFFINE", "BINARY"):
        return False
    pure = bool(np.all(scale == 1.0) and np.all(shift == 0.0))
    if producer.attrs["act"] != ir.ACT_NONE:
        # clip(clip(x, a, b), c, d) = clip(x, max(a, c), min(b, d)) when the ranges overlap
        r1, r2 = _clip_range(producer.attrs), _clip_range(affine.attrs)
        if not pure or r1 is None or r2 is None:
            return False
        lo, hi = max(r1[0], r2[0]), min(r1[1], r2[1])
        if lo > hi:
            return False
        relu = (lo, hi) == (0.0, np.inf)
        producer.attrs.update(act=ir.ACT_RELU if relu else ir.ACT_CLIP,
                              alpha=0.0 if relu else float(lo), beta=0.0 if relu else float(hi))
        return True
    if not pure and producer.op == "AFFINE":
        _compose(producer, scale, shift)
    elif not pure:
        if producer.op == "BINARY" or len(producer.inputs) > 1:
            return False  # BINARY takes activations only; a CONV's residual would be scaled too
        w = producer.weights["w"]
        g, _, _, _, cout_g = w.shape
        # float32 products of float32 values are correctly rounded: as exact as float64
        producer.weights["w"] = w * scale.astype(np.float32).reshape(g, 1, 1, 1, cout_g)
        producer.weights["b"] = (producer.weights["b"] * scale + shift).astype(np.float32)
    _set_act(producer, affine)
    return True


def _compose(producer: ir.Layer, scale, shift) -> None:
    """The producer's scale and shift (AFFINE, LAYERNORM), then ``scale`` and ``shift``, as one."""
    producer.weights["scale"] = (producer.weights["scale"] * scale).astype(np.float32)
    producer.weights["shift"] = (producer.weights["shift"] * scale + shift).astype(np.float32)


def fuse_sequence_ops(layers: list[ir.Layer], inputs: dict[str, int], outputs: dict[str, int]):
    for fuse in (_fuse_layernorm, _fuse_gelu, _fuse_matmul_epilogues, _fuse_heads_merge,
                 _fuse_causal_context, _fuse_attention, _drop_regrouping_copies):
        fuse(layers, _consumers(layers), set(outputs.values()))
        layers, inputs, outputs = prune_layers(layers, inputs, outputs)
    return fuse_layers(layers, inputs, outputs)


def _consumers(layers):
    """Per layer, the set of layers reading it. The list is pruned (``fuse_layers`` ends so, and
    each fusion is followed by ``prune_layers``): every layer that reads another is live."""
    cons: list[set] = [set() for _ in layers]
    for j, layer in enumerate(layers):
        for p in layer.inputs:
            cons[p].add(j)
    return cons


def _replace(layers, j, layer: ir.Layer) -> None:
    """Layer j becomes ``layer`` with j's name, shapes and layout (its consumers read it on)."""
    old = layers[j]
    layer.name, layer.shape, layer.onnx_shape, layer.layout = \
        old.name, old.shape, old.onnx_shape, old.layout
    layers[j] = layer


def _only(cons, p, j, outs) -> bool:
    return cons[p] == {j} and p not in outs


def _scalar(a: np.ndarray):
    a = np.asarray(a).reshape(-1)
    return float(a[0]) if a.size and np.all(a == a[0]) else None


# ------------------------------------------------------------------------------------ LayerNorm

def _is(layers, i, op, **attrs) -> bool:
    layer = layers[i]
    return layer.op == op and all(layer.attrs.get(k) == v for k, v in attrs.items())


def _fuse_layernorm(layers, cons, outs):
    for y in range(len(layers)):
        found = _layernorm_at(layers, cons, outs, y)
        if found is not None:
            x, eps, scale, shift = found
            c = layers[x].rows
            weights = {"scale": np.broadcast_to(np.asarray(scale, np.float32), (c,)).copy(),
                       "shift": np.broadcast_to(np.asarray(shift, np.float32), (c,)).copy()}
            _replace(layers, y, ir.Layer("", "LAYERNORM", [x], layers[y].shape,
                                         {"eps": float(eps)}, weights))


def _layernorm_at(layers, cons, outs, y):
    """(x, eps, scale, shift) when layer y ends a written-out layer normalisation of x."""
    scale, shift = 1.0, 0.0
    n = y
    if _is(layers, y, "AFFINE", act=ir.ACT_NONE) and layers[layers[y].inputs[0]].op == "BINARY":
        n = layers[y].inputs[0]
        if not _only(cons, n, y, outs):
            return None
        scale, shift = layers[y].weights["scale"], layers[y].weights["shift"]
    L = layers[n]
    if L.op != "BINARY" or len(L.inputs) != 2 or L.attrs["act"] != ir.ACT_NONE:
        return None
    d, s = L.inputs
    if L.attrs["kind"] == ir.BIN_MUL and _is(layers, s, "AFFINE", act=ir.ACT_RECIPROCAL) and \
            _scalar(layers[s].weights["scale"]) == 1.0 and \
            _scalar(layers[s].weights["shift"]) == 0.0 and _only(cons, s, n, outs):
        r, s = s, layers[s].inputs[0]  # d * (1 / sqrt(v + eps))
        if not _only(cons, s, r, outs):
            return None
    elif L.attrs["kind"] != ir.BIN_DIV or not _only(cons, s, n, outs):  # d / sqrt(v + eps)
        return None
    S = layers[s]
    if S.op != "AFFINE" or S.attrs["act"] != ir.ACT_SQRT or _scalar(S.weights["scale"]) != 1.0:
        return None
    eps = _scalar(S.weights["shift"])
    v = S.inputs[0]
    if eps is None or eps < 0 or not _is(layers, v, "ROW_REDUCE", kind=ir.REDUCE_MEAN) or \
            not _only(cons, v, s, outs):
        return None
    q = layers[v].inputs[0]
    if not (_is(layers, q, "BINARY", kind=ir.BIN_MUL, act=ir.ACT_NONE)
            and layers[q].inputs == [d, d] and _only(cons, q, v, outs)):
        return None
    D = layers[d]
    if not (D.op == "BINARY" and D.attrs["kind"] == ir.BIN_SUB and D.attrs["act"] == ir.ACT_NONE
            and len(D.inputs) == 2 and cons[d] == {q, n} and d not in outs):
        return None
    x, m = D.inputs
    if not (_is(layers, m, "ROW_REDUCE", kind=ir.REDUCE_MEAN) and layers[m].inputs == [x]
            and _only(cons, m, d, outs) and D.shape == layers[x].shape == layers[y].shape):
        return None
    return x, eps, scale, shift


# ----------------------------------------------------------------------------------------- GELU

_PROBE = np.linspace(-10.0, 10.0, 401)


def _elementwise_scalar(layer: ir.Layer) -> bool:
    """An elementwise layer whose constants are one scalar each (GELU's building blocks)."""
    if layer.op == "AFFINE":
        return _scalar(layer.weights["scale"]) is not None and \
            _scalar(layer.weights["shift"]) is not None
    if layer.op == "BINARY":
        return len(layer.inputs) == 2 or np.asarray(layer.weights["k"]).size == 1
    return False


def _fuse_gelu(layers, cons, outs):
    from ..reference import activation

    for y in range(len(layers)):
        if not _elementwise_scalar(layers[y]):
            continue
        group = {y}
        # Absorb producers used by the group only, latest first (a producer is decided after
        # every consumer that could join).
        heap = [-p for p in set(layers[y].inputs)]
        heapq.heapify(heap)
        seen = set()
        while heap:
            p = -heapq.heappop(heap)
            if p in seen:
                continue
            seen.add(p)
            if p not in outs and cons[p] and cons[p] <= group and \
                    _elementwise_scalar(layers[p]) and layers[p].shape == layers[y].shape:
                group.add(p)
                for q in layers[p].inputs:
                    heapq.heappush(heap, -q)
        external = {p for j in group for p in layers[j].inputs if p not in group}
        if len(group) < 2 or len(external) != 1:
            continue
        x = external.pop()
        if layers[x].shape != layers[y].shape:
            continue
        f = _evaluate(layers, sorted(group), x, _PROBE)
        for act in (ir.ACT_GELU, ir.ACT_GELU_TANH):
            want = activation(_PROBE, act)
            if f is not None and np.all(np.abs(f - want) <= 1e-5 * (1.0 + np.abs(want))):
                c = layers[x].rows
                _replace(layers, y, ir.Layer("", "AFFINE", [x], layers[y].shape,
                                             dict(act=act, alpha=0.0, beta=0.0),
                                             {"scale": np.ones(c, np.float32),
                                              "shift": np.zeros(c, np.float32)}))
                cons[x] = (cons[x] - group) | {y}
                break


def _evaluate(layers, order, x, probe):
    """The group's function of x on probe values (float64), or None where it is not defined."""
    from ..reference import _BIN, activation

    vals = {x: probe}
    with np.errstate(all="ignore"):
        for j in order:
            L = layers[j]
            a = L.attrs
            if L.op == "AFFINE":
                v = vals[L.inputs[0]] * _scalar(L.weights["scale"]) + _scalar(L.weights["shift"])
            else:
                u = vals[L.inputs[0]]
                w = vals[L.inputs[1]] if len(L.inputs) == 2 else _scalar(L.weights["k"])
                u, w = (w, u) if len(L.inputs) == 1 and a.get("const_first") else (u, w)
                v = _BIN[a["kind"]](u, w)
            vals[j] = activation(np.asarray(v, np.float64), a.get("act", ir.ACT_NONE),
                                 a.get("alpha", 0.0), a.get("beta", 0.0))
    out = vals[order[-1]]
    return out if np.all(np.isfinite(out)) else None


# --------------------------------------------------------------------------- attention epilogues

def _causal_offset(keep: np.ndarray):
    """The offset o with keep[i, j] == (j <= i + o), or None."""
    m, n = keep.shape
    o = int(keep[-1].sum()) - 1 - (m - 1)
    if keep.all() or not keep.any():
        return None
    want = np.arange(n)[None, :] <= np.arange(m)[:, None] + o
    return o if np.array_equal(keep, want) else None


def _per_batch(mm: ir.Layer, k4: np.ndarray):
    """The (i, j) constant every batch of the MATMUL's output has, or None when the pattern
    differs between batches; ``k4`` is given like that output ((N, C, H, W), broadcast)."""
    a = mm.attrs
    flat = ir.internal_to_storage(np.ascontiguousarray(np.broadcast_to(k4, mm.shape)))
    k = flat.reshape(a["batch0"], a["batch1"], a["m"], a["n"])
    return k[0, 0] if (k == k[:1, :1]).all() else None


def _fuse_matmul_epilogues(layers, cons, outs):
    for j, L in enumerate(layers):
        mms = [p for p in L.inputs if layers[p].op == "MATMUL" and _only(cons, p, j, outs)
               and layers[p].attrs["out_mode"] == 0 and layers[p].shape == L.shape]
        if not mms:
            continue
        p = mms[0]
        mm = layers[p]
        a = mm.attrs
        plain = not a["causal"] and not a["has_mask"]
        fused = None
        if L.op == "AFFINE" and L.attrs["act"] == ir.ACT_NONE and plain:
            s, t = _scalar(L.weights["scale"]), _scalar(L.weights["shift"])
            if s is not None and t == 0.0:
                fused = _with(mm, scale=float(a["scale"] * s))
        elif L.op == "WHERE" and L.attrs["operands"] == 2 and plain and \
                np.asarray(L.weights["y"]).size == 1:
            keep = _per_batch(mm, np.asarray(L.weights["cond"]) != 0)
            off = None if keep is None else _causal_offset(keep)
            if off is not None:
                fused = _with(mm, causal=1, offset=off, fill=float(L.weights["y"].reshape(-1)[0]))
        elif L.op == "BINARY" and L.attrs["kind"] == ir.BIN_ADD and L.attrs["act"] == ir.ACT_NONE:
            if len(L.inputs) == 1 and plain:
                fused = _additive_causal(mm, np.asarray(L.weights["k"], np.float64))
            elif len(L.inputs) == 2 and L.inputs[0] != L.inputs[1] and not a["has_mask"]:
                q = L.inputs[1] if L.inputs[0] == p else L.inputs[0]
                fused = _with_mask(mm, q, layers[q])
        if fused is not None:
            _replace(layers, j, fused)
            cons[p] = set()
            for i in fused.inputs:
                cons[i].add(j)


def _with(mm: ir.Layer, **attrs) -> ir.Layer:
    return ir.Layer("", "MATMUL", list(mm.inputs), mm.shape, dict(mm.attrs, **attrs))


def _additive_causal(mm, k4):
    """scores + constant: a causal fill when the constant is 0 where kept and one huge negative
    value elsewhere."""
    k = _per_batch(mm, k4)
    if k is None:
        return None
    masked = k != 0
    off = _causal_offset(~masked)
    fill = np.unique(k[masked])
    if off is None or fill.size != 1 or not fill[0] <= HUGE_NEGATIVE:
        return None
    return _with(mm, causal=1, offset=off, fill=float(fill[0]))


def _with_mask(mm: ir.Layer, q: int, mask: ir.Layer):
    """scores + mask (an activation broadcast to the scores): the mask read through strides."""
    a = mm.attrs
    b0, b1, m, n = a["batch0"], a["batch1"], a["m"], a["n"]
    # the (N, C, H, W) axis of each logical axis (b0, b1, i, j) of the scores
    if mm.shape == (b0, n, b1, m):
        axes = (0, 2, 3, 1)
    elif (b0, b1) == (1, 1) and mm.shape == (m, n, 1, 1):
        axes = (None, None, 0, 1)
    else:
        return None
    _, qc, qh, qw = mask.shape
    # storage strides of the mask's (N, C, H, W), 0 where it broadcasts
    strides = (qh * qw * qc, 1, qw * qc, qc)
    logical = [0 if ax is None or mask.shape[ax] == 1 else strides[ax] for ax in axes]
    if logical[3] not in (0, 1):
        return None
    return ir.Layer("", "MATMUL", list(mm.inputs) + [q], mm.shape,
                    dict(mm.attrs, has_mask=1, m_off=0, m_s0=logical[0], m_s1=logical[1],
                         m_si=logical[2], m_sj=logical[3]))


def _fuse_heads_merge(layers, cons, outs):
    """GATHER(context) that puts the heads side by side -> the MATMUL writes that way."""
    for g, G in enumerate(layers):
        if G.op != "GATHER" or len(G.inputs) != 1 or "const" in G.weights:
            continue
        p = G.inputs[0]
        mm = layers[p]
        if mm.op != "MATMUL" or mm.attrs["out_mode"] != 0 or not _only(cons, p, g, outs):
            continue
        a = mm.attrs
        b0, b1, m, n = a["batch0"], a["batch1"], a["m"], a["n"]
        if G.columns != b0 * m or G.rows != b1 * n or b1 == 1:
            continue
        want = np.arange(b0 * b1 * m * n).reshape(b0, b1, m, n).transpose(0, 2, 1, 3).ravel()
        if np.array_equal(np.asarray(G.weights["index"], np.int64), want):
            _replace(layers, g, _with(mm, out_mode=1))
            cons[p] = set()


def _fuse_causal_context(layers, cons, outs):
    for c, C in enumerate(layers):
        if C.op != "MATMUL" or C.attrs["causal"] or C.attrs["has_mask"]:
            continue
        s = C.inputs[0]
        if not _is(layers, s, "SOFTMAX", log=0):
            continue
        P = layers[layers[s].inputs[0]]
        if P.op != "MATMUL" or P.attrs["causal"] != 1 or P.attrs["has_mask"] or \
                P.attrs["fill"] > HUGE_NEGATIVE or P.attrs["out_mode"] != 0:
            continue
        if not _reads_probabilities(C, P):
            continue
        _replace(layers, c, _with(C, causal=2, offset=P.attrs["offset"]))


def _reads_probabilities(C: ir.Layer, P: ir.Layer) -> bool:
    """The context MATMUL C reads the softmax of scores P exactly as the scores lie: its A is
    (b0, b1, i, k) row-major over P's batches, queries and keys."""
    a, b = C.attrs, P.attrs
    m, k = b["m"], b["n"]
    return (a["batch0"], a["batch1"], a["m"], a["k"]) == (b["batch0"], b["batch1"], m, k) and \
        (a["a_off"], a["a_si"]) == (0, k) and \
        not (b["batch0"] > 1 and a["a_s0"] != b["batch1"] * m * k) and \
        not (b["batch1"] > 1 and a["a_s1"] != m * k)


def _fuse_attention(layers, cons, outs):
    """context MATMUL(SOFTMAX(scores MATMUL), values) -> ATTENTION, when the context reads the
    probabilities exactly as they lie and the scores leave out only what a softmax makes exactly
    zero: a causal fill of HUGE_NEGATIVE or less, every query keeping a key, and no mask (a
    padding mask as large as the fill, finfo.min on left padding, would tie the kept keys of a
    padded query with the left-out ones, which the unfused softmax then counts)."""
    for c, C in enumerate(layers):
        if C.op != "MATMUL" or C.attrs.get("has_mask") or C.attrs.get("scale", 1.0) != 1.0:
            continue
        s = C.inputs[0]
        if not _is(layers, s, "SOFTMAX", log=0) or not _only(cons, s, c, outs):
            continue
        p = layers[s].inputs[0]
        P = layers[p]
        if P.op != "MATMUL" or P.attrs["out_mode"] != 0 or not _only(cons, p, s, outs):
            continue
        a, b = C.attrs, P.attrs
        causal, off = b.get("causal", 0), b.get("offset", 0)
        if causal == 2 or (causal == 1 and (not b.get("fill", 0.0) <= HUGE_NEGATIVE or off < 0
                                            or b.get("has_mask"))):
            continue
        if a.get("causal", 0) not in (0, 2) or (a.get("causal") == 2 and
                                                (causal != 1 or a.get("offset") != off)):
            continue
        if not _reads_probabilities(C, P):
            continue
        attrs = {key: b.get(key, 0) for key in ir.MATMUL_IPARAMS}
        attrs.update(out_mode=a["out_mode"], causal=causal, offset=off if causal else 0,
                     scale=b.get("scale", 1.0), dv=a["n"], v_off=a["b_off"], v_s0=a["b_s0"],
                     v_s1=a["b_s1"], v_sk=a["b_sk"], v_sj=a["b_sj"])
        inputs = list(P.inputs[:2]) + [C.inputs[1]] + list(P.inputs[2:3])
        _replace(layers, c, ir.Layer("", "ATTENTION", inputs, C.shape, attrs))
        cons[s] = set()
        cons[p] = set()


# ---------------------------------------------------------------------------- regrouping copies

#: Ops that read their input only through its storage (their own columns are free to group).
_STORAGE_READERS = ("MATMUL", "ATTENTION", "EMBED", "GATHER")


def _per_column(layer: ir.Layer) -> bool:
    """Ops whose output column c is computed from input column c alone (same grouping)."""
    a = layer.attrs
    if layer.op in ("AFFINE", "SOFTMAX", "LAYERNORM", "ROW_REDUCE"):
        return True
    return layer.op == "CONV" and (a["kh"], a["kw"], a["sh"], a["sw"]) == (1, 1, 1, 1) and \
        a["pt"] + a["pl"] + a["pb"] + a["pr"] == 0


def _regroup(layers, cons, top: int, copy: int) -> list[int] | None:
    """Layers to give another column grouping so that layer ``top`` has it: top and, through
    per-column ops, their inputs, down to a layer that reads by storage position. None when a
    layer on the way (or a consumer of one other than ``copy``) depends on the grouping."""
    chain, todo = [], [top]
    while todo:
        li = todo.pop()
        L = layers[li]
        if li in chain:
            continue
        if not (L.layout == ir.LAYOUT_LAST or len(L.onnx_shape) <= 2) or L.op == "INPUT":
            return None
        chain.append(li)
        if L.op in _STORAGE_READERS:
            continue
        if not _per_column(L):
            return None
        todo.extend(dict.fromkeys(L.inputs))
    members = set(chain)
    for li in chain:  # everyone else reading these must read by storage position
        for j in cons[li]:
            if j not in members and j != copy and layers[j].op not in _STORAGE_READERS:
                return None
    return chain


def _drop_regrouping_copies(layers, cons, outs):
    for g, G in enumerate(layers):
        if G.op != "GATHER" or len(G.inputs) != 1 or "const" in G.weights or g in outs:
            continue
        p = G.inputs[0]
        P = layers[p]
        if P.rows != G.rows or P.shape == G.shape or \
                not np.array_equal(G.weights["index"], np.arange(P.columns * P.rows)):
            continue
        chain = _regroup(layers, cons, p, g)
        if chain is None:
            continue
        n, _, h, w = G.shape
        for li in chain:
            layers[li].shape = (n, layers[li].rows, h, w)
        for j in cons[g]:  # G's readers read its input, now grouped the same way
            layers[j].inputs = [p if q == g else q for q in layers[j].inputs]
            cons[p].add(j)
        cons[p].discard(g)
        cons[g] = set()


#: Limits of the native runtime's prologue (native/src/ops_conv.c CONV_PRE_MAX_KH,
#: CONV_PRE_MAX_RING_FLOATS): kernel rows, and the ring of that many rows of its input.
PROLOGUE_MAX_KH = 16
PROLOGUE_MAX_RING_FLOATS = 4 << 20
#: Smallest expanded map (one batch item) worth a prologue. A smaller one stays in L2 between the
#: two layers anyway, while every tile boundary of the depthwise layer makes the prologue compute
#: kh - sh rows twice: MobileNetV2's 28 x 28 x 192 and smaller maps fused made its 2-thread run
#: slower than with the 112 x 112 and 56 x 56 ones alone (docs/PERFORMANCE.md).
PROLOGUE_MIN_MAP_BYTES = 1 << 20


def fuse_pointwise_prologues(graph: ir.Graph) -> ir.Graph:
    """For graphs a local Runtime runs (coacto.compile with ``threads``): a 1x1 convolution
    (stride 1, no padding, one group, no residual) whose only consumer is a depthwise
    convolution (dilation 1, a vertical stride no larger than its kernel) becomes that layer's
    prologue where its output map (one batch item) has PROLOGUE_MIN_MAP_BYTES or more (attrs
    ``pre``, ``pre_act``, ``pre_alpha``, ``pre_beta``; weights ``pre_w`` as (cin, c), ``pre_b``).
    The runtime then computes the 1x1 convolution's rows as the depthwise window reaches them
    and keeps only a few, where the two layers wrote and read back a map of the expanded width:
    MobileNet-style inverted residuals. Graphs for offloading stay unfused:
    the server and the device must cut the same layers. Returns ``graph`` changed in place."""
    layers = graph.layers
    cons = graph.consumers()
    outs = set(graph.outputs.values())
    alive = [True] * len(layers)
    for j, dw in enumerate(layers):
        if dw.op != "CONV" or dw.layout != ir.LAYOUT_CHANNELS or dw.attrs.get("pre"):
            continue
        p = dw.inputs[0]
        pw = layers[p]
        a, c = dw.attrs, dw.shape[1]
        # (one channel in and out: the runtime prepares such a 1x1 as a depthwise layer)
        if not (a["group"] == c == pw.shape[1] > 1 and a.get("dh", 1) == 1
                and a.get("dw", 1) == 1 and a["sh"] <= a["kh"] <= PROLOGUE_MAX_KH
                and a["kh"] * pw.shape[3] * c <= PROLOGUE_MAX_RING_FLOATS):
            continue
        if 4 * pw.shape[1] * pw.shape[2] * pw.shape[3] < PROLOGUE_MIN_MAP_BYTES:
            continue
        if not (_pointwise(pw) and not pw.attrs.get("pre") and pw.layout == ir.LAYOUT_CHANNELS
                and len(pw.inputs) == 1 and cons[p] == [j] and p not in outs):
            continue
        cin = layers[pw.inputs[0]].shape[1]
        a.update(pre=1, pre_act=pw.attrs.get("act", ir.ACT_NONE),
                 pre_alpha=float(pw.attrs.get("alpha", 0.0)),
                 pre_beta=float(pw.attrs.get("beta", 0.0)))
        dw.weights["pre_w"] = np.ascontiguousarray(pw.weights["w"].reshape(cin, c))
        if "b" in pw.weights:
            dw.weights["pre_b"] = pw.weights["b"]
        dw.inputs = [pw.inputs[0]] + dw.inputs[1:]
        alive[p] = False
    if not all(alive):
        graph.layers, graph.inputs, graph.outputs = prune_layers(layers, graph.inputs,
                                                                 graph.outputs, alive)
    return graph
