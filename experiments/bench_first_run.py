"""The first inference after loading, in fresh processes: its latency against the steady state's,
and where the computing threads were when it woke them.

Each of `--processes` child processes builds the model, creates a Runtime (which runs its
warm-up), notes the CPU each computing thread last ran on, times one inference (the first a
user would run) with its tiles' start times recorded, then times `--repeat` more back to back. A process whose threads all sat on one
CPU shows how long the last of them took to start (the runtime's `unstack`, runtime.c, moves a
worker that computes alone while the others cannot run). Prints one line per process and the
spread of first / steady.

    python experiments/bench_first_run.py [--model mobilenetv2] [--threads 2] [--processes 12]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
import numpy as np
from coacto import compiler, zoo
from coacto.runtime import Runtime

name, threads, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = zoo.build(name)
feeds = zoo.input_feeds(model)
tg = compiler.compile(model, threads=threads)
before = set(os.listdir("/proc/self/task"))
rt = Runtime(tg, threads=threads)
workers = sorted(set(os.listdir("/proc/self/task")) - before, key=int)

def cpu(tid):
    with open(f"/proc/self/task/{tid}/stat") as f:
        s = f.read()
    return int(s[s.rindex(")") + 2:].split()[36])

cpus = [cpu(t) for t in workers]
rt._native.set_profiling(True)  # tile start times, read after the timed run
t0 = time.perf_counter()
rt.run(feeds)
first = time.perf_counter() - t0
t_start, _t_end, worker = rt._native.tile_trace()
rt._native.set_profiling(False)
done = worker >= 0
base = t_start[done].min()
starts = [(t_start[worker == w].min() - base) * 1e6 if (worker == w).any() else float("nan")
          for w in range(threads)]
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    rt.run(feeds)
    times.append(time.perf_counter() - t0)
print(json.dumps({"first_ms": first * 1e3, "steady_ms": float(np.median(times)) * 1e3,
                  "cpus_before": cpus, "last_worker_start_us": max(starts)}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenetv2", help="a zoo model (default mobilenetv2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--processes", type=int, default=12, help="fresh processes (default 12)")
    ap.add_argument("--repeat", type=int, default=20, help="steady runs per process")
    ap.add_argument("--json", action="store_true", help="one JSON object per process")
    args = ap.parse_args(argv)
    if not os.path.isdir("/proc/self/task"):
        print("needs Linux (/proc/self/task)", file=sys.stderr)
        return 1
    ratios = []
    for i in range(args.processes):
        out = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.threads),
                              str(args.repeat)], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        ratios.append(row["first_ms"] / row["steady_ms"])
        if args.json:
            print(json.dumps(row))
        else:
            shared = len(set(row["cpus_before"])) < len(row["cpus_before"])
            print(f"process {i + 1:2d}: first {row['first_ms']:6.2f} ms, steady "
                  f"{row['steady_ms']:6.2f} ms, first / steady {ratios[-1]:.2f}; threads on "
                  f"CPUs {row['cpus_before']}{' (shared)' if shared else ''}, the last started "
                  f"{row['last_worker_start_us']:.0f} us in")
    ratios.sort()
    print(f"{args.model} at {args.threads} threads, {args.processes} processes: first / steady "
          f"{ratios[0]:.2f}-{ratios[-1]:.2f}, median {ratios[len(ratios) // 2]:.2f}",
          file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
