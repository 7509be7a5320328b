"""The simulator (coacto.sim) against schedules computed by hand on tiny tile graphs, its use of the
runtime's send rule, every policy on a zoo model, bandwidth traces, profiles and its CLIs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import coacto
from coacto import ir, protocol as P
from coacto.partition import TilePlan, input_tiles
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
    kw.setdefault("transfer", "raw")  # the byte counts below are of float32 tiles
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


def test_encoded_transfers_take_their_layers_share_of_the_bytes():
    tg = chain()
    wire = np.full(tg.n_layers, 0.5)
    raw = sim(tg, "cloud", transfer="raw").inferences[0]
    half = sim(tg, "cloud", transfer="lossless", wire=wire).inferences[0]
    # two input tiles of 1000 bytes: 500 each, plus a 4-byte length per tile
    assert raw.bytes_sent - half.bytes_sent == 2 * 500 - 2 * 4
    assert half.latency_s < raw.latency_s
    with pytest.raises(SimError, match="one ratio per layer"):
        sim(tg, "cloud", transfer="lossless", wire=[0.5])
    with pytest.raises(SimError, match="transfer must be one of"):
        sim(tg, "cloud", transfer="zip")


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


def test_the_devices_own_work_runs_at_its_local_graphs_speed():
    """A real client computes what it does alone on a graph cut for its threads (Engine.local_tg):
    local_speedup divides those inferences' tile times, whether given or read from the device's
    profile for this graph and thread count; offloaded plans keep the offloading graph's."""
    tg = chain()
    assert sim(tg, "local", device_threads=1, local_speedup=1.25).p50 == \
        pytest.approx(4e-3, rel=1e-12)
    measured = dict(DEVICE, local_speedup={"hand": {"graph_id": tg.graph_id,
                                                    "threads": {"1": 2.0}}})
    r = sim(tg, "local", device=measured, device_threads=1)
    assert r.settings["local_speedup"] == 2.0 and r.p50 == pytest.approx(2.5e-3, rel=1e-12)
    r = sim(tg, "local", device=measured, device_threads=2)  # not measured at 2 threads
    assert r.settings["local_speedup"] == 1.0 and r.p50 == pytest.approx(3e-3, rel=1e-12)
    cloud = sim(tg, "cloud", device_threads=1)
    assert sim(tg, "cloud", device_threads=1, local_speedup=2.0).p50 == cloud.p50
    # dynamic's gate compares offloading with the local graph's time: at 16 Mbit/s offloading
    # (about 3.5 ms) beats 5 ms on the device, not 2.5
    for speedup, offloaded in ((1.0, True), (2.0, False)):
        r = sim(tg, "dynamic", device_threads=1, server_cores=1, inferences=40, warmup=20,
                rtt_ms=1.0, bandwidth_mbps=16.0, local_speedup=speedup)
        late = r.inferences[20:]
        assert sum(i.offloaded for i in late) > 0.8 * len(late) if offloaded else \
            sum(i.offloaded for i in late) <= 3, (speedup, [i.offloaded for i in late])
    with pytest.raises(SimError, match="local_speedup"):
        sim(tg, "local", local_speedup=0)


def test_profile_measures_the_local_graphs_speedup_into_an_existing_profile(tmp_path,
                                                                            monkeypatch):
    """`coacto profile --only local` times each model's offloading graph and the graph a client
    cuts for its threads, alternating, and adds their ratio to the profile, where the simulator
    finds it by the offloading graph's id. (The clock is the test's: the offloading graph's runs
    take 2 ms on it, the local graph's 1, whatever this machine's load; a ratio of real
    latencies of a sub-millisecond model once read 7.5 here.)"""
    import time as real_time
    from types import SimpleNamespace

    from coacto import zoo
    from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS
    from coacto.runtime import Runtime
    from coacto.sim import measure
    from coacto.sim.measure import run_profile

    gid = coacto.compile(zoo.build("mobilenetv3_block"),
                         min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS).graph_id
    clock = [0.0]
    real_run = Runtime.run

    def run(self, *a, **k):
        out = real_run(self, *a, **k)
        clock[0] += 2e-3 if self.graph.graph_id == gid else 1e-3
        return out

    monkeypatch.setattr(Runtime, "run", run)
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: clock[0],
                                                         strftime=real_time.strftime))
    path = tmp_path / "here.json"
    path.write_text(json.dumps(DEVICE))
    prof, written = run_profile("here", threads=[1], models=["mobilenetv3_block"], runs=1,
                                output=path, only=["local"], quota_models=["mobilenetv3_block"])
    entry = prof["local_speedup"]["mobilenetv3_block"]
    assert entry["graph_id"] == gid and set(entry["threads"]) == {"1"}
    assert entry["threads"]["1"] == pytest.approx(2.0)  # the offloading graph's over the local's
    assert load_profile(str(written)).local_speedup(gid, 1) == entry["threads"]["1"]
    assert load_profile(str(written)).local_speedup(gid, 2) is None
    again, _ = run_profile("here", threads=[2], models=["mobilenetv3_block"], runs=1,
                           output=path, only=["local"], quota_models=["mobilenetv3_block"])
    assert set(again["local_speedup"]["mobilenetv3_block"]["threads"]) == {"1", "2"}  # merged
    kept = load_profile(str(written))  # the rest of the profile is kept
    assert kept.gflops.keys() == {1, 2} and (kept.gflops[1] == 1.0).all()
    with pytest.raises(coacto.CoactoError, match="engine, quota and/or local"):
        run_profile("here", output=path, only=["nonsense"])


