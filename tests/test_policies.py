"""Offloading policies: plans are well-formed, split and fl choose sensibly, and every policy's
outputs equal onnxruntime's through an in-process exchange of tiles (no network)."""
from __future__ import annotations

import select
import time

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper
import pytest

import coacto
from coacto.inference import (REPORT_DONE, REPORT_SEND, REPORT_TILE, SEND_ALWAYS, SEND_DECIDE, SEND_NEVER,
                              NativeInference, ReportQueue, now)
from coacto import partition as tm
from coacto.mobile import policies as P
from coacto.runtime import NativeRuntime

from conftest import assert_close, onnxruntime_outputs, zoo_model

MODELS = ("resnet18", "squeezenet")  # 64x64 (conftest sizes): layer 1 stages split spatially


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    name = request.param
    tg = coacto.compile(zoo_model(name), tiles_per_layer=5)
    feeds, ref = onnxruntime_outputs(name)
    return tg, feeds, ref


def all_plans(tg):
    fig = dict(device_flops=5e9, server_flops=20e9, bandwidth=2e6, rtt=0.002, alpha=1.0)
    return [P.make_plan(p, tg, **fig) for p in P.POLICIES] + [
        P.plan_split(tg, 5e9, 20e9, 2e6, 0.002, layer=tm.valid_cuts(tg)[len(tm.valid_cuts(tg)) // 2]),
        P.plan_fl(tg, 5e9, 5e9),
    ]


def exchange(tg, feeds, plan, timeout=60):
    """A device inference with ``plan`` and a server inference that computes whatever it can
    from what it receives and returns its exit tiles; returns the device's (outputs, stats)."""
    dev_rt, srv_rt = NativeRuntime(1), NativeRuntime(1)
    dev_q, srv_q = ReportQueue(dev_rt), ReportQueue(srv_rt)
    dev, srv = NativeInference(dev_rt, tg, tag=1), NativeInference(srv_rt, tg, tag=2)
    out_mask = np.zeros(tg.n_tiles, np.uint8)
    for li in tg.graph.outputs.values():
        out_mask[tm.layer_tiles(tg, li)] = 1
    dev.set_plan(local=plan.local, send=plan.send)
    srv.set_plan(report=out_mask)
    dev.set_offload_params(bandwidth=1e9, rtt=0.0, inputs_at_server=now() + 1e6, server_flops=1e9)
    dev.set_inputs(feeds)
    deadline = time.monotonic() + timeout
    done = False
    while not done and time.monotonic() < deadline:
        select.select([dev_q.fd, srv_q.fd], [], [], 0.05)
        for _tag, kind, _tile in dev_q.take():
            if kind == REPORT_SEND and plan.uses_server:
                while True:
                    ids, data = dev.take_sends(1 << 16)
                    if not len(ids):
                        break
                    srv.put_tiles(ids, data)
            done |= kind == REPORT_DONE
        for _tag, kind, tile in srv_q.take():
            if kind == REPORT_TILE:
                dev.put_tiles([tile], srv.get_tiles([tile]))
    assert done, "the device's inference did not finish"
    out, stats = dev.outputs(), dev.stats()
    dev.close(), srv.close()
    return out, stats


# ------------------------------------------------------------------------------ well-formed

def test_plans_are_well_formed(model):
    tg, _, _ = model
    for plan in all_plans(tg):
        for mask in (plan.local, plan.send):
            if mask is not None:
                assert mask.shape == (tg.n_tiles,) and mask.dtype == np.uint8
        assert P.check_plan(tg, plan) == [], plan.policy


def test_check_plan_catches_an_unreachable_output(model):
    tg, _, _ = model
    plan = P.plan_cloud(tg)
    plan.send[:] = 0  # nothing goes to the server, and the device parks everything
    assert P.check_plan(tg, plan)


def test_cuts_send_every_tensor_read_after_them(model):
    tg, _, _ = model
    layers = tg.graph.layers
    cuts = tm.valid_cuts(tg)
    assert cuts[0] == max(tg.graph.inputs.values()) and cuts[-1] == len(layers) - 1
    several = 0
    for c in cuts:
        read_later = {p for layer in layers[c + 1:] for p in layer.inputs if p < c}
        assert tm.cut_layers(tg, c) == sorted(read_later) + [c], c
        assert tm.cut_bytes(tg)[c] == pytest.approx(
            sum(float(tg.plan.tile_bytes[list(tm.layer_tiles(tg, li))].sum())
                for li in sorted(read_later) + [c]))
        assert (c in tm.single_tensor_cuts(tg)) == (not read_later)
        several += bool(read_later)
    assert several  # both models have cuts inside a block (a shortcut or a concat is live)


def test_a_cut_inside_a_block_sends_both_tensors_and_matches_onnxruntime(model):
    tg, feeds, ref = model
    c = next(c for c in tm.valid_cuts(tg) if len(tm.cut_layers(tg, c)) > 1)
    plan = P.plan_split(tg, 5e9, 20e9, 2e6, 0.002, layer=c)
    sent = np.flatnonzero(plan.send == SEND_ALWAYS)
    assert set(sent.tolist()) == set(tm.cut_tiles(tg, c).tolist())
    out, stats = exchange(tg, feeds, plan)
    assert_close(out, ref, rel=1e-4)


def _exported_encoder(layers=2, s=16, d=32, h=2, seed=0):
    """Attention blocks as torch.onnx.export writes them: MatMul + Add projections, Reshape /
    Transpose heads, the padding mask as (1 - mask) * finfo.min added to the scores (read by
    every block), residual Adds."""
    rng = np.random.default_rng(seed)
    dh = d // h
    const = {"hs": np.array([1, s, h, dh], np.int64), "ms": np.array([1, s, d], np.int64),
             "ax12": np.array([1, 2], np.int64), "one": np.array(1.0, np.float32),
             "fmin": np.array(np.finfo(np.float32).min, np.float32),
             "sc": np.array(np.sqrt(dh), np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["mask", "ax12"], ["m4"]),
             helper.make_node("Cast", ["m4"], ["mf"], to=T.FLOAT),
             helper.make_node("Sub", ["one", "mf"], ["inv"]),
             helper.make_node("Mul", ["inv", "fmin"], ["bias"])]
    x = "x"
    for blk in range(layers):
        p = f"b{blk}_"
        for n in "qkvo":
            const[p + "W" + n] = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
            const[p + "b" + n] = (0.1 * rng.standard_normal(d)).astype(np.float32)
        for n in "qkv":
            nodes += [helper.make_node("MatMul", [x, p + "W" + n], [p + n + "0"]),
                      helper.make_node("Add", [p + n + "0", p + "b" + n], [p + n + "1"]),
                      helper.make_node("Reshape", [p + n + "1", "hs"], [p + n + "2"]),
                      helper.make_node("Transpose", [p + n + "2"], [p + n],
                                       perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])]
        nodes += [helper.make_node("MatMul", [p + "q", p + "k"], [p + "s0"]),
                  helper.make_node("Div", [p + "s0", "sc"], [p + "s1"]),
                  helper.make_node("Add", [p + "s1", "bias"], [p + "s2"]),
                  helper.make_node("Softmax", [p + "s2"], [p + "pr"], axis=-1),
                  helper.make_node("MatMul", [p + "pr", p + "v"], [p + "c0"]),
                  helper.make_node("Transpose", [p + "c0"], [p + "c1"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [p + "c1", "ms"], [p + "c2"]),
                  helper.make_node("MatMul", [p + "c2", p + "Wo"], [p + "o0"]),
                  helper.make_node("Add", [p + "o0", p + "bo"], [p + "o1"]),
                  helper.make_node("Add", [p + "o1", x], [p + "y"])]
        x = p + "y"
    graph = helper.make_graph(
        nodes, "exported_encoder",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, s, d]),
         helper.make_tensor_value_info("mask", T.INT64, [1, s])],
        [helper.make_tensor_value_info(x, T.FLOAT, [1, s, d])],
        [numpy_helper.from_array(v, k) for k, v in const.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _exported_encoder_case(seed: int, tokens: int):
    """The exported encoder compiled at 4 tiles per layer, inputs with ``tokens`` of 16 unpadded,
    and onnxruntime's outputs for them."""
    import onnxruntime as ort

    m = _exported_encoder()
    tg = coacto.compile(m, tiles_per_layer=4)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((1, 16, 32)).astype(np.float32),
             "mask": np.array([[1] * tokens + [0] * (16 - tokens)], np.int64)}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return m, tg, feeds, dict(zip(names, sess.run(names, feeds)))


