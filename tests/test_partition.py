"""Partitioner properties: tiles cover every element exactly once, and dependencies are exact —
equal to an element-by-element oracle that enumerates what each output element reads."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coacto import ir
from coacto.partition import partition


def conv_out(size, k, s, p0, p1, d):
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def element_reads(graph, li, n, c, y, x):
    """Yields (input layer, n, c, y, x) for every input element output (n, c, y, x) reads."""
    layer = graph.layers[li]
    a = layer.attrs
    for k, p in enumerate(layer.inputs):
        src = graph.layers[p]
        sn, sc, sh, sw = src.shape
        if layer.op in ("CONV", "POOL") and k == 0:
            if layer.op == "CONV":
                g = a["group"]
                cin_g, cout_g = sc // g, layer.shape[1] // g
                chans = range((c // cout_g) * cin_g, (c // cout_g + 1) * cin_g)
            else:
                chans = [c]
            for ky, kx in itertools.product(range(a["kh"]), range(a["kw"])):
                iy = y * a["sh"] - a["pt"] + ky * a.get("dh", 1)
                ix = x * a["sw"] - a["pl"] + kx * a.get("dw", 1)
                if 0 <= iy < sh and 0 <= ix < sw:
                    for ci in chans:
                        yield p, n, ci, iy, ix
        elif layer.op == "GLOBAL_POOL":
            for iy, ix in itertools.product(range(sh), range(sw)):
                yield p, n, c, iy, ix
        elif layer.op == "CONCAT":
            off = sum(graph.layers[q].shape[1] for q in layer.inputs[:k])
            if off <= c < off + sc:
                yield p, n, c - off, y, x
        elif layer.op == "LRN":
            size = a["size"]
            for ci in range(c - (size - 1) // 2, c + (size - 1) - (size - 1) // 2 + 1):
                if 0 <= ci < sc:
                    yield p, n, ci, y, x
        elif layer.op in ("SOFTMAX", "LAYERNORM", "ROW_REDUCE"):  # every row of the column
            for ci in range(sc):
                yield p, n, ci, y, x
        elif layer.op == "MATMUL":
            yield from _matmul_reads(graph, layer, k, p, n, c, y, x)
        elif layer.op == "ATTENTION":
            yield from _attention_reads(graph, layer, k, p, n, c, y, x)
        elif layer.op == "EMBED":  # output column i reads element i of the ids
            _, _, h, w = layer.shape
            yield (p, *_storage_element(src, (n * h + y) * w + x))
        else:  # elementwise with broadcasting (BINARY, AFFINE, WHERE, CONV residual)
            yield (p, n if sn > 1 else 0, c if sc > 1 else 0, y if sh > 1 else 0,
                   x if sw > 1 else 0)


def _storage_element(src, e):
    """(n, c, y, x) of storage element e of a layer."""
    sn, sc, sh, sw = src.shape
    col, ci = divmod(int(e), sc)
    ni, rem = divmod(col, sh * sw)
    yi, xi = divmod(rem, sw)
    return ni, ci, yi, xi


def _matmul_reads(graph, layer, k, p, n, c, y, x):
    """What output element (n, c, y, x) of a MATMUL reads from its input k (the definition in
    coacto.ir: masked outputs of causal 1 read only the mask; causal 2 sums over k <= i + o)."""
    a = layer.attrs
    _, _, h, w = layer.shape
    col = (n * h + y) * w + x
    m_, n_ = a["m"], a["n"]
    if a["out_mode"] == 0:
        bb, i = divmod(col, m_)
        b0, b1 = divmod(bb, a["batch1"])
        j = c
    else:
        b0, i = divmod(col, m_)
        b1, j = divmod(c, n_)
    src = graph.layers[p]
    if k == 2:
        e = a["m_off"] + b0 * a["m_s0"] + b1 * a["m_s1"] + i * a["m_si"] + j * a["m_sj"]
        yield (p, *_storage_element(src, e))
        return
    if a["causal"] == 1 and j > i + a["offset"]:
        return
    kmax = a["k"] if a["causal"] != 2 else max(0, min(a["k"], i + a["offset"] + 1))
    for kk in range(kmax):
        if k == 0:
            e = a["a_off"] + b0 * a["a_s0"] + b1 * a["a_s1"] + i * a["a_si"] + kk
        else:
            e = a["b_off"] + b0 * a["b_s0"] + b1 * a["b_s1"] + kk * a["b_sk"] + j * a["b_sj"]
        yield (p, *_storage_element(src, e))


def _attention_reads(graph, layer, k, p, n, c, y, x):
    """What output element (n, c, y, x) of an ATTENTION reads from its input k (coacto.ir): its
    query's row, and the keys, values and mask values of the keys that query keeps."""
    a = layer.attrs
    _, _, h, w = layer.shape
    col = (n * h + y) * w + x
    if a["out_mode"] == 0:
        bb, i = divmod(col, a["m"])
        b0, b1 = divmod(bb, a["batch1"])
        d = c
    else:
        b0, i = divmod(col, a["m"])
        b1, d = divmod(c, a["dv"])
    keep = min(a["n"], i + a["offset"] + 1) if a["causal"] else a["n"]
    src = graph.layers[p]
    if k == 0:
        elements = [a["a_off"] + b0 * a["a_s0"] + b1 * a["a_s1"] + i * a["a_si"] + kk
                    for kk in range(a["k"])]
    elif k == 1:
        elements = [a["b_off"] + b0 * a["b_s0"] + b1 * a["b_s1"] + kk * a["b_sk"] + j * a["b_sj"]
                    for kk in range(a["k"]) for j in range(keep)]
    elif k == 2:
        elements = [a["v_off"] + b0 * a["v_s0"] + b1 * a["v_s1"] + j * a["v_sk"] + d * a["v_sj"]
                    for j in range(keep)]
    else:
        elements = [a["m_off"] + b0 * a["m_s0"] + b1 * a["m_s1"] + i * a["m_si"] + j * a["m_sj"]
                    for j in range(keep)]
    for e in elements:
        yield (p, *_storage_element(src, e))


