"""Tile partitioner: cut every layer's output into tiles and derive exact tile dependencies
(docs/ARCHITECTURE.md §3: a layer's output is a matrix of columns, positions, by rows, channels).

A layer's tiles form a grid: column blocks (the default split) times row blocks (used when a
layer has too few columns to feed the threads, e.g. late CNN stages and fully connected layers).
Per operator family the columns read are computed with vectorised index arithmetic: the
receptive field of every output column (convolution / pooling taps with stride, padding and
dilation), broadcasting maps, whole-batch reads for global pooling and fully connected layers,
and the element index map of GATHER layers. Rows are intervals (a channel group of a grouped
convolution, the LRN window, a CONCAT input's channel range). MATMUL and EMBED layers read their
inputs by storage position (coacto.partition.sequence). The plan these rules make, its numbering
and the queries asked of it are in coacto.partition.plan.
"""
from __future__ import annotations

import math
import numpy as np

from .. import ir
from ..errors import CoactoError, ModelError, ShapeError
from .plan import TilePlan, number_tiles
from .sequence import attention_parent_pairs, block_of, embed_parent_pairs, matmul_parent_pairs

#: Bumped whenever partitioning changes the tiles it derives for the same parameters (the rules
#: and constants of this module and coacto.partition.sequence, or the layers the importer makes
#: of a model): stored graphs and tuned tile counts made by another version are rebuilt, not
#: trusted, and a device and a server of two versions do not exchange tiles.
PARTITIONER_VERSION = 10

# The measurements behind these values are in docs/PERFORMANCE.md, "History of the partitioner's
# constants".

#: Default work per tile when tiles_per_layer is not given (FLOPs): every column tile streams the
#: layer's weights again and every row tile re-reads (or re-im2cols) its input, so tiles cost
#: more than their scheduling and a cheap layer gains nothing from many.
DEFAULT_TILE_FLOPS = 100e6
#: Most tiles a layer gets from the default heuristic.
DEFAULT_MAX_TILES = 16
#: Fewest tiles a layer gets from the default heuristic when it has the columns or rows for
#: them: even a cheap layer is then shared by two threads instead of serialising the network,
#: and a chain of cheap layers at one resolution gets the same column blocks, so a thread runs
#: a block depth-first through the chain while it is in cache. A graph partitioned for one
#: computing thread (``threads=1``) runs a cheap layer whole instead: split four ways, one
#: thread ran it slower, not faster (its tiles run as a wavefront through many layers whose
#: blocks together outgrow L2; docs/PERFORMANCE.md). For more threads the fewest is the larger
#: of this and the thread count, at most DEFAULT_MAX_TILES (two tiles for two threads were no
#: faster in app conditions).
DEFAULT_MIN_TILES = 4
#: Fewest column blocks of an image layer (CNN layout) in a graph meant for offloading
#: (``min_column_blocks``, which clients use), where the columns allow (MIN_TILE_COLUMNS each),
#: however cheap the layer is: a server receives the input row by row, and a coarse cheap layer
#: makes every later tile wait for a large part of the image. Local graphs do without: more
#: column blocks re-read the weights more often.
OFFLOAD_MIN_COLUMN_BLOCKS = 32
#: Fewest columns a column block gets from the default heuristic (GEMM efficiency).
MIN_TILE_COLUMNS = 48
#: Fewest columns per column block, by the default heuristic, of a layer whose weights are small
#: (SMALL_WEIGHT_BYTES or less, or none) and of a sequence's whole-row ops (WHOLE_ROWS in the
#: "last" layout): small maps and short sequences then get two column blocks that two threads
#: run side by side (a column block of a 1x1 convolution depends only on the same columns of the
#: layer before; a row block waits for every row block of it), and re-reading small weights
#: costs little.
MIN_TILE_COLUMNS_SMALL_WEIGHTS = 24
SMALL_WEIGHT_BYTES = 2 << 20
#: Fewest columns per column block of a convolution that reads its input in place (see
#: _reads_in_place) and has more than LARGE_WEIGHT_BYTES of weights, by the default heuristic:
#: every column block streams the weights from memory again, while a row block only copies the
#: padded input rows it reads (no im2col to redo), so such layers split rows instead.
MIN_TILE_COLUMNS_LARGE_WEIGHTS = 196
LARGE_WEIGHT_BYTES = 4 << 20
#: Shortest output row the native convolution reads in place (the AVX-512 micro-kernel's row block;
#: see conv_execute_gemm in native/src/ops_conv.c).
IN_PLACE_MIN_WIDTH = 14
#: Column tiles of an input layer by default: set_input copies the input tile by tile and
#: completes each as it lands, so the first layer starts on the first tiles during the copy; when
#: offloading, finer input tiles let the server start on the first rows of the image while the
#: rest is still on the way.
DEFAULT_INPUT_TILES = 16
#: Fewest output channels per row block of a convolution that needs im2col (a kernel larger than
#: 1x1 or a stride, not depthwise), from the default heuristic: every row block redoes the
#: im2col of its columns, which costs about as much as the GEMM of 20 channels, so narrow row
#: blocks would waste most of their time. (A 1x1 convolution re-reads its input from cache, a
#: depthwise one reads only its own channels: their row blocks cost nothing extra. Convolutions
#: read in place redo only a copy of their padded input rows, yet narrower blocks do not pay
#: there either.)
DEFAULT_MIN_CONV_ROWS = 128
#: Token blocks of a transformer's linear layer (see _streams_weights) with the default tile
#: count or a given one of at least two (coacto tune's), when each block keeps at least
#: MIN_TOKENS_PER_BLOCK tokens and the weights are at most TOKEN_SPLIT_MAX_WEIGHT_BYTES (each
#: token block streams them again): a 2-thread run then stops reading what the other core wrote,
#: and the layers after one start on half of the tokens while the other half is computed; with
#: fewer tokens per block each weight panel is read by too few rows.
TOKEN_BLOCKS = 2
MIN_TOKENS_PER_BLOCK = 64
TOKEN_SPLIT_MAX_WEIGHT_BYTES = 32 << 20
#: Row-split boundaries of CONV layers are multiples of this (a multiple of every GEMM kernel's
#: panel width, so row tiles start on a packed panel).
CONV_ROW_ALIGN = 32
OTHER_ROW_ALIGN = 8
#: Ops never split by rows: each tile would compute over all the rows of its columns anyway.
WHOLE_ROWS = ("SOFTMAX", "INPUT", "LAYERNORM", "ROW_REDUCE")


