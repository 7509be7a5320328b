"""Online estimates the dynamic scheduler and the baselines plan with: link goodput, round-trip
time, the server's speed and contention, the device's own speed.

Goodput comes from acknowledgements. Each TILES batch is acknowledged once the server has taken it
in; the ACK echoes the time the batch was handed to the link and carries the server's clock. While
the sender is backlogged (a batch was handed over while the link still carried the one before it)
the link never idles between them, so the time between the server taking in successive batches is
the time the link took for the later one: bytes acknowledged over the spacing of the server's ACK
timestamps is the goodput, whatever the pipelining depth and the RTT, and untouched by how late the
device gets around to reading the ACKs (a busy or CPU-capped device reads them in bunches). When
the link had carried the one before is known from the server's stamp and the clock offset (or the
client's own shaper); without them, a batch handed over while earlier ones were unacknowledged
counts as backlogged. A batch the device paced (handed over after the link had carried the one
before) only bounds the goodput from below.
Samples are pooled over windows of at least ``WINDOW_S`` and the windows are smoothed with an EWMA.
An isolated batch still bounds the goodput from below (it took at most its round trip, less what
a burst carried at once), which lifts a too-low initial guess quickly; the probe train the
session sends after the handshake is measured like backlogged batches.

Round-trip time comes from HEARTBEAT -> STATS exchanges (the server echoes our timestamp), from the
HELLO handshake and from ACKs of small, unqueued batches; each sample is min-filtered over the last
few (queueing behind our own data only ever adds) and then smoothed.

All times are seconds on the runtime's clock (``coacto.inference.now``); rates are bytes/s and
FLOP/s.
"""
from __future__ import annotations

import collections
import math
import logging

import numpy as np

log = logging.getLogger(__name__)

#: Goodput before anything was measured, when no --bandwidth is given: 10 Mbit/s, a modest WiFi or
#: LTE uplink. Conservative on purpose: the dynamic scheduler then sends little beyond the inputs
#: until ACKs show the link is faster (one batch is enough to lift the estimate).
DEFAULT_BANDWIDTH = 10e6 / 8
#: Round-trip time before anything was measured.
DEFAULT_RTT = 0.010
#: Server FLOP/s assumed before HELLO_OK says (only for planning before the first handshake).
DEFAULT_SERVER_FLOPS = 20e9
#: Shortest window pooled into one goodput sample.
WINDOW_S = 0.020
#: Smallest byte count a goodput window must hold to count (tiny windows measure overheads).
WINDOW_MIN_BYTES = 16 * 1024
#: ... and the link time it must span: batches the server received within less of each other
#: crossed in one burst and measure the burst, not the rate (on the testbed's 200 Mbit/s link a
#: probe train that passed whole read 11 Gbit/s, and the correct sample after it only blended
#: in: 1.4-5 Gbit/s). A link too fast for this is bounded from below by isolated transfers.
WINDOW_MIN_S = 0.002
#: EWMA weights of new samples.
GOODPUT_GAIN = 0.3
RTT_GAIN = 0.25
DEVICE_GAIN = 0.3
#: A goodput sample after this long without one replaces the estimate instead of blending into
#: it: the link may have changed meanwhile (the engine probes it again after as long).
GOODPUT_STALE_S = 2.0
#: EWMA weight of a new offloaded inference's prediction error.
OFFLOAD_ERROR_GAIN = 0.3
#: The engine's gate reuses its last verdict while every rate it reads is within this share
#: of what it was then (Estimates.plans_hold): its cost model took 150-290 us of the engine's
#: CPU per inference (cold caches after the computing threads' work; 30 us in a loop), four
#: times that in a 25% quota, and made MobileNetV2 run one quota period slower than `local`.
#: (The device's own rate drifts by a few % per inference while its runtime warms up: finer
#: steps recomputed the verdict at every other inference.)
GATE_STEP = 0.1
#: A kind of plan's prediction error applies on links within this factor of the goodput it was
#: learnt at (Estimates.offload_errors).
ERROR_LINK_FACTOR = 2.0
#: A contention factor above this means the server is computing other devices' inferences.
SHARED_ALPHA = 1.1
#: The kinds of offloaded plan dynamic chooses between (policies.dynamic_options), each with an
#: error of its own.
OFFLOAD_KINDS = ("inputs", "cut", "share")
#: Bytes on the wire per raw byte of a layer not measured yet, per transfer encoding: dense
#: tiles (a tile is never sent larger than that).
WIRE_PRIOR = {"raw": 1.0, "lossless": 1.0, "f16": 0.5, "int8": 0.25}
#: EWMA weight of a new inference's measured wire ratio of a layer (activations' sparsity moves
#: with the input, a little).
WIRE_GAIN = 0.5
#: RTT samples a min-filter spans.
RTT_MIN_OF = 5
#: A link may carry this much at once faster than its rate (a token bucket's burst, a Wi-Fi
#: aggregate, a driver's queue): an isolated transfer bounds the goodput only by the bytes beyond
#: it: a probe or an input smaller than the burst otherwise reads a slow link as fast (docs/
#: SCHEDULER.md, "Measurements behind the constants").
BURST_BYTES = 16 * 1024
#: ... and a link that carried more than that at once has a larger burst: a transfer that crossed
#: faster than this many times the last measured rate (of backlogged batches, after any burst)
#: teaches the burst instead of raising the goodput (Goodput.burst): a fast link's shaper lets
#: more through at once than BURST_BYTES, since its timer needs it.
BURST_EVIDENCE = 1.5
#: The largest burst believed (a transfer this large is a measurement whatever its speed).
BURST_MAX_BYTES = 1 << 20
#: A batch handed over more than this share of its spacing after the link had carried the one
#: before it was paced by the device: no sample, a lower bound (Goodput.acked).
PACED_SHARE = 0.25


