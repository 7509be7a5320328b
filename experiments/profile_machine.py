"""Measure this machine and write its profile to profiles/NAME.json.

What it records (every figure measured here, in this run):
- the CPU (model, cores, ISA features the runtime uses) and the GEMM micro-kernel selected;
- GEMM GFLOP/s on layer-shaped problems, one thread, coacto's kernel and OpenBLAS (numpy);
- per-tile runtime overhead (empty kernels), 1 and 2 threads;
- end-to-end latency of zoo models at 1..N threads, coacto and onnxruntime, and the FLOP rate
  coacto sustains on them (the figure a scheduler needs: FLOPs per second per thread count).

    python experiments/profile_machine.py --name xeon-avx512-2core [--models resnet50,mobilenetv2]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the GEMM comparison is single-threaded

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from coacto.machine import cpu_model  # noqa: E402

HERE = Path(__file__).resolve().parent


def run_json(script: str, *args: str):
    out = subprocess.run([sys.executable, str(HERE / script), "--json", *args], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="profile name (file profiles/NAME.json)")
    ap.add_argument("--models", default="resnet50,mobilenetv2,squeezenet")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    from coacto import benchmark, zoo
    from coacto.runtime import gemm_kernel_name

    import coacto

    print("GEMM ...", file=sys.stderr)
    gemm = run_json("bench_gemm.py")
    print("per-tile overhead ...", file=sys.stderr)
    overhead = run_json("bench_overhead.py")
    models = []
    for name in args.models.split(","):
        model = zoo.build(name)
        graph = coacto.compile(model)
        for th in (int(t) for t in args.threads.split(",")):
            print(f"{name} at {th} thread(s) ...", file=sys.stderr)
            row = benchmark.compare(graph, model.SerializeToString(), th, args.repeat, name=name)
            row["coacto_gflops_per_s"] = graph.total_flops / 1e9 / (row["coacto_ms"] / 1e3)
            models.append(row)
    profile = {
        "name": args.name,
        "measured": time.strftime("%Y-%m-%d"),
        "how": "experiments/profile_machine.py on the machine itself; medians of interleaved runs",
        "cpu": {"model": cpu_model(), "machine": platform.machine(), "cores": os.cpu_count()},
        "gemm_kernel": gemm_kernel_name(),
        "gemm": gemm,
        "tile_overhead": overhead,
        "models": models,
    }
    out = HERE.parent / "profiles" / f"{args.name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
