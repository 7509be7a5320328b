"""Latency of every offloading policy vs bandwidth, with a device slower than the server.

How the setup is emulated on one machine (and said in the output and the CSV):
- the server: `coacto-server` pinned to CPU 1 (taskset), one computing thread;
- the device: `coacto-client` pinned to CPU 0 inside a cgroup (v1 `cpu.cfs_quota_us`, a period
  of 1 ms / quota: 4 ms at 25%) limited to `--quota` of one CPU (0.25: a device 4x slower than the server), one
  computing thread; its communication thread runs under the same quota;
- the link: the client's token-bucket shaper at each `--bandwidths` setting (both directions);
  the measured goodput and RTT the client reports are logged beside the nominal setting.
Without root (no cgroup), the device runs unthrottled and the output says so.

Every output is compared with onnxruntime. Writes CSV (+ PNG when matplotlib is installed) and
prints the table with, per bandwidth, dynamic's latency over the best of local, cloud and split
(the schemes deployed today) and over the best of every other policy (fl included).

    python experiments/offload_bandwidth.py --model resnet50 --bandwidths 5,20,100 --rounds 3 --repeat 3
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CGROUP = Path("/sys/fs/cgroup/cpu/coacto-device")
POLICIES = ["local", "cloud", "split", "fl", "dynamic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cgroup(quota: float) -> bool:
    try:
        CGROUP.mkdir(exist_ok=True)
        # A short period: CFS bandwidth control throttles the whole group once its quota for the
        # period is spent, so with the default 100 ms a 25% quota stops the device — its
        # communication thread too — for up to 75 ms at a time, which no slow CPU does. The
        # shortest usable period keeps those stalls to a few ms (the kernel's minimum quota is
        # 1 ms).
        period = max(1000, int(round(1000 / quota)))
        (CGROUP / "cpu.cfs_quota_us").write_text("-1")
        (CGROUP / "cpu.cfs_period_us").write_text(str(period))
        (CGROUP / "cpu.cfs_quota_us").write_text(str(int(period * quota)))
        return True
    except OSError as e:
        print(f"no cgroup CPU quota ({e.strerror}): the device runs unthrottled", file=sys.stderr)
        return False


def bin_path(name: str) -> str:
    found = shutil.which(name)
    if not found:
        sys.exit(f"{name} is not installed: pip install -e . first")
    return found


def start_server(models_dir: Path, port: int, threads: int) -> subprocess.Popen:
    cmd = ["taskset", "-c", "1", bin_path("coacto-server"), "--bind", f"tcp://127.0.0.1:{port}",
           "--threads", str(threads), "--models", str(models_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until it accepts connections
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            sys.exit(f"coacto-server exited: {proc.stderr.read()}")
        time.sleep(0.2)
    proc.kill()
    sys.exit("coacto-server did not start within 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_client(args, model_path: Path, inputs: Path, out_npz: Path, port: int, policy: str,
               bandwidth: str, throttled: bool) -> list[dict]:
    client = [bin_path("coacto-client"), "--server", f"tcp://127.0.0.1:{port}", "--model",
              str(model_path), "--input", str(inputs), "--policy", policy, "--threads", "1",
              "--repeat", str(args.repeat + 1), "--json", "--output", str(out_npz),
              "--timeout", str(args.timeout)]
    if bandwidth != "unlimited":
        client += ["--bandwidth", bandwidth]
    pinned = ["taskset", "-c", "0", *client]
    if throttled:  # join the cgroup, then exec the client (its threads inherit the group)
        cmd = ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "sh", *pinned]
    else:
        cmd = pinned
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.repeat * 120 + 120)
    if r.returncode != 0:
        raise RuntimeError(f"coacto-client {policy} @ {bandwidth} failed: {r.stderr.strip()[-800:]}")
    # The first inference of every client process is a warm-up for every policy alike (some
    # policies calibrate the device first, which would otherwise warm only their caches).
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50", help="zoo model name")
    ap.add_argument("--bandwidths", default="5,20,100", help="Mbit/s, comma-separated")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--repeat", type=int, default=3,
                    help="measured inferences per client run (after one warm-up)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds over all settings (each round runs every policy at every bandwidth)")
    ap.add_argument("--quota", type=float, default=0.25, help="device CPU share of one core")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--out", default="experiments/results", help="folder for CSV / PNG")
    args = ap.parse_args()

    import onnxruntime as ort

    from coacto import zoo

    tmp = Path(tempfile.mkdtemp(prefix="coacto-exp-"))
    models = tmp / "models"
    models.mkdir()
    model = zoo.build(args.model)
    model_path = zoo.save(args.model, models / f"{args.model}.onnx")
    feeds = zoo.input_feeds(model)
    np.savez(tmp / "inputs.npz", **feeds)
    ref = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    ref_names = [o.name for o in model.graph.output]

    throttled = os.geteuid() == 0 and make_cgroup(args.quota)
    port = free_port()
    server = start_server(models, port, args.server_threads)
    rows = []
    runs: dict[tuple[str, str], list[dict]] = {}
    errors: dict[tuple[str, str], float] = {}
    settings = [("unlimited" if bw in ("0", "unlimited") else f"{bw}mbit", policy)
                for bw in args.bandwidths.split(",") for policy in args.policies.split(",")]
    try:
        # Rounds cycle through every setting, so slow drift of the machine (and of the CPU
        # quota's accounting) spreads evenly over the policies instead of landing on one block.
        for rnd in range(args.rounds):
            for rate, policy in settings:
                out_npz = tmp / f"out-{policy}-{rate}.npz"
                print(f"round {rnd + 1}/{args.rounds}: {policy:8s} @ {rate:>9s} ...", file=sys.stderr,
                      flush=True)
                results = run_client(args, model_path, tmp / "inputs.npz", out_npz, port, policy,
                                     rate, throttled)
                runs.setdefault((rate, policy), []).extend(results)
                got = np.load(out_npz)
                err = max(float(np.abs(got[n] - r).max() / np.abs(r).max()) for n, r in zip(ref_names, ref))
                errors[rate, policy] = max(err, errors.get((rate, policy), 0.0))
        for rate, policy in settings:
            results = runs[rate, policy]
            lat = [r["latency_s"] for r in results]
            err = errors[rate, policy]
            rows.append({
                "model": args.model, "policy": policy, "bandwidth": rate,
                "latency_ms": statistics.median(lat) * 1e3,
                "latency_min_ms": min(lat) * 1e3,
                "runs": len(lat),
                "measured_mbps": statistics.median(r.get("bandwidth_est_mbps") or 0 for r in results),
                "rtt_ms": statistics.median(r.get("rtt_est_ms") or 0 for r in results),
                "tiles_sent": statistics.median(r.get("tiles_sent", 0) for r in results),
                "fallback": any(r.get("fallback") for r in results),
                "max_rel_error": err, "match": err <= 1e-4,
                "device": f"1 thread, CPU 0, quota {args.quota if throttled else 'none'}",
                "server": f"{args.server_threads} thread(s), CPU 1",
            })
    finally:
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / f"offload_bandwidth_{args.model}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{args.model}: device {rows[0]['device']}; server {rows[0]['server']}")
    # The bar compares dynamic with the schemes deployed today (local, cloud, split); fl is a
    # tile-level scheme of its own and is reported beside them.
    print(f"{'bandwidth':>10} " + " ".join(f"{p:>9}" for p in args.policies.split(","))
          + "   dynamic/best(local,cloud,split)  dynamic/best(all)  (measured Mbit/s)")
    for bw in dict.fromkeys(r["bandwidth"] for r in rows):
        sub = {r["policy"]: r for r in rows if r["bandwidth"] == bw}
        dyn = sub["dynamic"]["latency_ms"] if "dynamic" in sub else float("nan")
        bar = [sub[p]["latency_ms"] for p in ("local", "cloud", "split") if p in sub]
        every = [sub[p]["latency_ms"] for p in sub if p != "dynamic"]
        r_bar = dyn / min(bar) if bar else float("nan")
        r_all = dyn / min(every) if every else float("nan")
        print(f"{bw:>10} " + " ".join(f"{sub[p]['latency_ms']:9.1f}" for p in args.policies.split(","))
              + f"   {r_bar:31.3f}  {r_all:17.3f}  "
              f"({sub.get('dynamic', next(iter(sub.values())))['measured_mbps']:.1f})")
    print("all outputs match onnxruntime" if all(r["match"] for r in rows) else "MISMATCH in some outputs")
    print(f"wrote {csv_path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        bws = list(dict.fromkeys(r["bandwidth"] for r in rows))
        for p in args.policies.split(","):
            ax.plot(bws, [next(r["latency_ms"] for r in rows if r["policy"] == p and r["bandwidth"] == b)
                          for b in bws], marker="o", label=p)
        ax.set_xlabel("bandwidth cap")
        ax.set_ylabel("latency (ms, median)")
        ax.set_title(f"{args.model}: device {rows[0]['device']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"offload_bandwidth_{args.model}.png", dpi=120)
    except ImportError:
        print("(matplotlib not installed: no PNG)")


if __name__ == "__main__":
    main()
