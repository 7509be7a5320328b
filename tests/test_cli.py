"""The `coacto` command as a user runs it: real processes, real files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx

from coacto import zoo


def coacto(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "coacto.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_help_teaches():
    r = coacto("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "coacto demo" in r.stdout
    for cmd in ("compile", "run", "bench", "tune", "demo"):
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
    r = coacto("bench", "mobilenetv3_block", "--threads", 1, "--repeat", 3, "--json",
               "--memory", "off")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["match"] is True and row["ratio"] > 0 and row["onnxruntime_ms"] > 0


def test_bench_many_models_one_table_with_unsupported_rows(tmp_path):
    """Every model and thread count is a row; models that cannot run say why and do not stop
    the others; the 2-thread row carries the speedup over 1 thread; memory of both runtimes.
    A transformer (a small BERT file: int64 token inputs) runs like any other model."""
    bert = zoo.save("bert", tmp_path / "bert_small.onnx", layers=1, hidden=64, heads=4, seq_len=16)
    r = coacto("bench", "--models", f"squeezenet,{bert},nosuchmodel", "--threads", "1,2",
               "--repeat", 2, "--image-size", 32, "--memory-runs", 1, "--json",
               env={**os.environ, "COACTO_PROFILE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["model"], x["threads"]) for x in rows] == [
        (m, t) for m in ("squeezenet", str(bert), "nosuchmodel") for t in (1, 2)]
    for row in rows[:4]:
        assert row["match"] is True and row["coacto_ms"] > 0 and row["onnxruntime_ms"] > 0
        assert row["coacto_mb"] > 0 and row["onnxruntime_mb"] > 0
        assert row["memory_ratio"] == row["coacto_mb"] / row["onnxruntime_mb"]
        assert 0 < row["coacto_best_ms"] <= row["coacto_ms"]
        assert 0 < row["onnxruntime_best_ms"] <= row["onnxruntime_ms"]
        assert row["best_ratio"] == row["coacto_best_ms"] / row["onnxruntime_best_ms"]
    for one, two in (rows[0:2], rows[2:4]):
        assert one["speedup"] == 1.0 and two["speedup"] == one["coacto_ms"] / two["coacto_ms"]
        assert two["best_speedup"] == one["coacto_best_ms"] / two["coacto_best_ms"]
    for row in rows[4:]:
        assert row["status"] == "not in the zoo" and "coacto_ms" not in row
    # the text table: same rows, reasons instead of numbers
    r = coacto("bench", "--models", "squeezenet,nosuchmodel", "--threads", "1", "--repeat", 2,
               "--image-size", 32, "--memory", "off",
               env={**os.environ, "COACTO_PROFILE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "coacto ms" in lines[0] and "speedup" in lines[0] and "mem ratio" in lines[0]
    assert any(ln.startswith("squeezenet") and "matches" in ln for ln in lines)
    assert any(ln.startswith("nosuchmodel") and ln.rstrip().endswith("not in the zoo")
               for ln in lines)


def test_bench_reports_unsupported_models_and_fails_when_none_runs(tmp_path):
    onnx.save(_int_input_model(), tmp_path / "ints.onnx")
    r = coacto("bench", "--models", f"{tmp_path / 'ints.onnx'},nosuchmodel", "--threads", 1,
               "--memory", "off", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    assert rows[0]["status"].startswith("unsupported:") and "float32" in rows[0]["status"]
    assert rows[1]["status"] == "not in the zoo"


def _int_input_model():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [1, 8])
    g = helper.make_graph([helper.make_node("Identity", ["ids"], ["y"])], "ints", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_bench_rejects_bad_thread_lists():
    r = coacto("bench", "squeezenet", "--threads", "1,x")
    assert r.returncode == 1 and "--threads" in r.stderr and "Traceback" not in r.stderr


def test_run_profile_shows_where_the_time_goes():
    r = coacto("run", "squeezenet", "--image-size", 32, "--random", "--profile", 2, "--json")
    assert r.returncode == 0, r.stderr
    layers = json.loads(r.stdout)["layers"]
    assert layers and all({"layer", "op", "tiles", "seconds", "share"} <= set(x) for x in layers)
    assert any(x["op"] == "CONV" and x["seconds"] > 0 for x in layers)
    r = coacto("run", "squeezenet", "--image-size", 32, "--random", "--profile", 2)
    assert r.returncode == 0 and "per-layer busy time" in r.stdout and "GFLOP/s" in r.stdout


def test_run_trace_writes_a_chrome_trace(tmp_path):
    out = tmp_path / "t.json"
    r = coacto("run", "squeezenet", "--image-size", 32, "--random", "--threads", 2, "--trace", out)
    assert r.returncode == 0, r.stderr
    assert "threads busy" in r.stdout and str(out) in r.stdout
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X"} <= {0, 1}
    assert any(e["cat"] == "CONV" and e["dur"] > 0 for e in events if e["ph"] == "X")
    bad = tmp_path / "no" / "such" / "dir" / "t.json"
    r = coacto("run", "squeezenet", "--image-size", 32, "--random", "--trace", bad)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert str(bad) in r.stderr and "No such file or directory" in r.stderr


def test_memory_child_usage_and_report(tmp_path):
    r = subprocess.run([sys.executable, "-m", "coacto.memory", "bogus"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
    from coacto.memory import peak_memory

    model = zoo.build("squeezenet", image_size=32)
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **zoo.input_feeds(model))
    rep = peak_memory("onnxruntime", tmp_path / "m.onnx", tmp_path / "in.npz", threads=1, runs=1)
    assert rep["model_peak_bytes"] > 0 and rep["peak_bytes"] >= rep["baseline_bytes"]
    rep = peak_memory("coacto", tmp_path / "m.onnx", tmp_path / "in.npz", threads=1, runs=1)
    assert rep["runtime"] == "coacto" and rep["model_peak_bytes"] > 0
