"""The simulator against real runs: every coacto row of the bandwidth figure (fig_bandwidth.py's
bandwidth.csv and its settings file) simulated with the same settings, sim over real per row.

The simulation (experiments/sim_bridge.py) uses this machine's MEASURED profile (`coacto
profile --engine`: per-layer times of the figure models at 1 and 2 threads, per-class rates,
the per-tile overhead, the device engine's and the server I/O thread's CPU per message and
byte), never anything fitted to these rows; from each row it takes what the real run had: the
measured goodput and RTT, the quota and its CFS period, one device core and thread, the server's
threads and CPUs, tbf's burst under kernel shaping, the client's own FLOP-rate estimates
(device_gflops; server_gflops where the rows have it), and the device's speed in its quota as
measured beside the session (device_probe_ms: the median of local inferences just before and
after its policies; H.run_policies). A core shared with the rest of the host, run 1 ms in every
4, computes 10-30% slower for seconds at a time, and a model near a whole number of CFS periods
then takes one period more or less (MobileNetV2: 24 or 28 ms); the profile's in-quota slowdown
was measured on another minute. That makes the `local` rows close to a restatement of the probe
(they are printed, not hidden); every other policy still depends on the link, the server, the
engines and the plans. sim_profile_device_s is the same simulation with the profile's slowdown,
for comparison. Each fresh client is simulated as
run_policies drives it (its warm-up dynamic inferences, then the round's rotated policies,
repeat inferences each), in the order the real run made them (per model one server; in rows
without server_gflops its announced rate is the simulated server's: its calibration until it
has measured the model, then what it measured, carried from session to session). Per setting
(model, policy, bandwidth) the median of all its simulated inferences is compared with the
median of all its real ones, over every round.

Split plans one cut for the whole inference from the client's goodput estimate, and near a
break-even point the real estimate's noise (a 100 Mbit/s link read as 140-500 Mbit/s after a
burst tbf let through at line rate) picks another cut than the simulated client's: the latency
then differs by the cut, not by the model of time. So split's inferences are planned at the cuts
the real run chose (bandwidth.csv's `cuts` column, when it has one) -- the same planning code
given the same cut, as Client(split_layer=) does -- and the session planned from the simulated
client's own estimates is reported beside it (sim_own_plan_s; --own-cuts judges that instead).
Dynamic's plan of each inference is replayed the same way (the rows' `frontiers`: the device
alone when the engine's gate kept it there, the inputs, a streamed cut or a device share;
policies.plan_dynamic's frontier) -- MobileNetV2 at 100 Mbit/s has a cut, a share and the
device within a few ms of each other, and a goodput read as 85 or as 100 Mbit/s picks another;
the per-tile send decisions inside the plan stay the simulated client's own (the C rule). fl's
stack is fixed by the model.

    python experiments/sim_vs_real.py --out results/ [--real results/bandwidth.csv]
    python experiments/sim_vs_real.py --out /tmp/svr --real /tmp/q1/bandwidth.csv --models resnet50

Writes sim_vs_real.csv (a row per model, policy and bandwidth: the real median over every
inference of the run's rounds beside the simulated one), sim_vs_real_rows.csv (every real row
beside its simulation), their settings files and
sim_vs_real.png under --out and prints the table. Exit status: 0 when every setting is within the
tolerance (20%), 1 when one is not, 2 on
bad usage or unreadable input.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402
import sim_bridge as B  # noqa: E402

TOLERANCE = 0.20


def read_real(path: Path) -> tuple[list[dict], dict]:
    """coacto's rows of a bandwidth.csv and the settings file beside it."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("system", "coacto") == "coacto"]
    settings_path = path.with_name(path.stem + ".settings.json")
    settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    if not rows:
        raise ValueError(f"{path} holds no coacto rows")
    return rows, settings


