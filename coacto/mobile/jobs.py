"""One inference as the communication engine tracks it: its plan, its TILES batches, its counters
and the statistics it reports."""
from __future__ import annotations

import collections

from concurrent.futures import Future

import numpy as np

from .. import protocol as P
from ..inference import now
from . import policies

MAX_BATCH_TILES = 4096
#: Tiles queued after the inputs wait up to this long for company before they are sent (unless a
#: full batch is queued): tiles trickle out of the computing threads one by one, and a message per
#: tile would cost more CPU than the tiles' copies. The ECT rule is told (as extra RTT).
COALESCE_S = 0.001


class Job:
    """An inference submitted to a Client: its Future, plan, native inference and counters.
    Written by the engine thread only (the app thread creates it and waits on ``future``)."""

    def __init__(self, job_id: int, feeds: dict, policy: str, options: dict, t_submit: float,
                 trace=None):
        self.id = job_id
        self.future: Future = Future()
        self.feeds = feeds  # until it ends (Engine._after_stall may start it again)
        self.policy = policy
        self.options = options
        self.t_submit = t_submit
        self.t_start: float | None = None
        self.plan = None
        self.tg = None  # the tile graph it runs on (Engine.tg, or Engine.local_tg when local)
        self.native = None
        # server side
        self.waiting = False            # not started: waits for the server to plan (split / fl)
        self.deadline: float | None = None  # fall back if no server by then
        self.attached = False           # BEGIN sent on connection `epoch`
        self.epoch = 0
        self.sending = False
        self.decides = False            # the plan has SEND_DECIDE tiles (dynamic)
        self.fallback = False
        self.fallback_reason: str | None = None
        self.server_done = False
        self.skipped: str | None = None  # why a dynamic inference did not use the server
        self.explores = False  # offloads although the gate predicted the device faster
        self.done = False
        self.begin_released = False     # BEGIN left for the server (CANCEL it if we win)
        self.server_report: dict | None = None
        self.t_begin: float | None = None
        self.last_news = 0.0
        # inputs and the ECT parameters
        self.inputs_to_send = 0
        self.input_bytes = 0
        self.input_batch: int | None = None
        self.local_parked = False        # local work waits for the inputs to leave (dynamic)
        self.resume_at: float | None = None
        self.resume_on_release = True    # unpark when the last input batch leaves
        self.kept_work = False           # computes from the start: the server is shared
        self.t_stalled: float | None = None  # the link stalled then (Engine._after_stall)
        self.acked_at_stall = 0
        self.restarted_from = None       # the offloading plan a restart left (_after_stall)
        self.natives = 0                 # native inferences started (tags tell them apart)
        self.whole_bytes = 0             # send nothing before this many raw bytes were queued
        self.inputs_at_server: float | None = None
        # counters
        self.batches = 0
        self.inflight: dict[int, int] = {}
        self.queued_since: float | None = None  # tiles wait for company (engine.COALESCE_S)
        self.unacked = 0
        self.t_first_batch: float | None = None  # the first TILES batch handed to the link
        self.bytes_handed = 0            # TILES bytes handed to the link, and acknowledged
        self.bytes_acked = 0
        self.ack_log = collections.deque(maxlen=64)  # (time, bytes_acked) at its ACKs
        self.native_closing = False      # its native inference was handed to the reaper
        self.bytes_sent = 0
        self.bytes_received = 0
        self.tiles_sent = 0
        self.tiles_from_server = 0
        self.trace = trace               # a trace.TraceRecord when this inference is traced
        self.measures_wire = False       # the runtime sums its tiles' encoded bytes per layer

    def take_batch(self, max_bytes: int, is_input: np.ndarray, goodput):
        """The frames of the next TILES message (up to ``max_bytes`` of queued tiles, shallowest
        first; one tile alone if it is larger), or None while there is nothing to send or the
        queued tiles wait for company (COALESCE_S)."""
        native = self.native
        queued = native.queued_bytes()
        if queued <= 0:
            self.queued_since = None
            return None
        if self.whole_bytes:  # cloud / split: the whole tensor in one message, once all is here
            if native.stats()["bytes_sent_raw"] < self.whole_bytes:
                return None
            self.whole_bytes = 0
            max_bytes = max(max_bytes, queued)
        if queued < max_bytes and not self.inputs_to_send:
            t = now()
            if self.queued_since is None:
                self.queued_since = t
            if t < self.queued_since + COALESCE_S:
                return None
        self.queued_since = None
        header = {"t": P.TILES, "inf": self.id, "batch": self.batches + 1, "t_send": 0.0}
        if native.transfer != "raw":
            enc, ids, lens, data = native.take_sends_encoded(min(queued, max_bytes),
                                                             MAX_BATCH_TILES)
            if ids.size == 0:
                return None
            header["enc"] = enc
            payload = P.tile_frames(ids, lens=lens, encoded=data)
        else:
            ids, data = native.take_sends(min(queued, max_bytes), MAX_BATCH_TILES)
            if ids.size == 0:
                return None
            payload = P.tile_frames(ids, data)
        t = now()
        self.batches += 1
        batch = self.batches
        header["t_send"] = t
        frames = P.pack(header, *payload)
        nbytes = len(frames[0]) + sum(a.nbytes for a in payload)
        goodput.sent((self.id, batch), nbytes, t)
        if self.trace is not None:
            self.trace.handed(batch, ids, nbytes, t)
        self.inflight[batch] = nbytes
        self.unacked += nbytes
        if self.t_first_batch is None:
            self.t_first_batch = t
        self.bytes_handed += nbytes
        if self.inputs_to_send:
            self.inputs_to_send -= int(is_input[ids].sum())
            if self.inputs_to_send <= 0:
                self.input_batch = batch
        return frames

    def complete(self, outputs: dict, stats: dict) -> None:
        self.future.stats = stats
        if not self.future.done():
            self.future.set_result(outputs)

    def fail(self, exc: BaseException) -> None:
        if self.native is not None:
            self.native.close()
        if not self.future.done():
            self.future.set_exception(exc)


