"""Every figure of the experiments, one after the other, into one folder.

    python experiments/run_all.py --out results/            # the full sweep (hours)
    python experiments/run_all.py --quick --out /tmp/quick  # a reduced sweep of every figure
    python experiments/run_all.py --quick --only bandwidth,sim_vs_real --out /tmp/q

Runs, each as its own process (a figure that fails is reported and the others still run):
  bandwidth     fig_bandwidth.py     latency vs 5..200 Mbit/s, all policies, the CoActo reference
  server_cores  fig_server_cores.py  latency vs server threads (1-2 measured, 4-64 simulated)
  multitenant   fig_multitenant.py   1-8 devices with distinct models: p50/p95, throughput
  tiles         fig_tiles.py         latency vs tiles per layer
  timeline      fig_timeline.py      one dynamic inference, device and server side by side
  sim_vs_real   sim_vs_real.py       the simulator against the bandwidth figure's real rows
  sim           fig_sim.py           from the simulator: a Raspberry Pi 4 and a 64-core server
                                     (4-64 cores, 1-64 devices, 1-200 Mbit/s, LTE/Wi-Fi traces)

Each leaves NAME.csv, NAME.settings.json (settings, machine, testbed) and NAME.png under --out.

The simulator's figures (server_cores' 4-64 cores, sim_vs_real, sim) need a profile of this
machine (`coacto profile`: per-layer times, the engines' CPU costs, the in-quota slowdown). The
shipped one (profiles/epyc-avx512-2core.json) is used when this machine is of its kind (the
same CPU model, core count and GEMM kernel); otherwise one is measured first into
DIR/profile.json (a few minutes), or give one with --profile.
Needs root for kernel shaping and the CPU quota (without it, the client's token bucket on an
unthrottled device, and every file says so). Exit status: 0 when every figure was written.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness as H  # noqa: E402

#: name -> (script, expected seconds with --quick, expected seconds in full, whether it runs on
#: the testbed, whether it simulates with this machine's profile) for the ETA and the arguments
FIGURES = {
    "bandwidth": ("fig_bandwidth.py", 750, 1500, True, False),
    "server_cores": ("fig_server_cores.py", 150, 900, True, True),
    "multitenant": ("fig_multitenant.py", 60, 1200, True, False),
    "tiles": ("fig_tiles.py", 140, 900, True, False),
    "timeline": ("fig_timeline.py", 40, 60, True, False),
    "sim_vs_real": ("sim_vs_real.py", 40, 90, False, True),
    "sim": ("fig_sim.py", 60, 600, False, True),
}
#: expected seconds of measuring a profile (quick, full)
PROFILE_S = (240, 420)
#: the models a measured profile covers: the figures' and two that rate every op class
PROFILE_MODELS = "resnet50,vgg16,mobilenetv2,bert,densenet_block,mobilenetv3_block"


def measure_profile(out: Path, quick: bool, quota: float | None) -> Path | None:
    """`coacto profile` of this machine into out/profile.json; None if it failed."""
    import os

    path = out / "profile.json"
    cmd = [sys.executable, "-m", "coacto", "profile", "--name", "this-machine",
           "--models", PROFILE_MODELS, "--threads", "1,2", "--runs", "3" if quick else "5",
           "--engine", "-o", str(path)]
    if quota and quota < 1 and os.geteuid() == 0:
        # the testbed's CFS period for this quota (experiments/testbed.py)
        period_ms = max(1000, round(1000 / quota)) / 1000
        cmd += ["--quota", str(quota), "--period-ms", f"{period_ms:g}"]
    print(f"\n== profile: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    if subprocess.call(cmd) != 0 or not path.exists():
        return None
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for every figure's files")
    ap.add_argument("--quick", action="store_true", help="the reduced sweep of every figure")
    ap.add_argument("--only", default=",".join(FIGURES), metavar="NAME,..",
                    help="figures to make (default: all: %(default)s)")
    ap.add_argument("--mode", choices=("auto", "netns", "shaper"), default="auto")
    ap.add_argument("--quota", type=float, default=0.25)
    ap.add_argument("--profile", default=None, metavar="NAME|PATH",
                    help="the simulator's profile of this machine (default: the shipped one if "
                         "this machine is of its kind, else measured into DIR/profile.json)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        ap.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    expected = {n: FIGURES[n][1 if args.quick else 2] for n in names}
    profile = args.profile
    simulates = any(FIGURES[n][4] for n in names)
    if simulates and profile is None:
        import sim_bridge

        fits, why = sim_bridge.profile_fits()
        print(f"run_all: {why}" + ("" if fits else "; measuring this machine's first"),
              file=sys.stderr, flush=True)
        if fits:
            profile = sim_bridge.PROFILE
        else:
            expected = {"profile": PROFILE_S[0 if args.quick else 1], **expected}
    progress = H.Progress(sum(expected.values()), "run_all")
    failed = []
    t_start = time.monotonic()
    if simulates and profile is None:
        t0 = time.monotonic()
        measured = measure_profile(out, args.quick, args.quota)
        if measured is None:
            failed.append("profile")
            print("== profile FAILED: the simulated figures use the shipped profile, of another "
                  "machine", file=sys.stderr, flush=True)
        profile = str(measured) if measured else None
        progress.step(expected["profile"], f"profile done in {H.fmt_s(time.monotonic() - t0)}")
    for n in names:
        script = HERE / FIGURES[n][0]
        cmd = [sys.executable, str(script), "--out", str(out)]
        if FIGURES[n][3]:
            cmd += ["--mode", args.mode, "--quota", str(args.quota)]
        if FIGURES[n][4] and profile:
            cmd += ["--profile", profile]
        if args.quick:
            cmd.append("--quick")
        print(f"\n== {n}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd)
        took = time.monotonic() - t0
        if rc != 0:
            failed.append(n)
            print(f"== {n} FAILED (exit {rc}) after {H.fmt_s(took)}", file=sys.stderr, flush=True)
        progress.step(expected[n], f"{n} done in {H.fmt_s(took)}")
    progress.close()
    written = sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png"))
    figures_failed = [n for n in failed if n in names]
    print(f"\n{len(names) - len(figures_failed)}/{len(names)} figures in "
          f"{H.fmt_s(time.monotonic() - t_start)}"
          f" -> {out}: {', '.join(written)}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
