"""Merged traces of one collaborative inference (coacto.mobile.trace): the builder on synthetic
records, the TRACE message's checks, and real inferences against a server on 127.0.0.1 whose
trace files must be valid trace-event JSON holding both sides on one clock, causally consistent;
plus the coacto-client --trace option and experiments/plot_trace.py on a real trace."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest

import coacto
from coacto import protocol as P
from coacto import zoo
from coacto.mobile import Client
from coacto.mobile.trace import (PID_DEVICE, PID_LINK, PID_SERVER, TID_ENGINE,
                                 TID_SERVER_INFERENCE, TraceRecord, map_clock, merged_trace)
from coacto.server import Server

from conftest import assert_close, zoo_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def squeezenet():
    model = zoo_model("squeezenet", image_size=32)
    feeds = zoo.input_feeds(model, seed=0)
    with coacto.Runtime(coacto.compile(model), threads=1) as rt:
        ref = rt.run(feeds)
    return model, feeds, ref


@pytest.fixture(scope="module")
def server():
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv:
        yield srv


# ------------------------------------------------------------------------------ the format

def check_trace_events(trace: dict) -> dict:
    """Checks a trace against the trace-event format as Perfetto and chrome://tracing read it;
    returns the events by phase."""
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN / Infinity
    assert trace["displayTimeUnit"] == "ms" and isinstance(trace["traceEvents"], list)
    by_phase = defaultdict(list)
    for e in trace["traceEvents"]:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in e, (key, e)
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        by_phase[e["ph"]].append(e)
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] in ("s", "f"):
            assert "id" in e and "cat" in e, e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "process_labels",
                                 "thread_name", "thread_sort_index"), e
        else:
            raise AssertionError(f"unexpected phase {e['ph']!r}")
    # slices of one track nest or follow each other (tiles of one thread never overlap)
    tracks = defaultdict(list)
    for e in by_phase["X"]:
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in tracks.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-3 or b1 <= a1 + 1e-3, (key, (a0, a1), (b0, b1))
    # flows: one start and one end per id, same name and category, each bound to a slice that
    # starts where it is (the binding Perfetto and Chrome's DevTools both read)
    starts = {(e["pid"], e["tid"], e["ts"]) for e in by_phase["X"]}
    ends = defaultdict(list)
    for e in by_phase["s"] + by_phase["f"]:
        ends[e["id"]].append(e)
        assert (e["pid"], e["tid"], e["ts"]) in starts, e
    for fid, pair in ends.items():
        assert sorted(p["ph"] for p in pair) == ["f", "s"], pair
        assert pair[0]["name"] == pair[1]["name"] and pair[0]["cat"] == pair[1]["cat"], pair
        assert [p for p in pair if p["ph"] == "f"][0].get("bp") == "e"
    # names of the processes and of every thread that holds an event
    named = {(e["pid"], e["tid"]) for e in by_phase["M"] if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in by_phase["M"] if e["name"] == "process_name"}
    for e in by_phase["X"] + by_phase["i"]:
        assert (e["pid"], e["tid"]) in named and e["pid"] in procs, e
    return by_phase


def tiles_by_side(by_phase) -> dict:
    out = {"device": [], "server": []}
    for e in by_phase["X"]:
        side = e.get("args", {}).get("side")
        if side is not None:
            out[side].append(e)
    return out


def check_causality(tg, by_phase) -> int:
    """Every server tile that reads a tile the device sent (and the server did not compute
    itself) starts after that tile's first arrival; returns how many such reads there were."""
    arrival = {}
    for e in sorted((e for e in by_phase["X"] if e["pid"] == PID_LINK and
                     e["name"].startswith("TILES")), key=lambda e: e["ts"] + e["dur"]):
        for t in e["args"]["ids"]:
            arrival.setdefault(t, e["ts"] + e["dur"])
    server = tiles_by_side(by_phase)["server"]
    computed = {e["args"]["tile"] for e in server}
    reads = 0
    for e in server:
        for parent in tg.plan.dependencies(e["args"]["tile"]).tolist():
            if parent in arrival and parent not in computed:
                assert e["ts"] >= arrival[parent] - 1.0, (e["name"], parent)  # 1 us of rounding
                reads += 1
    return reads


# ------------------------------------------------------------------------------ units

@pytest.fixture(scope="module")
def small_graph():
    return coacto.compile(zoo_model("squeezenet", image_size=32), tiles_per_layer=3)


