"""The device's communication engine: one thread per Client owns the DEALER socket.

It waits on three things with one zmq.Poller: the socket, the native runtime's report queue (tiles
queued for sending, inferences done) and a wake-up pipe (work submitted, close requested). The
application's threads never touch the socket; they submit jobs and wait on Futures.

Per inference (a job) it plans (policies.py), starts the native inference, and, when the plan uses
the server, sends BEGIN and then streams the tiles the runtime queues, in TILES batches of up to
MAX_BATCH_BYTES, oldest inference first (inputs first: the native queue is ordered shallowest
first). ACKs feed the goodput and RTT estimates, which are pushed into every dynamic inference
(set_offload_params) for the C-side ECT rule; RESULTs complete the device's inference from outside.
Whichever side completes the exit tiles first wins; the loser's work is cancelled (CANCEL to the
server, or closing the native inference here).

The device always finishes (docs/ARCHITECTURE.md §5, "Faults"). Connections follow the Lazy Pirate pattern:
every request that expects an answer arms a reply timer; silence for ``timeout`` seconds, or the
TCP connection dropping, closes the socket (LINGER 0) and opens a fresh one after an exponential,
capped back-off, HELLO and model query again. Inferences attached to the lost connection finish on
the device (``compute_all``; ``fallback`` in their stats). An inference that hears nothing about
itself for ``timeout`` seconds, that finds no server within ``timeout``, or that the server answers
with ERROR, does the same; results that still come from the server are taken (exactly once).
"""
from __future__ import annotations

import collections
import logging
import math
import os
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zmq

from .. import protocol as P
from .._version import __version__
from ..errors import CoactoError, InferenceCancelled
from ..inference import REPORT_DONE, SEND_ALWAYS, SEND_DECIDE, NativeInference, ReportQueue, now
from ..native import lib
from ..partition import input_tiles, output_bytes, wire_bytes
from . import estimates, policies
from .jobs import COALESCE_S, Job, job_stats
from .link import Link
from .shaper import UNCAPPED
from .session import Session
from .trace import merged_trace, write_trace

log = logging.getLogger(__name__)

#: Parked local work waits for a server predicted this many times faster than the device,
#: and no longer than this factor times the server's predicted time.
INSURANCE_MARGIN = 1.5
#: How long a closing client's last words (CANCELs, BYE) may wait to leave.
CLOSE_LINGER_MS = 100
MAX_BATCH_BYTES = 256 << 10
MIN_BATCH_BYTES = 16 << 10
#: A batch carries about this much link time (bounded by the two sizes above).
BATCH_SECONDS = 0.004


def batch_bytes(bandwidth: float) -> int:
    """A TILES batch's size at this goodput: BATCH_SECONDS of link time, within the bounds."""
    return int(min(MAX_BATCH_BYTES, max(MIN_BATCH_BYTES, bandwidth * BATCH_SECONDS)))


#: The send window (bytes handed to the link, not yet acknowledged) covers at least this much
#: link time, and twice the RTT: enough to keep the link busy while the engine is descheduled.
WINDOW_S = 0.05
#: Inferences that measure each layer's encoded bytes: the first few, then one in this many
#: (activations' share of zeros moves little from one input to the next).
WIRE_SAMPLE_FIRST, WIRE_SAMPLE_EVERY = 3, 8
#: A parked inference's inputs more than this much of the link's time (beyond two batches)
#: behind the goodput estimate mean the link has slowed: the device computes at once.
STALL_S = 0.005
#: ... and the inputs' ACKs are watched this long after (at least two batches' time at the
#: estimate): if the rest of the inputs would not be across before the device is done, the
#: device restarts on its local graph when that is faster by this margin than going on with
#: the offloading graph (Engine._after_stall).
STALL_WATCH_S = 0.01
#: ... and a stall needs the link to have carried less than half the estimate over this many
#: batches' time (or nothing for two of them): a goodput read high is not a stall.
ACKED_WINDOW_BATCHES = 4
RESTART_MARGIN = 0.95
#: Bits of a native inference's report tag that hold its job's id; the bits above count the
#: job's native inferences, so that a report from one a restart cancelled is told apart.
TAG_JOB_BITS = 40
#: A dynamic inference skips the server when the device is predicted to finish before any split
#: point could (policies.dynamic_options with the current estimates): then not even the inputs are
#: worth their link time and CPU. Every EXPLORE_EVERY-th such inference offloads anyway, so the
#: prediction errors stay fresh (the link's goodput is probed, the server's load comes with
#: every heartbeat). Rare enough that these runs stay out of a device's p95 (docs/SCHEDULER.md,
#: Exploration): a p95 is a device's slowest 5%, and at one in 20 the explorations were exactly
#: that (four devices on a one-thread server, the small models' p95 1.1-1.2x their local one).
EXPLORE_EVERY = 50
#: One offloaded dynamic inference in this many may run a kind of plan not yet run, or one not
#: run for KIND_STALE_AFTER offloaded inferences (_unseen).
KIND_EXPLORE_EVERY = 8
KIND_STALE_AFTER = 16
#: ... and while it keeps them there the link is probed again (the session's probe train, when
#: the link is idle) once its goodput was last measured this long ago: a link that got faster is
#: seen by the next inference, not the eighth.
REPROBE_S = estimates.GOODPUT_STALE_S
#: ... and unless offloading is predicted to be at least this much faster: the predictions carry
#: errors of a few percent, and offloading costs what they leave out (the device's CPU for the
#: link, a fallback when the server goes away). A tie stays on the device.
OFFLOAD_MIN_GAIN = 0.05
#: ... or this much while the server computes for other devices too (Estimates.server_shared):
#: their bursts delay this inference in ways alpha's moving average does not foresee, and the
#: device then keeps its work (_keeps_work), so an offload costs its CPU the sends on top of
#: computing everything. Four devices on a one-thread server, the fourth (ResNet-50) offloading
#: every inference: the small models' occasional offloads took up to 1.7-2.5x their median
#: and were among their slowest (docs/SCHEDULER.md, Many devices).
SHARED_OFFLOAD_MIN_GAIN = 0.3
#: Longest poll (the loop also wakes on every event).
MAX_POLL_S = 0.5
#: A traced inference waits at most this long (and at most the client's timeout) after it
#: finished for the server's side of its trace (the TRACE reply to DONE or CANCEL).
TRACE_WAIT_S = 2.0