def test_an_exported_encoder_cut_anywhere_matches_onnxruntime():
    """Not a zoo model: two attention blocks written as torch.onnx.export writes them (MatMul +
    Add projections, Reshape / Transpose heads, the padding mask turned into an additive bias
    that both blocks read, residual Adds). Every cut -- each sends the mask's bias and the block
    state live there -- gives onnxruntime's output through an in-process exchange."""
    m, tg, feeds, ref = _exported_encoder_case(seed=1, tokens=11)
    cuts = tm.valid_cuts(tg)
    assert len(cuts) > 10 and tm.single_tensor_cuts(tg) == [cuts[-1]]
    for c in cuts:
        out, _ = exchange(tg, feeds, P.plan_split(tg, 5e9, 20e9, 2e6, 0.002, layer=c))
        assert_close(out, ref, rel=1e-4)
    fast = P.plan_split(tg, device_flops=1e8, server_flops=1e12, bandwidth=1e8, rtt=1e-3)
    assert fast.split_layer == cuts[0] and len(tm.cut_layers(tg, cuts[0])) == 2


@pytest.mark.parametrize("policy", ["split", "dynamic"])
def test_an_exported_encoder_offloads_over_zeromq(policy):
    """The same encoder through a real server: split at a cut inside the second block (the mask's
    bias and three tensors of the block go up), and dynamic on a fast loopback link."""
    from coacto.mobile import Client
    from coacto.server import Server

    m, tg, feeds, ref = _exported_encoder_case(seed=2, tokens=9)
    cut = max(tm.valid_cuts(tg), key=lambda c: len(tm.cut_layers(tg, c)))
    options = {"split_layer": cut} if policy == "split" else {}
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv, \
            Client(srv.address, tg, threads=1, policy=policy, timeout=10, model_bytes=m,
                   device_flops=1e6, **options) as client:  # 0.33 s alone: worth offloading
        client.connect(10)
        for _ in range(2):
            assert_close(client.infer(feeds), ref, rel=1e-4)
            s = client.last_stats
            assert not s["fallback"] and s["offloaded"] and s["tiles_sent"] > 0, s
    if policy == "split":  # (dynamic's device computes everything too and may finish first)
        assert s["split_layer"] == cut and s["tiles_sent"] == len(tm.cut_tiles(tg, cut))
        assert s["tiles_from_server"] > 0


