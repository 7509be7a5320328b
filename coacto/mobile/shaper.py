"""The client's own bandwidth cap: rates that say bits or bytes, a token bucket per direction.

Without root (no network namespaces, no ``tc``), ``coacto-client --bandwidth 20mbit`` emulates a
slow link inside the client: every frame it sends waits in a token bucket before it reaches the
socket, and every frame it receives waits in another before it is processed. The model of the link
is the one ``tc tbf`` gives: tokens accrue at ``rate`` bytes per second up to ``burst`` while the
link is idle; a frame leaves once the tokens it needs have accrued. A frame larger than the bucket
borrows what the bucket cannot hold (the bucket goes into debt) and so leaves after exactly its
serialization time: a 256 kB batch on a 5 Mbit/s link is released 0.42 s after the link became free
for it, as the last byte of a real transfer would arrive. That keeps the acknowledgement timing
honest, so the goodput the engine measures from ACKs is the cap, not the loopback's speed.

The cap applies to inference traffic; the one-time model upload is setup and goes unshaped.

The engine never sleeps in here: ``reserve`` books the link and returns the release time, which the
engine uses as its poll timeout.
"""
from __future__ import annotations

import math
import re

from ..errors import CoactoError

__all__ = ["RateError", "parse_rate", "parse_schedule", "format_rate", "format_bytes_rate",
           "describe_schedule", "TokenBucket", "UNCAPPED"]

#: How a prefix is written back in messages.
_PREFIX_TEXT = {"": "", "k": "k", "m": "M", "g": "G", "t": "T", "ki": "Ki", "mi": "Mi", "gi": "Gi",
                "ti": "Ti"}
#: Unit prefixes, read in any case: decimal (k = 1000) and binary (Ki = 1024).
_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
             "ki": 1024.0, "mi": 1024.0 ** 2, "gi": 1024.0 ** 3, "ti": 1024.0 ** 4}
_P = "(|k|m|g|t|ki|mi|gi|ti)"
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]*)\s*$", re.IGNORECASE)
_BITS_RE = re.compile(rf"^{_P}bits?(/s)?$")            # matched against the lower-cased unit
_BYTE_WORDS_RE = re.compile(rf"^{_P}bytes?/s$")        # likewise
_BYTE_LETTER_RE = re.compile(r"^([kKmMgGtT][iI]?|)B/[sS]$")  # any-case prefix, a capital B
_BPS_RE = re.compile(rf"^{_P}bps$")
_LOWER_B_RE = re.compile(rf"^{_P}b/s$")
_SIZE_RE = re.compile(rf"^{_P}(b|bytes?)$")
ACCEPTED_UNITS = ("bit, kbit, Mbit, Gbit (also Kibit, Mibit, ...; '/s' optional) for bits per "
                  "second; B/s, kB/s, MB/s, GB/s, KiB/s, MiB/s (or byte/s, kbyte/s, ...) for bytes "
                  "per second")


class RateError(CoactoError, ValueError):
    """A bandwidth that cannot be parsed, is ambiguous, or is not positive."""


def parse_rate(rate) -> float:
    """A rate -> bytes per second. Every accepted string has one meaning, whatever its case.

    Bits per second: ``"20mbit"``, ``"20Mbit/s"``, ``"500kbit"``, ``"1gbit"`` (tc's spelling, with
    or without ``/s``), binary ``"8Mibit"``. Bytes per second: ``"2.5MB/s"``, ``"100kB/s"``,
    ``"1MiB/s"``, ``"2.5MByte/s"``. Prefixes are read in any case (k = 1000, Ki = 1024).

    Refused, with a message that says what to write: the ``bps`` family (``"20Mbps"``,
    ``"20mbps"``, ``"20MBps"``), because networking reads ``Mbps`` as megabits while tc reads
    ``mbps`` as megabytes, so the same letters differ eightfold by who reads them; a lower-case
    ``b/s`` (``"20Mb/s"``), whose bits-or-bytes hangs on the case of one letter; a size without
    ``/s`` (``"20MB"``); and a string without a unit (``"8000"``: tc would read bits, the
    simulator's ``--bandwidth`` reads Mbit/s).

    A Python number (int or float) is bits per second, tc's default unit.
    """
    if isinstance(rate, bool):
        raise RateError(f"bandwidth must be a rate such as '20mbit', not {rate!r}")
    if isinstance(rate, (int, float)):
        bps = float(rate) / 8
    elif isinstance(rate, str):
        bps = _parse_rate_text(rate)
    else:
        raise RateError(f"bandwidth must be a string such as '20mbit' or a number of bits/s, "
                        f"not {type(rate).__name__}")
    if not (bps > 0) or math.isinf(bps):
        raise RateError(f"bandwidth {rate!r} must be positive and finite")
    if bps < 100:
        raise RateError(f"bandwidth {rate!r} is below 800 bit/s: nothing useful gets through; "
                        "check the unit")
    return bps


