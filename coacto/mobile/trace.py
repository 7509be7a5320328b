"""Merged traces of one collaborative inference: the tiles each side computed, the frames between
them and the scheduler's decisions, on the device's clock, in one Chrome trace-event file that
Perfetto (https://ui.perfetto.dev) and chrome://tracing open (experiments/plot_trace.py draws it).

The engine fills a TraceRecord while the inference runs (engine thread only); the server's side
comes back in a TRACE message after DONE or CANCEL (docs/PROTOCOL.md §5); ``merged_trace`` turns
both into trace events.

Tracks (pid, tid; thread names as Perfetto shows them):

* device: ``inference`` (submission to completion: the latency), ``engine`` (RESULTs taken in),
  ``worker N`` (one per computing thread: a tile per slice, the send decisions as instants);
* link: ``uplink N`` (a TILES batch per slice, from when the engine handed it to the link until the
  server took it in), ``downlink N`` (a RESULT, from when the server sent it until the device took
  it in). Frames in flight at the same time overlap, so each direction has as many lanes as it
  needs;
* server: ``inference`` (BEGIN to the TRACE reply), ``I/O`` (TILES taken in, RESULTs sent),
  ``worker N``.

Flows (arrows): one per tile sent, from the device's tile (or, for an input, its batch on the link)
to the first server tile that reads it (or its arrival, if none did); one per tile returned, from
the server's tile to the device taking in its RESULT.

Clocks: ts 0 is the inference's submission; server times are mapped onto the device's clock with
the offset the heartbeats measure (estimates.ClockOffset: server minus device from the quickest of
the last exchanges, uncertain by half that exchange's round trip). The inference's own messages
bound the offset too: a batch cannot reach the server before the device released it, an ACK, a
RESULT or the TRACE cannot reach the device before the server sent it. A measured offset outside
those bounds is clamped into them (the metadata says so); without one the bounds' midpoint is used.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass

import numpy as np

from .. import protocol as P

log = logging.getLogger(__name__)

PID_DEVICE, PID_LINK, PID_SERVER = 1, 2, 3
# Thread ids are unique across processes: Perfetto keys a JSON trace's threads by tid alone.
TID_INFERENCE, TID_ENGINE, TID_WORKER = 100, 101, 110          # device
TID_UPLINK, TID_DOWNLINK = 1000, 2000                          # link lanes
TID_SERVER_INFERENCE, TID_SERVER_IO, TID_SERVER_WORKER = 3000, 3001, 3010
#: Every slice a flow binds to has this category: Perfetto matches a flow's ends by id, category
#: and name, Chrome's DevTools binds a flow event to the slice of the same category and start.
CAT = "coacto"


@dataclass
class ClockMapping:
    """How server times were put on the device's clock: device = server - offset_s."""

    offset_s: float
    uncertainty_s: float | None     # half the round trip of the exchange measured_s came from
    source: str
    measured_s: float | None        # the heartbeats' offset, before any clamping
    lower_s: float | None           # bounds from this inference's own messages
    upper_s: float | None


def map_clock(measured: float | None, uncertainty: float | None, lower: float | None,
              upper: float | None) -> ClockMapping:
    consistent = lower is None or upper is None or lower <= upper
    if measured is not None:
        offset, source = measured, "heartbeats"
        if consistent and lower is not None and offset < lower:
            offset, source = lower, "heartbeats, raised to this inference's messages' bound"
        elif consistent and upper is not None and offset > upper:
            offset, source = upper, "heartbeats, lowered to this inference's messages' bound"
    elif lower is not None and upper is not None and consistent:
        offset, source = (lower + upper) / 2, "this inference's messages (no heartbeat yet)"
        uncertainty = (upper - lower) / 2
    else:
        offset, source = lower if lower is not None else (upper or 0.0), \
            "this inference's messages, one-sided (no heartbeat yet)"
    if not consistent:
        source += "; the messages' bounds contradict each other (a clock stepped?)"
    return ClockMapping(offset, uncertainty, source, measured, lower, upper)