# ------------------------------------------------------------------------------------ costs

def layer_flops(graph: ir.Graph, li: int) -> float:
    """Multiply-adds count twice; everything else once per output element (per tap for pools)."""
    layer = graph.layers[li]
    n, c, h, w = layer.shape
    out = float(n * c * h * w)
    a = layer.attrs
    if layer.op == "CONV":
        cin = graph.layers[layer.inputs[0]].shape[1]
        if a.get("pre"):  # a depthwise layer, after a 1x1 convolution of its input to c channels
            hin, win = graph.layers[layer.inputs[0]].shape[2:4]
            return 2.0 * out * a["kh"] * a["kw"] + 2.0 * n * c * hin * win * cin
        return 2.0 * out * a["kh"] * a["kw"] * (cin // a["group"])
    if layer.op == "POOL":
        return out * a["kh"] * a["kw"]
    if layer.op == "GLOBAL_POOL":
        src = graph.layers[layer.inputs[0]].shape
        return float(src[0] * src[1] * src[2] * src[3])
    if layer.op in ("LRN", "SOFTMAX"):
        return out * 4.0
    if layer.op == "MATMUL":
        return 2.0 * out * a["k"]
    if layer.op == "ATTENTION":  # the scores, their softmax and the context, per context value
        return out * (2.0 * a["n"] + (2.0 * a["k"] + 4.0) * a["n"] / a["dv"])
    if layer.op in ("LAYERNORM", "ROW_REDUCE"):
        src = graph.layers[layer.inputs[0]]
        return float(src.columns * src.rows) * (4.0 if layer.op == "LAYERNORM" else 1.0)
    if layer.op == "INPUT":
        return 0.0
    return out


# ------------------------------------------------------------------------------------ splits

def _even_bounds(total: int, parts: int, align: int = 1) -> np.ndarray:
    """Bounds of at most ``parts`` blocks of ``total``, as even as multiples of ``align`` allow."""
    units = math.ceil(total / align)
    parts = max(1, min(parts, total // align))
    b = [min(total, (i * units // parts) * align) for i in range(parts + 1)]
    b[-1] = total
    return np.unique(np.asarray(b, dtype=np.int64))


def _balanced_parts(units: int, target: int, blocks: int = 1) -> int:
    """The tile count near `target` (a quarter, at least 1 fewer or 2 more) whose tiles (of
    `units` panels, cut as evenly as the panels allow, once for each of `blocks` token blocks)
    leave 2 and 4 threads the least idle time; the closer count on ties.

    A transformer's linear layer split by output features only (one token block) makes the next
    layer wait for all its tiles: an odd or uneven set leaves threads idle while the last tiles
    run."""
    if target <= 1:
        return target

    def idle(parts: int) -> float:
        sizes = np.tile(np.diff(_even_bounds(units, parts)), blocks)
        waste = 0
        for threads in (2, 4):
            free = [0] * threads
            for size in sizes:  # the runtime hands each tile to the first thread that is free
                free[free.index(min(free))] += int(size)
            waste += threads * max(free) - units * blocks
        return waste / (units * blocks)

    lo, hi = max(2, target - max(1, target // 4)), min(units, target + max(2, target // 4))
    candidates = range(lo, hi + 1) or [target]
    return min(candidates, key=lambda p: (round(idle(p), 2), abs(p - target)))  # 1% steps


def _streams_weights(layer: ir.Layer) -> bool:
    """A 1x1 CONV over the rows of a sequence (a transformer's linear layer)."""
    a = layer.attrs
    return layer.op == "CONV" and layer.layout == ir.LAYOUT_LAST and \
        (a.get("kh"), a.get("kw"), a.get("group")) == (1, 1, 1)


def _needs_im2col(layer: ir.Layer) -> bool:
    a = layer.attrs
    return (layer.op == "CONV" and a.get("group", 1) == 1
            and (a["kh"] * a["kw"] > 1 or a["sh"] * a["sw"] > 1))


def _reads_in_place(graph: ir.Graph, layer: ir.Layer) -> bool:
    """A convolution the native runtime computes from padded input rows rather than im2col (the
    conditions of conv_execute_gemm for a tile of all the layer's channels, less the row cache's
    limits, which only very wide or very tall windows reach)."""
    a = layer.attrs
    if not _needs_im2col(layer) or layer.layout == ir.LAYOUT_LAST or len(layer.shape) != 4:
        return False
    cin = graph.layers[layer.inputs[0]].rows
    return (a.get("dw", 1) == 1 and layer.shape[3] >= IN_PLACE_MIN_WIDTH
            and 4 * a["kw"] * cin >= layer.rows)


def _winograd_row_pairs(graph: ir.Graph, layer: ir.Layer) -> np.ndarray | None:
    """The column bounds a block may end on, of a convolution the native runtime computes as
    Winograd F(2x2, 3x3) (winograd_fits in native/src/ops_conv.c: 3x3, stride 1, one pixel of
    padding, one group, at least 16 input channels, at most 512 x 512 weights per tap; less its
    machine-dependent least map size): the starts of its pairs of output rows, image by image,
    and the end; None for other layers. Its tiles compute whole 2x2 output blocks and keep the
    columns they own: a column block that starts or ends inside a pair of rows computes that
    pair's blocks again. ResNet-50's 3x3 convolutions in a graph for offloading (32 column blocks
    of 98 columns at 56x56, of 49 at 28x28: 1.75 rows each) took 1.6x as long as in one block.
    Only graphs for offloading use it (choose_splits): a local graph's blocks are tens of rows,
    and aligning them measured no better (VGG-16 at 1 thread 0.98-1.01x; its 56x56x256
    convolutions slower in blocks of one or two row pairs than of 3.5 rows, for reasons not
    found)."""
    a = layer.attrs
    if layer.op != "CONV" or layer.layout == ir.LAYOUT_LAST or len(layer.shape) != 4:
        return None
    geometry = (a.get("kh"), a.get("kw"), a.get("sh"), a.get("sw"), a.get("dh", 1),
                a.get("dw", 1), a.get("group", 1), a.get("pt"), a.get("pl"), a.get("pb"),
                a.get("pr"))
    cin = graph.layers[layer.inputs[0]].rows
    if geometry != (3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1) or cin < 16 or cin * layer.rows > 512 * 512:
        return None
    n, _, h, w = (int(d) for d in layer.shape)
    starts = np.arange(0, h, 2, dtype=np.int64) * w
    return np.concatenate([(i * h * w + starts) for i in range(n)] + [[n * h * w]])


def choose_splits(graph: ir.Graph, li: int, tiles_per_layer: int | None,
                  min_column_blocks: int = 0,
                  min_tiles: int = DEFAULT_MIN_TILES) -> tuple[np.ndarray, np.ndarray]:
    """Column and row block boundaries of one layer.

    The layer gets about T tiles: T = tiles_per_layer when given; otherwise FLOPs /
    DEFAULT_TILE_FLOPS, clamped to [min_tiles, DEFAULT_MAX_TILES], and for image layers at
    least ``min_column_blocks`` column blocks where the columns allow (see
    OFFLOAD_MIN_COLUMN_BLOCKS). Columns are split first, into blocks of at least MIN_TILE_COLUMNS
    columns (a GEMM over fewer rows wastes most of the micro-kernel, and every column block
    re-reads the layer's weights; MIN_TILE_COLUMNS_SMALL_WEIGHTS for layers whose weights are
    small and for a sequence's whole-row ops, MIN_TILE_COLUMNS_LARGE_WEIGHTS for convolutions
    read in place whose weights are large, see there); when that gives fewer than T blocks — a
    layer with too few columns — rows are split to make up the rest, at
    multiples of CONV_ROW_ALIGN for convolutions (and, by default, in blocks of at least
    DEFAULT_MIN_CONV_ROWS channels for convolutions that need im2col). Layers that read all rows
    of a column to write any (SOFTMAX, LAYERNORM, ROW_REDUCE) and INPUT layers are never split
    by rows; an INPUT layer gets DEFAULT_INPUT_TILES column tiles unless tiles_per_layer says
    otherwise. In a graph for offloading, a convolution that runs as Winograd gets column blocks
    of whole pairs of output rows (_winograd_row_pairs), so fewer of them where a block would
    be shorter.

    Matrix products with weights over the rows of a sequence (1x1 CONV in the "last" layout: the
    linear layers of a transformer) have few columns (tokens) and large weights: every column
    block streams the whole weight matrix again, every row block re-reads the (smaller, cached)
    input. Their columns are split into about sqrt(T * input bytes / (4 * weight bytes)) blocks
    (at least one): for BERT-base at 128 tokens that is one block, so each tile multiplies all
    tokens by a slice of the weights, read once. Where tokens allow, they get TOKEN_BLOCKS blocks
    all the same (see there).
    """
    layer = graph.layers[li]
    cols, rows = layer.columns, layer.rows
    if tiles_per_layer is None:
        want = int(round(layer_flops(graph, li) / DEFAULT_TILE_FLOPS))
        want = max(min_tiles, min(DEFAULT_MAX_TILES, want))
    else:
        want = max(1, int(tiles_per_layer))
    min_cols = MIN_TILE_COLUMNS
    weight_bytes = sum(int(w.nbytes) for w in layer.weights.values())
    if tiles_per_layer is None:
        last = layer.layout == ir.LAYOUT_LAST
        if (not last and weight_bytes <= SMALL_WEIGHT_BYTES) or (last and layer.op in WHOLE_ROWS):
            min_cols = MIN_TILE_COLUMNS_SMALL_WEIGHTS
        if weight_bytes > LARGE_WEIGHT_BYTES and _reads_in_place(graph, layer):
            min_cols = MIN_TILE_COLUMNS_LARGE_WEIGHTS
    col_parts = min(want, max(1, cols // min_cols))
    if tiles_per_layer is None and layer.layout != ir.LAYOUT_LAST:
        col_parts = max(col_parts, min(int(min_column_blocks), cols // MIN_TILE_COLUMNS))
    if _streams_weights(layer):
        in_bytes = float(cols * graph.layers[layer.inputs[0]].rows)
        w_bytes = float(layer.weights["w"].size) if "w" in layer.weights else in_bytes
        col_parts = max(1, min(col_parts, int(math.sqrt(want * in_bytes / (4.0 * w_bytes)))))
        if 4.0 * w_bytes <= TOKEN_SPLIT_MAX_WEIGHT_BYTES:  # given tile counts too (tuning)
            col_parts = max(col_parts, min(TOKEN_BLOCKS, cols // MIN_TOKENS_PER_BLOCK, want))
    if layer.op == "INPUT":
        col_parts = min(cols, max(1, want if tiles_per_layer is not None else DEFAULT_INPUT_TILES))
    if layer.op == "ATTENTION" and layer.attrs["out_mode"] == 1:
        # Heads first: a tile packs the keys and values of every head it has, so a block of
        # queries across all heads packed them all again (ViT at 2 threads, four query blocks:
        # 1% slower than the three layers it replaces).
        dv, heads = int(layer.attrs["dv"]), int(layer.attrs["batch1"])
        row_parts = min(want, heads)
        col_parts = max(1, min(math.ceil(want / row_parts), cols // min_cols))
        return _even_bounds(cols, col_parts), _even_bounds(rows, row_parts, dv)
    col_bounds = _even_bounds(cols, col_parts)
    asked = len(col_bounds) - 1
    pairs = _winograd_row_pairs(graph, layer) if min_column_blocks else None
    if pairs is not None:  # whole row pairs, as many as the floor for GEMM efficiency allows
        units = len(pairs) - 1
        pair_cols = 2 * int(layer.shape[3])
        floor_units = math.ceil(min(min_cols, MIN_TILE_COLUMNS, cols) / pair_cols)
        parts = max(1, min(col_parts, units // floor_units))
        col_bounds = np.unique(pairs[[i * units // parts for i in range(parts + 1)]])
    col_parts = len(col_bounds) - 1
    row_parts = 1
    if layer.op not in WHOLE_ROWS and asked < want:
        # (from the blocks asked for: the fewer row pairs do not make more row blocks)
        row_parts = math.ceil(want / asked)
        if tiles_per_layer is None and _needs_im2col(layer):
            row_parts = min(row_parts, max(1, rows // DEFAULT_MIN_CONV_ROWS))
    align = CONV_ROW_ALIGN if layer.op == "CONV" else OTHER_ROW_ALIGN
    if layer.op == "ATTENTION":  # whole heads: a tile computes the scores of each head it has
        align = int(layer.attrs["dv"])  # (out_mode 0, rows = one head's dv: never split)
    if rows < 2 * align:
        row_parts = 1
    if tiles_per_layer is None and row_parts > 1 and _streams_weights(layer):
        row_parts = _balanced_parts(math.ceil(rows / align), row_parts, col_parts)
    return col_bounds, _even_bounds(rows, row_parts, align)


# ------------------------------------------------------------------------------------ reads

def _positions(shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, _, h, w = shape
    cols = np.arange(n * h * w, dtype=np.int64)
    return cols // (h * w), (cols // w) % h, cols % w


def _window_pairs(layer: ir.Layer, src: ir.Layer) -> tuple[np.ndarray, np.ndarray]:
    """(output column, input column) for every tap of a convolution / pooling window."""
    a = layer.attrs
    nn, yy, xx = _positions(layer.shape)
    _, _, hin, win = src.shape
    ky = np.arange(a["kh"], dtype=np.int64)
    kx = np.arange(a["kw"], dtype=np.int64)
    iy = yy[:, None] * a["sh"] - a["pt"] + ky[None, :] * a.get("dh", 1)  # [P, kh]
    ix = xx[:, None] * a["sw"] - a["pl"] + kx[None, :] * a.get("dw", 1)  # [P, kw]
    vy = (iy >= 0) & (iy < hin)
    vx = (ix >= 0) & (ix < win)
    base = nn[:, None, None] * (hin * win) + iy[:, :, None] * win + ix[:, None, :]
    valid = vy[:, :, None] & vx[:, None, :]
    out_col = np.broadcast_to(np.arange(layer.columns, dtype=np.int64)[:, None, None], base.shape)
    return out_col[valid], base[valid]


def _broadcast_pairs(layer: ir.Layer, src: ir.Layer) -> tuple[np.ndarray, np.ndarray]:
    sn, _, sh, sw = src.shape
    if (sn, sh, sw) == (layer.shape[0], layer.shape[2], layer.shape[3]):
        cols = np.arange(layer.columns, dtype=np.int64)
        return cols, cols
    nn, yy, xx = _positions(layer.shape)
    in_col = ((nn if sn > 1 else 0) * sh + (yy if sh > 1 else 0)) * sw + (xx if sw > 1 else 0)
    in_col = np.broadcast_to(np.asarray(in_col, dtype=np.int64), (layer.columns,))
    return np.arange(layer.columns, dtype=np.int64), in_col


def _batch_pairs(layer: ir.Layer, src: ir.Layer) -> tuple[np.ndarray, np.ndarray]:
    """Output column n reads every input column of batch n."""
    n = layer.shape[0]
    per = src.columns // src.shape[0]
    out_col = np.repeat(np.arange(n, dtype=np.int64), per)
    return out_col, np.arange(src.columns, dtype=np.int64)


def column_reads(graph: ir.Graph, li: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (output column, input column) that layer li's computation reads from its input k."""
    layer = graph.layers[li]
    src = graph.layers[layer.inputs[k]]
    op = layer.op
    if (op == "CONV" and k == 0) or op == "POOL":
        return _window_pairs(layer, src)
    if op == "GLOBAL_POOL":
        return _batch_pairs(layer, src)
    if op in ("CONV", "BINARY", "AFFINE", "LRN", "SOFTMAX", "CONCAT", "NOP", "LAYERNORM",
              "ROW_REDUCE", "WHERE"):
        return _broadcast_pairs(layer, src)
    raise CoactoError(f"no column rule for op {op}")


def row_reads(graph: ir.Graph, li: int, k: int, r0: int, r1: int) -> tuple[int, int]:
    """Input rows [a, b) of input k that output rows [r0, r1) of layer li read (a == b: none)."""
    layer = graph.layers[li]
    src = graph.layers[layer.inputs[k]]
    cin = src.rows
    op = layer.op
    if op == "CONV" and k == 0 and layer.attrs.get("pre"):
        return 0, cin  # the prologue reads every channel
    if op == "CONV" and k == 0:
        g = layer.attrs["group"]
        cout_g, cin_g = layer.rows // g, cin // g
        return (r0 // cout_g) * cin_g, ((r1 - 1) // cout_g + 1) * cin_g
    if op == "CONCAT":
        off = sum(graph.layers[p].rows for p in layer.inputs[:k])
        a, b = max(r0 - off, 0), min(r1 - off, cin)
        return (a, b) if a < b else (0, 0)
    if op == "LRN":
        size = layer.attrs["size"]
        return max(0, r0 - (size - 1) // 2), min(cin, r1 + (size - 1) - (size - 1) // 2)
    if op in ("SOFTMAX", "LAYERNORM", "ROW_REDUCE"):
        return 0, cin
    if cin == 1 and layer.rows > 1:  # channel broadcast
        return 0, 1
    return r0, r1


# ------------------------------------------------------------------------------------ plan

def _gather_parent_pairs(graph, li, plan_cols, plan_rows, first_tile):
    """(output tile, parent tile) pairs of a GATHER layer from its element index map."""
    def tiles(lj, elem):  # the tiles of layer lj holding these elements of its storage
        c, row_blocks = graph.layers[lj].rows, len(plan_rows[lj]) - 1
        return (first_tile[lj] + block_of(plan_cols[lj], elem // c) * row_blocks
                + block_of(plan_rows[lj], elem % c))

    layer = graph.layers[li]
    index = np.asarray(layer.weights["index"], dtype=np.int64)
    out_elem = np.nonzero(index >= 0)[0]
    src_elem = index[out_elem]
    out_tile = tiles(li, out_elem)
    pairs_out, pairs_in = [], []
    offset = 0
    for p in layer.inputs:
        src = graph.layers[p]
        size = src.columns * src.rows
        sel = (src_elem >= offset) & (src_elem < offset + size)
        pairs_out.append(out_tile[sel])
        pairs_in.append(tiles(p, src_elem[sel] - offset))
        offset += size
    return np.concatenate(pairs_out), np.concatenate(pairs_in)


def _separable_parent_pairs(graph, li, plan_cols, plan_rows, first_tile):
    """(output tile, parent tile) pairs when reads factor into columns x row intervals."""
    layer = graph.layers[li]
    orb_n = len(plan_rows[li]) - 1
    outs, ins = [], []
    for k, p in enumerate(layer.inputs):
        if p in layer.inputs[:k]:
            continue  # the same producer read twice: handled with its first occurrence
        ks = [kk for kk, q in enumerate(layer.inputs) if q == p]
        out_cols, in_cols = zip(*(column_reads(graph, li, kk) for kk in ks))
        icb_n, irb_n = len(plan_cols[p]) - 1, len(plan_rows[p]) - 1
        ocb = block_of(plan_cols[li], np.concatenate(out_cols))
        icb = block_of(plan_cols[p], np.concatenate(in_cols))
        key = np.unique(ocb * icb_n + icb)
        ocb_u, icb_u = key // icb_n, key % icb_n
        for orb in range(orb_n):
            r0, r1 = int(plan_rows[li][orb]), int(plan_rows[li][orb + 1])
            rows = [(a, b) for a, b in (row_reads(graph, li, kk, r0, r1) for kk in ks) if a < b]
            if not rows:
                continue
            lo, hi = min(a for a, _ in rows), max(b for _, b in rows)
            rb0, rb1 = block_of(plan_rows[p], np.asarray([lo, hi - 1]))
            rb = np.arange(rb0, rb1 + 1)
            out_t = first_tile[li] + ocb_u * orb_n + orb
            in_t = first_tile[p] + icb_u[:, None] * irb_n + rb[None, :]
            outs.append(np.repeat(out_t, len(rb)))
            ins.append(in_t.reshape(-1))
    if not outs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(outs), np.concatenate(ins)


def tile_output_flops(graph: ir.Graph, li: int, cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """FLOPs of tiles of ``cols`` x ``rows`` outputs of layer li: their share of the layer's."""
    layer = graph.layers[li]
    return layer_flops(graph, li) * ((cols * rows) / float(layer.columns * layer.rows))


def _check_layer_tiles(layer_tiles, n_layers: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for k, v in (layer_tiles or {}).items():
        try:
            li, t = int(k), int(v)
        except (TypeError, ValueError):
            raise CoactoError(f"layer_tiles maps layer indices to tile counts, got "
                              f"{k!r}: {v!r}") from None
        if not 0 <= li < n_layers or t < 1 or t != v:
            raise CoactoError(f"layer_tiles[{k!r}] = {v!r}: the layer must be in "
                              f"0..{n_layers - 1} and the tile count a positive integer")
        out[li] = t
    return out


def partition(graph: ir.Graph, tiles_per_layer: int | None = None,
              layer_tiles: dict[int, int] | None = None, min_column_blocks: int = 0,
              threads: int | None = None) -> TilePlan:
    """Cut every layer into tiles and compute their exact dependencies.

    ``layer_tiles`` overrides the tile count of single layers ({layer index: tiles}, as
    ``tiles_per_layer`` does for all): the hook auto-tuning (coacto.tune) uses to give each layer
    the count that measured fastest on a device. ``min_column_blocks``: see
    OFFLOAD_MIN_COLUMN_BLOCKS (0: none). ``threads``: the computing threads the graph will run
    on, when known: it sets the fewest tiles of a cheap layer (see DEFAULT_MIN_TILES, the
    default when None). Raises CoactoError only."""
    try:
        return _partition(graph, tiles_per_layer, layer_tiles, min_column_blocks, threads)
    except CoactoError:
        raise
    except MemoryError as e:  # the size caps should have refused it first
        err = ShapeError(f"could not partition the model: it needs more memory than there is "
                         f"({e}); check its dimensions and the input_shapes given")
        err.internal = True
        raise err from e
    except Exception as e:  # the importer let an inconsistent graph through
        err = ModelError(f"could not partition the model (internal error: {type(e).__name__}: "
                         f"{e}); report it with the model")
        err.internal = True
        raise err from e


def _partition(graph: ir.Graph, tiles_per_layer, layer_tiles, min_column_blocks,
               threads) -> TilePlan:
    if type(min_column_blocks) is not int or not 0 <= min_column_blocks <= 4096:
        raise CoactoError(f"min_column_blocks must be an integer from 0 to 4096, got "
                          f"{min_column_blocks!r}")
    if threads is not None and (type(threads) is not int or not 1 <= threads <= 4096):
        raise CoactoError(f"threads must be None or an integer from 1 to 4096, got {threads!r}")
    min_tiles = (DEFAULT_MIN_TILES if threads is None else 1 if threads == 1
                 else min(max(threads, DEFAULT_MIN_TILES), DEFAULT_MAX_TILES))
    if tiles_per_layer is not None and (int(tiles_per_layer) != tiles_per_layer
                                        or tiles_per_layer < 1):
        raise CoactoError(f"tiles_per_layer must be a positive integer, got {tiles_per_layer!r}")
    n_layers = len(graph.layers)
    layer_tiles = _check_layer_tiles(layer_tiles, n_layers)
    plan_cols, plan_rows = [], []
    for li, layer in enumerate(graph.layers):
        tiles = layer_tiles.get(li, tiles_per_layer)
        cb, rb = choose_splits(graph, li, tiles, min_column_blocks, min_tiles)
        if tiles is None and layer.op == "POOL":
            # At least as many column blocks as the layer it reads: a pooling tile then reads
            # about one producer tile's output, which the thread that just computed it still has
            # in cache and runs next (depth-first), instead of reading it from memory.
            blocks = min(len(plan_cols[layer.inputs[0]]) - 1, layer.columns)
            if blocks > len(cb) - 1:
                cb = _even_bounds(layer.columns, blocks)
        plan_cols.append(cb)
        plan_rows.append(rb)
    first_tile, _, bounds = number_tiles(plan_cols, plan_rows)
    n_tiles = int(first_tile[-1])
    flops = np.zeros(n_tiles, dtype=np.float64)
    for li in range(n_layers):
        s = slice(first_tile[li], first_tile[li + 1])
        b = bounds[s]
        flops[s] = tile_output_flops(graph, li, b[:, 1] - b[:, 0], b[:, 3] - b[:, 2])

    outs, ins = [], []
    for li, layer in enumerate(graph.layers):
        if layer.op == "INPUT":
            continue
        if layer.op == "GATHER":
            o, i = _gather_parent_pairs(graph, li, plan_cols, plan_rows, first_tile)
        elif layer.op == "MATMUL":
            o, i = matmul_parent_pairs(graph, li, plan_cols, plan_rows, first_tile, bounds)
        elif layer.op == "ATTENTION":
            o, i = attention_parent_pairs(graph, li, plan_cols, plan_rows, first_tile, bounds)
        elif layer.op == "EMBED":
            o, i = embed_parent_pairs(graph, li, plan_cols, plan_rows, first_tile)
        else:
            o, i = _separable_parent_pairs(graph, li, plan_cols, plan_rows, first_tile)
        outs.append(o)
        ins.append(i)
    if outs:
        key = np.unique(np.concatenate(outs) * n_tiles + np.concatenate(ins))
        child, parent = key // n_tiles, key % n_tiles
    else:
        child = parent = np.zeros(0, np.int64)
    offsets = np.zeros(n_tiles + 1, dtype=np.int64)
    np.add.at(offsets, child + 1, 1)
    offsets = np.cumsum(offsets)
    if offsets[-1] >= 2**31:
        raise CoactoError("the tile graph has more than 2^31 dependencies; use fewer tiles "
                          "per layer")
    return TilePlan.from_splits(plan_cols, plan_rows, offsets.astype(np.int32),
                                parent.astype(np.int32), flops)
