"""The `coacto` command as a user runs it: real processes, real files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx

from coacto import zoo


def coacto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "coacto.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_help_teaches():
    r = coacto("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "coacto demo" in r.stdout
    for cmd in ("compile", "run", "bench", "demo"):
        r = coacto(cmd, "--help")
        assert r.returncode == 0 and "example" in r.stdout, cmd


def test_compile_then_run_with_files(tmp_path):
    model = zoo.build("squeezenet", image_size=32)
    onnx.save(model, tmp_path / "sq.onnx")
    feeds = zoo.input_feeds(model)
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    r = coacto("compile", tmp_path / "sq.onnx", "-o", tmp_path / "sq.ctg", "--tiles", 5, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["tiles"] > 0 and (tmp_path / "sq.ctg").exists()
    r = coacto("run", tmp_path / "sq.ctg", "--input", f"{name}={tmp_path / 'x.npy'}", "--threads", 2,
               "--output", tmp_path / "out.npz", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["threads"] == 2 and res["latency_s"] > 0
    import onnxruntime as ort

    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = np.load(tmp_path / "out.npz")[model.graph.output[0].name]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_run_errors_exit_1_with_a_message(tmp_path):
    r = coacto("run", tmp_path / "absent.onnx", "--random")
    assert r.returncode == 1 and "coacto: error:" in r.stderr and "Traceback" not in r.stderr
    model = zoo.build("squeezenet", image_size=32)
    onnx.save(model, tmp_path / "sq.onnx")
    r = coacto("run", tmp_path / "sq.onnx")
    assert r.returncode == 1 and "--input" in r.stderr
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), np.float32))
    r = coacto("run", tmp_path / "sq.onnx", "--input", f"{model.graph.input[0].name}={tmp_path / 'bad.npy'}")
    assert r.returncode == 1 and "shape" in r.stderr
    r = coacto("bogus")
    assert r.returncode == 2


def test_demo_on_a_small_model():
    r = coacto("demo", "--model", "squeezenet", "--image-size", 64, "--threads", 2, "--repeat", 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matches onnxruntime" in r.stdout and "tile graph:" in r.stdout


def test_bench_prints_ratio():
    r = coacto("bench", "mobilenetv3_block", "--threads", 1, "--repeat", 3, "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["match"] is True and row["ratio"] > 0 and row["onnxruntime_ms"] > 0
