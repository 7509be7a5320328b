"""The `coacto` command as a user runs it: real processes, real files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import coacto as coacto_pkg
from coacto import zoo
from coacto.protocol import PROTOCOL_VERSION


def coacto(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "coacto.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def server_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "coacto.server.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def client_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "coacto.mobile.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def squeezenet_files(tmp_path_factory):
    """A small model as the user holds it: sq.onnx, and sq.ctg compiled from it at 4 tiles."""
    folder = tmp_path_factory.mktemp("sq")
    onnx.save(zoo.build("squeezenet", image_size=32), folder / "sq.onnx")
    r = coacto("compile", folder / "sq.onnx", "-o", folder / "sq.ctg", "--tiles", 4, timeout=120)
    assert r.returncode == 0, r.stderr
    return folder / "sq.onnx", folder / "sq.ctg"


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
    onnx.save(_bfloat16_model(), tmp_path / "bf16.onnx")
    r = coacto("bench", "--models", f"{tmp_path / 'bf16.onnx'},nosuchmodel", "--threads", 1,
               "--memory", "off", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    assert rows[0]["status"].startswith("unsupported:") and "BFLOAT16" in rows[0]["status"]
    assert rows[1]["status"] == "not in the zoo"


def _bfloat16_model():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, 8])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "bf16", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_bench_rejects_bad_thread_lists():
    r = coacto("bench", "squeezenet", "--threads", "1,x")
    assert r.returncode == 2 and "--threads" in r.stderr and "Traceback" not in r.stderr


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


# ------------------------------------------------------------------------------ conventions

def test_version_on_every_command():
    v = coacto_pkg.__version__
    r = coacto("--version", timeout=60)
    assert r.returncode == 0 and r.stdout == f"coacto {v}\n", r.stdout + r.stderr
    r = server_cli("--version")
    assert r.returncode == 0 and r.stdout == f"coacto-server {v} (protocol {PROTOCOL_VERSION})\n"
    r = client_cli("--version")
    assert r.returncode == 0 and r.stdout == f"coacto-client {v} (protocol {PROTOCOL_VERSION})\n"


def test_every_help_lists_the_exit_codes():
    for cmd in ((), ("compile",), ("run",), ("bench",), ("tune",), ("demo",), ("profile",),
                ("keygen",)):
        r = coacto(*cmd, "--help", timeout=60)
        assert r.returncode == 0 and "exit codes: 0 success" in r.stdout, cmd
        assert "2 bad usage" in r.stdout, cmd
    assert "3 with --check" in coacto("run", "--help", timeout=60).stdout
    for run in (server_cli, client_cli):
        text = run("--help").stdout
        assert "exit codes: 0" in text and "2 bad usage" in text


def test_rates_say_bits_or_bytes():
    from coacto.mobile.shaper import RateError, describe_schedule, parse_schedule

    assert parse_schedule("20Mbit/s") == parse_schedule("2.5MB/s") == [(0.0, 2.5e6)]
    steps = parse_schedule("2.5MB/s,5mbit@2")
    assert steps == [(0.0, 2.5e6), (2.0, 625e3)]
    assert describe_schedule(steps) == "20 Mbit/s (2.5 MB/s), then 5 Mbit/s (625 kB/s) from 2 s"
    with pytest.raises(RateError, match="ambiguous"):
        parse_schedule("100mbit,20Mbps@1")
    # the Python API reads rates with the same parser, before it loads anything
    with pytest.raises(RateError, match="'20Mbit/s'.*'20MB/s'"):
        coacto_pkg.Client(None, "absent.onnx", policy="local", bandwidth="20Mbps")


def test_client_refuses_ambiguous_rates_and_echoes_the_one_it_read(squeezenet_files):
    sq_onnx, _ = squeezenet_files
    for rate in ("20Mbps", "20mbps", "20MBps", "20Mb/s"):
        r = client_cli("--server", "tcp://127.0.0.1:1", "--model", sq_onnx, "--random",
                       "--bandwidth", rate)
        assert r.returncode == 2 and "ambiguous" in r.stderr, (rate, r.stderr)
        assert "'20Mbit/s'" in r.stderr and "'20MB/s'" in r.stderr and "Traceback" not in r.stderr
    # nothing listens on port 1: the device finishes alone, after saying what link it emulates
    r = client_cli("--server", "tcp://127.0.0.1:1", "--model", sq_onnx, "--random",
                   "--timeout", 1, "--bandwidth", "2.5MB/s", "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert "coacto-client: link capped at 20 Mbit/s (2.5 MB/s)" in r.stderr


def test_ports_out_of_range_are_refused(squeezenet_files):
    from coacto.errors import CoactoError
    from coacto.mobile.client import normalize_address

    assert normalize_address("gpu-box:5555") == "tcp://gpu-box:5555"
    assert normalize_address("tcp://[::1]:65535") == "tcp://[::1]:65535"
    assert normalize_address("ipc:///tmp/coacto.sock") == "ipc:///tmp/coacto.sock"
    for bad in ("tcp://gpu-box:99999", "gpu-box:65536", "tcp://gpu-box:0", "tcp://gpu-box"):
        with pytest.raises(CoactoError, match="65535|port number"):
            normalize_address(bad)
    sq_onnx, _ = squeezenet_files
    r = client_cli("--server", "tcp://127.0.0.1:99999", "--model", sq_onnx, "--random")
    assert r.returncode == 2 and "port 99999 is not from 1 to 65535" in r.stderr, r.stderr
    r = server_cli("--bind", "tcp://127.0.0.1:99999", "--threads", 1)
    assert r.returncode == 2 and "port 99999 is not from 0 to 65535" in r.stderr, r.stderr


def test_ignored_flags_are_named(squeezenet_files):
    sq_onnx, sq_ctg = squeezenet_files
    r = coacto("run", sq_ctg, "--random", "--tiles", 3, "--image-size", 64, "--repeat", 1,
               "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert "coacto: warning: --tiles is ignored with" in r.stderr
    assert "coacto: warning: --image-size is ignored with" in r.stderr
    r = coacto("run", sq_onnx, "--random", "--image-size", 64, "--repeat", 1, "--threads", 1)
    assert r.returncode == 0 and "--image-size is ignored" in r.stderr and "zoo" in r.stderr
    r = coacto("run", sq_onnx, "--random", "--repeat", 1, "--threads", 1)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    r = client_cli("--model", sq_ctg, "--policy", "local", "--random", "--threads", 1,
                   "--bandwidth", "20mbit", "--tiles", 3, "--server", "tcp://127.0.0.1:1")
    assert r.returncode == 0, r.stderr
    for flag in ("--bandwidth", "--server", "--tiles"):
        assert f"coacto-client: warning: {flag} is ignored" in r.stderr, (flag, r.stderr)
    assert "link capped" not in r.stderr  # no link to cap on the device alone


def test_usage_errors_exit_2_and_errors_exit_1(squeezenet_files, tmp_path):
    sq_onnx, sq_ctg = squeezenet_files
    usage = [
        coacto("run", sq_onnx, "--random", "--repeat", 0),
        coacto("run", sq_onnx, "--random", "--warmup", -1),
        coacto("run", sq_onnx, "--random", "--threads", 0),
        coacto("run", sq_onnx, "--random", "--shape", "x"),
        coacto("run", sq_ctg, "--random", "--check"),  # a .ctg holds no ONNX to compare with
        coacto("bench", "squeezenet", "--repeat", 0),
        coacto("demo", "--bandwidths", "20Mbps"),
        client_cli("--model", sq_onnx, "--random", "--repeat", 0, "--policy", "local"),
        client_cli("--model", sq_onnx, "--random"),  # dynamic needs --server
        client_cli("--model", sq_onnx, "--random", "--policy", "local", "--rtt-ms", -1),
        server_cli("--threads", 0),
        server_cli("--max-model-mb", 0),
    ]
    for r in usage:
        assert r.returncode == 2, r.args[3:] + [r.stderr]
        assert "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    errors = [
        coacto("run", tmp_path / "absent.onnx", "--random"),
        coacto("run", sq_ctg, "--random", "--check", "--reference", tmp_path / "absent.onnx"),
        client_cli("--model", tmp_path / "absent.onnx", "--policy", "local", "--random"),
    ]
    for r in errors:
        assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr, \
            r.args[3:] + [r.stderr]


def test_run_reports_the_median_after_warm_up(squeezenet_files):
    sq_onnx, _ = squeezenet_files
    r = coacto("run", sq_onnx, "--random", "--threads", 1, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["repeat"] == 5 and res["warmup"] == 1  # the defaults
    assert 0 < res["latency_min_s"] <= res["latency_s"] <= res["latency_max_s"]
    r = coacto("run", sq_onnx, "--random", "--threads", 1, "--repeat", 3, "--warmup", 2)
    assert r.returncode == 0, r.stderr
    assert "median of 3 (after 2 warm-up runs; min" in r.stdout and "max" in r.stdout


def test_run_check_against_onnxruntime(squeezenet_files, tmp_path):
    sq_onnx, sq_ctg = squeezenet_files
    r = coacto("run", sq_onnx, "--random", "--threads", 1, "--repeat", 1, "--check")
    assert r.returncode == 0 and "matches onnxruntime" in r.stdout, r.stdout + r.stderr
    r = coacto("run", sq_ctg, "--random", "--threads", 1, "--repeat", 1, "--check",
               "--reference", sq_onnx, "--json")
    assert r.returncode == 0, r.stderr
    check = json.loads(r.stdout)["check"]
    assert check["match"] is True and all(c["max_error"] <= 1e-4 * c["max_reference"]
                                          for c in check["outputs"].values())
    # the ONNX a .ctg was not compiled from is refused, not compared
    onnx.save(zoo.build("squeezenet", image_size=64), tmp_path / "other.onnx")
    r = coacto("run", sq_ctg, "--random", "--repeat", 1, "--check", "--reference",
               tmp_path / "other.onnx")
    assert r.returncode == 1 and "sha256 differs" in r.stderr
    # outputs that disagree exit 3: onnxruntime's reference, shifted, in a real process
    shifted = ("import sys; import coacto.benchmark as b; real = b.onnxruntime_run; "
               "b.onnxruntime_run = lambda *a: ({k: v + 1e-2 * abs(v).max() "
               "for k, v in real(*a)[0].items()}, 0.0); "
               "from coacto.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", shifted, "run", str(sq_onnx), "--random",
                        "--threads", "1", "--repeat", "1", "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "MISMATCH" in r.stdout, r.stdout + r.stderr


def test_run_check_casts_integer_inputs_to_the_declared_type(tmp_path):
    """coacto takes int32 token ids for an int64 input; the onnxruntime reference is given the
    type the model declares (it refuses any other), and its own errors are a clean exit 1."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((50, 16)).astype(np.float32), "table")
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], name="/embed/Gather"),
         helper.make_node("Relu", ["emb"], ["out"], name="/act/Relu")], "torch_jit",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 16])], [table])
    model = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.save(tmp_path / "ids.npy", np.arange(8, dtype=np.int32).reshape(1, 8) * 3)
    r = coacto("run", model, "--input", f"ids={tmp_path / 'ids.npy'}", "--repeat", 1, "--check")
    assert r.returncode == 0 and "matches onnxruntime" in r.stdout, r.stdout + r.stderr
