#!/usr/bin/env python3
"""Single-thread GEMM throughput of coacto's micro-kernels against numpy's BLAS, same run.

For tile-shaped products C[m x n] = A[m x k] @ B[k x n] (m output positions, n output channels,
k the reduction) it prints GFLOP/s of coacto's selected GEMM kernel (B packed once, outside the
timing, as the runtime does at graph load), of numpy's matmul on the same shapes (OpenBLAS, also
one thread), and their ratio. Measurements alternate between the two, several rounds, best of
each, so that frequency changes and neighbours on a noisy machine hit both alike.

Examples:
  python experiments/bench_gemm.py
  python experiments/bench_gemm.py --shapes 196,256,576 49,512,4608 --rounds 10
  python experiments/bench_gemm.py --json --min-ratio 0.8      # exit 1 if any shape is below 0.8
  COACTO_FORCE_SCALAR=1 python experiments/bench_gemm.py       # the portable scalar kernel

Exit codes: 0 done, 1 a ratio below --min-ratio, 2 bad arguments, 3 coacto's native module missing.
"""
from __future__ import annotations

import os

# One thread for every BLAS numpy might use: set before numpy is first imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

# (m, n, k): ResNet-50-like tiles. 3x3 convolutions at 14x14 (256 ch), 7x7 (512 ch), 56x56 (64 ch),
# 28x28 (128 ch); the classifier on a batch of 64 and on one image.
DEFAULT_SHAPES = [
    (196, 256, 576),
    (49, 512, 4608),
    (3136, 64, 576),
    (784, 128, 1152),
    (64, 1000, 2048),
    (1, 1000, 2048),
]


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected m,n,k (e.g. 196,256,576)")
    if min(m, n, k) <= 0:
        raise argparse.ArgumentTypeError(f"shape {text!r}: m, n and k must be positive")
    return m, n, k


def numpy_best(a: np.ndarray, b: np.ndarray, out: np.ndarray, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return best


def blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no dict mode
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Examples:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, metavar="M,N,K",
                        help="shapes to measure (default: six ResNet-50 tile shapes)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="alternating rounds per shape (default 7)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs per side and round, best kept (default 5)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="pin this process to one CPU (Linux)")
    parser.add_argument("--min-ratio", type=float, default=None,
                        help="exit 1 if coacto/numpy falls below this on any shape")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.rounds <= 0 or args.repeats <= 0:
        parser.error("--rounds and --repeats must be positive")
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (AttributeError, OSError) as exc:
            parser.error(f"--cpu {args.cpu}: {exc}")

    try:
        from coacto._native import ffi, lib
    except ImportError as exc:
        print(f"coacto's native module is not built ({exc}); run `pip install -e .` first",
              file=sys.stderr)
        return 3

    kernel = ffi.string(lib.coacto_gemm_kernel_name()).decode()
    shapes = args.shapes or DEFAULT_SHAPES
    rng = np.random.default_rng(0)
    results = []
    if not args.json:
        print(f"kernel {kernel}, numpy BLAS {blas_name()}, one thread")
        print(f"{'m':>6} {'n':>6} {'k':>6}  {'coacto GFLOP/s':>14}  {'numpy GFLOP/s':>13}  ratio")
    for idx, (m, n, k) in enumerate(shapes):
        if args.json:
            print(f"[{idx + 1}/{len(shapes)}] {m}x{n}x{k}", file=sys.stderr, flush=True)
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        out = np.empty((m, n), dtype=np.float32)
        best_coacto = best_numpy = float("inf")
        for _ in range(args.rounds):
            t = lib.coacto_gemm_benchmark(m, n, k, args.repeats)
            if t <= 0:
                print(f"coacto_gemm_benchmark failed for {m}x{n}x{k}", file=sys.stderr)
                return 3
            best_coacto = min(best_coacto, t)
            best_numpy = min(best_numpy, numpy_best(a, b, out, args.repeats))
        flops = 2.0 * m * n * k
        row = {
            "m": m, "n": n, "k": k,
            "coacto_gflops": flops / best_coacto / 1e9,
            "numpy_gflops": flops / best_numpy / 1e9,
            "ratio": best_numpy / best_coacto,
        }
        results.append(row)
        if not args.json:
            print(f"{m:6d} {n:6d} {k:6d}  {row['coacto_gflops']:14.1f}  "
                  f"{row['numpy_gflops']:13.1f}  {row['ratio']:5.2f}", flush=True)

    worst = min(r["ratio"] for r in results)
    if args.json:
        print(json.dumps({"kernel": kernel, "numpy_blas": blas_name(), "threads": 1,
                          "rounds": args.rounds, "repeats": args.repeats,
                          "results": results, "min_ratio": worst}, indent=2))
    if args.min_ratio is not None and worst < args.min_ratio:
        print(f"ratio {worst:.2f} below --min-ratio {args.min_ratio}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
