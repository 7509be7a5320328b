"""The tile plan: how a graph's tiles are numbered, what each one reads, and the questions the
planners and the simulator ask of it.

Tiles are numbered layer by layer (layers are in topological order), column block major, row
block minor, so tile ids are topological too: every parent has a smaller id than its child. A
tile is (layer, col0, col1, row0, row1) of that layer's output matrix.

The queries take a tile graph (anything with ``.graph``, an ir.Graph, and ``.plan``, its
TilePlan): they need the layers' inputs and the graph's inputs and outputs as well as the tiles.
What they derive once per plan is kept in the plan's ``memo``; plans are made per compiled model,
queries are asked at every inference.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def number_tiles(col_bounds, row_bounds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first tile of each layer [n_layers + 1], layer of each tile, bounds [n_tiles, 4]: col0,
    col1, row0, row1) of the layers' column and row block boundaries."""
    counts = np.asarray([(len(c) - 1) * (len(r) - 1) for c, r in zip(col_bounds, row_bounds)],
                        dtype=np.int64)
    first = np.zeros(len(counts) + 1, dtype=np.int64)
    first[1:] = np.cumsum(counts)
    bounds = np.zeros((int(first[-1]), 4), dtype=np.int32)
    for li, (cb, rb) in enumerate(zip(col_bounds, row_bounds)):
        s = slice(first[li], first[li + 1])
        bounds[s, 0] = np.repeat(cb[:-1], len(rb) - 1)
        bounds[s, 1] = np.repeat(cb[1:], len(rb) - 1)
        bounds[s, 2] = np.tile(rb[:-1], len(cb) - 1)
        bounds[s, 3] = np.tile(rb[1:], len(cb) - 1)
    return first, np.repeat(np.arange(len(counts), dtype=np.int32), counts), bounds