def tile_of(plan, graph, li, n, c, y, x):
    _, _, h, w = graph.layers[li].shape
    col = (n * h + y) * w + x
    cb = np.searchsorted(plan.col_bounds[li], col, side="right") - 1
    rb = np.searchsorted(plan.row_bounds[li], c, side="right") - 1
    return int(plan.layer_first_tile[li] + cb * (len(plan.row_bounds[li]) - 1) + rb)


def check_plan(graph, plan):
    # coverage: every element of every layer in exactly one tile
    for li, layer in enumerate(graph.layers):
        count = np.zeros((layer.columns, layer.rows), np.int32)
        for t in range(plan.layer_first_tile[li], plan.layer_first_tile[li + 1]):
            c0, c1, r0, r1 = plan.tile_bounds[t]
            count[c0:c1, r0:r1] += 1
        assert (count == 1).all(), f"layer {li}: elements covered {count.min()}..{count.max()} times"
    # exactness: parents == the tiles holding some element the tile reads
    for li, layer in enumerate(graph.layers):
        if layer.op == "INPUT":
            continue
        n_, c_, h_, w_ = layer.shape
        for t in range(plan.layer_first_tile[li], plan.layer_first_tile[li + 1]):
            c0, c1, r0, r1 = (int(v) for v in plan.tile_bounds[t])
            want = set()
            for col in range(c0, c1):
                n, rem = divmod(col, h_ * w_)
                y, x = divmod(rem, w_)
                for c in range(r0, r1):
                    for p, pn, pc, py, px in element_reads(graph, li, n, c, y, x):
                        want.add(tile_of(plan, graph, p, pn, pc, py, px))
            got = set(int(v) for v in plan.dependencies(t))
            assert got == want, f"layer {li} ({layer.op}) tile {t}: extra {got - want}, missing {want - got}"


@st.composite
def window_graphs(draw):
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([1, 3, 8, 64, 96]))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    op = draw(st.sampled_from(["CONV", "POOL"]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    pt, pl, pb, pr = pads
    ho, wo = conv_out(h, kh, sh, pt, pb, dh), conv_out(w, kw, sw, pl, pr, dw)
    if ho < 1 or wo < 1 or pt >= kh * dh or pb >= kh * dh or pl >= kw * dw or pr >= kw * dw:
        ho = wo = 0
    if ho < 1 or wo < 1:
        kh = kw = sh = sw = dh = dw = 1
        pt = pl = pb = pr = 0
        ho, wo = h, w
    attrs = dict(kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr, dh=dh, dw=dw)
    layers = [ir.Layer("x", "INPUT", [], (n, c, h, w))]
    if op == "CONV":
        group = draw(st.sampled_from([g for g in (1, 2, 4, c) if c % g == 0]))
        cout = group * draw(st.sampled_from([1, 2, 40]))
        layers.append(ir.Layer("conv", "CONV", [0], (n, cout, ho, wo), dict(attrs, group=group)))
    else:
        layers.append(ir.Layer("pool", "POOL", [0], (n, c, ho, wo), dict(attrs, kind=ir.POOL_MAX)))
    tiles = draw(st.integers(1, 12))
    return ir.Graph(layers, {"x": 0}, {"y": 1}), tiles


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_graphs())
def test_window_ops_dependencies_exact(case):
    graph, tiles = case
    check_plan(graph, partition(graph, tiles))


@st.composite
def mixed_graphs(draw):
    """INPUT -> conv -> (residual conv, concat, broadcast mul, global pool, LRN)."""
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([4, 64]))
    h, w = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    conv = dict(kh=3, kw=3, sh=1, sw=1, pt=1, pl=1, pb=1, pr=1, dh=1, dw=1, group=1)
    L = [ir.Layer("x", "INPUT", [], (n, c, h, w)),
         ir.Layer("a", "CONV", [0], (n, c, h, w), dict(conv)),
         ir.Layer("b", "CONV", [1, 0], (n, c, h, w), dict(conv))]  # residual from the input
    L.append(ir.Layer("cat", "CONCAT", [1, 2, 0], (n, 3 * c, h, w)))
    L.append(ir.Layer("gp", "GLOBAL_POOL", [3], (n, 3 * c, 1, 1), dict(kind=ir.POOL_AVG)))
    L.append(ir.Layer("mul", "BINARY", [3, 4], (n, 3 * c, h, w), dict(kind=ir.BIN_MUL)))
    L.append(ir.Layer("lrn", "LRN", [5], (n, 3 * c, h, w),
                      dict(size=draw(st.sampled_from([1, 2, 5])), alpha=1e-4, beta=0.75, bias=1.0)))
    tiles = draw(st.integers(1, 10))
    return ir.Graph(L, {"x": 0}, {"y": 6}), tiles


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_graphs())
def test_mixed_ops_dependencies_exact(case):
    graph, tiles = case
    check_plan(graph, partition(graph, tiles))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.sampled_from([2, 4, 6]), st.integers(1, 5), st.integers(1, 5),
       st.integers(1, 9))
