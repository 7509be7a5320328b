"""Auto-tuning: the per-layer tile-count hook, the profile cache (keys, validation, use by the CLI)
and the tuning loop itself on a small model."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import coacto
from coacto import ir, tune, zoo
from coacto.errors import CoactoError
from coacto.partition import partition

from conftest import assert_close, onnxruntime_outputs, zoo_model


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    monkeypatch.setenv("COACTO_PROFILE_DIR", str(d))
    return d


def _squeeze_bytes():
    return zoo.build("squeezenet", image_size=32).SerializeToString()


# ------------------------------------------------------------------------------ partition hook

def _fc_graph():
    conv = dict(kh=3, kw=3, sh=1, sw=1, pt=1, pl=1, pb=1, pr=1, dh=1, dw=1, group=1)
    layers = [ir.Layer("x", "INPUT", [], (1, 8, 16, 16)),
              ir.Layer("a", "CONV", [0], (1, 64, 16, 16), dict(conv)),
              ir.Layer("b", "CONV", [1], (1, 64, 16, 16), dict(conv))]
    return ir.Graph(layers, {"x": 0}, {"y": 2})


def test_layer_tiles_override_one_layer_only():
    graph = _fc_graph()
    base = partition(graph, 4)
    plan = partition(graph, 4, layer_tiles={2: 1})
    counts = [(len(c) - 1) * (len(r) - 1) for c, r in zip(plan.col_bounds, plan.row_bounds)]
    base_counts = [(len(c) - 1) * (len(r) - 1) for c, r in zip(base.col_bounds, base.row_bounds)]
    assert counts[2] == 1 and base_counts[2] == 4
    assert counts[:2] == base_counts[:2]
    # string keys (as JSON gives them) are accepted
    assert partition(graph, 4, layer_tiles={"2": 1}).n_tiles == plan.n_tiles


@pytest.mark.parametrize("bad", [{5: 2}, {1: 0}, {1: 2.5}, {"x": 2}, {-1: 2}])
def test_layer_tiles_rejects_bad_entries(bad):
    with pytest.raises(CoactoError, match="layer_tiles"):
        partition(_fc_graph(), 4, layer_tiles=bad)


def test_layer_tiles_change_the_graph_id_and_keep_results():
    feeds, ref = onnxruntime_outputs("squeezenet")
    model = zoo_model("squeezenet")
    default = coacto.compile(model)
    tuned = coacto.compile(model, layer_tiles={1: 1, 3: 2})
    assert "layer_tiles" not in default.params  # untuned graphs keep their ids
    assert tuned.params["layer_tiles"] == {"1": 1, "3": 2}
    assert tuned.graph_id != default.graph_id
    with coacto.Runtime(tuned, threads=2) as rt:
        assert_close(rt.run(feeds), ref)


# ------------------------------------------------------------------------------ cache

def test_profile_dir_follows_the_environment(profile_dir, monkeypatch):
    assert tune.profile_dir() == profile_dir
    monkeypatch.delenv("COACTO_PROFILE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(profile_dir.parent / "xdg"))
    assert tune.profile_dir() == profile_dir.parent / "xdg" / "coacto" / "profiles"


def test_profile_path_is_keyed_by_model_machine_and_threads(profile_dir):
    h1, h2 = "a" * 64, "b" * 64
    paths = {tune.profile_path(h, t) for h in (h1, h2) for t in (1, 2)}
    assert len(paths) == 4
    assert tune.profile_path(h1, 1, "f" * 12) != tune.profile_path(h1, 1, "e" * 12)
    info = tune.machine_info()
    assert tune.machine_fingerprint(info) == tune.machine_fingerprint(dict(info))
    other = dict(info, cpus=info["cpus"] + 1)
    assert tune.machine_fingerprint(other) != tune.machine_fingerprint(info)


def _profile(model_hash="c" * 64, threads=2, layer_tiles=None, **over):
    from coacto.partition import PARTITIONER_VERSION

    info = tune.machine_info()
    prof = {"format": tune.PROFILE_FORMAT, "model_hash": model_hash, "threads": threads,
            "machine": dict(info, fingerprint=tune.machine_fingerprint(info)),
            "partitioner": PARTITIONER_VERSION,
            "layer_tiles": {"1": 2} if layer_tiles is None else layer_tiles,
            "default_ms": 10.0, "tuned_ms": 9.0, "ratio": 0.9}
    prof.update(over)
    return prof


def test_save_and_load_round_trip(profile_dir):
    path = tune.save_profile(_profile())
    assert path.parent == profile_dir and path.exists()
    assert tune.load_profile("c" * 64, 2)["tuned_ms"] == 9.0
    assert tune.tuned_layer_tiles("c" * 64, 2) == {1: 2}
    assert tune.load_profile("c" * 64, 1) is None  # another thread count
    assert tune.load_profile("d" * 64, 2) is None  # another model
    tune.save_profile(_profile(layer_tiles={}))  # the default was best
    assert tune.load_profile("c" * 64, 2) is not None
    assert tune.tuned_layer_tiles("c" * 64, 2) is None


@pytest.mark.parametrize("change", [
    {"partitioner": -1}, {"format": 99}, {"layer_tiles": {"1": 0}}, {"layer_tiles": [1, 2]},
    {"model_hash": "e" * 64},
])
def test_stale_or_foreign_profiles_are_ignored(profile_dir, change, caplog):
    path = tune.save_profile(_profile())
    prof = json.loads(path.read_text())
    prof.update(change)
    path.write_text(json.dumps(prof))
    assert tune.load_profile("c" * 64, 2) is None
    assert "ignoring the tuned profile" in caplog.text


def test_corrupt_profile_is_ignored(profile_dir, caplog):
    path = tune.save_profile(_profile())
    path.write_text("{ not json")
    assert tune.tuned_layer_tiles("c" * 64, 2) is None
    assert "cannot read it" in caplog.text


# ------------------------------------------------------------------------------ the loop

def test_tune_measures_and_writes_a_profile(profile_dir):
    data = _squeeze_bytes()
    steps = []
    result = tune.tune(data, 1, budget_s=3, rounds=3, runs=1, final_rounds=3, progress=steps.append)
    assert result.default_ms > 0 and result.tuned_ms > 0
    assert result.ratio == pytest.approx(result.tuned_ms / result.default_ms)
    assert result.path is not None and result.path.exists()
    prof = json.loads(result.path.read_text())
    assert prof["model_hash"] == coacto.compile(data).model_hash
    assert prof["threads"] == 1 and prof["ratio"] == pytest.approx(result.ratio)
    assert any(s.startswith("final check") for s in steps)
    # a kept change is one that beat the incumbent by more than its noise band
    for s in result.steps:
        if s["kept"]:
            assert 1 - s["candidate_ms"] / s["best_ms"] > s["noise"]
    # what the profile holds is what compile then uses
    lt = tune.tuned_layer_tiles(prof["model_hash"], 1)
    assert lt == ({int(k): v for k, v in prof["layer_tiles"].items()} or None)


def test_tune_rejects_bad_arguments(profile_dir):
    with pytest.raises(CoactoError):
        tune.tune(_squeeze_bytes(), 0)
    with pytest.raises(CoactoError):
        tune.tune(_squeeze_bytes(), 1, rounds=2)


def test_tune_checks_the_profile_folder_before_measuring(tmp_path, monkeypatch):
    """A profile folder that cannot hold profiles is reported at once, not after the search."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("COACTO_PROFILE_DIR", str(blocker))

    def no_measuring(*args, **kwargs):
        raise AssertionError("tune measured before checking where its profile goes")

    monkeypatch.setattr(tune, "_Bench", no_measuring)
    with pytest.raises(CoactoError, match="is a file, not a folder.*--no-save"):
        tune.tune(_squeeze_bytes(), 1)
    monkeypatch.setenv("COACTO_PROFILE_DIR", str(blocker / "sub"))  # a folder under a file
    with pytest.raises(CoactoError, match="cannot write profiles to .*COACTO_PROFILE_DIR"):
        tune.tune(_squeeze_bytes(), 1)
    # --no-save needs no folder: the check is skipped and the search starts
    with pytest.raises(AssertionError, match="measured before"):
        tune.tune(_squeeze_bytes(), 1, save=False)


