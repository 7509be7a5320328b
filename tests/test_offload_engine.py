"""The native offloading machinery without a network: a device inference with a plan and a server
inference exchange tiles in one process; results equal a local run, every tile completes once."""
from __future__ import annotations

import select
import time

import numpy as np
import pytest

import coacto
from coacto import zoo
from coacto.inference import (REPORT_DONE, REPORT_SEND, REPORT_TILE, SEND_ALWAYS, SEND_DECIDE,
                              NativeInference, ReportQueue, now, tile_work)
from coacto.runtime import NativeRuntime

from conftest import assert_close, zoo_model


@pytest.fixture(scope="module")
def setup():
    model = zoo_model("resnet18")
    tg = coacto.compile(model, tiles_per_layer=7)
    feeds = zoo.input_feeds(model)
    with coacto.Runtime(tg, threads=2) as rt:
        ref = rt.run(feeds)
    return tg, feeds, ref


def input_tiles(tg):
    ids = []
    for li in tg.graph.inputs.values():
        ids += range(tg.plan.layer_first_tile[li], tg.plan.layer_first_tile[li + 1])
    return np.asarray(ids)


def output_mask(tg):
    mask = np.zeros(tg.n_tiles, np.uint8)
    for li in tg.graph.outputs.values():
        mask[tg.plan.layer_first_tile[li]:tg.plan.layer_first_tile[li + 1]] = 1
    return mask


def exchange(tg, feeds, device_local, device_send, params=None, server_alive=True, timeout=60,
             server_returns=True, masks=None):
    """Runs a device and a server inference against each other; returns (outputs, stats).
    server_returns=False keeps the server's results from the device, which then computes every
    tile itself: what it sends depends on its own decisions only, not on which side is faster."""
    dev_rt, srv_rt = NativeRuntime(1), NativeRuntime(1)
    dev_q, srv_q = ReportQueue(dev_rt), ReportQueue(srv_rt)
    dev = NativeInference(dev_rt, tg, tag=1)
    srv = NativeInference(srv_rt, tg, tag=2)
    dev.set_plan(local=device_local, send=device_send)
    srv.set_plan(report=output_mask(tg))
    if params:
        dev.set_offload_params(**params)
    dev.set_inputs(feeds)
    deadline = time.monotonic() + timeout
    done = False
    while not done and time.monotonic() < deadline:
        select.select([dev_q.fd, srv_q.fd], [], [], 0.05)
        for tag, kind, tile in dev_q.take():
            if kind == REPORT_SEND and server_alive:
                while True:
                    ids, data = dev.take_sends(1 << 16)
                    if not len(ids):
                        break
                    srv.put_tiles(ids, data)
            if kind == REPORT_DONE:
                done = True
        for tag, kind, tile in srv_q.take():
            if kind == REPORT_TILE and server_alive and server_returns:
                dev.put_tiles([tile], srv.get_tiles([tile]))
        if not server_alive and not done and time.monotonic() > deadline - timeout + 0.5:
            dev.compute_all()  # the engine's fallback after its server timeout
    assert done, "device inference did not finish"
    dev.wait(10)
    out, stats = dev.outputs(), dev.stats()
    if masks is not None:  # which tiles each side's threads computed
        masks += [dev.computed_mask(), srv.computed_mask()]
    dev.close(), srv.close()
    return out, stats


def test_cloud_plan_server_computes_everything(setup):
    tg, feeds, ref = setup
    local = np.zeros(tg.n_tiles, np.uint8)
    local[input_tiles(tg)] = 1
    send = np.zeros(tg.n_tiles, np.uint8)
    send[input_tiles(tg)] = SEND_ALWAYS
    out, stats = exchange(tg, feeds, local, send)
    assert_close(out, ref, rel=1e-6)
    assert stats["tiles_computed"] == 0  # everything came back from the server
    assert stats["tiles_sent"] == len(input_tiles(tg))
    assert stats["tiles_external"] == int(output_mask(tg).sum())