def test_bandwidth_step_mid_transfer_gives_the_hand_computed_finish():
    tg = chain(in_bytes=50_000)
    step = 0.004  # 100 Mbit/s (12.5e6 B/s) until 4 ms, then 5 Mbit/s (625e3 B/s)
    trace = [(0.0, 100.0), (step, 5.0)]
    r = sim(tg, "cloud", trace=trace, server_cores=2)
    up = _CONTROL_BYTES[P.BEGIN] + tiles_header_bytes(1, 1) + 4 * 2 + 2 * 50_000
    released = step + (up - 12.5e6 * step) / 625e3
    down = _HEADER_BYTES[P.RESULT] + 4 + 400
    assert r.p50 == pytest.approx(released + 1e-3 + 3e-4 + down / 625e3 + 1e-3, rel=1e-12)


def test_a_link_that_gets_faster_is_seen_while_dynamic_stays_local():
    """At 0.8 Mbit/s the 2 kB input costs more than the 5 ms the device takes; at 16 Mbit/s
    offloading wins clearly (1 ms up, 1 ms RTT, 0.5 ms there, 0.2 ms back; at 8 Mbit/s it was
    predicted at 4.8 ms after its outcomes' correction (it took 4.6), within the gate's 5% of the
    device's 5.0, once the gate read the device's measured latency instead of a 6.3 ms estimate). The input is too small to measure the link, so the engine's probe train, sent
    again while the gate keeps inferences local, is what sees the rise, and its first sample
    after a pause replaces the estimate."""
    from coacto.mobile.engine import REPROBE_S

    r = sim(chain(), "dynamic", device_threads=1, server_cores=1, inferences=1200, rtt_ms=1.0,
            trace=[(0, 0.8), (1.0, 16.0)])
    early = [i for i in r.inferences if i.t_submit < 1.0]
    late = [i for i in r.inferences if i.t_submit > 1.0 + REPROBE_S + 0.3]
    assert sum(i.offloaded for i in early) <= len(early) // 8 + 1  # only the gate's explorations
    assert len(late) > 100 and sum(i.offloaded for i in late) > 0.8 * len(late)
    assert late[-1].estimates["bandwidth_est_mbps"] == pytest.approx(16.0, rel=0.1)


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


def _dynamic_with_decisions(monkeypatch):
    # CoActo's plan (the input first: 2 ms on the link + 1 ms RTT + 0.5 ms at the server + 0.4
    # ms back vs 5 ms here; a device share is predicted faster still, and a cut is explored, so
    # the kind is fixed): local work waits for the input to leave, then the device computes and
    # decides. (With the insurance margin at 2: the device, starting once its input has left,
    # would finish at 7 ms, after 1.5x the server's predicted 3.9, and wait as insurance.)
    from coacto.mobile import engine, policies

    monkeypatch.setattr(policies, "choose_dynamic", lambda *a, **k: "inputs")
    monkeypatch.setattr(engine, "INSURANCE_MARGIN", 2.0)
    return sim(chain(), "dynamic", device_threads=1, server_cores=1, inferences=2, rtt_ms=1.0)


def test_parked_work_is_insurance_when_the_device_would_finish_after_the_server():
    """_park_local counts the device's finish from when its inputs have left: a device that
    needs 5 ms after a 2 ms input ends at 7, after 1.5x the server's predicted 3.9 ms, so its
    work waits as insurance (counted from the start, 5 ms, it started once the input was out);
    against a server ten times slower (8.4 ms predicted) it starts once the input is out."""
    from types import SimpleNamespace

    from coacto.mobile.engine import Engine
    from coacto.mobile.estimates import Estimates
    from coacto.mobile.jobs import Job

    tg = chain()
    est = Estimates(bandwidth=1e6, device_flops=1e9)  # 5 ms of work (5 tiles of 1 MFLOP)
    est.server_flops, est.rtt.value, est.down.value = 1e10, 1e-3, 1e6

    def parked(predicted=None):
        eng = SimpleNamespace(est=est, tg=tg)
        job = Job(1, None, "dynamic", {}, 0.0)
        job.t_start, job.input_bytes = 0.0, 2000  # 2 ms on the link
        if predicted is not None:
            job.plan = SimpleNamespace(info={"predicted_s": predicted})
        Engine._park_local(eng, job)
        return job

    job = parked()
    assert job.local_parked and not job.resume_on_release and not job.kept_work
    assert job.resume_at == pytest.approx(1.5 * (2e-3 + 1e-3 + 0.5e-3 + 0.4e-3))
    # the plan's own price (the streamed inputs: the server starts before the last input
    # arrives) times the insurance when there is one; NaN (nothing to price it with) is not one
    job = parked(predicted=2.6e-3)
    assert job.local_parked and job.resume_at == pytest.approx(1.5 * 2.6e-3)
    est.on_offloaded(2.6e-3, 3.6e-3, "inputs")  # ... as late as the kind has run here
    assert parked(predicted=2.6e-3).resume_at == pytest.approx(1.5 * 3.6e-3)
    est.offload_errors.clear()
    job = parked(predicted=float("nan"))
    assert job.resume_at == pytest.approx(1.5 * (2e-3 + 1e-3 + 0.5e-3 + 0.4e-3))
    est.server_flops = 1e9
    job = parked()
    assert job.local_parked and job.resume_on_release