def _ewma(old: float | None, sample: float, gain: float) -> float:
    """The smoothed value after ``sample`` (the sample itself when there is no ``old``)."""
    return sample if old is None else (1 - gain) * old + gain * sample


class Goodput:
    """Goodput from acknowledged batches (see the module text)."""

    def __init__(self, initial: float = DEFAULT_BANDWIDTH):
        self.value = float(initial)
        self.samples = 0
        self.measured_at: float | None = None  # when the last sample was taken
        self.inflight_bytes = 0
        self._pending: dict = {}
        self._last_ack: float | None = None
        self._last_server: float | None = None
        self._last_done: float | None = None  # when the link had carried the last one acked
        self._last_booked: float | None = None
        self._booked: dict = {}
        self._win_bytes = 0
        self._win_time = 0.0
        #: What the link carries at once faster than its rate (BURST_BYTES until a transfer
        #: shows more)
        self.burst = float(BURST_BYTES)
        self._window_rate: float | None = None  # the last sample of backlogged batches

    def sent(self, key, nbytes: int, t: float) -> None:
        """A batch of ``nbytes`` was handed to the link at ``t``."""
        if key in self._pending:  # a key used again: the old one will not be acknowledged
            self.forget(key)
        self._pending[key] = (int(nbytes), t, self.inflight_bytes > 0)
        self.inflight_bytes += int(nbytes)

    def handed(self, key, t: float) -> None:
        """The batch went to the link at ``t``, some time after it was taken (``sent``): the
        engine's CPU for it in between."""
        item = self._pending.get(key)
        if item is not None:
            self._pending[key] = (item[0], t, item[2])

    def booked(self, key, t_release: float, delay: float | None = 0.0) -> None:
        """The client's own shaper scheduled the batch's last byte to cross at ``t_release``,
        which includes ``delay`` (the one-way delay it adds) after the crossing; None: the
        crossing tells nothing of the real link (a shaper that only adds a delay)."""
        if key in self._pending:
            self._booked[key] = (t_release, None if delay is None else t_release - delay)

    def forget(self, key) -> None:
        """A batch that will never be acknowledged (its inference or connection is gone)."""
        item = self._pending.pop(key, None)
        self._booked.pop(key, None)
        if item is not None:
            self.inflight_bytes -= item[0]

    def expire(self, before: float) -> None:
        """Forgets batches handed over before ``before`` that were never acknowledged."""
        if self._pending:
            for key in [k for k, (_, t, _) in self._pending.items() if t < before]:
                self.forget(key)

    def reset(self) -> None:
        """The connection was replaced: nothing in flight any more (the estimate stays)."""
        self._pending.clear()
        self._booked.clear()
        self.inflight_bytes = 0
        self._last_ack = self._last_server = self._last_booked = self._last_done = None
        self._win_bytes, self._win_time = 0, 0.0

    def acked(self, key, t: float, rtt: float, t_server: float | None = None,
              t_arrived: float | None = None) -> float | None:
        """The batch's ACK arrived at ``t`` (stamped ``t_server`` by the server: ``t_arrived``
        on our clock, when the clock offset is known); returns the round-trip time it shows when
        the batch was small and not queued behind others (an RTT sample), else None."""
        item = self._pending.pop(key, None)
        if item is None:
            return None
        n, t_sent, backlogged = item
        t_booked, t_crossed = self._booked.pop(key, (None, None))
        self.inflight_bytes -= n
        rtt_sample = None
        paced = False
        spacing = 0.0  # from the batch acknowledged before it to this one
        if backlogged and self._last_ack is not None:
            if t_server is not None and self._last_server is not None:
                spacing = t_server - self._last_server
            else:
                spacing = t - max(self._last_ack, t_sent)
            if t_booked is not None and self._last_booked is not None:
                # with the client's own shaper, a device too busy to send on time releases
                # batches in bunches; the link they emulate still carried them this far apart
                spacing = max(spacing, t_booked - self._last_booked)
            # Batches still unacknowledged need not be on the link: with a 10 ms RTT a 100
            # Mbit/s link carries 125 kB before the first ACK is back. Handed over after the
            # link had carried the one before, this one found it idle, and the spacing is the
            # device's pace (a share's tiles streamed as they are computed, an
            # engine slower than the link), not the link's: a simulated Raspberry Pi's share of
            # MobileNetV2 read a 100 Mbit/s link as 46 so. An idle gap of a small share of the
            # spacing still counts (the sample is low by at most that share): a probe behind
            # one that crossed in a burst is handed over a little after that one crossed
            paced = self._last_done is not None and \
                t_sent - self._last_done > PACED_SHARE * spacing
        if backlogged and not paced and self._last_ack is not None:
            self._win_bytes += n
            self._win_time += max(0.0, spacing)
        else:
            elapsed = t - t_sent
            measured = self._window_rate
            if elapsed > 0:
                # It took at most `elapsed`: a lower bound on the goodput (what a burst let
                # through at once left out) -- unless the link was measured far slower, when
                # it shows a burst larger than believed.
                bound = (n - self.burst) / elapsed
                if measured is not None and bound > BURST_EVIDENCE * measured:
                    self.burst = min(float(BURST_MAX_BYTES), max(self.burst, n - measured * elapsed))
                elif bound > self.value:
                    self.value = bound
                if n <= 4096:
                    rtt_sample = max(0.0, elapsed - n / self.value)
                elif elapsed > 3 * rtt and n > self.burst and self.inflight_bytes == 0 \
                        and not paced:
                    # the transfer dominates the round trip: a real sample, of what the burst
                    # did not carry (unless batches queued behind it measure the rate better:
                    # this one's round trip holds the device's delay in reading its ACK; a
                    # paced batch's, the wait for the batch before it)
                    self._win_bytes += n - self.burst
                    self._win_time += elapsed - rtt
            if paced and spacing >= WINDOW_MIN_S:
                # the link carried it within the spacing: a lower bound, which lifts a low
                # estimate by at most 1.5x a batch (a burst shortens the spacing too), and none
                # that a burst larger than believed would explain
                bound = (n - self.burst) / spacing
                if bound > self.value and (measured is None or bound <= BURST_EVIDENCE * measured):
                    self.value = min(bound, BURST_EVIDENCE * self.value)
        # when the link had carried this batch, on our clock: the shaper's crossing, else the
        # server's stamp less the way there (a clock offset that puts it outside the batch's
        # round trip is stale: a server restarted or replaced)
        if t_crossed is not None:
            self._last_done = t_crossed
        elif t_arrived is not None and t_sent - rtt <= t_arrived <= t + rtt:
            self._last_done = t_arrived - rtt / 2
        else:
            self._last_done = None
        self._last_ack = t
        self._last_server = t_server
        self._last_booked = t_booked
        if self._win_time >= WINDOW_S or (self.inflight_bytes == 0 and self._win_time > 0):
            if self._close_window(t):
                self.measured_at = t
        return rtt_sample

    def _close_window(self, t: float) -> bool:
        sampled = self._win_bytes >= WINDOW_MIN_BYTES and self._win_time >= WINDOW_MIN_S
        if sampled:
            sample = self._win_bytes / self._win_time
            self._window_rate = sample
            fresh = self.samples == 0 or self.measured_at is None or \
                t - self.measured_at > GOODPUT_STALE_S
            self.value = _ewma(None if fresh else self.value, sample, GOODPUT_GAIN)
            self.samples += 1
            log.debug("goodput sample %.3g B/s over %.1f ms -> %.3g B/s", sample,
                      self._win_time * 1e3, self.value)
        self._win_bytes, self._win_time = 0, 0.0
        return sampled


