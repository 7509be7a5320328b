"""The simulator (coacto.sim) against schedules computed by hand on tiny tile graphs, its use of the
runtime's send rule, every policy on a zoo model, bandwidth traces, profiles and its CLIs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import coacto
from coacto import ir, protocol as P
from coacto.partition import TilePlan
from coacto.sim import (BandwidthTrace, ProfileError, SimError, TraceError, load_profile,
                        lte_trace, simulate, wifi_trace)
from coacto.sim import rule as sim_rule
from coacto.sim.device import _CONTROL_BYTES, tiles_header_bytes
from coacto.sim.profiles import OP_CLASSES
from coacto.sim.server import _HEADER_BYTES
from coacto.tilegraph import TileGraph

from conftest import zoo_model

CLASSES = {c: 1.0 for c in OP_CLASSES}
#: 1 GFLOP/s per thread, 2 cores; a 1e6-FLOP tile takes 1 ms
DEVICE = {"name": "hand-device", "cores": 2, "source": "test",
          "gflops": {"1": CLASSES, "2": {c: 2.0 for c in OP_CLASSES}}, "tile_overhead_us": 0.0}
#: 10 GFLOP/s per thread at any count: a 1e6-FLOP tile takes 0.1 ms
SERVER = {"name": "hand-server", "cores": 16, "source": "test",
          "gflops": {"1": {c: 10.0 for c in OP_CLASSES}}, "tile_overhead_us": 0.0}


def chain(tiles=(2, 2, 2, 1), flops=1e6, in_bytes=1000, out_bytes=400) -> TileGraph:
    """An input layer and 1x1 convolutions: tile j of a layer reads tile j of the layer before
    (all of them when the counts differ); every computed tile has ``flops`` and ``out_bytes``."""
    layers, parents, offsets = [], [], [0]
    first = np.concatenate([[0], np.cumsum(tiles)]).astype(np.int64)
    for li, n in enumerate(tiles):
        if li == 0:
            layers.append(ir.Layer("x", "INPUT", [], (1, 4, 1, n)))
        else:
            layers.append(ir.Layer(f"conv{li}", "CONV", [li - 1], (1, 4, 1, n),
                                   {"kh": 1, "kw": 1, "group": 1, "sh": 1, "sw": 1}))
        for j in range(n):
            if li:
                prev = range(first[li - 1], first[li])
                parents += [first[li - 1] + j] if tiles[li - 1] == n else list(prev)
            offsets.append(len(parents))
    n_tiles = int(first[-1])
    tile_layer = np.repeat(np.arange(len(tiles)), tiles).astype(np.int32)
    plan = TilePlan(
        col_bounds=[np.arange(n + 1) for n in tiles], row_bounds=[np.array([0, 4])] * len(tiles),
        layer_first_tile=first, tile_layer=tile_layer,
        tile_bounds=np.zeros((n_tiles, 4), np.int32),
        parent_offsets=np.asarray(offsets, np.int32), parents=np.asarray(parents, np.int32),
        tile_flops=np.where(tile_layer == 0, 0.0, flops),
        tile_bytes=np.where(tile_layer == 0, in_bytes, out_bytes).astype(np.int64))
    graph = ir.Graph(layers, {"x": 0}, {"y": len(tiles) - 1}, model_hash="hand")
    return TileGraph(graph, plan, {}, "hand", b"", [[] for _ in tiles])


def sim(tg, policy, **kw):
    kw.setdefault("device", DEVICE)
    kw.setdefault("server", SERVER)
    kw.setdefault("rtt_ms", 2.0)
    if "trace" not in kw:
        kw.setdefault("bandwidth_mbps", 8.0)  # 1e6 bytes/s
    return simulate(tg, policy, **kw)


# ---------------------------------------------------------------------------- by hand

def test_device_alone_one_and_two_threads():
    tg = chain()  # 5 computed tiles of 1 ms each at 1 GFLOP/s
    r = sim(tg, "local", device_threads=1)
    assert r.p50 == pytest.approx(5e-3, rel=1e-12)
    # two threads: the two column chains run side by side, the last tile joins them
    r = sim(tg, "local", device_threads=2)
    assert r.p50 == pytest.approx(3e-3, rel=1e-12)
    (inf,) = r.inferences
    assert inf.tiles_local == 5 and inf.tiles_server == 0 and inf.tiles_sent == 0
    rows = inf.schedule()
    assert {w for _, side, w, _, _ in rows} == {0, 1} and {s for _, s, *_ in rows} == {"device"}
    assert rows[-1][3:] == pytest.approx((2e-3, 3e-3))


def test_quota_and_per_tile_overhead():
    tg = chain()
    dev = dict(DEVICE, tile_overhead_us=100.0)
    # a quarter of one core: every tile (kernel and overhead) takes four times as long
    r = sim(tg, "local", device=dev, device_threads=1, quota=0.25)
    assert r.p50 == pytest.approx(4 * 5 * (1e-3 + 100e-6), rel=1e-12)
    # the quota is shared by the busy threads: two in half a core run at a quarter of a core
    # each (two layers of two tiles), the last tile alone gets the whole half core
    r = sim(tg, "local", device=dev, device_threads=2, quota=0.5)
    assert r.p50 == pytest.approx((4 + 4 + 2) * (1e-3 + 100e-6), rel=1e-12)


@pytest.mark.parametrize("cores,compute", [(1, 5 * 1e-4), (2, 3 * 1e-4)])
def test_cloud_latency_is_serialisation_rtt_and_server_compute(cores, compute):
    tg = chain()
    r = sim(tg, "cloud", server_cores=cores)
    (inf,) = r.inferences
    # BEGIN, then both input tiles in one message (send_whole), at 1e6 bytes/s; half an RTT
    up = _CONTROL_BYTES[P.BEGIN] + tiles_header_bytes(1, 1) + 4 * 2 + 2 * 1000
    # the exit tile comes back in a RESULT: header, its id, its 400 bytes; half an RTT
    down = _HEADER_BYTES[P.RESULT] + 4 + 400
    assert inf.latency_s == pytest.approx(up / 1e6 + 1e-3 + compute + down / 1e6 + 1e-3, rel=1e-12)
    assert inf.finished_by == "server" and inf.tiles_local == 0 and inf.tiles_server == 5
    assert inf.tiles_sent == 2 and inf.bytes_sent == up
    server_rows = [row for row in inf.schedule() if row[1] == "server"]
    assert len(server_rows) == 5
    assert min(row[3] for row in server_rows) == pytest.approx(up / 1e6 + 1e-3)


def test_bandwidth_step_mid_transfer_gives_the_hand_computed_finish():
    tg = chain(in_bytes=50_000)
    step = 0.004  # 100 Mbit/s (12.5e6 B/s) until 4 ms, then 5 Mbit/s (625e3 B/s)
    trace = [(0.0, 100.0), (step, 5.0)]
    r = sim(tg, "cloud", trace=trace, server_cores=2)
    up = _CONTROL_BYTES[P.BEGIN] + tiles_header_bytes(1, 1) + 4 * 2 + 2 * 50_000
    released = step + (up - 12.5e6 * step) / 625e3
    down = _HEADER_BYTES[P.RESULT] + 4 + 400
    assert r.p50 == pytest.approx(released + 1e-3 + 3e-4 + down / 625e3 + 1e-3, rel=1e-12)


def test_trace_transfer_end_and_validation():
    tr = BandwidthTrace([(0, 100), (1, 0), (2, 8)])
    assert tr.transfer_end(0.5, 12.5e6 * 0.5) == pytest.approx(1.0)
    # the link is down from 1 to 2 s: what is left crosses at 1e6 B/s from 2 s
    assert tr.transfer_end(0.5, 12.5e6 * 0.5 + 1e6) == pytest.approx(3.0)
    assert tr.mbps_at(1.5) == 0 and tr.mean_mbps(3.0) == pytest.approx((100 + 0 + 8) / 3)
    for bad in ([], [(1, 5)], [(0, 5), (0, 6)], [(0, -1)], [(0, 5), (1, 0)]):
        with pytest.raises(TraceError):
            BandwidthTrace(bad)
    a, b = lte_trace(10, seed=3), lte_trace(10, seed=3)
    assert a.steps == b.steps and a.steps != lte_trace(10, seed=4).steps
    assert "synthetic" in a.name.lower() and "synthetic" in wifi_trace(5).name.lower()
    assert wifi_trace(60).mean_mbps(60) > lte_trace(60).mean_mbps(60)


# ---------------------------------------------------------------------------- the send rule

class Spy:
    """Stands in for the cffi lib: counts coacto_send_rule calls and delegates (or answers)."""

    def __init__(self, real, answer=None):
        self.real, self.answer, self.calls = real, answer, []

    def coacto_send_rule(self, params, now, queued, nbytes, work, off, srv):
        got = self.real.coacto_send_rule(params, now, queued, nbytes, work, off, srv)
        self.calls.append((now, queued, nbytes, work, got, off[0], srv[0]))
        return got if self.answer is None else self.answer

    def __getattr__(self, name):
        return getattr(self.real, name)


def _dynamic_with_decisions():
    # The input is the best start (2 ms on the link + 2 ms RTT + 0.5 ms at the server vs 5 ms
    # here): local work waits for the input to leave, then the device computes and decides.
    return sim(chain(), "dynamic", device_threads=1, server_cores=1, inferences=2)


def test_send_decisions_go_through_the_runtimes_rule(monkeypatch):
    spy = Spy(sim_rule.lib)
    monkeypatch.setattr(sim_rule, "lib", spy)
    r = _dynamic_with_decisions()
    decisions = sum(i.decisions for i in r.inferences)
    assert decisions > 0 and len(spy.calls) == decisions
    assert sum(i.decided_sent for i in r.inferences) == sum(c[4] for c in spy.calls)
    for now, queued, nbytes, work, sent, off, srv in spy.calls:
        assert nbytes == 400 and work in (1e6, 2e6, 3e6, 5e6) and sent == (off < srv)
    # the simulator acts on the callee's answer, whatever it is
    always = Spy(spy.real, answer=1)
    monkeypatch.setattr(sim_rule, "lib", always)
    r = _dynamic_with_decisions()
    assert sum(i.decided_sent for i in r.inferences) == sum(i.decisions for i in r.inferences) > 0


def test_decide_returns_the_rules_completion_times():
    p = sim_rule.OffloadParams()
    p.set(bandwidth=1e6, rtt=0.010, inputs_at_server=0.5, server_flops=1e10, alpha=2.0)
    # the example of tests/test_send_rule.py: 1.055 offloaded vs 0.7 at the server
    assert sim_rule.decide(p, 1.0, 40e3, 10e3, 1e9) == (False, pytest.approx(1.055),
                                                         pytest.approx(0.7))


# ---------------------------------------------------------------------------- policies, scale

@pytest.fixture(scope="module")
def squeezenet_tg():
    from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS

    return coacto.compile(zoo_model("squeezenet"), min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)


@pytest.mark.parametrize("policy", ["local", "cloud", "split", "fl", "dynamic"])
@pytest.mark.parametrize("bandwidth", [5.0, 100.0])
def test_every_policy_completes(squeezenet_tg, policy, bandwidth):
    r = simulate(squeezenet_tg, policy, device="raspberry-pi-4", server="threadripper-3990x",
                 server_cores=8, devices=2, bandwidth_mbps=bandwidth, inferences=3, warmup=1)
    assert len(r.inferences) == 6 and len(r.measured) == 4
    for inf in r.inferences:
        assert 0 < inf.latency_s < 10 and not inf.fallback
        assert inf.finished_by in ("device", "server", "both")
        if policy == "local":
            assert inf.tiles_server == 0 and inf.tiles_sent == 0
    assert math.isfinite(r.p50) and r.p95 >= r.p50 and r.throughput > 0


def test_local_latency_is_work_over_rate_plus_overhead(squeezenet_tg):
    rates = {"conv": 3.0, "gemm": 2.0, "depthwise": 0.5, "elementwise": 0.25, "other": 0.4}
    dev = dict(DEVICE, gflops={"1": rates}, tile_overhead_us=7.0)
    r = simulate(squeezenet_tg, "local", device=dev, server=SERVER, device_threads=1,
                 bandwidth_mbps=10)
    from coacto.sim.graph import sim_graph

    g = sim_graph(squeezenet_tg)
    expect = sum(g.class_flops[c] / (rates[c] * 1e9) for c in OP_CLASSES) + g.n_computable * 7e-6
    assert r.p50 == pytest.approx(expect, rel=1e-9)
    assert r.inferences[0].tiles_local == g.n_computable


def test_more_server_cores_never_make_cloud_slower(squeezenet_tg):
    last = math.inf
    for cores in (1, 2, 3, 4, 8, 16, 64):
        r = simulate(squeezenet_tg, "cloud", device="raspberry-pi-4", server="threadripper-3990x",
                     server_cores=cores, bandwidth_mbps=100)
        assert r.p50 <= last * (1 + 1e-12), cores
        last = r.p50


def test_tenants_share_the_server_and_alpha_reaches_the_devices(squeezenet_tg):
    kw = dict(device="raspberry-pi-4", server="threadripper-3990x", server_cores=1,
              bandwidth_mbps=100, inferences=4, rtt_ms=1.0)
    one = simulate(squeezenet_tg, "cloud", devices=1, **kw)
    four = simulate(squeezenet_tg, "cloud", devices=4, timeout=30.0, **kw)
    assert four.p50 > one.p50 and four.throughput > one.throughput
    assert {i.device for i in four.inferences} == {0, 1, 2, 3}
    # heartbeats (every 5/3 s) carried the server's contention: other devices' inferences
    long = simulate(squeezenet_tg, "cloud", devices=4, **dict(kw, inferences=30, bandwidth_mbps=5))
    assert long.throughput > 0 and long.settings["inferences"] == 30
    assert max(i.estimates["alpha"] for i in long.inferences) > 1.0
    assert max(i.estimates["alpha"] for i in long.inferences) > 1.0


def test_fallback_when_the_link_dies():
    tg = chain(in_bytes=50_000)
    # the link all but stops after 1 ms: nothing is heard for the timeout, the device finishes
    r = sim(tg, "cloud", trace=[(0, 100), (0.001, 0.001), (60, 100)], timeout=0.5)
    (inf,) = r.inferences
    assert inf.fallback and inf.finished_by == "device" and inf.tiles_local == 5
    assert inf.latency_s == pytest.approx(0.5 + 3e-3, rel=1e-9)  # 2 threads: 3 ms (see above)


def test_settings_errors_say_what_to_give():
    tg = chain()
    with pytest.raises(SimError, match="exactly one of bandwidth_mbps"):
        simulate(tg, "local", device=DEVICE, server=SERVER)
    with pytest.raises(SimError, match="unknown policy"):
        sim(tg, "nope")
    with pytest.raises(SimError, match="quota"):
        sim(tg, "local", quota=0)
    with pytest.raises(coacto.CoactoError):
        sim(tg, "local", trace="5g")


# ---------------------------------------------------------------------------- profiles

@pytest.mark.parametrize("name", ["raspberry-pi-4", "jetson-agx-xavier-cpu", "threadripper-3990x"])
def test_public_profiles_say_where_their_numbers_come_from(name):
    p = load_profile(name)
    assert "derived, not measured here" in p.source.lower() and "ncnn" in p.source
    assert p.per_class and set(p.gflops) and p.cores in (4, 8, 64)
    assert (p.machine_flops(p.cores) > p.machine_flops(1)).all()


def test_legacy_machine_profiles_still_load():
    p = load_profile("xeon-avx512-2core")
    assert not p.per_class and p.cores == 2 and p.tile_overhead_s > 0
    assert len(set(p.machine_flops(1))) == 1


@pytest.mark.parametrize("drop,field_", [("gflops", "gflops"), ("cores", "cores"),
                                         ("tile_overhead_us", "tile_overhead_us"),
                                         ("source", "source")])
def test_profile_missing_field_says_what_to_do(drop, field_):
    raw = {k: v for k, v in DEVICE.items() if k != drop}
    with pytest.raises(ProfileError) as e:
        load_profile(raw)
    assert isinstance(e.value, coacto.CoactoError)
    assert repr(field_) in str(e.value) and "coacto profile" in str(e.value)


def test_profile_errors_name_the_problem(tmp_path):
    with pytest.raises(ProfileError, match="lacks the op class.*depthwise"):
        load_profile(dict(DEVICE, gflops={"1": {"conv": 1, "gemm": 1}}))
    with pytest.raises(ProfileError, match="positive number"):
        load_profile(dict(DEVICE, gflops={"1": dict(CLASSES, conv=0)}))
    with pytest.raises(ProfileError, match="thread counts"):
        load_profile(dict(DEVICE, gflops={"one": CLASSES}))
    with pytest.raises(ProfileError, match="raspberry-pi-4"):
        load_profile("no-such-machine")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(str(bad))


def test_thread_counts_between_and_beyond_the_measured_ones():
    p = load_profile(dict(DEVICE, cores=8,
                          gflops={"1": CLASSES, "4": {c: 3.0 for c in OP_CLASSES}}))
    assert p.machine_flops(2)[0] == pytest.approx(1e9 + (3e9 - 1e9) / 3)
    assert p.machine_flops(8)[0] == pytest.approx(6e9)  # each thread adds 4's per-thread rate
    assert p.machine_flops(16)[0] == pytest.approx(6e9)  # no more than the cores
    assert p.thread_flops(16)[0] == pytest.approx(6e9 / 16)


# ---------------------------------------------------------------------------- command lines

def test_sim_cli_table_and_json(capsys, tmp_path):
    from coacto.sim.__main__ import main

    sched = tmp_path / "gantt.json"
    assert main(["--model", "squeezenet", "--policy", "local,cloud", "--bandwidth", "5,50",
                 "--server-cores", "4", "--inferences", "2", "--json",
                 "--schedule", str(sched)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4 and {r["settings"]["policy"] for r in rows} == {"local", "cloud"}
    assert all(r["summary"]["p50_ms"] > 0 for r in rows)
    g = json.loads(sched.read_text())
    assert g["inferences"] and {row[1] for row in g["inferences"][0]["schedule"]} == {"server"}
    assert main(["--model", "squeezenet", "--policy", "all", "--trace", "wifi"]) == 0
    assert "dynamic" in capsys.readouterr().out
    assert main(["--model", "squeezenet"]) == 1
    assert "--bandwidth" in capsys.readouterr().err


def test_coacto_profile_writes_a_profile_the_simulator_reads(tmp_path):
    from coacto.cli import main

    out = tmp_path / "here.json"
    assert main(["profile", "--name", "here", "--threads", "1", "--runs", "1",
                 "--models", "squeezenet,mobilenetv3_block", "-o", str(out)]) == 0
    p = load_profile(str(out))
    assert p.name == "here" and set(p.gflops) == {1} and (p.gflops[1] > 0).all()
    assert "measured on this machine" in p.source
    r = simulate(chain(), "local", device=str(out), server=SERVER, bandwidth_mbps=10)
    assert r.p50 > 0