def test_tune_reports_its_result_when_the_profile_cannot_be_written(profile_dir, monkeypatch):
    def disk_full(profile):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tune, "save_profile", disk_full)
    with pytest.raises(CoactoError, match=r"tuned [0-9.]+ ms against the default's [0-9.]+ ms.*"
                                          r"No space left on device.*layer tiles"):
        tune.tune(_squeeze_bytes(), 1, budget_s=1, rounds=3, runs=1, final_rounds=3)


def test_cli_tune_reports_an_unusable_profile_folder(tmp_path):
    import os

    blocker = tmp_path / "prof"
    blocker.write_text("x")
    env = dict(os.environ, COACTO_PROFILE_DIR=str(blocker))
    r = _coacto("tune", "squeezenet", "--image-size", 32, "--threads", 1, env=env, timeout=120)
    assert r.returncode != 0
    assert "is a file, not a folder" in r.stderr and "Traceback" not in r.stderr
    assert "pass 1" not in r.stderr  # nothing was measured


def _coacto(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "coacto.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_tune_then_compile_uses_the_profile(profile_dir, tmp_path, monkeypatch):
    import os

    model = tmp_path / "sq.onnx"
    model.write_bytes(_squeeze_bytes())
    env = dict(os.environ, COACTO_PROFILE_DIR=str(profile_dir))
    r = _coacto("tune", model, "--threads", 1, "--budget", 2, "--rounds", 3, "--runs", 1,
                "--final-rounds", 3, "--json", env=env)
    assert r.returncode == 0, r.stderr
    prof = json.loads(r.stdout)
    assert prof["threads"] == 1 and "ratio" in prof and prof["path"]
    assert "final check" in r.stderr  # progress on stderr
    # a second run does not tune again without --force
    r = _coacto("tune", model, "--threads", 1, env=env)
    assert r.returncode == 0 and "--force" in r.stdout
    # compile picks the profile up (forced to hold an override, so the graph must differ)
    h = prof["model_hash"]
    forced = _profile(model_hash=h, threads=1, layer_tiles={"1": 1})
    tune.save_profile(forced)
    r1 = _coacto("compile", model, "--threads", 1, "-o", tmp_path / "t.ctg", "--json", env=env)
    r2 = _coacto("compile", model, "--threads", 1, "-o", tmp_path / "d.ctg", "--json",
                 "--no-tuned", env=env)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    tuned, default = json.loads(r1.stdout), json.loads(r2.stdout)
    assert tuned["params"]["layer_tiles"] == {"1": 1} and "using the tuned tile counts" in r1.stderr
    assert "layer_tiles" not in default["params"]
    assert tuned["graph_id"] != default["graph_id"]
    # --tiles wins over a profile
    r3 = _coacto("compile", model, "--threads", 1, "--tiles", 3, "-o", tmp_path / "x.ctg", "--json",
                 env=env)
    assert "layer_tiles" not in json.loads(r3.stdout)["params"]
