"""The device side of an experiment: one process that plays the edge device for one model.

The experiment scripts start it inside the testbed's device namespace and CPU quota
(`Testbed.device_cmd`), so that compiling the model and its first packing happen once per model
instead of once per setting. It reads one JSON command per line on stdin and answers each with
one JSON line on stdout:

    {"cmd": "calibrate"}                                   -> {"device_flops": F}
    {"cmd": "run", "policy": "dynamic", "repeat": 3,
     "warmup": 1, "bandwidth": "20mbit" | null,
     "trace": "/path/t.json" | null}                       -> {"latencies_s": [...], "stats": [...],
                                                               "max_rel_error": E, ...}
                                                               (a trace: of the last inference)
    {"cmd": "learn", "max": 10, "bandwidth": ...}          -> dynamic inferences until one was
                                                               offloaded and the goodput measured
    {"cmd": "client", "bandwidth": "20mbit" | null}        -> a fresh Client (new estimates, new
                                                               connection) for what follows
    {"cmd": "probe", "runs": 3}                            -> {"latencies_s": [...]}: local
                                                               inferences after one left out
                                                               (the device's speed now)
    {"cmd": "set_bandwidth", "bandwidth": "100mbit"}       -> the client's own link changes now
    "run" may carry "change": {"after_s": 0.05, "bandwidth": "5mbit"}: the client's own link
    changes that far into each inference (shaper mode), and back before the next.

Every command may carry "rtt_ms": a round-trip delay the Client adds to its link (the kernel here
has no netem).

A Client is kept between runs of the same bandwidth argument: its estimates carry over from one
policy to the next as they would on a device that runs several inferences. Every output is
compared with onnxruntime's (computed by the experiment beforehand and passed as an .npz).

    python experiments/device_driver.py --server tcp://10.203.0.1:5555 --model m.onnx \
        --inputs in.npz --reference ref.npz --threads 1
"""
from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import threading
import time
import traceback

import numpy as np