def _parse_rate_text(rate: str) -> float:
    m = _RATE_RE.match(rate)
    if not m:
        raise RateError(f"cannot read bandwidth {rate!r}: write a number and a unit, e.g. "
                        "'20mbit' or '20Mbit/s' (bits/s), '2.5MB/s' (bytes/s)")
    number, unit = m.group(1), m.group(2)
    value, low = float(number), unit.lower()
    if not unit:
        raise RateError(f"bandwidth {rate!r} has no unit: write '{number}bit' (bits/s) or "
                        f"'{number}B/s' (bytes/s); e.g. '20mbit' for 20 megabits per second")
    if (hit := _BITS_RE.match(low)):
        return value * _PREFIXES[hit.group(1)] / 8
    if (hit := _BYTE_WORDS_RE.match(low)) or (hit := _BYTE_LETTER_RE.match(unit)):
        return value * _PREFIXES[hit.group(1).lower()]
    hit = _BPS_RE.match(low) or (unit.endswith("b/s") and _LOWER_B_RE.match(low))
    if hit:
        bits = value * _PREFIXES[hit.group(1)]
        pre = _PREFIX_TEXT[hit.group(1)]
        why = (f"a 'bps' unit reads as bits per second in networking, as bytes per second in "
               f"tc, and its 'b' or 'B' is often typed either way"
               if low.endswith("bps") else "bits or bytes hangs on the case of one letter")
        raise RateError(f"bandwidth {rate!r} is ambiguous ({why}): write '{number}{pre}bit/s' for "
                        f"{format_rate(bits / 8)} ({format_bytes_rate(bits / 8)}) or "
                        f"'{number}{pre}B/s' for {format_bytes_rate(bits)} "
                        f"({format_rate(bits)})")
    if (hit := _SIZE_RE.match(low)):
        pre = _PREFIX_TEXT[hit.group(1)]
        raise RateError(f"bandwidth {rate!r} is a size, not a rate: write '{number}{pre}B/s' "
                        f"(bytes per second) or '{number}{pre}bit' (bits per second)")
    raise RateError(f"unknown bandwidth unit {unit!r} in {rate!r}; use {ACCEPTED_UNITS}")


def parse_schedule(spec) -> list[tuple[float, float]]:
    """A rate, or a rate that changes over time -> [(seconds, bytes per second), ...] from 0.

    ``"20mbit"``: one rate. ``"100mbit,5mbit@2.5,100mbit@6"``: 100 Mbit/s from the start, 5 from
    2.5 s, 100 again from 6 s (times since the client was created, increasing; an ``s`` after
    the number is allowed). Each rate is read by parse_rate.
    """
    if not isinstance(spec, str) or "," not in spec and "@" not in spec:
        return [(0.0, parse_rate(spec))]
    steps: list[tuple[float, float]] = []
    for i, part in enumerate(spec.split(",")):
        rate, at, when = part.partition("@")
        if i == 0 and at:
            when_s = _seconds(when, spec)
            if when_s != 0:
                raise RateError(f"bandwidth schedule {spec!r}: the first rate holds from 0 s; "
                                "write e.g. '100mbit,5mbit@2.5'")
        elif i > 0 and not at:
            raise RateError(f"bandwidth schedule {spec!r}: every rate after the first needs "
                            f"@SECONDS (e.g. '5mbit@2.5'), {part!r} has none")
        t = _seconds(when, spec) if at else 0.0
        if steps and not t > steps[-1][0]:
            raise RateError(f"bandwidth schedule {spec!r}: times must increase ({t:g} s after "
                            f"{steps[-1][0]:g} s)")
        steps.append((t, parse_rate(rate)))
    return steps