def synthetic_record(tg, offset: float, t_zero: float = 1000.0) -> tuple[TraceRecord, dict]:
    """A made-up inference: the device computes layer 1's first tiles and sends one, the server
    gets the inputs and that tile, computes every reader of them, returns the output tiles."""
    plan = tg.plan
    first = plan.layer_first_tile
    inputs = np.arange(first[0], first[1], dtype=np.int32)
    n = plan.n_tiles
    rec = TraceRecord(None)
    rec.threads = 2
    rec.estimates = {"bandwidth_est_mbps": 20.0, "rtt_est_ms": 1.0}
    d0, d1, dw = np.zeros(n), np.zeros(n), np.full(n, -1, np.int32)
    dev = np.arange(first[1], first[2])[:2]
    for k, t in enumerate(dev):
        d0[t], d1[t], dw[t] = t_zero + 0.001 + k * 0.001, t_zero + 0.0015 + k * 0.001, k % 2
    rec.device = (d0, d1, dw)
    rec.decisions = [{"tile": int(dev[0]), "sent": True, "time": d1[dev[0]],
                      "ect_offloaded": t_zero + 0.004, "ect_server": t_zero + 0.006},
                     {"tile": int(dev[1]), "sent": False, "time": d1[dev[1]],
                      "ect_offloaded": t_zero + 0.009, "ect_server": math.inf}]
    rec.handed(1, inputs, 4000, t_zero + 0.0005)
    rec.released(1, t_zero + 0.0006)
    rec.acked(1, t_zero + 0.0031, offset + t_zero + 0.0021)
    rec.handed(2, dev[:1], 300, d1[dev[0]] + 0.0001)
    rec.released(2, d1[dev[0]] + 0.0002)
    outputs = np.arange(first[-2], first[-1], dtype=np.int32)
    # the server's rows, on its clock: received batches, computed tiles, returned outputs
    srv = lambda t: offset + t_zero + t  # noqa: E731
    rows = []  # (tile, t0, t1, worker)
    rows += [(t, srv(0.0020), srv(0.0021), P.TRACE_RECEIVED) for t in inputs]
    rows.append((dev[0], srv(0.0040), srv(0.0041), P.TRACE_RECEIVED))
    clock = 0.0030
    for t in range(first[1], first[-1]):
        if t == dev[0]:
            continue
        if dev[0] in plan.dependencies(t) and clock < 0.0042:
            clock = 0.0042  # a reader of the sent tile waits for it
        rows.append((t, srv(clock), srv(clock + 1e-5), 0))
        clock += 2e-5
    rows += [(t, srv(clock), srv(clock + 1e-5), P.TRACE_RETURNED) for t in outputs]
    ids, t0, t1, w = zip(*rows)
    header = {"t": P.TRACE, "inf": 1, "rows": len(ids), "t_begin": srv(0.0005),
              "t_inputs": srv(0.0021), "t_server": srv(clock + 2e-5), "threads": 1}
    frames = [f.tobytes() for f in P.pack_trace_rows(ids, t0, t1, w)]
    rec.result(outputs, 500, t_zero + clock + 0.0005, t_zero + clock + 0.0006)
    rec.asked = True
    rec.server_reply(header, frames, n, t_zero + clock + 0.0007)
    stats = {"policy": "dynamic", "latency_s": clock + 0.001, "tiles_local": 2, "tiles_sent": 17,
             "tiles_from_server": int(outputs.size)}
    return rec, stats


def test_builder_on_a_synthetic_inference(small_graph):
    tg = small_graph
    offset = 50.0  # the server's clock runs 50 s ahead
    rec, stats = synthetic_record(tg, offset)
    trace = merged_trace(tg, rec, stats, 1000.0, offset + 2e-5, 1e-4, "server test")
    by_phase = check_trace_events(trace)
    clock = trace["metadata"]["coacto"]["clock"]
    assert clock["offset_s"] == pytest.approx(offset + 2e-5) and clock["source"] == "heartbeats"
    assert clock["lower_s"] <= clock["offset_s"] <= clock["upper_s"]
    sides = tiles_by_side(by_phase)
    assert len(sides["device"]) == 2 and len(sides["server"]) > 10
    for e in sides["server"]:  # mapped: server time - offset - t_zero, in microseconds
        assert e["ts"] == pytest.approx((e["args"]["t_server"] - offset - 2e-5 - 1000.0) * 1e6)
        assert 0 <= e["ts"] <= stats["latency_s"] * 1e6
    assert check_causality(tg, by_phase) > 0
    procs = {e["pid"]: e["args"]["name"] for e in by_phase["M"] if e["name"] == "process_name"}
    assert procs == {PID_DEVICE: "device", PID_LINK: "link", PID_SERVER: "server test"}
    # two batches (the second while the first is in flight: another lane), one RESULT
    up = [e for e in by_phase["X"] if e["pid"] == PID_LINK and e["name"].startswith("TILES")]
    down = [e for e in by_phase["X"] if e["pid"] == PID_LINK and e["name"].startswith("RESULT")]
    assert sorted(e["name"] for e in up) == ["TILES 1", "TILES 2"] and len(down) == 1
    assert up[0]["tid"] != up[1]["tid"]
    # every tile sent has a flow to its first reader or arrival, every output one back
    flows = {e["name"] for e in by_phase["s"]}
    assert {f"tile {t}" for t in rec.batches[1]["ids"].tolist()} <= flows
    decisions = by_phase["i"]
    assert [d["args"]["sent"] for d in decisions] == [True, False]
    assert decisions[0]["args"]["ect_offloaded"] == pytest.approx(0.004)
    assert decisions[0]["args"]["ect_server"] == pytest.approx(0.006)
    assert decisions[1]["args"]["ect_server"] is None  # infinite: JSON has no Infinity
    assert decisions[0]["tid"] != decisions[1]["tid"]  # each on the thread that made it
    assert {e["name"] for e in by_phase["C"]} == {"estimates"}