def verdict_stands(est, key, verdict, local_now: float | None, gain: float) -> bool:
    """Whether the gate's last verdict (Engine._local_is_faster: ``verdict`` = (local, best
    offloaded prediction, (raw prediction, kind) per kind of plan), made at ``key``,
    Estimates.planning_key) holds against the device's time ``local_now``. With the rates moved
    since by a factor of at most f (Estimates.drift), a raw prediction is within B = f^2 of what
    the cost model would say now (each of its terms is a size over one rate, or alpha times
    FLOPs over the server's rate, or a part of the RTT, which may have moved by the little
    drift allows), and its corrected value (Estimates.offloaded_s, rising with the raw one) is
    between those of raw / B and raw * B; when even those bounds leave the verdict as it was,
    the cost model need not run. On the testbed the rates moved past GATE_STEP in 14 of 40
    gated MobileNetV2 inferences at 5 and 20 Mbit/s (the device's rate is learnt from runs in
    a quota, which vary by 10-20%), 240-360 us of the engine's CPU each; at 5 Mbit/s offloading
    was predicted 1.36x slower than the device, a margin the rates then rarely cross."""
    b = est.drift(key) ** 2  # (inf before the first verdict: no key yet)
    if local_now is None or not math.isfinite(b) or not verdict[2]:
        return False
    rtt = 2.0 * abs(est.rtt.value - key[1])  # (a prediction holds up to 1.5 RTTs)
    bar = local_now * (1.0 - gain)
    low = min(est.offloaded_s(raw / b, kind) for raw, kind in verdict[2]) - rtt
    high = min(est.offloaded_s(raw * b, kind) for raw, kind in verdict[2]) + rtt
    return low >= bar or high < bar


