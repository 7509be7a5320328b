"""The experiments' shared machinery: tables, settings files, figures, progress, and one real
bandwidth sweep on the testbed (a small model, three policies, one bandwidth)."""
from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import fig_bandwidth  # noqa: E402
import harness as H  # noqa: E402


def row(model, bw, policy, ms, system="coacto"):
    return {"system": system, "model": model, "nominal_mbps": bw, "policy": policy,
            "median_ms": ms, "measured_up_mbps": bw * 0.95}


def test_best_table_compares_dynamic_with_the_best_baseline_per_setting():
    rows = [row("resnet50", 5, "local", 600), row("resnet50", 5, "cloud", 1100),
            row("resnet50", 5, "split", 580), row("resnet50", 5, "dynamic", 590),
            row("resnet50", 100, "local", 600), row("resnet50", 100, "cloud", 200),
            row("resnet50", 100, "dynamic", 150), row("resnet50", 100, "dynamic", 170),
            row("resnet50", 100, "dynamic", 400, system="coacto-ref x")]
    t = {r["nominal_mbps"]: r for r in fig_bandwidth.best_table(rows, H.POLICIES)}
    assert t[5]["best_baseline"] == "split"
    assert t[5]["dynamic_over_best"] == pytest.approx(590 / 580)
    assert t[100]["best_baseline"] == "cloud" and t[100]["dynamic"] == pytest.approx(160)
    assert t[100]["dynamic_over_best"] == pytest.approx(0.8)
    assert t[100]["ref_dynamic"] == 400 and t[5]["ref_dynamic"] is None
    assert t[100]["measured_mbps"] == pytest.approx(95)


def test_tables_carry_their_settings_and_machine(tmp_path):
    rows = [{"a": 1, "b": 0.1234567}, {"a": 2, "c": "x"}]
    path = H.write_table(tmp_path, "fig", rows, {"quota": 0.25, "testbed": {"mode": "netns"}})
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert [r["a"] for r in got] == ["1", "2"] and got[0]["b"] == "0.123457" and got[1]["c"] == "x"
    meta = json.loads((tmp_path / "fig.settings.json").read_text())
    assert meta["quota"] == 0.25 and meta["testbed"]["mode"] == "netns"
    assert meta["machine"]["cores"] == os.cpu_count() and meta["machine"]["cpu"]


def test_bandwidth_plot_is_a_png(tmp_path):
    rows = [row(m, bw, p, 100.0 * (1 + i) / bw ** 0.3) for m in ("resnet50", "bert")
            for bw in (5, 20, 100) for i, p in enumerate(H.POLICIES)]
    rows += [row("resnet50", bw, "dynamic", 300, system="coacto-ref x") for bw in (5, 20, 100)]
    path = fig_bandwidth.plot(tmp_path, rows, H.POLICIES, {"quota": 0.25})
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_progress_reports_an_eta():
    out = io.StringIO()
    p = H.Progress(10, "x", stream=out)
    p.step(5, "half")
    assert "50.0%" in out.getvalue() and "eta" in out.getvalue() and "half" in out.getvalue()


def test_summarize_and_medians():
    s = H.summarize([0.3, 0.1, 0.2])
    assert s["median_ms"] == pytest.approx(200) and s["min_ms"] == pytest.approx(100)
    assert s["p95_ms"] == pytest.approx(300) and s["n"] == 3
    rows = [{"k": 1, "median_ms": 3.0, "p": "a"}, {"k": 1, "median_ms": 5.0, "p": "a"},
            {"k": 2, "median_ms": 7.0, "p": "b"}]
    assert H.medians_by(rows, "k", p="a") == {1: 4.0}


def test_multitenant_compares_each_devices_pooled_p95():
    import fig_multitenant

    def row(dev, policy, rnd, lat):
        return {"devices": 4, "device": dev, "model": f"m{dev}", "policy": policy,
                "round": rnd, "latencies_ms": " ".join(str(x) for x in lat)}

    rows = [row(0, "local", 0, range(10, 30)), row(0, "local", 1, [100]),
            row(0, "dynamic", 0, range(5, 25)), row(0, "dynamic", 1, [50]),
            row(1, "local", 0, [10, 10]), row(1, "dynamic", 0, [12, 12])]
    got = fig_multitenant.dynamic_over_local_p95(rows)
    # device 0: 21 latencies each, p95 the 20th of 21: local 29, dynamic 24
    assert got == [(4, 0, "m0", pytest.approx(24 / 29)), (4, 1, "m1", pytest.approx(1.2))]
    # --control: device 1 alone while the others ran dynamic
    rows.append(row(1, fig_multitenant.CONTROL, 0, [15, 15]))
    got = fig_multitenant.dynamic_over_local_p95(rows, fig_multitenant.CONTROL)
    assert got == [(4, 1, "m1", pytest.approx(0.8))]


