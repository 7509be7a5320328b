"""Offloading policies: per-tile plans (which tiles the device computes, which it sends).

A plan is two masks over the tile graph's tiles, the ones ``NativeInference.set_plan`` takes:
``local[t] = 1`` lets the device compute tile t (0 parks it until it arrives from the server, or
until a fallback computes everything), ``send[t]`` is SEND_NEVER / SEND_ALWAYS / SEND_DECIDE (the
ECT rule in the runtime). The server computes whatever it can from what it receives and returns the
exit tiles; every policy therefore gives the same outputs, only who computes what differs.

* ``local``    the device alone; no server.
* ``cloud``    send the inputs, the server computes everything.
* ``split``    Neurosurgeon / SPINN: compute layers up to a cut here, send the tensors live
               there, the server computes the rest; sequential, at the cut predicted fastest
               (split_costs: the cost model docs/SCHEDULER.md describes).
* ``fl``       fused-layer offloading (DeepThings): the first K layers form a fused stack split
               spatially (by columns) into a device part and a server part sized by the two
               speeds; the device computes its part (halos included, recomputed), sends its part
               of layer K; the server computes its part from the inputs and all layers after K.
* ``dynamic``  CoActo's plan (the inputs first, then every tile the ECT rule sends), a cut
               (sent whole, as split sends it, the rest kept as insurance) or a device share,
               whichever is predicted fastest (docs/SCHEDULER.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CoactoError
from ..inference import SEND_ALWAYS, SEND_DECIDE, SEND_NEVER
from ..partition import (
    cut_byte_array, cut_flops, cut_needs, cut_tiles, flops_per_layer, input_tiles, layer_tiles,
    output_bytes, single_tensor_cuts, valid_cuts,
)
from ..tilegraph import TileGraph

POLICIES = ("local", "cloud", "split", "fl", "dynamic")

#: The fused stack of `fl` ends at the first single-tensor cut after this share of the FLOPs.
FL_STACK_FLOPS_SHARE = 1 / 3
#: Dynamic takes a later cut (or a share) instead of sending the inputs only when the cost
#: model predicts it at least this much faster (why: docs/SCHEDULER.md, "A cut must win clearly").
CUT_MIN_GAIN = 0.05
#: Dynamic runs a kind of plan it has not run yet (its prediction error unknown) once when the
#: model puts it within this factor of the best kind's corrected prediction.
EXPLORE_WITHIN = 1.25


class PolicyError(CoactoError, ValueError):
    """An unknown policy or impossible policy parameters."""


@dataclass
class Plan:
    """Masks for NativeInference.set_plan (None: the runtime's default) and what they mean."""

    policy: str
    local: np.ndarray | None
    send: np.ndarray | None
    uses_server: bool
    split_layer: int | None = None
    info: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ policies

def plan_local(tg: TileGraph) -> Plan:
    return Plan("local", None, None, uses_server=False, split_layer=tg.n_layers - 1)


def plan_cloud(tg: TileGraph) -> Plan:
    """Cloud-only offloading as deployed today: the whole input in one message, then the server
    infers (``send_whole``: no tile-level overlap of transmission and server computation — that
    overlap is what ``dynamic`` adds)."""
    ids = input_tiles(tg)
    return Plan("cloud", tg.plan.mask(ids), tg.plan.mask(ids, SEND_ALWAYS), uses_server=True,
                info={"send_whole": True})


def dynamic_options(tg: TileGraph, device_flops: float, server_flops: float, bandwidth: float,
                    rtt: float, alpha: float = 1.0, downlink: float | None = None,
                    wire=None) -> dict[str, tuple[float, object]]:
    """What dynamic may do, each with its predicted latency (s) and where it cuts:
    ``local`` (None), ``inputs`` (the input layer: CoActo's plan), ``cut`` (the best later cut,
    sent whole; absent when the graph has none) and ``share`` ((layer, device blocks): the best
    device share of a fused stack; absent when the graph has none)."""
    cuts, costs = split_cost_array(tg, device_flops, server_flops, bandwidth, rtt, alpha,
                                   downlink, wire)
    out: dict[str, tuple[float, object]] = {"local": (cut_flops(tg)[3] / device_flops, None)}
    at_inputs = max(tg.graph.inputs.values())
    if len(cuts) and cuts[0] == at_inputs:
        out["inputs"] = (inputs_cost(tg, server_flops, bandwidth, rtt, alpha, downlink, wire),
                         at_inputs)
    later = (cuts != tg.n_layers - 1) & (cuts > at_inputs)  # (valid cuts start at the last input)
    if later.any():
        # the cheapest; among equals the latest (more computed here)
        i = int(np.flatnonzero(later)[np.lexsort((-cuts[later], costs[later]))[0]])
        out["cut"] = (float(costs[i]), int(cuts[i]))
    table, shares = share_costs(tg, device_flops, server_flops, bandwidth, rtt, alpha, downlink,
                                wire)
    if len(shares):  # the best device share
        i = int(np.argmin(shares))
        out["share"] = (float(shares[i]), (int(table.layer[i]), int(table.blocks[i])))
    return out


def choose_dynamic(options: dict[str, tuple[float, object]], correct=None,
                   unseen=(), explore=None) -> str:
    """The kind of offloaded plan dynamic takes from ``options`` (dynamic_options; ``local``
    is the engine's gate's business, decided before): the lowest predicted latency after
    ``correct(predicted_s, kind)`` (what each kind of plan has been off by on this device and
    link; None: as predicted), where a later cut or a share must beat the inputs by
    CUT_MIN_GAIN. A kind in ``unseen`` (never run, so its error is not known) predicted within
    EXPLORE_WITHIN of the best is taken instead, once. ``explore`` (kinds, the stalest first:
    an inference the gate would have kept on the device offloads to refresh what the device
    knows): the first of them predicted, as the model stands, within EXPLORE_WITHIN of the
    best. Why explore at all: docs/SCHEDULER.md, "Exploration"."""
    pred = {k: (v if correct is None else correct(v, k))
            for k, (v, _w) in options.items() if k != "local"}
    if not pred:
        return "local"
    if explore:
        raw = min(options[k][0] for k in pred)
        for k in explore:
            if k in pred and options[k][0] <= EXPLORE_WITHIN * raw:
                return k
    best = min(pred, key=lambda k: (pred[k], k != "inputs"))
    if best in ("cut", "share") and "inputs" in pred and \
            pred[best] > (1.0 - CUT_MIN_GAIN) * pred["inputs"]:
        best = "inputs"
    near = [k for k in unseen if k in pred and k != best
            and options[k][0] <= EXPLORE_WITHIN * pred[best]]
    if near:
        best = min(near, key=lambda k: options[k][0])
    return best


def plan_dynamic(tg: TileGraph, device_flops: float | None = None, server_flops: float = 1.0,
                 bandwidth: float = 1.0, rtt: float = 0.0, alpha: float = 1.0,
                 downlink: float | None = None, wire=None, correct=None,
                 unseen=(), explore=None, frontier: str | None = None) -> Plan:
    """Tile-level collaboration, in the kind of plan predicted fastest (choose_dynamic; before
    the device's speed is known, the inputs): ``inputs`` (CoActo's rule), a ``cut`` or
    a device ``share`` (plan_share), as docs/SCHEDULER.md describes them. The engine's gate has
    decided before that the inference offloads (or explores: it then runs the plan it would
    use, so that what it measures is that plan's latency). ``frontier``: run this plan instead
    of the one predicted fastest, as stats' ``frontier`` names it (``inputs``, ``cut LAYER`` or
    ``share LAYER M/N``; parse_frontier): a recorded inference replayed, e.g. by the simulator
    against the real run that recorded it."""
    forced = None if frontier is None else parse_frontier(tg, frontier)
    inputs = input_tiles(tg)
    send = np.full(tg.n_tiles, SEND_DECIDE, dtype=np.uint8)
    send[inputs] = SEND_ALWAYS
    outputs = [t for li in set(tg.graph.outputs.values()) for t in tg.plan.layer_tiles(li)]
    send[outputs] = SEND_NEVER  # the device has its own exit tiles: sending them back helps no one
    if not (device_flops and device_flops > 0 and bandwidth > 0 and server_flops > 0) \
            and (forced is None or forced[0] == "inputs"):
        return Plan("dynamic", None, send, uses_server=True, info={"kind": "inputs"})
    options = dynamic_options(tg, device_flops, server_flops, bandwidth, rtt, alpha, downlink,
                              wire) if device_flops and device_flops > 0 else {}
    if forced is None:
        kind = choose_dynamic(options, correct, unseen, explore)
        predicted, where = options[kind]
    else:
        kind, where = forced
        if where is None:  # the inputs plan's own cut
            if kind not in options:
                return Plan("dynamic", None, send, uses_server=True, info={"kind": "inputs"})
            where = options[kind][1]
        predicted = _forced_cost(tg, kind, where, options, device_flops, server_flops,
                                 bandwidth, rtt, alpha, downlink, wire)
    info: dict = {"predicted_s": predicted, "kind": kind}
    if kind == "share":
        return plan_share(tg, where[0], where[1], info)
    if kind == "cut":
        # The device computes what the cut needs and sends it in one message, as split does and
        # as split's model prices it; the rest waits as insurance (the engine's _park_rest;
        # docs/SCHEDULER.md, "Measurements behind the constants", "A cut goes whole").
        info.update(cut_name=tg.graph.layers[where].name, park_rest=True, send_whole=True)
        send[:] = SEND_NEVER
        send[cut_tiles(tg, where)] = SEND_ALWAYS
        return Plan("dynamic", cut_needs(tg, where), send, uses_server=True, split_layer=where,
                    info=info)
    if kind == "inputs":
        # The inputs get the device's CPU first (where the CPU is the bottleneck, computing would
        # slow their transmission): the engine unparks local work once the last is on the wire.
        info.update(cut_name=tg.graph.layers[where].name, local_after_inputs=True)
        return Plan("dynamic", tg.plan.mask(inputs), send, uses_server=True, info=info)
    # a graph with no cut at all (an output before the last input): CoActo's rule
    return Plan("dynamic", None, send, uses_server=True, info=info)


def _forced_cost(tg, kind, where, options, device_flops, server_flops, bandwidth, rtt, alpha,
                 downlink, wire) -> float:
    """The cost model's prediction for a plan forced by name (plan_dynamic's ``frontier``),
    which need not be the best of its kind: the engine times its insurance from it
    (_park_rest), and a missing one (NaN) once left a replayed cut's device work parked on a
    timer set to NaN. NaN only where the model has no such plan."""
    if kind in options and options[kind][1] == where:
        return float(options[kind][0])
    if not (device_flops and device_flops > 0):  # nothing to price it with yet
        return float("nan")
    if kind == "cut":
        cuts, costs = split_cost_array(tg, device_flops, server_flops, bandwidth, rtt, alpha,
                                       downlink, wire)
        hit = np.flatnonzero(cuts == where)
        return float(costs[hit[0]]) if len(hit) else float("nan")
    if kind == "share":
        table, shares = share_costs(tg, device_flops, server_flops, bandwidth, rtt, alpha,
                                    downlink, wire)
        hit = np.flatnonzero((table.layer == where[0]) & (table.blocks == where[1]))
        return float(shares[hit[0]]) if len(hit) else float("nan")
    return float("nan")


# ------------------------------------------------------------------------------ streamed inputs

def input_need_flops(tg: TileGraph) -> tuple[np.ndarray, float]:
    """(need, free): need[q] the FLOPs of the tiles that need the input tiles up to the q-th
    sent (input tiles leave in tile order, shallowest first: an image's top rows first, the
    inputs in layer order) and no later one (float64 [inputs]); free the FLOPs of the tiles
    that read no input at all. Built once per plan from each tile's latest input ancestor."""
    def make():
        plan = tg.plan
        inp = input_tiles(tg)
        last = np.full(tg.n_tiles, -1, dtype=np.int64)
        last[inp] = np.arange(len(inp))
        off, par, first = plan.parent_offsets, plan.parents, plan.layer_first_tile
        for li in range(tg.n_layers):  # tiles of a layer read earlier layers only
            lo, hi = int(first[li]), int(first[li + 1])
            a, b = int(off[lo]), int(off[hi])
            if a == b:
                continue
            has = np.flatnonzero(np.diff(off[lo:hi + 1]))
            got = np.maximum.reduceat(last[par[a:b]], off[lo:hi][has] - a)
            last[lo + has] = np.maximum(last[lo + has], got)
        rest = np.ones(tg.n_tiles, dtype=bool)
        rest[inp] = False
        flops = plan.tile_flops.astype(np.float64)
        free = float(flops[rest & (last < 0)].sum())  # tiles that read no input (constants')
        rest &= last >= 0
        return np.bincount(last[rest], weights=flops[rest], minlength=len(inp)), free
    return tg.plan.memoised("input_need_flops", make)


def inputs_cost(tg: TileGraph, server_flops: float, bandwidth: float, rtt: float,
                alpha: float = 1.0, downlink: float | None = None, wire=None) -> float:
    """Predicted latency (s) of the inputs plan: its input tiles streamed at ``bandwidth``,
    the server computing each tile once the inputs it reads are there (one resource: what is
    left after the q-th input tile arrives is the work that needs it or a later one), then the
    exit tiles back. Split's model (split_costs) adds the whole transfer and the whole server
    work instead, which the inputs plan overlaps: 40% of ResNet-50's FLOPs can run before the
    last of its image's 16 tiles arrives (docs/SCHEDULER.md, "The inputs plan streams")."""
    inp = input_tiles(tg)
    w = np.ones(tg.n_layers) if wire is None else np.asarray(wire, dtype=np.float64)
    sent = tg.plan.tile_bytes[inp].astype(np.float64) * w[tg.plan.tile_layer[inp]]
    arrive = 0.5 * rtt + np.cumsum(sent) / bandwidth
    need, free = input_need_flops(tg)
    left = np.cumsum(need[::-1])[::-1]  # the work that needs input q or a later one
    back = output_bytes(tg) / (downlink or bandwidth)
    done = max(float(np.max(arrive + alpha * left / server_flops)),
               alpha * (float(left[0]) + free) / server_flops)  # (what reads no input: at once)
    return done + back + 0.5 * rtt


# ------------------------------------------------------------------------------ device shares

#: A share plan splits the fused stack's last layer into at most this many column blocks (the
#: blocks each tile serves are the bits of a 64-bit word).
SHARE_MAX_BLOCKS = 64


@dataclass
class ShareTable:
    """Every device share of every fused stack a graph offers, with what each costs: candidate
    i gives the device the last ``blocks[i]`` column blocks of layer ``layer[i]`` (of
    ``n_blocks[i]``) and the ancestors of those tiles, the server the rest of that layer from
    the inputs its own blocks need, and everything after it."""

    layer: np.ndarray          # the stack's last layer (a single-tensor cut)
    blocks: np.ndarray         # column blocks the device takes (the last ones)
    n_blocks: np.ndarray
    device_flops: np.ndarray   # FLOPs of the device's part of the stack (its halo included)
    server_flops: np.ndarray   # FLOPs of the server's part of the stack (its halo included)
    rest_flops: np.ndarray     # FLOPs after the stack (the server's alone)
    server_inputs: np.ndarray  # [candidate, input layer]: raw bytes of the inputs the server needs
    input_layers: np.ndarray   # the input layers, in server_inputs' column order
    device_out: np.ndarray     # raw bytes of the device's blocks of the stack's last layer
    serves: dict               # layer -> per tile, the bits of the column blocks it serves

    def __len__(self) -> int:
        return len(self.layer)


def _serves(tg: TileGraph, k: int) -> np.ndarray:
    """Per tile, bit b set when it is (an ancestor of) a tile in column block b of layer k."""
    plan = tg.plan
    first = plan.layer_first_tile
    bits = np.zeros(tg.n_tiles, dtype=np.uint64)
    for b in range(len(plan.col_bounds[k]) - 1):
        bits[plan.block_tiles(k, b, b + 1)] = np.uint64(1) << np.uint64(b)
    off, par = plan.parent_offsets, plan.parents
    counts = np.diff(off)
    for li in range(k, -1, -1):
        lo, hi = int(first[li]), int(first[li + 1])
        a, b = int(off[lo]), int(off[hi])
        if a == b or not bits[lo:hi].any():
            continue
        child = np.repeat(np.arange(lo, hi), counts[lo:hi])
        np.bitwise_or.at(bits, par[a:b], bits[child])
    return bits


def _share_parts(bits: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(device part, server part) as bool masks over ``bits`` (_serves of a layer with ``n``
    column blocks) when the device takes the last ``m`` blocks."""
    server_bits = (1 << (n - m)) - 1
    device_bits = ((1 << n) - 1) ^ server_bits
    return (bits & np.uint64(device_bits)) != 0, (bits & np.uint64(server_bits)) != 0


def share_table(tg: TileGraph) -> ShareTable:
    """The graph's ShareTable (built once per plan: a few milliseconds per stack)."""
    return tg.plan.memoised("share_table", lambda: _share_table(tg))


def _share_table(tg: TileGraph) -> ShareTable:
    plan = tg.plan
    first = plan.layer_first_tile
    flops = plan.tile_flops.astype(np.float64)
    raw = plan.tile_bytes.astype(np.float64)
    cum = np.cumsum(flops_per_layer(tg))
    in_layers = np.asarray(sorted(tg.graph.inputs.values()), dtype=np.int64)
    layer_of = plan.tile_layer
    rows: list[tuple] = []
    serves: dict = {}
    for k in single_tensor_cuts(tg):
        n = len(plan.col_bounds[k]) - 1
        if k in tg.graph.inputs.values() or k >= tg.n_layers - 1 or not 2 <= n <= SHARE_MAX_BLOCKS:
            continue
        bits = serves[k] = _serves(tg, k)
        n_rows = len(plan.row_bounds[k]) - 1
        k_raw = raw[first[k]:first[k + 1]].reshape(n, n_rows).sum(axis=1)
        stack = np.arange(int(first[k + 1]))
        for m in range(1, n):
            dev, srv = _share_parts(bits[stack], n, m)
            srv_in = [float(raw[stack[srv & (layer_of[stack] == li)]].sum()) for li in in_layers]
            rows.append((k, m, n, float(flops[stack[dev]].sum()), float(flops[stack[srv]].sum()),
                         float(cum[-1]) - float(cum[k]), srv_in, float(k_raw[n - m:].sum())))
    cols = list(zip(*rows)) if rows else [[]] * 8
    return ShareTable(
        layer=np.asarray(cols[0], dtype=np.int64), blocks=np.asarray(cols[1], dtype=np.int64),
        n_blocks=np.asarray(cols[2], dtype=np.int64), device_flops=np.asarray(cols[3], float),
        server_flops=np.asarray(cols[4], float), rest_flops=np.asarray(cols[5], float),
        server_inputs=np.asarray(cols[6], float).reshape(len(rows), len(in_layers)),
        input_layers=in_layers, device_out=np.asarray(cols[7], float), serves=serves)


def share_costs(tg: TileGraph, device_flops: float, server_flops: float, bandwidth: float,
                rtt: float, alpha: float = 1.0, downlink: float | None = None,
                wire=None) -> tuple[ShareTable, np.ndarray]:
    """Predicted latency (s) of every device share (share_table), by the model split_costs
    uses, as docs/SCHEDULER.md ("A share is priced by the same model") describes it."""
    table = share_table(tg)
    if not len(table):
        return table, np.zeros(0)
    w = np.ones(tg.n_layers) if wire is None else np.asarray(wire, dtype=np.float64)
    srv_in = table.server_inputs @ w[table.input_layers] / bandwidth
    dev_out = table.device_out * w[table.layer] / bandwidth
    server_part = srv_in + 0.5 * rtt + alpha * table.server_flops / server_flops
    device_part = np.maximum(table.device_flops / device_flops, srv_in) + dev_out + 0.5 * rtt
    back = output_bytes(tg) / (downlink or bandwidth)
    costs = (np.maximum(server_part, device_part) + alpha * table.rest_flops / server_flops
             + back + 0.5 * rtt)
    return table, costs


def plan_share(tg: TileGraph, layer: int, blocks: int, info: dict | None = None) -> Plan:
    """The device computes the last ``blocks`` column blocks of ``layer`` (a single-tensor cut)
    and their ancestors and streams those blocks; the server receives the inputs the other
    blocks need, computes them and everything after ``layer``. Whatever the device does not
    compute waits (local 0) for compute_all: the engine's insurance if the server is late."""
    table = share_table(tg)
    if layer not in table.serves:
        raise PolicyError(f"layer {layer} cannot end a device share (valid: "
                          f"{sorted(table.serves)[:20]})")
    n = len(tg.plan.col_bounds[layer]) - 1
    if not 1 <= blocks < n:
        raise PolicyError(f"a device share of layer {layer} takes 1 to {n - 1} blocks, "
                          f"got {blocks}")
    dev, srv = _share_parts(table.serves[layer], n, blocks)
    inp = input_tiles(tg)
    local = dev.astype(np.uint8)
    local[inp] = 1
    send = np.zeros(tg.n_tiles, dtype=np.uint8)
    send[inp[srv[inp]]] = SEND_ALWAYS
    send[tg.plan.block_tiles(layer, n - blocks, n)] = SEND_ALWAYS
    info = dict(info or {}, share_layer=layer, share_name=tg.graph.layers[layer].name,
                device_blocks=blocks, blocks=n, park_rest=True)
    return Plan("dynamic", local, send, uses_server=True, info=info)


def split_cost_array(tg: TileGraph, device_flops: float, server_flops: float,
                     bandwidth: float, rtt: float, alpha: float = 1.0,
                     downlink: float | None = None, wire=None) -> tuple[np.ndarray, np.ndarray]:
    """(valid cuts, predicted latency of each): split_costs as arrays (the last layer, when a
    valid cut, is the device alone)."""
    cuts, before, after, total = cut_flops(tg)
    sent = cut_byte_array(tg, wire)
    back = output_bytes(tg) / (downlink or bandwidth)
    costs = before / device_flops + sent / bandwidth + rtt + alpha * after / server_flops + back
    if len(cuts) and cuts[-1] == tg.n_layers - 1:
        costs[-1] = total / device_flops
    return cuts, costs


def split_costs(tg: TileGraph, device_flops: float, server_flops: float, bandwidth: float,
                rtt: float, alpha: float = 1.0, downlink: float | None = None,
                wire=None) -> dict[int, float]:
    """Predicted latency (s) of cutting after each valid layer; the last layer means all local.
    An offloaded cut pays its tensors up at ``bandwidth`` (at the per-layer wire ratios
    ``wire``: what the transfer encoding makes of them) and the exit tiles back at ``downlink``
    (default: the same)."""
    cuts, arr = split_cost_array(tg, device_flops, server_flops, bandwidth, rtt, alpha,
                                 downlink, wire)
    costs = dict(zip(cuts.tolist(), arr.tolist()))
    costs.setdefault(tg.n_layers - 1, cut_flops(tg)[3] / device_flops)
    return costs


def plan_split(tg: TileGraph, device_flops: float, server_flops: float, bandwidth: float,
               rtt: float, alpha: float = 1.0, layer: int | None = None,
               downlink: float | None = None, wire=None) -> Plan:
    """Cut at ``layer`` (a valid cut) or at the cut with the lowest predicted latency."""
    for name, v in (("device_flops", device_flops), ("server_flops", server_flops),
                    ("bandwidth", bandwidth)):
        if not (v and v > 0):
            raise PolicyError(f"split needs a positive {name}, got {v!r}")
    cuts = valid_cuts(tg)
    costs = split_costs(tg, device_flops, server_flops, bandwidth, rtt, alpha, downlink, wire)
    last = tg.n_layers - 1
    if layer is None:
        layer = min(costs, key=lambda c: (costs[c], -c))  # ties: compute more here
    elif layer not in costs:
        raise PolicyError(f"layer {layer} is not a valid split point of this model (valid: "
                          f"{cuts[:20]}{' ...' if len(cuts) > 20 else ''})")
    # Sequential, as Neurosurgeon / SPINN: the cut's whole tensor in one message once computed.
    info = {"predicted_s": costs[layer], "predicted_local_s": costs[last],
            "split_name": tg.graph.layers[layer].name, "send_whole": True}
    if layer == last:
        return Plan("split", None, None, uses_server=False, split_layer=layer, info=info)
    first = tg.plan.layer_first_tile
    local = np.zeros(tg.n_tiles, dtype=np.uint8)
    local[:first[layer + 1]] = 1
    send = np.zeros(tg.n_tiles, dtype=np.uint8)
    send[cut_tiles(tg, layer)] = SEND_ALWAYS
    return Plan("split", local, send, uses_server=True, split_layer=layer, info=info)


def fl_stack_layer(tg: TileGraph, share: float = FL_STACK_FLOPS_SHARE) -> int | None:
    """The last layer of the fused stack: the first single-tensor cut after ``share`` of the
    FLOPs whose output has at least two column blocks (else the latest such cut before it); None
    if none."""
    cum = np.cumsum(flops_per_layer(tg))
    inputs = set(tg.graph.inputs.values())
    splittable = [c for c in single_tensor_cuts(tg) if c not in inputs and c < tg.n_layers - 1
                  and len(tg.plan.col_bounds[c]) - 1 >= 2]
    if not splittable:
        return None
    after = [c for c in splittable if cum[c] >= share * float(cum[-1])]
    return after[0] if after else splittable[-1]


def plan_fl(tg: TileGraph, device_flops: float, server_flops: float, alpha: float = 1.0,
            layer: int | None = None, device_share: float | None = None) -> Plan:
    """Fused-layer offloading over layers 0..``layer`` with the device taking ``device_share`` of
    the stack's columns (default: its share of the combined speed)."""
    if layer is None:
        layer = fl_stack_layer(tg)
        if layer is None:  # nothing to fuse: a chain of tiny layers; split does the same job
            plan = plan_split(tg, device_flops, server_flops, 1e12, 0.0, alpha)
            plan.policy = "fl"
            plan.info["fl_degenerate"] = True
            return plan
    elif layer not in single_tensor_cuts(tg):
        raise PolicyError(f"layer {layer} cannot end a fused stack: later layers read layers "
                          "before it (choose a cut after which one tensor is live)")
    if device_share is None:
        speed_srv = server_flops / max(alpha, 1.0)
        device_share = device_flops / (device_flops + speed_srv)
    if not (0.0 <= device_share <= 1.0):
        raise PolicyError(f"device_share must lie in [0, 1], got {device_share!r}")
    plan_ = tg.plan
    n_blocks = len(plan_.col_bounds[layer]) - 1
    m = int(round(device_share * n_blocks))
    dev_k = plan_.block_tiles(layer, 0, m)
    inp = input_tiles(tg)
    dev_mask = plan_.ancestors(plan_.mask(dev_k))
    srv_mask = plan_.ancestors(plan_.mask(plan_.block_tiles(layer, m, n_blocks)))
    local = dev_mask.astype(np.uint8)
    local[inp] = 1
    send = np.zeros(tg.n_tiles, dtype=np.uint8)
    send[inp[srv_mask[inp]]] = SEND_ALWAYS
    send[dev_k] = SEND_ALWAYS
    halo = dev_mask & srv_mask
    halo[inp] = False
    info = {"fl_layer": layer, "fl_name": tg.graph.layers[layer].name, "device_blocks": m,
            "blocks": n_blocks, "device_share": device_share, "halo_tiles": int(halo.sum())}
    return Plan("fl", local, send, uses_server=True, split_layer=layer, info=info)


def rest_comes_last(plan: Plan | None) -> bool:
    """Whether the device's own tiles of ``plan`` are what the server waits for (a device share,
    a cut), so that its parked rest, once started, runs only when none of them is ready
    (NativeInference.compute_all's rest_last)."""
    info = plan.info if plan is not None else {}
    return "share_layer" in info or bool(info.get("park_rest"))


def frontier(plan: Plan) -> str:
    """Which dynamic plan this is, in words (stats' ``frontier``): ``device``, ``inputs``,
    ``cut LAYER`` or ``share LAYER M/N`` (the device's M of N column blocks of LAYER)."""
    if not plan.uses_server:
        return "device"
    if "share_layer" in plan.info:
        return f"share {plan.info['share_name']} {plan.info['device_blocks']}/{plan.info['blocks']}"
    if plan.split_layer is not None:
        return f"cut {plan.info.get('cut_name', plan.split_layer)}"
    return "inputs"


def parse_frontier(tg: TileGraph, text: str) -> tuple[str, object]:
    """(kind, where) of a dynamic plan named as frontier() names it: ("inputs", None),
    ("cut", layer) or ("share", (layer, device blocks)). ``device`` is no dynamic plan (the
    engine's gate kept the inference local) and is refused like any other text."""
    if not isinstance(text, str):
        raise PolicyError(f"a frontier is text such as 'inputs' or 'cut LAYER', got {text!r}")
    kind, _, rest = text.strip().partition(" ")
    if kind == "inputs" and not rest:
        return "inputs", None
    names = {layer.name: i for i, layer in enumerate(tg.graph.layers)}
    if kind == "cut" and rest:
        layer = names.get(rest, int(rest) if rest.isdigit() else None)
        if layer is None or layer not in valid_cuts(tg):
            raise PolicyError(f"frontier {text!r}: {rest!r} is not a layer this graph can be "
                              f"cut after")
        return "cut", layer
    if kind == "share" and rest:
        name, _, share = rest.rpartition(" ")
        m, _, n = share.partition("/")
        if name not in names or not (m.isdigit() and n.isdigit()):
            raise PolicyError(f"frontier {text!r}: expected 'share LAYER M/N' with a layer of "
                              f"this graph")
        return "share", (names[name], int(m))
    raise PolicyError(f"frontier {text!r}: expected 'inputs', 'cut LAYER' or 'share LAYER M/N' "
                      f"(a plan that offloads; 'device' runs the local policy)")


def prepare(tg: TileGraph) -> None:
    """Builds the per-graph tables the planners cache (cuts, their bytes, the device shares):
    a few ms for the zoo's CNNs, spent once where it does not delay an inference."""
    cut_flops(tg)
    cut_byte_array(tg)
    input_need_flops(tg)
    share_table(tg)
    output_bytes(tg)


def make_plan(policy: str, tg: TileGraph, *, device_flops: float | None = None,
              server_flops: float = 1.0, bandwidth: float = 1.0, rtt: float = 0.0,
              alpha: float = 1.0, split_layer: int | None = None, fl_layer: int | None = None,
              device_share: float | None = None, downlink: float | None = None,
              wire=None, correct=None, unseen=(), explore=None,
              frontier: str | None = None) -> Plan:
    if policy == "local":
        return plan_local(tg)
    if policy == "cloud":
        return plan_cloud(tg)
    if policy == "dynamic":
        return plan_dynamic(tg, device_flops, server_flops, bandwidth, rtt, alpha, downlink, wire,
                            correct, unseen, explore, frontier)
    if policy == "split":
        return plan_split(tg, device_flops, server_flops, bandwidth, rtt, alpha, split_layer,
                          downlink, wire)
    if policy == "fl":
        return plan_fl(tg, device_flops, server_flops, alpha, fl_layer, device_share)
    raise PolicyError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


def check_plan(tg: TileGraph, plan: Plan) -> list[str]:
    """Problems that would keep an inference with this plan from finishing (empty: well-formed):
    every tile must be computable here or reachable by the server, which holds only what is sent
    and what it computes from that."""
    n = tg.n_tiles
    problems = []
    local = np.ones(n, bool) if plan.local is None else np.asarray(plan.local) != 0
    send = np.zeros(n, np.uint8) if plan.send is None else np.asarray(plan.send)
    if local.shape != (n,) or send.shape != (n,):
        return [f"masks must have {n} entries"]
    if plan.send is not None and send.max(initial=0) > SEND_DECIDE:
        problems.append("send mask holds values other than NEVER / ALWAYS / DECIDE")
    inp = input_tiles(tg)
    if not local[inp].all():
        problems.append("input tiles must be local (set_inputs completes them)")
    off, par = tg.plan.parent_offsets, tg.plan.parents
    dev = np.zeros(n, bool)   # completed on the device without the server
    dev[inp] = True
    srv = np.zeros(n, bool)   # available on the server (received or computed there)
    for t in range(n):
        ps = par[off[t]:off[t + 1]]
        dev[t] = dev[t] or (bool(local[t]) and bool(dev[ps].all()))
        sent = dev[t] and send[t] == SEND_ALWAYS
        srv[t] = sent or (len(ps) > 0 and bool(srv[ps].all()))
    outs = np.concatenate([np.asarray(layer_tiles(tg, li)) for li in tg.graph.outputs.values()])
    if not plan.uses_server:
        if not dev[outs].all():
            problems.append("a plan without the server must compute every output tile here")
        return problems
    missing = outs[~(dev[outs] | srv[outs])]
    if len(missing):
        problems.append(f"{len(missing)} output tiles are computed by neither side "
                        f"(first: {missing[:5].tolist()})")
    return problems