def _seconds(text: str, spec: str) -> float:
    text = text.strip().lower().removesuffix("s")
    try:
        t = float(text)
    except ValueError:
        raise RateError(f"bandwidth schedule {spec!r}: {text!r} is not a time in seconds") from None
    if not (0.0 <= t < 1e6):
        raise RateError(f"bandwidth schedule {spec!r}: times must lie in [0, 1e6) s, got {t!r}")
    return t


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second -> a short human string in bits (``"20 Mbit/s"``)."""
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def format_bytes_rate(bytes_per_s: float) -> str:
    """Bytes per second -> a short human string in bytes (``"2.5 MB/s"``)."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def describe_schedule(steps: list[tuple[float, float]]) -> str:
    """parse_schedule's steps in words, bits and bytes both: what a command echoes at start, so
    a unit read otherwise than meant shows before any result does."""
    parts = []
    for i, (t, rate) in enumerate(steps):
        text = f"{format_rate(rate)} ({format_bytes_rate(rate)})"
        parts.append(text if i == 0 else f"{text} from {t:g} s")
    return ", then ".join(parts)


#: The rate of a link that only adds delay (``--rtt-ms`` without ``--bandwidth``): no frame waits
#: for tokens.
UNCAPPED = 1e15


class TokenBucket:
    """A link of ``rate`` bytes/s that lends up to ``burst`` bytes of idle credit, and whose frames
    arrive ``delay`` seconds after they have crossed it (propagation: half an added round trip).

    ``reserve(n, now)`` books the link for an ``n``-byte frame handed over at ``now`` and returns
    the time the frame may be released at the far end (``now`` + ``delay`` when credit covers
    it). Frames are released in the order they were reserved. ``free_at(now)`` is when the link
    has no frame booked any more.
    """

    def __init__(self, rate: float, burst: float | None = None, delay: float = 0.0):
        if not (rate > 0):
            raise RateError(f"a token bucket needs a positive rate, got {rate!r}")
        if not (0.0 <= delay < 60.0):
            raise RateError(f"a link delay must lie in [0, 60) seconds, got {delay!r}")
        self.delay = float(delay)
        self.rate = float(rate)
        # Two milliseconds of credit (at least one Ethernet frame): a cap close to the nominal
        # rate even for the first frame after an idle period, like `tc tbf` with a small burst.
        self._burst_given = burst is not None
        self.burst = float(burst) if burst is not None else max(1500.0, self.rate * 0.002)
        self._tokens = self.burst
        self._t = None  # time up to which tokens are accounted (may lie in the future: booked)

    def book(self, n: int, now: float) -> tuple[float, float]:
        """Like reserve; returns (when the frame starts to occupy the link, its release)."""
        start = now if self._t is None else max(now, self._t)
        return start, self.reserve(n, now)

    def rewind(self, t: float) -> None:
        """Forgets bookings after ``t`` (frames withdrawn before they were sent): the link is
        busy until ``t`` and has no credit then."""
        if self._t is None or t < self._t:
            self._t = t
            self._tokens = 0.0

    def reserve(self, n: int, now: float) -> float:
        if self._t is None:
            self._t = now
        if now > self._t:  # idle since the last booking: tokens accrue up to the burst
            self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
            self._t = now
        need = n - self._tokens
        if need <= 0:
            self._tokens -= n
            return max(now, self._t) + self.delay
        # Borrow: the frame leaves when the missing tokens have accrued; the bucket is empty then.
        self._t += need / self.rate
        self._tokens = 0.0
        return self._t + self.delay

    def set_rate(self, rate: float, now: float) -> None:
        """The link's rate changes at ``now`` (``tc change``). Frames booked before keep their
        release times: the Link re-books what it still holds (Link.set_rate)."""
        if not (rate > 0):
            raise RateError(f"a token bucket needs a positive rate, got {rate!r}")
        if self._t is not None and now > self._t:  # credit earned at the old rate until now
            self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
            self._t = now
        self.rate = float(rate)
        if not self._burst_given:
            self.burst = max(1500.0, self.rate * 0.002)
            self._tokens = min(self._tokens, self.burst)

    def free_at(self, now: float) -> float:
        return now if self._t is None else max(now, self._t)
