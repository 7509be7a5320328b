"""`coacto bench --mode app`: one inference per runtime and round, order rotating, each after a
pause and other memory traffic; the first inference apart; OpenVINO as an optional second peer,
checked against onnxruntime like coacto. No timed assertions: only what is measured and how."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from coacto import benchmark, compiler, zoo
from coacto.peer import OnnxruntimePeer, openvino_message, openvino_missing

pytest.importorskip("onnxruntime")

OPENVINO = openvino_missing() is None


def coacto(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "coacto.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def squeezenet():
    """A small model: (ONNX bytes, feeds, tile graph)."""
    model = zoo.build("squeezenet", image_size=32)
    feeds = zoo.input_feeds(model)
    return model.SerializeToString(), feeds, compiler.compile(model, tiles_per_layer=4)


class Recorder:
    """Stands in for time in coacto.benchmark (perf_counter real, sleep logged, not slept) and
    for the memory traffic, so a test sees what runs before each inference."""

    def __init__(self):
        self.log: list[str] = []
        self.perf_counter = time.perf_counter
        self.mb = 0.5

    def sleep(self, seconds):
        self.log.append(f"pause {seconds:g}")

    def __call__(self):  # the traffic
        self.log.append("traffic")


def test_app_mode_from_the_command_line(tmp_path):
    r = coacto("bench", "squeezenet", "--mode", "app", "--repeat", 2, "--traffic-mb", 1,
               "--pause", 0.01, "--image-size", 32, "--threads", 1, "--memory", "off", "--json",
               env={**os.environ, "COACTO_PROFILE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["mode"] == "app" and row["match"] is True and row["runs"] == 2
    assert row["pause_s"] == 0.01 and row["traffic_mb"] == 1
    peers = ["onnxruntime", "openvino"] if OPENVINO else ["onnxruntime"]
    assert row["peers"] == peers
    for name in ["coacto"] + peers:
        assert row[f"{name}_ms"] > 0 and row[f"{name}_first_ms"] > 0
        assert row[f"{name}_p10_ms"] <= row[f"{name}_ms"] <= row[f"{name}_p90_ms"]
    for name in peers:
        assert row[f"ratio_{name}"] == row["coacto_ms"] / row[f"{name}_ms"]
    best = min(peers, key=lambda n: row[f"{n}_ms"])
    assert row["best_peer"] == best and row["ratio"] == row["coacto_ms"] / row[f"{best}_ms"]
    assert row["coacto_first_ratio"] == row["coacto_first_ms"] / row["coacto_ms"]
    assert row["coacto_spread"] == pytest.approx(
        (row["coacto_p90_ms"] - row["coacto_p10_ms"]) / row["coacto_ms"])
    if OPENVINO:
        assert row["openvino_match"] is True and "openvino_status" not in row
        assert row["openvino_config"]["INFERENCE_NUM_THREADS"] == 1
        assert row["openvino_config"]["PERFORMANCE_HINT"] == "LATENCY"
        assert row["openvino_config"]["INFERENCE_PRECISION_HINT"] == "f32"
    else:
        assert row["openvino_status"].startswith("not installed")
    # the text table: the app mode's columns and legend
    text = benchmark.format_table([row])
    head = text.splitlines()[0]
    for column in ("coacto ms", "ort ms", "ov ms", "vs best", "first", "spread", "peer spread"):
        assert column in head
    assert "mode app: 2 rounds" in text and "0.01 s pause and 1 MB" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("squeezenet"))
    assert f"{row['ratio']:.2f} {benchmark.PEER_ABBREV[best]}" in line and "matches" in line
    lo = round((row[f"{best}_p10_ms"] / row[f"{best}_ms"] - 1) * 100)
    hi = round((row[f"{best}_p90_ms"] / row[f"{best}_ms"] - 1) * 100)
    assert f"{lo:+d}/{hi:+d}%" in line  # the fastest peer's spread, beside coacto's


def test_back_to_back_is_the_default_and_says_so(tmp_path):
    r = coacto("bench", "squeezenet", "--repeat", 1, "--image-size", 32, "--threads", 1,
               "--memory", "off", "--pause", 0.2,
               env={**os.environ, "COACTO_PROFILE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "mode back-to-back:" in r.stdout and "ov ms" not in r.stdout
    assert "--pause is ignored" in r.stderr
    r = coacto("bench", "squeezenet", "--mode", "app", "--traffic-mb", -1)
    assert r.returncode == 2 and "--traffic-mb" in r.stderr and "Traceback" not in r.stderr


def test_rounds_rotate_the_order_each_inference_after_a_pause_and_traffic(squeezenet,
                                                                         monkeypatch):
    onnx_bytes, feeds, tg = squeezenet
    rec = Recorder()
    monkeypatch.setattr(benchmark, "time", rec)
    contest = benchmark.AppContest(tg, onnx_bytes, 1, "sq", feeds, pause=0.25, traffic=rec)
    try:
        names = list(contest.runners)
        assert names[:2] == ["coacto", "onnxruntime"]
        assert names[2:] == (["openvino"] if OPENVINO else [])
        for name in names:  # log each inference as it really runs
            fn = contest.runners[name]
            contest.runners[name] = lambda fn=fn, name=name: (rec.log.append(name), fn())[1]
        rec.log.clear()
        rounds = 2 * len(names)
        for i in range(rounds):
            contest.run_round(i)
        row = contest.result()
    finally:
        contest.close()
    ran = [x for x in rec.log if x in names]
    expected = [names[(i + j) % len(names)] for i in range(rounds) for j in range(len(names))]
    assert ran == expected
    assert contest.orders == [expected[i * len(names):(i + 1) * len(names)]
                              for i in range(rounds)]
    # every runtime starts a round as often as any other, and each inference is preceded by
    # the pause, then the traffic
    assert sorted(o[0] for o in contest.orders) == sorted(names * 2)
    assert rec.log == [step for name in expected for step in ("pause 0.25", "traffic", name)]
    assert row["runs"] == rounds and row["traffic_mb"] == 0.5 and row["pause_s"] == 0.25


def test_absent_openvino_is_a_line_not_an_error(squeezenet, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    assert "pip install openvino" in openvino_missing()
    onnx_bytes, feeds, tg = squeezenet
    row = benchmark.compare(tg, onnx_bytes, 1, 2, "sq", feeds, mode="app", pause=0,
                            traffic_mb=0.1)
    assert row["peers"] == ["onnxruntime"] and row["best_peer"] == "onnxruntime"
    assert row["openvino_status"].startswith("not installed") and "openvino_ms" not in row
    assert "pip install openvino" in row["openvino_status"]
    json.dumps(row)
    text = benchmark.format_table([row])
    assert "OpenVINO: not installed (pip install openvino" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("sq "))
    assert line.rstrip().endswith("matches") and " ort " in line


class FakeOpenVINO:
    """An OpenVINO peer that disagrees with onnxruntime (or cannot load the model)."""

    name = "openvino"
    fail = False

    def __init__(self, onnx_model, threads, feeds, output_names=None):
        if self.fail:
            raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:97:\n"
                               "Exception from src/frontends/onnx/frontend/src/frontend.cpp:1:\n"
                               "OpenVINO does not support the following ONNX operations: Foo\n")
        self.ort = OnnxruntimePeer(onnx_model, threads)
        self.config = {"INFERENCE_NUM_THREADS": threads}

    def run(self, feeds):
        return {k: v + 1e-2 * np.abs(v).max() for k, v in self.ort.run(feeds).items()}


def test_a_peer_that_disagrees_is_reported_not_timed(squeezenet, monkeypatch):
    monkeypatch.setattr(benchmark, "openvino_missing", lambda: None)
    monkeypatch.setattr(benchmark, "OpenVINOPeer", FakeOpenVINO)
    onnx_bytes, feeds, tg = squeezenet
    row = benchmark.compare(tg, onnx_bytes, 1, 2, "sq", feeds, mode="app", pause=0,
                            traffic_mb=0)
    assert row["match"] is True  # coacto's own check is unaffected
    assert row["openvino_match"] is False and row["openvino_max_rel_error"] > 1e-4
    assert row["openvino_status"].startswith("MISMATCH with onnxruntime")
    assert row["peers"] == ["onnxruntime"] and "openvino_ms" not in row
    assert "openvino MISMATCH" in benchmark.format_table([row])
    # a model OpenVINO cannot load: its reason, in one line
    monkeypatch.setattr(FakeOpenVINO, "fail", True)
    row = benchmark.compare(tg, onnx_bytes, 1, 1, "sq", feeds, mode="app", pause=0,
                            traffic_mb=0)
    assert row["openvino_status"] == ("failed: OpenVINO does not support the following ONNX "
                                      "operations: Foo")
    assert row["peers"] == ["onnxruntime"]


def test_app_mode_on_a_tile_graph_alone(squeezenet):
    """A .ctg holds no ONNX: coacto alone, first inference and spread, no ratio."""
    _, feeds, tg = squeezenet
    row = benchmark.compare(tg, None, 1, 3, "sq.ctg", feeds, mode="app", pause=0, traffic_mb=0)
    assert row["runs"] == 3 and row["coacto_first_ms"] > 0 and row["peers"] == []
    assert "ratio" not in row and "match" not in row
    assert "sq.ctg" in benchmark.format_table([row])


def test_memory_traffic_writes_then_reads_the_whole_buffer():
    traffic = benchmark.MemoryTraffic(0.8)
    traffic()
    traffic()
    n = 800_000 // 8
    assert traffic.buffer.size == n and (traffic.buffer == 2).all() and traffic.sink == 2 * n
    benchmark.MemoryTraffic(0)()  # nothing to do


def test_openvino_message_keeps_the_line_that_says_what_went_wrong():
    e = RuntimeError("Exception from src/a.cpp:1:\nException from src/b.cpp:2:\nbad shape\n")
    assert openvino_message(e) == "bad shape"
    assert openvino_message(RuntimeError("")) == "RuntimeError"


@pytest.mark.skipif(not OPENVINO, reason="openvino is not installed (pip install openvino)")
@pytest.mark.parametrize("name", ["squeezenet", "bert"])
def test_openvino_agrees_with_onnxruntime(name):
    """OpenVINO as coacto bench sets it up (f32, latency hint, the thread count, the feeds'
    static shapes) computes what onnxruntime computes, within the bench's bound; a transformer
    with int64 token ids too."""
    from coacto.peer import OpenVINOPeer

    kw = ({"image_size": 32} if name == "squeezenet"
          else {"layers": 1, "hidden": 64, "heads": 4, "seq_len": 16})
    model = zoo.build(name, **kw)
    feeds = zoo.input_feeds(model)
    onnx_bytes = model.SerializeToString()
    ort = OnnxruntimePeer(onnx_bytes, 2)
    ov = OpenVINOPeer(onnx_bytes, 2, feeds, ort.output_names)
    assert ov.config["INFERENCE_NUM_THREADS"] == 2 and ov.config["NUM_STREAMS"] == 1
    assert ov.config["PERFORMANCE_HINT"] == "LATENCY"
    assert ov.config["INFERENCE_PRECISION_HINT"] == "f32"
    ref = ort.run(feeds)
    got = ov.run(feeds)
    assert list(got) == list(ref)
    err, match = benchmark.check_outputs(got, ref)
    assert match, err
    assert [p.get_partial_shape().is_static for p in ov.compiled.inputs] == [True] * len(feeds)
