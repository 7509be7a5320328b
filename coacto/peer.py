"""onnxruntime as the peer coacto is measured against: the one session setup that the latency
benchmark (coacto.benchmark, and through it the commands' output checks) and the memory child
(coacto.memory) share, so every comparison runs onnxruntime the same way. A module of its own so
that the memory child need not import the benchmark: the benchmark imports the memory child."""
from __future__ import annotations

from .errors import CoactoError


def onnxruntime_session(onnx_model, threads: int, profile_prefix: str | None = None):
    """An onnxruntime CPU session (model: bytes or a path) with `threads` intra-op threads, all
    graph optimizations, sequential execution: the peer every comparison uses. With
    `profile_prefix`, onnxruntime's own per-node profiler is on, writing its JSON file there
    (`end_profiling()` returns the path)."""
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
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(onnx_model, so, providers=["CPUExecutionProvider"])
