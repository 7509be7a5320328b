"""The figures this machine cannot hold, from the simulator (coacto.sim) with the paper's device
and server: a Raspberry Pi 4 (4 cores) offloading to a 64-core Threadripper 3990X.

* ``sim_cores``: latency against the server's cores (4-64) at one bandwidth (CoActo's Fig. 8);
* ``sim_devices``: 1, 4, 16 and 64 devices, each on its own link, sharing one 64-core server:
  p50, p95 and throughput per policy (the multi-tenant figure);
* ``sim_bandwidth``: latency against the link's bandwidth, 1-200 Mbit/s (Fig. 9);
* ``sim_traces``: links that follow the SYNTHETIC LTE-like and Wi-Fi-like traces
  (coacto.sim.lte_trace / wifi_trace: seeded random walks, no data set): the latency
  distribution per policy over many inferences.

Every policy (local, cloud, split, fl, dynamic); CSV + PNG + settings each. The profiles of the
Raspberry Pi 4 and the 3990X are DERIVED from public figures (profiles/*.json say how); their
communication engines' CPU costs are this machine's MEASURED costs (`coacto profile --engine`,
profiles/epyc-avx512-2core.json) times ``--device-engine-scale`` (an ASSUMPTION: interpreted
Python on a 1.5 GHz Cortex-A72 against a Zen 3 core; default 5) and ``--server-engine-scale``
(default 1, Zen 2 against Zen 3). The simulator was checked against real runs on this machine
(experiments/sim_vs_real.py, docs/SIMULATOR.md); quote these numbers with that check.

    python experiments/fig_sim.py --out results/            # full sweep (several minutes)
    python experiments/fig_sim.py --out /tmp/sim --quick    # fewer settings, about 2 minutes

Prints, per model and bandwidth, dynamic's latency over the best baseline's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

DEVICE = "raspberry-pi-4"
SERVER = "threadripper-3990x"
ENGINE_PROFILE = "epyc-avx512-2core"
CORES = (4, 8, 16, 32, 64)
DEVICES = (1, 4, 16, 64)
BANDWIDTHS = (1, 2, 5, 10, 20, 50, 100, 200)
QUICK_BANDWIDTHS = (1, 5, 20, 100, 200)
COLORS = {"local": "#555555", "cloud": "#1f77b4", "split": "#2ca02c", "fl": "#9467bd",
          "dynamic": "#d62728"}


def sim_kwargs(args) -> dict:
    engine = args.profile or ENGINE_PROFILE
    return {"device": DEVICE, "server": SERVER, "device_costs": engine,
            "server_costs": engine, "device_costs_scale": args.device_engine_scale,
            "server_costs_scale": args.server_engine_scale}


def run(tg, policy, args, inferences: int, **kw):
    from coacto import sim

    kwargs = sim_kwargs(args)
    kwargs.update(kw)
    kwargs.setdefault("rtt_ms", args.rtt)
    kwargs.setdefault("server_cores", 64)
    return sim.simulate(tg, policy, inferences=inferences + 1, warmup=1, seed=args.seed,
                        **kwargs)


def row(model, policy, r, **extra) -> dict:
    s = r.summary()
    return {"model": model, "policy": policy, **extra, "p50_ms": s["p50_ms"],
            "p95_ms": s["p95_ms"], "mean_ms": s["mean_ms"],
            "throughput_per_s": s["throughput_per_s"], "inferences": s["inferences"],
            "tiles_sent": s["tiles_sent"], "tiles_server": s["tiles_server"],
            "fallbacks": s["fallbacks"],
            "finished_by_server": s["finished_by"]["server"] + s["finished_by"]["both"]}


# ----------------------------------------------------------------------------- the sweeps

def sweep_cores(args, graphs, progress) -> list[dict]:
    rows = []
    for model, tg in graphs.items():
        for cores in args.cores:
            for p in args.policies:
                r = run(tg, p, args, args.inferences, server_cores=cores,
                        bandwidth_mbps=args.bandwidth)
                rows.append(row(model, p, r, server_cores=cores, bandwidth_mbps=args.bandwidth))
                progress.step(1, f"cores {model} {p} {cores}")
    return rows


def sweep_devices(args, graphs, progress) -> list[dict]:
    rows = []
    for model, tg in graphs.items():
        if model not in args.device_models:
            continue
        for n in args.devices:
            for p in args.policies:
                r = run(tg, p, args, args.device_inferences, devices=n,
                        bandwidth_mbps=args.bandwidth, start_jitter_s=0.05)
                rows.append(row(model, p, r, devices=n, server_cores=64,
                                bandwidth_mbps=args.bandwidth,
                                server_busy_s=r.settings["server_busy_s"]))
                progress.step(1, f"devices {model} {p} {n}")
    return rows


def sweep_bandwidth(args, graphs, progress) -> list[dict]:
    rows = []
    for model, tg in graphs.items():
        for bw in args.bandwidths:
            for p in args.policies:
                r = run(tg, p, args, args.inferences, bandwidth_mbps=bw)
                rows.append(row(model, p, r, bandwidth_mbps=bw, server_cores=64))
                progress.step(1, f"bandwidth {model} {p} {bw}")
    return rows


def sweep_traces(args, graphs, progress) -> list[dict]:
    rows = []
    for model, tg in graphs.items():
        for name, rtt in (("lte", args.lte_rtt), ("wifi", args.rtt)):
            for p in args.policies:
                r = run(tg, p, args, args.trace_inferences, trace=name, rtt_ms=rtt)
                lat = np.array([i.latency_s * 1e3 for i in r.measured])
                rows.append(row(model, p, r, trace=name, rtt_ms=rtt, server_cores=64,
                                p5_ms=float(np.percentile(lat, 5)),
                                p25_ms=float(np.percentile(lat, 25)),
                                p75_ms=float(np.percentile(lat, 75)),
                                max_ms=float(lat.max()),
                                latencies_ms=" ".join(f"{x:.1f}" for x in lat)))
                progress.step(1, f"trace {name} {model} {p}")
    return rows


# ----------------------------------------------------------------------------- figures

def _models(rows):
    return [m for m in H.FIGURE_MODELS if any(r["model"] == m for r in rows)] + \
        sorted({r["model"] for r in rows} - set(H.FIGURE_MODELS))


def _grid(plt, n):
    cols = min(2, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4 * nrows + 0.8), squeeze=False)
    return fig, axes


def _finish(plt, fig, axes, n, title, settings, out: Path, name: str) -> Path:
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.005, H.settings_note(settings, 160), fontsize=5.5, va="bottom",
             family="monospace")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_lines(out, rows, x, xlabel, name, title, settings, logx=True) -> Path:
    plt = H.pyplot()
    models = _models(rows)
    fig, axes = _grid(plt, len(models))
    for ax, model in zip(axes.flat, models):
        for p in COLORS:
            pts = sorted((r[x], r["p50_ms"]) for r in rows if r["model"] == model
                         and r["policy"] == p)
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], "-o", color=COLORS[p],
                        lw=2 if p == "dynamic" else 1.2, ms=3, label=p)
        if logx:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("latency (ms, p50, simulated)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(plt, fig, axes, len(models), title, settings, out, name)


def plot_devices(out, rows, settings) -> Path:
    plt = H.pyplot()
    models = _models(rows)
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models) + 0.8), squeeze=False)
    for (ax_l, ax_t), model in zip(axes, models):
        for p in COLORS:
            pts = sorted((r["devices"], r["p50_ms"], r["p95_ms"], r["throughput_per_s"])
                         for r in rows if r["model"] == model and r["policy"] == p)
            if not pts:
                continue
            n = [a[0] for a in pts]
            ax_l.plot(n, [a[1] for a in pts], "-o", color=COLORS[p], ms=3, label=f"{p} p50")
            ax_l.plot(n, [a[2] for a in pts], ":", color=COLORS[p], lw=1, label=f"{p} p95")
            ax_t.plot(n, [a[3] for a in pts], "-o", color=COLORS[p], ms=3, label=p)
        for ax, ylab in ((ax_l, "latency (ms, simulated)"), (ax_t, "inferences / s, all devices")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("devices sharing the 64-core server")
            ax.set_ylabel(ylab)
            ax.set_title(model)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    return _finish(plt, fig, axes, 2 * len(models), "Devices on one 64-core server "
                   "(simulated: p50 solid, p95 dotted; throughput)", settings, out, "sim_devices")


def plot_traces(out, rows, settings) -> Path:
    plt = H.pyplot()
    models = _models(rows)
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models) + 0.8),
                             squeeze=False)
    for axrow, model in zip(axes, models):
        for ax, trace in zip(axrow, ("lte", "wifi")):
            data, labels = [], []
            for p in COLORS:
                r = next((r for r in rows if r["model"] == model and r["trace"] == trace
                          and r["policy"] == p), None)
                if r:
                    data.append([float(v) for v in r["latencies_ms"].split()])
                    labels.append(p)
            if data:
                parts = ax.boxplot(data, tick_labels=labels, whis=(5, 95), showfliers=True,
                                   patch_artist=True)
                for patch, p in zip(parts["boxes"], labels):
                    patch.set_facecolor(COLORS[p])
                    patch.set_alpha(0.5)
            ax.set_yscale("log")
            ax.set_ylabel("latency (ms, simulated)")
            ax.set_title(f"{model}, synthetic {'LTE' if trace == 'lte' else 'Wi-Fi'}-like link")
            ax.grid(True, axis="y", which="both", alpha=0.3)
    return _finish(plt, fig, axes, 2 * len(models), "Latency over synthetic LTE-like and Wi-Fi-"
                   "like bandwidth traces (boxes: quartiles, whiskers: p5-p95)", settings, out,
                   "sim_traces")


# ----------------------------------------------------------------------------- headline

def headline(rows: list[dict], policies, at=(5, 20, 100)) -> list[dict]:
    """Per model and bandwidth: dynamic's p50 over the best baseline's."""
    out = []
    for model in _models(rows):
        for bw in at:
            med = {r["policy"]: r["p50_ms"] for r in rows
                   if r["model"] == model and r["bandwidth_mbps"] == bw}
            base = {p: v for p, v in med.items() if p != "dynamic"}
            if "dynamic" not in med or not base:
                continue
            best = min(base, key=base.get)
            out.append({"model": model, "bandwidth_mbps": bw, "dynamic_ms": med["dynamic"],
                        "best_baseline": best, "best_ms": base[best],
                        "dynamic_over_best": med["dynamic"] / base[best],
                        **{f"{p}_ms": v for p, v in med.items()}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="experiments/results", metavar="DIR")
    ap.add_argument("--quick", action="store_true",
                    help="fewer settings and inferences (about two minutes)")
    ap.add_argument("--models", default=",".join(H.FIGURE_MODELS))
    ap.add_argument("--policies", default=",".join(H.POLICIES))
    ap.add_argument("--figures", default="cores,devices,bandwidth,traces",
                    help="which of cores, devices, bandwidth, traces")
    ap.add_argument("--bandwidth", type=float, default=100.0,
                    help="Mbit/s of the cores and devices figures (default %(default)s)")
    ap.add_argument("--rtt", type=float, default=10.0,
                    help="round-trip ms of the constant links and the Wi-Fi-like trace")
    ap.add_argument("--lte-rtt", type=float, default=40.0, help="round-trip ms of the LTE-like trace")
    ap.add_argument("--device-engine-scale", type=float, default=5.0,
                    help="the device engine's CPU costs: this machine's times this "
                         "(an assumption, default %(default)s)")
    ap.add_argument("--server-engine-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, metavar="NAME|PATH",
                    help="the profile whose measured engine costs are scaled (default: "
                         f"{ENGINE_PROFILE}; run_all.py passes this machine's)")
    args = ap.parse_args(argv)
    args.out = Path(args.out)
    args.models = [m for m in args.models.split(",") if m]
    args.policies = [p for p in args.policies.split(",") if p]
    figures = [f for f in args.figures.split(",") if f]
    unknown = [f for f in figures if f not in ("cores", "devices", "bandwidth", "traces")]
    if unknown:
        ap.error(f"unknown figure(s) {', '.join(unknown)}: choose from cores, devices, "
                 "bandwidth, traces")
    q = args.quick
    args.cores = CORES
    args.devices = DEVICES
    args.bandwidths = QUICK_BANDWIDTHS if q else BANDWIDTHS
    args.inferences = 3 if q else 8
    args.device_inferences = 2 if q else 5
    args.trace_inferences = 30 if q else 150
    args.device_models = args.models[:2] if q else args.models
    from coacto import sim

    graphs = {m: sim.resolve_graph(m) for m in args.models}
    n_models = len(graphs)
    units = {"cores": n_models * len(args.cores), "bandwidth": n_models * len(args.bandwidths),
             "devices": len(args.device_models) * len(args.devices), "traces": n_models * 2}
    progress = H.Progress(sum(units[f] for f in figures) * len(args.policies), "fig_sim")
    base = {"device": DEVICE, "server": SERVER, "device_threads": 4,
            "device_profile_source": sim.load_profile(DEVICE).source,
            "server_profile_source": sim.load_profile(SERVER).source,
            "engine_costs": f"{args.profile or ENGINE_PROFILE} (measured here), device x"
                            f"{args.device_engine_scale:g} and server x"
                            f"{args.server_engine_scale:g} (assumed scales)",
            "engine_costs_how": (sim.load_profile(args.profile or ENGINE_PROFILE).raw
                                 .get("engine") or {}).get("how"),
            "rtt_ms": args.rtt, "quick": q, "seed": args.seed,
            "validated_by": "experiments/sim_vs_real.py on this machine (docs/SIMULATOR.md)"}
    t0 = time.monotonic()
    written = []
    if "cores" in figures:
        rows = sweep_cores(args, graphs, progress)
        st = dict(base, bandwidth_mbps=args.bandwidth, inferences=args.inferences)
        H.write_table(args.out, "sim_cores", rows, st)
        written.append(plot_lines(args.out, rows, "server_cores", "server cores", "sim_cores",
                                  f"Latency vs server cores at {args.bandwidth:g} Mbit/s "
                                  f"(simulated: RPi 4 + 3990X)", _note(st)))
    if "devices" in figures:
        rows = sweep_devices(args, graphs, progress)
        st = dict(base, bandwidth_mbps=args.bandwidth, inferences_per_device=args.device_inferences,
                  server_cores=64, start_jitter_s=0.05)
        H.write_table(args.out, "sim_devices", rows, st)
        written.append(plot_devices(args.out, rows, _note(st)))
    table = []
    if "bandwidth" in figures:
        rows = sweep_bandwidth(args, graphs, progress)
        st = dict(base, server_cores=64, inferences=args.inferences)
        H.write_table(args.out, "sim_bandwidth", rows, st)
        written.append(plot_lines(args.out, rows, "bandwidth_mbps", "link bandwidth (Mbit/s)",
                                  "sim_bandwidth", "Latency vs bandwidth (simulated: RPi 4 + "
                                  "3990X, 64 cores)", _note(st)))
        table = headline(rows, args.policies)
        if table:
            H.write_table(args.out, "sim_headline", table, st)
    if "traces" in figures:
        rows = sweep_traces(args, graphs, progress)
        st = dict(base, server_cores=64, inferences=args.trace_inferences,
                  lte_rtt_ms=args.lte_rtt,
                  traces="SYNTHETIC LTE-like (mean 12 Mbit/s, fades) and Wi-Fi-like (mean 60 "
                         "Mbit/s, dips) random walks, coacto.sim.link; no data set")
        H.write_table(args.out, "sim_traces", rows, st)
        written.append(plot_traces(args.out, rows, _note(st)))
    progress.close()
    for t in table:
        print(f"{t['model']:12s} {t['bandwidth_mbps']:5g} Mbit/s: dynamic {t['dynamic_ms']:8.1f} "
              f"ms, best baseline {t['best_baseline']:7s} {t['best_ms']:8.1f} ms -> "
              f"{t['dynamic_over_best']:.2f}x")
    print(f"wrote {', '.join(str(p) for p in written)} ({time.monotonic() - t0:.0f} s)")
    return 0


def _note(settings: dict) -> dict:
    return {k: v for k, v in settings.items()
            if k not in ("device_profile_source", "server_profile_source", "engine_costs_how")}


if __name__ == "__main__":
    sys.exit(main())
