"""A simulated device: its computing threads, its client's communication engine, its link.

The engine's decisions are the real client's (coacto/mobile/engine.py), and where the engine's
code is pure Python it is *called*, not copied: planning (``Engine._plan`` -> policies.make_plan),
the gate that keeps a dynamic inference local when no split could win (``_local_is_faster``),
parking local work while the input goes out (``_park_local``) and the ECT parameters pushed to the
runtime (``_push_params``) all run on this object, which carries the attributes they read (``est``,
``tg``, ``link.backlog_bytes``, ``_gated``). The estimates are coacto.mobile.estimates.Estimates,
fed with simulated ACKs and heartbeats. What the engine does through the native runtime or
ZeroMQ is modelled here: the send queue (shallowest depth bucket first), TILES batches up to the
engine's batch size inside its send window, inputs first, ``send_whole`` plans in one message,
the coalescing delay, ACK handling, RESULTs completing tiles, CANCEL when the device wins, the
fallback after ``timeout`` seconds without news.

The engine's own CPU time (coacto.sim.profiles.DeviceCosts, measured by `coacto profile
--engine`) is charged when costs are given: starting an inference (the plan, the native
inference) before its inputs are set, every message it hands to the link (per message and byte)
before the link takes it, every message it takes in before it acts on it, the runtime's wake-ups
(a tile queued for sending) and finishing an inference before the latency ends. Those tasks run
one at a time on the device's CPU (coacto.sim.cpu) with priority over the computing threads,
inside the device's quota. Without costs the engine is free and instantaneous, as before.

Not modelled: the handshake and the model upload (the session is ready when the simulation
starts; the RTT estimate starts at the true RTT); the goodput probe is sent when asked for.
"""
from __future__ import annotations

import collections
import logging

import numpy as np

from .. import protocol as P
from ..inference import SEND_ALWAYS, SEND_DECIDE, SEND_NEVER
from ..mobile import policies
from ..mobile.engine import WINDOW_S, Engine, batch_bytes
from ..mobile.estimates import Estimates
from ..mobile.jobs import COALESCE_S, MAX_BATCH_TILES, Job
from ..mobile.session import TrainStamps
from . import rule
from .cores import Cores, TileState
from .graph import POOL_DEPTH_BUCKETS, SimGraph
from .link import Link, Msg

log = logging.getLogger(__name__)

#: msgpack sizes of the control messages the simulator sends (headers only, no frames)
_CONTROL_BYTES = {kind: len(P.pack(h)[0]) for kind, h in {
    P.BEGIN: {"t": P.BEGIN, "inf": 1, "graph_id": "0" * 64},
    P.CANCEL: {"t": P.CANCEL, "inf": 1},
    P.HEARTBEAT: {"t": P.HEARTBEAT, "t_send": 1.0},
}.items()}


def tiles_header_bytes(inf: int, batch: int) -> int:
    return len(P.pack({"t": P.TILES, "inf": inf, "batch": batch, "t_send": 1.0})[0])


