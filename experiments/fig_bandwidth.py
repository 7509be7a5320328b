"""Latency of every policy against the link's bandwidth (CoActo's Fig. 9), with the CoActo
reference implementation's own policies on the same testbed beside coacto's.

The testbed (experiments/testbed.py): the server in one network namespace pinned to CPU 1 with
one computing thread, the device in another pinned to CPU 0 inside a CPU quota (default 25% of a
core: a device 4x slower than the server), the link between them shaped by tbf in both
directions; each row records the goodput and RTT measured on that link beside the nominal setting.
Without root the client's own token bucket shapes a loopback link instead, and the rows say so.

Per model: one server and one device process (compiled once); for every bandwidth a fresh Client
(its estimates start from nothing, as on a device that just joined a network), one warm-up
inference, then every policy `--repeat` times, policies rotated from round to round. Every output
is compared with onnxruntime's. Then the reference's `local`, `conventional` (cloud), `spinn`
(split) and `dynamic` at the same settings, for the architectures it ships (ResNet-50, VGG-16,
BERT-base; random weights; its yield build, since its threads busy-wait on 2 cores).

    python experiments/fig_bandwidth.py --out results/                  # 5..200 Mbit/s, 4 models
    python experiments/fig_bandwidth.py --quick --models resnet50       # 5, 20, 100 Mbit/s, three
                                                                        # rounds; the reference's
                                                                        # local and dynamic only
    python experiments/fig_bandwidth.py --bandwidths 10,50 --no-ref
    python experiments/fig_bandwidth.py --bandwidths 20 --rtt-ms 40        # a distant server

Writes bandwidth.csv, bandwidth.settings.json and bandwidth.png under --out, and prints per
model and bandwidth dynamic's latency over the best baseline's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

FULL_BANDWIDTHS = (5, 10, 20, 50, 100, 200)
QUICK_BANDWIDTHS = (5, 20, 100)
REF_POLICIES = ("local", "cloud", "split", "fl", "dynamic")
#: with --quick: its own dynamic beside ours, and its local for scale
REF_POLICIES_QUICK = ("local", "dynamic")
#: its fused-layer baseline spins forever on BERT (in its own code)
REF_SKIP = {("bert", "fl")}


def measure_coacto(args, tb, wd, model: str, bandwidths, progress, rows: list[dict]) -> None:
    case = wd.model(model)
    with H.Server(tb, wd, [case], threads=args.server_threads) as srv, \
            H.Device(tb, srv, case, threads=1) as dev:
        device_flops = dev.calibrate()
        for rnd in range(args.rounds):
            order = list(bandwidths) if rnd % 2 == 0 else list(reversed(bandwidths))
            for bw in order:
                tb.set_link(bw, rtt_ms=args.rtt_ms)
                link = tb.measure_link(0.5 if args.quick else 1.0)
                base = {"model": model, "nominal_mbps": bw, "added_rtt_ms": args.rtt_ms,
                        **H.link_columns(link),
                        "device_gflops": device_flops / 1e9}
                rows += H.run_policies(dev, args.policies, args.repeat, rnd,
                                       H.bandwidth_arg(tb, bw), base, progress,
                                       chunk=args.chunk)


def measure_reference(args, tb, model: str, bandwidths, progress, rows: list[dict]) -> None:
    label = None
    for bw in bandwidths:
        tb.set_link(bw)
        link = tb.measure_link(0.5 if args.quick else 1.0)
        for policy in args.ref_policies:
            if policy == "local" and bw != bandwidths[0] or (model, policy) in REF_SKIP:
                continue  # its local run does not touch the link
            row = H.reference_row(tb, model, policy, args.ref_repeat,
                                  {"model": model, "round": 0, "nominal_mbps": bw,
                                   **H.link_columns(link)})
            label = row["system"]
            rows.append(row)
            progress.step(1, f"coacto-ref {model} {policy} @ {bw} Mbit/s")
    if "local" in args.ref_policies:  # one local measurement stands for every bandwidth
        local = [r for r in rows if r["system"] == label and r["model"] == model
                 and r["policy"] == "local"]
        if local:
            for bw in bandwidths[1:]:
                rows.append({**local[-1], "nominal_mbps": bw, "measured_up_mbps": "",
                             "measured_down_mbps": "", "measured_rtt_ms": "",
                             "note": f"local: measured once, at {bandwidths[0]} Mbit/s"})


def best_table(rows: list[dict], policies) -> list[dict]:
    """Per model and bandwidth: each policy's median over rounds, dynamic over the best baseline."""
    out = []
    keys = sorted({(r["model"], r["nominal_mbps"]) for r in rows if r["system"] == "coacto"},
                  key=lambda k: (k[0], k[1]))
    for model, bw in keys:
        med = {}
        for p in policies:
            xs = [r["median_ms"] for r in rows if r["system"] == "coacto" and r["model"] == model
                  and r["nominal_mbps"] == bw and r["policy"] == p]
            if xs:
                med[p] = statistics.median(xs)
        base = {p: v for p, v in med.items() if p != "dynamic"}
        best = min(base, key=base.get) if base else None
        refdyn = [r.get("median_ms") for r in rows if r["system"] != "coacto" and r["model"] == model
                  and r["nominal_mbps"] == bw and r["policy"] == "dynamic" and r.get("median_ms")]
        measured = [float(r["measured_up_mbps"]) for r in rows if r["model"] == model
                    and r["nominal_mbps"] == bw and r.get("measured_up_mbps") not in (None, "")]
        out.append({"model": model, "nominal_mbps": bw,
                     "measured_mbps": statistics.median(measured) if measured else None,
                     **{p: med.get(p) for p in policies},
                     "best_baseline": best,
                     "dynamic_over_best": (med["dynamic"] / base[best]) if best and "dynamic" in med else None,
                     "ref_dynamic": refdyn[0] if refdyn else None})
    return out


