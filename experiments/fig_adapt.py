"""A link that changes under the device: does `dynamic` follow it?

The testbed as in fig_bandwidth.py (kernel shaping between two namespaces as root, else the
client's token bucket). Two experiments per model:

- **drop**: the link runs at `--high` Mbit/s; `--at` of the way into each inference (a share of
  dynamic's own median latency at `--high`, measured first) it drops to `--low` (`tc change` of
  both qdiscs, or the client's shaper re-timing what it holds); the next inference starts at
  `--high` again. Each policy's latency is set against `local`'s (which the link does not touch):
  the bar is `dynamic` within 10% of it, not stuck behind the link.
- **rise**: the link runs at `--low` until `dynamic` keeps inferences on the device, then rises to
  `--high`; inferences follow back to back. The row says when (how many inferences, how many
  seconds after the rise) `dynamic` offloaded again and the latencies before and after.

    python experiments/fig_adapt.py --out experiments/results
    python experiments/fig_adapt.py --quick --models resnet50

Writes adapt.csv (one row per policy and experiment), adapt.settings.json and adapt.png.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

POLICIES = ("local", "dynamic", "cloud", "split")


def drop(tb, dev: H.Device, args, progress) -> list[dict]:
    rows = []
    high_arg = H.bandwidth_arg(tb, args.high)
    tb.set_link(args.high)
    dev.fresh_client(high_arg)
    dev.learn(high_arg)
    base = dev.run("dynamic", repeat=args.repeat, warmup=1, bandwidth=high_arg)
    base_ms = 1e3 * statistics.median(base["latencies_s"])
    after_s = args.at * base_ms / 1e3
    progress.step(1, f"dynamic at {args.high:g} Mbit/s: {base_ms:.0f} ms")
    for rnd in range(args.rounds):
        for policy in (POLICIES if rnd % 2 == 0 else POLICIES[::-1]):
            lat, offloaded, fallbacks = [], 0, 0
            for _ in range(args.repeat):
                # a device whose estimates say --high: a fresh client that has measured it
                tb.set_link(args.high)
                dev.fresh_client(high_arg)
                dev.learn(high_arg)
                change = None
                timer = None
                if tb.mode == "netns":
                    timer = threading.Timer(after_s, tb.set_link, [args.low])
                    timer.start()
                else:
                    change = {"after_s": after_s, "bandwidth": f"{args.low:g}mbit"}
                r = dev.run(policy, repeat=1, warmup=0, bandwidth=high_arg, change=change)
                if timer is not None:
                    timer.join()
                lat += r["latencies_s"]
                st = r["stats"][0]
                offloaded += bool(st.get("offloaded"))
                fallbacks += bool(st.get("fallback"))
            rows.append({"experiment": "drop", "model": dev.case.name, "policy": policy,
                         "round": rnd, "high_mbps": args.high, "low_mbps": args.low,
                         "drop_after_ms": 1e3 * after_s, "dynamic_at_high_ms": base_ms,
                         **H.summarize(lat),
                         "latencies_ms": " ".join(f"{1e3 * x:.1f}" for x in lat),
                         "offloaded": offloaded, "fallbacks": fallbacks})
            progress.step(1, f"drop {dev.case.name} {policy}")
    tb.set_link(args.high)
    return rows


def rise(tb, dev: H.Device, args, progress) -> list[dict]:
    """At --low until dynamic keeps inferences local, then --high; inferences back to back."""
    rows = []
    for rnd in range(args.rounds):
        tb.set_link(args.low)
        low_arg = H.bandwidth_arg(tb, args.low)
        dev.fresh_client(low_arg)
        dev.learn(low_arg)
        before = dev.run("dynamic", repeat=args.repeat, warmup=1, bandwidth=low_arg)
        kept = sum(not s.get("offloaded") for s in before["stats"])
        tb.set_link(args.high)
        if tb.mode != "netns":  # the client's own link: the same client, its cap raised
            dev.set_bandwidth(f"{args.high:g}mbit")
        r = dev.run("dynamic", repeat=args.after, warmup=0, bandwidth=low_arg)
        first = next((i for i, s in enumerate(r["stats"]) if s.get("offloaded")), None)
        elapsed = sum(r["latencies_s"][:first]) if first is not None else None
        rows.append({"experiment": "rise", "model": dev.case.name, "policy": "dynamic",
                     "round": rnd, "high_mbps": args.high, "low_mbps": args.low,
                     "kept_local_before": kept, "before_median_ms":
                     1e3 * statistics.median(before["latencies_s"]),
                     "first_offloaded_after_rise": "" if first is None else first + 1,
                     "seconds_to_offload": "" if elapsed is None else round(elapsed, 3),
                     **H.summarize(r["latencies_s"][first:] if first is not None else
                                   r["latencies_s"]),
                     "latencies_ms": " ".join(f"{1e3 * x:.1f}" for x in r["latencies_s"])})
        progress.step(1, f"rise {dev.case.name}")
    tb.set_link(args.high)
    return rows


def plot(rows: list[dict], out: Path, settings: dict) -> None:
    plt = H.pyplot()
    if plt is None:
        return
    drops = [r for r in rows if r["experiment"] == "drop"]
    models = sorted({r["model"] for r in drops})
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(5 * max(1, len(models)), 4),
                             squeeze=False)
    for ax, model in zip(axes[0], models):
        pol = [p for p in POLICIES if any(r["model"] == model and r["policy"] == p for r in drops)]
        med = [statistics.median(r["median_ms"] for r in drops
                                 if r["model"] == model and r["policy"] == p) for p in pol]
        ax.bar(pol, med, color=["#888", "#c33", "#37a", "#3a7"][:len(pol)])
        ax.set_title(f"{model}: link drops mid-inference")
        ax.set_ylabel("latency (ms)")
    H.save_figure(fig, out, "adapt", settings)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_common_args(ap, models=("resnet50", "vgg16"), quick_models=("resnet50",))
    ap.add_argument("--high", type=float, default=100, help="Mbit/s before a drop, after a rise")
    ap.add_argument("--low", type=float, default=5, help="Mbit/s after a drop, before a rise")
    ap.add_argument("--at", type=float, default=0.3,
                    help="the drop comes this share of dynamic's latency at --high into each "
                         "inference (default: %(default)s)")
    ap.add_argument("--after", type=int, default=12,
                    help="inferences after a rise (default: %(default)s: more than the goodput's "
                         "2 s staleness, after which a device that keeps its work probes the "
                         "link again, takes at ResNet-50's local latency)")
    args = ap.parse_args(argv)
    H.resolve_common(args)
    progress = H.Progress(len(args.models) * (1 + args.rounds * (len(POLICIES) + 1)), "adapt")
    rows: list[dict] = []
    with H.testbed(args) as tb, H.Workdir(args.image_size) as wd:
        described = H.testbed_settings(tb, shaping=(
            "tc tbf on both veth ends, changed in place (tc qdisc replace) mid-inference"
            if tb.mode == "netns" else
            "coacto-client's token bucket, its rate changed mid-inference (Client.set_bandwidth)"))
        for model in args.models:
            case = wd.model(model)
            with H.Server(tb, wd, [case], threads=1) as srv, H.Device(tb, srv, case) as dev:
                dev.calibrate(H.bandwidth_arg(tb, args.high))
                rows += drop(tb, dev, args, progress)
                rows += rise(tb, dev, args, progress)
    progress.close()
    settings = {"models": args.models, "quota": args.quota, "high_mbps": args.high,
                "low_mbps": args.low, "at": args.at, "repeat": args.repeat,
                "rounds": args.rounds, "testbed": described}
    H.write_table(args.out, "adapt", rows, settings)
    plot(rows, args.out, settings)
    for model in args.models:
        local = [r["median_ms"] for r in rows if r["model"] == model and r["policy"] == "local"
                 and r["experiment"] == "drop"]
        ref = statistics.median(local) if local else float("nan")
        for policy in POLICIES:
            xs = [r["median_ms"] for r in rows if r["model"] == model and r["policy"] == policy
                  and r["experiment"] == "drop"]
            if xs:
                print(f"{model} drop {args.high:g}->{args.low:g} Mbit/s: {policy:8} "
                      f"{statistics.median(xs):7.1f} ms  ({statistics.median(xs) / ref:.2f}x local)")
        for r in rows:
            if r["model"] == model and r["experiment"] == "rise":
                print(f"{model} rise {args.low:g}->{args.high:g} Mbit/s, round {r['round']}: "
                      f"before {r['before_median_ms']:.0f} ms ({r['kept_local_before']} kept "
                      f"local); offloaded again at inference {r['first_offloaded_after_rise']} "
                      f"({r['seconds_to_offload']} s); latencies {r['latencies_ms']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