class DeviceNative:
    """What the engine sees of a native inference (NativeInference): the tile state, the plan's
    send mask with the C send rule, the send queue and the ECT parameters."""

    def __init__(self, device: "SimDevice", job: Job, plan: policies.Plan):
        self.device = device
        self.job = job
        g = device.g
        decides = self._on_local_complete if plan.send is not None else None
        # work the device does alone runs on its local graph (SimDevice, local_speedup)
        scale = 1.0 / device.local_speedup if job.local_graph else 1.0
        self.ts = TileState(device.cores, g, local=plan.local, on_local_complete=decides,
                            on_done=self._on_done, tag=job.id, scale=scale)
        self.send = None if plan.send is None else np.asarray(plan.send).tolist()
        self.params = rule.OffloadParams()
        self.queue = [collections.deque() for _ in range(POOL_DEPTH_BUCKETS)]
        self.queued = 0
        self.tiles_queued = 0
        self.decisions: list[tuple] = []

    # the NativeInference methods the engine's code calls
    def queued_bytes(self) -> int:
        return self.queued

    def set_offload_params(self, bandwidth, rtt, inputs_at_server, server_flops, alpha=1.0) -> None:
        self.params.set(bandwidth, rtt, inputs_at_server, server_flops, alpha)

    def compute_all(self, t: float, rest_last: bool = False) -> None:
        self.ts.compute_all(t, rest_last)

    def _on_local_complete(self, tile: int, t: float) -> None:
        mode = self.send[tile]
        if mode == SEND_NEVER:
            return
        g = self.device.g
        nbytes = self.device.nbytes_list[tile]
        if mode == SEND_DECIDE:
            sent, off, srv = rule.decide(self.params, t, self.queued, nbytes, g.work[tile])
            self.decisions.append((tile, sent, t, off, srv))
            if not sent:
                return
        elif mode != SEND_ALWAYS:
            return
        self.queue[g.bucket[tile]].append(tile)
        self.queued += nbytes
        self.tiles_queued += 1
        self.device.wake(t, from_runtime=True)

    def take(self, max_tiles: int, max_bytes: int) -> list[int]:
        """coacto_inference_take_sends: shallowest first, stop at the first tile that does not
        fit."""
        ids, used, nb = [], 0, self.device.nbytes_list
        for q in self.queue:
            while q and len(ids) < max_tiles:
                t = q[0]
                if used + nb[t] > max_bytes:
                    return ids
                q.popleft()
                ids.append(t)
                used += nb[t]
                self.queued -= nb[t]
            if len(ids) >= max_tiles:
                break
        return ids

    def _on_done(self, t: float) -> None:
        dev = self.device
        if dev.costs is None:
            dev.loop.at(t, dev.finish, self.job)
        else:  # REPORT_DONE wakes the engine, which finishes the inference
            dev.cpu.run(dev.costs.finish(self.job.policy), dev.finish, self.job)


