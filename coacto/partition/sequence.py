"""Exact tile dependencies of MATMUL and EMBED layers (coacto.partition.rules handles the others).

Both read their inputs by position in the producer's storage rather than column for column, so their
reads are described as *segments*: runs of consecutive storage elements ``[start, start + length)``
of a producer (a row of A, a key or a value row of B, a mask row, one id). A segment maps to the
tiles holding its elements with interval arithmetic on columns (``start // C``) and rows
(``start % C``); a segment that crosses columns is cut into its first column, the full columns in
between and its last column.

MATMUL reads exactly what its tile executor (native/src/ops_seq.c) reads:

- the tile is cut into blocks of one batch (b0, b1), a run of rows i and a range of columns j;
- A: row i of the block over all of k; with causal 1 only rows that keep some column
  (``i >= j0 - offset``); with causal 2 only ``k <= i + offset``;
- B: every k of the block's columns j; with causal 1 only columns ``j <= i_max + offset`` (the
  queries of a tile need the keys up to their last one: masking removes work, not just values);
  with causal 2 only ``k <= i_max + offset`` (a context tile needs the values of earlier tokens);
- the mask: the block's rows and columns (every output gets its mask value).
"""
from __future__ import annotations

import numpy as np

from .. import ir


def block_of(bounds: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The block holding each index, of blocks with these boundaries."""
    return np.searchsorted(bounds, idx, side="right") - 1


def segment_parents(plan_cols, plan_rows, first_tile, graph: ir.Graph, producer: int,
                    out_tile: np.ndarray, start: np.ndarray, length: np.ndarray):
    """(output tile, producer tile) pairs for segments of the producer's storage."""
    keep = length > 0
    out_tile, start, length = out_tile[keep], start[keep], length[keep]
    if out_tile.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    C = graph.layers[producer].rows
    end = start + length - 1
    c0, c1, r0, r1 = start // C, end // C, start % C, end % C
    single = c0 == c1
    multi = ~single
    mid = multi & (c1 - c0 >= 2)
    full = np.full(out_tile.shape, C - 1, np.int64)
    zero = np.zeros(out_tile.shape, np.int64)
    pieces = [
        (single, c0, c0, r0, r1),
        (multi, c0, c0, r0, full),  # first column of a segment that crosses columns
        (mid, c0 + 1, c1 - 1, zero, full),  # columns in between
        (multi, c1, c1, zero, r1),  # last column
    ]
    t = np.concatenate([out_tile[piece[0]] for piece in pieces])
    # column from, column to, row from, row to (inclusive)
    rect = [np.concatenate([piece[1 + i][piece[0]] for piece in pieces]) for i in range(4)]
    cb, rb = plan_cols[producer], plan_rows[producer]
    cba, cbb = block_of(cb, rect[0]), block_of(cb, rect[1])
    rba, rbb = block_of(rb, rect[2]), block_of(rb, rect[3])
    key = np.unique(np.stack([t, cba, cbb, rba, rbb], axis=1), axis=0)
    t, cba, cbb, rba, rbb = key.T
    widths = rbb - rba + 1
    counts = (cbb - cba + 1) * widths
    which, k = _ranges(np.zeros_like(counts), counts)
    col_block = cba[which] + k // widths[which]
    row_block = rba[which] + k % widths[which]
    parent = first_tile[producer] + col_block * (len(rb) - 1) + row_block
    return t[which], parent


def _ranges(lo: np.ndarray, hi: np.ndarray):
    """(which, value) for every value of the ranges [lo[w], hi[w])."""
    n = np.maximum(hi - lo, 0)
    which = np.repeat(np.arange(len(n)), n)
    value = lo[which] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return which, value


def _blocks(layer: ir.Layer, tiles):
    """Blocks (tile, b0, b1, i0, i1, j0, j1) of a MATMUL or ATTENTION layer's tiles (as the
    executor cuts; j are ATTENTION's features d)."""
    a = layer.attrs
    b1n, m = a["batch1"], a["m"]
    n = a["dv"] if layer.op == "ATTENTION" else a["n"]
    out = []
    for t, (c0, c1, r0, r1) in tiles:
        col = c0
        while col < c1:
            i0 = col % m
            i1 = min(m, i0 + (c1 - col))
            if a["out_mode"] == 0:
                bb = col // m
                out.append((t, bb // b1n, bb % b1n, i0, i1, r0, r1))
            else:
                for b1 in range(r0 // n, (r1 - 1) // n + 1):
                    out.append((t, col // m, b1, i0, i1, max(r0 - b1 * n, 0),
                                min(r1 - b1 * n, n)))
            col += i1 - i0
    return np.asarray(out, dtype=np.int64).reshape(-1, 7)


def matmul_parent_pairs(graph: ir.Graph, li: int, plan_cols, plan_rows, first_tile, bounds):
    layer = graph.layers[li]
    a = layer.attrs
    k, off, causal = a["k"], a.get("offset", 0), a.get("causal", 0)
    tiles = [(t, bounds[t]) for t in range(first_tile[li], first_tile[li + 1])]
    blk = _blocks(layer, tiles)
    t, b0, b1, i0, i1, j0, j1 = blk.T
    pairs = []

    def read(n, w, start, length):  # segments of input n read by the blocks w
        pairs.append(segment_parents(plan_cols, plan_rows, first_tile, graph, layer.inputs[n],
                                     t[w], start, length))

    # A: rows of the block
    lo = np.maximum(i0, j0 - off) if causal == 1 else i0
    w, i = _ranges(lo, i1)
    length = np.full(i.shape, k, np.int64)
    if causal == 2:
        length = np.clip(i + off + 1, 0, k)
    start = a["a_off"] + b0[w] * a["a_s0"] + b1[w] * a["a_s1"] + i * a["a_si"]
    read(0, w, start, length)

    # B: the block's columns over k
    jc, kd = j1, np.full(t.shape, k, np.int64)
    if causal == 1:
        jc = np.minimum(j1, i1 - 1 + off + 1)
    elif causal == 2:
        kd = np.clip(i1 - 1 + off + 1, 0, k)
    base = a["b_off"] + b0 * a["b_s0"] + b1 * a["b_s1"]
    if a["b_sj"] == 1:  # one segment per k, along j
        w, kk = _ranges(np.zeros_like(kd), kd)
        start = base[w] + kk * a["b_sk"] + j0[w]
        length = np.maximum(jc - j0, 0)[w]
    else:  # one segment per j, along k
        w, j = _ranges(j0, jc)
        start = base[w] + j * a["b_sj"]
        length = kd[w]
    read(1, w, start, length)

    # the mask: every row and column of the block
    if a.get("has_mask"):
        w, i = _ranges(i0, i1)
        start = (a["m_off"] + b0[w] * a["m_s0"] + b1[w] * a["m_s1"] + i * a["m_si"]
                 + j0[w] * a["m_sj"])
        length = (j1 - j0)[w] if a["m_sj"] == 1 else np.ones(i.shape, np.int64)
        read(2, w, start, length)
    return tuple(np.concatenate(c) for c in zip(*pairs))


def attention_parent_pairs(graph: ir.Graph, li: int, plan_cols, plan_rows, first_tile, bounds):
    """A block of queries [i0, i1) and features [d0, d1) reads its queries over all of k, the keys
    (over k) and the values (features [d0, d1)) up to the last one its last query keeps, and
    its queries' mask rows up to there."""
    layer = graph.layers[li]
    a = layer.attrs
    k, n, off = a["k"], a["n"], a.get("offset", 0)
    tiles = [(t, bounds[t]) for t in range(first_tile[li], first_tile[li + 1])]
    t, b0, b1, i0, i1, d0, d1 = _blocks(layer, tiles).T
    jn = np.minimum(n, i1 - 1 + off + 1) if a.get("causal") else np.full(t.shape, n, np.int64)
    pairs = []

    def read(idx, w, start, length):
        pairs.append(segment_parents(plan_cols, plan_rows, first_tile, graph, layer.inputs[idx],
                                     t[w], start, length))

    w, i = _ranges(i0, i1)  # the queries
    read(0, w, a["a_off"] + b0[w] * a["a_s0"] + b1[w] * a["a_s1"] + i * a["a_si"],
         np.full(i.shape, k, np.int64))
    # the keys B[kk, j] (kk < k) and the values V[j, d] (d0 <= d < d1) of the keys j < jn
    kb = a["b_off"] + b0 * a["b_s0"] + b1 * a["b_s1"]
    if a["b_sj"] == 1:  # one segment per kk, along the keys
        w, kk = _ranges(np.zeros_like(t), np.full(t.shape, k, np.int64))
        read(1, w, kb[w] + kk * a["b_sk"], jn[w])
    else:  # one segment per key, along kk
        w, j = _ranges(np.zeros_like(jn), jn)
        read(1, w, kb[w] + j * a["b_sj"], np.full(j.shape, k, np.int64))
    vb = a["v_off"] + b0 * a["v_s0"] + b1 * a["v_s1"]
    if a["v_sj"] == 1:  # one segment per key, along the features
        w, j = _ranges(np.zeros_like(jn), jn)
        read(2, w, vb[w] + j * a["v_sk"] + d0[w], (d1 - d0)[w])
    else:  # one segment per feature, along the keys
        w, d = _ranges(d0, d1)
        read(2, w, vb[w] + d * a["v_sj"], jn[w])
    if a.get("has_mask"):
        w, i = _ranges(i0, i1)
        start = a["m_off"] + b0[w] * a["m_s0"] + b1[w] * a["m_s1"] + i * a["m_si"]
        read(3, w, start, jn[w] if a["m_sj"] == 1 else np.ones(i.shape, np.int64))
    return tuple(np.concatenate(c) for c in zip(*pairs))


def embed_parent_pairs(graph: ir.Graph, li: int, plan_cols, plan_rows, first_tile):
    """Output column c reads element c of the ids (every row block of it)."""
    layer = graph.layers[li]
    nrb = len(plan_rows[li]) - 1
    cols = np.arange(layer.columns, dtype=np.int64)
    cb = block_of(plan_cols[li], cols)
    out_tile = (first_tile[li] + cb[:, None] * nrb + np.arange(nrb)[None, :]).reshape(-1)
    start = np.repeat(cols, nrb)
    return segment_parents(plan_cols, plan_rows, first_tile, graph, layer.inputs[0], out_tile,
                           start, np.ones_like(start))