def compare(real_rows: list[dict], settings: dict, profile: str = B.PROFILE,
            image_size: int | None = None, tolerance: float = TOLERANCE,
            progress=None, replay_cuts: bool = True) -> list[dict]:
    """One row per real row: the simulated median beside the real one. ``replay_cuts``: split's
    inferences are planned at the cuts the real client chose and dynamic's with the plans it
    chose (rows that record them), and the
    simulation planned from its own estimates is kept beside it (sim_own_plan_s)."""
    order = [p for p in H.POLICIES if any(r["policy"] == p for r in real_rows)]
    repeat = int(settings.get("repeat") or 2)
    groups: dict = {}
    for r in real_rows:
        groups.setdefault((r["model"], float(r["nominal_mbps"]), int(float(r.get("round") or 0))),
                          []).append(r)
    out = []
    graphs: dict = {}
    announced: dict = {}  # per model: what its server announces to the next fresh client
    from coacto import sim

    first = "calibrated" if sim.load_profile(profile).calibrated_flops(1) else None
    for model, bw, rnd in B.session_order(groups, settings):
        rows = groups[(model, bw, rnd)]
        if model not in graphs:
            graphs[model] = B.graph(model, image_size, settings.get("model_files"))
        cuts = B.real_cuts(rows) if replay_cuts else {}
        res = B.simulate_session(graphs[model], settings, rows[0], order, repeat, rnd, profile,
                                 cuts=cuts, server_flops=announced.get(model, first))
        # the same session planned from the simulated client's own estimates throughout
        free = B.by_policy(B.simulate_session(
            graphs[model], settings, rows[0], order, repeat, rnd, profile,
            server_flops=announced.get(model, first))) if cuts else None
        # and with the device's speed in its quota as the profile measured it, not as the
        # session's probe did (how far a device drifting with its host moves the rows)
        fixed = B.by_policy(B.simulate_session(
            graphs[model], settings, rows[0], order, repeat, rnd, profile, cuts=cuts,
            server_flops=announced.get(model, first), measured_device=False)) \
            if rows[0].get("device_probe_ms") else None
        announced[model] = res.settings["server_flops_measured"] or \
            res.settings["server_flops_est"]
        sims = B.by_policy(res)
        for r in sorted(rows, key=lambda r: order.index(r["policy"])):
            infs = sims.get(r["policy"], [])
            if not infs:
                continue
            sim_s = statistics.median(i.latency_s for i in infs)
            free_infs = (free or sims).get(r["policy"], infs)
            real_s = float(r["median_ms"]) / 1e3
            ratio = sim_s / real_s
            last = infs[-1]
            out.append({
                "model": model, "policy": r["policy"], "bandwidth_mbps": bw, "round": rnd,
                "measured_up_mbps": float(r["measured_up_mbps"]),
                "rtt_ms": float(r["measured_rtt_ms"]),
                "sim_s": sim_s, "real_s": real_s, "ratio": ratio,
                "within_20pct": abs(ratio - 1.0) <= tolerance,
                "cuts_replayed": r["policy"] in cuts,
                "cuts_real": r.get("cuts", ""),
                "cuts_sim_own": " ".join(str(i.split_layer) for i in free_infs)
                if r["policy"] in ("split", "fl") else "",
                "sim_own_plan_s": statistics.median(i.latency_s for i in free_infs),
                "device_probe_ms": r.get("device_probe_ms"),
                "quota_slowdown": res.settings["quota_slowdown"],
                "sim_profile_device_s": statistics.median(
                    i.latency_s for i in (fixed or sims).get(r["policy"], infs)),
                "sim_ms_each": " ".join(f"{1e3 * i.latency_s:.1f}" for i in infs),
                "real_ms_each": r.get("latencies_ms", ""),
                "tiles_sent_sim": statistics.median(i.tiles_sent for i in infs),
                "tiles_sent_real": r.get("tiles_sent"),
                "tiles_from_server_sim": statistics.median(i.tiles_from_server for i in infs),
                "tiles_from_server_real": r.get("tiles_from_server"),
                "finished_by_sim": ",".join(sorted({i.finished_by for i in infs})),
                "finished_by_real": r.get("finished_by"),
                "server_gflops_announced_sim": res.settings["server_flops_est"] / 1e9,
                "server_gflops_real": r.get("server_gflops"),
                "warmup_inferences": r.get("warmup_inferences"),
                "goodput_est_sim_mbps": last.estimates["bandwidth_est_mbps"],
                "goodput_est_real_mbps": r.get("client_goodput_mbps"),
                "device_gflops": r.get("device_gflops"),
            })
        if progress:
            progress(f"{model} at {bw:g} Mbit/s (round {rnd})")
    return out


def _each(text) -> list[float]:
    return [float(x) for x in str(text or "").split()]