def plot(out: Path, rows: list[dict], policies, settings: dict) -> Path:
    plt = H.pyplot()
    from matplotlib.ticker import NullLocator, ScalarFormatter

    models = sorted({r["model"] for r in rows}, key=lambda m: list(H.FIGURE_MODELS).index(m)
                    if m in H.FIGURE_MODELS else 99)
    cols = min(2, len(models))
    nrows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 4.2 * nrows + 0.8), squeeze=False)
    colors = H.POLICY_COLORS
    for ax, model in zip(axes.flat, models):
        for system in sorted({r["system"] for r in rows if r["model"] == model},
                             key=lambda s: s != "coacto"):
            for p in policies:
                pts = {}
                for r in rows:
                    if r["model"] == model and r["system"] == system and r["policy"] == p \
                            and r.get("median_ms"):
                        pts.setdefault(r["nominal_mbps"], []).append(r["median_ms"])
                if not pts:
                    continue
                xs = sorted(pts)
                ys = [statistics.median(pts[x]) for x in xs]
                ours = system == "coacto"
                ax.plot(xs, ys, marker="o" if ours else "x", linestyle="-" if ours else "--",
                        color=colors.get(p), lw=2 if p == "dynamic" else 1.2,
                        label=p if ours else f"ref {p}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        bws = sorted({r["nominal_mbps"] for r in rows if r["model"] == model})
        ax.set_xticks(bws, [f"{b:g}" for b in bws])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(model)
        ax.set_xlabel("link bandwidth (Mbit/s, nominal)")
        ax.set_ylabel("latency (ms, median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle("Latency vs bandwidth\ncoacto's policies (solid), the CoActo reference's (dashed)",
                 fontsize=10)
    return H.save_figure(fig, out, "bandwidth", settings, bottom=0.05, top=0.97)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_common_args(ap)
    ap.add_argument("--bandwidths", default=None, metavar="MBPS,..",
                    help=f"Mbit/s (default: {','.join(map(str, FULL_BANDWIDTHS))}; --quick: "
                         f"{','.join(map(str, QUICK_BANDWIDTHS))})")
    ap.add_argument("--policies", default=",".join(H.POLICIES))
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=None, metavar="K",
                    help="each fresh client runs the policies K inferences at a time, in turns, "
                         "until each has run --repeat (default: all of one policy's, then the "
                         "next's), each turn in an order drawn afresh. The device in its quota runs "
                         "10-50%% slower for seconds after it sat idle (a slow link's cloud or fl "
                         "inferences), so the policy that follows such a run pays for it; in "
                         "turns of one, every policy pays alike")
    ap.add_argument("--rtt-ms", type=float, default=0.0, metavar="MS",
                    help="add this round trip to the link (the client adds it: this kernel has "
                         "no netem; the reference cannot, so it is left out then)")
    ap.add_argument("--no-ref", action="store_true", help="leave out the CoActo reference's rows")
    ap.add_argument("--from-csv", metavar="BANDWIDTH.CSV", type=Path,
                    help="measure nothing: remake the summary, table and PNG from this file (and "
                         "the settings file beside it)")
    ap.add_argument("--ref-repeat", type=int, default=None,
                    help="inferences per reference run (default: 3 with --quick, else 6)")
    args = ap.parse_args(argv)
    if args.chunk is not None and args.chunk < 1:
        ap.error("--chunk: give a number of inferences >= 1")
    quick_rounds = args.quick and args.rounds is None
    H.resolve_common(args)
    if quick_rounds:  # three passes even so: sim_vs_real compares medians over rounds, and a
        args.rounds = 3  # slow minute of the throttled device should not decide a setting
    args.policies = args.policies.split(",")
    args.ref_policies = REF_POLICIES_QUICK if args.quick else REF_POLICIES
    if args.from_csv:
        return remake(args)
    bandwidths = [float(x) if "." in x else int(x) for x in args.bandwidths.split(",")] \
        if args.bandwidths else list(QUICK_BANDWIDTHS if args.quick else FULL_BANDWIDTHS)
    if args.ref_repeat is None:
        args.ref_repeat = 3 if args.quick else 6
    if args.rtt_ms and not args.no_ref:
        print("--rtt-ms: the CoActo reference cannot add a delay to its link; its rows are left "
              "out", file=sys.stderr)
    ref_models = [] if args.no_ref or args.rtt_ms else [m for m in args.models if m in H.REF_MODELS]
    units = (len(args.models) * len(bandwidths) * len(args.policies) * args.rounds
             + sum(len(bandwidths) * (len(args.ref_policies) - 1
                                      - ((m, "fl") in REF_SKIP and "fl" in args.ref_policies)) + 1
                   for m in ref_models))
    progress = H.Progress(units, "bandwidth")
    rows: list[dict] = []
    with H.testbed(args) as tb, H.Workdir(args.image_size) as wd:
        settings = {"quota": args.quota, "server_threads": args.server_threads,
                    "added_rtt_ms": args.rtt_ms,
                    "device_threads": 1, "repeat": args.repeat, "rounds": args.rounds,
                    "rotation": "alternate",  # H.rotation
                    "chunk": args.chunk,
                    "bandwidths_mbps": bandwidths, "testbed": H.testbed_settings(tb)}
        for model in args.models:
            measure_coacto(args, tb, wd, model, bandwidths, progress, rows)
        for model in ref_models:
            measure_reference(args, tb, model, bandwidths, progress, rows)
        if ref_models:
            import peer_coacto_ref as ref

            settings["reference"] = ref.build().label
    progress.close()
    H.write_table(args.out, "bandwidth", rows, settings)
    table = best_table(rows, args.policies)
    H.write_table(args.out, "bandwidth_summary", table, settings)
    png = plot(args.out, rows, args.policies, {k: v for k, v in settings.items() if k != "testbed"}
               | {"testbed": settings["testbed"]["shaping"]})
    print_table(table, args.policies)
    print(f"wrote {args.out / 'bandwidth.csv'}, {png}")
    return 0