def test_multitenant_chunks_keep_every_inference_in_order():
    import fig_multitenant as M

    assert H.chunk_sizes(20, None) == [20] and H.chunk_sizes(20, 40) == [20]
    assert H.chunk_sizes(20, 5) == [5, 5, 5, 5] and H.chunk_sizes(7, 3) == [3, 3, 1]
    acc: dict = {}
    for c, k in enumerate(H.chunk_sizes(7, 3)):
        lat = [c + j / 10 for j in range(k)]
        M.merge(acc, [{"latencies_s": lat, "stats": [{"c": c}] * k, "max_rel_error": c * 1e-6},
                      {"latencies_s": [9.0] * k, "stats": [{}] * k, "max_rel_error": 0.0}],
                wall=2.0)
    first, second = acc["results"]
    assert first["latencies_s"] == [0, 0.1, 0.2, 1, 1.1, 1.2, 2]
    assert [s["c"] for s in first["stats"]] == [0, 0, 0, 1, 1, 1, 2]
    assert first["max_rel_error"] == 2e-6 and second["latencies_s"] == [9.0] * 7
    assert acc["inferences"] == 14 and acc["wall_s"] == 6.0


def test_fig_sim_refuses_an_unknown_figure(capsys, tmp_path):
    import fig_sim

    with pytest.raises(SystemExit) as e:
        fig_sim.main(["--figures", "sim_bandwidth", "--out", str(tmp_path)])
    assert e.value.code == 2 and "choose from cores, devices, bandwidth" in capsys.readouterr().err


def test_run_all_refuses_an_unknown_figure(capsys):
    import run_all

    with pytest.raises(SystemExit) as e:
        run_all.main(["--out", "/tmp/x", "--only", "bandwidth,nonsense"])
    assert e.value.code == 2 and "nonsense" in capsys.readouterr().err


def test_a_profile_of_another_machine_does_not_fit(tmp_path):
    import sim_bridge

    shipped = json.loads((EXPERIMENTS.parent / "profiles" / f"{sim_bridge.PROFILE}.json")
                         .read_text())
    fits, why = sim_bridge.profile_fits(str(EXPERIMENTS.parent / "profiles" /
                                            f"{sim_bridge.PROFILE}.json"))
    assert isinstance(fits, bool) and why
    other = dict(shipped, cpu=dict(shipped["cpu"], model="Some Other CPU 9000"))
    (tmp_path / "other.json").write_text(json.dumps(other))
    fits, why = sim_bridge.profile_fits(str(tmp_path / "other.json"))
    assert not fits and "Some Other CPU 9000" in why
    # one name, other caches: two virtual machines' EPYCs of different generations
    here = sim_bridge.profile_fits(str(EXPERIMENTS.parent / "profiles" /
                                       f"{sim_bridge.PROFILE}.json"))
    caches = dict(shipped["cpu"].get("caches") or {}, L1d=12345)  # no machine's
    other = dict(shipped, cpu=dict(shipped["cpu"], caches=caches))
    (tmp_path / "caches.json").write_text(json.dumps(other))
    fits, why = sim_bridge.profile_fits(str(tmp_path / "caches.json"))
    assert not fits and "caches" in why and "12345" in why, (here, why)
    partial = {k: v for k, v in shipped.items() if k != "engine"}
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    fits, why = sim_bridge.profile_fits(str(tmp_path / "partial.json"))
    assert not fits and "engine" in why
    fits, why = sim_bridge.profile_fits(str(tmp_path / "missing.json"))
    assert not fits and "cannot read" in why


