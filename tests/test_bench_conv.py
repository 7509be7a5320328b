"""experiments/bench_conv.py: one-layer models timed by both runtimes' profilers, outputs checked."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_conv.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_conv", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_small_shapes_agree_with_onnxruntime_and_report_times(capsys):
    bench = load()
    rc = bench.main(["--shapes", "8,16,9,3", "16,32,10,3,2", "12,20,6,1", "--runs", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [r["shape"] for r in out["results"]] == ["8,16,9,3", "16,32,10,3,2", "12,20,6,1"]
    for row in out["results"]:
        assert row["max_rel_error"] <= 1e-4
        assert row["coacto_ms"] > 0 and row["onnxruntime_ms"] > 0
        assert row["ratio"] == pytest.approx(row["coacto_ms"] / row["onnxruntime_ms"])
    # the stride-2 layer's FLOPs count its 5 x 5 output
    s2 = out["results"][1]
    assert s2["coacto_gflops"] == pytest.approx(2 * 32 * 16 * 9 * 25 / (s2["coacto_ms"] * 1e6))


@pytest.mark.parametrize("bad", ["1,2,3", "8,16,0,3", "8,16,3,3,0", "resnet"])
def test_bad_shapes_are_refused_with_usage(bad, capsys):
    bench = load()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--shapes", bad])
    assert exc.value.code == 2
    assert "shape" in capsys.readouterr().err


def test_named_shapes_are_listed(capsys):
    assert load().main(["--list"]) == 0
    assert "r14-reduce" in capsys.readouterr().out
