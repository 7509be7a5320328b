"""Per-tile cost of the offloading path: a plan that sends every tile (decide + copy + enqueue in C,
batched hand-off to a stub sender in Python) vs the same inference with no plan."""
import select, statistics, time, sys
import numpy as np
import coacto
from coacto import zoo
from coacto.inference import NativeInference, ReportQueue, SEND_ALWAYS, SEND_DECIDE, REPORT_DONE, now
from coacto.runtime import NativeRuntime

name = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
size = int(sys.argv[2]) if len(sys.argv) > 2 else 64
tiles = int(sys.argv[3]) if len(sys.argv) > 3 else 16
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
for r in range(30):
    for mode in res:
        res[mode].append(run(mode)[0])
med = {k: statistics.median(v) for k, v in res.items()}
_, sent = run("always")
print(f"{name} {size}px tiles/layer {tiles}: {tg.n_tiles} tiles, {sent} sent per inference, "
      f"{tg.plan.tile_bytes.sum()/1e6:.2f} MB of tile outputs")
for k in ("always", "decide"):
    print(f"  {k}: median {med[k]*1e3:.3f} ms vs local {med['local']*1e3:.3f} ms -> "
          f"{(med[k]-med['local'])/tg.n_tiles*1e6:.2f} us per tile")