def test_sessions_replay_the_recorded_plans_and_the_probe():
    import sim_bridge

    rows = [{"policy": "split", "cuts": "21 21"},
            {"policy": "dynamic", "frontiers": "device;cut /a/Conv"},
            {"policy": "fl", "cuts": "15 15"}]
    plans = sim_bridge.real_cuts(rows)
    assert plans == {"split": [21, 21], "dynamic": ["device", "cut /a/Conv"]}
    seq = sim_bridge.session(["local", "split", "fl", "dynamic"], 2, 1, warmup=2, cuts=plans,
                             probe=3, alternate=False)
    assert seq[0] == ("dynamic", 2) and seq[1] == ("local", 3) and seq[-1] == ("local", 3)
    # round 1 starts at the second policy (results recorded before the order alternated)
    assert seq[2:-1] == [("split", 1, {"split_layer": 21}), ("split", 1, {"split_layer": 21}),
                         ("fl", 2), ("dynamic", 1, {"frontier": "device"}),
                         ("dynamic", 1, {"frontier": "cut /a/Conv"}), ("local", 2)]
    # and now, as H.rotation runs it: rotated, then reversed on an odd round
    seq = sim_bridge.session(["local", "split", "fl", "dynamic"], 2, 1, warmup=2, cuts=plans,
                             probe=3)
    assert [s[0] for s in seq[2:-1]] == ["local"] + ["dynamic"] * 2 + ["fl"] + ["split"] * 2
    # in turns of one inference (fig_bandwidth --chunk 1): each turn every policy once, in the
    # harness's order for that turn, the recorded plans in their order
    seq = sim_bridge.session(["split", "dynamic"], 3, 0, warmup=1,
                             cuts={"split": [21, 22, 23], "dynamic": ["device", "inputs", "x"]},
                             chunk=1)
    assert seq[0] == ("dynamic", 1)
    turns = [seq[1 + 2 * t:3 + 2 * t] for t in range(3)]
    assert [[s[0] for s in turn] for turn in turns] == \
        [H.turn_order(["split", "dynamic"], t) for t in range(3)]
    assert [s[2] for s in seq[1:] if s[0] == "split"] == \
        [{"split_layer": c} for c in (21, 22, 23)]
    assert [s[2]["frontier"] for s in seq[1:] if s[0] == "dynamic"] == ["device", "inputs", "x"]
    seq = sim_bridge.session(["local", "cloud"], 5, 0, chunk=2)
    assert [k for _, k in seq[1:]] == [2, 2, 2, 2, 1, 1]


def test_turns_vary_which_policy_goes_before_which():
    """A chunked run's turns: the round's order first, then permutations drawn per turn, the
    same each time; over ten turns each policy follows at least two different ones."""
    order = ["local", "cloud", "split", "fl", "dynamic"]
    assert H.turn_order(order, 0) == order
    turns = [H.turn_order(order, t) for t in range(10)]
    assert turns == [H.turn_order(order, t) for t in range(10)]
    assert all(sorted(t) == sorted(order) for t in turns)
    flat = [p for t in turns for p in t]
    before = {p: {flat[i - 1] for i in range(1, len(flat)) if flat[i] == p} for p in order}
    assert all(len(b) >= 2 for b in before.values()), before


class _FakeDevice:
    """What run_policies asks of a device, recording the order of the runs."""

    def __init__(self):
        self.calls: list = []

    def fresh_client(self, bw):
        self.calls.append("fresh")

    def learn(self, bw):
        return {"inferences": 1, "latencies_s": [0.5]}

    def probe(self, runs):
        return [0.1] * runs

    def run(self, policy, repeat, warmup, bandwidth):
        n = sum(1 for c in self.calls if c[0] == policy)
        self.calls.append((policy, repeat))
        lat = [n + j / 10 for j in range(repeat)]
        stats = [{"tiles_sent": 1, "tiles_from_server": 0, "bytes_sent": 8, "fallback": False,
                  "finished_by": "device", "frontier": f"f{n}", "predicted_s": 0.25,
                  "device_process": {"user_ms": 1.0, "sys_ms": 0.0}}] * repeat
        return {"latencies_s": lat, "stats": stats, "max_rel_error": n * 1e-7,
                "estimates": {"bandwidth_est_mbps": 10 + n, "rtt_est_ms": 1.0, "alpha": 1.0,
                              "server_flops": 1e9}}