def test_send_decisions_go_through_the_runtimes_rule(monkeypatch):
    spy = Spy(sim_rule.lib)
    monkeypatch.setattr(sim_rule, "lib", spy)
    r = _dynamic_with_decisions(monkeypatch)
    decisions = sum(i.decisions for i in r.inferences)
    assert decisions > 0 and len(spy.calls) == decisions
    assert sum(i.decided_sent for i in r.inferences) == sum(c[4] for c in spy.calls)
    for now, queued, nbytes, work, sent, off, srv in spy.calls:
        assert nbytes == 400 and work in (1e6, 2e6, 3e6, 5e6) and sent == (off < srv)
    # the simulator acts on the callee's answer, whatever it is
    always = Spy(spy.real, answer=1)
    monkeypatch.setattr(sim_rule, "lib", always)
    r = _dynamic_with_decisions(monkeypatch)
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


def test_a_replayed_cut_that_is_not_the_best_runs_at_once(squeezenet_tg):
    """sim_vs_real replays the plan each real inference ran (plan_dynamic's frontier). A cut the
    cost model would not choose now had no prediction (NaN), the engine's insurance timer was
    set to it, and the event loop's order broke: such inferences took 0.3-6 s where their
    neighbours took 40-70 ms. Priced now, it runs as any cut does; an event at NaN raises."""
    from coacto.mobile import policies as P
    from coacto import partition as tm

    tg = squeezenet_tg
    kw = dict(device="raspberry-pi-4", server="threadripper-3990x", server_cores=8,
              bandwidth_mbps=50.0)
    best = P.dynamic_options(tg, 1e10, 1e11, 50e6 / 8, 1e-3).get("cut", (0, None))[1]
    cut = next(c for c in tm.valid_cuts(tg)[1:] if c != best)
    frontier = f"cut {tg.graph.layers[cut].name}"
    split = simulate(tg, "split", split_layer=cut, inferences=2, **kw).p50  # the same cut
    r = simulate(tg, [("dynamic", 6, {"frontier": frontier})], **kw)
    assert all(i.frontier == frontier for i in r.inferences)
    assert all(math.isfinite(i.predicted_s) for i in r.inferences)
    assert max(i.latency_s for i in r.inferences) < 1.5 * split, \
        (split, [i.latency_s for i in r.inferences])
    with pytest.raises(ValueError, match="NaN"):
        EventLoop().at(float("nan"), print)


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


def test_devices_sharing_a_server_keep_their_work(squeezenet_tg):
    """Told by STATS that other connections use the server, a dynamic device does not park its
    own work while its inputs go out (Engine._keeps_work); alone, it parks as before."""
    # 1 s of inferences, a heartbeat every 0.5 s (a third of the timeout)
    kw = dict(device="raspberry-pi-4", server="threadripper-3990x", server_cores=8,
              bandwidth_mbps=100, inferences=400, rtt_ms=1.0, timeout=1.5)
    alone = simulate(squeezenet_tg, "dynamic", devices=1, **kw)
    assert not any(i.kept_work for i in alone.inferences)
    assert any(i.offloaded for i in alone.inferences)
    shared = simulate(squeezenet_tg, "dynamic", devices=3, **kw)
    # once a heartbeat's STATS has told a device (what it knew when its previous
    # inference ended), every inference it offloads keeps its work
    told = []
    for d in range(3):
        mine = sorted((i for i in shared.inferences if i.device == d), key=lambda i: i.index)
        told += [i for prev, i in zip(mine, mine[1:])
                 if i.offloaded and prev.estimates["server_others"] == 2]
    assert told and all(i.kept_work for i in told)


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
    assert main(["--model", "squeezenet"]) == 2
    assert "--bandwidth" in capsys.readouterr().err


def test_sim_cli_reads_rates_as_every_command_does(capsys):
    """A bare number is Mbit/s (the flag's documented unit); a unit is read as coacto-client
    reads it, bytes and bits distinct; ambiguous and non-positive rates are refused."""
    from coacto.sim.__main__ import main

    assert main(["--model", "squeezenet", "--policy", "local", "--bandwidth", "40,40mbit,5MB/s",
                 "--json"]) == 0
    rates = [json.loads(line)["settings"]["bandwidth_mbps"]
             for line in capsys.readouterr().out.splitlines()]
    assert rates == [40.0, 40.0, 40.0]
    for bad, says in (("20Mbps", "ambiguous"), ("0", "positive"), ("fast", "unit")):
        assert main(["--model", "squeezenet", "--policy", "local", "--bandwidth", bad]) == 2
        assert says in capsys.readouterr().err


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


