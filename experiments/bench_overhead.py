"""Per-tile runtime overhead: scheduling + bookkeeping of tiles whose kernel does nothing.

Also measures the offloading path's per-tile cost (the C send decision by the ECT rule, the copy
into the send queue, the announcement on the report queue) with `--send decide` / `--send always`:
the difference to `--send none` is what offloading adds per tile (bar: <= 5 us).

Builds tile graphs of NOP layers directly through the native API (no ONNX involved): a layer is
cut into `--tiles` column tiles, and each tile of layer i+1 depends on the overlapping tile of
layer i plus its neighbours (a 3-wide stencil, like a 3x3 convolution's receptive field), so tiles
ready their children, continue depth-first, push to and steal from the ready pool as in a real
network. Prints microseconds per tile for 1 and 2 threads.

    python experiments/bench_overhead.py [--layers 200] [--tiles 64] [--repeat 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from coacto._native import ffi, lib
from coacto.runtime import check


def build_graph(layers: int, tiles: int):
    descs = ffi.new("coacto_layer_desc[]", layers)
    for li in range(layers):
        d = descs[li]
        d.op = lib.COACTO_OP_INPUT if li == 0 else lib.COACTO_OP_NOP
        d.n_inputs = 0 if li == 0 else 1
        d.inputs[0] = max(li - 1, 0)
        d.n, d.c, d.h, d.w = 1, 8, 1, tiles
        d.flags = lib.COACTO_LAYER_KEEP if li == layers - 1 else 0
    n_tiles = layers * tiles
    tile_layer = np.repeat(np.arange(layers, dtype=np.int32), tiles)
    bounds = np.zeros((n_tiles, 4), np.int32)
    cols = np.tile(np.arange(tiles, dtype=np.int32), layers)
    bounds[:, 0], bounds[:, 1], bounds[:, 2], bounds[:, 3] = cols, cols + 1, 0, 8
    parents, offsets = [], [0]
    for t in range(n_tiles):
        li, c = divmod(t, tiles)
        if li > 0:
            for dc in (-1, 0, 1):
                if 0 <= c + dc < tiles:
                    parents.append((li - 1) * tiles + c + dc)
        offsets.append(len(parents))
    arrays = [tile_layer, bounds.reshape(-1), np.asarray(offsets, np.int32), np.asarray(parents, np.int32)]
    desc = ffi.new("coacto_graph_desc *")
    desc.n_layers, desc.layers, desc.n_tiles = layers, descs, n_tiles
    desc.tile_layer = ffi.from_buffer("int32_t[]", arrays[0])
    desc.tile_bounds = ffi.from_buffer("int32_t[]", arrays[1])
    desc.parent_offsets = ffi.from_buffer("int32_t[]", arrays[2])
    desc.parents = ffi.from_buffer("int32_t[]", arrays[3])
    blob = ffi.new("uint8_t[]", 64)
    desc.blob, desc.blob_size = blob, 0
    out = ffi.new("coacto_graph **")
    err = ffi.new("char[256]")
    check(lib.coacto_graph_create(desc, out, err, 256), "graph", ffi.string(err).decode())
    return out[0], n_tiles


def drain(rt, inf, n_tiles: int) -> None:
    """Empties the send queue and the report queue (what the communication engine does)."""
    ids = ffi.new("int32_t[]", n_tiles)
    data = ffi.new("float[]", n_tiles * 8)
    used = ffi.new("int64_t *")
    while lib.coacto_inference_take_sends(inf, ids, n_tiles, data, n_tiles * 8, used):
        pass
    reports = ffi.new("coacto_report[]", 4096)
    while lib.coacto_runtime_take_reports(rt, reports, 4096):
        pass


def measure(graph, n_tiles: int, tiles: int, threads: int, repeat: int, send: str = "none") -> float:
    rt_out = ffi.new("coacto_runtime **")
    check(lib.coacto_runtime_create(threads, rt_out), "runtime")
    rt = rt_out[0]
    data = np.zeros(tiles * 8, np.float32)
    times = []
    try:
        for _ in range(repeat + 2):
            inf_out = ffi.new("coacto_inference **")
            check(lib.coacto_inference_create(rt, graph, inf_out), "inference")
            inf = inf_out[0]
            if send != "none":
                mode = lib.COACTO_SEND_ALWAYS if send == "always" else lib.COACTO_SEND_DECIDE
                mask = np.full(n_tiles, mode, np.uint8)
                check(lib.coacto_inference_set_plan(inf, ffi.NULL, ffi.from_buffer("uint8_t[]", mask),
                                                    ffi.NULL, 7), "plan")
                p = ffi.new("coacto_offload_params *")
                # a decision that always comes out "send", so the whole path is exercised
                p.bandwidth, p.rtt, p.inputs_at_server = 1e12, 0.0, lib.coacto_now_seconds() + 1e6
                p.server_flops, p.alpha = 1e9, 1.0
                check(lib.coacto_inference_set_offload_params(inf, p), "params")
            t0 = time.perf_counter()
            check(lib.coacto_inference_set_input(inf, 0, ffi.from_buffer("float[]", data), data.size), "input")
            check(lib.coacto_inference_wait(inf, 60.0), "wait")
            times.append(time.perf_counter() - t0)
            if send != "none":
                drain(rt, inf, n_tiles)
            lib.coacto_inference_destroy(inf)
    finally:
        lib.coacto_runtime_destroy(rt)
    return statistics.median(times[2:]) / (n_tiles - tiles) * 1e6  # input tiles are not run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--tiles", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--send", default="none,decide,always",
                    help="offloading modes to measure: none, decide (ECT rule), always")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    graph, n_tiles = build_graph(args.layers, args.tiles)
    work = np.ones(n_tiles, np.float64)
    check(lib.coacto_graph_set_work(graph, ffi.from_buffer("double[]", work), n_tiles), "work")
    rows = []
    try:
        for th in (int(x) for x in args.threads.split(",")):
            base = None
            for send in args.send.split(","):
                us = measure(graph, n_tiles, args.tiles, th, args.repeat, send)
                row = {"threads": th, "send": send, "tiles": n_tiles, "us_per_tile": round(us, 3)}
                if send == "none":
                    base = us
                    row.update(bar_us=2.0, ok=us <= 2.0)
                elif base is not None:
                    row.update(offload_us_per_tile=round(us - base, 3), bar_us=5.0, ok=us - base <= 5.0)
                rows.append(row)
    finally:
        lib.coacto_graph_destroy(graph)
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            extra = (f"  offloading adds {r['offload_us_per_tile']:.3f} us/tile"
                     if "offload_us_per_tile" in r else "")
            print(f"threads={r['threads']}  send={r['send']:<6}  tiles={r['tiles']}  "
                  f"{r['us_per_tile']:.3f} us/tile{extra}  (bar: <= {r['bar_us']} us)  "
                  f"{'ok' if r['ok'] else 'OVER'}")


if __name__ == "__main__":
    main()