class SimDevice:
    """One device (see the module text)."""

    def __init__(self, sim, index: int, *, threads: int, durations, uplink_trace,
                 downlink_trace, rtt: float, bandwidth0: float, device_flops: float,
                 server_flops: float, timeout: float, heartbeat_s: float, cpu=None,
                 costs=None, device_flops_fixed: bool = False, probe: bool = False,
                 burst_bytes: float = 0.0, wire=None, local_speedup: float = 1.0):
        self.sim = sim
        self.loop = sim.loop
        self.index = index
        self.tg = sim.tg
        # A real client computes what it does alone on a second graph cut for its threads
        # (Engine.local_tg): here the same tiles, each local_speedup times faster (the
        # offloading graph's time over the local graph's, as `coacto profile` measures it)
        self.local_tg = sim.tg
        self.local_speedup = float(local_speedup)
        if not self.local_speedup > 0:
            raise ValueError(f"local_speedup must be positive, got {local_speedup!r}")
        self.g: SimGraph = sim.g
        # the transfer encoding's bytes per raw byte, per layer (None: raw floats): each tile
        # takes its layer's share on the wire, and the planners price cuts with it
        self.wire = None if wire is None else np.asarray(wire, dtype=np.float64)
        self.nbytes = self.g.nbytes if self.wire is None else np.maximum(
            1, np.round(self.g.nbytes * self.wire[self.tg.plan.tile_layer])).astype(np.int64)
        self.nbytes_list = self.nbytes.tolist()
        self.lens_bytes = 0 if self.wire is None else 4  # the encoded lengths' frame, per tile
        self.cpu = cpu
        self.costs = costs  # coacto.sim.profiles.DeviceCosts, or None: the engine is free
        self.cores = Cores(self.loop, threads, durations, name=f"device {index}", cpu=cpu)
        self.timeout = float(timeout)
        self.heartbeat_s = float(heartbeat_s)
        self.rtt = float(rtt)
        # the estimates as the session leaves them after the handshake (module text)
        self.est = Estimates(bandwidth0)
        self.est.rtt.sample(self.rtt)
        self.est.server_flops = float(server_flops)
        self.est.server_flops_known = True
        self.est.on_local_run(self.tg.total_flops, self.tg.total_flops / device_flops)
        if not device_flops_fixed:  # Client.calibrate: each graph's rate, and their ratio
            self.est.on_local_run(self.tg.total_flops,
                                  self.tg.total_flops / (device_flops * self.local_speedup),
                                  local_graph=True)
            self.est.graph_ratio = 1.0 / self.local_speedup
        # Client(device_flops=F) keeps F (the experiments' device driver passes its calibration)
        self.est._device_fixed = bool(device_flops_fixed)
        self._probe = probe  # the session's goodput probe after the handshake
        self.link = Link(self.loop, uplink_trace, rtt / 2, on_release=self._on_released,
                         on_arrive=self._arrive_at_server, tiles_kind=P.TILES,
                         burst_bytes=burst_bytes)
        self.downlink = Link(self.loop, downlink_trace, rtt / 2, on_arrive=self._receive,
                             burst_bytes=burst_bytes)
        self._gated = 0
        self._gate_key, self._gate_verdict = None, (0.0, 0.0)
        self._planned = 0
        self._outcomes = 0  # (Engine._learn_outcome)
        self._last_probe: float | None = None
        self._probes: set = set()  # keys of the probe train in flight
        self._train_stamps = TrainStamps()
        self._trains = 0
        self.jobs: dict[int, Job] = {}
        self.outbox: collections.deque = collections.deque()
        self._pump_due = False
        self.records: list[dict] = []
        self.todo: collections.deque = collections.deque()  # (policy, options) per inference
        self.policy = "dynamic"
        self.options: dict = {}
        self._ids = 0
        self.closed = False
        self._sending = False  # the engine is handing a message to the link (costs only)

    @property
    def remaining(self) -> int:
        return len(self.todo)

    def _engine(self, cost: float, fn, *args) -> None:
        """``fn(*args)`` once the engine thread has spent ``cost`` CPU seconds on it (its
        tasks run one after the other, before the computing threads' tiles); at once when the
        engine's costs are not modelled."""
        if self.costs is None:
            fn(*args)
        else:
            self.cpu.run(cost, fn, *args)

    # ------------------------------------------------------------------ inferences

    def start(self, sequence, t0: float) -> None:
        """Runs ``sequence`` ([(policy, inferences, options), ...]) back to back from ``t0``,
        as one Client whose estimates carry over."""
        for policy, n, options in sequence:
            self.todo.extend([(policy, dict(options or {}))] * int(n))
        self.loop.at(t0, self._submit)
        if any(p != "local" for p, _ in self.todo):
            if self._probe:
                self.loop.at(t0, self._send_probe)
            # the handshake's heartbeat was just answered: the next one is due
            self.loop.at(t0 + self.heartbeat_s, self._heartbeat)

    def _submit(self) -> None:
        if not self.todo:
            return
        self.policy, self.options = self.todo.popleft()
        t = self.loop.now
        self._ids += 1
        job = Job(self._ids, None, self.policy, self.options, t)
        self.jobs[job.id] = job
        self._engine(0.0 if self.costs is None else self.costs.start(self.policy),
                     self._admit, job)

    def _admit(self, job: Job) -> None:
        """Engine._admit: the plan from the estimates now, then the native inference; what the
        device does alone (Engine._start_local) runs on its local graph."""
        replay = job.options.get("frontier")
        job.local_graph = True
        if job.policy == "local":
            plan = policies.plan_local(self.tg)
        elif job.policy == "dynamic" and replay == "device":
            # a recorded inference the real engine's gate kept on the device, replayed
            job.options = {}
            job.skipped = "replayed: the recorded inference ran on the device"
            plan = policies.plan_local(self.tg)
        elif job.policy == "dynamic" and replay is None and Engine._local_is_faster(self, job):
            plan = policies.plan_local(self.tg)
        else:
            job.local_graph = False
            plan = Engine._plan(self, job)
        self._start_native(job, plan, self.loop.now)

    def _start_native(self, job: Job, plan: policies.Plan, t: float) -> None:
        job.plan = plan
        native = DeviceNative(self, job, plan)
        job.native = native
        g = self.g
        if plan.uses_server:
            send = np.asarray(plan.send)
            job.inputs_to_send = int((send[g.is_input] == SEND_ALWAYS).sum())
            job.input_bytes = int(self.nbytes[g.is_input & (send == SEND_ALWAYS)].sum())
            job.decides = bool((send == SEND_DECIDE).any())
            if plan.info.get("send_whole"):
                job.whole_bytes = int(self.nbytes[send == SEND_ALWAYS].sum())
        job.t_start = t
        if plan.info.get("local_after_inputs") or plan.info.get("park_rest"):
            if plan.info.get("park_rest"):
                Engine._park_rest(self, job)
            else:
                Engine._park_local(self, job)
            if job.resume_at is not None:
                self.loop.at(job.resume_at, self._resume_timer, job)
        if plan.uses_server:
            job.attached, job.epoch, job.deadline = True, 0, None
            job.t_begin = job.last_news = t
            job.sending = True
            self.outbox.append(Msg(P.BEGIN, _CONTROL_BYTES[P.BEGIN], job))
            Engine._push_params(self, job, t)
            self.loop.at(t + self.timeout, self._watch, job)
        native.ts.set_inputs(t)
        self.wake(t)

    def _resume_timer(self, job: Job) -> None:
        if job.local_parked and job.resume_at is not None and self.loop.now >= job.resume_at:
            self._resume_local(job)

    def _resume_local(self, job: Job) -> None:
        job.local_parked = False
        if not job.done:  # as Engine._resume_local: a share's or a cut's own tiles first
            job.native.compute_all(self.loop.now, rest_last=policies.rest_comes_last(job.plan))

    _keeps_work = Engine._keeps_work  # the engine's own, calling the _resume_local above

    def _watch(self, job: Job) -> None:
        """The engine's silence check: nothing heard about the inference for ``timeout``."""
        if job.done or job.fallback:
            return
        due = job.last_news + self.timeout  # the time this was scheduled for, to the bit
        if self.loop.now >= due:
            self._fallback(job, f"nothing heard about this inference for {self.timeout:g} s")
        else:
            self.loop.at(due, self._watch, job)

    def _fallback(self, job: Job, reason: str) -> None:
        log.debug("device %d inference %d falls back: %s", self.index, job.id, reason)
        job.fallback, job.fallback_reason = True, reason
        job.sending = False
        job.native.set_offload_params(0.0, 0.0, 0.0, 1.0, 1.0)
        job.native.compute_all(self.loop.now)

    def finish(self, job: Job) -> None:
        if job.done:
            return
        t = self.loop.now
        del self.jobs[job.id]
        job.done = True
        native = job.native
        for m in self.link.drop(job, (P.BEGIN, P.TILES), t):
            if m.kind == P.TILES:
                self.est.goodput.forget((job.id, m.data["batch"]))
        if job.begin_released and not job.server_done:
            self.outbox.append(Msg(P.CANCEL, _CONTROL_BYTES[P.CANCEL], job))
        native.ts.cancel()
        ts = native.ts
        if ts.computed == self.g.n_computable:  # as Engine._finish learns the device's rate
            self.est.on_local_run(self.tg.total_flops, ts.t_end - ts.t_start,
                                  local_graph=job.local_graph,
                                  latency=t - job.t_start if job.t_start is not None else None)
        Engine._learn_outcome(self, job, t)
        self.records.append(self._record(job, t))
        self.wake(t)
        if self.remaining > 0:
            self.loop.at(t, self._submit)

    def _record(self, job: Job, t: float) -> dict:
        ts = job.native.ts
        n_out = len(self.g.outputs)
        finished_by = ("server" if job.tiles_from_server >= n_out
                       else "device" if job.tiles_from_server == 0 else "both")
        plan = job.plan
        return {
            "device": self.index, "inference": job.id, "policy": job.policy,
            "t_submit": job.t_submit, "t_end": t, "latency_s": t - job.t_submit,
            "tiles_local": ts.computed, "tiles_from_server": job.tiles_from_server,
            "tiles_sent": job.tiles_sent, "bytes_sent": job.bytes_sent,
            "bytes_received": job.bytes_received, "batches": job.batches,
            "fallback": job.fallback, "fallback_reason": job.fallback_reason,
            "server_skipped": job.skipped, "finished_by": finished_by,
            "offloaded": plan.uses_server,
            "split_layer": plan.split_layer if job.policy in ("split", "fl") else None,
            "frontier": "device" if job.skipped else policies.frontier(plan),
            "predicted_s": plan.info.get("predicted_s"),
            "estimates": self.est.snapshot(),
            "_trace": (ts.t0, ts.t1, ts.worker),
            "_job": job,
        }

    # ------------------------------------------------------------------ sending

    def wake(self, t: float, from_runtime: bool = False) -> None:
        """The engine wakes (a tile was queued, a message left, an ACK came): pump at once.
        With costs, a wake-up by the runtime (REPORT_SEND) costs the engine a loop round."""
        if self._pump_due:
            return
        self._pump_due = True
        if self.costs is not None and from_runtime:
            self.cpu.run(self.costs.wake(), self._pump)
        else:
            self.loop.at(t, self._pump)

    def _pump(self) -> None:
        self._pump_due = False
        t = self.loop.now
        if self.costs is not None:
            # one message at a time: taken now, handed to the link when the engine has spent
            # its cost (the next one is chosen then)
            if self._sending:
                return
            msg = self.outbox.popleft() if self.outbox else self._next_batch(t)
            if msg is not None:
                self._sending = True
                self.cpu.run(self.costs.send(msg.nbytes), self._hand_over, msg)
            return
        while True:
            msg = self.outbox.popleft() if self.outbox else self._next_batch(t)
            if msg is None:
                break
            self.link.send(msg, t)

    def _hand_over(self, msg: Msg) -> None:
        self._sending = False
        job = msg.job
        if not (job is not None and job.done and msg.kind in (P.BEGIN, P.TILES)):
            if msg.kind == P.TILES:  # packed: to the socket now (Engine._on_sent)
                self.est.goodput.handed((job.id, msg.data["batch"]), self.loop.now)
            self.link.send(msg, self.loop.now)
        elif msg.kind == P.TILES:  # its inference finished while the engine packed it
            self.est.goodput.forget((job.id, msg.data["batch"]))
        self._pump()

    def _next_batch(self, t: float) -> Msg | None:
        """Engine._next_batch: the oldest inference's next batch while the window allows."""
        b = self.est.bandwidth
        size = batch_bytes(b)
        window = max(2 * size, b * max(2 * self.est.rtt.value, WINDOW_S))
        if self.est.goodput.inflight_bytes >= window:
            return None
        for job in self.jobs.values():
            if job.attached and job.sending:
                msg = self._take_batch(job, size, t)
                if msg is not None:
                    return msg
        return None

    def _take_batch(self, job: Job, max_bytes: int, t: float) -> Msg | None:
        """Job.take_batch on the simulated send queue."""
        native = job.native
        queued = native.queued
        if queued <= 0:
            job.queued_since = None
            return None
        if job.whole_bytes:
            if queued < job.whole_bytes:
                return None
            job.whole_bytes = 0
            max_bytes = max(max_bytes, queued)
        if queued < max_bytes and not job.inputs_to_send:
            if job.queued_since is None:
                job.queued_since = t
            if t < job.queued_since + COALESCE_S:
                due = job.queued_since + COALESCE_S
                self.loop.at(due, self.wake, due)
                return None
        job.queued_since = None
        ids = native.take(MAX_BATCH_TILES, (min(queued, max_bytes) // 4) * 4)
        if not ids:  # the next tile alone is larger than a batch: it goes alone
            ids = native.take(1, queued)
            if not ids:
                return None
        job.batches += 1
        batch = job.batches
        data = int(sum(self.nbytes_list[i] for i in ids))
        nbytes = tiles_header_bytes(job.id, batch) + (4 + self.lens_bytes) * len(ids) + data
        self.est.goodput.sent((job.id, batch), nbytes, t)
        job.inflight[batch] = nbytes
        job.unacked += nbytes
        if job.inputs_to_send:
            job.inputs_to_send -= int(sum(1 for i in ids if self.g.is_input[i]))
            if job.inputs_to_send <= 0:
                job.input_batch = batch
        return Msg(P.TILES, nbytes, job, {"batch": batch, "ids": ids, "inf": job.id})

    def _heartbeat(self) -> None:
        if self.closed:
            return
        t = self.loop.now
        self.outbox.append(Msg(P.HEARTBEAT, _CONTROL_BYTES[P.HEARTBEAT], None, {"t_send": t}))
        self.wake(t)
        self.loop.at(t + self.heartbeat_s, self._heartbeat)

    def _on_released(self, msg: Msg, t: float) -> bool:
        """Engine._on_sent: the link released a message; False drops it."""
        job = msg.job
        if job is None:
            return True
        if msg.kind == P.TILES:
            key = (job.id, msg.data["batch"])
            if job.done:
                self.est.goodput.forget(key)
                return False
            self.est.goodput.booked(key, t)
            job.tiles_sent += len(msg.data["ids"])
            if job.local_parked and job.resume_on_release and msg.data["batch"] == job.input_batch:
                self._resume_local(job)
        elif msg.kind == P.BEGIN and job.done:
            return False
        job.bytes_sent += msg.nbytes
        if msg.kind == P.BEGIN:
            job.begin_released = True
        self.wake(t)
        return True

    def _arrive_at_server(self, msg: Msg) -> None:
        self.sim.server.receive(self, msg, self.loop.now)

    def _wire(self):
        """Engine._wire: the per-layer wire ratios the planners price with."""
        return self.wire

    def _clock(self) -> float:
        return self.loop.now

    def _probe_if_stale(self) -> None:
        Engine._probe_if_stale(self)

    def _unseen(self, job: Job) -> tuple[str, ...]:
        return Engine._unseen(self, job)

    def _send_probe(self, after_burst: int = 0) -> None:
        """Session._make_probe: a train of HEARTBEATs padded to 20 ms of the assumed goodput each
        (24-256 kB), handed over back to back; their STATS are taken as ACKs."""
        from ..mobile.session import PROBE_TRAIN, probe_size

        if self._probes:  # one train at a time
            return
        size = probe_size(self.est.bandwidth, after_burst)
        t = self.loop.now
        self._trains += 1
        self._train_stamps.start(self._trains, size)
        for i in range(PROBE_TRAIN):
            key = ("probe", 0, self._trains, i)
            self._probes.add(key)
            self.est.goodput.sent(key, size, t)
            self.outbox.append(Msg(P.HEARTBEAT, _CONTROL_BYTES[P.HEARTBEAT] + size, None,
                                   {"t_send": t, "probe": key}))
        self.wake(t)

    # ------------------------------------------------------------------ receiving

    def _receive(self, msg: Msg) -> None:
        if self.costs is None:
            self._handle(msg)
        else:
            self.cpu.run(self.costs.recv(msg.kind, msg.nbytes), self._handle, msg)

    def _handle(self, msg: Msg) -> None:
        t = self.loop.now
        kind, data = msg.kind, msg.data
        job = self.jobs.get(data.get("inf")) if "inf" in data else None
        if job is not None:
            job.bytes_received += msg.nbytes
            job.last_news = t
        if kind == P.ACK:
            # one clock for both sides here: the server's stamp is ours
            sample = self.est.goodput.acked((data["inf"], data["batch"]), t, self.est.rtt.value,
                                            data["t_server"], data["t_server"])
            if sample is not None:
                self.est.rtt.sample(sample)
            if job is not None:
                job.unacked -= job.inflight.pop(data["batch"], 0)
                if data["batch"] == job.input_batch and job.inputs_at_server is None:
                    # one clock for both sides here: the server's stamp is ours
                    job.inputs_at_server = min(data["t_server"], t)
            self._refresh_params(t)
        elif kind == P.RESULT:
            if job is not None and not job.done:
                ts = job.native.ts
                accepted = sum(1 for tile in data["ids"] if ts.put_tile(tile, t))
                job.tiles_from_server += accepted
                self.cores.dispatch(t)
            # one clock for both sides here: the server's stamp is ours
            self.est.down.result(msg.nbytes, data.get("ts"), t, self.est.rtt.value)
        elif kind == P.DONE:
            if job is not None:
                job.server_done = True
        elif kind == P.STATS and data.get("probe") is not None:
            self._probes.discard(data["probe"])
            self.est.goodput.acked(data["probe"], t, self.est.rtt.value, data["t_server"],
                                   data["t_server"])
            burst = self._train_stamps.answered(data["probe"][2], data["t_server"])
            if burst:
                self._send_probe(after_burst=burst)  # Session._on_stats
        elif kind == P.STATS:
            self.est.rtt.sample(t - data["t_send"])
            flops = self.est.server_flops
            self.est.on_stats(data)
            self.est.server_flops = flops  # the per-graph rate of MODEL_READY beats the server's
            self._refresh_params(t)
        elif kind == P.ERROR:
            if "batch" in data:
                self.est.goodput.forget((data.get("inf"), data["batch"]))
            if job is not None:
                job.server_done = True
                self._fallback(job, f"server error: {data.get('text')}")
        self.wake(t)

    def _refresh_params(self, t: float) -> None:
        for job in self.jobs.values():
            if job.attached and job.decides and job.sending:
                Engine._push_params(self, job, t)