# ---------------------------------------------------------------------------- the CPU model

from coacto.sim.cpu import Cpu  # noqa: E402
from coacto.sim.events import EventLoop  # noqa: E402
from coacto.sim.link import Link, Msg  # noqa: E402
from coacto.sim.profiles import DeviceCosts, ServerCosts  # noqa: E402


def device_costs(start=0.0, finish=0.0, send=0.0, recv=0.0, wake=0.0, loop=0.0, **kw):
    return DeviceCosts(start_s={p: start for p in ("local", "cloud", "split", "fl", "dynamic")},
                       send_msg_s=send, send_byte_s=kw.get("send_byte", 0.0),
                       recv_msg_s={k: recv for k in ("ack", "result", "stats", "done")},
                       recv_byte_s=kw.get("recv_byte", 0.0), finish_s=finish, wake_s=wake,
                       loop_s=loop)


def test_engine_costs_are_charged_inside_a_smooth_quota():
    # one thread in a quarter of a core: the engine's start (1 ms of CPU), the five 1-ms tiles
    # and the engine's finish (2 ms) all run at a quarter of full speed, one after the other
    r = sim(chain(), "local", device_threads=1, quota=0.25,
            device_costs=device_costs(start=1e-3, finish=2e-3))
    assert r.p50 == pytest.approx((1 + 5 + 2) * 1e-3 / 0.25, rel=1e-9)
    assert r.settings["device_engine_busy_s"] == pytest.approx(3e-3, rel=1e-9)
    # without costs the same device takes the tiles' time alone
    assert sim(chain(), "local", device_threads=1, quota=0.25).p50 == pytest.approx(20e-3)


def test_cfs_period_throttles_in_windows():
    # 25% of a 4 ms period: 1 ms of full speed, then nothing until the next period. The start
    # task spends [0, 1) ms, the tiles run in [4, 5), [8, 9), ... [20, 21), the 2 ms finish in
    # [24, 25) and [28, 29): the inference ends at 29 ms (a smooth quota says 32)
    costs = device_costs(start=1e-3, finish=2e-3)
    r = sim(chain(), "local", device_threads=1, quota=0.25, quota_period_ms=4.0, device_cpus=1,
            device_costs=costs)
    assert r.p50 == pytest.approx(29e-3, rel=1e-9)
    # the tiles alone: [0, 1), [4, 5), ..., [16, 17)
    r = sim(chain(), "local", device_threads=1, quota=0.25, quota_period_ms=4.0, device_cpus=1)
    assert r.p50 == pytest.approx(17e-3, rel=1e-9)
    rows = [row for row in r.inferences[0].schedule()]
    assert [round(row[4] * 1e3, 9) for row in rows] == [1, 5, 9, 13, 17]


def test_measured_quota_slowdown_stretches_the_devices_cpu():
    # a profile that measured 1.5x inside 0.25 @ 4 ms: 1.5 ms per tile; in windows of 1 ms the
    # tiles end at 4.5, 9, 16.5, 21 and 28.5 ms
    dev = dict(DEVICE, quota={"0.25@4ms": {"quota": 0.25, "period_ms": 4.0, "slowdown": 1.5,
                                             "models": {}}})
    r = sim(chain(), "local", device=dev, device_threads=1, quota=0.25, quota_period_ms=4.0,
            device_cpus=1)
    assert r.settings["quota_slowdown"] == 1.5
    assert r.p50 == pytest.approx(28.5e-3, rel=1e-9)
    assert sim(chain(), "local", device=dev, device_threads=1, quota=0.25).p50 == \
        pytest.approx(20e-3)  # a smooth quota was not measured: no slowdown


def test_step_middle_takes_the_middle_of_the_step_below_the_target():
    from coacto.sim.quota import step_middle

    # 4 ms periods, 6 units of demand per unit of s: latency 4 * ceil(6 s) ms
    def staircase(s):
        return 4e-3 * math.ceil(6 * s - 1e-12)

    # 25 ms: the highest step at or below is 24 ms, s in (5/6, 1]: its middle
    assert step_middle(staircase, 25e-3, 4e-3) == pytest.approx(11 / 12, abs=1e-6)
    # exactly on a step: that step, still its middle, not its upper edge
    assert step_middle(staircase, 28e-3, 4e-3) == pytest.approx(13 / 12, abs=1e-6)
    # a staircase that rises a little within each step (the last window's share)
    assert step_middle(lambda s: staircase(s) + 1e-4 * s, 25e-3, 4e-3) == \
        pytest.approx(11 / 12, abs=1e-4)


