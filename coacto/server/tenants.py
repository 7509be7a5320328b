"""The tenants of a server: every device's session and inferences on the shared runtime.

Inference ids are looked up in the sending device's own session only, so no device can reach
another's inferences. The I/O thread alone calls these methods (no locks); messages go out through
the server's `send`.
"""
from __future__ import annotations

import itertools
import logging
from typing import Callable

import numpy as np

from .. import protocol as P
from ..errors import CoactoError
from ..inference import REPORT_DONE, REPORT_TILE, NativeInference, now
from ..native import NativeRuntime
from .limits import Limits
from .sessions import FlopEstimate, LoadAverage, ServedInference, Session, TraceLog, alpha
from .store import ModelStore, is_hash

log = logging.getLogger(__name__)

MAX_INF_ID_CHARS = 128
#: A device that began an inference within this many seconds counts in STATS' ``others``: a
#: device told the server is shared keeps its own work going (docs/SCHEDULER.md, "Many
#: devices"). Longer than a heartbeat period, so a device's view stays set between its STATS.
SHARED_WINDOW_S = 10.0
#: An inference measures the server's rate when the server computed at least this share of the
#: graph's FLOPs.
MIN_FLOPS_SHARE = 0.25


class Reject(Exception):
    """Answer the current message with ERROR {code, text, **extra}."""

    def __init__(self, code: int, text: str, **extra):
        super().__init__(text)
        self.code, self.text, self.extra = code, text, extra


def parse_inf_id(header: dict):
    inf = header.get("inf")
    if (type(inf) is int and -(1 << 63) <= inf < (1 << 64)) or \
            (type(inf) is str and 0 < len(inf) <= MAX_INF_ID_CHARS):
        return inf
    raise Reject(P.E_BAD_MESSAGE, f"'inf' must be an integer or a string of at most "
                                  f"{MAX_INF_ID_CHARS} characters")


def echo(value):
    """A value the server echoes (batch): numbers and short strings only."""
    if type(value) in (int, float) or (type(value) is str and len(value) <= MAX_INF_ID_CHARS):
        return value
    return None