def test_a_wrong_heartbeat_offset_is_clamped_to_the_inference_s_messages(small_graph):
    rec, stats = synthetic_record(small_graph, 50.0)
    trace = merged_trace(small_graph, rec, stats, 1000.0, 49.0, 1e-4)
    clock = trace["metadata"]["coacto"]["clock"]
    assert clock["measured_s"] == 49.0 and "raised" in clock["source"]
    assert clock["offset_s"] == pytest.approx(clock["lower_s"])
    assert clock["lower_s"] <= 50.0 <= clock["upper_s"]
    check_causality(small_graph, check_trace_events(trace))
    # no heartbeat at all: the middle of the bounds, uncertain by half their width
    m = map_clock(None, None, 49.9, 50.1)
    assert m.offset_s == pytest.approx(50.0) and m.uncertainty_s == pytest.approx(0.1)


def test_a_malformed_server_trace_is_ignored(small_graph):
    n = small_graph.n_tiles
    good = [f.tobytes() for f in P.pack_trace_rows([0, 1], [1.0, 2.0], [1.5, 2.5], [0, -1])]
    assert P.unpack_trace_rows({"rows": 2}, good, n)[0].tolist() == [0, 1]
    bad_cases = [
        good[:3],                                                      # a frame missing
        [good[0], good[1][:8], good[2], good[3]],                      # lengths differ
        [f.tobytes() for f in P.pack_trace_rows([0, n], [1.0] * 2, [2.0] * 2, [0, 0])],  # id
        [f.tobytes() for f in P.pack_trace_rows([0], [2.0], [1.0], [0])],       # ends first
        [f.tobytes() for f in P.pack_trace_rows([0], [math.nan], [1.0], [0])],  # not finite
        [f.tobytes() for f in P.pack_trace_rows([0], [1.0], [2.0], [-7])],      # worker
    ]
    for frames in bad_cases:
        with pytest.raises(P.ProtocolError):
            P.unpack_trace_rows({}, frames, n)
    with pytest.raises(P.ProtocolError):
        P.unpack_trace_rows({"rows": 3}, good, n)
    rec = TraceRecord(None)
    rec.asked = True
    rec.server_reply({"t": P.TRACE, "inf": 1}, bad_cases[1], n, 0.0)
    assert rec.server is None and rec.server_note.startswith("malformed TRACE ignored")
    trace = merged_trace(small_graph, rec, {"policy": "dynamic", "latency_s": 0.01}, 0.0, None,
                         None)
    check_trace_events(trace)


# ------------------------------------------------------------------------------ real inferences

