"""Latency against tiles per layer (CoActo's Fig. 12): how fine the tiles must be for the device
and the server to overlap, and where per-tile overheads start to cost.

The testbed as in fig_bandwidth.py at one bandwidth (default 100 Mbit/s). For each tile count the
device compiles the model with `--tiles T` (the server compiles the same graph on demand: the
graph id carries the parameters); `default` is coacto's own choice per layer. The CoActo
reference runs its own tile graphs (20-200 tiles per layer; BERT 20 and 50) at the same settings.

    python experiments/fig_tiles.py --out results/
    python experiments/fig_tiles.py --quick --models resnet50 --tiles 4,16,64
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

FULL_TILES = (1, 2, 4, 8, 16, 32, 64)
QUICK_TILES = (2, 8, 32)
POLICIES = ("local", "cloud", "dynamic")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --quick: a CNN and a transformer, so that run_all --quick stays within 20 minutes
    H.add_common_args(ap, quick_models=("resnet50", "bert"))
    ap.add_argument("--bandwidth", type=float, default=100, help="Mbit/s (default: %(default)s)")
    ap.add_argument("--tiles", default=None, metavar="T,T",
                    help=f"tiles per layer (default: {','.join(map(str, FULL_TILES))}; --quick: "
                         f"{','.join(map(str, QUICK_TILES))}); 0 = coacto's default")
    ap.add_argument("--policies", default=",".join(POLICIES))
    H.add_reference_args(ap)
    args = ap.parse_args(argv)
    H.resolve_common(args)
    args.policies = args.policies.split(",")
    tiles = [int(x) for x in args.tiles.split(",")] if args.tiles else \
        list(QUICK_TILES if args.quick else FULL_TILES)
    ref_runs = {m: ref_plan(m, args) for m in args.models}
    progress = H.Progress(len(args.models) * len(tiles) * args.rounds * len(args.policies)
                          + sum(len(v) for v in ref_runs.values()), "tiles")
    rows: list[dict] = []
    with H.testbed(args) as tb, H.Workdir(args.image_size) as wd:
        tb.set_link(args.bandwidth)
        link = tb.measure_link(0.5)
        described = H.testbed_settings(tb)
        for model in args.models:
            case = wd.model(model)
            with H.Server(tb, wd, [case], threads=1) as srv:
                for rnd in range(args.rounds):
                    for t in (tiles if rnd % 2 == 0 else tiles[::-1]):
                        with H.Device(tb, srv, case, tiles=t or None) as dev:
                            flops = dev.calibrate()
                            base = {"model": model, "tiles_per_layer": t or "default",
                                    "nominal_mbps": args.bandwidth, **H.link_columns(link),
                                    "device_gflops": flops / 1e9}
                            rows += H.run_policies(dev, args.policies, args.repeat, rnd,
                                                   H.bandwidth_arg(tb, args.bandwidth), base, progress)
            for policy, t in ref_runs[model]:  # its own tile graphs, at the same link and quota
                rows.append(H.reference_row(tb, model, policy, args.ref_repeat,
                                            {"model": model, "tiles_per_layer": t,
                                             "nominal_mbps": args.bandwidth,
                                             **H.link_columns(link)}, tiles=t))
                progress.step(1, f"coacto-ref {model} {policy} T={t}")
    progress.close()
    settings = {"quota": args.quota, "bandwidth_mbps": args.bandwidth, "repeat": args.repeat,
                "rounds": args.rounds, "server_threads": 1, "device_threads": 1,
                "testbed": described}
    H.write_table(args.out, "tiles", rows, settings)
    png = plot(args.out, rows, {k: v for k, v in settings.items() if k != "testbed"})
    for model in args.models:
        for system in sorted({r["system"] for r in rows}, key=lambda s: s != "coacto"):
            for p in args.policies:
                pts = H.medians_by(rows, "tiles_per_layer", model=model, policy=p, system=system)
                if pts:
                    print(f"{model:12s} {p:8s} {'' if system == 'coacto' else '(ref) '}"
                          + "  ".join(f"T={t}: {v:.0f} ms" for t, v in pts.items()))
    print(f"wrote {args.out / 'tiles.csv'}, {png}")
    return 0


def ref_plan(model: str, args) -> list[tuple[str, int]]:
    """(policy, tiles) runs of the CoActo reference for ``model``: the tile graphs it ships."""
    if args.no_ref or model not in H.REF_MODELS:
        return []
    if args.ref_repeat is None:
        args.ref_repeat = 3 if args.quick else 6
    shipped = H.REF_TILES[model]
    tiles = (shipped[0], shipped[-1]) if args.quick else shipped
    policies = ("dynamic",) if args.quick else ("local", "dynamic")
    return [(p, t) for p in policies for t in tiles]


def plot(out: Path, rows: list[dict], settings: dict) -> Path:
    plt = H.pyplot()
    models = [m for m in H.FIGURE_MODELS if any(r["model"] == m for r in rows)] or \
        sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.8 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for system in sorted({r["system"] for r in rows}, key=lambda s: s != "coacto"):
            ours = system == "coacto"
            for p in sorted({r["policy"] for r in rows if r["system"] == system}):
                pts = {k: v for k, v in H.medians_by(rows, "tiles_per_layer", model=model, policy=p,
                                                     system=system).items() if k != "default"}
                if pts:
                    ax.plot(list(pts), list(pts.values()), "-o" if ours else "--x",
                            label=p if ours else f"ref {p}", color=H.POLICY_COLORS.get(p),
                            lw=2 if p == "dynamic" else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(model)
        ax.set_xlabel("tiles per layer")
        ax.set_ylabel("latency (ms, median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Latency vs tiles per layer at {settings['bandwidth_mbps']} Mbit/s "
                 "(coacto solid, the CoActo reference dashed)")
    return H.save_figure(fig, out, "tiles", settings, bottom=0.06, top=0.95)


if __name__ == "__main__":
    sys.exit(main())
