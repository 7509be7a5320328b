"""COACTO_FORCE_SCALAR=1 runs the portable kernels (what a CPU without AVX2 gets) and still
matches onnxruntime."""
from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import numpy as np, onnxruntime as ort, coacto
from coacto import zoo
from coacto.runtime import gemm_kernel_name
assert gemm_kernel_name().endswith('__scalar'), gemm_kernel_name()
for name in ('squeezenet', 'mobilenetv3_block', 'shufflenet_unit'):
    m = zoo.build(name, **({'image_size': 32} if name == 'squeezenet' else {}))
    feeds = zoo.input_feeds(m)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    with coacto.Runtime(coacto.compile(m, tiles_per_layer=7), threads=2) as rt:
        got = list(rt.run(feeds).values())
    for g, r in zip(got, ref):
        assert np.abs(g - r).max() <= 1e-4 * np.abs(r).max(), name
print('scalar ok', gemm_kernel_name())
"""


def test_forced_scalar_kernels_match_onnxruntime():
    env = dict(os.environ, COACTO_FORCE_SCALAR="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "scalar ok" in r.stdout
