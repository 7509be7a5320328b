"""COACTO_ISA caps the GEMM kernels picked at start (so an AVX-512 machine measures the AVX2 path,
and any machine the portable one a CPU without SIMD gets), every capped path still matches
onnxruntime, and a value this CPU's architecture does not have is refused with the choices.
COACTO_FORCE_SCALAR=1 is the older spelling of COACTO_ISA=scalar."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coacto.native import ISA_CHOICES, _arch, gemm_kernels_available

SCRIPT = """
import sys
import numpy as np, onnxruntime as ort, coacto
from coacto import zoo
from coacto.native import gemm_kernel_name, kernel_summary
want = sys.argv[1]
assert gemm_kernel_name() == want, (gemm_kernel_name(), want)
for name in ('squeezenet', 'mobilenetv3_block', 'shufflenet_unit'):
    m = zoo.build(name, **({'image_size': 32} if name == 'squeezenet' else {}))
    feeds = zoo.input_feeds(m)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    with coacto.Runtime(coacto.compile(m, tiles_per_layer=7), threads=2) as rt:
        got = list(rt.run(feeds).values())
    for g, r in zip(got, ref):
        assert np.abs(g - r).max() <= 1e-4 * np.abs(r).max(), name
print('ok', kernel_summary())
"""

#: the instruction set each kernel name ends with, as COACTO_ISA spells it
ISA_OF = {"avx512f": "avx512", "avx2": "avx2", "neon": "neon", "scalar": "scalar"}
RANK = {"scalar": 0, "avx2": 1, "neon": 1, "avx512": 2}


def _run(env_extra: dict, want: str):
    env = {k: v for k, v in os.environ.items() if k not in ("COACTO_ISA", "COACTO_FORCE_SCALAR")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", SCRIPT, want], env=env, capture_output=True,
                          text=True, timeout=600)


def _expected(cap: str) -> str:
    """The best kernel this CPU runs whose instruction set is at most ``cap``."""
    return next(k for k in gemm_kernels_available()
                if RANK[ISA_OF[k.rsplit("__", 1)[1]]] <= RANK[cap])


@pytest.mark.parametrize("cap", ISA_CHOICES.get(_arch(), ("scalar",)))
def test_each_cap_picks_the_best_kernel_under_it_and_matches_onnxruntime(cap):
    r = _run({"COACTO_ISA": cap}, _expected(cap))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"COACTO_ISA={cap}" in r.stdout and "caches" in r.stdout


def test_forced_scalar_is_the_scalar_cap():
    r = _run({"COACTO_FORCE_SCALAR": "1"}, _expected("scalar"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "__scalar" in r.stdout


def test_an_isa_this_cpu_does_not_have_is_refused_with_the_choices():
    other = "neon" if _arch() != "aarch64" else "avx2"
    env = dict(os.environ, COACTO_ISA=other)
    r = subprocess.run([sys.executable, "-m", "coacto", "demo", "--model", "squeezenet"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert f"COACTO_ISA='{other}'" in r.stderr and "scalar" in r.stderr
    assert "Traceback" not in r.stderr
    env["COACTO_ISA"] = "avx3"
    r = subprocess.run([sys.executable, "-c", "import coacto.native"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "COACTO_ISA='avx3'" in r.stderr


def test_the_cache_sizes_come_from_the_machine():
    from coacto.machine import cache_sizes, format_caches

    caches = cache_sizes()
    if not os.path.isdir("/sys/devices/system/cpu/cpu0/cache"):
        pytest.skip("no sysfs cache description on this machine")
    assert caches.get("L1d", 0) >= 8 << 10 and caches.get("L2", 0) >= caches["L1d"]
    assert format_caches({"L1d": 48 << 10, "L2": 1 << 20}) == "L1d 48 KiB, L2 1 MiB"
    assert format_caches({}) == "unknown"


BLOCKING = """
import sys
import numpy as np, onnxruntime as ort, coacto
from coacto import zoo
from coacto.native import gemm_blocking, kernel_summary
print(gemm_blocking())
for name, kw in (('resnet18', {'image_size': 64}), ('vgg16', {'image_size': 32}),
                 ('bert', {'layers': 1, 'seq_len': 24})):
    m = zoo.build(name, **kw)
    feeds = zoo.input_feeds(m)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    with coacto.Runtime(coacto.compile(m), threads=2) as rt:
        got = list(rt.run(feeds).values())
    for g, r in zip(got, ref):
        assert np.abs(g - r).max() <= 1e-4 * np.abs(r).max(), name
print('ok', kernel_summary())
"""


@pytest.mark.parametrize("l1d,l2", [("4K", "16K"), ("2M", "64M")])
def test_the_blocking_follows_the_caches_and_every_blocking_computes_the_same(l1d, l2):
    """The GEMM blocking is derived from the caches (COACTO_L1D_BYTES / COACTO_L2_BYTES stand
    for another machine's): a panel slice of half the L1d, row blocks of a quarter of L2, within
    their bounds; at both extremes the convolutions (im2col, Winograd) and matrix products still
    match onnxruntime."""
    env = dict(os.environ, COACTO_L1D_BYTES=l1d, COACTO_L2_BYTES=l2)
    r = subprocess.run([sys.executable, "-c", BLOCKING], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    b = eval(r.stdout.splitlines()[0])
    assert b["cache_source"] == "environment" and "COACTO_L1D_BYTES" in r.stdout
    nr = int(gemm_kernel_nr())
    mr = int(gemm_kernel_mr())
    l1, l2b = b["l1d_bytes"], b["l2_bytes"]
    assert b["block_k"] == min(512, max(64, l1 // 2 // (nr * 4) // 16 * 16))
    assert b["block_m"] == min(1024, max(4 * mr, l2b // 4 // (b["block_k"] * 4))) // mr * mr


def gemm_kernel_nr() -> int:
    from coacto.native import gemm_kernel_name

    return int(gemm_kernel_name().split("_")[2].split("x")[1])


def gemm_kernel_mr() -> int:
    from coacto.native import gemm_kernel_name

    return int(gemm_kernel_name().split("_")[2].split("x")[0])


def test_this_machines_blocking_is_read_from_its_caches():
    from coacto.machine import cache_sizes
    from coacto.native import gemm_blocking

    b = gemm_blocking()  # (the test run does not set COACTO_L1D_BYTES / COACTO_L2_BYTES)
    seen = cache_sizes()
    assert b["cache_source"] in ("sysfs", "sysconf", "assumed")
    if b["cache_source"] == "sysfs":
        assert b["l1d_bytes"] == seen["L1d"] and b["l2_bytes"] == seen["L2"]
