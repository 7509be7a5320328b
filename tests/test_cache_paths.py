"""The cache-derived paths on a model shaped as tf2onnx exports it (NHWC input and Transpose, an
explicit Pad node, a MatMul head), not by our zoo: 1x1 convolutions and a MatMul whose rows of A
are 4 and 8 KiB apart (copied per K block where they share an L1 set), and a 14 x 14 x 256 3x3
convolution (Winograd where the L1 data cache is under 48 KiB, direct above). Each cache setting
is a fresh process (the caches are read once), every thread count's partition against
onnxruntime."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import numpy as np, onnx, onnxruntime as ort, coacto
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(1)
def w(*s): return (rng.standard_normal(s) * (2 / np.prod(s[1:])) ** .5).astype(np.float32)
nodes = [h.make_node("Transpose", ["x"], ["t0"], perm=[0, 3, 1, 2]),
         h.make_node("Conv", ["t0", "W1", "B1"], ["c1"], kernel_shape=[1, 1]),
         h.make_node("Relu", ["c1"], ["r1"]),
         h.make_node("Pad", ["r1", "pads"], ["p1"], mode="constant"),
         h.make_node("Conv", ["p1", "W2", "B2"], ["c2"], kernel_shape=[3, 3]),
         h.make_node("Relu", ["c2"], ["r2"]),
         h.make_node("Conv", ["r2", "W3"], ["c3"], kernel_shape=[1, 1]),
         h.make_node("Transpose", ["c3"], ["t3"], perm=[0, 2, 3, 1]),
         h.make_node("Reshape", ["t3", "shp"], ["f"]),
         h.make_node("MatMul", ["f", "W4"], ["y"])]
inits = [nh.from_array(w(256, 1024, 1, 1), "W1"), nh.from_array(np.zeros(256, np.float32), "B1"),
         nh.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
         nh.from_array(w(256, 256, 3, 3), "W2"),
         nh.from_array((rng.standard_normal(256) * .1).astype(np.float32), "B2"),
         nh.from_array(w(2048, 256, 1, 1), "W3"),
         nh.from_array(np.array([196, 2048], np.int64), "shp"),
         nh.from_array((rng.standard_normal((2048, 100)) / 45).astype(np.float32), "W4")]
g = h.make_graph(nodes, "tfstyle", [h.make_tensor_value_info("x", T.FLOAT, [1, 14, 14, 1024])],
                 [h.make_tensor_value_info("y", T.FLOAT, [196, 100])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
m.ir_version = 7
x = rng.standard_normal((1, 14, 14, 1024)).astype(np.float32)
ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {"x": x})[0]
for threads in (None, 1, 2):
    with coacto.Runtime(coacto.compile(m, threads=threads), threads=threads or 2) as rt:
        got = rt.run({"x": x})["y"]
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err <= 1e-4, (threads, err)
print("ok")
"""


@pytest.mark.parametrize("env", [{}, {"COACTO_L1D_BYTES": "32K"}, {"COACTO_L1D_BYTES": "48K"},
                                 {"COACTO_L1D_WAYS": "2", "COACTO_ISA": "avx2"}],
                         ids=["machine", "l1-32k", "l1-48k", "2-way-avx2"])
def test_tf_style_model_matches_onnxruntime_under_each_cache_setting(env):
    if env.get("COACTO_ISA") == "avx2":
        from coacto.native import gemm_kernels_available

        if not any(k.endswith("__avx2") for k in gemm_kernels_available()):
            env = {"COACTO_L1D_WAYS": "2"}  # the portable kernel, rows copied all the same
    full = {k: v for k, v in os.environ.items()
            if k not in ("COACTO_ISA", "COACTO_L1D_BYTES", "COACTO_L1D_WAYS")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