def test_local_slowdown_reproduces_a_measured_local_latency():
    from coacto.sim import local_slowdown

    kw = dict(device=DEVICE, server=SERVER, device_threads=1, device_cpus=1, quota=0.25,
              quota_period_ms=4.0, rtt_ms=2.0, bandwidth_mbps=8.0, transfer="raw")
    plain = sim(chain(), "local", **{k: v for k, v in kw.items() if k not in ("server",)}).p50
    for measured in (plain, 28.5e-3, 41e-3):
        s = local_slowdown(chain(), measured, **kw)
        got = sim(chain(), [("local", 3)], warmup=1, quota_slowdown=s, **kw).p50
        # the step at or below the measurement, less than a period under it
        assert measured - 4e-3 < got <= measured + 1e-9
    assert local_slowdown(chain(), 28.5e-3, **kw) < local_slowdown(chain(), 41e-3, **kw)
    with pytest.raises(SimError, match="quota"):
        local_slowdown(chain(), 28.5e-3, device=DEVICE, bandwidth_mbps=8.0)
    with pytest.raises(SimError, match="positive"):
        local_slowdown(chain(), -1.0, **kw)


def test_a_recorded_dynamic_plan_is_replayed():
    """A session's dynamic inferences may carry the plan a real run recorded (sim_vs_real):
    'device' runs on the device alone, another frontier is that plan."""
    tg = chain(tiles=(4, 4, 4, 1))
    seq = [("dynamic", 1), ("dynamic", 1, {"frontier": "device"}),
           ("dynamic", 1, {"frontier": "inputs"})]
    r = sim(tg, seq, device_threads=1, device_flops=1e9, server_flops=1e10, warmup=1)
    kept, sent = r.measured
    assert kept.frontier == "device" and kept.tiles_sent == 0 and not kept.offloaded
    assert kept.server_skipped.startswith("replayed")
    assert sent.frontier == "inputs" and sent.tiles_sent >= 4 and sent.offloaded


def test_communication_thread_preempts_the_tiles():
    loop = EventLoop()
    cpu = Cpu(loop, cores=1.0, quota=0.5)
    done = {}
    cpu.start_tile(5e-3, lambda: done.setdefault("tile", loop.now))
    loop.at(2e-3, lambda: cpu.run(1e-3, lambda: done.setdefault("task", loop.now)))
    loop.run()
    # at half a core the tile has done 1 ms of its 5 by 2 ms; the task's 1 ms takes [2, 4) ms;
    # the tile's last 4 ms take 8 more
    assert done["task"] == pytest.approx(4e-3) and done["tile"] == pytest.approx(12e-3)
    assert cpu.engine_busy_s == pytest.approx(1e-3) and cpu.tile_cpu_s == pytest.approx(5e-3)
    # with a free core the task costs the tile nothing
    loop = EventLoop()
    cpu = Cpu(loop, cores=2.0)
    cpu.start_tile(5e-3, lambda: done.__setitem__("tile", loop.now))
    loop.at(2e-3, lambda: cpu.run(1e-3, lambda: None))
    loop.run()
    assert done["tile"] == pytest.approx(5e-3)


def test_server_io_costs_in_cloud_latency():
    tg = chain()
    costs = ServerCosts(recv_msg_s={"begin": 1e-4, "tiles": 3e-4, "heartbeat": 0.0,
                                    "cancel": 0.0}, recv_byte_s=1e-8,
                        send_msg_s={"result": 2e-4, "done": 5e-5}, send_byte_s=0.0)
    r = sim(tg, "cloud", server_cores=1, server_costs=costs)
    (inf,) = r.inferences
    tiles_msg = tiles_header_bytes(1, 1) + 4 * 2 + 2 * 1000
    up = _CONTROL_BYTES[P.BEGIN] + tiles_msg
    down = _HEADER_BYTES[P.RESULT] + 4 + 400
    # the I/O thread takes the batch in (3e-4 + 1e-8 per byte), the one core computes the
    # five tiles (0.1 ms each), the I/O thread sends the RESULT and DONE
    expect = (up / 1e6 + 1e-3 + 3e-4 + 1e-8 * tiles_msg + 5e-4 + 2e-4 + 5e-5 + down / 1e6
              + 1e-3)
    assert inf.latency_s == pytest.approx(expect, rel=1e-9)
    assert r.settings["server_io_busy_s"] > 0


def test_device_send_costs_delay_the_batch():
    costs = device_costs(send=2e-4, recv=1e-4)
    base = sim(chain(), "cloud", server_cores=1)
    r = sim(chain(), "cloud", server_cores=1, device_costs=costs)
    # BEGIN and then the TILES message each cost the engine 0.2 ms before the link takes them:
    # the batch starts crossing at 0.4 ms instead of when BEGIN has crossed; at the end the
    # RESULT and then the DONE behind it take 0.1 ms each before the inference is finished
    # (two device cores: the engine never waits for a tile)
    begin = _CONTROL_BYTES[P.BEGIN] / 1e6
    assert r.p50 - base.p50 == pytest.approx(4e-4 - begin + 2e-4, rel=1e-6)


def test_token_bucket_link_passes_the_burst_at_once():
    loop = EventLoop()
    got = []
    link = Link(loop, BandwidthTrace.constant(8.0), 0.0, on_arrive=lambda m: got.append(loop.now),
                burst_bytes=500)
    link.send(Msg("x", 1500), 0.0)            # 500 at once, 1000 at 1e6 B/s
    loop.at(1.2e-3, lambda: link.send(Msg("y", 300), loop.now))  # 200 tokens back: 100 wait
    loop.run()
    assert got == [pytest.approx(1e-3), pytest.approx(1.3e-3)]


