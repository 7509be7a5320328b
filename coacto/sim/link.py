"""Links for the simulator: bandwidth traces and one direction of a device's connection.

A link carries messages one after the other, each serialised at the bandwidth in force while its
bytes cross (a piecewise-constant trace applies to every transfer in flight, so a step in the
middle of a message changes its finish time), then half the round-trip time of propagation. That
is the device's own shaper (coacto/mobile/shaper.py) with the bandwidth allowed to vary; with
``burst_bytes`` it is a token bucket as tc's tbf (the testbed's kernel shaping): after the link
idled, up to that many bytes pass at once. A message withdrawn before it left gives its link time back to
the messages behind it, as Link.drop_job in coacto/mobile/link.py.

``lte_trace`` and ``wifi_trace`` are SYNTHETIC: random walks with shapes chosen by hand to look
like a cellular uplink (tens of Mbit/s at best, deep fades) and a shared Wi-Fi link (faster,
steadier, contention dips). They are not measured and come from no data set; use a measured
trace (a list of (t, mbps) steps) for anything that must match a real network.
"""
from __future__ import annotations

import bisect
import collections
import math

import numpy as np

from ..errors import CoactoError


class TraceError(CoactoError, ValueError):
    """A bandwidth trace that cannot be used (empty, unordered, negative)."""


def mbps_to_bytes(mbps: float) -> float:
    return float(mbps) * 1e6 / 8.0


class BandwidthTrace:
    """Piecewise-constant bandwidth: ``steps`` is a list of (t seconds, Mbit/s); each rate holds
    from its t until the next step, the last one for ever. The first step must be at t = 0."""

    def __init__(self, steps, name: str | None = None):
        try:
            steps = [(float(t), float(m)) for t, m in steps]
        except (TypeError, ValueError):
            raise TraceError("a bandwidth trace is a list of (t seconds, Mbit/s) pairs") from None
        if not steps:
            raise TraceError("a bandwidth trace needs at least one (t, Mbit/s) step")
        if steps[0][0] != 0.0:
            raise TraceError(f"a bandwidth trace starts at t = 0 (its first step is at "
                             f"{steps[0][0]:g} s); add a (0, Mbit/s) step")
        for (t0, _), (t1, _) in zip(steps, steps[1:]):
            if not t1 > t0:
                raise TraceError(f"bandwidth trace times must increase (… {t0:g}, {t1:g} …)")
        for t, m in steps:
            if not (m >= 0) or math.isinf(m):
                raise TraceError(f"bandwidth at t = {t:g} s must be a finite number of Mbit/s "
                                 f">= 0, got {m!r}")
        if steps[-1][1] <= 0:
            raise TraceError("a bandwidth trace must end with a positive rate (else nothing "
                             "sent after it ever arrives); append a step")
        self.steps = steps
        self.name = name
        self.times = [t for t, _ in steps]
        self.rates = [mbps_to_bytes(m) for _, m in steps]

    @classmethod
    def constant(cls, mbps: float) -> "BandwidthTrace":
        if not (float(mbps) > 0):
            raise TraceError(f"bandwidth must be positive, got {mbps!r} Mbit/s")
        return cls([(0.0, mbps)], name=f"{mbps:g} Mbit/s")

    @property
    def constant_rate(self) -> float | None:
        return self.rates[0] if len(self.rates) == 1 else None

    def rate_at(self, t: float) -> float:
        """Bytes per second at time ``t``."""
        return self.rates[max(0, bisect.bisect_right(self.times, t) - 1)]

    def mbps_at(self, t: float) -> float:
        return self.rate_at(t) * 8 / 1e6

    def transfer_end(self, t0: float, nbytes: float) -> float:
        """When ``nbytes`` that start crossing at ``t0`` have all crossed."""
        if nbytes <= 0:
            return t0
        rates, times = self.rates, self.times
        if len(rates) == 1:
            return t0 + nbytes / rates[0]
        i = max(0, bisect.bisect_right(times, t0) - 1)
        t, left = t0, float(nbytes)
        while True:
            r = rates[i]
            end = times[i + 1] if i + 1 < len(times) else math.inf
            if r > 0:
                need = left / r
                if t + need <= end:
                    return t + need
                left -= (end - t) * r
            t = end
            i += 1

    def mean_mbps(self, until: float) -> float:
        """Average Mbit/s over [0, until]."""
        if until <= 0:
            return self.mbps_at(0.0)
        return self.transfer_volume(0.0, until) * 8 / 1e6 / until

    def transfer_volume(self, t0: float, t1: float) -> float:
        total, times, rates = 0.0, self.times, self.rates
        for i, start in enumerate(times):
            end = times[i + 1] if i + 1 < len(times) else math.inf
            lo, hi = max(start, t0), min(end, t1)
            if hi > lo:
                total += (hi - lo) * rates[i]
        return total

    def to_list(self) -> list[list[float]]:
        return [[t, m] for t, m in self.steps]