def rel_error(got: dict, ref) -> float:
    worst = 0.0
    for name in ref.files:
        r = ref[name]
        g = np.asarray(got[name], dtype=np.float64)
        scale = max(float(np.abs(r).max()), 1e-12)
        worst = max(worst, float(np.abs(g - r).max()) / scale)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True, help="ONNX file (the server holds the same one)")
    ap.add_argument("--inputs", required=True, help=".npz of the model's inputs")
    ap.add_argument("--reference", required=True, help=".npz of onnxruntime's outputs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tiles", type=int, default=None, help="tiles per layer (default: coacto's)")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--transfer", default="lossless", help="the Client's tile encoding")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import coacto
    from coacto.mobile.client import resolve_model

    feeds = dict(np.load(args.inputs))
    ref = np.load(args.reference)
    tg, model_bytes = resolve_model(args.model, tiles_per_layer=args.tiles)
    client = None
    client_link = None
    calibrated = False

    def make_client(bandwidth, rtt_ms=0.0):
        nonlocal client, client_link
        if client is not None:
            client.close()
        client = coacto.Client(args.server, tg, threads=args.threads, bandwidth=bandwidth,
                               timeout=args.timeout, model_bytes=model_bytes, rtt_ms=rtt_ms,
                               transfer=args.transfer)
        client.connect(timeout=30)
        client_link = (bandwidth, rtt_ms)
        if calibrated:
            # A fresh client measures the device itself and goes on learning its rate from
            # every local run (a rate passed as device_flops would stay fixed: the device in a
            # CPU quota is 10-20% slower in most runs than in its best).
            client.calibrate()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "calibrate":
                if client is None:
                    make_client(cmd.get("bandwidth"), cmd.get("rtt_ms", 0.0))
                calibrated = True
                reply = {"device_flops": client.calibrate()}
            elif cmd["cmd"] == "learn":
                # A device that just joined a network: dynamic inferences until its estimates
                # include a measured goodput from an offloaded one (the engine offloads now and
                # then to keep its estimates fresh), at most `max`.
                link = (cmd.get("bandwidth"), cmd.get("rtt_ms", 0.0))
                if client is None or link != client_link:
                    make_client(*link)
                n, lat, pred = 0, [], []
                for n in range(1, cmd.get("max", 10) + 1):
                    client.infer(feeds, policy="dynamic")
                    lat.append(client.last_stats["latency_s"])
                    pred.append(client.last_stats.get("predicted_s"))
                    if client.last_stats.get("offloaded") and client.estimates["goodput_samples"] > 0:
                        break
                reply = {"inferences": n, "latencies_s": lat, "predicted_s": pred,
                         "estimates": client.estimates}
            elif cmd["cmd"] == "probe":
                # The device's own speed now: local inferences, as the link is measured beside
                # every setting (a core shared with the rest of the host, in 1 ms of every 4,
                # computes 10-30% slower for seconds at a time); the simulator takes it
                # (after a policy that left the later layers to the server their weights are
                # out of the caches: the first local inference is left out)
                lat = []
                for i in range(1 + int(cmd.get("runs", 3))):
                    client.infer(feeds, policy="local")
                    if i:
                        lat.append(client.last_stats["latency_s"])
                reply = {"latencies_s": lat}
            elif cmd["cmd"] == "set_bandwidth":
                client.set_bandwidth(cmd["bandwidth"])
                reply = {"ok": True}
            elif cmd["cmd"] == "client":
                make_client(cmd.get("bandwidth"), cmd.get("rtt_ms", 0.0))
                reply = {"ok": True}
            elif cmd["cmd"] == "run":
                link = (cmd.get("bandwidth"), cmd.get("rtt_ms", 0.0))
                if client is None or link != client_link:
                    make_client(*link)
                lat, stats, err = [], [], 0.0
                total = cmd.get("warmup", 0) + cmd["repeat"]
                # "change": {"after_s": S, "bandwidth": RATE}: the client's own link changes to
                # RATE S seconds into each inference (shaper mode; under kernel shaping the
                # experiment changes the qdisc itself), and back before the next
                change = cmd.get("change")
                for i in range(total):
                    # the last inference writes the merged trace when one is asked for
                    trace = cmd.get("trace") if i == total - 1 else None
                    timer = None
                    if change:
                        if link[0]:
                            client.set_bandwidth(link[0])
                        timer = threading.Timer(float(change["after_s"]), client.set_bandwidth,
                                                [change["bandwidth"]])
                    ru0 = resource.getrusage(resource.RUSAGE_SELF)
                    t0 = time.perf_counter()
                    if timer is not None:
                        timer.start()
                    out = client.infer(feeds, policy=cmd["policy"], trace=trace)
                    wall = time.perf_counter() - t0
                    ru1 = resource.getrusage(resource.RUSAGE_SELF)
                    if timer is not None:
                        timer.cancel()
                    err = max(err, rel_error(out, ref))
                    if i >= cmd.get("warmup", 0):
                        lat.append(client.last_stats.get("latency_s", wall))
                        # what the device process itself spent during the inference (all its
                        # threads): CPU time, page faults and context switches -- the quota's
                        # view of where a slow run's time went
                        stats.append({**client.last_stats, "device_process": {
                            "user_ms": 1e3 * (ru1.ru_utime - ru0.ru_utime),
                            "sys_ms": 1e3 * (ru1.ru_stime - ru0.ru_stime),
                            "minor_faults": ru1.ru_minflt - ru0.ru_minflt,
                            "voluntary_switches": ru1.ru_nvcsw - ru0.ru_nvcsw,
                            "involuntary_switches": ru1.ru_nivcsw - ru0.ru_nivcsw}})
                reply = {"latencies_s": lat, "stats": stats, "max_rel_error": err,
                         "estimates": client.estimates}
            else:
                reply = {"error": f"unknown command {cmd['cmd']!r}"}
        except Exception as e:  # the experiment records the failure and goes on
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply, default=_json_default), flush=True)
    if client is not None:
        client.close()
    return 0


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