class TraceRecord:
    """What the engine records about one traced inference (written by the engine thread)."""

    def __init__(self, path: str | None):
        self.path = path
        self.batches: dict[int, dict] = {}   # TILES: ids, bytes, handed, released, acked, t_ack
        self.results: list[dict] = []        # RESULTs taken in: ids, bytes, t0, t1 (device)
        self.server: dict | None = None      # the TRACE reply: header, ids, t0, t1, worker, t_recv
        self.server_note = "the server was not used"
        self.replied = False                 # a TRACE came, well-formed or not
        self.asked = False                   # BEGIN asked the server for its side
        self.waited_from: float | None = None  # the inference finished; the TRACE was due
        self.deadline: float | None = None   # stop waiting for it then
        self.device: tuple | None = None     # (t0, t1, worker) of the device's tiles
        self.decisions: list[dict] = []
        self.estimates: dict = {}
        self.threads = 0

    # ---------------------------------------------------------------- engine hooks

    def handed(self, batch: int, ids: np.ndarray, nbytes: int, t: float) -> None:
        self.batches[batch] = {"ids": np.array(ids, np.int32), "bytes": int(nbytes), "handed": t,
                               "released": None, "acked": None, "t_ack": None}

    def released(self, batch, t: float) -> None:
        if batch in self.batches:
            self.batches[batch]["released"] = t

    def acked(self, batch, t: float, t_server) -> None:
        b = self.batches.get(batch)
        if b is not None and b["acked"] is None:
            b["acked"] = t
            b["t_ack"] = float(t_server) if isinstance(t_server, (int, float)) else None

    def result(self, ids: np.ndarray, nbytes: int, t0: float, t1: float) -> None:
        self.results.append({"ids": np.array(ids, np.int32), "bytes": int(nbytes), "t0": t0,
                             "t1": t1})

    def server_reply(self, header: dict, frames: list, n_tiles: int, t: float) -> None:
        """Takes a TRACE message; a malformed one is logged and left out, never raised."""
        self.replied = True
        try:
            ids, t0, t1, worker = P.unpack_trace_rows(header, frames, n_tiles)
        except P.ProtocolError as e:
            log.warning("ignoring the server's trace of inference %r: %s", header.get("inf"), e)
            self.server_note = f"malformed TRACE ignored ({e})"
            return
        self.server = {"header": header, "ids": ids, "t0": t0, "t1": t1, "worker": worker,
                       "t_recv": t}
        self.server_note = "received" + (" (truncated by the server)"
                                         if header.get("truncated") is True else "")


# -------------------------------------------------------------------------------- building

