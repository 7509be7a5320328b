"""The simulated server: N computing threads shared by every tenant, as coacto/server/tenants.py
runs them on one native runtime.

An inference exists from its BEGIN; tiles that arrive complete it from outside and the threads
compute whatever becomes ready (all tenants' ready tiles share one pool, shallowest first, first
come first served, see cores.py); output tiles go back in a RESULT as soon as they complete (those
the device sent itself are not returned); DONE when every output was sent; CANCEL frees the
inference (its running tiles finish). Every TILES batch is acknowledged with the server's clock.
Contention is the server's own alpha: the same LoadAverage and ``alpha`` function as
coacto.server.sessions, over the inferences whose inputs have all arrived, sent in STATS.

With costs (coacto.sim.profiles.ServerCosts, `coacto profile --engine`) the I/O thread takes
messages in one at a time (BEGIN, TILES with put_tiles and the ACK, HEARTBEAT with its STATS,
CANCEL: per message and byte) and spends the RESULT's and DONE's cost before they leave, on the
server's CPU (coacto.sim.cpu) with priority over the computing threads; without, it is free and
instantaneous. The server measures the model's FLOP rate as sessions.FlopEstimate did before it
counted its threads' busy time (FLOPs over the time from the last input to the last RESULT, of
inferences it computed alone and whole): ``measured_flops``, reported; the simulated devices
plan with the rate they were given.

Not modelled: model upload, limits (inferences per device, devices).
"""
from __future__ import annotations

import numpy as np

from .. import protocol as P
from ..server.sessions import LoadAverage, alpha
from ..server.tenants import SHARED_WINDOW_S
from .cores import Cores, TileState
from .graph import SimGraph
from .link import Msg

#: msgpack sizes of the server's small messages (headers only)
_HEADER_BYTES = {kind: len(P.pack(h)[0]) for kind, h in {
    P.ACK: {"t": P.ACK, "inf": 1, "batch": 1, "bytes": 100000, "t_send": 1.0, "t_server": 1.0,
            "accepted": 10, "duplicates": 0},
    P.RESULT: {"t": P.RESULT, "inf": 1, "ts": 1.0},
    P.DONE: {"t": P.DONE, "inf": 1, "seconds": 1.0, "compute_s": 1.0, "tiles_computed": 100,
             "tiles_external": 10, "duplicates": 0},
    P.STATS: {"t": P.STATS, "t_send": 1.0, "t_server": 1.0, "alpha": 1.0, "inferences": 1,
              "devices": 1, "threads": 64, "server_flops": 1e12, "computing": 1, "others": 1},
    P.ERROR: {"t": P.ERROR, "code": P.E_UNKNOWN_INFERENCE, "inf": 1, "batch": 1,
              "text": "inference 1 has finished or was cancelled"},
}.items()}


class Served:
    """One device's inference on the server (ServedInference)."""

    __slots__ = ("device", "inf", "ts", "sent", "n_sent", "inputs_seen", "n_inputs_seen",
                 "t_begin", "t_inputs", "computing", "pending_results", "flush_due", "contended")

    def __init__(self, device, inf: int, ts: TileState, g: SimGraph, t: float):
        self.device, self.inf, self.ts = device, inf, ts
        self.sent = np.zeros(g.n, bool)
        self.n_sent = 0
        self.inputs_seen = np.zeros(g.n, bool)
        self.n_inputs_seen = 0
        self.t_begin = t
        self.t_inputs = None
        self.computing = False
        self.pending_results: list[int] = []
        self.flush_due = False
        self.contended = False


