"""Per-tile cost of the offloading path on a real model: a plan that sends every tile (the C
decision by the ECT rule, the copy into the send queue, the report, and the batched hand-off to a
stub sender in Python that drops the batches) vs the same inference with no plan, one thread,
medians of interleaved runs. The bar is <= 5 us per tile.

    python experiments/bench_offload_tiles.py --model resnet18 --image-size 64 --tiles 16
"""
import argparse
import select
import statistics
import time

import numpy as np

import coacto
from coacto import zoo
from coacto.inference import (REPORT_DONE, SEND_ALWAYS, SEND_DECIDE, NativeInference, ReportQueue,
                              now)
from coacto.runtime import NativeRuntime

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="resnet18", help="zoo model name")
ap.add_argument("--image-size", type=int, default=64)
ap.add_argument("--tiles", type=int, default=16, help="tiles per layer")
ap.add_argument("--repeat", type=int, default=30)
args = ap.parse_args()
name, size, tiles = args.model, args.image_size, args.tiles
m = zoo.build(name, image_size=size)
tg = coacto.compile(m, tiles_per_layer=tiles)
feeds = zoo.input_feeds(m)
rt = NativeRuntime(1)
q = ReportQueue(rt)

def run(mode):
    inf = NativeInference(rt, tg, tag=7)
    if mode == "local":
        inf.set_plan(None, None, None)
    else:
        send = np.full(tg.n_tiles, SEND_ALWAYS if mode == "always" else SEND_DECIDE, np.uint8)
        inf.set_plan(None, send, None)
        # decide: the ECT rule evaluated for every tile, always true (server never catches up)
        inf.set_offload_params(1e12, 0.0, now() + 1e6, 1e9, 1.0)
    t0 = time.perf_counter()
    inf.set_inputs(feeds)
    done = False
    sent = 0
    while not done:
        select.select([q.fd], [], [], 0.05)
        for tag, kind, tile in q.take():
            if kind == REPORT_DONE:
                done = True
        if mode != "local":
            while True:  # the stub sender: take batches of up to 256 kB, drop them
                ids, data = inf.take_sends(256 << 10)
                if not len(ids):
                    break
                sent += len(ids)
    t = time.perf_counter() - t0
    inf.close()
    return t, sent

for mode in ("local", "always", "decide"):
    run(mode)
res = {"local": [], "always": [], "decide": []}
for r in range(args.repeat):
    for mode in res:
        res[mode].append(run(mode)[0])
med = {k: statistics.median(v) for k, v in res.items()}
_, sent = run("always")
print(f"{name} {size}px tiles/layer {tiles}: {tg.n_tiles} tiles, {sent} sent per inference, "
      f"{tg.plan.tile_bytes.sum()/1e6:.2f} MB of tile outputs")
for k in ("always", "decide"):
    print(f"  {k}: median {med[k]*1e3:.3f} ms vs local {med['local']*1e3:.3f} ms -> "
          f"{(med[k]-med['local'])/tg.n_tiles*1e6:.2f} us per tile")