def _walk(duration_s: float, step_s: float, seed: int, mean_mbps: float, sigma: float, ar: float,
          dips_per_s: float, dip_mbps: tuple, dip_s: tuple, floor: float, cap: float, name: str):
    if not (duration_s > 0 and step_s > 0):
        raise TraceError("duration_s and step_s must be positive")
    rng = np.random.default_rng(seed)
    n = max(1, int(math.ceil(duration_s / step_s)))
    mu = math.log(mean_mbps) - sigma ** 2 / 2  # the walk's mean rate is mean_mbps
    x = mu
    rates = np.empty(n)
    for i in range(n):
        x = mu + ar * (x - mu) + sigma * math.sqrt(1 - ar * ar) * rng.standard_normal()
        rates[i] = math.exp(x)
    t = 0.0
    while True:  # dips (handover, fading, contention): Poisson arrivals
        t += rng.exponential(1.0 / dips_per_s) if dips_per_s > 0 else math.inf
        if t >= duration_s:
            break
        length = rng.uniform(*dip_s)
        lo, hi = int(t / step_s), int(min(duration_s, t + length) / step_s) + 1
        rates[lo:hi] = np.minimum(rates[lo:hi], rng.uniform(*dip_mbps))
    rates = np.clip(rates, floor, cap)
    steps = [(i * step_s, round(float(r), 3)) for i, r in enumerate(rates)]
    return BandwidthTrace(steps, name=name)


def lte_trace(duration_s: float = 60.0, seed: int = 0, step_s: float = 0.1,
              mean_mbps: float = 12.0) -> BandwidthTrace:
    """A SYNTHETIC LTE-like uplink (not measured): a log-normal random walk around
    ``mean_mbps`` with strong variation (sigma 0.6, correlation 0.9 per step) and a fade to
    0.2-2 Mbit/s for 0.2-1.5 s every 10 s on average; clipped to 0.1-60 Mbit/s."""
    return _walk(duration_s, step_s, seed, mean_mbps, 0.6, 0.9, 0.1, (0.2, 2.0), (0.2, 1.5),
                 0.1, 60.0, f"synthetic LTE-like (seed {seed})")


def wifi_trace(duration_s: float = 60.0, seed: int = 0, step_s: float = 0.1,
               mean_mbps: float = 60.0) -> BandwidthTrace:
    """A SYNTHETIC Wi-Fi-like link (not measured): a log-normal random walk around
    ``mean_mbps`` with moderate variation (sigma 0.25, correlation 0.8 per step) and a
    contention dip to 5-20 Mbit/s for 0.1-0.5 s every 5 s on average; clipped to 1-200 Mbit/s."""
    return _walk(duration_s, step_s, seed, mean_mbps, 0.25, 0.8, 0.2, (5.0, 20.0), (0.1, 0.5),
                 1.0, 200.0, f"synthetic Wi-Fi-like (seed {seed})")