class SimServer:
    """See the module text."""

    def __init__(self, loop, g: SimGraph, threads: int, durations, server_flops: float,
                 cpu=None, costs=None):
        self.loop = loop
        self.g = g
        self.cpu = cpu
        self.costs = costs  # coacto.sim.profiles.ServerCosts, or None: the I/O thread is free
        self.cores = Cores(loop, threads, durations, name="server", cpu=cpu)
        self.threads = int(threads)
        self.server_flops = float(server_flops)
        self.served: dict[tuple, Served] = {}
        # what coacto-server measured of the model before it counted its busy time: FLOPs over
        # the time from the last input to the last RESULT, of inferences it computed alone and whole
        self.measured_flops: float | None = None
        self.measured_samples = 0
        self.all_computing = LoadAverage(0.0)
        self.device_computing: dict[int, LoadAverage] = {}
        self.traces: dict[tuple, TileState] = {}
        self.last_begin: dict[int, float] = {}  # device index -> its last BEGIN (others)

    # ------------------------------------------------------------------ messages

    def receive(self, device, msg: Msg, t: float) -> None:
        if self.costs is None:
            self._receive(device, msg)
        else:  # the I/O thread takes messages in one after the other
            self.cpu.run(self.costs.recv(msg.kind, msg.nbytes), self._receive, device, msg)

    def _receive(self, device, msg: Msg) -> None:
        t = self.loop.now
        kind = msg.kind
        if kind == P.BEGIN:
            self._begin(device, msg.job.id, t)
        elif kind == P.TILES:
            self._tiles(device, msg, t)
        elif kind == P.CANCEL:
            si = self.served.get((device.index, msg.job.id))
            if si is not None:
                self._free(si, t)
        elif kind == P.HEARTBEAT:
            self._send(device, P.STATS, _HEADER_BYTES[P.STATS], {
                "t_send": msg.data["t_send"], "t_server": t,
                "alpha": alpha(self.all_computing, self._session(device), t),
                "server_flops": self.server_flops, "threads": self.threads,
                "others": sum(1 for d, tb in self.last_begin.items()
                              if d != device.index and t - tb <= SHARED_WINDOW_S),
                "probe": msg.data.get("probe")})

    def _session(self, device) -> LoadAverage:
        la = self.device_computing.get(device.index)
        if la is None:
            la = self.device_computing[device.index] = LoadAverage(0.0)
        return la

    def _send(self, device, kind: str, nbytes: int, data: dict) -> None:
        device.downlink.send(Msg(kind, nbytes, None, data), self.loop.now)

    def _begin(self, device, inf: int, t: float) -> None:
        key = (device.index, inf)
        if key in self.served:
            return
        self.last_begin[device.index] = t
        ts = TileState(self.cores, self.g, tag=key)
        si = Served(device, inf, ts, self.g, t)
        ts.on_output = lambda tile, now, si=si: self._output_ready(si, tile, now)
        self.served[key] = si
        self.traces[key] = ts
        if not self.g.inputs:
            self._start_computing(si, t)

    def _tiles(self, device, msg: Msg, t: float) -> None:
        data = msg.data
        si = self.served.get((device.index, data["inf"]))
        if si is None:  # finished or cancelled meanwhile: the device forgets the batch
            self._send(device, P.ERROR, _HEADER_BYTES[P.ERROR],
                       {"inf": data["inf"], "batch": data["batch"], "text": "no such inference"})
            return
        ids = data["ids"]
        g = self.g
        for tile in ids:  # output tiles the device sent: it has them, no RESULT for those
            if g.is_output_list[tile] and not si.sent[tile]:
                si.sent[tile] = True
                si.n_sent += 1
        for tile in ids:
            si.ts.put_tile(tile, t)
        new = [i for i in ids if g.is_input[i] and not si.inputs_seen[i]]
        if new and si.t_inputs is None:
            si.inputs_seen[new] = True
            si.n_inputs_seen += len(new)
            if si.n_inputs_seen == len(g.inputs):
                self._start_computing(si, t)
        self._send(device, P.ACK, _HEADER_BYTES[P.ACK], {"inf": data["inf"], "batch": data["batch"],
                                                         "t_server": t})
        self.cores.dispatch(t)
        if si.pending_results:
            self._flush(si)

    def _start_computing(self, si: Served, t: float) -> None:
        si.t_inputs = t
        computing = [o for o in self.served.values() if o.computing]
        if computing:
            si.contended = True
            for o in computing:
                o.contended = True
        si.computing = True
        self.all_computing.add(1, t)
        self._session(si.device).add(1, t)

    def _stop_computing(self, si: Served, t: float) -> None:
        if si.computing:
            si.computing = False
            self.all_computing.add(-1, t)
            self._session(si.device).add(-1, t)

    # ------------------------------------------------------------------ results

    def _output_ready(self, si: Served, tile: int, t: float) -> None:
        if si.sent[tile]:
            return
        si.pending_results.append(tile)
        if not si.flush_due:  # reports taken together go out in one RESULT
            si.flush_due = True
            if self.costs is None:
                self.loop.at(t, self._flush, si)
            else:  # the I/O thread reads the tiles and sends them (and DONE with the last)
                ids = [i for i in si.pending_results if not si.sent[i]]
                nbytes = _HEADER_BYTES[P.RESULT] + 4 * len(ids) + int(self.g.nbytes[ids].sum())
                cost = self.costs.send(P.RESULT, nbytes)
                if si.n_sent + len(ids) >= len(self.g.outputs):
                    cost += self.costs.send(P.DONE, _HEADER_BYTES[P.DONE])
                self.cpu.run(cost, self._flush, si)

    def _flush(self, si: Served) -> None:
        si.flush_due = False
        if (si.device.index, si.inf) not in self.served:
            return
        ids = [i for i in si.pending_results if not si.sent[i]]
        si.pending_results = []
        if ids:
            si.sent[ids] = True
            si.n_sent += len(ids)
            nbytes = _HEADER_BYTES[P.RESULT] + 4 * len(ids) + int(self.g.nbytes[ids].sum())
            self._send(si.device, P.RESULT, nbytes, {"inf": si.inf, "ids": ids,
                                                     "ts": self.loop.now})
        if si.n_sent == len(self.g.outputs):
            t = self.loop.now
            self._measure(si, t)
            self._send(si.device, P.DONE, _HEADER_BYTES[P.DONE], {"inf": si.inf})
            self._free(si, t)

    def _measure(self, si: Served, t: float) -> None:
        from ..server.sessions import FLOPS_EWMA_WEIGHT

        whole = si.ts.external == len(self.g.inputs)
        if si.t_inputs is None or si.contended or not whole or t <= si.t_inputs:
            return
        rate = self.g.total_flops / (t - si.t_inputs)
        w = FLOPS_EWMA_WEIGHT
        self.measured_flops = rate if self.measured_flops is None else \
            (1 - w) * self.measured_flops + w * rate
        self.measured_samples += 1

    def _free(self, si: Served, t: float) -> None:
        self._stop_computing(si, t)
        self.served.pop((si.device.index, si.inf), None)
        si.ts.cancel()
