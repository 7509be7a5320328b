"""The peers coacto is measured against: onnxruntime (the reference every output check uses) and,
when it is installed, OpenVINO. The one session setup that the latency benchmark
(coacto.benchmark, and through it the commands' output checks) and the memory child
(coacto.memory) share, so every comparison runs each peer the same way. A module of its own so
that the memory child need not import the benchmark: the benchmark imports the memory child."""
from __future__ import annotations

import numpy as np

from .errors import CoactoError

#: What to run to make OpenVINO a peer of `coacto bench` (it is not a dependency of coacto).
OPENVINO_INSTALL = "pip install openvino"


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


class OnnxruntimePeer:
    """onnxruntime_session behind the interface every peer has: `run(feeds)` -> {output name:
    array}, in the ONNX model's output order (`output_names`)."""

    name = "onnxruntime"

    def __init__(self, onnx_model, threads: int):
        self.session = onnxruntime_session(onnx_model, threads)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict) -> dict:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))


def openvino_missing() -> str | None:
    """None when OpenVINO can be imported; else the line that says it is not installed and how to
    install it (never an error: OpenVINO is an optional peer)."""
    try:
        import openvino  # noqa: F401
        import openvino.properties  # noqa: F401
    except ImportError:
        return f"not installed ({OPENVINO_INSTALL} to add it as a peer)"
    return None


def openvino_message(e: BaseException) -> str:
    """OpenVINO's own message in one line: its C++ exceptions start with lines naming source
    files ("Exception from src/..."); the last line says what went wrong."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith("Exception from ")]
    return (said or lines or [type(e).__name__])[-1]


class OpenVINOPeer:
    """An OpenVINO CPU model compiled as coacto runs: float32 (INFERENCE_PRECISION_HINT f32, so
    no bf16 / f16 on CPUs that have them), PERFORMANCE_HINT LATENCY (one stream: one inference
    at a time, on all its threads), INFERENCE_NUM_THREADS = the thread count, and the static
    input shapes of `feeds` (the model is reshaped to them, as coacto compiled it).
    `output_names`: the ONNX outputs to return, in this order (default: all, the model's order).
    `config`: the settings the compiled model reports it runs with (JSON-serialisable)."""

    name = "openvino"

    def __init__(self, onnx_model, threads: int, feeds: dict,
                 output_names: list[str] | None = None):
        if openvino_missing():
            raise CoactoError(f"OpenVINO is not installed: {OPENVINO_INSTALL} to compare "
                              "against it")
        import openvino as ov
        import openvino.properties as props
        import openvino.properties.hint as hints

        core = ov.Core()
        model = core.read_model(onnx_model)  # ONNX bytes or a path
        model.reshape({name: ov.PartialShape(list(np.shape(v))) for name, v in feeds.items()})
        self.compiled = core.compile_model(model, "CPU", {
            hints.performance_mode: hints.PerformanceMode.LATENCY,
            props.inference_num_threads: int(threads),
            hints.inference_precision: ov.Type.f32,
        })
        self.request = self.compiled.create_infer_request()
        if output_names is None:
            self.ports = list(self.compiled.outputs)
            self.output_names = [p.get_any_name() for p in self.ports]
        else:
            self.ports = [self.compiled.output(n) for n in output_names]
            self.output_names = list(output_names)
        get = self.compiled.get_property
        self.config = {
            "PERFORMANCE_HINT": str(get(hints.performance_mode())),
            "INFERENCE_NUM_THREADS": int(get(props.inference_num_threads())),
            "INFERENCE_PRECISION_HINT": get(hints.inference_precision()).get_type_name(),
            "NUM_STREAMS": int(get(props.num_streams())),
            # OpenVINO's default: its threads pinned to cores (coacto's and onnxruntime's are not)
            "ENABLE_CPU_PINNING": bool(get(hints.enable_cpu_pinning())),
            "version": ov.get_version(),
        }

    def run(self, feeds: dict) -> dict:
        # share_inputs: read the caller's arrays in place, as onnxruntime does; outputs are copied
        # into fresh arrays, as both other runtimes return them
        result = self.request.infer(feeds, share_inputs=True)
        return {n: result[p] for n, p in zip(self.output_names, self.ports)}
