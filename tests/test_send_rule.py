"""The send rule (docs/ARCHITECTURE.md §5) as the runtime exports it for the simulator, against hand-computed
completion times, and the per-inference trace that logs each decision the runtime takes with it."""
from __future__ import annotations

import math

import numpy as np
import pytest

import coacto
from coacto.inference import SEND_ALWAYS, SEND_DECIDE, NativeInference, now, tile_work
from coacto.runtime import NativeRuntime, ffi, lib

from conftest import zoo_model


def rule(bandwidth, rtt, inputs_at_server, server_flops, alpha, now, queued, nbytes, work):
    p = ffi.new("coacto_offload_params *")
    p.bandwidth, p.rtt, p.inputs_at_server = bandwidth, rtt, inputs_at_server
    p.server_flops, p.alpha = server_flops, alpha
    off, srv = ffi.new("double *"), ffi.new("double *")
    send = lib.coacto_send_rule(p, now, queued, nbytes, work, off, srv)
    return send, off[0], srv[0]


def test_rule_sends_when_the_link_beats_the_server():
    # 1 MB/s link, 10 ms RTT; 40 kB queued + 10 kB tile at t=1.0 -> 1.0 + 0.05 + 0.005 = 1.055;
    # the input reached the server at 0.5: it needs 2 * 1e9 / 1e10 = 0.2 s -> 0.7. Server wins.
    send, off, srv = rule(1e6, 0.010, 0.5, 1e10, 2.0, 1.0, 40e3, 10e3, 1e9)
    assert send == 0
    assert off == pytest.approx(1.055) and srv == pytest.approx(0.7)
    # 10x the work: the server needs 2 s -> 2.5; sending at 1.055 wins.
    send, off, srv = rule(1e6, 0.010, 0.5, 1e10, 2.0, 1.0, 40e3, 10e3, 1e10)
    assert send == 1 and srv == pytest.approx(2.5)


def test_rule_waits_for_the_inputs_to_arrive_first():
    # Nothing queued at t=0, but the input reaches the server only at 3.0: the tile after it, 3.01.
    send, off, srv = rule(1e6, 0.0, 3.0, 1e10, 1.0, 0.0, 0.0, 10e3, 1e9)
    assert off == pytest.approx(3.01) and srv == pytest.approx(3.1) and send == 1


@pytest.mark.parametrize("bandwidth,server_flops", [(0.0, 1e9), (-1.0, 1e9), (1e6, 0.0)])
def test_rule_never_sends_without_usable_estimates(bandwidth, server_flops):
    send, off, srv = rule(bandwidth, 0.0, 0.0, server_flops, 1.0, 0.0, 0.0, 1e3, 1e12)
    assert send == 0 and math.isinf(off) and math.isinf(srv)


def test_rule_accepts_null_outputs():
    p = ffi.new("coacto_offload_params *")
    p.bandwidth, p.server_flops, p.alpha = 1e6, 1e9, 1.0
    assert lib.coacto_send_rule(p, 0.0, 0.0, 1.0, 1e12, ffi.NULL, ffi.NULL) == 1
    assert lib.coacto_send_rule(ffi.NULL, 0.0, 0.0, 1.0, 1e12, ffi.NULL, ffi.NULL) == 0


def test_trace_logs_every_decision_with_the_rule_s_values():
    model = zoo_model("resnet18")
    tg = coacto.compile(model, tiles_per_layer=4)
    feeds = coacto.zoo.input_feeds(model)
    work = tile_work(tg)
    rt = NativeRuntime(2)
    with NativeInference(rt, tg) as inf:
        send = np.full(tg.n_tiles, SEND_DECIDE, np.uint8)
        inputs = [t for li in tg.graph.inputs.values()
                  for t in range(tg.plan.layer_first_tile[li], tg.plan.layer_first_tile[li + 1])]
        send[inputs] = SEND_ALWAYS
        inf.set_plan(send=send)
        # A server that needs 20 ms for a median tile's work from the inputs, a 2 MB/s link:
        # shallow tiles are cheaper for the server to redo, deep ones cheaper to send.
        flops = float(np.median(work[work > 0])) * 50
        t_in = now()
        inf.set_offload_params(bandwidth=2e6, rtt=0.001, inputs_at_server=t_in,
                               server_flops=flops, alpha=1.0)
        inf.enable_trace()
        inf.set_inputs(feeds)
        inf.wait(60)
        t0, t1, worker = inf.tile_trace()
        decisions = inf.decisions()
        stats = inf.stats()
        with pytest.raises(coacto.CoactoError):
            inf.enable_trace()  # too late: the inference has started
    computed = worker >= 0
    assert computed.sum() == stats["tiles_computed"] > 0
    assert (t1[computed] >= t0[computed]).all() and set(np.unique(worker[computed])) <= {0, 1}
    decided = {d["tile"] for d in decisions}
    assert decided == set(np.flatnonzero(send == SEND_DECIDE)) - set(np.flatnonzero(~computed))
    assert len(decided) == len(decisions)
    assert 0 < sum(d["sent"] for d in decisions) < len(decisions)
    assert stats["tiles_sent"] == sum(d["sent"] for d in decisions) + len(inputs)
    for d in decisions:  # each logged pair is what the exported rule gives for the same inputs
        assert d["sent"] == (d["ect_offloaded"] < d["ect_server"])
        assert d["ect_server"] == pytest.approx(t_in + work[d["tile"]] / flops)
        send_again, off, srv = rule(2e6, 0.001, t_in, flops, 1.0, d["time"], 0.0, 0.0, work[d["tile"]])
        assert srv == pytest.approx(d["ect_server"]) and off <= d["ect_offloaded"]