class Downlink:
    """The server-to-device goodput, from RESULTs: the server stamps each when it hands it to
    its socket and the clock offset puts that on our clock. A RESULT handed over before the
    previous one arrived queued behind it: the link carried it in the time between the two
    arrivals (pooled into windows of at least WINDOW_S, as the uplink's ACKs are). An isolated
    one larger than two bursts took its bytes beyond the burst over (arrival - stamp - RTT/2).
    None until measured (the uplink's estimate stands in). It prices returning the exit tiles,
    which for a transformer's hidden states (BERT-base: 393 kB in 8 RESULTs) is most of what
    crosses the link."""

    def __init__(self):
        self.value: float | None = None
        self.samples = 0
        self._last_recv: float | None = None
        self._win_bytes = 0
        self._win_time = 0.0

    def result(self, nbytes: int, t_sent_local: float | None, t_recv: float, rtt: float) -> None:
        if t_sent_local is None:
            return
        last, self._last_recv = self._last_recv, t_recv
        if last is not None and t_sent_local < last and t_recv > last:
            self._win_bytes += nbytes
            self._win_time += t_recv - last
            if self._win_time >= WINDOW_S:
                self._close()
            return
        self._close()
        dt = t_recv - t_sent_local - rtt / 2
        if nbytes >= 2 * BURST_BYTES and dt > 0:
            self._sample((nbytes - BURST_BYTES) / dt)

    def _close(self) -> None:
        if self._win_bytes >= WINDOW_MIN_BYTES and self._win_time > 0:
            self._sample(self._win_bytes / self._win_time)
        self._win_bytes, self._win_time = 0, 0.0

    def _sample(self, sample: float) -> None:
        self.value = _ewma(self.value, sample, GOODPUT_GAIN)
        self.samples += 1
        log.debug("downlink sample %.3g B/s -> %.3g B/s", sample, self.value)