def test_run_policies_takes_turns_and_keeps_every_inference():
    dev = _FakeDevice()
    rows = H.run_policies(dev, ["local", "dynamic"], 5, 0, None, {"model": "m"}, chunk=2)
    assert dev.calls[0] == "fresh" and [k for _, k in dev.calls[1:]] == [2, 2, 2, 2, 1, 1]
    assert [[p for p, _ in dev.calls[1 + 2 * t:3 + 2 * t]] for t in range(3)] == \
        [H.turn_order(["local", "dynamic"], t) for t in range(3)]
    dyn = next(r for r in rows if r["policy"] == "dynamic")
    assert dyn["latencies_ms"] == "0.0 100.0 1000.0 1100.0 2000.0" and dyn["n"] == 5
    assert dyn["frontiers"] == "f0;f0;f1;f1;f2" and dyn["predicted_ms"] == " ".join(["250.0"] * 5)
    assert dyn["client_goodput_mbps"] == 12 and dyn["warmup_ms"] == "500.0"
    dev = _FakeDevice()  # without chunks: each policy's inferences at once, as before
    H.run_policies(dev, ["local", "dynamic"], 5, 0, None, {"model": "m"})
    assert dev.calls == ["fresh", ("local", 5), ("dynamic", 5)]


# ----------------------------------------------------------------------------- real runs