def by_setting(rows: list[dict], tolerance: float) -> list[dict]:
    """Per model, policy and bandwidth: the median of every inference of every round that
    measured it, real and simulated (one inference that took half again, a share's first or a
    slow minute of the throttled device, moves it less than it moves a round's median of two);
    the median of the rounds' medians is kept beside it."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["policy"], r["bandwidth_mbps"]), []).append(r)
    out = []
    for (model, policy, bw), rs in groups.items():
        real_each = [x / 1e3 for r in rs for x in _each(r["real_ms_each"])]
        sim_each = [x / 1e3 for r in rs for x in _each(r["sim_ms_each"])]
        real_rounds = statistics.median(r["real_s"] for r in rs)
        sim_rounds = statistics.median(r["sim_s"] for r in rs)
        # rows from before latencies were listed: the rounds' medians
        real_s = statistics.median(real_each) if real_each else real_rounds
        sim_s = statistics.median(sim_each) if sim_each and real_each else sim_rounds
        own = statistics.median(r["sim_own_plan_s"] for r in rs)
        fixed = statistics.median(r["sim_profile_device_s"] for r in rs)
        out.append({"model": model, "policy": policy, "bandwidth_mbps": bw, "rounds": len(rs),
                    "inferences": len(real_each),
                    "sim_s": sim_s, "real_s": real_s, "ratio": sim_s / real_s,
                    "within_20pct": abs(sim_s / real_s - 1) <= tolerance,
                    "cuts_replayed": any(r["cuts_replayed"] for r in rs),
                    "round_medians_ratio": sim_rounds / real_rounds,
                    "sim_own_plan_s": own, "own_plan_ratio": own / real_rounds,
                    "sim_profile_device_s": fixed, "profile_device_ratio": fixed / real_rounds})
    return out


def plot(out: Path, rows: list[dict], settings: dict, tolerance: float) -> Path:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    colors = {"local": "#555555", "cloud": "#1f77b4", "split": "#2ca02c", "fl": "#9467bd",
              "dynamic": "#d62728"}
    markers = {"resnet50": "o", "vgg16": "s", "mobilenetv2": "^", "bert": "D", "squeezenet": "v"}
    xs = [r["real_s"] * 1e3 for r in rows] + [r["sim_s"] * 1e3 for r in rows]
    lo, hi = min(xs) / 1.5, max(xs) * 1.5
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=1)
    ax.fill_between(line, [v * (1 - tolerance) for v in line], [v * (1 + tolerance) for v in line],
                    color="#dddddd", alpha=0.6, label=f"±{tolerance:.0%}")
    seen = set()
    for r in rows:
        key = (r["model"], r["policy"])
        ax.scatter(r["real_s"] * 1e3, r["sim_s"] * 1e3, color=colors.get(r["policy"], "k"),
                   marker=markers.get(r["model"], "P"), s=36,
                   edgecolors="black" if not r["within_20pct"] else "none",
                   label=None if key in seen else f"{r['model']} {r['policy']}")
        seen.add(key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("real latency (ms, median)")
    ax.set_ylabel("simulated latency (ms, median)")
    n_ok = sum(r["within_20pct"] for r in rows)
    ax.set_title(f"Simulator vs real runs: {n_ok}/{len(rows)} within ±{tolerance:.0%}\n"
                 f"(outlined: outside the band)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.text(0.01, 0.005, H.settings_note(settings, 130), fontsize=5, va="bottom",
             family="monospace")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / "sim_vs_real.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(rows: list[dict], tolerance: float) -> None:
    print(f"{'model':12s} {'policy':8s} {'Mbit/s':>6s} {'rnd':>3s} {'real ms':>9s} "
          f"{'sim ms':>9s} {'sim/real':>8s}  sent r/s   from srv r/s")
    for r in rows:
        flag = "" if r["within_20pct"] else f"  OFF by more than {tolerance:.0%}"
        print(f"{r['model']:12s} {r['policy']:8s} {r['bandwidth_mbps']:6g} {r['round']:3d} "
              f"{r['real_s'] * 1e3:9.1f} {r['sim_s'] * 1e3:9.1f} {r['ratio']:8.2f}  "
              f"{r['tiles_sent_real'] or '-':>4}/{r['tiles_sent_sim']:<4g} "
              f"{r['tiles_from_server_real'] or '-':>4}/{r['tiles_from_server_sim']:<4g}{flag}")
    ok = sum(r["within_20pct"] for r in rows)
    ratios = [r["ratio"] for r in rows]
    print(f"{ok}/{len(rows)} rows within ±{tolerance:.0%}; sim/real median "
          f"{statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="folder for sim_vs_real.csv / .settings.json / .png")
    ap.add_argument("--real", default=None, metavar="CSV",
                    help="the real rows (default: DIR/bandwidth.csv); its .settings.json beside it")
    ap.add_argument("--profile", default=B.PROFILE,
                    help="this machine's measured profile (default: %(default)s)")
    ap.add_argument("--models", default=None, help="only these models (comma-separated)")
    ap.add_argument("--image-size", type=int, default=None, metavar="PX",
                    help="the --image-size the real run was made with, if any")
    ap.add_argument("--quick", action="store_true",
                    help="accepted for run_all.py: the comparison simulates what the real run "
                         "measured, quick or not")
    ap.add_argument("--own-cuts", action="store_true",
                    help="judge split and dynamic rows planned from the simulated client's "
                         "estimates too (default: the cuts and plans the real client chose, "
                         "which the rows record; its own plan is reported beside them either "
                         "way)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                    help="largest |sim/real - 1| a row may show (default %(default)s)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    real_path = Path(args.real) if args.real else out / "bandwidth.csv"
    try:
        real_rows, real_settings = read_real(real_path)
    except (OSError, ValueError, KeyError) as e:
        print(f"sim_vs_real: cannot read the real rows: {e}", file=sys.stderr)
        return 2
    if args.models:
        keep = set(args.models.split(","))
        real_rows = [r for r in real_rows if r["model"] in keep]
    from coacto import sim

    prof = sim.load_profile(args.profile)
    engine = prof.raw.get("engine") or {}
    t0 = time.monotonic()
    rows = compare(real_rows, real_settings, args.profile, args.image_size, args.tolerance,
                   progress=lambda m: print(f"simulated {m}", file=sys.stderr),
                   replay_cuts=not args.own_cuts)
    if not rows:
        print("sim_vs_real: nothing to compare", file=sys.stderr)
        return 2
    layers = sorted((prof.raw.get("layers") or {}))
    settings = {
        "real": str(real_path), "real_written": real_settings.get("written"),
        "real_machine": real_settings.get("machine"), "tolerance": args.tolerance,
        "profile": prof.path or args.profile,
        "profile_measured": {
            "rates_and_layers": prof.source,
            "layer_tables_for": layers,
            "tile_overhead_us": prof.tile_overhead_s * 1e6,
            "engine_costs": engine.get("how", "none: the engines were not charged"),
            "engine_measured": engine.get("measured"),
        },
        "simulated_as": ("per fresh client of the real run: a warm-up dynamic inference, then "
                         "the round's rotated policies, repeat inferences each (estimates carry "
                         "over), after the row's warm-up inferences; link = the row's measured "
                         "goodput and RTT, both directions, "
                         "with tbf's burst under kernel shaping; the device: 1 computing thread "
                         "on 1 core in the settings' quota and CFS period, its engine's costs "
                         "charged to that quota with priority over its tiles; the server: the "
                         "settings' threads on as many cores, its I/O thread's costs charged "
                         "there; the device plans with the row's device_gflops (kept, as the "
                         "device driver's Client keeps it) and server_gflops (what the real "
                         "server announced; older rows: the simulated server's calibration, "
                         "then its measured rate); the client starts from its default "
                         "goodput and the session's probe under kernel shaping"),
        "split_cuts": ("the simulated client's own plan (--own-cuts)" if args.own_cuts else
                       "replayed: each split inference planned at the cut the real client chose "
                       "(the rows' cuts column) and each dynamic one with the plan it chose "
                       "(frontiers), when recorded; sim_own_plan_s is the session planned from "
                       "the simulated client's estimates"),
        "real_settings": {k: real_settings.get(k) for k in
                          ("quota", "server_threads", "device_threads", "repeat", "rounds",
                           "bandwidths_mbps", "testbed")},
        "sim_wall_s": round(time.monotonic() - t0, 2),
    }
    # A row of sim_vs_real.csv is a setting (model, policy, bandwidth): the real side is the
    # median over the rounds that measured it, so one slow minute of the throttled device weighs
    # less; sim_vs_real_rows.csv keeps every real row beside its simulation.
    H.write_table(out, "sim_vs_real_rows", rows, settings)
    per_setting = by_setting(rows, args.tolerance)
    H.write_table(out, "sim_vs_real", per_setting,
                  dict(settings, note="one row per model, policy and bandwidth: the median "
                                      "of every inference of the real run's rounds beside the "
                                      "simulated ones; sim_vs_real_rows.csv has every real row"))
    png = plot(out, per_setting, {"profile": args.profile, "real": str(real_path),
                                  "quota": real_settings.get("quota"),
                                  "tolerance": args.tolerance}, args.tolerance)
    print_table(rows, args.tolerance)
    ok = sum(r["within_20pct"] for r in per_setting)
    print(f"by setting (medians over every round's inferences): {ok}/{len(per_setting)} within "
          f"±{args.tolerance:.0%}" + "".join(
              f"\n  off: {r['model']} {r['policy']} {r['bandwidth_mbps']:g} Mbit/s "
              f"{r['ratio']:.2f}" for r in per_setting if not r["within_20pct"]))
    print(f"wrote {out / 'sim_vs_real.csv'}, {out / 'sim_vs_real_rows.csv'}, {png}")
    return 0 if all(r["within_20pct"] for r in per_setting) else 1


if __name__ == "__main__":
    sys.exit(main())