def test_gather_dependencies_exact(n, c, h, w, tiles):
    """A channel shuffle (groups of 2) as a GATHER index map."""
    total = n * h * w * c
    src = np.arange(total).reshape(n, h, w, c)
    shuffled = src.reshape(n, h, w, 2, c // 2).transpose(0, 1, 2, 4, 3).reshape(-1)
    layers = [ir.Layer("x", "INPUT", [], (n, c, h, w)),
              ir.Layer("shuffle", "GATHER", [0], (n, c, h, w), {"fill": 0.0},
                       {"index": shuffled.astype(np.int32)})]
    graph = ir.Graph(layers, {"x": 0}, {"y": 1})
    plan = partition(graph, tiles)
    for t in range(plan.layer_first_tile[1], plan.layer_first_tile[2]):
        c0, c1, r0, r1 = plan.tile_bounds[t]
        want = set()
        for col in range(c0, c1):
            for r in range(r0, r1):
                src_flat = int(shuffled[col * c + r])
                sn, sy, sx = np.unravel_index(src_flat // c, (n, h, w))
                want.add(tile_of(plan, graph, 0, int(sn), src_flat % c, int(sy), int(sx)))
        assert set(int(v) for v in plan.dependencies(t)) == want


def test_row_splits_for_few_columns():
    """A fully connected layer (1 column) is split by rows and each row tile reads all inputs."""
    layers = [ir.Layer("x", "INPUT", [], (1, 512, 1, 1)),
              ir.Layer("fc", "CONV", [0], (1, 1000, 1, 1),
                       dict(kh=1, kw=1, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, group=1))]
    graph = ir.Graph(layers, {"x": 0}, {"y": 1})
    plan = partition(graph, 8)
    fc_tiles = range(plan.layer_first_tile[1], plan.layer_first_tile[2])
    assert len(fc_tiles) == 8
    assert all(plan.tile_bounds[t][2] % 32 == 0 for t in fc_tiles)
    check_plan(graph, plan)


def test_linear_layers_of_a_sequence_get_equal_even_tiles():
    """A 127-token 1152 -> 3072 linear layer (0.9 GFLOP: about 9 tiles by FLOPs, one token block)
    is cut into 8 equal row tiles, not 9 of 10 or 11 panels; an odd panel count gets the least
    idle split. With 128 tokens or more the tokens are halved (TOKEN_BLOCKS), each half cut into
    equal row tiles: ViT's 197 x 768 -> 3072 as 2 x 4. 64 tokens (GPT-2) and weights over
    TOKEN_SPLIT_MAX_WEIGHT_BYTES (a language-model head) keep one token block."""
    from coacto.partition.rules import TOKEN_SPLIT_MAX_WEIGHT_BYTES, _balanced_parts, choose_splits

    def linear(cols, d_in, d_out):
        w = np.zeros((d_out, d_in, 1, 1), np.float32)
        layers = [ir.Layer("x", "INPUT", [], (1, d_in, 1, cols), layout=ir.LAYOUT_LAST),
                  ir.Layer("fc", "CONV", [0], (1, d_out, 1, cols),
                           dict(kh=1, kw=1, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, group=1),
                           weights={"w": w}, layout=ir.LAYOUT_LAST)]
        return ir.Graph(layers, {"x": 0}, {"y": 1})

    cols, rows = choose_splits(linear(127, 1152, 3072), 1, None)
    assert len(cols) == 2 and len(rows) == 9, rows
    assert len(set(np.diff(rows))) == 1
    for d_in, d_out in [(768, 3072), (3072, 768)]:
        cols, rows = choose_splits(linear(197, d_in, d_out), 1, None)
        assert list(cols) == [0, 98, 197] and len(rows) == 5, (cols, rows)
        assert len(set(np.diff(rows))) == 1
    cols, rows = choose_splits(linear(128, 768, 768), 1, None)
    assert list(cols) == [0, 64, 128] and len(rows) == 3
    assert len(choose_splits(linear(64, 768, 3072), 1, None)[0]) == 2
    head = linear(256, 768, 12000)
    assert head.layers[1].weights["w"].nbytes > TOKEN_SPLIT_MAX_WEIGHT_BYTES
    assert len(choose_splits(head, 1, None)[0]) == 2
    assert _balanced_parts(24, 9) == 8 and _balanced_parts(96, 9) == 8
    assert _balanced_parts(5, 4) == 4 and _balanced_parts(30, 5) == 4  # even beats equal-but-odd
    assert _balanced_parts(1571, 16) == 16  # already within 1%: the count stays
    assert _balanced_parts(8, 1) == 1


def test_layer_norm_over_a_short_sequence_is_shared():
    """A LayerNorm over GPT-2's 64 tokens gets two token tiles (MIN_TILE_COLUMNS_SMALL_WEIGHTS),
    not one that the other thread would wait for; BERT's 128 tokens get four. A LayerNorm is never
    split by rows (it reads the whole row of a token), and its tiles depend on exactly the tokens
    they normalise."""
    from coacto.partition import choose_splits

    def norm(tokens, d):
        layers = [ir.Layer("x", "INPUT", [], (1, d, 1, tokens), layout=ir.LAYOUT_LAST),
                  ir.Layer("ln", "LAYERNORM", [0], (1, d, 1, tokens), {"eps": 1e-5},
                           weights={"scale": np.ones(d, np.float32),
                                    "shift": np.zeros(d, np.float32)},
                           layout=ir.LAYOUT_LAST)]
        return ir.Graph(layers, {"x": 0}, {"y": 1})

    cols, rows = choose_splits(norm(64, 768), 1, None)
    assert list(cols) == [0, 32, 64] and list(rows) == [0, 768]
    cols, rows = choose_splits(norm(128, 768), 1, None)
    assert len(cols) == 5 and len(rows) == 2
    assert len(choose_splits(norm(20, 768), 1, None)[0]) == 2  # too few tokens for two tiles
    small = norm(50, 16)
    check_plan(small, partition(small))


def test_small_weight_layers_on_small_maps_split_by_columns():
    """A 1x1 convolution on a 7x7 map (49 columns) gets two column blocks when its weights are
    small (MobileNetV2's 160 -> 960), so a chain of them runs as two independent halves; with
    large weights (ResNet-50's 512 -> 2048) it keeps one column block and splits its rows."""
    from coacto.partition.rules import SMALL_WEIGHT_BYTES, choose_splits

    def pointwise_chain(cin, cmid):
        conv = dict(kh=1, kw=1, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, group=1)
        w1 = np.zeros((cmid, cin, 1, 1), np.float32)
        w2 = np.zeros((cin, cmid, 1, 1), np.float32)
        layers = [ir.Layer("x", "INPUT", [], (1, cin, 7, 7)),
                  ir.Layer("expand", "CONV", [0], (1, cmid, 7, 7), conv, weights={"w": w1}),
                  ir.Layer("project", "CONV", [1], (1, cin, 7, 7), conv, weights={"w": w2})]
        return ir.Graph(layers, {"x": 0}, {"y": 2})

    small = pointwise_chain(160, 960)
    assert small.layers[1].weights["w"].nbytes <= SMALL_WEIGHT_BYTES
    cols, rows = choose_splits(small, 1, None)
    assert list(cols) == [0, 24, 49] and len(rows) == 3
    tiny = pointwise_chain(8, 24)  # the element-by-element oracle, on a size it can afford
    check_plan(tiny, partition(tiny))
    plan = partition(small)
    first, last = plan.layer_first_tile[2], plan.layer_first_tile[3]
    for t in range(first, last):  # a projection tile reads only its own columns of the expansion
        c0, c1 = plan.tile_bounds[t][:2]
        parents = plan.dependencies(t)
        assert all(plan.tile_bounds[p][0] == c0 and plan.tile_bounds[p][1] == c1 for p in parents)
    large = pointwise_chain(512, 2048)
    assert large.layers[1].weights["w"].nbytes > SMALL_WEIGHT_BYTES
    cols, rows = choose_splits(large, 1, None)
    assert list(cols) == [0, 49] and len(rows) == 5


def test_threads_set_the_fewest_tiles_of_cheap_layers():
    """A graph partitioned for one computing thread runs a cheap layer whole; for two threads,
    or without a thread count, it keeps DEFAULT_MIN_TILES, and for eight, eight; layers whose
    FLOPs ask for more tiles get them either way, and every plan still covers each element once
    with exact dependencies. A thread count that is not a positive integer is refused."""
    import pytest

    from coacto.errors import CoactoError
    from coacto.partition.rules import DEFAULT_MIN_TILES, DEFAULT_TILE_FLOPS

    conv = dict(kh=1, kw=1, sh=1, sw=1, pt=0, pl=0, pb=0, pr=0, group=1)
    cheap = np.zeros((96, 16, 1, 1), np.float32)        # 16 -> 96 at 56 x 56: 9.6 MFLOP
    costly = np.zeros((1024, 1024, 1, 1), np.float32)   # 1024 -> 1024 at 56 x 56: 6.6 GFLOP
    layers = [ir.Layer("x", "INPUT", [], (1, 16, 56, 56)),
              ir.Layer("cheap", "CONV", [0], (1, 96, 56, 56), conv, weights={"w": cheap}),
              ir.Layer("wide", "CONV", [1], (1, 1024, 56, 56), conv,
                       weights={"w": np.zeros((1024, 96, 1, 1), np.float32)}),
              ir.Layer("costly", "CONV", [2], (1, 1024, 56, 56), conv, weights={"w": costly})]
    graph = ir.Graph(layers, {"x": 0}, {"y": 3})

    def tiles(plan, li):
        return int(plan.layer_first_tile[li + 1] - plan.layer_first_tile[li])

    default, one, two = partition(graph), partition(graph, threads=1), partition(graph, threads=2)
    assert tiles(default, 1) == tiles(two, 1) == DEFAULT_MIN_TILES == 4 and tiles(one, 1) == 1
    assert tiles(partition(graph, threads=8), 1) == 8
    want = round(2 * 56 * 56 * 1024 * 1024 / DEFAULT_TILE_FLOPS)
    assert tiles(one, 3) == tiles(default, 3) >= min(want, 16) > 4
    small = ir.Graph([ir.Layer("x", "INPUT", [], (1, 3, 9, 9)),
                      ir.Layer("c", "CONV", [0], (1, 5, 9, 9), conv,
                               weights={"w": np.zeros((5, 3, 1, 1), np.float32)}),
                      ir.Layer("d", "CONV", [1], (1, 4, 9, 9), conv,
                               weights={"w": np.zeros((4, 5, 1, 1), np.float32)})],
                     {"x": 0}, {"y": 2})
    for t in (1, 2, 3):
        check_plan(small, partition(small, threads=t))
    for bad in (0, -1, 1.0, "2", True):
        with pytest.raises(CoactoError):
            partition(graph, threads=bad)


def test_large_weight_convolutions_read_in_place_split_rows():
    """A 3x3 convolution the runtime reads in place with more than LARGE_WEIGHT_BYTES of weights
    (VGG-16's 28 x 28 x 512) gets column blocks of at least MIN_TILE_COLUMNS_LARGE_WEIGHTS
    positions and splits its channels instead, so its weights stream from memory 4 times, not 16;
    one with smaller weights (ResNet-50's 14 x 14 x 256), a short-row map (7 x 7, im2col) and a
    strided-width dilation (im2col) keep the column split."""
    from coacto.partition.rules import (LARGE_WEIGHT_BYTES, MIN_TILE_COLUMNS,
                                  MIN_TILE_COLUMNS_LARGE_WEIGHTS, choose_splits)

    def conv3x3(c, hw, dw=1):
        attrs = dict(kh=3, kw=3, sh=1, sw=1, pt=dw, pl=dw, pb=dw, pr=dw, dh=1, dw=dw, group=1)
        w = np.zeros((c, c, 3, 3), np.float32)
        layers = [ir.Layer("x", "INPUT", [], (1, c, hw, hw)),
                  ir.Layer("conv", "CONV", [0], (1, c, hw, hw), attrs, weights={"w": w})]
        return ir.Graph(layers, {"x": 0}, {"y": 1})

    big = conv3x3(512, 28)
    assert big.layers[1].weights["w"].nbytes > LARGE_WEIGHT_BYTES
    cols, rows = choose_splits(big, 1, None)
    assert min(np.diff(cols)) >= MIN_TILE_COLUMNS_LARGE_WEIGHTS and len(cols) == 5
    assert len(rows) == 5 and (len(cols) - 1) * (len(rows) - 1) == 16
    check_plan(conv3x3(8, 14), partition(conv3x3(8, 14)))  # the oracle on an affordable size
    for graph in (conv3x3(256, 14), conv3x3(512, 7), conv3x3(512, 28, dw=2)):
        cols, rows = choose_splits(graph, 1, None)
        assert min(np.diff(cols)) < MIN_TILE_COLUMNS_LARGE_WEIGHTS, graph.layers[1].shape
        assert min(np.diff(cols)) >= min(MIN_TILE_COLUMNS, graph.layers[1].columns)


def test_winograd_convolutions_get_blocks_of_whole_row_pairs():
    """In a graph for offloading, a convolution the runtime computes as Winograd F(2x2, 3x3)
    (whose tiles compute whole 2x2 output blocks) gets column blocks of whole pairs of output
    rows, image by image; in ResNet-50's graph for offloading those at 56x56 had 32 blocks of
    1.75 rows, each computing its rows' blocks again (1.6x the single block's time). A local
    graph, a strided convolution and one with too few input channels for Winograd keep their
    blocks. The plans stay exact (the oracle)."""
    from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS
    from coacto.partition.rules import MIN_TILE_COLUMNS_SMALL_WEIGHTS, choose_splits

    def conv(hw, stride=1, cin=64, n=1):
        attrs = dict(kh=3, kw=3, sh=stride, sw=stride, pt=1, pl=1, pb=1, pr=1, dh=1, dw=1,
                     group=1)
        out = (hw + 2 - 3) // stride + 1
        layers = [ir.Layer("x", "INPUT", [], (n, cin, hw, hw)),
                  ir.Layer("conv", "CONV", [0], (n, 64, out, out), attrs,
                           weights={"w": np.zeros((64, cin, 3, 3), np.float32)})]
        return ir.Graph(layers, {"x": 0}, {"y": 1})

    def pair_starts(n, hw):
        return {i * hw * hw + y * hw for i in range(n) for y in range(0, hw, 2)} | {n * hw * hw}

    for hw, blocks in ((56, 28), (28, 14), (14, 4), (7, 2)):
        cols, _ = choose_splits(conv(hw), 1, None, OFFLOAD_MIN_COLUMN_BLOCKS)
        assert set(cols.tolist()) <= pair_starts(1, hw), (hw, cols)
        # (an odd row count leaves the last block a row short of a pair)
        assert len(cols) - 1 == blocks and min(np.diff(cols)) >= MIN_TILE_COLUMNS_SMALL_WEIGHTS - \
            (hw if hw % 2 else 0)
    cols, _ = choose_splits(conv(7, n=2), 1, None, OFFLOAD_MIN_COLUMN_BLOCKS)
    assert set(cols.tolist()) <= pair_starts(2, 7) and len(cols) > 2, cols  # pairs per image
    cols, _ = choose_splits(conv(56), 1, None)  # a local graph's blocks: as even as they come
    assert len(cols) - 1 == 4 and np.all(np.diff(cols) == 784)
    for graph in (conv(112, stride=2), conv(56, cin=8)):  # no Winograd: 3136 columns, 98 each
        cols, _ = choose_splits(graph, 1, None, OFFLOAD_MIN_COLUMN_BLOCKS)
        assert len(cols) - 1 == OFFLOAD_MIN_COLUMN_BLOCKS and np.all(np.diff(cols) == 98)
    check_plan(conv(14, cin=16), partition(conv(14, cin=16), min_column_blocks=32))
    check_plan(conv(7, cin=16, n=2), partition(conv(7, cin=16, n=2), min_column_blocks=32))


def test_pooling_follows_its_producers_column_blocks():
    """A max pooling after a 16-tile convolution (VGG-16's 112 x 112 x 128) gets 16 column blocks,
    not the 4 its FLOPs ask for, each reading the output of one or two convolution tiles; given
    tile counts are left alone."""
    conv = dict(kh=3, kw=3, sh=1, sw=1, pt=1, pl=1, pb=1, pr=1, group=1)
    pool = dict(kind=ir.POOL_MAX, kh=2, kw=2, sh=2, sw=2, pt=0, pl=0, pb=0, pr=0, dh=1, dw=1)
    w = np.zeros((128, 128, 3, 3), np.float32)
    layers = [ir.Layer("x", "INPUT", [], (1, 128, 112, 112)),
              ir.Layer("conv", "CONV", [0], (1, 128, 112, 112), conv, weights={"w": w}),
              ir.Layer("pool", "POOL", [1], (1, 128, 56, 56), pool)]
    graph = ir.Graph(layers, {"x": 0}, {"y": 2})
    plan = partition(graph)
    assert len(plan.col_bounds[1]) - 1 == 16 and len(plan.col_bounds[2]) - 1 == 16
    for t in range(plan.layer_first_tile[2], plan.layer_first_tile[3]):
        assert 1 <= len(plan.dependencies(t)) <= 2
    assert len(partition(graph, layer_tiles={2: 4}).col_bounds[2]) - 1 == 4


def test_offloading_tiles_keep_the_wavefront():
    """A server receiving ResNet-50's input row by row can start on the first rows: with the
    tiles clients use, the work that waits for the last input tile is not far above what the
    architecture forces (stages 3 and 4 read nearly the whole image: about 55% of the FLOPs).
    Coarse cheap layers (4 max-pooling tiles) made it 93%."""
    from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS
    import coacto
    from coacto import zoo
    from coacto.partition import input_tiles

    tg = coacto.compile(zoo.build("resnet50"), min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)
    p = tg.plan
    off, par = p.parent_offsets, p.parents
    pool = next(i for i, layer in enumerate(tg.graph.layers) if layer.op == "POOL")
    assert len(p.col_bounds[pool]) - 1 >= 16
    gated = np.zeros(p.n_tiles, bool)
    gated[input_tiles(tg)[-1]] = True
    for t in range(p.n_tiles):
        if gated[par[off[t]:off[t + 1]]].any():
            gated[t] = True
    share = p.tile_flops[gated].sum() / p.tile_flops.sum()
    assert 0.5 < share < 0.65, share


# ------------------------------------------------------------------------------ sequence ops

@st.composite
def matmul_graphs(draw):
    """A MATMUL reading strided operands from INPUT layers laid out as transformers lay them:
    queries / keys / values side by side per token (heads in rows), plain row-major tensors, or
    one fused projection holding both operands; optional mask, causal forms, heads-merged output."""
    b0, b1 = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    m, kd = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    form = draw(st.sampled_from(["plain", "heads", "fused"]))
    n = m if form == "fused" else draw(st.integers(1, 6))
    layers, attrs = [], dict(batch0=b0, batch1=b1, m=m, n=n, k=kd, out_mode=0, causal=0,
                             offset=0, has_mask=0, m_off=0, m_s0=0, m_s1=0, m_si=0, m_sj=0,
                             scale=1.0, fill=0.0)
    if form == "plain":  # A (b0, b1, m, k); B (b0, b1, k, n) contiguous along n
        layers.append(ir.Layer("a", "INPUT", [], (b0 * b1 * m, kd, 1, 1)))
        layers.append(ir.Layer("b", "INPUT", [], (b0 * b1 * kd, n, 1, 1)))
        attrs.update(a_off=0, a_s0=b1 * m * kd, a_s1=m * kd, a_si=kd,
                     b_off=0, b_s0=b1 * kd * n, b_s1=kd * n, b_sk=n, b_sj=1)
        inputs = [0, 1]
    elif form == "heads":  # queries (b0, m, b1, k); values (b0, k, b1, n)
        layers.append(ir.Layer("q", "INPUT", [], (b0, b1 * kd, 1, m)))
        layers.append(ir.Layer("v", "INPUT", [], (b0, b1 * n, 1, kd)))
        attrs.update(a_off=0, a_s0=m * b1 * kd, a_s1=kd, a_si=b1 * kd,
                     b_off=0, b_s0=kd * b1 * n, b_s1=n, b_sk=b1 * n, b_sj=1)
        inputs = [0, 1]
    else:  # one projection (b0, m, [q | k]) per token: scores = q k^T, keys contiguous along k
        layers.append(ir.Layer("qk", "INPUT", [], (b0, 2 * b1 * kd, 1, m)))
        attrs.update(a_off=0, a_s0=m * 2 * b1 * kd, a_s1=kd, a_si=2 * b1 * kd,
                     b_off=b1 * kd, b_s0=m * 2 * b1 * kd, b_s1=kd, b_sk=1, b_sj=2 * b1 * kd)
        inputs = [0, 0]
    attrs["causal"] = draw(st.sampled_from([0, 0, 1, 2]))
    attrs["offset"] = draw(st.integers(-2, 2))
    if attrs["causal"] == 2:
        attrs["k"] = kd  # the sum runs over k <= i + offset
    if draw(st.booleans()):  # a padding mask (b0, n) broadcast over heads and queries
        layers.append(ir.Layer("mask", "INPUT", [], (b0, n, 1, 1)))
        attrs.update(has_mask=1, m_s0=n, m_sj=1)
        inputs.append(len(layers) - 1)
    merged = b1 > 1 and draw(st.booleans())
    attrs["out_mode"] = int(merged)
    shape = (b0, b1 * n, 1, m) if merged else (b0, n, b1, m)
    layers.append(ir.Layer("mm", "MATMUL", inputs, shape, attrs))
    graph = ir.Graph(layers, {lay.name: i for i, lay in enumerate(layers[:-1])},
                     {"y": len(layers) - 1})
    return graph, draw(st.integers(1, 12))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matmul_graphs())
def test_matmul_dependencies_exact(case):
    graph, tiles = case
    check_plan(graph, partition(graph, tiles))


@st.composite
def attention_graphs(draw):
    """An ATTENTION over queries and keys from one projection (per token, heads side by side) or
    row-major tensors (then up to 3 more keys than queries), its values per token, row-major per
    head or contiguous along the keys, read directly or through an AFFINE (which row blocks
    split); a padding mask (one row per sequence, or one key per column) or one value per query;
    causal 1 with an offset >= 0, or none. Long sequences (96 tokens and more, one head) give the
    queries several column blocks."""
    long = draw(st.booleans())
    b0, b1 = (1, 1) if long else (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    m = draw(st.integers(96, 110)) if long else draw(st.integers(1, 6))
    kd, dv = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    projection = draw(st.booleans())
    n = m if projection else m + draw(st.integers(0, 3))  # more keys: a cache of earlier ones
    a = dict(batch0=b0, batch1=b1, m=m, n=n, k=kd, dv=dv, scale=1.0,
             causal=draw(st.sampled_from([0, 1])), offset=draw(st.integers(0, 3)), has_mask=0,
             m_off=0, m_s0=0, m_s1=0, m_si=0, m_sj=0, out_mode=int(draw(st.booleans())))
    if projection:  # one projection (b0, m, [q | k]) per token
        layers = [ir.Layer("qk", "INPUT", [], (b0, 2 * b1 * kd, 1, m))]
        a.update(a_off=0, a_s0=m * 2 * b1 * kd, a_s1=kd, a_si=2 * b1 * kd, b_off=b1 * kd,
                 b_s0=m * 2 * b1 * kd, b_s1=kd, b_sk=1, b_sj=2 * b1 * kd)
        inputs = [0, 0]
    else:  # A (b0, b1, m, k); B (b0, b1, k, n) contiguous along the keys
        layers = [ir.Layer("a", "INPUT", [], (b0 * b1 * m, kd, 1, 1)),
                  ir.Layer("b", "INPUT", [], (b0 * b1 * kd, n, 1, 1))]
        a.update(a_off=0, a_s0=b1 * m * kd, a_s1=m * kd, a_si=kd, b_off=0, b_s0=b1 * kd * n,
                 b_s1=kd * n, b_sk=n, b_sj=1)
        inputs = [0, 1]
    form = draw(st.sampled_from(["heads", "plain", "keys"]))
    if form == "heads":  # (b0, n, b1, dv)
        layers.append(ir.Layer("v", "INPUT", [], (b0, b1 * dv, 1, n)))
        a.update(v_off=0, v_s0=n * b1 * dv, v_s1=dv, v_sk=b1 * dv, v_sj=1)
    elif form == "plain":  # (b0, b1, n, dv)
        layers.append(ir.Layer("v", "INPUT", [], (b0 * b1 * n, dv, 1, 1)))
        a.update(v_off=0, v_s0=b1 * n * dv, v_s1=n * dv, v_sk=dv, v_sj=1)
    else:  # (b0, b1, dv, n): contiguous along the keys
        layers.append(ir.Layer("v", "INPUT", [], (b0 * b1 * dv, n, 1, 1)))
        a.update(v_off=0, v_s0=b1 * dv * n, v_s1=dv * n, v_sk=1, v_sj=n)
    if draw(st.booleans()):
        shape = layers[-1].shape
        layers.append(ir.Layer("vx", "AFFINE", [len(layers) - 1], shape, {"act": 0},
                               {"scale": np.ones(shape[1], np.float32),
                                "shift": np.zeros(shape[1], np.float32)}))
    inputs.append(len(layers) - 1)
    mask = draw(st.sampled_from(["none", "padding", "padding by key", "row"]))
    if mask.startswith("padding"):  # (b0, n) broadcast over heads and queries
        layers.append(ir.Layer("mask", "INPUT", [], (b0, 1, 1, n) if mask == "padding by key"
                               else (b0, n, 1, 1)))
        a.update(has_mask=1, m_s0=n, m_sj=1)
        inputs.append(len(layers) - 1)
    elif mask == "row":  # one value per query (m_sj 0)
        layers.append(ir.Layer("mask", "INPUT", [], (b0 * b1 * m, 1, 1, 1)))
        a.update(has_mask=1, m_s0=b1 * m, m_s1=m, m_si=1, m_sj=0)
        inputs.append(len(layers) - 1)
    shape = (b0, b1 * dv, 1, m) if a["out_mode"] else (b0, dv, b1, m)
    layers.append(ir.Layer("att", "ATTENTION", inputs, shape, a))
    graph = ir.Graph(layers, {lay.name: i for i, lay in enumerate(layers[:-1])},
                     {"y": len(layers) - 1})
    return graph, draw(st.integers(1, 12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attention_graphs())
def test_attention_dependencies_exact(case):
    graph, tiles = case
    check_plan(graph, partition(graph, tiles))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(1, 5), st.integers(1, 5), st.integers(1, 9),
       st.sampled_from(["LAYERNORM", "SOFTMAX", "ROW_REDUCE", "EMBED", "WHERE"]))
def test_sequence_ops_dependencies_exact(n, s, c, tiles, op):
    """Per-column ops read whole columns; EMBED reads one id per output column (the ids laid
    out as (n, s)); WHERE broadcasts like BINARY."""
    layers = [ir.Layer("x", "INPUT", [], (n, c, 1, s))]
    if op == "EMBED":
        layers = [ir.Layer("ids", "INPUT", [], (n, s, 1, 1)),
                  ir.Layer("e", "EMBED", [0], (n, c, 1, s))]
    elif op == "WHERE":
        layers += [ir.Layer("cond", "INPUT", [], (n, 1, 1, s)),
                   ir.Layer("w", "WHERE", [1, 0], (n, c, 1, s), {"operands": 3})]
    else:
        rows = 1 if op == "ROW_REDUCE" else c
        layers.append(ir.Layer("y", op, [0], (n, rows, 1, s)))
    graph = ir.Graph(layers, {lay.name: i for i, lay in enumerate(layers) if lay.op == "INPUT"},
                     {"y": len(layers) - 1})
    check_plan(graph, partition(graph, tiles))
