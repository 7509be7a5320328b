"""``coacto profile --quota Q --period-ms P``: how much slower this machine computes inside a CFS
CPU quota than its quota alone says.

A device emulated by a cgroup quota (the experiments' testbed: 25% of one core, a 4 ms period)
runs 1 ms at full speed, then nothing for 3 ms while other tasks use the core; its caches and
branch predictors are cold again at every period, so a model takes longer than its full-speed
latency over the quota. The simulator's CPU model (coacto.sim.cpu) reproduces the throttling
itself; this measures the rest: zoo models run one thread in a child process pinned to one CPU,
first as it is, then inside a fresh cgroup with the quota and period, and per model the
slowdown s for which the simulator's own throttling (coacto.sim.cpu: full speed in the budget of
each period, nothing after) of back-to-back runs of s x the full-speed latency gives the median
latency measured in the quota (the windows' own cost is not counted twice). The simulator
multiplies the device's CPU demands (its tiles' and its engine's) by the model's
slowdown (the median over the models for another model) when it simulates that quota and period.

Needs root (cgroup v1 ``cpu`` or v2 with the ``cpu`` controller); the group is removed after.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..errors import CoactoError

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


def key(quota: float, period_ms: float) -> str:
    """The profile's key of a quota measurement: '0.25@4ms'."""
    return f"{quota:g}@{period_ms:g}ms"


def _child(models: list[str], runs: int, cpu: int | None) -> int:
    """Compiles, says ready, waits for go (it is in the group by then), runs, prints JSON."""
    from .. import compiler, zoo
    from ..partition import OFFLOAD_MIN_COLUMN_BLOCKS
    from ..runtime import Runtime

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    cases = []
    for m in models:
        onnx_model = zoo.build(m)
        tg = compiler.compile(onnx_model, min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)
        rt = Runtime(tg, threads=1)
        feeds = zoo.input_feeds(onnx_model)
        rt.run(feeds)  # packs the weights
        cases.append((m, tg.graph_id, rt, feeds))
    print("ready", flush=True)
    sys.stdin.readline()
    out = {}
    for m, graph_id, rt, feeds in cases:
        rt.run(feeds)
        lat = []
        for _ in range(runs):
            t0 = time.perf_counter()
            rt.run(feeds)
            lat.append(time.perf_counter() - t0)
        out[m] = {"graph_id": graph_id, "latencies_s": lat}
        rt.close()
    print(json.dumps(out), flush=True)
    return 0


def _run_child(models, runs: int, cpu: int | None, group: Path | None) -> dict:
    argv = [sys.executable, "-m", "coacto.sim.quota", "--child", ",".join(models),
            "--runs", str(runs)] + (["--cpu", str(cpu)] if cpu is not None else [])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise CoactoError(f"the quota measurement's child failed (exit {proc.wait()})")
        if group is not None:
            (group / "cgroup.procs").write_text(str(proc.pid))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not line:
        raise CoactoError("the quota measurement's child gave no result")
    return json.loads(line)


def _make_group(quota: float, period_us: int) -> Path:
    name = f"coacto-profile-{os.getpid()}"
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        path = CGROUP_V1 / name
        path.mkdir()
        (path / "cpu.cfs_quota_us").write_text("-1")
        (path / "cpu.cfs_period_us").write_text(str(period_us))
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(period_us * quota))))
        return path
    if "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
        path = CGROUP_V2 / name
        path.mkdir()
        (path / "cpu.max").write_text(f"{max(1000, round(period_us * quota))} {period_us}")
        return path
    raise OSError("no cgroup cpu controller (v1 cpu, or v2 with cpu) is mounted")


def _remove_group(path: Path) -> None:
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def windowed_latency(demand: float, quota: float, period: float, runs: int) -> float:
    """Median latency of ``runs`` back-to-back jobs of ``demand`` CPU seconds each under the
    quota's CFS windows, as the simulator's CPU model (coacto.sim.cpu) throttles them."""
    from .cpu import Cpu
    from .events import EventLoop

    loop = EventLoop()
    cpu = Cpu(loop, 1.0, quota, period)
    lat = []

    def start():
        t0 = loop.now
        cpu.start_tile(demand, lambda: (lat.append(loop.now - t0),
                                        start() if len(lat) < runs else None))

    start()
    loop.run()
    return statistics.median(lat)