def _run_script(script: str, *args, timeout=300):
    import subprocess

    r = subprocess.run([sys.executable, str(EXPERIMENTS / script), *map(str, args),
                        "--testbed-name", "cxe" + str(os.getpid() % 100000)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_models_may_be_onnx_files_named_by_their_stem(tmp_path, monkeypatch):
    import argparse

    monkeypatch.setattr(H, "MODEL_FILES", {})
    (tmp_path / "mine.onnx").write_bytes(b"")

    def resolve(models):
        ap = argparse.ArgumentParser()
        H.add_common_args(ap)
        args = ap.parse_args(["--models", models, "--out", str(tmp_path)])
        H.resolve_common(args)
        return args.models

    assert resolve(f"resnet50,{tmp_path / 'mine.onnx'}") == ["resnet50", "mine"]
    assert H.MODEL_FILES == {"mine": (tmp_path / "mine.onnx").resolve()}
    for models, says in [(str(tmp_path / "absent.onnx"), "no such ONNX file"),
                         (f"{tmp_path / 'mine.onnx'},mine", "named mine"),
                         ("resnet5", "or give an ONNX file")]:
        with pytest.raises(SystemExit, match=says):
            resolve(models)
    (tmp_path / "vgg16.onnx").write_bytes(b"")
    with pytest.raises(SystemExit, match="rename the file"):
        resolve(str(tmp_path / "vgg16.onnx"))


def test_the_simulator_finds_a_model_file_by_its_name(tmp_path):
    import sim_bridge
    from coacto import zoo

    path = zoo.save("squeezenet", tmp_path / "mine.onnx", image_size=32)
    tg = sim_bridge.graph("mine", None, {"mine": str(path)})
    assert tg.model_hash == sim_bridge.graph(str(path)).model_hash


@pytest.mark.parametrize("argv, says", [
    (["--device-cpus", "0"], "one per device"),
    (["--device-cpus", "0,4096"], "CPU 4096"),
    (["--device-cpus", "0,x"], "'x' is not a CPU list"),
    (["--chunk", "0"], "--chunk"),
    (["--repeat", "0"], "--repeat"),
])
def test_multitenant_refuses_bad_settings_before_starting(argv, says, capsys):
    import fig_multitenant

    with pytest.raises(SystemExit):
        fig_multitenant.main(["--devices", "2", "--models", "squeezenet,mobilenetv2", *argv])
    assert says in capsys.readouterr().err


def test_a_small_bandwidth_sweep_on_the_testbed(tmp_path):
    # a model file of the user's, exported in another tool's style (the ONNX model zoo's:
    # opset 9, initializers listed as graph inputs)
    from coacto import zoo

    model = zoo.save("mobilenetv2", tmp_path / "mnv2_zoo_style.onnx", style="zoo", image_size=64)
    r = _run_script("fig_bandwidth.py", "--models", str(model),
                    "--bandwidths", "50", "--policies", "local,cloud,dynamic", "--repeat", "1",
                    "--rounds", "1", "--no-ref", "--out", tmp_path / "out")
    tmp_path = tmp_path / "out"
    with open(tmp_path / "bandwidth.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["model"] for r in rows} == {"mnv2_zoo_style"}
    assert sorted(r["policy"] for r in rows) == ["cloud", "dynamic", "local"]
    meta = json.loads((tmp_path / "bandwidth.settings.json").read_text())
    for row in rows:
        assert float(row["max_rel_error"]) <= 1e-4 and float(row["median_ms"]) > 0
        if meta["testbed"]["mode"] == "netns":  # the kernel shapes: the measured goodput says so
            assert 0.6 * 50 < float(row["measured_up_mbps"]) < 1.1 * 50
    cloud = next(r for r in rows if r["policy"] == "cloud")
    assert cloud["finished_by"] == "server" and float(cloud["bytes_sent"]) > 0
    assert (tmp_path / "bandwidth.png").read_bytes()[:4] == b"\x89PNG"
    assert "dyn/best" in r.stdout


def test_the_timeline_holds_both_sides_of_a_collaborative_inference(tmp_path):
    # fused-layer stacks: the device computes its share of the first layers by construction, the
    # server the rest (whether dynamic keeps the device busy depends on estimates that a shared
    # machine's noise can tip; run_all's timeline shows a dynamic one)
    _run_script("fig_timeline.py", "--models", "vgg16", "--image-size", "112", "--bandwidth", "20",
                "--policy", "fl", "--repeat", "2", "--out", tmp_path)
    trace = json.loads((tmp_path / "timeline.json").read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"
             and e["name"] == "process_name"}
    for e in events:  # the trace-event format's required keys, per phase
        assert {"ph", "pid"} <= set(e), e
        if e["ph"] in ("X", "i", "s", "f", "C"):
            assert isinstance(e["ts"], (int, float)) and "tid" in e, e
        if e["ph"] == "X":
            assert e["dur"] >= 0
    tiles_by_process = {}
    for e in events:
        if e.get("ph") == "X" and "tile" in e.get("args", {}):
            p = names[e["pid"]].split()[0]
            tiles_by_process[p] = tiles_by_process.get(p, 0) + 1
    assert tiles_by_process.get("device", 0) > 0 and tiles_by_process.get("server", 0) > 0, \
        tiles_by_process
    starts = {e["id"] for e in events if e.get("ph") == "s"}
    ends = {e["id"] for e in events if e.get("ph") == "f"}
    assert starts and starts == ends
    assert (tmp_path / "timeline.png").stat().st_size > 20_000


def test_a_short_soak_loses_nothing_across_a_server_restart(tmp_path):
    # two device processes, a keyed server restarted half-way: every request answered and right
    # (fallbacks while the server is away are the design); too short to judge RSS and fds
    import subprocess

    r = subprocess.run([sys.executable, str(EXPERIMENTS / "soak.py"), "--devices", "2",
                        "--inferences", "10", "--think-ms", "20", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "soak.json").read_text())
    assert s["passed"] and s["answered"] == s["inferences"] == 20
    assert s["wrong"] == 0 and s["lost"] == 0 and s["max_rel_error"] <= 1e-4
    assert s["restart"]["exit_status"] == 0 and s["server_exit_status"] == 0
    assert len(s["server_incarnations"]) == 2
    with open(tmp_path / "soak.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20 and all(r["ok"] == "True" for r in rows)


def test_the_micro_kernels_instructions_are_counted_under_qemu(tmp_path):
    import shutil
    import subprocess

    tools = ("aarch64-linux-gnu-gcc", "qemu-aarch64", "qemu-x86_64")
    if not all(shutil.which(t) for t in tools):
        pytest.skip(f"needs {', '.join(tools)} (Debian: gcc-aarch64-linux-gnu, qemu-user)")
    r = subprocess.run([sys.executable, str(EXPERIMENTS / "ukernel_instructions.py"), "--kc", "64",
                        "--calls", "3", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    with open(tmp_path / "ukernel_instructions.csv") as f:
        rows = {(row["kernel"], row["arch"]): row for row in csv.DictReader(f)}
    neon = rows[("gemm_f32_6x16__neon", "aarch64")]
    # at least its 24 FMLAs a step, and not the stack traffic of spilled accumulators
    assert 24 <= float(neon["instructions_per_step"]) < 50, neon
    avx2 = rows[("gemm_f32_6x16__avx2", "x86_64")]
    assert 12 <= float(avx2["instructions_per_step"]) < 40, avx2


def test_the_first_run_probe_reports_each_process(capsys):
    """experiments/bench_first_run.py on one fresh process of a small model: a JSON row with the
    first and steady latencies, a CPU per computing thread, and when the last one started."""
    import bench_first_run

    assert bench_first_run.main(["--model", "squeezenet", "--threads", "2", "--processes", "1",
                                 "--repeat", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["first_ms"] > 0 and row["steady_ms"] > 0
    assert len(row["cpus_before"]) == 2 and all(c >= 0 for c in row["cpus_before"])
    assert 0 <= row["last_worker_start_us"] < 1e6
