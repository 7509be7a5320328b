"""Latency against the server's computing threads (CoActo's Fig. 8): measured at 1 and 2 threads
on this machine, extended to 4-64 cores by the simulator (coacto.sim) on the same tile graphs.

Measured: the testbed as in fig_bandwidth.py at one bandwidth (default 100 Mbit/s); the server
pinned to CPU 1 with one thread, then to CPUs 0-1 with two (its second thread then shares the
device's core, which the CSV says). Simulated: the device profile measured here (`coacto profile`,
or the built-in estimate from the measured device rate) with the same quota, and a server of N
cores of this machine's per-core rate; rows are marked `source=sim`. The CoActo reference's
dynamic runs at the same settings with its server at 1 and 2 computing threads.

    python experiments/fig_server_cores.py --out results/
    python experiments/fig_server_cores.py --quick --models resnet50 --sim-cores 4,16,64
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

POLICIES = ("local", "cloud", "split", "fl", "dynamic")


def measure(args, progress) -> tuple[list[dict], dict]:
    sys.path.insert(0, str(H.HERE))
    from testbed import Testbed

    rows: list[dict] = []
    described = {}
    with H.Workdir(args.image_size) as wd:
        cases = {m: wd.model(m) for m in args.models}
        for threads, cpus in ((1, "1"), (2, "0,1")):
            with Testbed(quota=args.quota, mode=args.mode, server_cpus=cpus,
                         name=args.testbed_name) as tb:
                tb.set_link(args.bandwidth)
                link = tb.measure_link(0.5)
                described[threads] = H.testbed_settings(tb)
                for model in args.models:
                    with H.Server(tb, wd, [cases[model]], threads=threads) as srv, \
                            H.Device(tb, srv, cases[model]) as dev:
                        flops = dev.calibrate()
                        for rnd in range(args.rounds):
                            base = {"source": "real", "model": model, "server_threads": threads,
                                    "server_cpus": cpus, "nominal_mbps": args.bandwidth,
                                    **H.link_columns(link), "device_gflops": flops / 1e9}
                            rows += H.run_policies(dev, args.policies, args.repeat, rnd,
                                                   H.bandwidth_arg(tb, args.bandwidth), base, progress)
                for model in ref_models(args):  # its server with as many computing threads
                    rows.append(H.reference_row(
                        tb, model, "dynamic", args.ref_repeat,
                        {"source": "real", "model": model, "server_threads": threads,
                         "server_cpus": cpus, "nominal_mbps": args.bandwidth,
                         **H.link_columns(link)}, server_threads=threads))
                    progress.step(1, f"coacto-ref {model} dynamic server_threads={threads}")
    return rows, described


def ref_models(args) -> list[str]:
    return [] if args.no_ref else [m for m in args.models if m in H.REF_MODELS]


def simulate(args, real_rows: list[dict]) -> list[dict]:
    """The simulator's rows for args.sim_cores, calibrated from this run's measured rates."""
    try:
        import sim_bridge
    except ImportError:
        return []
    return sim_bridge.server_cores_rows(args, real_rows)


def plot(out: Path, rows: list[dict], settings: dict) -> Path:
    plt = H.pyplot()
    models = [m for m in H.FIGURE_MODELS if any(r["model"] == m for r in rows)] + \
        sorted({r["model"] for r in rows} - set(H.FIGURE_MODELS))
    fig, axes = plt.subplots(1, len(models), figsize=(4.8 * len(models), 4.2), squeeze=False)
    ours = [r for r in rows if (r.get("system") or "coacto") == "coacto"]
    ref = [r for r in rows if (r.get("system") or "coacto") != "coacto"]
    for ax, model in zip(axes[0], models):
        for p in sorted({r["policy"] for r in rows}):
            for source, style in (("real", "-o"), ("sim", ":s")):
                pts = H.medians_by(ours, "server_threads", model=model, policy=p, source=source)
                if pts:
                    ax.plot(list(pts), list(pts.values()), style, label=f"{p} ({source})",
                            color=H.POLICY_COLORS.get(p), lw=2 if p == "dynamic" else 1)
            pts = H.medians_by(ref, "server_threads", model=model, policy=p)
            if pts:
                ax.plot(list(pts), list(pts.values()), "--x", label=f"ref {p}",
                        color=H.POLICY_COLORS.get(p), lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("server threads (cores)")
        ax.set_ylabel("latency (ms, median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Latency vs server cores at {settings['bandwidth_mbps']} Mbit/s "
                 "(measured: 1-2; simulated beyond)")
    return H.save_figure(fig, out, "server_cores", settings, bottom=0.06, top=0.95)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --quick: a CNN and a transformer, so that run_all --quick stays within 20 minutes
    H.add_common_args(ap, quick_models=("resnet50", "bert"))
    ap.add_argument("--bandwidth", type=float, default=100, help="Mbit/s (default: %(default)s)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--sim-cores", default="1,2,4,8,16,32,64", help="simulated server cores")
    ap.add_argument("--profile", default=None, metavar="NAME|PATH",
                    help="the simulator's profile of this machine (default: the shipped "
                         "epyc-avx512-2core; run_all.py measures one when this machine is of "
                         "another kind)")
    H.add_reference_args(ap)
    args = ap.parse_args(argv)
    H.resolve_common(args)
    args.policies = args.policies.split(",")
    args.sim_cores = [int(x) for x in args.sim_cores.split(",") if x]
    if args.ref_repeat is None:
        args.ref_repeat = 3 if args.quick else 6
    progress = H.Progress(2 * len(args.models) * args.rounds * len(args.policies)
                          + 2 * len(ref_models(args)), "server_cores")
    rows, described = measure(args, progress)
    progress.close()
    rows += simulate(args, [r for r in rows if (r.get("system") or "coacto") == "coacto"])
    settings = {"quota": args.quota, "bandwidth_mbps": args.bandwidth, "repeat": args.repeat,
                "rounds": args.rounds, "device_threads": 1, "testbed": described}
    H.write_table(args.out, "server_cores", rows, settings)
    png = plot(args.out, rows, {k: v for k, v in settings.items() if k != "testbed"})
    for model in args.models:
        for p in args.policies:
            pts = H.medians_by([r for r in rows if (r.get("system") or "coacto") == "coacto"],
                               "server_threads", model=model, policy=p, source="real")
            print(f"{model:12s} {p:8s} " + "  ".join(f"{t} thr: {v:.0f} ms" for t, v in pts.items()))
        ref = H.medians_by([r for r in rows if (r.get("system") or "coacto") != "coacto"],
                           "server_threads", model=model, policy="dynamic")
        if ref:
            print(f"{model:12s} {'dynamic':8s} (ref) "
                  + "  ".join(f"{t} thr: {v:.0f} ms" for t, v in ref.items()))
    print(f"wrote {args.out / 'server_cores.csv'}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