def remake(args) -> int:
    rows = H.read_table(args.from_csv)
    for r in rows:
        r["nominal_mbps"] = float(r["nominal_mbps"])
    settings_path = args.from_csv.with_name(args.from_csv.stem + ".settings.json")
    settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    policies = [p for p in args.policies if any(r["policy"] == p for r in rows)]
    table = best_table(rows, policies)
    H.write_table(args.out, "bandwidth_summary", table, {k: v for k, v in settings.items()
                                                         if k not in ("figure", "written", "machine")})
    shown = {k: v for k, v in settings.items() if k in ("quota", "server_threads", "repeat",
                                                         "rounds", "reference")}
    shown["testbed"] = settings.get("testbed", {}).get("shaping")
    png = plot(args.out, rows, policies, shown)
    print_table(table, policies)
    print(f"wrote {args.out / 'bandwidth_summary.csv'}, {png}")
    return 0


def print_table(table: list[dict], policies) -> None:
    head = ["model", "Mbit/s", "measured"] + list(policies) + ["dyn/best", "ref dyn"]
    print(" | ".join(head))
    for t in table:
        cells = [t["model"], str(t["nominal_mbps"]),
                 f"{t['measured_mbps']:.1f}" if t["measured_mbps"] else "-"]
        cells += [f"{t[p]:.0f}" if t.get(p) else "-" for p in policies]
        cells.append(f"{t['dynamic_over_best']:.2f}" if t["dynamic_over_best"] else "-")
        cells.append(f"{t['ref_dynamic']:.0f}" if t["ref_dynamic"] else "-")
        print(" | ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