def test_split_plan(setup):
    tg, feeds, ref = setup
    layers = tg.graph.layers
    # a valid split: nothing after it reads a layer before it (a single live tensor)
    cuts = [c for c in range(1, len(layers) - 1)
            if all(p >= c for layer in layers[c + 1:] for p in layer.inputs)]
    split_layer = cuts[len(cuts) // 2]  # compute layers 0..split here, send the split's tiles
    first = tg.plan.layer_first_tile
    local = np.zeros(tg.n_tiles, np.uint8)
    local[:first[split_layer + 1]] = 1
    send = np.zeros(tg.n_tiles, np.uint8)
    send[first[split_layer]:first[split_layer + 1]] = SEND_ALWAYS
    masks = []
    out, stats = exchange(tg, feeds, local, send, masks=masks)
    assert_close(out, ref, rel=1e-6)
    assert stats["tiles_sent"] == first[split_layer + 1] - first[split_layer]
    # the server computed what follows the cut and nothing before it (what it measures its
    # rate by); the device everything up to the cut but its inputs
    dev_mask, srv_mask = masks
    after = np.arange(tg.n_tiles) >= first[split_layer + 1]
    assert np.array_equal(srv_mask, after)
    expect_dev = ~after
    expect_dev[input_tiles(tg)] = False
    assert np.array_equal(dev_mask, expect_dev)


def test_dynamic_decisions_follow_the_ect_rule(setup):
    tg, feeds, ref = setup
    send = np.full(tg.n_tiles, SEND_DECIDE, np.uint8)
    send[input_tiles(tg)] = SEND_ALWAYS
    # a server that will never catch up: every tile is worth sending (the server's results are
    # kept from the device, or a server faster than the device here would complete tiles before
    # the device computed, and so decided on, them)
    out, stats = exchange(tg, feeds, None, send, params=dict(
        bandwidth=1e12, rtt=0.0, inputs_at_server=now() + 1e6, server_flops=1e9, alpha=1.0),
        server_returns=False)
    assert_close(out, ref, rel=1e-6)
    assert stats["tiles_sent"] > tg.n_tiles // 2
    # a link so slow nothing but the inputs is worth sending
    out, stats = exchange(tg, feeds, None, send, params=dict(
        bandwidth=1.0, rtt=1.0, inputs_at_server=now(), server_flops=1e15, alpha=1.0))
    assert_close(out, ref, rel=1e-6)
    assert stats["tiles_sent"] == len(input_tiles(tg))


def test_fallback_when_the_server_is_gone(setup):
    tg, feeds, ref = setup
    local = np.zeros(tg.n_tiles, np.uint8)
    local[input_tiles(tg)] = 1
    out, stats = exchange(tg, feeds, local, None, server_alive=False, timeout=20)
    assert_close(out, ref, rel=1e-6)
    assert stats["tiles_computed"] == tg.n_tiles - len(input_tiles(tg))


def test_tile_work_is_ancestor_flops(setup):
    tg, _, _ = setup
    work = tile_work(tg)
    plan = tg.plan
    # brute force on a few tiles: walk the ancestors
    for t in (0, plan.n_tiles // 2, plan.n_tiles - 1):
        seen, stack = {t}, [t]
        while stack:
            for p in plan.dependencies(stack.pop()):
                if int(p) not in seen:
                    seen.add(int(p))
                    stack.append(int(p))
        assert work[t] == pytest.approx(sum(plan.tile_flops[i] for i in seen))


def test_tile_batches_are_checked_before_anything_is_applied(setup):
    from coacto.runtime import ffi, lib

    tg, feeds, _ = setup
    inf = NativeInference(NativeRuntime(1), tg)
    try:
        ids = np.asarray([5, 6], np.int32)
        size = int(tg.plan.tile_bytes[ids].sum()) // 4
        data = np.zeros(size, np.float32)
        counts = ffi.new("int32_t[2]")
        for bad_ids, n_floats in (([5, tg.n_tiles], size), ([5, 6], size - 1), ([-1, 6], size)):
            arr = np.asarray(bad_ids, np.int32)
            st = lib.coacto_inference_put_tiles(inf.handle, ffi.from_buffer("int32_t[]", arr), 2,
                                                ffi.from_buffer("float[]", data), n_floats,
                                                counts, counts + 1)
            assert st == lib.COACTO_ERR_INVALID_ARGUMENT
            assert inf.tile_state(5) == 0 and counts[0] == 0  # nothing applied
        assert inf.put_tiles(ids, data) == (2, 0)
        assert inf.put_tiles(ids, data) == (0, 2)  # exactly once
    finally:
        inf.close()


@pytest.mark.parametrize("rest_last", [True, False])
def test_a_share_whose_rest_starts_keeps_its_own_tiles_first(setup, rest_last):
    """A device share's rest unparked as insurance (coacto_inference_compute_rest): every tile of
    the share (its blocks of the stack, what the server waits for) is computed before any tile
    of the rest starts, where plain compute_all runs the rest's shallow tiles among them."""
    from coacto.mobile import policies as P

    tg, feeds, ref = setup
    table = P.share_table(tg)
    i = int(np.argmax(table.blocks * (table.blocks < table.n_blocks)))
    plan = P.plan_share(tg, int(table.layer[i]), int(table.blocks[i]), {"predicted_s": 0.1})
    rt = NativeRuntime(1)
    inf = NativeInference(rt, tg, tag=1)
    try:
        inf.set_plan(local=plan.local)
        inf.enable_trace()
        if rest_last:  # after the inputs: before, a rest tile whose inputs came first may run
            inf.set_inputs(feeds)
            inf.compute_all(rest_last=True)
        else:  # before: the rest's first layers compete from the start, in depth order
            inf.compute_all()
            inf.set_inputs(feeds)
        inf.wait(60)
        assert_close(inf.outputs(), ref, rel=1e-6)
        t0, t1, worker = inf.tile_trace()
    finally:
        inf.close()
    own = plan.local.astype(bool)
    own[input_tiles(tg)] = False
    rest = ~plan.local.astype(bool)
    assert own.any() and rest.any() and (worker[own] >= 0).all() and (worker[rest] >= 0).all()
    own_done, rest_first = t1[own].max(), t0[rest].min()
    if rest_last:
        assert own_done <= rest_first
    else:  # the case it guards against: depth order puts the rest's first layers earlier
        assert own_done > rest_first