def check_real_trace(tg, trace: dict, stats: dict) -> dict:
    by_phase = check_trace_events(trace)
    meta = trace["metadata"]["coacto"]
    assert meta["server_trace"] == "received", meta["server_trace"]
    sides = tiles_by_side(by_phase)
    assert sides["device"] and sides["server"], {k: len(v) for k, v in sides.items()}
    # read just after the statistics, while the tiles in flight (one per thread) still finish
    assert 0 <= len(sides["device"]) - stats["tiles_local"] <= meta["device_threads"]
    procs = {e["pid"]: e["args"]["name"] for e in by_phase["M"] if e["name"] == "process_name"}
    assert procs[PID_DEVICE] == "device" and procs[PID_SERVER].startswith("server")
    clock = meta["clock"]
    unc = (clock["uncertainty_s"] or 0.0) * 1e6
    # one machine, one CLOCK_MONOTONIC: the true offset is 0, and the estimate is off by at
    # most half the round trip it came from
    assert abs(clock["offset_s"]) * 1e6 <= unc + 1.0, clock
    # within the inference: from its submission to its end, or, when the device finished
    # first, until the server stopped on the CANCEL (the end of its side's span)
    span, = [e for e in by_phase["X"]
             if e["pid"] == PID_SERVER and e["tid"] == TID_SERVER_INFERENCE]
    end = stats["latency_s"] * 1e6
    if stats["finished_by"] == "device":
        end = span["ts"] + span["dur"]
    assert span["ts"] >= -unc - 1.0
    for e in sides["server"]:
        assert -unc - 1.0 <= e["ts"] and e["ts"] + e["dur"] <= end + unc + 1.0, (e, end)
    assert check_causality(tg, by_phase) > 0
    return by_phase


def test_fl_trace_holds_both_sides_on_one_clock(server, squeezenet, tmp_path):
    model, feeds, ref = squeezenet
    # the link holds the input back a few ms: the device computes its half of the stack
    # meanwhile (with the whole input the server would compute every tile it can)
    with Client(server.address, model, threads=1, policy="fl", device_share=0.5,
                bandwidth="20mbit", trace=tmp_path / "fl.json") as client:
        client.connect()
        future = client.infer_async(feeds)
        assert_close(future.result(), ref)
        stats = future.stats
    assert stats["tiles_local"] > 0 and stats["tiles_from_server"] > 0, stats
    trace = json.loads((tmp_path / "fl.json").read_text())
    assert trace == json.loads(json.dumps(future.trace))
    by_phase = check_real_trace(client.graph, trace, stats)
    up = [e for e in by_phase["X"] if e["pid"] == PID_LINK and e["name"].startswith("TILES")]
    down = [e for e in by_phase["X"] if e["pid"] == PID_LINK and e["name"].startswith("RESULT")]
    assert sum(e["args"]["tiles"] for e in up) == stats["tiles_sent"]
    assert sum(e["args"]["tiles"] for e in down) == stats["tiles_from_server"]
    assert len(by_phase["f"]) >= stats["tiles_sent"] + stats["tiles_from_server"]
    assert not by_phase["i"]  # fl decides nothing per tile