def test_a_transformer_can_be_cut_anywhere_its_mask_goes_along():
    """BERT's attention mask (an input) is read by every layer: before cuts sent several tensors
    only the cut after the last attention was valid, so split and dynamic priced offloading as
    running the whole encoder here, and never offloaded. Every layer is a cut now; the input cut
    is cloud, and a mid-encoder cut sends the hidden state with the mask."""
    import onnxruntime as ort

    from coacto import zoo

    m = zoo.build("bert", layers=2, hidden=64, heads=4, seq_len=16, vocab=1000)
    tg = coacto.compile(m, tiles_per_layer=4)
    feeds = zoo.input_feeds(m, seed=0)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feeds)))
    inputs = sorted(tg.graph.inputs.values())
    cuts = tm.valid_cuts(tg)
    assert cuts[0] == inputs[-1] and tm.cut_layers(tg, cuts[0]) == [
        li for li in inputs if any(li in layer.inputs for layer in tg.graph.layers)]
    assert len(tm.single_tensor_cuts(tg)) < len(cuts) // 4  # the mask is live almost everywhere
    # a fast link and server: the inputs go (a few hundred bytes), not the encoder's output
    plan = P.plan_split(tg, device_flops=1e9, server_flops=1e12, bandwidth=1e8, rtt=1e-3)
    assert plan.split_layer == cuts[0] and plan.info["predicted_s"] < plan.info["predicted_local_s"]
    mid = next(c for c in cuts[len(cuts) // 2:] if len(tm.cut_layers(tg, c)) > 1)
    for layer in (cuts[0], mid):
        out, _ = exchange(tg, feeds, P.plan_split(tg, 5e9, 20e9, 2e6, 0.002, layer=layer))
        assert_close(out, ref, rel=1e-4)
    dyn = P.plan_dynamic(tg, device_flops=1e9, server_flops=1e12, bandwidth=1e8, rtt=1e-3)
    assert dyn.info.get("local_after_inputs")  # the input is the best start: CoActo's rule
    # lossless transfers make the mask's arithmetic (all zeros for unpadded tokens) near-free to
    # send: the cut after it is a hair cheaper than the inputs, not worth streaming from the
    # device (a plan that keeps the device computing from the start; BERT lost 10-15% to it)
    wire = np.ones(tg.n_layers)
    after = next(c for c in cuts[1:] if tm.cut_layers(tg, c)[-1] == c and
                 tm.layer_bytes(tg)[c] <= max(tm.layer_bytes(tg)[li] for li in inputs))
    wire[after] = 0.0
    costs = P.split_costs(tg, 1e9, 1e12, 1e8, 1e-3, wire=wire)
    assert min(costs, key=lambda c: (costs[c], -c)) != cuts[0]  # the cheapest by a hair
    dyn = P.plan_dynamic(tg, device_flops=1e9, server_flops=1e12, bandwidth=1e8, rtt=1e-3,
                         wire=wire)
    assert dyn.info.get("local_after_inputs") and dyn.split_layer is None


def test_cloud_and_dynamic_masks(model):
    tg, _, _ = model
    inp = tm.input_tiles(tg)
    cloud = P.plan_cloud(tg)
    assert cloud.local.sum() == len(inp) and (cloud.send[inp] == SEND_ALWAYS).all()
    assert cloud.send.sum() == SEND_ALWAYS * len(inp)
    dyn = P.plan_dynamic(tg)  # device speed unknown: CoActo's rule, inputs first
    assert dyn.local is None and (dyn.send[inp] == SEND_ALWAYS).all()
    outs = np.concatenate([tm.layer_tiles(tg, li) for li in set(tg.graph.outputs.values())])
    assert (dyn.send[outs] == SEND_NEVER).all()  # the device's own exit tiles stay here
    rest = np.setdiff1d(np.arange(tg.n_tiles), np.concatenate([inp, outs]))
    assert (dyn.send[rest] == SEND_DECIDE).all()
    assert P.plan_local(tg).uses_server is False


def test_dynamic_sends_a_cut_when_the_input_is_expensive(model):
    """A slow link and a device fast enough to shrink the input first: the tiles of the cut the
    cost model prefers go in one message once computed (``send_whole``, as split sends its cut
    and as the model prices it); what comes after the cut waits, as insurance (the engine's
    _park_rest). (The device alone is faster still: that is the engine's gate's decision, taken
    before; the plan is the best way to offload.)"""
    tg, feeds, ref = model
    costs = P.split_costs(tg, 1e10, 1e11, 2e5, 0.001)
    later = {c: v for c, v in costs.items() if c not in tg.graph.inputs.values()
             and c != tg.n_layers - 1}
    best = min(later, key=lambda c: (later[c], -c))
    assert later[best] < 0.5 * costs[max(tg.graph.inputs.values())]
    dyn = P.plan_dynamic(tg, device_flops=1e10, server_flops=1e11, bandwidth=2e5, rtt=0.001)
    assert dyn.info["kind"] == "cut" and dyn.info["park_rest"] and dyn.info["send_whole"]
    needed = tg.plan.ancestors(np.isin(np.arange(tg.n_tiles), tm.cut_tiles(tg, best)))
    needed[tm.input_tiles(tg)] = True
    assert (dyn.local.astype(bool) == needed).all() and P.check_plan(tg, dyn) == []
    out, stats = exchange(tg, feeds, dyn)  # the server computes everything after the cut
    assert_close(out, ref, rel=1e-4)
    assert stats["tiles_computed"] <= int(needed.sum())
    assert dyn.split_layer == best and dyn.info["predicted_s"] == pytest.approx(later[best])
    sent = np.nonzero(dyn.send)[0]
    assert set(sent.tolist()) == set(tm.cut_tiles(tg, best).tolist())
    assert (dyn.send[sent] == SEND_ALWAYS).all()
    assert P.frontier(dyn) == f"cut {tg.graph.layers[best].name}"


# ------------------------------------------------------------------------------ split

def test_split_goes_to_the_cloud_with_a_fast_link_and_server(model):
    tg, _, _ = model
    plan = P.plan_split(tg, device_flops=1e9, server_flops=1e13, bandwidth=1e11, rtt=1e-4)
    assert plan.split_layer == tm.valid_cuts(tg)[0] and plan.uses_server
    assert (plan.local == P.plan_cloud(tg).local).all()


def test_split_stays_local_with_a_tiny_link(model):
    tg, _, _ = model
    plan = P.plan_split(tg, device_flops=1e9, server_flops=1e13, bandwidth=1e3, rtt=0.05)
    assert plan.split_layer == tg.n_layers - 1 and not plan.uses_server
    assert plan.local is None and plan.send is None


def test_split_chooses_the_cheapest_predicted_cut(model):
    tg, _, _ = model
    fig = (3e9, 30e9, 1e6, 0.01, 1.5)
    costs = P.split_costs(tg, *fig)
    plan = P.plan_split(tg, *fig)
    assert costs[plan.split_layer] == min(costs.values())
    assert plan.info["predicted_s"] == pytest.approx(min(costs.values()))
    first = tg.plan.layer_first_tile
    c = plan.split_layer
    if plan.uses_server:
        assert plan.local[:first[c + 1]].all() and not plan.local[first[c + 1]:].any()
        assert (plan.send[first[c]:first[c + 1]] == SEND_ALWAYS).all()


def test_split_rejects_an_invalid_layer(model):
    tg, _, _ = model
    invalid = [c for c in range(tg.n_layers) if c not in tm.valid_cuts(tg)]
    if invalid:
        with pytest.raises(P.PolicyError, match="valid split"):
            P.plan_split(tg, 1e9, 1e10, 1e6, 0.01, layer=invalid[-1])
    with pytest.raises(P.PolicyError, match="unknown policy"):
        P.make_plan("nearest", tg)


# ------------------------------------------------------------------------------ fl

def test_fl_recomputes_halos_on_the_device(model):
    tg, _, _ = model
    plan = P.plan_fl(tg, device_flops=5e9, server_flops=5e9)
    k = plan.split_layer
    assert k in tm.valid_cuts(tg) and 0 < plan.info["device_blocks"] < plan.info["blocks"]
    tiles_k = np.asarray(tm.layer_tiles(tg, k))
    dev_k = tiles_k[plan.send[tiles_k] == SEND_ALWAYS]
    srv_k = tiles_k[plan.send[tiles_k] != SEND_ALWAYS]
    assert len(dev_k) and len(srv_k)
    local = plan.local.astype(bool)
    assert local[dev_k].all() and not local[srv_k].any()
    # the halo: tiles the device computes that the server's part needs too
    srv_anc = tg.plan.ancestors(np.isin(np.arange(tg.n_tiles), srv_k))
    halo = local & srv_anc
    halo[tm.input_tiles(tg)] = False
    assert halo.any() and plan.info["halo_tiles"] == int(halo.sum())
    # nothing after the stack is computed on the device
    assert not local[tg.plan.layer_first_tile[k + 1]:].any()


def test_fl_shares_follow_the_speeds(model):
    tg, _, _ = model
    slow_dev = P.plan_fl(tg, device_flops=1e9, server_flops=1e12)
    fast_dev = P.plan_fl(tg, device_flops=1e12, server_flops=1e9)
    assert slow_dev.info["device_blocks"] <= fast_dev.info["device_blocks"]
    assert slow_dev.local.sum() <= fast_dev.local.sum()


# ------------------------------------------------------------------------------ device shares

def _share_oracle(tg, k, m):
    """The two parts of a share of layer k's column blocks, from policies.ancestors (a tile at
    a time): the device's last m blocks and their ancestors, the server's others and theirs."""
    first = tg.plan.layer_first_tile
    n_rows = len(tg.plan.row_bounds[k]) - 1
    n = len(tg.plan.col_bounds[k]) - 1
    tiles = np.arange(first[k], first[k + 1])
    dev_k = tiles[(tiles - first[k]) // n_rows >= n - m]
    srv_k = tiles[(tiles - first[k]) // n_rows < n - m]
    dev = tg.plan.ancestors(np.isin(np.arange(tg.n_tiles), dev_k))
    srv = tg.plan.ancestors(np.isin(np.arange(tg.n_tiles), srv_k))
    return dev, srv, dev_k


def test_the_share_table_matches_the_ancestors_tile_by_tile(model):
    tg, _, _ = model
    table = P.share_table(tg)
    assert len(table) and set(table.layer.tolist()) <= set(tm.single_tensor_cuts(tg))
    flops = tg.plan.tile_flops.astype(float)
    raw = tg.plan.tile_bytes.astype(float)
    inp = tm.input_tiles(tg)
    lf = np.cumsum(tm.flops_per_layer(tg))
    for i in range(0, len(table), max(1, len(table) // 7)):
        k, m = int(table.layer[i]), int(table.blocks[i])
        dev, srv, dev_k = _share_oracle(tg, k, m)
        assert table.device_flops[i] == pytest.approx(flops[dev].sum())
        assert table.server_flops[i] == pytest.approx(flops[srv].sum())
        assert table.rest_flops[i] == pytest.approx(lf[-1] - lf[k])
        assert table.server_inputs[i].sum() == pytest.approx(raw[inp[srv[inp]]].sum())
        assert table.device_out[i] == pytest.approx(raw[dev_k].sum())


def test_a_share_plan_gives_the_two_sides_disjoint_parts(model):
    tg, _, _ = model
    table = P.share_table(tg)
    i = int(np.argmax(table.blocks * (table.blocks < table.n_blocks)))  # a share of many blocks
    k, m = int(table.layer[i]), int(table.blocks[i])
    plan = P.plan_share(tg, k, m, {"predicted_s": 0.1})
    assert P.check_plan(tg, plan) == []
    dev, srv, dev_k = _share_oracle(tg, k, m)
    inp = tm.input_tiles(tg)
    local = plan.local.astype(bool)
    # the device computes its part and nothing else; it sends its blocks of layer k and the
    # inputs the server's part needs, nothing more
    expect = dev.copy()
    expect[inp] = True
    assert (local == expect).all()
    sent = set(np.flatnonzero(plan.send == SEND_ALWAYS).tolist())
    assert sent == set(dev_k.tolist()) | set(inp[srv[inp]].tolist())
    assert not (plan.send == SEND_DECIDE).any()
    # the server cannot compute the device's blocks from what it receives: the parts are
    # disjoint but for halos
    assert len(inp[srv[inp]]) < len(inp) or m == 0
    assert plan.info["device_blocks"] == m and P.frontier(plan).startswith("share ")
    with pytest.raises(P.PolicyError, match="device share"):
        P.plan_share(tg, k, 0)
    with pytest.raises(P.PolicyError, match="cannot end a device share"):
        P.plan_share(tg, tg.n_layers - 1, 1)


def test_share_costs_follow_their_model(model):
    tg, _, _ = model
    d, s, b, rtt, a, down = 4e9, 20e9, 3e6, 0.004, 1.3, 5e6
    table, costs = P.share_costs(tg, d, s, b, rtt, a, down)
    i = len(table) // 2
    srv_in = table.server_inputs[i].sum() / b
    server_part = srv_in + rtt / 2 + a * table.server_flops[i] / s
    device_part = max(table.device_flops[i] / d, srv_in) + table.device_out[i] / b + rtt / 2
    expect = max(server_part, device_part) + a * table.rest_flops[i] / s + \
        tm.output_bytes(tg) / down + rtt / 2
    assert costs[i] == pytest.approx(expect)
    # encoded bytes: halving every layer's wire bytes shortens every share's prediction
    _, halved = P.share_costs(tg, d, s, b, rtt, a, down, wire=np.full(tg.n_layers, 0.5))
    assert (halved < costs).all()


def _one_server_finish(tg, server_flops, bandwidth, rtt, alpha, down):
    """The inputs plan played out tile by tile (the oracle of inputs_cost): the input tiles
    arrive one after another in tile order; a tile is ready once every input tile among its
    ancestors (found by walking its parents) has arrived; one server computes the tiles in the
    order they become ready (a valid order: a parent is ready no later than its child), each
    when it is free and the tile ready; then the exit tiles come back."""
    plan = tg.plan
    inp = tm.input_tiles(tg)
    raw = plan.tile_bytes[inp].astype(float)
    arrive = dict(zip(inp.tolist(), (rtt / 2 + np.cumsum(raw) / bandwidth).tolist()))
    ready = {}
    off, par = plan.parent_offsets, plan.parents
    for tile in range(tg.n_tiles):
        ps = par[off[tile]:off[tile + 1]].tolist()
        ready[tile] = arrive[tile] if tile in arrive else max((ready[p] for p in ps),
                                                              default=0.0)
    t = 0.0
    for tile in sorted(set(range(tg.n_tiles)) - set(arrive), key=lambda x: (ready[x], x)):
        t = max(t, ready[tile]) + alpha * float(plan.tile_flops[tile]) / server_flops
    return t + tm.output_bytes(tg) / down + rtt / 2


def test_the_inputs_plan_is_priced_as_streamed(model):
    """inputs_cost against the tile-by-tile oracle: the server starts on the first rows of the
    image while the rest are on the way, which split's price of the same cut (the whole
    transfer, then the whole server work) does not see."""
    _check_inputs_cost(model[0])


def test_the_inputs_plan_of_a_tf2onnx_style_cnn_is_priced_as_streamed():
    _check_inputs_cost(coacto.compile(_tf_style_cnn(), tiles_per_layer=6))


def test_the_inputs_plan_of_an_encoder_is_priced_as_streamed():
    """Several inputs (token ids, attention mask), tiles that read none of them (position
    embeddings): the same oracle, the inputs sent in layer order."""
    from coacto import zoo

    tg = coacto.compile(zoo.build("bert", layers=2, hidden=64, heads=4, seq_len=16, vocab=1000))
    assert len(tg.graph.inputs) >= 2
    _check_inputs_cost(tg, overlaps=False)  # (attention reads every token: little to overlap)


def _check_inputs_cost(tg, overlaps=True):
    d, s, rtt, a, down = 4e9, 20e9, 0.004, 1.3, 5e6
    total = tm.cut_flops(tg)[3]
    for b in (2e5, 3e6, 5e7):
        expect = _one_server_finish(tg, s, b, rtt, a, down)
        assert P.inputs_cost(tg, s, b, rtt, a, down) == pytest.approx(expect, rel=1e-9)
        cuts, split = P.split_cost_array(tg, d, s, b, rtt, a, down)
        assert cuts[0] == max(tg.graph.inputs.values())
        opts = P.dynamic_options(tg, d, s, b, rtt, a, down)
        assert opts["inputs"][0] == pytest.approx(expect, rel=1e-9)
        # the overlap is real and bounded: below split's price, above the server's work alone
        # and above the transfer alone
        assert expect < split[0] - 1e-6 if overlaps else expect <= split[0] + 1e-12
        assert expect > a * total / s + rtt and expect > tm.input_bytes(tg) / b + rtt
    # an instant link: nothing to overlap, split's price (with no transfer)
    assert P.inputs_cost(tg, s, 1e15, rtt, a, down) == pytest.approx(
        rtt + a * total / s + tm.output_bytes(tg) / down, rel=1e-6)
    # wire ratios scale the input's bytes
    half = np.full(tg.n_layers, 0.5)
    assert P.inputs_cost(tg, s, 2e5, rtt, a, down, wire=half) == pytest.approx(
        _one_server_finish(tg, s, 4e5, rtt, a, down), rel=1e-9)


def test_dynamic_takes_a_share_when_it_is_predicted_clearly_best():
    """SqueezeNet with a fast server and a link slow enough that the device had better keep
    part of the input: a share is predicted 14% faster than anything else."""
    tg = coacto.compile(zoo_model("squeezenet"), tiles_per_layer=5)
    feeds, ref = onnxruntime_outputs("squeezenet")
    dev, srv, bw = 5.6e8, 2e11, 4.9e6
    opts = P.dynamic_options(tg, dev, srv, bw, 1e-3)
    assert P.choose_dynamic(opts) == "share"
    assert opts["share"][0] < 0.9 * min(v for k, (v, _w) in opts.items() if k != "share")
    plan = P.plan_dynamic(tg, dev, srv, bw, 1e-3)
    assert plan.info["kind"] == "share" and plan.info["predicted_s"] == opts["share"][0]
    assert (plan.info["share_layer"], plan.info["device_blocks"]) == opts["share"][1]
    out, stats = exchange(tg, feeds, plan)
    assert_close(out, ref, rel=1e-4)
    assert stats["tiles_computed"] <= int(plan.local.sum())
    # what each kind has been off by decides: a share that ran 50% late loses to the inputs
    late = P.plan_dynamic(tg, dev, srv, bw, 1e-3,
                          correct=lambda v, k: v * 1.5 if k == "share" else v)
    assert late.info["kind"] != "share"


def test_a_recorded_frontier_replays_the_same_plan():
    """What stats' frontier names, given back as plan_dynamic's frontier, is that plan again
    (the simulator replays real inferences this way); its outputs still match onnxruntime's."""
    tg = coacto.compile(zoo_model("squeezenet"), tiles_per_layer=5)
    feeds, ref = onnxruntime_outputs("squeezenet")
    dev, srv, bw = 5.6e8, 2e11, 4.9e6
    opts = P.dynamic_options(tg, dev, srv, bw, 1e-3)
    assert {"inputs", "cut", "share"} <= set(opts)
    for kind in ("inputs", "cut", "share"):
        chosen = P.plan_dynamic(tg, dev, srv, bw, 1e-3, correct=lambda v, k, kind=kind:
                                v if k == kind else 10 * v)
        assert chosen.info["kind"] == kind
        name = P.frontier(chosen)
        # replayed under other estimates (a link 20x faster): the same plan, tile for tile
        again = P.plan_dynamic(tg, dev, srv, 20 * bw, 1e-3, frontier=name)
        assert P.frontier(again) == name and again.info["kind"] == kind
        # priced under the new estimates though no longer the best of its kind (the engine
        # times its insurance from it; NaN once left a replayed cut's device work parked)
        assert np.isfinite(again.info["predicted_s"]) and again.info["predicted_s"] > 0
        assert np.array_equal(np.asarray(again.send), np.asarray(chosen.send))
        assert (again.local is None) == (chosen.local is None)
        if chosen.local is not None:
            assert np.array_equal(np.asarray(again.local), np.asarray(chosen.local))
    out, _ = exchange(tg, feeds, P.make_plan("dynamic", tg, device_flops=dev, server_flops=srv,
                                             bandwidth=bw, frontier=P.frontier(chosen)))
    assert_close(out, ref, rel=1e-4)
    # a cut dynamic would not choose is still that cut, priced by the cost model
    cut = tm.valid_cuts(tg)[1]
    assert cut != opts["cut"][1]
    plan = P.plan_dynamic(tg, dev, srv, bw, 1e-3, frontier=f"cut {tg.graph.layers[cut].name}")
    cuts, costs = P.split_cost_array(tg, dev, srv, bw, 1e-3)
    assert plan.split_layer == cut
    assert plan.info["predicted_s"] == pytest.approx(costs[list(cuts).index(cut)], rel=1e-12)
    table, shares = P.share_costs(tg, dev, srv, bw, 1e-3)
    other = int(np.argmax(shares))  # the worst share
    layer, blocks = int(table.layer[other]), int(table.blocks[other])
    plan = P.plan_dynamic(tg, dev, srv, bw, 1e-3, frontier=f"share {tg.graph.layers[layer].name} "
                          f"{blocks}/{int(table.n_blocks[other])}")
    assert plan.info["predicted_s"] == pytest.approx(shares[other], rel=1e-12)
    for bad in ("device", "cut no-such-layer", "share no-such-layer 1/2", "inputs now", "", 3):
        with pytest.raises(P.PolicyError):
            P.plan_dynamic(tg, dev, srv, bw, 1e-3, frontier=bad)


def test_dynamic_tries_a_kind_it_has_not_run_when_it_is_near_the_best():
    opts = {"local": (1.0, None), "inputs": (0.30, 0), "cut": (0.36, 5), "share": (0.50, (3, 2))}
    assert P.choose_dynamic(opts) == "inputs"
    assert P.choose_dynamic(opts, unseen=("cut", "share")) == "cut"  # within 1.25x, not share
    assert P.choose_dynamic(opts, unseen=("share",)) == "inputs"
    # a corrected best: the cut has run and was 30% early, the inputs not yet
    corr = lambda v, k: v * 0.7 if k == "cut" else v  # noqa: E731
    assert P.choose_dynamic(opts, corr) == "cut"
    assert P.choose_dynamic(opts, corr, unseen=("inputs",)) == "inputs"  # 0.30 <= 1.25 * 0.252
    # ... but not when 20% early: a cut must beat the inputs by CUT_MIN_GAIN
    assert P.choose_dynamic(opts, lambda v, k: v * 0.8 if k == "cut" else v) == "inputs"
    # an exploring inference runs the stalest kind the model puts near the best, whatever its
    # error says: one bad sample (a link busy with a probe) cannot shut a kind out for good
    stale = lambda v, k: v + 0.1 if k == "inputs" else v  # noqa: E731
    assert P.choose_dynamic(opts, stale) == "cut"
    assert P.choose_dynamic(opts, stale, explore=("inputs", "cut", "share")) == "inputs"
    assert P.choose_dynamic(opts, stale, explore=("share", "cut", "inputs")) == "cut"  # 0.5 > 1.25 * 0.3
    # local is the gate's choice, made before: the plan is the best offloaded one
    assert P.choose_dynamic({"local": (0.1, None), "inputs": (0.12, 0)}) == "inputs"


def _tf_style_cnn(size=48, seed=0):
    """A CNN the way tf2onnx writes a Keras model: NHWC input transposed to NCHW, Conv with bias,
    Relu, a residual Add, MaxPool, then ReduceMean over H, W (Keras' GlobalAveragePooling2D),
    MatMul + Add for the dense layer."""
    r = np.random.default_rng(seed)
    inits, nodes = [], []
    node = helper.make_node

    def w(name, shape):
        inits.append(numpy_helper.from_array((r.standard_normal(shape) * 0.1).astype(np.float32),
                                             name))
        return name

    def conv(x, y, cin, cout, stride=1):
        nodes.append(node("Conv", [x, w(f"k_{y}", (cout, cin, 3, 3)), w(f"b_{y}", (cout,))], [y],
                          pads=[1, 1, 1, 1], strides=[stride, stride]))

    nodes.append(node("Transpose", ["input_1"], ["x0"], perm=[0, 3, 1, 2]))
    conv("x0", "c1", 3, 16, stride=2)
    nodes.append(node("Relu", ["c1"], ["r1"]))
    conv("r1", "c2", 16, 16)
    nodes.append(node("Relu", ["c2"], ["r2"]))
    conv("r2", "c3", 16, 16)
    nodes.append(node("Add", ["c3", "r1"], ["a3"]))
    nodes.append(node("Relu", ["a3"], ["r3"]))
    nodes.append(node("MaxPool", ["r3"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]))
    conv("p3", "c4", 16, 32)
    nodes.append(node("Relu", ["c4"], ["r4"]))
    nodes.append(node("ReduceMean", ["r4"], ["g"], axes=[2, 3], keepdims=0))
    nodes.append(node("MatMul", ["g", w("fc", (32, 10))], ["m"]))
    nodes.append(node("Add", ["m", w("fcb", (10,))], ["logits"]))
    g = helper.make_graph(nodes, "tf2onnx",
                          [helper.make_tensor_value_info("input_1", T.FLOAT, [1, size, size, 3])],
                          [helper.make_tensor_value_info("logits", T.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                             producer_name="tf2onnx")


def test_an_nhwc_input_streams_by_image_rows():
    """A Keras model's NHWC image (input_1, then Transpose to NCHW) is stored with its last
    axis as rows, which is the NCHW image position by position: no Transpose layer is left,
    the first convolution's first column block reads only the image's first blocks (the
    server can start while the rest is on the way), and outputs equal onnxruntime's, on the
    device alone and with the first input's tiles exchanged. An input read by anything else
    besides such a Transpose keeps axis 1 as channels."""
    import onnxruntime as ort

    model = _tf_style_cnn()
    x = np.random.default_rng(2).standard_normal((1, 48, 48, 3)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"input_1": x})[0]
    tg = coacto.compile(model, tiles_per_layer=6)
    inp = tg.graph.layers[tg.graph.inputs["input_1"]]
    assert inp.layout == "last" and [L.op for L in tg.graph.layers].count("GATHER") == 0
    conv = next(i for i, L in enumerate(tg.graph.layers) if L.op == "CONV")
    first = tg.plan.layer_tiles(conv)[0]
    off, par = tg.plan.parent_offsets, tg.plan.parents
    n_in = len(tm.input_tiles(tg))
    assert n_in >= 4 and set(par[off[first]:off[first + 1]].tolist()) < set(range(n_in // 2))
    need, free = P.input_need_flops(tg)
    assert need[:-1].sum() > 0.3 * need.sum() and free == 0  # work that does not wait for the last rows
    assert_close(coacto.Runtime(tg).run({"input_1": x}), {"logits": ref}, rel=1e-4)
    out, _ = exchange(tg, {"input_1": x}, P.plan_cloud(tg))
    assert_close(out, {"logits": ref}, rel=1e-4)
    # its shape read too (tf2onnx's Shape -> Slice -> Concat -> Reshape for a dynamic batch):
    # still stored by rows
    shaped = onnx.ModelProto()
    shaped.CopyFrom(model)
    g = shaped.graph
    g.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                          (("s0", [0]), ("s1", [1]), ("minus1", [-1]))])
    g.node.extend([helper.make_node("Shape", ["input_1"], ["shp"]),
                   helper.make_node("Slice", ["shp", "s0", "s1"], ["batch"]),
                   helper.make_node("Concat", ["batch", "minus1"], ["flat_shape"], axis=0),
                   helper.make_node("Reshape", ["logits", "flat_shape"], ["flat"])])
    g.output.append(helper.make_tensor_value_info("flat", T.FLOAT, [1, 10]))
    tg = coacto.compile(shaped, tiles_per_layer=6)
    assert tg.graph.layers[tg.graph.inputs["input_1"]].layout == "last"
    assert_close(coacto.Runtime(tg).run({"input_1": x}), {"logits": ref, "flat": ref}, rel=1e-4)
    # the same image also read as it is (scaled, an output of its own): axis 1 stays the
    # channels, and the outputs are right all the same
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.float32(2.0), "two"))
    g.node.append(helper.make_node("Mul", ["input_1", "two"], ["s"]))
    g.output.append(helper.make_tensor_value_info("s", T.FLOAT, [1, 48, 48, 3]))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    both = coacto.compile(model, tiles_per_layer=6)
    assert both.graph.layers[both.graph.inputs["input_1"]].layout == "channels"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = dict(zip(["logits", "s"], sess.run(None, {"input_1": x})))
    assert_close(coacto.Runtime(both).run({"input_1": x}), refs, rel=1e-4)


def test_shares_of_a_tf2onnx_style_cnn_match_onnxruntime():
    """A model shaped as tf2onnx writes a Keras CNN (not by our zoo): every layer that can end a
    device share, at one block and at all but one, and dynamic's plan where a share is
    predicted best, give onnxruntime's outputs through the tile exchange."""
    import onnxruntime as ort

    model = _tf_style_cnn()
    feeds = {"input_1": np.random.default_rng(1).standard_normal((1, 48, 48, 3)).astype(np.float32)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = {"logits": sess.run(["logits"], feeds)[0]}
    tg = coacto.compile(model, tiles_per_layer=5, min_column_blocks=4)
    table = P.share_table(tg)
    layers = sorted(set(table.layer.tolist()))
    assert len(layers) >= 3
    for k in layers:
        n = len(tg.plan.col_bounds[k]) - 1
        for m in sorted({1, n - 1}):
            plan = P.plan_share(tg, k, m)
            assert P.check_plan(tg, plan) == [], (k, m)
            out, stats = exchange(tg, feeds, plan)
            assert_close(out, ref, rel=1e-4)
            assert stats["tiles_computed"] <= int(plan.local.sum())
    opts = P.dynamic_options(tg, 1e8, 1e11, 1e6, 1e-3)
    plan = P.make_plan("dynamic", tg, device_flops=1e8, server_flops=1e11, bandwidth=1e6,
                       rtt=1e-3, correct=lambda v, k: v * 0.5 if k == "share" else v)
    assert plan.info["kind"] == "share" and "share" in opts
    out, _ = exchange(tg, feeds, plan)
    assert_close(out, ref, rel=1e-4)


@pytest.mark.parametrize("blocks", ["one", "all-but-one"])
def test_share_plans_match_onnxruntime(model, blocks):
    tg, feeds, ref = model
    table = P.share_table(tg)
    k = int(table.layer[len(table) // 2])
    n = len(tg.plan.col_bounds[k]) - 1
    plan = P.plan_share(tg, k, 1 if blocks == "one" else n - 1)
    out, stats = exchange(tg, feeds, plan)
    assert_close(out, ref, rel=1e-4)
    assert stats["tiles_computed"] <= int(plan.local.sum())


# ------------------------------------------------------------------------------ outputs

@pytest.mark.parametrize("policy", P.POLICIES + ("split-mid", "fl-half"))
def test_every_policy_matches_onnxruntime(model, policy):
    tg, feeds, ref = model
    cuts = tm.valid_cuts(tg)
    if policy == "split-mid":
        plan = P.plan_split(tg, 5e9, 20e9, 2e6, 0.002, layer=cuts[len(cuts) // 2])
    elif policy == "fl-half":
        plan = P.plan_fl(tg, 5e9, 5e9)
    else:
        plan = P.make_plan(policy, tg, device_flops=5e9, server_flops=20e9, bandwidth=2e6,
                           rtt=0.002)
    out, stats = exchange(tg, feeds, plan)
    assert_close(out, ref, rel=1e-4)
    if plan.policy == "cloud":
        assert stats["tiles_computed"] == 0
    if plan.uses_server and plan.local is not None:
        assert stats["tiles_computed"] <= int(plan.local.sum())