def _groups(ids, t0, t1, rows) -> list[dict]:
    """Rows logged together (one TILES batch or RESULT each) -> [{ids, t0, t1}] by time."""
    if not rows.size:
        return []
    keys = np.stack([t0[rows], t1[rows]], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    return [{"ids": ids[rows][inverse == g], "t0": float(uniq[g, 0]), "t1": float(uniq[g, 1])}
            for g in range(len(uniq))]


def _match(device_items: list[dict], server_groups: list[dict]) -> list[dict | None]:
    """Pairs the device's frames with the server's rows for the same frame (same tile ids), in
    order; None where the server has no record (arrived after it finished, or truncated)."""
    pool: dict[bytes, list] = {}
    for g in server_groups:
        pool.setdefault(np.sort(g["ids"]).tobytes(), []).append(g)
    return [(pool.get(np.sort(d["ids"]).tobytes()) or [None]).pop(0) for d in device_items]


def _lanes(spans: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: the lane of each (start, end), lanes never overlapping."""
    ends: list[float] = []
    out = []
    for start, end in spans:
        for k, e in enumerate(ends):
            if e <= start:
                ends[k] = end
                out.append(k)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out


def _num(x):
    """JSON has no infinities or NaN."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _children(plan) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each tile's readers (the plan lists parents)."""
    n = plan.n_tiles
    counts = np.diff(plan.parent_offsets)
    child = np.repeat(np.arange(n, dtype=np.int32), counts)
    order = np.argsort(plan.parents, kind="stable")
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(plan.parents, minlength=n), out=offsets[1:])
    return offsets, child[order]


def causal_bounds(rec: TraceRecord, batches: list, received: list, returned: list) -> tuple:
    """(lower, upper) bounds on the offset (server - device) that this inference's messages
    imply: each arrived after it was sent."""
    lower, upper = [], []
    for b, g in zip(batches, received):
        if g is not None:
            upper.append(g["t0"] - b["released"])
        if b["t_ack"] is not None and b["acked"] is not None:
            lower.append(b["t_ack"] - b["acked"])
    for r, g in zip(rec.results, returned):
        if g is not None:
            lower.append(g["t0"] - r["t0"])
    if rec.server is not None and isinstance(rec.server["header"].get("t_server"), (int, float)):
        lower.append(rec.server["header"]["t_server"] - rec.server["t_recv"])
    return (max(lower) if lower else None), (min(upper) if upper else None)


def merged_trace(tg, rec: TraceRecord, stats: dict, t_zero: float, clock_offset: float | None,
                 clock_uncertainty: float | None, server_name: str = "server") -> dict:
    """The trace-event JSON object (``{"traceEvents": [...], "displayTimeUnit": "ms",
    "metadata": {...}}``) of one inference; see the module text for its tracks. ``t_zero``: the
    device's clock at ts 0; ``clock_offset`` / ``clock_uncertainty``: the heartbeats' estimate
    (None: none yet)."""
    return _Builder(tg, rec, stats, t_zero, clock_offset, clock_uncertainty, server_name).build()


class _Builder:
    """One merged trace; each method adds the events of one kind of track."""

    def __init__(self, tg, rec, stats, t_zero, clock_offset, clock_uncertainty, server_name):
        self.tg, self.plan, self.layers = tg, tg.plan, tg.graph.layers
        self.rec, self.stats, self.t_zero, self.server_name = rec, stats, t_zero, server_name
        self.events: list[dict] = []
        srv = self.srv = rec.server
        # frames as both sides saw them: the device's batches and results paired with the
        # server's rows of the same tiles
        self.batches = [(k, b) for k, b in sorted(rec.batches.items())
                        if b["released"] is not None]
        if srv is not None:
            rows_in = np.flatnonzero(srv["worker"] == P.TRACE_RECEIVED)
            rows_out = np.flatnonzero(srv["worker"] == P.TRACE_RETURNED)
            self.taken_in = _groups(srv["ids"], srv["t0"], srv["t1"], rows_in)
            self.sent_back = _groups(srv["ids"], srv["t0"], srv["t1"], rows_out)
        else:
            self.taken_in, self.sent_back = [], []
        self.received = _match([b for _, b in self.batches], self.taken_in)
        self.returned = _match(rec.results, self.sent_back)
        lower, upper = causal_bounds(rec, [b for _, b in self.batches], self.received,
                                     self.returned)
        self.clock = map_clock(clock_offset, clock_uncertainty, lower, upper)
        n = self.plan.n_tiles
        self.dev_t0, self.dev_worker = np.zeros(n), np.full(n, -1, np.int32)
        self.srv_first: dict[int, tuple] = {}   # tile -> (ts, tid) of its server slice
        self.batch_slice: dict[int, tuple] = {}  # batch -> (ts, tid) on the uplink
        self.result_slice: list[tuple] = []      # per result: (ts, tid) on the device
        self.lanes = (0, 0)
        self._flows = 0

    # ---------------------------------------------------------------- helpers

    def us(self, t: float) -> float:
        """A device time -> ts (microseconds since t_zero)."""
        return (t - self.t_zero) * 1e6

    def sus(self, t: float) -> float:
        """A server time -> ts on the device's clock."""
        return self.us(t - self.clock.offset_s)

    def slice(self, name: str, pid: int, tid: int, ts: float, dur_s: float, args: dict) -> None:
        self.events.append({"name": name, "cat": CAT, "ph": "X", "pid": pid, "tid": tid,
                            "ts": ts, "dur": max(0.0, dur_s * 1e6), "args": args})

    def tile(self, t: int, pid: int, tid: int, ts: float, dur_s: float, side: str, **extra):
        li = int(self.plan.tile_layer[t])
        layer = self.layers[li]
        self.slice(f"{layer.name} #{t}", pid, tid, ts, dur_s, {
            "tile": t, "layer": layer.name, "op": layer.op, "depth": li,
            "flops": float(self.plan.tile_flops[t]), "bytes": int(self.plan.tile_bytes[t]),
            "side": side, **extra})

    def flow(self, name: str, src: tuple, dst: tuple) -> None:
        """An arrow between the slices that start at src and dst, (pid, ts, tid) each."""
        self._flows += 1
        for ph, (pid, ts, tid) in (("s", src), ("f", dst)):
            e = {"name": name, "cat": CAT, "ph": ph, "id": self._flows, "pid": pid, "tid": tid,
                 "ts": ts}
            if ph == "f":
                e["bp"] = "e"
            self.events.append(e)

    # ---------------------------------------------------------------- tracks

    def device(self) -> None:
        rec = self.rec
        if rec.device is not None:
            t0, t1, self.dev_worker = rec.device
            self.dev_t0 = t0
            for t in np.flatnonzero(self.dev_worker >= 0).tolist():
                self.tile(t, PID_DEVICE, TID_WORKER + int(self.dev_worker[t]), self.us(t0[t]),
                          t1[t] - t0[t], "device")
        for d in rec.decisions:  # on the thread that completed the tile and decided
            t = int(d["tile"])
            w = int(self.dev_worker[t])
            self.events.append({
                "name": "send" if d["sent"] else "keep", "cat": "decision", "ph": "i", "s": "t",
                "pid": PID_DEVICE, "tid": TID_WORKER + w if w >= 0 else TID_ENGINE,
                "ts": self.us(d["time"]),
                "args": {"tile": t, "layer": self.layers[int(self.plan.tile_layer[t])].name,
                         "sent": bool(d["sent"]),
                         "ect_offloaded": _num(d["ect_offloaded"] - self.t_zero),
                         "ect_server": _num(d["ect_server"] - self.t_zero)}})

    def server(self) -> None:
        srv = self.srv
        if srv is None:
            return
        for r in np.flatnonzero(srv["worker"] >= 0).tolist():
            t = int(srv["ids"][r])
            ts, tid = self.sus(srv["t0"][r]), TID_SERVER_WORKER + int(srv["worker"][r])
            self.tile(t, PID_SERVER, tid, ts, srv["t1"][r] - srv["t0"][r], "server",
                      t_server=float(srv["t0"][r]))
            self.srv_first.setdefault(t, (ts, tid))
        h = srv["header"]
        if isinstance(h.get("t_begin"), (int, float)) and isinstance(h.get("t_server"),
                                                                     (int, float)):
            t_in = h.get("t_inputs")
            self.slice("server inference", PID_SERVER, TID_SERVER_INFERENCE,
                       self.sus(h["t_begin"]), h["t_server"] - h["t_begin"], {
                           "inputs_arrived_ms": _num((t_in - h["t_begin"]) * 1e3)
                           if isinstance(t_in, (int, float)) else None,
                           "truncated": h.get("truncated") is True})
        for what, groups in (("take TILES", self.taken_in), ("send RESULT", self.sent_back)):
            for gr in groups:
                n = int(gr["ids"].size)
                self.slice(f"{what} ({n} tiles)", PID_SERVER, TID_SERVER_IO, self.sus(gr["t0"]),
                           gr["t1"] - gr["t0"], {"tiles": n})

    def uplink(self) -> None:
        offset, items = self.clock.offset_s, []
        for (k, b), gr in zip(self.batches, self.received):
            arrive = gr["t0"] - offset if gr is not None else (
                b["t_ack"] - offset if b["t_ack"] is not None else None)
            # neither the server nor an ACK says when it arrived (after the server had
            # finished, or the connection went): the slice ends when it left the device
            end = max(arrive if arrive is not None else b["released"], b["handed"])
            items.append((k, b, end, arrive))
        lanes = _lanes([(b["handed"], end) for _k, b, end, _a in items])
        for lane, (k, b, end, arrive) in zip(lanes, items):
            ts, tid = self.us(b["handed"]), TID_UPLINK + lane
            self.batch_slice[k] = (ts, tid)
            ms = lambda t: _num((t - self.t_zero) * 1e3) if t is not None else None  # noqa: E731
            self.slice(f"TILES {k}" + ("" if arrive is not None else " (not taken in)"),
                       PID_LINK, tid, ts, end - b["handed"], {
                           "batch": k, "tiles": int(b["ids"].size), "bytes": b["bytes"],
                           "released_ms": ms(b["released"]), "arrived_ms": ms(arrive),
                           "acked_ms": ms(b["acked"]), "ids": b["ids"].tolist()})
        self.lanes = (max(lanes, default=-1) + 1, self.lanes[1])

    def downlink(self) -> None:
        items = []
        for r, gr in zip(self.rec.results, self.returned):
            start = gr["t0"] - self.clock.offset_s if gr is not None else r["t0"]
            items.append((r, min(start, r["t0"])))
        lanes = _lanes([(start, r["t0"]) for r, start in items])
        for lane, (r, start) in zip(lanes, items):
            n = int(r["ids"].size)
            self.slice(f"RESULT ({n} tiles)", PID_LINK, TID_DOWNLINK + lane, self.us(start),
                       r["t0"] - start, {"tiles": n, "bytes": r["bytes"],
                                         "ids": r["ids"].tolist()})
            self.slice(f"take RESULT ({n} tiles)", PID_DEVICE, TID_ENGINE, self.us(r["t0"]),
                       r["t1"] - r["t0"], {"tiles": n})
            self.result_slice.append((self.us(r["t0"]), TID_ENGINE))
        self.lanes = (self.lanes[0], max(lanes, default=-1) + 1)

    def flows(self) -> None:
        """Each tile sent: from the device's tile (an input: its batch on the link) to the first
        server tile that reads it, else to its arrival. Each tile returned: from the server's
        tile (or its RESULT) to the device taking the RESULT in."""
        offsets, readers = _children(self.plan)
        computed = np.zeros(self.plan.n_tiles, bool)
        computed[np.fromiter(self.srv_first, np.int64, len(self.srv_first))] = True
        arrival = {k: (PID_SERVER, self.sus(gr["t0"]), TID_SERVER_IO)
                   for (k, _b), gr in zip(self.batches, self.received) if gr is not None}
        done = set()
        for k, b in self.batches:
            on_link = (PID_LINK, *self.batch_slice[k])
            for t in b["ids"].tolist():
                if t in done:
                    continue
                done.add(t)
                w = int(self.dev_worker[t])
                src = (PID_DEVICE, self.us(self.dev_t0[t]), TID_WORKER + w) if w >= 0 else on_link
                rd = readers[offsets[t]:offsets[t + 1]]
                rd = rd[computed[rd]]
                if rd.size:
                    dst = (PID_SERVER, *min(self.srv_first[int(x)] for x in rd))
                else:
                    dst = arrival.get(k, on_link)
                if dst != src:
                    self.flow(f"tile {t}", src, dst)
        for r, gr, (ts, tid) in zip(self.rec.results, self.returned, self.result_slice):
            for t in r["ids"].tolist():
                if t in self.srv_first:
                    src = (PID_SERVER, *self.srv_first[t])
                elif gr is not None:
                    src = (PID_SERVER, self.sus(gr["t0"]), TID_SERVER_IO)
                else:
                    continue
                self.flow(f"tile {t}", src, (PID_DEVICE, ts, tid))

    def summary(self) -> dict:
        """The inference's span and estimates on the device's tracks; the metadata."""
        stats, rec = self.stats, self.rec
        latency = stats.get("latency_s")
        summary = {k: _num(stats.get(k)) for k in (
            "policy", "latency_s", "tiles_total", "tiles_local", "tiles_sent",
            "tiles_from_server", "bytes_sent", "bytes_received", "batches", "offloaded",
            "fallback", "fallback_reason", "server_skipped", "finished_by", "bandwidth_est_mbps",
            "rtt_est_ms", "server_flops", "device_flops", "alpha", "frontier", "predicted_s")}
        if latency is not None:
            self.slice(f"inference ({stats.get('policy')})", PID_DEVICE, TID_INFERENCE, 0.0,
                       latency, summary)
        est = rec.estimates
        counter = {k: _num(est.get(src)) for k, src in (("bandwidth_mbps", "bandwidth_est_mbps"),
                                                        ("rtt_ms", "rtt_est_ms"))}
        counter = {k: v for k, v in counter.items() if v is not None}
        if counter:  # the estimates the inference started with, as a flat line over it
            for ts in (0.0, max(0.0, (latency or 0.0) * 1e6)):
                self.events.append({"name": "estimates", "ph": "C", "pid": PID_DEVICE,
                                    "tid": TID_INFERENCE, "ts": ts, "args": counter})
        threads = 0
        if self.srv is not None:
            threads = max(int(self.srv["header"].get("threads") or 0),
                          int(self.srv["worker"].max(initial=-1)) + 1)
        self.server_threads = threads
        return {**summary,
                "trace_zero": "ts 0 is the inference's submission, on the device's clock",
                "graph_id": self.tg.graph_id, "tiles": int(self.plan.n_tiles),
                "layers": len(self.layers), "device_threads": rec.threads,
                "server_threads": threads, "server_trace": rec.server_note,
                "estimates_at_start": {k: _num(v) for k, v in est.items()},
                "clock": {k: _num(v) for k, v in asdict(self.clock).items()},
                "decisions": len(rec.decisions),
                "decisions_sent": sum(1 for d in rec.decisions if d["sent"])}

    def build(self) -> dict:
        self.device()
        self.server()
        self.uplink()
        self.downlink()
        self.flows()  # after the slices they bind to (viewers bind a flow to a slice that
        # starts at its ts: listed first, that slice is open when the flow is read)
        meta = self.summary()
        has_server = self.srv is not None or bool(self.batches) or bool(self.rec.results)
        names = _metadata_events(self.rec.threads, self.server_threads, *self.lanes, has_server,
                                 self.server_name, self.stats)
        return {"traceEvents": names + self.events, "displayTimeUnit": "ms",
                "metadata": {"coacto": meta}}


def _metadata_events(threads_device: int, threads_server: int, up: int, down: int,
                     has_server: bool, server_name: str, stats: dict) -> list[dict]:
    def m(name, pid, tid, args):
        return {"name": name, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}

    latency = stats.get("latency_s")
    label = str(stats.get("policy")) + (f", {latency * 1e3:.1f} ms" if latency is not None else "")
    out = [m("process_name", PID_DEVICE, TID_INFERENCE, {"name": "device"}),
           m("process_sort_index", PID_DEVICE, TID_INFERENCE, {"sort_index": 0}),
           m("process_labels", PID_DEVICE, TID_INFERENCE, {"labels": label})]
    threads = [(PID_DEVICE, TID_INFERENCE, "inference"), (PID_DEVICE, TID_ENGINE, "engine")]
    threads += [(PID_DEVICE, TID_WORKER + w, f"worker {w}") for w in range(threads_device)]
    if has_server:
        out += [m("process_name", PID_LINK, TID_UPLINK, {"name": "link"}),
                m("process_sort_index", PID_LINK, TID_UPLINK, {"sort_index": 1}),
                m("process_name", PID_SERVER, TID_SERVER_INFERENCE, {"name": server_name}),
                m("process_sort_index", PID_SERVER, TID_SERVER_INFERENCE, {"sort_index": 2})]
        threads += [(PID_LINK, TID_UPLINK + k, f"uplink {k}") for k in range(up)]
        threads += [(PID_LINK, TID_DOWNLINK + k, f"downlink {k}") for k in range(down)]
        threads += [(PID_SERVER, TID_SERVER_INFERENCE, "inference"),
                    (PID_SERVER, TID_SERVER_IO, "I/O")]
        threads += [(PID_SERVER, TID_SERVER_WORKER + w, f"worker {w}")
                    for w in range(threads_server)]
    for i, (pid, tid, name) in enumerate(threads):
        out.append(m("thread_name", pid, tid, {"name": name}))
        out.append(m("thread_sort_index", pid, tid, {"sort_index": i}))
    return out


def write_trace(trace: dict, path) -> None:
    """Writes the trace atomically (a viewer never opens half a file)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f, separators=(",", ":"), allow_nan=False)
    os.replace(tmp, path)
