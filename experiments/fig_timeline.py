"""One collaborative inference, device and server side by side: the merged trace of a `dynamic`
run on the testbed (every tile on each device and server thread, every batch on the link, every
send decision), as a Gantt chart and as the trace file itself (open timeline.json in Perfetto).

The testbed as in fig_bandwidth.py; after a warm-up, `--repeat` inferences, the last one traced
(`Client.infer(..., trace=path)`: the server returns its side's tile times, mapped onto the
device's clock through the offset its heartbeats measure).

    python experiments/fig_timeline.py --out results/
    python experiments/fig_timeline.py --models resnet50 --bandwidth 100 --policy fl --out /tmp/t

Writes timeline.json (trace events), timeline.csv (one row per slice: process, thread, name,
start and duration in ms), timeline.settings.json and timeline.png.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402
import plot_trace  # noqa: E402


def slices(trace: dict) -> list[dict]:
    """The trace's complete events as rows, with their process and thread names."""
    events = trace["traceEvents"]
    pname = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    rows = []
    for e in events:
        if e.get("ph") == "X":
            rows.append({"process": pname.get(e["pid"], e["pid"]), "thread": tname.get((e["pid"], e["tid"]), e["tid"]),
                         "name": e["name"], "start_ms": e["ts"] / 1e3, "dur_ms": e["dur"] / 1e3,
                         "tile": e.get("args", {}).get("tile", ""), "layer": e.get("args", {}).get("layer", "")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_common_args(ap, models=("vgg16",))
    ap.add_argument("--bandwidth", type=float, default=20,
                    help="Mbit/s (default: %(default)s: with VGG-16 both sides compute there; where "
                         "the server is predicted far ahead, the device's work waits as insurance "
                         "and the trace shows the server alone)")
    ap.add_argument("--policy", default="dynamic")
    args = ap.parse_args(argv)
    H.resolve_common(args)
    model = args.models[0]
    progress = H.Progress(3, "timeline")
    with H.testbed(args) as tb, H.Workdir(args.image_size) as wd:
        tb.set_link(args.bandwidth)
        link = tb.measure_link(0.5)
        described = H.testbed_settings(tb)
        case = wd.model(model)
        progress.step(1, f"{model} built")
        trace_path = wd.path / "timeline.json"
        with H.Server(tb, wd, [case], threads=1) as srv, H.Device(tb, srv, case) as dev:
            dev.calibrate()
            bw = H.bandwidth_arg(tb, args.bandwidth)
            dev.fresh_client(bw)
            dev.learn(bw)
            progress.step(1, "warm")
            r = dev.run(args.policy, repeat=args.repeat, warmup=0, bandwidth=bw, trace=str(trace_path))
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace_path, args.out / "timeline.json")
    progress.step(1, "traced")
    progress.close()
    trace = json.loads((args.out / "timeline.json").read_text())
    rows = slices(trace)
    meta = trace.get("metadata", {}).get("coacto", {})
    settings = {"model": model, "policy": args.policy, "quota": args.quota,
                "bandwidth_mbps": args.bandwidth, **H.link_columns(link), "server_threads": 1,
                "device_threads": 1, "latencies_ms": [round(1e3 * x, 1) for x in r["latencies_s"]],
                "trace": {k: v for k, v in meta.items() if not isinstance(v, (list, dict))},
                "testbed": described}
    H.write_table(args.out, "timeline", rows, settings)
    plot_trace.plot(trace, args.out / "timeline.png",
                    title=f"{model}, {args.policy}, {args.bandwidth:g} Mbit/s "
                          f"(tbf), device at {args.quota:g} of a core: "
                          f"{1e3 * r['latencies_s'][-1]:.0f} ms")
    per_process: dict = {}
    for s in rows:
        per_process[s["process"]] = per_process.get(s["process"], 0) + (1 if s["tile"] != "" else 0)
    print("tiles per process: " + ", ".join(f"{p}: {n}" for p, n in per_process.items()))
    print(f"wrote {args.out / 'timeline.json'}, {args.out / 'timeline.csv'}, {args.out / 'timeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