class RoundTrip:
    """Min-filtered, smoothed round-trip time."""

    def __init__(self, initial: float = DEFAULT_RTT):
        self.value = float(initial)
        self.samples = 0
        self._recent: collections.deque = collections.deque(maxlen=RTT_MIN_OF)

    def sample(self, rtt: float) -> None:
        if not (rtt >= 0):
            return
        self._recent.append(float(rtt))
        floor = min(self._recent)
        self.value = _ewma(self.value if self.samples else None, floor, RTT_GAIN)
        self.samples += 1


class ClockOffset:
    """The server's clock minus ours, from exchanges that echo our send time and carry the
    server's: t_server - (t_send + rtt / 2), taken from the quickest of the last few exchanges
    (the one least inflated by queueing or by this device reading late)."""

    def __init__(self):
        self.value: float | None = None
        #: How far off ``value`` can be: half the round trip it came from (the server stamped
        #: somewhere within it; the estimate assumes the middle).
        self.uncertainty: float | None = None
        self._recent: collections.deque = collections.deque(maxlen=8)

    def sample(self, t_send: float, t_server: float, t_recv: float) -> None:
        rtt = t_recv - t_send
        if rtt >= 0:
            self._recent.append((rtt, t_server - t_send - rtt / 2))
            best = min(self._recent)
            self.value, self.uncertainty = best[1], best[0] / 2

    def reset(self) -> None:
        self.value = self.uncertainty = None
        self._recent.clear()

    def to_local(self, t_server: float) -> float | None:
        return None if self.value is None else t_server - self.value

    def latest_local(self, t_server: float) -> float | None:
        """The latest our clock can have read at ``t_server``: to_local plus the uncertainty
        (a batch is taken as paced by the device only when it surely was)."""
        return None if self.value is None else t_server - self.value + (self.uncertainty or 0.0)