def make_trace(spec) -> BandwidthTrace:
    """A BandwidthTrace from a number (Mbit/s), a list of (t, Mbit/s) steps or a trace."""
    if isinstance(spec, BandwidthTrace):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return BandwidthTrace.constant(spec)
    return BandwidthTrace(spec)


class Msg:
    """A message on a link: its kind (coacto.protocol's names), size on the wire, the job it
    belongs to and what it carries."""

    __slots__ = ("kind", "nbytes", "job", "data", "start", "release", "version", "dropped")

    def __init__(self, kind: str, nbytes: int, job=None, data=None):
        self.kind, self.nbytes, self.job, self.data = kind, int(nbytes), job, data
        self.start = self.release = 0.0
        self.version = 0
        self.dropped = False


class Link:
    """One direction of one connection (see the module text). ``on_release(msg, t)`` is called
    when a message's last byte has left (False drops it there), ``on_arrive(msg, t)`` half an
    RTT later."""

    def __init__(self, loop, trace: BandwidthTrace, delay_s: float, on_release=None,
                 on_arrive=None, tiles_kind: str | None = None, burst_bytes: float = 0.0):
        self.loop = loop
        self.trace = trace
        # a token bucket's depth (tc tbf's burst): after the link idled, this many bytes pass
        # at once (a veth's line rate), the rest at the trace's rate
        self.burst = float(burst_bytes or 0.0)
        self._tokens = self.burst
        self._tokens_t = 0.0
        self.delay = float(delay_s)
        self.on_release = on_release
        self.on_arrive = on_arrive
        self.tiles_kind = tiles_kind
        self.held: collections.deque = collections.deque()
        self.free_at = 0.0
        self.backlog_bytes = 0  # tile bytes booked on the link and not yet released
        self.bytes_carried = 0

    def send(self, msg: Msg, t: float) -> None:
        self._book(msg, t)
        self.held.append(msg)
        if msg.kind == self.tiles_kind:
            self.backlog_bytes += msg.nbytes

    def _book(self, msg: Msg, t: float) -> None:
        msg.start = max(t, self.free_at)
        if self.burst:
            tokens = min(self.burst, self._tokens
                         + self.trace.transfer_volume(self._tokens_t, msg.start))
            instant = min(tokens, float(msg.nbytes))
            msg.release = self.trace.transfer_end(msg.start, msg.nbytes - instant)
            self._tokens, self._tokens_t = tokens - instant, msg.release
        else:
            msg.release = self.trace.transfer_end(msg.start, msg.nbytes)
        msg.version += 1
        self.free_at = msg.release
        self.loop.at(msg.release, self._released, msg, msg.version)

    def _released(self, msg: Msg, version: int) -> None:
        if msg.dropped or version != msg.version:
            return
        t = self.loop.now
        if self.held and self.held[0] is msg:
            self.held.popleft()
        else:  # cannot happen with FIFO bookings; kept robust
            self.held.remove(msg)
        if msg.kind == self.tiles_kind:
            self.backlog_bytes -= msg.nbytes
        if self.on_release is not None and self.on_release(msg, t) is False:
            return
        self.bytes_carried += msg.nbytes
        if self.on_arrive is not None:
            self.loop.at(t + self.delay, self.on_arrive, msg)

    def drop(self, job, kinds, t: float) -> list[Msg]:
        """Withdraws ``job``'s messages of ``kinds`` that have not left yet and books the others
        again from where the first withdrawn one started (or ``t``); returns the withdrawn."""
        if not any(m.job is job and m.kind in kinds for m in self.held):
            return []
        dropped, keep, rebook_from = [], collections.deque(), None
        for m in self.held:
            if m.job is job and m.kind in kinds:
                m.dropped = True
                dropped.append(m)
                if m.kind == self.tiles_kind:
                    self.backlog_bytes -= m.nbytes
                if rebook_from is None:
                    rebook_from = m.start
            else:
                keep.append(m)
        self.held = keep
        self.free_at = max(rebook_from, t)
        for m in keep:
            if m.start >= rebook_from:  # (those already crossing keep their booking)
                self._book(m, t)
        return dropped
