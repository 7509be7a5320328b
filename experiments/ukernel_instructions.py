"""Instructions per FLOP of the GEMM micro-kernels, counted under QEMU: the NEON kernels measured
without ARM hardware (issue: local speed on every CPU), beside the AVX2 and scalar ones.

native/bench/ukernel_calls.c calls the selected kernel (COACTO_ISA picks it) on one full MR x NR
block with a reduction of KC, N times. It is built as `pip install` builds the runtime (-O3, for
aarch64 with -march=armv8-a; statically, for qemu-user), and run under qemu with one instruction
per translation block and every block's execution logged (`-singlestep -d nochain,exec`), once
with N calls and once with none: the difference over N * KC is the instructions the kernel
executes per reduction step. The ideal is one FMA instruction per vector of the MR x NR block
(MR * NR / lanes per step); loads of the packed panel and of A, the loop and the prefetch hint
come on top. AVX-512 cannot be counted here: QEMU's TCG does not emulate it, and this VM exposes
no hardware instruction counter to `perf`; the script says so instead of guessing.

    python experiments/ukernel_instructions.py [--kc 256] [--calls 20] [--out DIR]

Needs aarch64-linux-gnu-gcc, qemu-aarch64 and qemu-x86_64 (Debian: gcc-aarch64-linux-gnu,
qemu-user). Writes DIR/ukernel_instructions.csv and prints the table.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "native"
FLAGS = ["-O3", "-std=c11", "-ffp-contract=fast", "-pthread", "-fno-math-errno"]
#: (ISA cap, compiler, extra flags, qemu command, float lanes of one vector register)
TARGETS = [
    ("neon", "aarch64-linux-gnu-gcc", ["-march=armv8-a"], ["qemu-aarch64"], 4),
    ("scalar", "aarch64-linux-gnu-gcc", ["-march=armv8-a"], ["qemu-aarch64"], 1),
    ("avx2", "cc", [], ["qemu-x86_64", "-cpu", "max"], 8),
    ("scalar", "cc", [], ["qemu-x86_64", "-cpu", "max"], 1),
]


def build(compiler: str, extra: list[str], out: Path) -> None:
    sources = [str(NATIVE / "bench" / "ukernel_calls.c")] + \
        sorted(str(p) for p in (NATIVE / "src").glob("*.c")) + \
        sorted(str(p) for p in (NATIVE / "src" / "kernels").glob("*.c"))
    cmd = [compiler, *FLAGS, *extra, f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'src'}", *sources,
           "-lm", "-static", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building with {compiler} failed:\n{r.stderr[-2000:]}")


def executed(qemu: list[str], binary: Path, isa: str, calls: int, kc: int, log: Path) -> tuple:
    """(instructions executed by the whole program, what it printed)."""
    env = dict(os.environ, COACTO_ISA=isa)
    r = subprocess.run([*qemu, "-singlestep", "-d", "nochain,exec", "-D", str(log), str(binary),
                        str(calls), str(kc)], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{binary.name} under {qemu[0]} failed: {r.stderr[-1000:]}")
    with open(log, errors="replace") as f:
        count = sum(1 for line in f if line.startswith("Trace"))
    return count, r.stdout.split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kc", type=int, default=256, help="reduction length per call (default: the "
                    "driver's K block, %(default)s)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=None, metavar="DIR", help="write ukernel_instructions.csv")
    args = ap.parse_args(argv)
    if args.kc < 1 or args.calls < 1:
        ap.error("--kc and --calls must be positive")
    missing = sorted({t for _, c, _, q, _ in TARGETS for t in (c, q[0]) if not shutil.which(t)})
    if missing:
        print(f"ukernel_instructions: missing {', '.join(missing)} (Debian: gcc-aarch64-linux-gnu, "
              "qemu-user)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="coacto-ukernel-") as tmp:
        tmp = Path(tmp)
        built = {}
        for isa, compiler, extra, qemu, lanes in TARGETS:
            binary = tmp / f"ukernel-{compiler}"
            if compiler not in built:
                build(compiler, extra, binary)
                built[compiler] = binary
            base, _ = executed(qemu, binary, isa, 0, args.kc, tmp / "log0")
            total, out = executed(qemu, binary, isa, args.calls, args.kc, tmp / "log1")
            name, mr, nr = out[0], int(out[1]), int(out[2])
            per_step = (total - base) / (args.calls * args.kc)
            flops = 2 * mr * nr
            fma = mr * nr / lanes
            rows.append({"kernel": name, "isa": isa, "arch": qemu[0].replace("qemu-", ""),
                         "mr": mr, "nr": nr, "kc": args.kc,
                         "instructions_per_step": round(per_step, 2),
                         "fma_instructions_per_step": fma,
                         "instructions_per_flop": round(per_step / flops, 4),
                         "fma_share": round(fma / per_step, 3)})
    rows.append({"kernel": "gemm_f32_14x32__avx512f", "isa": "avx512", "arch": "x86_64",
                 "mr": 14, "nr": 32, "kc": args.kc, "instructions_per_step": "",
                 "fma_instructions_per_step": 14 * 32 / 16, "instructions_per_flop": "",
                 "fma_share": "not counted: QEMU's TCG has no AVX-512 and this machine no "
                              "hardware instruction counter"})
    print(f"{'kernel':26s} {'instr/step':>10s} {'FMA/step':>8s} {'instr/FLOP':>10s} {'FMA share':>9s}")
    for r in rows:
        print(f"{r['kernel']:26s} {r['instructions_per_step']!s:>10s} "
              f"{r['fma_instructions_per_step']:>8g} {r['instructions_per_flop']!s:>10s} "
              f"{r['fma_share']!s:>9s}"[:120])
    print(f"(one reduction step: MR x NR multiply-adds, 2 * MR * NR FLOPs; kc {args.kc}; the "
          f"kernels built -O3 as pip builds them)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "ukernel_instructions.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {out / 'ukernel_instructions.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