def _decrement(counts: dict, key, by: int = 1) -> None:
    left = counts.get(key, 0) - by
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class Tenants:
    """Sessions by identity, inferences by tag, and the load and memory they put on the server."""

    def __init__(self, rt: NativeRuntime, store: ModelStore, flops: FlopEstimate,
                 send: Callable, counts: dict, limits: Limits):
        self.rt = rt
        self.store = store
        self.flops = flops
        self.send = send
        self.counts = counts
        self.limits = limits
        self.sessions: dict[bytes, Session] = {}
        self.by_owner: dict[str, set] = {}  # owner -> its sessions' identities
        self.by_tag: dict[int, ServedInference] = {}
        self.computing: set[ServedInference] = set()
        #: inferences that received tiles and are not freed: a streamed one computes from its
        #: first tiles, before it counts as computing (its rate measures only when alone here)
        self.fed: set[ServedInference] = set()
        self.all_computing = LoadAverage(now())
        self.inference_bytes = 0  # bound on what the inferences in flight hold (admission)
        self.unsent_bytes = 0     # result bytes handed to ZeroMQ, not yet sent
        # per owner (Session.owner): inferences in flight and their bytes, compilations queued,
        # uploads among them and their bytes
        self.owner_inferences: dict[str, int] = {}
        self.owner_bytes: dict[str, int] = {}
        self.jobs: dict[str, int] = {}
        self.uploads_pending: dict[str, int] = {}
        self.upload_bytes = 0
        # frames queued for connections whose sessions were dropped: still in ZeroMQ's pipe
        # until the peer reads them or disconnects, so still counted (owner, tracker, bytes)
        self.orphans: list = []
        self.freed_since_trim = 0
        self._tags = itertools.count(1)
        # Session.device_key -> when that device last began an inference, oldest first (others)
        self.recent_begins: dict[object, float] = {}

    @property
    def max_inferences_per_device(self) -> int:
        return self.limits.inferences_per_device

    def session(self, identity: bytes, t: float, owner: str = "",
                peer: str = "") -> Session | None:
        """The connection's session (created on its first message). To make room, the least
        recently heard idle session (nothing in flight) of the same owner, or else of anyone, is
        forgotten; None when no room can be made."""
        session = self.sessions.get(identity)
        if session is None:
            mine = self.by_owner.get(owner, ())
            if len(mine) >= self.limits.sessions_per_owner and \
                    not self._evict_idle([self.sessions[i] for i in mine], "per-device limit"):
                self.counts["sessions_refused"] += 1
                return None
            if len(self.sessions) >= self.limits.sessions and \
                    not self._evict_idle(self.sessions.values(), "session table full"):
                self.counts["sessions_refused"] += 1
                return None
            session = self.sessions[identity] = Session(identity, t, owner, peer)
            self.by_owner.setdefault(owner, set()).add(identity)
            log.debug("device %s connected (%s)", session.name, owner[:24] or "?")
        session.last_seen = t
        session.messages += 1
        return session

    def _evict_idle(self, candidates, why: str) -> bool:
        candidates = list(candidates)
        for s in candidates:
            self._reap(s)
        idle = [s for s in candidates if s.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.last_seen)
        self.counts["sessions_evicted"] += 1
        log.debug("device %s forgotten to make room (%s)", oldest.name, why)
        self.drop(oldest, "evicted")
        return True

    def sweep(self, timeout: float) -> None:
        """Frees the state of devices silent for longer than `timeout` seconds, and of
        connections that never began an inference within ``limits.idle_expiry_s``."""
        t = now()
        fast = self.limits.idle_expiry_s
        for session in list(self.sessions.values()):
            silent = t - session.last_seen
            if silent > timeout:
                n = len(session.inferences)
                self.counts["devices_expired"] += 1
                self.counts["inferences_expired"] += n
                log.info("device %s silent for %.1f s: freeing it (%d inference(s))",
                         session.name, silent, n)
                self.drop(session, "expired")
            else:
                self._reap(session)
                if fast is not None and not session.began and session.idle and silent > fast:
                    self.counts["sessions_expired_idle"] += 1
                    self.drop(session, "idle")
        kept = []
        for owner, tracker, nbytes in self.orphans:
            if tracker.done:
                self.unsent_bytes -= nbytes
            else:
                kept.append((owner, tracker, nbytes))
        self.orphans = kept

    def drop(self, session: Session, why: str) -> None:
        for si in list(session.inferences.values()):
            self._free(si, why)
        self.sessions.pop(session.identity, None)
        key = session.device_key
        if key in self.recent_begins and not any(
                self.sessions[i].device_key == key for i in self.by_owner.get(session.owner, ())
                if i in self.sessions):
            del self.recent_begins[key]
        mine = self.by_owner.get(session.owner)
        if mine is not None:
            mine.discard(session.identity)
            if not mine:
                del self.by_owner[session.owner]
        self._reap(session)
        self.orphans.extend((session.owner, t, n) for t, n, _tag in session.unsent)
        session.unsent.clear()
        session.unsent_bytes = 0

    def drop_all(self, why: str) -> None:
        for session in list(self.sessions.values()):
            self.drop(session, why)

    def _reap(self, session: Session) -> None:
        before = session.unsent_bytes
        self.unsent_bytes -= before - session.reap()

    def memory_in_use(self) -> int:
        """What the admission check counts: the store, inferences in flight, queued results,
        uploads waiting to be compiled."""
        return self.store.nbytes() + self.inference_bytes + self.unsent_bytes + self.upload_bytes

    def orphaned_bytes(self, owner: str) -> int:
        return sum(n for o, t, n in self.orphans if o == owner and not t.done)

    def jobs_of(self, owner: str) -> int:
        return self.jobs.get(owner, 0)

    def job_queued(self, owner: str, upload_bytes: int) -> None:
        self.jobs[owner] = self.jobs.get(owner, 0) + 1
        if upload_bytes:
            self.uploads_pending[owner] = self.uploads_pending.get(owner, 0) + 1
            self.upload_bytes += upload_bytes

    def job_done(self, owner: str, upload_bytes: int) -> None:
        _decrement(self.jobs, owner)
        if upload_bytes:
            _decrement(self.uploads_pending, owner)
            self.upload_bytes -= upload_bytes

    # ------------------------------------------------------------------ messages

    def begin(self, session: Session, h: dict, frames: list) -> None:
        inf_id = parse_inf_id(h)
        graph_id = h.get("graph_id")
        if not is_hash(graph_id):
            raise Reject(P.E_BAD_MESSAGE, "BEGIN needs 'graph_id', a sha256 hex digest", inf=inf_id)
        existing = session.inferences.get(inf_id)
        if existing is not None:
            if existing.entry.tg.graph_id == graph_id:
                return  # a repeated BEGIN (a retry): the inference is already there
            raise Reject(P.E_BAD_MESSAGE, f"inference {inf_id!r} was already begun with another "
                                          f"graph; CANCEL it or use a new id", inf=inf_id)
        entry = self.store.graph(graph_id, session.owner)
        if entry is None:
            raise Reject(P.E_UNKNOWN_MODEL, f"graph {graph_id[:12]} is not loaded here; send "
                                            f"MODEL_QUERY (and MODEL_UPLOAD) first", inf=inf_id)
        if len(session.inferences) >= self.max_inferences_per_device:
            raise Reject(P.E_BUSY, f"this connection already has {len(session.inferences)} "
                                   f"inferences in flight (the limit)", inf=inf_id,
                         limit="inferences_per_device")
        need = entry.info.inference_bytes
        if need > self.limits.inference_memory:  # a preloaded graph, or the limit was lowered
            raise Reject(P.E_MODEL_TOO_LARGE, f"one inference of this graph needs up to "
                                              f"{need / 2**20:.0f} MiB; this server allows "
                                              f"{self.limits.inference_memory / 2**20:.0f} MiB",
                         inf=inf_id, limit="inference_memory")
        owner = session.owner
        if self.owner_inferences.get(owner, 0) >= self.limits.inferences_per_owner:
            raise Reject(P.E_BUSY, f"this device already has {self.owner_inferences[owner]} "
                                   f"inferences in flight over all its connections (the limit)",
                         inf=inf_id, limit="inferences_per_owner")
        self._reap(session)
        used = self.memory_in_use()
        if used + need > self.limits.memory:
            self.counts["memory_refused"] += 1
            raise Reject(P.E_BUSY, f"the server's memory budget is in use ({used / 2**20:.0f} of "
                                   f"{self.limits.memory / 2**20:.0f} MiB; this inference needs "
                                   f"up to {need / 2**20:.0f}); compute locally or retry later",
                         inf=inf_id, limit="memory")
        held = self.owner_bytes.get(owner, 0)
        if held + need > self.limits.memory * self.limits.owner_memory_share:
            self.counts["memory_refused"] += 1
            raise Reject(P.E_BUSY, f"this device's inferences in flight hold up to "
                                   f"{held / 2**20:.0f} MiB, its share of the server's memory is "
                                   f"{self.limits.memory * self.limits.owner_memory_share / 2**20:.0f}"
                                   f" MiB; compute locally or retry later", inf=inf_id,
                         limit="owner_memory")
        tag = next(self._tags)
        native = NativeInference(self.rt, entry.tg, tag)
        traced = h.get("trace") is True  # recorded only when asked: others pay nothing
        try:
            native.set_plan(report=entry.info.output_mask)
            if traced:
                native.enable_trace()
        except Exception:
            native.close()
            raise
        si = ServedInference(inf_id, tag, native, entry, session, now())
        result_enc = h.get("result_enc")
        if result_enc is not None:
            if not isinstance(result_enc, str) or result_enc not in P.TRANSFER_MODES or \
                    result_enc in P.LOSSY_TRANSFERS:
                native.close()
                raise Reject(P.E_BAD_MESSAGE, f"BEGIN 'result_enc' must be one of raw, lossless; "
                                              f"got {str(result_enc)[:40]!r}", inf=inf_id)
            si.result_enc = None if result_enc == "raw" else result_enc
        if traced:
            si.trace = TraceLog(entry.tg.n_tiles)
        session.inferences[inf_id] = si
        session.began += 1
        self.by_tag[tag] = si
        self.inference_bytes += need
        self.owner_inferences[owner] = self.owner_inferences.get(owner, 0) + 1
        self.owner_bytes[owner] = self.owner_bytes.get(owner, 0) + need
        self.recent_begins.pop(session.device_key, None)
        self.recent_begins[session.device_key] = si.t_begin
        if entry.info.n_inputs == 0:
            self._start_computing(si)

    def name_device(self, session: Session, token: str) -> None:
        """HELLO named the device behind this connection: its connections, one after the other
        or at once, count as one device in others (a token is only the same device under the
        same owner, so no device can merge itself with another's)."""
        if session.device_key == session.identity:  # not named yet (a HELLO again: it was)
            self.recent_begins.pop(session.identity, None)
        session.device_key = (session.owner, token)

    def others(self, session: Session, t: float) -> int:
        """Other devices that began an inference within SHARED_WINDOW_S."""
        recent = self.recent_begins
        while recent:
            oldest, t_begin = next(iter(recent.items()))
            if t - t_begin <= SHARED_WINDOW_S:
                break
            del recent[oldest]
        return len(recent) - (session.device_key in recent)

    def bye(self, session: Session, h: dict, frames: list) -> None:
        """The device closed its client: its state goes now, not at the heartbeat timeout."""
        self.drop(session, "the device closed its connection")

    def tiles(self, session: Session, h: dict, frames: list) -> None:
        inf_id = parse_inf_id(h)
        batch = echo(h.get("batch"))
        si = session.inferences.get(inf_id)
        if si is None:
            why = "has finished or was cancelled" if inf_id in session.recent_freed else \
                "was not begun (or expired)"
            raise Reject(P.E_UNKNOWN_INFERENCE, f"inference {inf_id!r} {why}", inf=inf_id,
                         batch=batch)
        info = si.entry.info
        try:
            got = P.read_tile_frames(h, frames, si.entry.tg.n_tiles, info.sizes)
        except P.ProtocolError as e:
            raise Reject(P.E_BAD_TILES, str(e), inf=inf_id, batch=batch) from None
        ids, n_bytes = got.ids, got.nbytes
        t_in = now()
        try:
            if got.enc is None:
                accepted, dup = si.native.put_tiles(ids, got.data)
            else:  # lengths and bitmaps are checked in C before anything is applied
                accepted, dup = si.native.put_tiles_encoded(got.enc, ids, got.lens, got.encoded)
        except CoactoError as e:
            raise Reject(P.E_BAD_TILES, str(e), inf=inf_id, batch=batch) from None
        if si.trace is not None:
            si.trace.add(ids, t_in, now(), P.TRACE_RECEIVED)
        outputs = np.unique(ids[info.output_mask[ids] == 1])
        outputs = outputs[~si.sent[outputs]]
        if outputs.size:  # output tiles the device sent: it has them, no RESULT for those
            si.sent[outputs] = True
            si.n_sent += int(outputs.size)
        si.tiles_in += accepted
        si.duplicates += dup
        si.bytes_in += n_bytes
        self.counts["tiles_in"] += accepted
        self.counts["bytes_in"] += n_bytes
        if si not in self.fed:
            others = self.fed | self.computing  # (a graph without inputs computes from BEGIN)
            if others - {si}:
                si.contended = True
                for other in others:
                    other.contended = True
            self.fed.add(si)
        if si.note_inputs(ids):
            self._start_computing(si)
        t_send = h.get("t_send")
        self.send(session.identity, {
            "t": P.ACK, "inf": inf_id, "batch": batch, "bytes": n_bytes,
            "t_send": t_send if type(t_send) in (int, float) else None, "t_server": now(),
            "accepted": accepted, "duplicates": dup})

    def cancel(self, session: Session, h: dict, frames: list) -> None:
        si = session.inferences.get(parse_inf_id(h))
        if si is not None:  # cancelling what is already gone is not an error
            self.counts["inferences_cancelled"] += 1
            si.native.cancel()  # tiles still running are left out of a trace
            self._send_trace(si)
            self._free(si, "cancelled")

    def heartbeat(self, session: Session, h: dict, frames: list) -> None:
        t = now()
        t_send = h.get("t_send")
        self.send(session.identity, {
            "t": P.STATS, "t_send": t_send if type(t_send) in (int, float) else None,
            "t_server": t, "alpha": alpha(self.all_computing, session.computing, t),
            "inferences": len(self.by_tag), "devices": len(self.sessions),
            "threads": self.rt.threads, "server_flops": self.flops.value,
            "computing": len(self.computing), "others": self.others(session, t)})

    # ------------------------------------------------------------------ inferences

    def _start_computing(self, si: ServedInference) -> None:
        t = now()
        si.t_inputs = t
        si.computing = True
        if self.computing:
            si.contended = True
            for other in self.computing:
                other.contended = True
        self.computing.add(si)
        self.all_computing.add(1, t)
        si.session.computing.add(1, t)

    def _stop_computing(self, si: ServedInference) -> None:
        if si.computing:
            t = now()
            si.computing = False
            self.computing.discard(si)
            self.all_computing.add(-1, t)
            si.session.computing.add(-1, t)

    def on_reports(self, reports) -> None:
        ready: dict[int, list[int]] = {}
        done: list[int] = []
        for tag, kind, tile in reports:
            if kind == REPORT_TILE:
                ready.setdefault(tag, []).append(tile)
            elif kind == REPORT_DONE:
                done.append(tag)
        for tag, tiles in ready.items():
            si = self.by_tag.get(tag)  # None: freed meanwhile
            if si is not None:
                self._send_results(si, tiles)
        for tag in done:
            si = self.by_tag.get(tag)
            if si is None:
                continue
            why = si.native.failure()
            if why is not None:  # the device finishes alone at once instead of timing out
                log.warning("inference %r of device %s failed: %s", si.inf_id, si.session.name, why)
                self.send(si.session.identity, {"t": P.ERROR, "code": P.E_INTERNAL, "inf": si.inf_id,
                                                "text": f"the server's inference failed: {why}"})
                self._free(si, "failed")
            else:
                self._send_results(si, si.unsent_outputs())

    def _send_results(self, si: ServedInference, tiles) -> None:
        """One RESULT with every given output tile not sent yet; DONE when none is left."""
        info = si.entry.info
        ids = np.unique(np.asarray(tiles, dtype=np.int32))
        ids = ids[(info.output_mask[ids] == 1) & ~si.sent[ids]]
        if ids.size:
            session = si.session
            self._reap(session)
            # an inference's own results always fit (else a model with larger outputs could
            # never run); what is still queued from earlier ones may not exceed the limit
            if session.unsent_bytes > self.limits.results_per_device and \
                    session.unsent_before(si.tag) + self.orphaned_bytes(session.owner) > \
                    self.limits.results_per_device:
                self._drop_results(si)
                return
            t_out = now()
            try:
                if si.result_enc is None:
                    payload = P.tile_frames(ids, si.native.get_tiles(ids))
                else:
                    lens, data = si.native.get_tiles_encoded(si.result_enc, ids)
                    payload = P.tile_frames(ids, lens=lens, encoded=data)
            except CoactoError as e:
                log.warning("inference %r of device %s: reading output tiles failed: %s",
                            si.inf_id, si.session.name, e)
                return
            si.sent[ids] = True
            si.n_sent += int(ids.size)
            self.counts["results"] += 1
            header = {"t": P.RESULT, "inf": si.inf_id, "ts": t_out}
            if si.result_enc is not None:
                header["enc"] = si.result_enc
            self._send_tracked(session, header, payload, si.tag)
            if si.trace is not None:
                si.trace.add(ids, t_out, now(), P.TRACE_RETURNED)
        if si.n_sent == info.n_outputs:
            self._finish(si)

    def _send_tracked(self, session: Session, header: dict, frames, tag: int) -> None:
        """Sends frames whose bytes count against the device's result high-water mark until
        ZeroMQ has put them on the wire."""
        nbytes = sum(f.nbytes if isinstance(f, np.ndarray) else len(f) for f in frames)
        tracker = self.send(session.identity, header, *frames, track=True)
        if tracker is not None:
            session.track(tracker, nbytes, tag)
            self.unsent_bytes += nbytes

    def _drop_results(self, si: ServedInference) -> None:
        """The device does not read its results: end its inference rather than queue more."""
        session = si.session
        self.counts["results_dropped"] += 1
        log.warning("device %s has %.0f MiB of results it does not read (limit %.0f MiB): "
                    "inference %r dropped", session.name, session.unsent_bytes / 2**20,
                    self.limits.results_per_device / 2**20, si.inf_id)
        self.send(session.identity, {
            "t": P.ERROR, "code": P.E_RESULTS_DROPPED, "inf": si.inf_id,
            "limit": "results_per_device",
            "text": f"results dropped: {session.unsent_bytes} bytes of earlier results are still "
                    f"queued for this device (limit {self.limits.results_per_device}); read "
                    f"RESULT messages as they come"})
        self._free(si, "results not read")

    def _finish(self, si: ServedInference) -> None:
        t = now()
        info = si.entry.info
        st = si.native.stats()
        compute_s = t - si.t_inputs if si.t_inputs is not None else None
        # The rate from the time its threads were on the inference, not from the last input:
        # streamed inputs let the server compute most of the graph before the last one arrives
        # (ResNet-50 at 200 Mbit/s: a 58 ms tail of 72 ms of work), and a device that sent
        # tiles of its own leaves it less to compute. A server that computed little of the graph
        # measured its per-tile overheads more than its speed.
        flops_here = float(si.entry.tg.plan.tile_flops[si.native.computed_mask()].sum())
        busy = st["busy_seconds"]
        if busy > 0 and flops_here >= MIN_FLOPS_SHARE * info.total_flops and not si.contended:
            self.flops.record(si.entry, flops_here, busy)
        self.counts["inferences_done"] += 1
        self._send_trace(si)  # before DONE: a device that sees DONE first expects no TRACE
        self.send(si.session.identity, {
            "t": P.DONE, "inf": si.inf_id, "seconds": t - si.t_begin, "compute_s": compute_s,
            "busy_s": busy, "server_flops": self.flops.for_graph(si.entry),
            "tiles_computed": st["tiles_computed"], "tiles_external": st["tiles_external"],
            "duplicates": si.duplicates})
        self._free(si, "done")

    def _send_trace(self, si: ServedInference) -> None:
        if si.trace is None:
            return
        try:
            header, frames = si.trace.message(si, now())
        except CoactoError as e:  # the trace is a diagnostic: never fail the inference for it
            log.warning("inference %r of device %s: no trace (%s)", si.inf_id, si.session.name, e)
            return
        self._send_tracked(si.session, header, frames, si.tag)

    def _free(self, si: ServedInference, why: str) -> None:
        self._stop_computing(si)
        self.fed.discard(si)
        session = si.session
        if session.inferences.get(si.inf_id) is si:
            del session.inferences[si.inf_id]
            session.recent_freed.append(si.inf_id)
        if self.by_tag.pop(si.tag, None) is not None:
            need = si.entry.info.inference_bytes
            self.inference_bytes -= need
            _decrement(self.owner_inferences, session.owner)
            _decrement(self.owner_bytes, session.owner, need)
            self.freed_since_trim += 1
        si.native.close()  # cancels its tiles and waits for those running
        log.debug("inference %r of device %s freed (%s)", si.inf_id, session.name, why)
