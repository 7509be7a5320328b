"""Peak resident memory of a local run, coacto's and onnxruntime's, each in a fresh process.

What is measured: a new Python process imports the libraries one runtime needs (numpy, and coacto
with its ONNX importer, or onnxruntime), notes its resident size (the *baseline*: interpreter and
libraries, not the model), loads the model, runs it ``runs`` times on the same inputs and reports
its peak resident size (``VmHWM``; ``ru_maxrss`` where there is no /proc) minus the baseline.
So each number is what that model costs
that runtime in RAM, at its worst moment, libraries excluded.

How each runtime loads the model is its own standard local path:

* onnxruntime: ``InferenceSession(model.onnx)`` with the same options as the latency benchmark;
* coacto, mode ``ctg`` (what a device runs): ``coacto.load(model.ctg)`` of the tile graph compiled
  ahead of time (the parent compiles it, outside the measurement), then ``Runtime``;
* coacto, mode ``onnx``: ``coacto.compile(model.onnx)`` in the measured process, then ``Runtime``:
  the import and partitioning count too.

The parent writes the model and inputs to a temporary folder; the child reads them, so nothing the
parent holds is counted. Run a child by hand with ``python -m coacto.memory RUNTIME MODEL INPUTS.npz
THREADS RUNS``; it prints one JSON object.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .errors import CoactoError

#: What `python -m coacto.memory` accepts as RUNTIME.
RUNTIMES = ("onnxruntime", "coacto")


def _rss_bytes() -> int:
    """Current resident size (Linux /proc; elsewhere the peak so far, a conservative stand-in)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_bytes()


def _peak_bytes() -> int:
    """Peak resident size of this process image. Linux: VmHWM, the high-water mark of this
    address space (ru_maxrss would carry over the parent's size through fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _child(runtime: str, model: str, inputs: str, threads: int, runs: int) -> dict:
    with np.load(inputs) as z:
        feeds = {k: z[k] for k in z.files}
    if runtime == "onnxruntime":
        from .peer import onnxruntime_session

        import onnxruntime  # noqa: F401  (imported before the baseline is taken)

        base = _rss_bytes()
        sess = onnxruntime_session(model, threads)
        names = [o.name for o in sess.get_outputs()]
        for _ in range(runs):
            sess.run(names, feeds)
    else:
        from . import compiler
        from . import frontend  # noqa: F401  (the importer's libraries: part of the baseline)
        from .runtime import Runtime

        base = _rss_bytes()
        tg = (compiler.load(model) if model.endswith(".ctg")
              else compiler.compile(model, threads=threads))  # as `coacto bench` times it
        with Runtime(tg, threads=threads) as rt:
            for _ in range(runs):
                rt.run(feeds)
    peak = _peak_bytes()
    return {"runtime": runtime, "model": model, "threads": threads, "runs": runs,
            "baseline_bytes": base, "peak_bytes": peak, "model_peak_bytes": max(0, peak - base)}


def peak_memory(runtime: str, model_path: str | os.PathLike, inputs_path: str | os.PathLike,
                threads: int, runs: int = 5, timeout: float = 600.0) -> dict:
    """Runs one child process (see the module's docstring) and returns its JSON report.
    ``model_path``: an .onnx file (onnxruntime; coacto compiles it in the child) or a .ctg file
    (coacto). Raises CoactoError with the child's message when it fails."""
    if runtime not in RUNTIMES:
        raise CoactoError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    # The child must import this very coacto (a source tree or a worktree), not another install.
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = package_root + (os.pathsep + rest if rest else "")
    cmd = [sys.executable, "-m", "coacto.memory", runtime, str(model_path), str(inputs_path),
           str(int(threads)), str(int(runs))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise CoactoError(f"measuring the memory of {runtime} took longer than "
                          f"{timeout:.0f} s") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CoactoError(f"measuring the memory of {runtime} failed: {tail[0]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 5 or argv[0] not in RUNTIMES:
        print(f"usage: python -m coacto.memory {{{','.join(RUNTIMES)}}} MODEL INPUTS.npz "
              "THREADS RUNS",
              file=sys.stderr)
        return 2
    print(json.dumps(_child(argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