def test_a_sequence_runs_as_one_client_and_a_given_device_rate_is_kept():
    r = sim(chain(), [("local", 2), ("cloud", 1), ("dynamic", 1)], device_flops=123e9,
            server_cores=1)
    assert [i.policy for i in sorted(r.inferences, key=lambda i: i.index)] == \
        ["local", "local", "cloud", "dynamic"]
    assert all(i.estimates["device_flops"] == 123e9 for i in r.inferences)
    assert r.settings["device_flops_fixed"] and r.settings["inferences"] == 4
    # a calibrated rate is refined by local runs (Client.calibrate, then on_local_run)
    free = sim(chain(), [("local", 2)], device_threads=1)
    assert free.settings["device_flops_est"] == pytest.approx(5e6 / 5e-3)
    with pytest.raises(SimError, match="list of"):
        sim(chain(), [("local", 0)])


def test_measured_layer_times_replace_class_rates():
    tg = chain()
    dev = dict(DEVICE, layers={"hand": {"graph_id": "hand", "n_layers": 4,
                                        "seconds": {"1": [0.0, 2e-3, 4e-3, 3e-3]}}})
    # 2 + 4 + 3 ms of busy time per layer, shared by its tiles by FLOPs
    assert sim(tg, "local", device=dev, device_threads=1).p50 == pytest.approx(9e-3)
    # a graph the profile did not measure keeps the class rates
    other = dict(dev, layers={"x": dict(dev["layers"]["hand"], graph_id="other")})
    assert sim(tg, "local", device=other, device_threads=1).p50 == pytest.approx(5e-3)


def test_engine_cost_fits():
    from coacto.sim.enginecost import fit_per_byte, loop_per_event

    rows = [(1, b, 1e-4 + 2e-9 * b) for b in (1e3, 5e4, 2e5)] + [(2, 1e4, 2e-4 + 2e-9 * 1e4)]
    msg, byte = fit_per_byte(rows)
    assert msg == pytest.approx(1e-4) and byte == pytest.approx(2e-9)
    # a slope below zero is no cost per byte
    assert fit_per_byte([(1, 1e3, 2e-4), (1, 1e5, 1e-4)])[1] == 0.0
    # the loop's time outside handlers comes from the unshaped runs when there are some
    assert loop_per_event([(10, 2e-3, 1e-3, False), (10, 9e-3, 1e-3, True)])[0] == \
        pytest.approx(1e-4)


def test_profiles_carry_engine_costs_and_the_simulator_uses_them():
    from coacto.sim.profiles import engine_costs

    p = load_profile("epyc-avx512-2core")
    dev, srv = engine_costs(p, "device"), engine_costs(p, "server")
    assert dev is not None and srv is not None
    assert dev.send(100_000) > dev.send(0) > 0 and srv.recv(P.TILES, 100_000) > 0
    assert engine_costs(DEVICE, "device") is None
    r = simulate(chain(), "cloud", device="epyc-avx512-2core", server="epyc-avx512-2core",
                 bandwidth_mbps=100, server_cores=1)
    assert r.settings["device_costs"].startswith("epyc") and r.settings["server_io_busy_s"] > 0
    off = simulate(chain(), "cloud", device="epyc-avx512-2core", server="epyc-avx512-2core",
                   bandwidth_mbps=100, server_cores=1, device_costs=False, server_costs=False)
    assert off.settings["device_costs"] is None and off.p50 < r.p50


# ---------------------------------------------------------------------------- experiments

def _experiments():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import sim_bridge
    import sim_vs_real

    return sim_bridge, sim_vs_real


def test_sim_bridge_replays_the_testbeds_sessions():
    B, _ = _experiments()
    assert B.session(["local", "cloud", "dynamic"], 2, 1, alternate=False) == \
        [("dynamic", 1), ("cloud", 2), ("dynamic", 2), ("local", 2)]
    assert B.session(["local", "cloud", "dynamic"], 2, 1) == \
        [("dynamic", 1), ("local", 2), ("dynamic", 2), ("cloud", 2)]
    kw = B.testbed_kwargs({"quota": 0.25, "server_threads": 1, "device_threads": 1,
                           "testbed": {"mode": "netns", "cfs_period_us": 4000, "cgroup": "v1",
                                       "server_cpus": "1"}}, 20)
    assert kw["quota_period_ms"] == 4.0 and kw["device_cpus"] == 1 and kw["probe"]
    assert kw["initial_goodput_mbps"] == B.CLIENT_DEFAULT_MBPS and kw["burst_bytes"] > 0
    kw = B.testbed_kwargs({"quota": 0.25, "testbed": {"mode": "shaper", "cgroup": "none"}}, 20)
    assert kw["quota"] is None and kw["initial_goodput_mbps"] == 20 and not kw["probe"]


