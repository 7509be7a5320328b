"""What the simulator needs of a tile graph, derived once and cached on the TileGraph: children,
depth buckets as the runtime's ready pool orders them, op classes, FLOPs, bytes and the server's
work per tile (the quantity the send rule compares)."""
from __future__ import annotations

import numpy as np

from ..inference import tile_work
from ..partition import input_tiles
from ..tilegraph import TileGraph
from .profiles import OP_CLASSES, op_class

#: Depth buckets of the runtime's ready pool and send queue (native/src/runtime_internal.h,
#: POOL_DEPTH_BUCKETS); not exported by the C header, so it is stated here.
POOL_DEPTH_BUCKETS = 16


class SimGraph:
    """Plain-Python views of a TileGraph for the event loop (lists index faster than arrays)."""

    def __init__(self, tg: TileGraph):
        plan = tg.plan
        n = plan.n_tiles
        self.tg = tg
        self.n = n
        off, par = plan.parent_offsets, plan.parents
        self.n_parents = np.diff(off).astype(np.int64).tolist()
        children: list[list[int]] = [[] for _ in range(n)]
        for t in range(n):
            for p in par[off[t]:off[t + 1]].tolist():
                children[p].append(t)
        self.children = children
        # depth = longest path from a source, bucket as native/src/graph.c derive_schedule
        depth = np.zeros(n, dtype=np.int64)
        for t in range(n):
            ps = par[off[t]:off[t + 1]]
            if len(ps):
                depth[t] = depth[ps].max() + 1
        self.bucket = (depth * POOL_DEPTH_BUCKETS // (int(depth.max()) + 1)).tolist()
        layer_cls = np.array([op_class(tg.graph, li) for li in range(tg.n_layers)], dtype=np.int64)
        self.tile_class = layer_cls[plan.tile_layer]
        self.flops = np.asarray(plan.tile_flops, dtype=np.float64)
        self.nbytes = np.asarray(plan.tile_bytes, dtype=np.int64)
        self.nbytes_list = self.nbytes.tolist()
        self.work = tile_work(tg).tolist()
        inputs = input_tiles(tg)
        self.is_input = np.zeros(n, bool)
        self.is_input[inputs] = True
        self.inputs = inputs.tolist()
        first = plan.layer_first_tile
        outs = sorted({t for li in set(tg.graph.outputs.values())
                       for t in range(int(first[li]), int(first[li + 1]))})
        self.outputs = outs
        self.is_output = np.zeros(n, bool)
        self.is_output[outs] = True
        self.is_output_list = self.is_output.tolist()
        # parentless tiles that are not inputs: the runtime schedules them when an inference starts
        self.sources = [t for t in range(n) if self.n_parents[t] == 0 and not self.is_input[t]]
        self.n_computable = n - len(inputs)
        self.total_flops = float(self.flops.sum())
        self.class_flops = {c: float(self.flops[self.tile_class == i].sum())
                            for i, c in enumerate(OP_CLASSES)}

    def durations_from_layers(self, layer_secs: np.ndarray, overhead_s: float,
                              speed: float) -> list[float]:
        """Seconds per tile on one thread from measured busy seconds per layer (summed over the
        threads that ran it): each layer's time shared among its tiles by FLOPs (by count where
        the layer has none), plus the per-tile overhead, divided by ``speed``."""
        plan = self.tg.plan
        layer = np.asarray(plan.tile_layer, dtype=np.int64)
        lflops = np.bincount(layer, weights=self.flops, minlength=len(layer_secs))
        ltiles = np.bincount(layer, minlength=len(layer_secs)).astype(np.float64)
        share = np.where(lflops[layer] > 0, self.flops / np.maximum(lflops[layer], 1e-300),
                         1.0 / np.maximum(ltiles[layer], 1.0))
        secs = (np.asarray(layer_secs)[layer] * share + overhead_s) / speed
        secs[self.is_input] = 0.0
        return secs.tolist()

    def durations(self, rates_per_thread: np.ndarray, overhead_s: float,
                  speed: float) -> list[float]:
        """Seconds per tile on one computing thread: FLOPs at the rate of the tile's op class plus
        the per-tile overhead, all divided by ``speed`` (the share of a core the thread gets)."""
        secs = (self.flops / rates_per_thread[self.tile_class] + overhead_s) / speed
        secs[self.is_input] = 0.0
        return secs.tolist()


def sim_graph(tg: TileGraph) -> SimGraph:
    return tg.plan.memoised("sim_graph", lambda: SimGraph(tg))