class Engine:
    """The communication engine of one Client (see the module text)."""

    def __init__(self, *, address, tg, model_bytes, runtime, estimates, timeout, uplink=None,
                 downlink=None, on_finish=None, name=None, transfer="lossless", curve=None,
                 local_tg=None):
        self.address = address
        self.transfer = transfer  # what the device asks for; raw with a server that lacks it
        self._transfer_warned = False
        self.tg = tg
        # An inference the device computes alone runs on a graph cut for local speed (fewer,
        # larger tiles: the offloading graph's took 14-28% longer at one thread), on the same
        # packed weights (TileGraph.retiled); one that may offload runs on `tg`.
        self.local_tg = local_tg if local_tg is not None else tg
        self.rt = runtime
        self.est = estimates
        self.timeout = float(timeout)
        self.on_finish = on_finish
        name = name or f"coacto-client/{__version__} {socket.gethostname()} pid {os.getpid()}"
        self._ready_cv = threading.Condition()
        self._submissions: queue.SimpleQueue = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue = queue.SimpleQueue()  # (Future or None, last id)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="coacto-client-io", daemon=True)
        self._reaper = ThreadPoolExecutor(1, thread_name_prefix="coacto-client-reaper")
        self._ctx = zmq.Context()
        self._reports = ReportQueue(runtime)
        self._poller = zmq.Poller()
        self.link = Link(self._ctx, self._poller, self.timeout, uplink, downlink, curve)
        self.session = Session(self.link, address, tg, model_bytes, estimates, self.timeout, name,
                               on_ready=self._server_ready, on_lost=self._server_lost)
        self._jobs: dict[int, Job] = {}
        # finished traced inferences waiting for the server's TRACE: id -> (job, outputs, stats)
        self._tracing: dict[int, tuple] = {}
        self._is_input = np.zeros(tg.n_tiles, bool)
        self._is_input[input_tiles(tg)] = True
        if address:  # the planners' per-graph tables now, not in the first inference's time
            policies.prepare(tg)
        # tiles of a whole local inference (all but the inputs), per graph
        self._n_computable = {g.graph_id: g.n_tiles - len(input_tiles(g))
                              for g in (tg, self.local_tg)}
        self._gated = 0
        self._gate_key, self._gate_verdict = None, (0.0, 0.0)  # _local_is_faster's last
        self._planned = 0  # dynamic inferences planned to offload (KIND_EXPLORE_EVERY)
        self._outcomes = 0  # offloaded dynamic inferences that ended (_learn_outcome)
        self._last_probe: float | None = None
        self._wire_runs = 0
        # the emulated link's rate changes: (time on now()'s clock, bytes/s), in order; and
        # changes asked for from other threads (Client.set_bandwidth)
        self._rate_steps: collections.deque = collections.deque()
        self._rate_requests: queue.SimpleQueue = queue.SimpleQueue()

    # ------------------------------------------------------------------ other threads

    @property
    def reconnects(self) -> int:
        return self.session.reconnects

    def start(self, connect: bool) -> None:
        self.session.want = bool(connect and self.address)
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._closing:
            raise RuntimeError("closed")
        self._submissions.put(job)
        self._wake()

    def cancel(self, future=None, upto: int = 0) -> None:
        """From any thread (a signal handler too: SimpleQueue.put is reentrant): stops the
        inference whose Future is ``future``, or with None every one numbered up to ``upto``."""
        self._cancels.put((future, upto))
        self._wake()

    def schedule_rates(self, steps) -> None:
        """Before start: the emulated link changes to each (time, bytes/s) at its time."""
        self._rate_steps.extend(sorted(steps))

    def set_link_rate(self, rate: float) -> None:
        """From any thread: the emulated link changes to ``rate`` bytes/s now."""
        self._rate_requests.put(float(rate))
        self._wake()

    def _rates(self, t: float) -> None:
        while True:
            try:
                rate = self._rate_requests.get_nowait()
            except queue.Empty:
                break
            self._set_rate(rate, t)
        while self._rate_steps and self._rate_steps[0][0] <= t:
            self._set_rate(self._rate_steps.popleft()[1], t)

    def _set_rate(self, rate: float, t: float) -> None:
        log.info("the emulated link changes to %.3g Mbit/s", rate * 8 / 1e6)
        self.link.set_rate(rate, t)

    def wait_ready(self, timeout: float | None) -> bool:
        with self._ready_cv:
            if self.address and not self.session.want:
                self.session.want = True
                self._wake()
            return self._ready_cv.wait_for(lambda: self.session.ready or self._closing, timeout) \
                and self.session.ready

    def close(self, timeout: float = 10.0) -> None:
        if self._closing:
            return
        self._closing = True
        self._wake()
        if threading.current_thread() is self._thread:
            return  # closed from a Future's callback: the loop ends when the callback returns
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_submissions()  # any that raced with the loop's end
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if not self._thread.is_alive():
            self._ctx.term()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except (BlockingIOError, OSError):
            pass

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        poller, link, session = self._poller, self.link, self.session
        poller.register(self._reports.fd, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._closing:
                self._intake()
                self._take_cancels()
                self._rates(now())
                self._timers(now())
                link.deliver(now(), self._handle)
                link.pump(now(), self._next_batch, self._on_sent)
                t = now()
                wait = min([t + MAX_POLL_S, *link.wakeups(), *session.wakeups(),
                            *self._job_wakeups(t),
                            *(step[0] for step in list(self._rate_steps)[:1])]) - t
                # zmq polls in whole milliseconds (a fraction is truncated: round up, no spin)
                events = dict(poller.poll(math.ceil(max(0.0, wait) * 1000.0)))
                if self._wake_r in events:
                    self._drain_wake()
                if self._reports.fd in events:
                    self._on_reports()
                if link.monitor is not None and link.monitor in events:
                    dropped = link.disconnected()
                    if link.refused is not None:
                        why, link.refused = link.refused, None
                        session.refused(why)
                    elif dropped:
                        session.lost("the connection was closed")
                if link.sock is not None and link.sock in events:
                    link.receive(self._handle, now)
        except Exception as e:  # a bug: never leave a Future hanging
            log.exception("the client's communication engine failed")
            for job in list(self._jobs.values()):
                job.fail(e)
            self._jobs.clear()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for job_id in list(self._tracing):
            self._trace_done(job_id, "the client was closed before the server's trace came")
        for job in list(self._jobs.values()):
            if job.begin_released and job.epoch == self.link.epoch and not job.server_done:
                self.link.send_now({"t": P.CANCEL, "inf": job.id})
            job.fail(CoactoError("the client was closed before this inference finished"))
        self._jobs.clear()
        self._fail_submissions()
        self.link.flush(P.CANCEL)  # the server frees what we no longer need at once
        if self.session.ready:
            # and this connection's state, now rather than at the heartbeat timeout
            self.link.send_now({"t": P.BYE})
        self.link.close(linger_ms=CLOSE_LINGER_MS)
        self._reaper.shutdown(wait=True)
        with self._ready_cv:
            self._ready_cv.notify_all()

    def _fail_submissions(self) -> None:
        while True:
            try:
                job = self._submissions.get_nowait()
            except queue.Empty:
                return
            job.fail(CoactoError("the client was closed before this inference started"))

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _park_local(self, job: Job) -> None:
        """Local work waits while the input goes out. When the server is predicted to finish far
        ahead of the device (the plan's price, as _park_rest times a share's), it waits longer
        — the device's work is then only insurance — and starts when the server is late by half
        its predicted time (a lost connection or a server error unparks it at once through the
        fallback)."""
        e = self.est
        if e.server_shared():
            self._keeps_work(job)
            return
        total = self.tg.total_flops
        # the plan's own price (policies.inputs_cost: the server starts on the first input rows
        # while the rest cross); before the device's rate is known there is none, and the whole
        # transfer, then the whole server work, bounds it
        t_server = job.plan.info.get("predicted_s") if job.plan is not None else None
        if t_server is None or not math.isfinite(t_server):
            t_server = (job.input_bytes / e.bandwidth + e.rtt.value
                        + e.alpha * total / e.server_flops + output_bytes(self.tg) / e.downlink)
        else:  # as the kind has run here: a plan late by its error is no late server
            t_server = e.offloaded_s(t_server, job.plan.info.get("kind", "inputs"))
        # parked, the device starts once its inputs have left: it finishes first only if that
        # and all of its work beat the server's answer
        t_device = job.input_bytes / e.bandwidth + total / e.device_flops if e.device_flops \
            else float("inf")
        job.local_parked = True
        if t_server * INSURANCE_MARGIN < t_device:
            job.resume_on_release = False
            job.resume_at = job.t_start + INSURANCE_MARGIN * t_server
        else:
            job.resume_on_release = True
            job.resume_at = job.t_start + 2 * job.input_bytes / e.bandwidth + 0.05

    def _park_rest(self, job: Job) -> None:
        """A device share or a cut: what the device does not compute is insurance,
        which starts when the server is late by half the plan's predicted time, corrected by
        the kind's error (or the link stalls, or the server is lost)."""
        predicted = job.plan.info.get("predicted_s")
        if self.est.server_shared() or not (predicted is not None and math.isfinite(predicted)):
            # (no prediction to time the insurance by: a forced plan the cost model lacks)
            self._keeps_work(job)
            return
        job.local_parked = True
        job.resume_on_release = False
        # as the kind has run here (a share late by its error is no late server)
        predicted = self.est.offloaded_s(predicted, job.plan.info.get("kind"))
        job.resume_at = job.t_start + INSURANCE_MARGIN * predicted

    def _keeps_work(self, job: Job) -> None:
        """A server shared with other devices (Estimates.server_shared) serves this inference
        late whenever their work comes in a burst, which the moving average behind alpha does
        not foresee; parked work starts only once the inputs went out, or at 1.5x the
        prediction, and those inferences were the device's p95. So the device computes from the
        start, as CoActo's rule has it, and the first complete set of exit tiles wins: no worse
        than local but for the CPU the sends take. A share's or a cut's own tiles still go
        first (_resume_local)."""
        job.local_parked = False
        job.kept_work = True
        self._resume_local(job)

    def _link_stalled(self, job: Job, t: float) -> bool:
        """The inputs of a parked inference are well behind what the goodput estimate says the
        link carries by now (a link that dropped mid-transfer): the device's work stops being
        insurance. Behind by two batches and STALL_S of data, so that ACKs that come a batch at
        a time, and a burst's head start, are not taken for a stall; and the link carrying less
        than half the estimate lately (ACKED_WINDOW_BATCHES batches' time; no ACK for two
        batches' time and STALL_S counts at once): a goodput read high (the testbed's first
        inferences after `learn` read 141 Mbit/s on its 100 Mbit/s link) leaves a transfer
        behind it by more and more, but its ACKs keep coming at the link's pace."""
        if job.t_first_batch is None or job.inputs_at_server is not None:
            return False
        b = self.est.bandwidth
        if b <= 0:
            return False
        start = job.t_first_batch + self.est.rtt.value
        if job.plan is not None and job.plan.info.get("send_whole"):
            # one message, acknowledged once whole (a cut larger than two batches read as a
            # stall a few ms after it left, on a link that ran at its estimate): a stall when
            # its ACK is late by its own time at the estimate, and STALL_S
            return job.bytes_acked < job.bytes_handed and \
                t - start > 2 * job.bytes_handed / b + STALL_S
        batch = batch_bytes(b)
        expected = min(job.bytes_handed, b * max(0.0, t - start))
        if expected - job.bytes_acked <= 2 * batch + b * STALL_S:
            return False
        log_ = job.ack_log  # (time, bytes acknowledged) at each ACK that acknowledged bytes
        if t - (log_[-1][0] if log_ else start) > 2 * batch / b + STALL_S:
            return True
        window = ACKED_WINDOW_BATCHES * batch / b
        if t - start < window or not log_:
            return False
        if len(log_) == log_.maxlen and log_[0][0] > t - window:
            return False  # (the log no longer reaches back that far)
        t_then, then = start, 0  # the last ACK at or before t - window, and its bytes
        for ts, acked in log_:
            if ts > t - window:
                break
            t_then, then = ts, acked
        # from ACK to ACK (silence after the last one is the rule above): ACKs a batch apart
        # at a rate read 40% high put only two or three in a window, exactly half its bytes
        return job.bytes_acked - then < 0.5 * b * (log_[-1][0] - t_then)

    def _resume_local(self, job: Job) -> None:
        """The parked rest starts. A device share's or a cut's own tiles (what the
        server waits for) stay first: unparked into the ready pool's depth order, the rest's
        shallow tiles went before them. On the testbed a one-core server's ACKs, late while it
        computed, read as a stall 27 ms into a ResNet-50 share at 200 Mbit/s; the device then
        computed 609 tiles breadth first and sent its share 100-150 ms late (224 ms against
        92 for the same plan undisturbed)."""
        job.local_parked = False
        if job.native is not None and not job.done:
            job.native.compute_all(rest_last=policies.rest_comes_last(job.plan))

    def _stall_watch(self, job: Job) -> float:
        """How long _after_stall watches the inputs' ACKs: STALL_WATCH_S, or two batches' time
        at the estimate where batches take longer (an ACK comes a batch at a time)."""
        b = self.est.bandwidth
        batch = batch_bytes(b)
        return max(STALL_WATCH_S, 2 * batch / b) if b > 0 else STALL_WATCH_S

    def _after_stall(self, job: Job, t: float) -> None:
        """A watch (_stall_watch) after the link stalled under a parked inference
        (_link_stalled): what the link carried of its inputs since says when the server could
        have them all. When that is later than the device would finish, and the device's local
        graph (coarser tiles, faster on it: Estimates.local_flops) would finish before the
        offloading graph's remaining tiles, the inference restarts there: a link that dropped
        from 100 to 5 Mbit/s early in a ResNet-50 inference left the device computing the
        offloading graph, 1.13-1.21x the local latency in a 25% CPU quota, where its local graph
        runs 13% faster. Only plans
        that send model inputs (the inputs plan, device shares): a cut's message has none, and
        nothing to time its rest by. A stall the estimate caused (a goodput read high) usually
        leaves the link carrying at its rate meanwhile, and the inference goes on as it was."""
        t0, acked0 = job.t_stalled, job.acked_at_stall
        job.t_stalled = None
        e = self.est
        if job.done or job.fallback or job.native is None or job.tg is not self.tg or \
                self.local_tg is self.tg or job.trace is not None or job.input_bytes <= 0 or \
                job.inputs_at_server is not None or not e.local_flops or not e.device_flops \
                or t <= t0:
            return
        rate = (job.bytes_acked - acked0) / (t - t0)
        left = max(0, job.input_bytes - job.bytes_acked)
        server_s = left / rate + e.rtt.value if rate > 0 else math.inf
        computed = job.native.stats()["tiles_computed"]
        go_on_s = (1.0 - computed / self._n_computable[self.tg.graph_id]) * \
            self.tg.total_flops / e.device_flops
        restart_s = self.local_tg.total_flops / e.local_flops
        if restart_s >= RESTART_MARGIN * min(server_s, go_on_s):
            return
        reason = (f"the link carried {rate * 8e-6:.2f} Mbit/s of the inputs after stalling; "
                  f"restarted on the local graph ({restart_s * 1e3:.0f} ms predicted, "
                  f"{go_on_s * 1e3:.0f} ms on the offloading graph)")
        log.info("inference %d: %s", job.id, reason)
        self._withdraw(job)
        job.fallback, job.fallback_reason = True, reason
        job.restarted_from = job.plan
        job.sending = job.attached = False
        job.deadline = None
        job.local_parked = False
        self._start_local(job)

    def _job_wakeups(self, t: float) -> list[float]:
        times = []
        for job in self._jobs.values():
            if job.local_parked and job.resume_at is not None:
                times.append(job.resume_at)
            if job.local_parked and job.t_first_batch is not None and \
                    job.inputs_at_server is None:
                times.append(t + STALL_S)  # watch the inputs' progress (_link_stalled)
            if job.t_stalled is not None:
                times.append(job.t_stalled + self._stall_watch(job))  # _after_stall
            if job.deadline is not None and not job.fallback:
                times.append(job.deadline)
            if job.attached and not job.fallback:
                times.append(job.last_news + self.timeout)
            if job.queued_since is not None and job.queued_since + COALESCE_S > t:
                times.append(job.queued_since + COALESCE_S)  # (past: the window holds it)
        times += [job.trace.deadline for job, _o, _s in self._tracing.values()]
        return times

    def _timers(self, t: float) -> None:
        for job, _o, _s in list(self._tracing.values()):
            if t >= job.trace.deadline:
                self._trace_done(job.id, f"no TRACE from the server within "
                                         f"{job.trace.deadline - job.trace.waited_from:.1f} s")
        self.session.tick(t)
        self.est.goodput.expire(t - max(30.0, 4 * self.timeout))
        for job in list(self._jobs.values()):
            if job.local_parked and job.resume_at is not None and t >= job.resume_at:
                self._resume_local(job)
            elif job.local_parked and self._link_stalled(job, t):
                log.info("inference %d: the link carries less than its estimate; the device "
                         "computes now", job.id)
                job.t_stalled, job.acked_at_stall = t, job.bytes_acked
                self._resume_local(job)
            elif job.t_stalled is not None and t >= job.t_stalled + self._stall_watch(job):
                self._after_stall(job, t)
            if job.fallback or job.native is None and not job.waiting:
                continue
            if job.deadline is not None and t >= job.deadline:
                self._fallback(job, f"no server within {self.timeout:g} s "
                                    f"({self.session.why_down()})")
            elif job.attached and t - job.last_news > self.timeout:
                self._fallback(job, f"nothing heard about this inference for {self.timeout:g} s")

    # ------------------------------------------------------------------ server events

    def _server_ready(self) -> None:
        # a new connection (perhaps a restarted server that loads the graph again): its first
        # offload pays that connection's one-time costs, not its kind's error (_learn_outcome)
        self._outcomes = 0
        for job in list(self._jobs.values()):
            if job.waiting:
                self._start(job, lambda job=job: self._plan(job))
            elif job.native is not None and job.plan.uses_server and not job.fallback \
                    and not job.attached:
                self._attach(job)
        with self._ready_cv:
            self._ready_cv.notify_all()

    def _server_lost(self, reason: str) -> None:
        """Inferences that relied on the lost connection finish on the device."""
        for job_id in list(self._tracing):
            self._trace_done(job_id, f"the connection was lost before the server's trace came "
                                     f"({reason})")
        for job in list(self._jobs.values()):
            if job.attached or job.waiting or (job.native is not None and job.plan.uses_server):
                self._fallback(job, f"server lost: {reason}")
            job.attached = False
        with self._ready_cv:
            self._ready_cv.notify_all()

    # ------------------------------------------------------------------ jobs

    def _intake(self) -> None:
        while True:
            try:
                job = self._submissions.get_nowait()
            except queue.Empty:
                return
            if not job.future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            self._jobs[job.id] = job
            self._admit(job)

    def _admit(self, job: Job) -> None:
        session = self.session
        if job.policy == "local" or not self.address:
            self._start_local(job)
            return
        session.want = True
        if session.ready and job.policy == "dynamic" and self._local_is_faster(job):
            self._start_local(job)
        elif session.ready:
            self._start(job, lambda: self._plan(job))
        elif session.server_down or session.version_error:
            job.fallback = True
            job.fallback_reason = f"server unavailable ({session.why_down()})"
            self._start_local(job)
        else:  # a connection is being made: wait for it at most `timeout`
            job.deadline = job.t_submit + self.timeout
            if job.policy in ("cloud", "dynamic"):
                self._start(job, lambda: self._plan(job))  # its part meanwhile; attaches later
            else:
                job.waiting = True  # split / fl plan with the server's figures

    def _local_is_faster(self, job: Job) -> bool:
        e = self.est
        if e.device_flops is None:
            return False
        gain = SHARED_OFFLOAD_MIN_GAIN if e.server_shared() else OFFLOAD_MIN_GAIN
        # it would run on the local graph (_start_local), at the rate its runs show; read at
        # every inference (a division), while the offloaded side, which needs the cost model,
        # waits for its rates to move (plans_hold) beyond what its margin allows
        local_now = self.local_tg.total_flops / e.local_flops if e.local_flops else None
        if not e.plans_hold(self._gate_key) and \
                not verdict_stands(e, self._gate_key, self._gate_verdict, local_now, gain):
            options = policies.dynamic_options(
                self.tg, e.device_flops, e.server_flops, e.bandwidth, e.rtt.value, e.alpha,
                e.downlink, self._wire())
            local = options.pop("local")[0]
            kinds = [(v, k) for k, (v, _w) in options.items()]
            offloaded = min((e.offloaded_s(v, k) for v, k in kinds), default=float("inf"))
            self._gate_key, self._gate_verdict = e.planning_key(), (local, offloaded, kinds)
        local, offloaded = self._gate_verdict[:2]
        if local_now is not None:
            local = local_now
        if offloaded < local * (1.0 - gain):
            self._gated = 0
            return False
        self._gated += 1
        if self._gated % EXPLORE_EVERY == 0:
            job.explores = True
            return False
        self._probe_if_stale()
        job.skipped = (f"the device is predicted to finish first ({local * 1e3:.1f} ms vs "
                       f"{offloaded * 1e3:.1f} ms offloaded at best)")
        return True

    def _probe_if_stale(self) -> None:
        t = self._clock()
        measured = self.est.goodput.measured_at
        if (measured is None or t - measured > REPROBE_S) and \
                (self._last_probe is None or t - self._last_probe > REPROBE_S):
            self._last_probe = t
            self._send_probe()

    @staticmethod
    def _clock() -> float:
        return now()

    def _send_probe(self) -> None:
        self.session._send_probe()

    def _learn_outcome(self, job: Job, t: float) -> None:
        """A dynamic inference that offloaded: how far its plan's prediction was off. Not the
        first on a connection (_server_ready starts the count again): it pays once for what
        later ones find ready (on the testbed mostly 5-35%
        slower than the ones after it, once 4x: ResNet-50 at 100 Mbit/s 110-123 ms against
        100-104, VGG-16 397 and 1045 against 260-290), and the first error of a kind stands
        for the kind until it runs again: taken as the inputs plan's, it kept fresh clients on
        shares that ran slower than the inputs plan would have."""
        plan = job.plan
        if job.policy == "dynamic" and plan.uses_server and not job.fallback \
                and job.t_start is not None and "predicted_s" in plan.info:
            self._outcomes += 1
            if self._outcomes == 1:
                return
            self.est.on_offloaded(plan.info["predicted_s"], t - job.t_start,
                                  plan.info.get("kind", "inputs"))

    def _plan(self, job: Job) -> policies.Plan:
        e = self.est
        return policies.make_plan(job.policy, self.tg, device_flops=e.device_flops,
                                  server_flops=e.server_flops, bandwidth=e.bandwidth,
                                  rtt=e.rtt.value, alpha=e.alpha, downlink=e.downlink,
                                  wire=self._wire(), correct=e.offloaded_s,
                                  unseen=self._unseen(job),
                                  explore=e.stalest_kinds() if job.explores else None,
                                  **job.options)

    def _unseen(self, job: Job) -> tuple[str, ...]:
        """The kinds of plan a dynamic inference may explore: one offloaded inference in
        KIND_EXPLORE_EVERY may run a kind never run on a link like today's, or, unless the
        server is shared, one whose error was last learnt KIND_STALE_AFTER offloaded inferences
        ago or more; no more often. A short session (an app's few inferences, an experiment's
        fresh client) runs the kind predicted best; a long one learns every kind's error within a
        few dozen, and learns it again now and then."""
        if job.policy != "dynamic":
            return ()
        self._planned += 1
        if self._planned % KIND_EXPLORE_EVERY:
            return ()
        e = self.est
        # a shared server: an exploration runs into the others' bursts (docs/SCHEDULER.md)
        stale = () if e.server_shared() else e.stale_kinds(KIND_STALE_AFTER)
        return e.unseen_kinds() + stale

    def _transfer_now(self) -> str:
        """The encoding this device's tiles take: the one asked for, unless the server (when
        one is connected) does not read it (an older server: raw floats then)."""
        mode = self.transfer
        if mode == "raw" or not self.session.ready:
            return mode
        if mode in (self.session.server_info.get("transfer") or ()):
            return mode
        if not self._transfer_warned:
            self._transfer_warned = True
            log.warning("the server does not read %s tile transfers (an older server): sending "
                        "raw float32", mode)
        return "raw"

    def _wire(self):
        """Bytes on the wire per raw byte, per layer, for the encoding now in use (None: raw)."""
        return self.est.wire if self._transfer_now() != "raw" else None

    def _start_local(self, job: Job) -> None:
        """Starts a job the device computes alone, on the local graph."""
        self._start(job, policies.plan_local(self.local_tg), self.local_tg)

    def _start(self, job: Job, plan, tg=None) -> None:
        """Starts a job with ``plan`` (a Plan, or a function making one) on ``tg`` (default: the
        offloading graph); a failure fails only this job's Future."""
        try:
            self._start_native(job, plan if isinstance(plan, policies.Plan) else plan(),
                               tg if tg is not None else self.tg)
        except Exception as e:  # a bad input the checks missed, a native error, a policy error
            log.debug("inference %d failed to start: %s", job.id, e)
            self._jobs.pop(job.id, None)
            job.fail(e)

    def _start_native(self, job: Job, plan: policies.Plan, tg) -> None:
        job.waiting = False
        job.plan = plan
        job.tg = tg  # only local plans run on local_tg (_start_local)
        job.natives += 1
        native = NativeInference(self.rt, tg, tag=job.id | job.natives << TAG_JOB_BITS)
        job.native = native
        report = None
        if plan.uses_server and plan.info.get("send_whole"):
            # The runtime announces a send only when its queue was empty: a tensor sent whole
            # waits for its last tile, whose completion must wake this loop, not MAX_POLL_S.
            report = (plan.send == SEND_ALWAYS).astype(np.uint8)
        native.set_plan(plan.local, plan.send, report)  # any plan: REPORT_DONE is announced
        mode = self._transfer_now()
        if mode != "raw":
            # the first inferences, then one in WIRE_SAMPLE_EVERY, measure what every tile
            # would take encoded (a pass over each activation, a few percent of an inference)
            job.measures_wire = self._wire_runs < WIRE_SAMPLE_FIRST or \
                self._wire_runs % WIRE_SAMPLE_EVERY == 0
            self._wire_runs += 1
            native.set_transfer(mode, measure=job.measures_wire)
        if job.trace is not None:
            native.enable_trace()
            job.trace.threads = self.rt.threads
            job.trace.estimates = self.est.snapshot()
        if plan.uses_server:
            send = plan.send
            job.inputs_to_send = int((send[self._is_input] == SEND_ALWAYS).sum())
            job.input_bytes = wire_bytes(
                self.tg, self._is_input & (send == SEND_ALWAYS), self._wire())
            job.decides = bool((send == SEND_DECIDE).any())
            if plan.info.get("send_whole"):
                job.whole_bytes = int(self.tg.plan.tile_bytes[send == SEND_ALWAYS].sum())
        job.t_start = now()
        if plan.info.get("local_after_inputs"):
            if self.session.ready and not job.fallback:
                self._park_local(job)
            else:
                native.compute_all()
        elif plan.info.get("park_rest"):
            if self.session.ready and not job.fallback:
                self._park_rest(job)
            else:
                native.compute_all()
        if plan.uses_server and self.session.ready and not job.fallback:
            self._attach(job)  # BEGIN and the ECT parameters before the first tile completes
        native.set_inputs(job.feeds)  # (kept until the job ends: a restart sets them again)

    def _attach(self, job: Job) -> None:
        enc = job.native.transfer if job.native is not None else "raw"
        if enc != "raw" and enc not in (self.session.server_info.get("transfer") or ()):
            # planned before this server was known, and it cannot read the encoding
            self._fallback(job, f"the server does not read {enc} tile transfers")
            return
        t = now()
        job.attached, job.epoch, job.deadline = True, self.link.epoch, None
        job.t_begin = job.last_news = t
        job.sending = True
        begin = {"t": P.BEGIN, "inf": job.id, "graph_id": self.tg.graph_id}
        if job.native is not None and job.native.transfer != "raw":
            begin["result_enc"] = "lossless"  # the exit tiles come back exact, zeros masked
        if job.trace is not None:
            if self.session.server_info.get("trace") is True:
                begin["trace"] = job.trace.asked = True
                job.trace.server_note = "asked for"
            else:  # a server that does not know the field would ignore it: never wait for it
                job.trace.server_note = "the server does not report its side (an older server)"
        self.link.control(begin, job=job)
        self._push_params(job, t)

    def _push_params(self, job: Job, t: float) -> None:
        if not job.decides or not job.sending or job.native is None:
            return
        e = self.est
        b, rtt = e.bandwidth, e.rtt.value
        if job.inputs_at_server is None:  # estimate until the ACK of the last input says
            left = job.unacked + (job.native.queued_bytes() if job.inputs_to_send else 0)
            at = max(job.t_begin + job.input_bytes / b, t + left / b) + rtt / 2
        else:
            at = job.inputs_at_server
        # what waits in the link, and the coalescing delay, lengthen every send: count them as RTT
        extra = COALESCE_S + self.link.backlog_bytes / b
        job.native.set_offload_params(b, rtt + 2 * extra, at, e.server_flops, e.alpha)

    def _fallback(self, job: Job, reason: str) -> None:
        if job.fallback and job.native is not None:
            return
        if not job.fallback:
            log.info("inference %d finishes on the device: %s", job.id, reason)
        job.fallback, job.fallback_reason = True, job.fallback_reason or reason
        job.sending = False
        job.deadline = None
        job.local_parked = False  # (computing all now: no resume or stall watch to come)
        if job.native is None:
            self._start_local(job)
            return
        job.native.set_offload_params(0.0, 0.0, 0.0, 1.0, 1.0)  # decide nothing more
        job.native.compute_all()

    def _on_reports(self) -> None:
        for tag, kind, _tile in self._reports.take():
            if kind == REPORT_DONE:
                job = self._jobs.get(tag & ((1 << TAG_JOB_BITS) - 1))
                # (a report of a native inference a restart cancelled is not this job's now)
                if job is not None and job.native is not None and job.native.tag == tag:
                    self._finish(job)
        # REPORT_SEND only wakes the loop: _pump looks at every sending job's queue

    def _take_cancels(self) -> None:
        while True:
            try:
                future, upto = self._cancels.get_nowait()
            except queue.Empty:
                return
            self._intake()  # a job submitted after the loop's intake, before its cancel
            for job in list(self._jobs.values()):
                if job.future is future or future is None and job.id <= upto:
                    self._cancel(job)

    def _withdraw(self, job: Job) -> None:
        """A job's native inference stops (its computing threads drop it now; closed off this
        thread, which waits for the piece each is in), its messages not yet sent are withdrawn,
        and the server, if it has the inference, is sent CANCEL."""
        native, job.native = job.native, None
        if native is not None:
            native.cancel()
            self._reaper.submit(native.close)
        for frames in self.link.drop_job(job, now()):
            self.est.goodput.forget((job.id, P.unpack(frames[:1])[0].get("batch")))
        if job.begin_released and job.epoch == self.link.epoch and not job.server_done \
                and self.link.is_open:
            self.link.control({"t": P.CANCEL, "inf": job.id}, job=job)
        job.server_done = True  # nothing more to ask of it

    def _cancel(self, job: Job) -> None:
        """The application gave up on an inference: its local work stops, its messages not yet
        sent are withdrawn, the server (if it has it) is sent CANCEL, its Future fails."""
        del self._jobs[job.id]
        job.done = True
        job.feeds = None
        self._withdraw(job)
        log.info("inference %d cancelled", job.id)
        job.fail(InferenceCancelled(f"inference {job.id} was cancelled (Client.cancel); the "
                                    "client is ready for the next", lib.COACTO_ERR_CANCELLED))

    def _finish(self, job: Job) -> None:
        del self._jobs[job.id]
        job.done = True
        job.feeds = None
        native = job.native
        try:
            outputs = native.outputs()
        except Exception as e:
            # its DONE reported a failure (memory, a tile's error): this inference fails, the
            # engine and the other inferences go on (an exception here stopped the engine's
            # thread, and every Future waited forever)
            why = native.failure()
            log.warning("inference %d failed on the device: %s", job.id, why or e)
            self._fail_finished(job, CoactoError(f"inference {job.id} failed on the device: "
                                                 f"{why}") if why else e)
            return
        try:
            self._conclude(job, native, outputs)
        except Exception as e:  # a bug: this inference fails, not the engine
            log.exception("inference %d: concluding it failed", job.id)
            self._fail_finished(job, CoactoError(f"inference {job.id} computed, but concluding "
                                                 f"it failed: {e}"))

    def _fail_finished(self, job: Job, err: BaseException) -> None:
        """A job out of _jobs already fails with `err`, whatever its cleanup meets (its Future
        would wait forever): its trace, unsent batches, server part and native inference go."""
        try:
            self._tracing.pop(job.id, None)
            if job.native_closing:  # (its close was handed to the reaper already)
                job.native = None
            self._withdraw(job)
        except Exception:
            log.exception("inference %d: withdrawing it failed", job.id)
        finally:
            job.fail(err)

    def _conclude(self, job: Job, native, outputs: dict) -> None:
        """A finished inference's statistics, learning, trace and Future (_finish)."""
        # the loser's remaining local work stops now (a tile in flight per thread still ends),
        # so that the statistics and the trace read below describe the same tiles
        native.cancel()
        native_stats = native.stats()
        if job.trace is not None:  # read before the native inference goes
            # the decisions first: a tile still in flight stores its times before it decides,
            # so a decision read here finds its tile in the trace read after it (read the other
            # way round, a decision made in between had no tile, and no thread, to show on: a
            # test failed so once in a loaded CI run)
            job.trace.decisions = native.decisions()
            job.trace.device = native.tile_trace()
        if native.transfer != "raw" and job.measures_wire:
            self.est.on_wire(*native.wire_bytes())
        for frames in self.link.drop_job(job, now()):  # batches not sent yet: withdrawn
            self.est.goodput.forget((job.id, P.unpack(frames[:1])[0].get("batch")))
        if job.begin_released and job.epoch == self.link.epoch and not job.server_done \
                and self.link.is_open:
            self.link.control({"t": P.CANCEL, "inf": job.id}, job=job)
        t = now()
        # destroying the inference waits for the tiles in flight (a throttled device may take
        # a while): not on this thread
        self._reaper.submit(native.close)
        job.native_closing = True
        if job.plan.uses_server and job.t_begin is None and not job.fallback:
            job.fallback = True
            job.fallback_reason = "finished on the device before a server was ready"
        if native_stats["tiles_computed"] == self._n_computable[job.tg.graph_id]:
            # The device's own speed, on the graph it ran: its tiles' span for the planners'
            # rate, and for the gate's "local" what an inference took from its start as this
            # engine runs it, as an offloaded one's outcome is timed (_learn_outcome). In a 25%
            # quota the span was 20 ms of MobileNetV2's 36: the rest is this engine's work
            # before and after, four times dearer there; learnt from the span the gate
            # predicted 20 ms for 36 and kept work the server did faster.
            self.est.on_local_run(job.tg.total_flops, native_stats["seconds"],
                                  local_graph=job.tg is not self.tg,
                                  latency=t - job.t_start if job.t_start is not None else None)
        self._learn_outcome(job, t)
        stats = job_stats(job, native_stats, t, self)
        if self.on_finish is not None:
            self.on_finish(stats)  # before the Future: whoever waits on it reads last_stats
        if job.trace is None:
            job.complete(outputs, stats)
            return
        self._tracing[job.id] = (job, outputs, stats)
        # the server answers DONE or CANCEL with its TRACE (DONE after it: once DONE or an ERROR
        # came, nothing more will)
        if job.trace.asked and not job.trace.replied and job.begin_released \
                and job.epoch == self.link.epoch and self.link.is_open and not job.server_done:
            job.trace.waited_from = t
            job.trace.deadline = t + min(self.timeout, TRACE_WAIT_S)
        else:
            self._trace_done(job.id)

    def _trace_done(self, job_id, why: str | None = None) -> None:
        """The trace of a finished inference is complete (or will not be): built and written off
        the engine's thread, then the inference's Future completes."""
        job, outputs, stats = self._tracing.pop(job_id)
        rec = job.trace
        if why is not None and not rec.replied:  # a malformed TRACE keeps its own note
            log.warning("inference %d: the trace holds the device's side only: %s", job.id, why)
            rec.server_note = why
        offset, uncertainty = self.est.clock.value, self.est.clock.uncertainty
        job.future.trace = None

        def emit():
            try:
                trace = merged_trace(job.tg, rec, stats, job.t_submit, offset, uncertainty,
                                     f"server {self.address}")
                job.future.trace = trace
                if rec.path is not None:
                    path = str(rec.path).replace("{n}", str(job.id))
                    write_trace(trace, path)
                    log.info("inference %d: trace written to %s", job.id, path)
            except Exception:  # a trace must never cost the inference
                log.exception("inference %d: building or writing its trace failed", job.id)
            job.complete(outputs, stats)

        self._reaper.submit(emit)

    # ------------------------------------------------------------------ sending

    def _on_sent(self, kind: str, frames, nbytes: int, job: Job | None, t_booked) -> bool:
        """The link releases a message; False drops it (its inference finished meanwhile)."""
        if job is None:
            return True
        if kind == P.TILES:
            key = (job.id, P.unpack(frames[:1])[0].get("batch"))
            if job.done:
                self.est.goodput.forget(key)
                return False
            if t_booked is not None:
                up = self.link.up  # uncapped, it only adds a delay: its crossings say nothing
                self.est.goodput.booked(key, t_booked, up.delay if up.rate < UNCAPPED else None)
            else:  # on its way to the socket now, after its packing
                self.est.goodput.handed(key, now())
            if job.trace is not None:
                job.trace.released(key[1], now())
            job.tiles_sent += len(frames[1])  # the int32 ids
            if job.local_parked and job.resume_on_release and key[1] == job.input_batch:
                self._resume_local(job)
        elif kind == P.BEGIN and job.done:
            return False
        job.bytes_sent += nbytes
        if kind == P.BEGIN:
            job.begin_released = True
        return True

    def _next_batch(self):
        """The next TILES message: oldest inference first, when the send window allows."""
        if not self.session.ready:
            return None
        b = self.est.bandwidth
        size = batch_bytes(b)
        window = max(2 * size, b * max(2 * self.est.rtt.value, WINDOW_S))
        if self.est.goodput.inflight_bytes >= window:
            return None
        epoch = self.link.epoch
        for job in self._jobs.values():
            if job.attached and job.sending and job.epoch == epoch:
                frames = job.take_batch(size, self._is_input, self.est.goodput)
                if frames is not None:
                    return P.TILES, frames, job
        return None

    # ------------------------------------------------------------------ receiving

    def _handle(self, frames) -> None:
        try:
            header, rest = P.unpack(frames)
        except P.ProtocolError as e:
            log.warning("dropping a malformed message from the server: %s", e)
            return
        kind = header["t"]
        try:
            if self.session.handle(kind, header, rest):
                if kind == P.STATS:
                    self._refresh_params()
                return
            handler = getattr(self, "_on_" + kind, None)
            if handler is None:
                log.debug("ignoring a %r message (devices do not take it)", kind)
                return
            handler(header, rest, sum(len(f) for f in frames))
        except Exception:
            log.exception("handling a %r message from the server failed", kind)

    def _job_of(self, header: dict, nbytes: int) -> Job | None:
        job = self._jobs.get(header.get("inf"))
        if job is not None:
            job.bytes_received += nbytes
            job.last_news = now()
        return job

    def _refresh_params(self) -> None:
        t = now()
        for job in self._jobs.values():
            if job.attached and job.decides and job.sending:
                self._push_params(job, t)

    def _on_ack(self, h, rest, nbytes) -> None:
        job = self._job_of(h, nbytes)
        batch = h.get("batch")
        t = now()
        inf = h.get("inf")
        t_server = h.get("t_server")
        sample = self.est.on_ack((inf, batch), t, t_server)
        if sample is not None:
            self.est.rtt.sample(sample)
        traced = job if job is not None else self._traced(h)
        if traced is not None and traced.trace is not None:
            traced.trace.acked(batch, t, t_server)
        if job is None:
            return
        acked = job.inflight.pop(batch, 0)
        job.unacked -= acked
        job.bytes_acked += acked
        if acked:
            job.ack_log.append((t, job.bytes_acked))
        if batch == job.input_batch and job.inputs_at_server is None:
            # when the server took in the last input: its own stamp on our clock if the offset
            # is known (immune to how late we read the ACK), else the ACK's arrival - RTT / 2
            at = self.est.clock.to_local(t_server) if isinstance(t_server, (int, float)) else None
            job.inputs_at_server = min(at, t) if at is not None else t - self.est.rtt.value / 2
        self._refresh_params()

    def _on_result(self, h, rest, nbytes) -> None:
        job = self._job_of(h, nbytes)
        if job is None:
            traced = self._traced(h)  # too late to use: still on the trace's downlink
            if traced is not None:
                try:
                    ids = P.read_tile_frames(h, rest, self.tg.n_tiles).ids
                except P.ProtocolError:
                    return
                t = now()
                traced.trace.result(ids, nbytes, t, t)
            return
        if job.native is None or job.tg is not self.tg:  # restarted on the local graph
            return
        t = now()
        try:
            got = P.read_tile_frames(h, rest, self.tg.n_tiles)
            ids = got.ids
            if got.enc is None:
                accepted, _dup = job.native.put_tiles(ids, got.data)
            else:
                accepted, _dup = job.native.put_tiles_encoded(got.enc, ids, got.lens, got.encoded)
        except Exception as e:  # whatever the server sent, the device finishes alone
            self._fallback(job, f"the server sent unusable results ({e})")
            return
        if job.trace is not None:
            job.trace.result(ids, nbytes, t, now())
        job.tiles_from_server += accepted
        self.est.on_result(nbytes, h.get("ts"), t)

    def _traced(self, h: dict) -> Job | None:
        """A finished inference whose trace waits for the server's side."""
        entry = self._tracing.get(h.get("inf"))
        return entry[0] if entry is not None else None

    def _on_trace(self, h, rest, nbytes) -> None:
        job = self._job_of(h, nbytes) or self._traced(h)
        if job is None or job.trace is None or not job.trace.asked or job.trace.replied:
            return  # not asked for (or already here): ignored
        job.trace.server_reply(h, rest, self.tg.n_tiles, now())
        if job.id in self._tracing:
            self._trace_done(job.id)

    def _on_done(self, h, rest, nbytes) -> None:
        # the server's rate on this graph as its inferences measure it (PROTOCOL.md, DONE); its
        # MODEL_READY had only the rate known when the device joined
        if self.est.on_server_rate(h.get("server_flops")):
            self._refresh_params()  # inferences in flight decide with it too
        job = self._job_of(h, nbytes)
        if job is not None:
            job.server_done = True
            job.server_report = {k: v for k, v in h.items() if k not in ("t", "inf")}
        elif self._traced(h) is not None:  # the server sends its TRACE before DONE
            self._trace_done(h.get("inf"), "the server finished without sending its trace")

    def _on_error(self, h, rest, nbytes) -> None:
        code, text, re_ = h.get("code"), str(h.get("text", ""))[:500], h.get("re")
        job = self._job_of(h, nbytes) if "inf" in h else None
        if "batch" in h:  # a TILES batch that will not be acknowledged
            self.est.goodput.forget((h.get("inf"), h.get("batch")))
        if "inf" in h and self._traced(h) is not None and "batch" not in h:
            self._trace_done(h.get("inf"), f"server error {code}: {text}")
        if job is not None and job.server_done and code == P.E_UNKNOWN_INFERENCE:
            return  # a batch that crossed the server's DONE: it had sent everything already
        if job is not None:
            job.server_done = True  # the server holds nothing more for it
            self._fallback(job, f"server error {code}: {text}")
            if code == P.E_UNKNOWN_MODEL:
                self.session.model_lost()
        elif "inf" not in h:
            self.session.on_error(code, text, re_)