def output_tile_count(tg) -> int:
    first = tg.plan.layer_first_tile
    return int(sum(first[li + 1] - first[li] for li in set(tg.graph.outputs.values())))


def job_stats(job: Job, native: dict, t: float, engine) -> dict:
    """The per-inference record: Client.last_stats, `coacto-client --json`."""
    # a restarted inference reports the plan it was offloaded with (its frontier, prediction)
    plan = job.restarted_from or job.plan
    n_out = output_tile_count(job.tg)
    if job.tiles_from_server >= n_out:
        finished_by = "server"
    elif job.tiles_from_server == 0:
        finished_by = "device"
    else:
        finished_by = "both"
    stats = {
        "latency_s": t - job.t_submit,
        "policy": job.policy,
        "tiles_total": native["tiles_total"],
        "tiles_local": native["tiles_computed"],
        "tiles_sent": job.tiles_sent,
        "tiles_from_server": job.tiles_from_server,
        "tiles_dropped": native["tiles_dropped"],
        "bytes_sent": job.bytes_sent,
        "bytes_received": job.bytes_received,
        # the tiles' data alone, as float32 and as encoded for the wire
        "tile_bytes_raw": native["bytes_sent_raw"],
        "tile_bytes_wire": native["bytes_sent"],
        "transfer": job.native.transfer if job.native is not None else "raw",
        "batches": job.batches,
        "offloaded": job.t_begin is not None,
        "fallback": job.fallback,
        "fallback_reason": job.fallback_reason,
        "server_skipped": job.skipped,
        "finished_by": finished_by,
        "reconnects": engine.reconnects,
        "wait_s": (job.t_start - job.t_submit) if job.t_start is not None else None,
        "inputs_at_server_s": (job.inputs_at_server - job.t_begin)
        if job.inputs_at_server is not None and job.t_begin is not None else None,
        "split_layer": plan.split_layer if job.policy in ("split", "fl") else None,
    }
    stats.update(engine.est.snapshot())
    if job.policy in ("split", "fl"):
        stats.update({k: (float(v) if isinstance(v, (float, np.floating)) else v)
                      for k, v in plan.info.items()})
    if job.policy == "dynamic":
        # which plan dynamic chose (docs/SCHEDULER.md) and what it predicted
        stats["frontier"] = "device" if job.skipped else policies.frontier(plan)
        stats["predicted_s"] = float(plan.info["predicted_s"]) if "predicted_s" in plan.info \
            else None
        stats["kept_work"] = job.kept_work  # the server was shared: nothing parked
        stats["explored"] = job.explores  # offloaded although the gate predicted local faster
        stats["restarted"] = job.restarted_from is not None  # on the local graph, the link stalled
    if job.server_report:
        stats["server"] = job.server_report
    return stats