def test_dynamic_trace_logs_decisions_with_both_completion_times(squeezenet, tmp_path,
                                                                  monkeypatch):
    """A device that believes itself slower than the server (6 GFLOP/s against 20: 49 ms against
    about 35 with the input's 20 ms on the link, a margin that holds when a loaded machine's
    probe reads the link a little slow) but not so much slower that it leaves the work to the
    server: it sends the input and then computes everything too. (Its work would be insurance
    when, starting after its 20 ms input, it finishes after the margin times the server's 35
    ms: 69 against 52 at the engine's 1.5, so the margin is raised to 2.5 here. CoActo's plan,
    the inputs first, is fixed: a cut or a device share, which decide nothing per tile, would
    be explored or may be predicted faster.)"""
    from coacto.mobile import engine, policies
    from coacto.server import tenants

    monkeypatch.setattr(policies, "choose_dynamic", lambda *a, **k: "inputs")
    monkeypatch.setattr(engine, "INSURANCE_MARGIN", 2.5)
    # The server measures no rate of its own (its threads are three times faster than the 20
    # GFLOP/s it announces): DONE would teach the device so, and from the second inference on
    # it would leave all the work to the server.
    monkeypatch.setattr(tenants, "MIN_FLOPS_SHARE", float("inf"))
    model = zoo_model("resnet18")
    feeds = zoo.input_feeds(model, seed=0)
    # a server of its own: the per-graph speed it learns from earlier inferences would change
    # what the device predicts
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv, \
            Client(srv.address, model, threads=1, policy="dynamic", bandwidth="20mbit",
                   device_flops=6e9) as client:
        client.connect()
        path = tmp_path / "dyn-{n}.json"
        # Both sides computing is a race the device can win outright (the server is a thread of
        # this process, its input 20 ms behind): up to five traced inferences, the first whose
        # merged trace holds tiles of both sides (the server's computed before its results came
        # back, or before the device's CANCEL) is checked.
        for attempt in range(1, 6):
            future = client.infer_async(feeds, trace=path)
            future.result()
            stats = future.stats
            trace = json.loads((tmp_path / f"dyn-{attempt}.json").read_text())
            if trace["metadata"]["coacto"]["server_trace"] == "received" and \
                    all(tiles_by_side(check_trace_events(trace)).values()):
                break
        client.infer(feeds, trace=False)
    written = sorted(p.name for p in tmp_path.iterdir())
    # one file per traced inference, numbered
    assert written == [f"dyn-{n}.json" for n in range(1, attempt + 1)], written
    assert stats["offloaded"] and not stats["fallback"], stats
    by_phase = check_real_trace(client.graph, trace, stats)
    decisions = by_phase["i"]
    assert decisions and all(d["cat"] == "decision" for d in decisions)
    for d in decisions:
        a = d["args"]
        assert a["ect_offloaded"] is not None and a["ect_server"] is not None, a
        assert a["sent"] == (a["ect_offloaded"] < a["ect_server"]), a
        assert d["tid"] != TID_ENGINE and d["pid"] == PID_DEVICE  # on a computing thread
    assert len(decisions) == trace["metadata"]["coacto"]["decisions"]
    plan_decides = {e["args"]["tile"] for e in tiles_by_side(by_phase)["device"]}
    assert {d["args"]["tile"] for d in decisions} <= plan_decides
    meta = trace["metadata"]["coacto"]
    assert meta["policy"] == "dynamic" and meta["estimates_at_start"]["bandwidth_est_mbps"] > 0
    # which plan the scheduler chose, and what it predicted (stats' frontier and predicted_s)
    assert meta["frontier"] == "inputs" == stats["frontier"]
    assert meta["predicted_s"] == pytest.approx(stats["predicted_s"]) and meta["predicted_s"] > 0
    counters = by_phase["C"]
    assert counters and {"bandwidth_mbps", "rtt_ms"} <= set(counters[0]["args"])


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_trace_and_plot(server, squeezenet, tmp_path):
    model, feeds, _ref = squeezenet
    onnx.save(model, tmp_path / "sq.onnx")
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    trace_path = tmp_path / "t.json"
    r = _run("-m", "coacto.mobile.cli", "--server", server.address, "--model", tmp_path / "sq.onnx",
             "--input", f"{name}={tmp_path / 'x.npy'}", "--policy", "cloud", "--threads", 1,
             "--repeat", 2, "--json", "--trace", trace_path)
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.splitlines()[-1])
    trace = json.loads(trace_path.read_text())
    by_phase = check_trace_events(trace)
    assert trace["metadata"]["coacto"]["latency_s"] == pytest.approx(last["latency_s"])
    assert tiles_by_side(by_phase)["server"]  # cloud: the server computes everything
    help_text = _run("-m", "coacto.mobile.cli", "--help").stdout
    assert "--trace" in help_text and "perfetto" in help_text.lower()
    r = _run("-m", "coacto.mobile.cli", "--model", tmp_path / "sq.onnx", "--policy", "local",
             "--random", "--trace", tmp_path / "no" / "t.json")
    assert r.returncode == 1 and "--trace" in r.stderr and "Traceback" not in r.stderr

    png = tmp_path / "t.png"  # matplotlib comes with the test extra
    script = ROOT / "experiments" / "plot_trace.py"
    r = _run(script, trace_path, "-o", png)
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    r = _run(script, "--help")
    assert r.returncode == 0 and "example:" in r.stdout
    (tmp_path / "bad.json").write_text("{}")
    r = _run(script, tmp_path / "bad.json")
    assert r.returncode == 1 and "not a trace-event file" in r.stderr


def test_servers_that_do_not_trace_or_trace_badly_cost_nothing(server, squeezenet, monkeypatch,
                                                               caplog):
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, policy="cloud") as client:
        client.connect()
        # a server that does not announce traces (an older one): the device does not ask for
        # one, nor wait for it
        client._engine.session.server_info.pop("trace")
        future = client.infer_async(feeds, trace=True)
        assert_close(future.result(timeout=2.0), ref)
        meta = future.trace["metadata"]["coacto"]
        assert "older server" in meta["server_trace"] and meta["tiles_from_server"] > 0
        client._engine.session.server_info["trace"] = True

        # one that sends a malformed TRACE: logged and left out, the inference unharmed
        from coacto.server.sessions import TraceLog

        real = TraceLog.message

        def truncated(self, si, t):
            header, frames = real(self, si, t)
            return header, frames[:3]

        monkeypatch.setattr(TraceLog, "message", truncated)
        future = client.infer_async(feeds, trace=True)
        assert_close(future.result(timeout=10.0), ref)
        assert future.trace["metadata"]["coacto"]["server_trace"].startswith("malformed")
        check_trace_events(future.trace)
    assert any("ignoring the server's trace" in r.getMessage() for r in caplog.records)