@dataclass
class TilePlan:
    """Tiles of a graph: numbered layer by layer, column block major, row block minor."""

    col_bounds: list[np.ndarray]  # per layer: column block boundaries (len = blocks + 1)
    row_bounds: list[np.ndarray]  # per layer: row block boundaries
    layer_first_tile: np.ndarray  # [n_layers + 1]
    tile_layer: np.ndarray  # int32 [n_tiles]
    tile_bounds: np.ndarray  # int32 [n_tiles, 4]: col0, col1, row0, row1
    parent_offsets: np.ndarray  # int32 [n_tiles + 1]
    parents: np.ndarray  # int32
    tile_flops: np.ndarray  # float64 [n_tiles]
    tile_bytes: np.ndarray  # int64 [n_tiles]: output bytes

    #: What the queries of this module (and the planners') derived from this plan, by name.
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_splits(cls, col_bounds, row_bounds, parent_offsets, parents,
                    tile_flops) -> "TilePlan":
        """The plan of these block boundaries, numbered, with the given dependencies and FLOPs
        (the arrays must be of the tile count the boundaries give: ``check_lengths``)."""
        first, tile_layer, bounds = number_tiles(col_bounds, row_bounds)
        tile_bytes = ((bounds[:, 1] - bounds[:, 0]).astype(np.int64)
                      * (bounds[:, 3] - bounds[:, 2]) * 4)
        return cls(col_bounds=list(col_bounds), row_bounds=list(row_bounds),
                   layer_first_tile=first, tile_layer=tile_layer, tile_bounds=bounds,
                   parent_offsets=parent_offsets, parents=parents, tile_flops=tile_flops,
                   tile_bytes=tile_bytes)

    @property
    def n_tiles(self) -> int:
        return int(self.tile_layer.shape[0])

    def dependencies(self, tile: int) -> np.ndarray:
        return self.parents[self.parent_offsets[tile]:self.parent_offsets[tile + 1]]

    def layer_tiles(self, li: int) -> range:
        first = self.layer_first_tile
        return range(int(first[li]), int(first[li + 1]))

    def block_tiles(self, li: int, b0: int, b1: int) -> range:
        """The tiles of layer li's column blocks b0 to b1 - 1."""
        first, rows = int(self.layer_first_tile[li]), len(self.row_bounds[li]) - 1
        return range(first + b0 * rows, first + b1 * rows)

    def tile_work(self) -> np.ndarray:
        """FLOPs needed to produce each tile from the inputs: the tile and all its ancestors
        (float64 [n_tiles]; what the send rule weighs). Exact, from ancestor bitsets built in
        topological order."""
        def make():
            n = self.n_tiles
            anc = np.zeros((n, (n + 63) // 64), dtype=np.uint64)
            off, par = self.parent_offsets, self.parents
            one = np.uint64(1)
            for t in range(n):
                ps = par[off[t]:off[t + 1]]
                if len(ps):
                    anc[t] = np.bitwise_or.reduce(anc[ps], axis=0)
                anc[t, t >> 6] |= one << np.uint64(t & 63)
            work = np.empty(n, dtype=np.float64)
            chunk = max(1, (1 << 24) // max(n, 1))
            for s in range(0, n, chunk):
                bits = np.unpackbits(anc[s:s + chunk].view(np.uint8), axis=1,
                                     bitorder="little")[:, :n]
                work[s:s + chunk] = bits @ self.tile_flops
            return work
        return self.memoised("tile_work", make)

    def ancestors(self, mask: np.ndarray) -> np.ndarray:
        """The tiles in ``mask`` and all their ancestors (bool mask)."""
        out = np.asarray(mask, dtype=bool).copy()
        off, par = self.parent_offsets, self.parents
        hi = int(np.flatnonzero(out).max()) if out.any() else -1
        for t in range(hi, -1, -1):
            if out[t]:
                out[par[off[t]:off[t + 1]]] = True
        return out

    def mask(self, ids, value=1) -> np.ndarray:
        """A uint8 mask over the tiles, ``value`` at ``ids``."""
        m = np.zeros(self.n_tiles, dtype=np.uint8)
        m[np.asarray(list(ids), dtype=np.int64)] = value
        return m

    def per_layer(self, per_tile: np.ndarray) -> np.ndarray:
        """Sums of a per-tile quantity over each layer's tiles."""
        first = self.layer_first_tile
        cs = np.concatenate([[0], np.cumsum(per_tile)])
        return cs[first[1:]] - cs[first[:-1]]

    def memoised(self, key, make):
        """``memo[key]``, made by ``make()`` the first time it is asked for."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


# ------------------------------------------------------------------ queries over graph + plan

def layer_tiles(tg, li: int) -> range:
    return tg.plan.layer_tiles(li)


def input_tiles(tg) -> np.ndarray:
    """The tiles of the graph's inputs, in layer order."""
    return np.asarray([t for li in sorted(tg.graph.inputs.values())
                       for t in tg.plan.layer_tiles(li)], dtype=np.int64)


def input_bytes(tg) -> int:
    return int(tg.plan.tile_bytes[input_tiles(tg)].sum())


def output_bytes(tg) -> float:
    """Bytes of the exit tiles: what the server returns."""
    return tg.plan.memoised("output_bytes", lambda: float(
        layer_bytes(tg)[sorted(set(tg.graph.outputs.values()))].sum()))


def flops_per_layer(tg) -> np.ndarray:
    """FLOPs per layer (sums of its tiles)."""
    return tg.plan.per_layer(tg.plan.tile_flops)


def layer_bytes(tg) -> np.ndarray:
    """Raw (float32) bytes of each layer's output."""
    plan = tg.plan
    return plan.memoised("layer_bytes", lambda: plan.per_layer(
        plan.tile_bytes.astype(np.int64)).astype(np.float64))


def last_reader(tg) -> np.ndarray:
    """last[l]: the largest index of a layer reading layer l (-1: none reads it)."""
    def make():
        last = np.full(len(tg.graph.layers), -1, dtype=np.int64)
        for i, layer in enumerate(tg.graph.layers):
            for p in layer.inputs:
                last[p] = max(last[p], i)
        return last
    return tg.plan.memoised("last_reader", make)


def cut_layers(tg, c: int) -> list[int]:
    """The layers whose tensors the server needs to compute everything after layer c from:
    c itself and every earlier layer a later one reads (BERT's attention mask, a residual
    block's shortcut)."""
    return [int(l) for l in np.flatnonzero(last_reader(tg)[:c] > c)] + [c]


def valid_cuts(tg) -> list[int]:
    """Layers c where the network can be cut: every input is at or before c and no graph output
    lies before c (it would have to be sent too). Computing layers 0..c here and sending
    cut_layers(tg, c) is then enough for the server to compute everything after c; a cut where
    several tensors are live sends them all (split prices their bytes)."""
    def make():
        outs = sorted(tg.graph.outputs.values())
        return [c for c in range(max(tg.graph.inputs.values()), len(tg.graph.layers))
                if not any(o < c for o in outs)]
    return tg.plan.memoised("valid_cuts", make)


def single_tensor_cuts(tg) -> list[int]:
    """The valid cuts after which one tensor is live (no later layer reads a layer before c):
    where a fused stack can end."""
    last = last_reader(tg)
    return tg.plan.memoised("single_tensor_cuts",
                            lambda: [c for c in valid_cuts(tg) if not (last[:c] > c).any()])


def cut_tiles(tg, c: int) -> np.ndarray:
    """The tiles sent at cut c (those of cut_layers)."""
    return np.concatenate([np.asarray(tg.plan.layer_tiles(li), dtype=np.int64)
                           for li in cut_layers(tg, c)])


def cut_needs(tg, c: int) -> np.ndarray:
    """local mask (uint8) of the tiles the cut at c sends and their ancestors, and the inputs
    (made once per cut: at each inference that streams it)."""
    def make():
        m = tg.plan.ancestors(tg.plan.mask(cut_tiles(tg, c))).astype(np.uint8)
        m[input_tiles(tg)] = 1
        return m
    return tg.plan.memoised(("cut_needs", c), make).copy()


def wire_bytes(tg, tiles, wire=None) -> float:
    """Bytes the given tiles (ids or a bool mask) take on the wire: raw bytes times their
    layer's ratio in ``wire`` (per layer; None: raw)."""
    tb = tg.plan.tile_bytes[tiles]
    if wire is None:
        return float(tb.sum())
    return float((tb * np.asarray(wire)[tg.plan.tile_layer[tiles]]).sum())


def cut_byte_array(tg, wire=None) -> np.ndarray:
    """Bytes sent at each valid cut (valid_cuts' order), raw or at the per-layer wire ratios."""
    def make():
        members = [cut_layers(tg, c) for c in valid_cuts(tg)]
        starts = np.cumsum([0] + [len(m) for m in members[:-1]])
        return (np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64),
                starts.astype(np.int64))
    layers, starts = tg.plan.memoised("cut_members", make)
    if not len(layers):
        return np.zeros(0)
    per_layer = layer_bytes(tg) if wire is None else layer_bytes(tg) * np.asarray(wire)
    return np.add.reduceat(per_layer[layers], starts)


def cut_bytes(tg, wire=None) -> dict[int, float]:
    """{valid cut: the bytes sent there}, raw or at the per-layer wire ratios ``wire``."""
    return dict(zip(valid_cuts(tg), cut_byte_array(tg, wire).tolist()))


def cut_flops(tg):
    """(valid cuts, FLOPs up to each, FLOPs after each, total) as arrays: split's cost model
    runs at every inference, inside a device's CPU quota."""
    def make():
        cuts = np.asarray(valid_cuts(tg), dtype=np.int64)
        cum = np.cumsum(flops_per_layer(tg))
        total = float(cum[-1])
        return cuts, cum[cuts], total - cum[cuts], total
    return tg.plan.memoised("cut_flops", make)