def step_middle(latency, target: float, step: float, lo: float = 0.25, hi: float = 8.0,
                iterations: int = 40) -> float:
    """The factor s for which ``latency(s)`` (a staircase growing with s, whole ``step``s apart,
    as a job's latency under CFS windows grows with its demand) comes nearest ``target`` from
    below, taken in the middle of its step: many factors give the same latency, and the upper
    edge of a step is where a few microseconds of any other cost add a whole step."""
    def last_below(limit: float) -> float:
        a, b = lo, hi
        for _ in range(iterations):
            mid = (a + b) / 2
            if latency(mid) <= limit:
                a = mid
            else:
                b = mid
        return a

    top = last_below(target)
    # within a step the latency still grows a little (the last window's share): the step
    # below is a whole step lower
    bottom = last_below(latency(top) - step / 2)
    return (bottom + top) / 2


def slowdown(full_s: float, quota_s: float, quota: float, period: float, runs: int) -> float:
    """The factor s for which jobs of s x ``full_s`` CPU seconds take ``quota_s`` under the
    simulator's CFS windows (the middle of that step): what the windows alone do not explain."""
    return step_middle(lambda s: windowed_latency(s * full_s, quota, period, runs), quota_s,
                       period, iterations=60)


def measure_quota(quota: float, period_ms: float, models, runs: int = 5, rounds: int = 3,
                  cpu: int | None = None, progress=lambda m: None) -> dict:
    """The profile's entry for this quota (see the module text). ``rounds`` alternations of a
    full-speed and an in-quota child, ``runs`` runs of each model in each; the medians pool
    every round (a core shared with the rest of the host drifts by several percent within
    minutes)."""
    if not (0 < quota < 1) or not period_ms > 0:
        raise CoactoError(f"quota {quota!r} must lie in (0, 1) cores and the period "
                          f"{period_ms!r} ms be positive")
    if os.geteuid() != 0:
        raise CoactoError("measuring under a CPU quota makes a cgroup: run as root (or leave "
                          "out --quota)")
    usable = sorted(os.sched_getaffinity(0))
    cpu = usable[0] if cpu is None else cpu
    models = list(models)
    full = {m: [] for m in models}
    capped = {m: [] for m in models}
    graph_ids = {}
    for rnd in range(rounds):
        progress(f"quota {key(quota, period_ms)}, round {rnd + 1}/{rounds}: "
                 f"{', '.join(models)} at full speed on CPU {cpu}, then in the quota ...")
        for m, v in _run_child(models, runs, cpu, None).items():
            full[m] += v["latencies_s"]
            graph_ids[m] = v["graph_id"]
        try:
            group = _make_group(quota, round(period_ms * 1000))
        except OSError as e:
            raise CoactoError(f"cannot make a cgroup for the quota ({e}); run as root on a "
                              f"machine with the cgroup cpu controller") from None
        try:
            for m, v in _run_child(models, runs, cpu, group).items():
                capped[m] += v["latencies_s"]
        finally:
            _remove_group(group)
    per_model = {}
    period = period_ms / 1e3
    for m in models:
        lf, lq = statistics.median(full[m]), statistics.median(capped[m])
        per_model[m] = {"graph_id": graph_ids[m], "full_ms": lf * 1e3, "quota_ms": lq * 1e3,
                        "quota_ms_range": [min(capped[m]) * 1e3, max(capped[m]) * 1e3],
                        "throttled_ms": windowed_latency(lf, quota, period, runs) * 1e3,
                        "slowdown": slowdown(lf, lq, quota, period, runs)}
    slow = [v["slowdown"] for v in per_model.values()]
    return {"quota": quota, "period_ms": period_ms, "cpu": cpu, "runs": runs,
            "rounds": rounds, "slowdown": statistics.median(slow), "models": per_model,
            "measured": time.strftime("%Y-%m-%d"),
            "how": (f"`coacto profile --quota {quota:g} --period-ms {period_ms:g}`: "
                    f"{', '.join(models)} on 1 thread pinned to CPU {cpu}, {rounds} rounds of "
                    f"{runs} runs at full speed and then {runs} in a cgroup with cfs quota "
                    f"{quota:g} x period {period_ms:g} ms, medians over all rounds; slowdown: "
                    f"the factor on the full-speed CPU time for which the simulator's CFS "
                    f"windows give the latency measured in the quota")}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m coacto.sim.quota")
    ap.add_argument("--child", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=None)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child.split(","), args.runs, args.cpu)
    return 2


if __name__ == "__main__":
    sys.exit(main())