def test_sim_bridge_plans_split_at_the_real_clients_cuts():
    B, _ = _experiments()
    tg = B.graph("squeezenet", 64)
    from coacto.partition import valid_cuts

    cuts = valid_cuts(tg)
    chosen = [cuts[len(cuts) // 2], cuts[-1]]  # one offloaded cut, then all on the device
    rows = [{"policy": "split", "cuts": " ".join(map(str, chosen))},
            {"policy": "fl", "cuts": "7 7"}, {"policy": "local", "cuts": ""}]
    assert B.real_cuts(rows) == {"split": chosen}  # fl's stack is fixed: never replayed
    assert B.session(["local", "split"], 2, 0, cuts={"split": chosen}) == [
        ("dynamic", 1), ("local", 2), ("split", 1, {"split_layer": chosen[0]}),
        ("split", 1, {"split_layer": chosen[1]})]
    settings = {"quota": 0.25, "server_threads": 1, "device_threads": 1,
                "testbed": {"mode": "netns", "cfs_period_us": 4000, "cgroup": "v1",
                            "server_cpus": "1"}}
    row = {"nominal_mbps": 20, "measured_up_mbps": 19.1, "measured_rtt_ms": 0.06,
           "device_gflops": 20.0}
    res = B.simulate_session(tg, settings, row, ["split"], 2, 0, cuts={"split": chosen})
    infs = B.by_policy(res)["split"]
    assert [i.split_layer for i in infs] == chosen
    assert infs[0].tiles_sent > 0 and infs[1].tiles_sent == 0


def test_sim_vs_real_flags_rows_off_by_more_than_the_tolerance(tmp_path):
    import csv

    B, svr = _experiments()
    settings = {"quota": 0.25, "server_threads": 1, "device_threads": 1, "repeat": 1,
                "testbed": {"mode": "netns", "cfs_period_us": 4000, "cgroup": "v1",
                            "server_cpus": "1"}}
    base = {"system": "coacto", "model": "squeezenet", "nominal_mbps": 20, "round": 0,
            "measured_up_mbps": 19.1, "measured_rtt_ms": 0.06, "device_gflops": 20.0}
    res = B.simulate_session(B.graph("squeezenet", 64), settings, base, ["local", "cloud"], 1, 0)
    sims = {p: v[0].latency_s * 1e3 for p, v in B.by_policy(res).items()}
    rows = [dict(base, policy="local", median_ms=sims["local"] * 1.1, tiles_sent=0,
                 tiles_from_server=0),
            dict(base, policy="cloud", median_ms=sims["cloud"] * 2.0, tiles_sent=1,
                 tiles_from_server=1)]
    real = tmp_path / "bandwidth.csv"
    with open(real, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "bandwidth.settings.json").write_text(json.dumps(settings))
    assert svr.main(["--out", str(tmp_path), "--image-size", "64"]) == 1
    out = list(csv.DictReader(open(tmp_path / "sim_vs_real.csv")))
    assert [(r["policy"], r["within_20pct"]) for r in out] == [("local", "True"),
                                                             ("cloud", "False")]
    assert float(out[0]["ratio"]) == pytest.approx(1 / 1.1, rel=1e-3)
    assert (tmp_path / "sim_vs_real.png").exists()
    meta = json.loads((tmp_path / "sim_vs_real.settings.json").read_text())
    assert "engine_costs" in meta["profile_measured"] and meta["tolerance"] == 0.2


def test_engine_costs_are_measured_with_the_real_client_and_server():
    from coacto.sim.enginecost import measure_engine
    from coacto.sim.profiles import DeviceCosts, ServerCosts

    out = measure_engine("squeezenet", inferences=1, caps=(0.0, 400.0),
                         policies=("local", "cloud", "dynamic"))
    dev, srv = out["device"], out["server"]
    assert set(dev["start_s"]) == {"local", "cloud", "dynamic"}
    assert dev["send_msg_s"] > 0 and dev["recv_msg_s"]["ack"] > 0
    assert srv["recv_msg_s"]["tiles"] > 0 and srv["recv_msg_s"]["begin"] > 0
    assert "thread_time_ns" in out["how"]
    # what the simulator reads back
    assert DeviceCosts.from_dict(dev).send(1000) > 0
    assert ServerCosts.from_dict(srv).recv(P.TILES, 1000) > 0


def test_a_share_plan_runs_and_its_insurance_starts_when_the_server_is_late(squeezenet_tg,
                                                                           monkeypatch):
    """Dynamic forced to a device share (policies.choose_dynamic): the device computes its part
    and streams it while the server computes the other; told a server a thousand times faster
    than it is, the device starts on the rest at 1.5x the (tiny) predicted time and finishes
    alone, long before the client's timeout."""
    from coacto.mobile import policies
    from coacto.mobile.engine import Engine

    monkeypatch.setattr(policies, "choose_dynamic",
                        lambda *a, **k: "share")
    kw = dict(device="raspberry-pi-4", server="threadripper-3990x", server_cores=8,
              bandwidth_mbps=50.0, inferences=2, device_flops=1e8)
    r = simulate(squeezenet_tg, "dynamic", **kw)
    computable = squeezenet_tg.n_tiles - len(input_tiles(squeezenet_tg))
    for inf in r.inferences:
        assert inf.frontier.startswith("share ") and not inf.fallback
        assert 0 < inf.tiles_local < computable and inf.tiles_server > 0
        assert inf.finished_by == "server"
    # told a server a thousand times faster than it is, over a fast link, the plan predicts
    # a millisecond; the server (one Raspberry Pi core) is late and the device (four) takes over
    monkeypatch.setattr(Engine, "_local_is_faster", lambda self, job: False)
    late = simulate(squeezenet_tg, "dynamic", device="raspberry-pi-4", server="raspberry-pi-4",
                    device_threads=4, server_cores=1, bandwidth_mbps=1000.0, rtt_ms=0.1,
                    initial_goodput_mbps=1000.0, inferences=2, device_flops=1e13,
                    server_flops=1e15, timeout=5.0)
    for inf in late.inferences:
        assert inf.frontier.startswith("share ") and not inf.fallback
        assert inf.finished_by in ("device", "both") and inf.tiles_local == computable
        assert inf.latency_s < 1.0
        assert inf.predicted_s < 0.2 * inf.latency_s


def test_batches_the_device_paced_do_not_measure_the_link():
    """The simulated Raspberry Pi's engine (this machine's costs times five: about 1.8 ms of CPU
    to send a batch) on a 200 Mbit/s link, where one of SqueezeNet's 37 kB input tiles crosses
    in 1.5 ms: the link idles between the engine's batches, and their spacing, counted as the
    link's, read it as 127 Mbit/s; dynamic then ran the model on the device (36 ms) where
    streaming a cut took 32-33. Batches handed over well after the link carried the one before
    only bound the goodput from below (those a little after, by under PACED_SHARE of their
    spacing, still count, low by that share: the estimate stays under the link's 200)."""
    from coacto.sim import resolve_graph

    squeezenet_tg = resolve_graph("squeezenet")  # 224 x 224, as the experiments run it
    kw = dict(device="raspberry-pi-4", server="threadripper-3990x", server_cores=64,
              bandwidth_mbps=200.0, rtt_ms=10.0, device_costs="epyc-avx512-2core",
              device_costs_scale=5.0, inferences=9, warmup=1)
    r = simulate(squeezenet_tg, "dynamic", **kw)
    est = r.inferences[-1].estimates
    assert 150 <= est["bandwidth_est_mbps"] <= 205, est
    best = min(simulate(squeezenet_tg, p, **kw).p50 for p in ("local", "cloud", "split"))
    assert r.p50 <= 1.0 * best, (r.p50, best)


def test_a_burst_larger_than_the_probes_is_probed_past(squeezenet_tg):
    """A 200 Mbit/s token-bucket link with the testbed's 100 kB burst, the client starting from
    10 Mbit/s: its first train (3 x 24 kB) crosses whole in the burst; the larger train that
    follows (Session.probe_again) and the tiles measure the rate, and isolated transfers that
    beat it teach the burst (Goodput.burst) instead of raising the estimate."""
    r = simulate(squeezenet_tg, "cloud", device="raspberry-pi-4", server="threadripper-3990x",
                 bandwidth_mbps=200.0, burst_bytes=100_000, probe=True, initial_goodput_mbps=10.0,
                 inferences=6, rtt_ms=1.0)
    est = r.inferences[-1].estimates
    assert 150 <= est["bandwidth_est_mbps"] <= 245, est  # 263 before either


@pytest.mark.parametrize("rtt_ms", [1.0, 10.0])
def test_probe_trains_that_cross_in_bursts_grow_and_end(squeezenet_tg, monkeypatch, rtt_ms):
    """What a burst train reads bounds the rate from below (its first probe's bytes past the
    burst over a round trip): at a 10 ms round trip that sized the next train no larger than
    24 kB, which crossed in the burst again, and probing went on for the whole run (7,501 trains;
    every cloud inference ran out its 5 s and was finished on the device). Each train after a
    burst is now at least PROBE_BURST_GROWTH times the one before: 24 kB, 96 kB, 256 kB."""
    from coacto.mobile.session import PROBE_BURST_GROWTH, PROBE_BURST_MAX_BYTES
    from coacto.sim import device as D

    sizes = []
    start = D.TrainStamps.start
    monkeypatch.setattr(D.TrainStamps, "start",
                        lambda self, train, size: (sizes.append(size), start(self, train, size)))
    r = simulate(squeezenet_tg, "cloud", device="raspberry-pi-4", server="threadripper-3990x",
                 bandwidth_mbps=200.0, burst_bytes=100_000, probe=True, initial_goodput_mbps=10.0,
                 inferences=3, rtt_ms=rtt_ms)
    assert 2 <= len(sizes) <= 3, sizes
    assert all(b >= min(PROBE_BURST_GROWTH * a, PROBE_BURST_MAX_BYTES)
               for a, b in zip(sizes, sizes[1:])), sizes
    assert r.p50 < 0.1 and not any(i.fallback for i in r.inferences), r.p50