class Estimates:
    """Everything the engine knows about the link, the server and the device."""

    def __init__(self, bandwidth: float | None = None, device_flops: float | None = None):
        self.goodput = Goodput(bandwidth if bandwidth else DEFAULT_BANDWIDTH)
        self.down = Downlink()
        self.rtt = RoundTrip()
        self.clock = ClockOffset()
        self.server_flops = DEFAULT_SERVER_FLOPS
        self.server_flops_known = False
        self.alpha = 1.0
        self.server_load: dict = {}
        self.device_flops = float(device_flops) if device_flops else None
        self._device_fixed = device_flops is not None
        #: The device's rate on the graph it computes alone on (Engine.local_tg: fewer, larger
        #: tiles than the offloading graph's, which device_flops is of), or None: the gate's
        #: "local" takes device_flops then. Given device_flops: not learnt (device_flops is used).
        self.local_flops: float | None = None
        #: The offloading graph's rate over the local graph's on this device (Client.calibrate
        #: measures both): a local-graph run also moves device_flops, by this ratio, so that
        #: the planners see a device that slows down (heat, a quota) while it computes alone.
        self.graph_ratio: float | None = None
        #: How much later than predicted dynamic's offloaded inferences ended (s, EWMA): what
        #: the cost model leaves out on this device and link (the engine's CPU for the messages,
        #: which a CPU quota makes four times dearer; RESULTs read late) or overstates
        #: (streaming overlaps what it adds up).
        self.offload_error = 0.0
        self.offload_outcomes = 0
        #: The same per kind of plan (policies.dynamic_options: inputs, cut, share), with the
        #: uplink goodput it was last learnt at: what the model overstates differs by kind (the
        #: inputs plan streams the whole network behind its inputs, a share mostly waits for
        #: both parts), and comparing kinds at their raw predictions chose the slower one. An
        #: error learnt on a link more than ERROR_LINK_FACTOR faster or slower than today's is
        #: not used (a plan that waited on a 0.8 Mbit/s link says nothing about it at 8).
        #: kind -> (error, goodput then, offload_outcomes then)
        self.offload_errors: dict[str, tuple[float, float, int]] = {}
        #: Counts changes to what the planners read beyond the rates (wire ratios, errors).
        self.version = 0
        #: Per layer: bytes its tiles take on the wire per raw byte in the transfer encoding
        #: (set_transfer), learnt from every inference's tiles; None before set_transfer.
        self.wire: np.ndarray | None = None

    def set_transfer(self, mode: str, n_layers: int) -> None:
        self.wire = np.full(n_layers, WIRE_PRIOR[mode])
        self._wire_seen = np.zeros(n_layers, bool)

    def on_wire(self, raw: np.ndarray, encoded: np.ndarray) -> None:
        """One inference's raw and encoded bytes per layer (of the tiles completed here)."""
        if self.wire is None or raw.shape != self.wire.shape:
            return
        before = self.wire.copy()
        m = raw > 0
        ratio = encoded[m] / raw[m]
        seen = self._wire_seen[m]
        self.wire[m] = np.where(seen, self.wire[m] + WIRE_GAIN * (ratio - self.wire[m]), ratio)
        self._wire_seen[m] = True
        if np.abs(self.wire - before).max(initial=0.0) > GATE_STEP / 3:
            self.version += 1

    @property
    def bandwidth(self) -> float:
        return self.goodput.value

    def on_ack(self, key, t: float, t_server) -> float | None:
        """A batch's (or probe's) acknowledgement arrived at ``t``, stamped ``t_server`` by the
        server (anything but a number: unstamped): Goodput.acked with the stamp put on our
        clock at the latest its offset allows."""
        if not isinstance(t_server, (int, float)):
            return self.goodput.acked(key, t, self.rtt.value)
        return self.goodput.acked(key, t, self.rtt.value, t_server,
                                  self.clock.latest_local(t_server))

    @property
    def downlink(self) -> float:
        """Server-to-device goodput: measured from RESULTs, else the uplink's estimate."""
        return self.down.value if self.down.value else self.goodput.value

    def on_result(self, nbytes: int, t_server: float | None, t_recv: float) -> None:
        """A RESULT of ``nbytes`` the server stamped ``t_server`` (its clock) arrived at
        ``t_recv``."""
        if isinstance(t_server, (int, float)):
            self.down.result(nbytes, self.clock.to_local(float(t_server)), t_recv, self.rtt.value)

    def on_hello(self, info: dict) -> None:
        self.on_server_rate(info.get("server_flops"))

    def on_server_rate(self, flops) -> bool:
        """The server's FLOP rate (HELLO_OK, STATS: server-wide; MODEL_READY, DONE: on this
        device's graph); False when the value is none."""
        if type(flops) in (int, float) and flops > 0 and math.isfinite(flops):
            self.server_flops = float(flops)
            self.server_flops_known = True
            return True
        return False

    def on_stats(self, stats: dict) -> None:
        alpha = stats.get("alpha")
        if isinstance(alpha, (int, float)) and alpha == alpha:
            self.alpha = max(1.0, float(alpha))
        self.server_load = {k: stats[k] for k in ("inferences", "devices", "threads", "others")
                            if type(stats.get(k)) is int}
        self.on_server_rate(stats.get("server_flops"))

    def server_shared(self) -> bool:
        """The server computes for other devices too: its contention factor says so, or other
        devices began inferences there in the last few seconds (STATS' ``others``)."""
        return self.alpha > SHARED_ALPHA or self.server_load.get("others", 0) > 0

    def on_offloaded(self, predicted_s: float, actual_s: float, kind: str = "inputs") -> None:
        """A dynamic inference planned (a ``kind`` of plan) to take ``predicted_s`` offloaded
        took ``actual_s``."""
        if not (predicted_s > 0 and actual_s > 0):
            return
        err = actual_s - predicted_s
        self.offload_error = _ewma(self.offload_error if self.offload_outcomes else None, err,
                                   OFFLOAD_ERROR_GAIN)
        self.offload_outcomes += 1
        self.offload_errors[kind] = (_ewma(self._error(kind), err, OFFLOAD_ERROR_GAIN),
                                     self.bandwidth, self.offload_outcomes)
        self.version += 1

    def _error(self, kind: str) -> float | None:
        """The error learnt for ``kind`` when it was learnt on a link like today's, else None."""
        if kind not in self.offload_errors:
            return None
        err, bw, _n = self.offload_errors[kind]
        return err if bw / ERROR_LINK_FACTOR <= self.bandwidth <= bw * ERROR_LINK_FACTOR \
            else None

    def offloaded_s(self, predicted_s: float, kind: str | None = None) -> float:
        """``predicted_s`` corrected by the error of the offloaded inferences so far (of this
        kind of plan when given). A kind that has not run on a link like today's is expected
        to be late by the mean of the kinds that have (when they were late): part of every
        kind's error is the device's (its engine's CPU in a quota, a first inference's costs),
        and taken as predicted a kind not yet run let the gate offload where the kinds that
        had run had shown offloading slower than the device alone (MobileNetV2 at 100 Mbit/s in
        a 25% quota: a cut predicted 26 ms ran 39, then a share predicted 28 ran 39, beside
        28-31 ms on the device). As predicted when none has run. A negative error takes off at
        most half."""
        if kind is None:
            err = self.offload_error
        else:
            err = self._error(kind)
            if err is None:
                # (a late mean only: an early one is often a kind's own, the inputs plan's
                # streaming, and lent to a kind not yet run it would make that kind look better)
                seen = [e for e in map(self._error, OFFLOAD_KINDS) if e is not None]
                err = max(0.0, sum(seen) / len(seen)) if seen else 0.0
        return predicted_s + max(err, -0.5 * predicted_s)

    def stale_kinds(self, age: int) -> tuple[str, ...]:
        """The kinds of offloaded plan whose error, learnt on a link like today's, was last
        learnt ``age`` or more offloaded outcomes ago: one sample that ran in bad conditions
        (a probe train ahead of its inputs, a burst on the server) would otherwise keep a kind
        shut out for as long as the kind chosen instead keeps being chosen."""
        return tuple(k for k in OFFLOAD_KINDS
                     if self._error(k) is not None
                     and self.offload_outcomes - self.offload_errors[k][2] >= age)

    def unseen_kinds(self) -> tuple[str, ...]:
        """The kinds of offloaded plan with no error learnt on a link like today's
        (policies.dynamic_options)."""
        return tuple(k for k in OFFLOAD_KINDS if self._error(k) is None)

    def planning_key(self) -> tuple:
        """What a plan is made from: the rates, and the version of the rest (see plans_hold)."""
        return ((self.device_flops or 0.0, self.server_flops, self.bandwidth, self.downlink,
                 self.alpha), self.rtt.value, self.version)

    def _rate_ratios(self, key: tuple | None, step: float) -> list[float] | None:
        """Each rate now over its value at ``key`` (planning_key); None when more than the rates
        changed: the version, or the RTT beyond 0.5 ms and ``step``."""
        if key is None:
            return None
        rates, rtt, version = key
        now_rates, now_rtt, now_version = self.planning_key()
        if version != now_version or abs(now_rtt - rtt) > max(5e-4, step * max(rtt, now_rtt)):
            return None
        return [b / a if a > 0 else math.inf for a, b in zip(rates, now_rates)]

    def plans_hold(self, key: tuple | None, step: float = GATE_STEP) -> bool:
        """A plan made at ``key`` (planning_key) still stands: nothing but the rates changed,
        each rate is within ``step`` of what it was, and the RTT within 0.5 ms or ``step``."""
        ratios = self._rate_ratios(key, step)
        return ratios is not None and all(abs(r - 1.0) <= step for r in ratios)

    def drift(self, key: tuple | None) -> float:
        """The largest factor by which any rate of ``key`` (planning_key) has moved since (1.0:
        none), or inf when more than the rates changed (what plans_hold refuses besides)."""
        ratios = self._rate_ratios(key, GATE_STEP)
        if ratios is None or not all(0 < r < math.inf for r in ratios):
            return math.inf
        return max([1.0] + [max(r, 1.0 / r) for r in ratios])

    def stalest_kinds(self) -> tuple[str, ...]:
        """The kinds of offloaded plan, the one whose error was learnt longest ago (or never)
        first: what an exploring inference runs (policies.choose_dynamic)."""
        return tuple(sorted(OFFLOAD_KINDS,
                            key=lambda k: self.offload_errors.get(k, (0, 0, -1))[2]))

    def on_local_run(self, flops: float, seconds: float, local_graph: bool = False,
                     latency: float | None = None) -> None:
        """A whole inference ran here: flops / seconds (its tiles' span) is the device's rate
        on this model, on the offloading graph or (``local_graph``) the local one. On the local
        graph ``latency`` (from the inference's start to its end, the engine's work included),
        when given, is what the gate's local rate learns instead."""
        if self._device_fixed or not (seconds > 0) or not (flops > 0):
            return
        rate = flops / seconds
        if local_graph:
            whole = flops / latency if latency is not None and latency > 0 else rate
            self.local_flops = _ewma(self.local_flops, whole, DEVICE_GAIN)
            if self.graph_ratio is not None and self.device_flops is not None:
                self.device_flops = _ewma(self.device_flops, rate * self.graph_ratio,
                                          DEVICE_GAIN)
        else:
            self.device_flops = _ewma(self.device_flops, rate, DEVICE_GAIN)

    def snapshot(self) -> dict:
        return {
            "bandwidth_est_mbps": self.bandwidth * 8 / 1e6,
            "downlink_est_mbps": self.downlink * 8 / 1e6,
            "downlink_samples": self.down.samples,
            "rtt_est_ms": self.rtt.value * 1e3,
            "server_flops": self.server_flops,
            "alpha": self.alpha,
            # other devices that began inferences on the server lately (STATS)
            "server_others": self.server_load.get("others"),
            "device_flops": self.device_flops,
            "device_local_flops": self.local_flops,
            "goodput_samples": self.goodput.samples,
            "offload_error_ms": self.offload_error * 1e3,
            "offload_errors_ms": {k: v[0] * 1e3 for k, v in self.offload_errors.items()},
            "rtt_samples": self.rtt.samples,
        }
