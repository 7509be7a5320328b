"""coacto vs onnxruntime in one process: same inputs, same threads, interleaved runs, medians."""
from __future__ import annotations

import statistics
import time

import numpy as np

from .errors import CoactoError


def max_error(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |got - ref|, max |ref|)."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf"), float(np.abs(ref).max(initial=0.0))
    return float(np.abs(got - ref).max(initial=0.0)), float(np.abs(ref).max(initial=0.0))


def onnxruntime_session(onnx_bytes: bytes, threads: int):
    try:
        import onnxruntime as ort
    except ImportError:
        raise CoactoError("onnxruntime is not installed: pip install -e '.[test]' "
                          "(or pip install onnxruntime) to compare against it") from None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])


def onnxruntime_run(onnx_bytes: bytes, feeds, threads: int, repeat: int):
    sess = onnxruntime_session(onnx_bytes, threads)
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(names, feeds)
        times.append(time.perf_counter() - t0)
    return dict(zip(names, outs)), statistics.median(times) if times else float("nan")


def compare(tg, onnx_bytes: bytes | None, threads: int, repeat: int, name: str = "") -> dict:
    """Median latency of coacto and onnxruntime, runs interleaved in blocks so both see the same
    machine noise."""
    from .runtime import Runtime

    feeds = tg.example_feeds(0)
    row = {"model": name, "threads": threads, "tiles": tg.n_tiles}
    with Runtime(tg, threads=threads) as rt:
        outs = rt.run(feeds)  # warm-up
        sess = None
        if onnx_bytes is not None:
            sess = onnxruntime_session(onnx_bytes, threads)
            onames = [o.name for o in sess.get_outputs()]
            ref = dict(zip(onames, sess.run(onames, feeds)))
            errs = [max_error(outs[k], ref[k]) for k in outs]
            row["max_rel_error"] = max(e / s if s else e for e, s in errs)
            row["match"] = all(e <= 1e-4 * s for e, s in errs)
        tc, to = [], []
        # Alternate blocks of runs, pause between blocks and drop the first run of each block:
        # both runtimes' idle threads spin for a while after a run (onnxruntime's for longer)
        # and would otherwise slow the other one down.
        block, pause_s = 5, 0.3
        for _ in range(max(1, (repeat + block - 2) // (block - 1))):
            for i in range(block):
                t0 = time.perf_counter()
                rt.run(feeds)
                if i:
                    tc.append(time.perf_counter() - t0)
            time.sleep(pause_s)
            if sess is not None:
                for i in range(block):
                    t0 = time.perf_counter()
                    sess.run(onames, feeds)
                    if i:
                        to.append(time.perf_counter() - t0)
                time.sleep(pause_s)
        row["coacto_ms"] = statistics.median(tc) * 1e3
        row["peak_activation_mb"] = rt.last_stats.get("peak_activation_bytes", 0) / 1e6
    if to:
        row["onnxruntime_ms"] = statistics.median(to) * 1e3
        row["ratio"] = row["coacto_ms"] / row["onnxruntime_ms"]
    return row


def format_table(rows: list[dict]) -> str:
    head = f"{'model':<16}{'threads':>8}{'tiles':>8}{'coacto ms':>12}{'ort ms':>10}{'ratio':>8}  match"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:<16}{r['threads']:>8}{r['tiles']:>8}{r['coacto_ms']:>12.2f}"
            f"{r.get('onnxruntime_ms', float('nan')):>10.2f}{r.get('ratio', float('nan')):>8.2f}  "
            f"{'-' if 'match' not in r else ('yes' if r['match'] else 'NO')}")
    lines.append("ratio = coacto / onnxruntime latency (below 1: coacto is faster)")
    return "\n".join(lines)
