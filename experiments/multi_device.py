"""Several devices on one server at once: every answer correct, nobody starved.

Starts one `coacto-server` and N `coacto-client` processes (each its own ZeroMQ identity and
process, like separate devices) that run `--repeat` inferences each, all at the same time. Prints
per-device p50 / p95 latency, the spread between the fastest and slowest device, and checks every
device's last outputs against onnxruntime. On this 2-core machine the devices and the server
share the cores, so absolute latencies are high; fairness and correctness are what this shows.

    python experiments/multi_device.py --devices 8 --model squeezenet --policy dynamic --repeat 10
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offload_bandwidth import bin_path, free_port, start_server, stop_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--model", default="squeezenet", help="zoo model name")
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--policy", default="dynamic")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--bandwidth", default=None, help="per-device cap, e.g. 100mbit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import onnxruntime as ort

    from coacto import zoo

    tmp = Path(tempfile.mkdtemp(prefix="coacto-multi-"))
    models = tmp / "models"
    models.mkdir()
    kw = {"image_size": args.image_size} if args.image_size else {}
    model = zoo.build(args.model, **kw)
    model_path = models / f"{args.model}.onnx"
    model_path.write_bytes(model.SerializeToString())
    port = free_port()
    server = start_server(models, port, args.server_threads)
    procs = []
    try:
        refs = []
        for d in range(args.devices):
            feeds = zoo.input_feeds(model, seed=d)  # every device its own input
            np.savez(tmp / f"in{d}.npz", **feeds)
            refs.append(ort.InferenceSession(str(model_path)).run(None, feeds))
            cmd = [bin_path("coacto-client"), "--server", f"tcp://127.0.0.1:{port}", "--model",
                   str(model_path), "--input", str(tmp / f"in{d}.npz"), "--policy", args.policy,
                   "--threads", "1", "--repeat", str(args.repeat), "--json",
                   "--output", str(tmp / f"out{d}.npz")]
            if args.bandwidth:
                cmd += ["--bandwidth", args.bandwidth]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        t0 = time.time()
        rows = []
        for d, p in enumerate(procs):
            out, err = p.communicate(timeout=args.repeat * 60 + 120)
            if p.returncode != 0:
                raise RuntimeError(f"device {d} failed: {err.strip()[-600:]}")
            res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            lat = sorted(r["latency_s"] * 1e3 for r in res)
            got = np.load(tmp / f"out{d}.npz")
            names = [o.name for o in model.graph.output]
            err_rel = max(float(np.abs(got[n] - r).max() / np.abs(r).max()) for n, r in zip(names, refs[d]))
            rows.append({"device": d, "p50_ms": statistics.median(lat),
                         "p95_ms": lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))],
                         "fallbacks": sum(bool(r.get("fallback")) for r in res),
                         "tiles_from_server": statistics.median(r.get("tiles_from_server", 0) for r in res),
                         "match": err_rel <= 1e-4})
        wall = time.time() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)
    p50s = [r["p50_ms"] for r in rows]
    summary = {"devices": args.devices, "model": args.model, "policy": args.policy,
               "all_correct": all(r["match"] for r in rows),
               "p50_ms_median": statistics.median(p50s),
               "p95_ms_max": max(r["p95_ms"] for r in rows),
               "slowest_over_fastest_p50": max(p50s) / min(p50s),
               "throughput_inf_per_s": args.devices * args.repeat / wall}
    if args.json:
        print(json.dumps({"summary": summary, "devices": rows}))
        return
    print(f"{'device':>6} {'p50 ms':>9} {'p95 ms':>9} {'fallbacks':>9} {'from server':>11}  correct")
    for r in rows:
        print(f"{r['device']:>6} {r['p50_ms']:9.1f} {r['p95_ms']:9.1f} {r['fallbacks']:>9} "
              f"{r['tiles_from_server']:>11}  {'yes' if r['match'] else 'NO'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
