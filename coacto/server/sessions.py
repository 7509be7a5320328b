"""Per-device state on the server (sessions and their inferences) and the load figures the server
reports to devices: the contention factor alpha and the FLOP rate estimate.

alpha (docs/PROTOCOL.md, "Contention"): every inference whose inputs have all arrived is
*computing* on the shared runtime. The server keeps time-weighted moving averages (time constant
ALPHA_TAU seconds) of the number of computing inferences, server-wide (C_all) and per device
(C_dev). A device should expect its next inference to get 1 / alpha of the server, with

    alpha = 1 + max(0, C_all - C_dev)

i.e. one plus the other devices' computing inferences, each assumed able to use every thread (a
pessimistic bound that is exact for a saturated server). The device's own inferences are left out:
it knows about them itself.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from .. import protocol as P
from ..inference import NativeInference
from .store import GraphEntry

#: Time constant (seconds) of the moving averages behind alpha.
ALPHA_TAU = 1.0
#: Weight of one measured inference in the server's FLOP rate estimate (EWMA).
FLOPS_EWMA_WEIGHT = 0.3
#: Inferences smaller than this (FLOPs) measure per-tile overheads more than the server's speed;
#: they refine their own graph's rate, not the server-wide estimate.
FLOPS_MIN_SAMPLE = 1e8
#: Freed inference ids remembered per device, to explain late tiles cheaply.
RECENT_FREED = 64


class LoadAverage:
    """Time-weighted exponential moving average of a piecewise-constant level."""

    def __init__(self, t: float, tau: float = ALPHA_TAU):
        self.tau = tau
        self.t = t
        self.level = 0
        self.value = 0.0

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            self.value += (1.0 - math.exp(-dt / self.tau)) * (self.level - self.value)
            self.t = t

    def add(self, delta: int, t: float) -> None:
        self._advance(t)
        self.level += delta

    def get(self, t: float) -> float:
        self._advance(t)
        return self.value


def alpha(all_computing: LoadAverage, device_computing: LoadAverage, t: float) -> float:
    return 1.0 + max(0.0, all_computing.get(t) - device_computing.get(t))


class ServedInference:
    """One device's inference on the server: the native inference and what has been sent back."""

    __slots__ = ("inf_id", "tag", "native", "entry", "session", "sent", "n_sent", "inputs_seen",
                 "n_inputs_seen", "t_begin", "t_inputs", "contended", "tiles_in", "bytes_in",
                 "duplicates", "computing", "trace", "result_enc")

    def __init__(self, inf_id, tag: int, native: NativeInference, entry: GraphEntry, session,
                 t: float):
        self.inf_id = inf_id
        self.tag = tag
        self.native = native
        self.entry = entry
        self.session = session
        n = entry.tg.n_tiles
        self.sent = np.zeros(n, bool)           # output tiles already in a RESULT
        self.n_sent = 0
        self.inputs_seen = np.zeros(n, bool)    # input tiles received
        self.n_inputs_seen = 0
        self.t_begin = t
        self.t_inputs = None                    # when the last input tile arrived
        self.contended = False                  # another one had tiles or computed meanwhile
        self.tiles_in = 0
        self.bytes_in = 0
        self.duplicates = 0
        self.computing = False
        self.result_enc: str | None = None      # RESULT data encoded so (BEGIN result_enc)
        self.trace: TraceLog | None = None     # when BEGIN asked for the server's side

    def note_inputs(self, ids: np.ndarray) -> bool:
        """Records received input tiles; True when this batch completed the inputs."""
        info = self.entry.info
        if self.t_inputs is not None or info.n_inputs == 0:
            return False
        new = ids[info.is_input[ids] & ~self.inputs_seen[ids]]
        if new.size:
            self.inputs_seen[new] = True
            self.n_inputs_seen = int(self.inputs_seen.sum())
        return self.n_inputs_seen == info.n_inputs

    def unsent_outputs(self) -> np.ndarray:
        mask = self.entry.info.output_mask.astype(bool) & ~self.sent
        return np.flatnonzero(mask).astype(np.int32)


class TraceLog:
    """What the server did with a traced inference's tiles besides computing them (the runtime
    records those): when each TILES batch was taken in and each RESULT sent. Bounded at
    ``TRACE_ROWS_PER_TILE - 1`` rows per tile of the graph (a device that re-sends tiles must not
    grow the server's memory); beyond that rows are dropped and the reply says it was truncated."""

    __slots__ = ("parts", "rows", "max_rows", "truncated")

    def __init__(self, n_tiles: int):
        self.parts: list = []  # (ids, t0, t1, kind)
        self.rows = 0
        self.max_rows = (P.TRACE_ROWS_PER_TILE - 1) * n_tiles  # received + returned rows
        self.truncated = False

    def add(self, ids: np.ndarray, t0: float, t1: float, kind: int) -> None:
        if self.rows + ids.size > self.max_rows:
            self.truncated = True
            return
        self.parts.append((np.array(ids, np.int32), t0, t1, kind))
        self.rows += ids.size

    def message(self, si: "ServedInference", t: float) -> tuple[dict, list]:
        """The TRACE reply: every tile the runtime computed, then the logged rows."""
        t0, t1, worker = si.native.tile_trace()
        done = np.flatnonzero(worker >= 0).astype(np.int32)
        ids = [done] + [p[0] for p in self.parts]
        start = [t0[done]] + [np.full(p[0].size, p[1]) for p in self.parts]
        end = [t1[done]] + [np.full(p[0].size, p[2]) for p in self.parts]
        kind = [worker[done]] + [np.full(p[0].size, p[3], np.int32) for p in self.parts]
        frames = P.pack_trace_rows(*(np.concatenate(a) for a in (ids, start, end, kind)))
        header = {"t": P.TRACE, "inf": si.inf_id, "rows": int(frames[0].size),
                  "t_begin": si.t_begin, "t_inputs": si.t_inputs, "t_server": t,
                  "threads": si.native.rt.threads, "truncated": self.truncated}
        return header, frames


class Session:
    """One connection of a device (one ROUTER routing id): its inferences, liveness, load
    average and the result bytes handed to ZeroMQ but not yet sent.

    ``owner`` is who the device is: its authenticated CURVE public key on a server with keys,
    else ``"addr:"`` + its IP address (all a server without keys can know). Limits per device
    count per owner; models a device uploaded are bound to it."""

    def __init__(self, identity: bytes, t: float, owner: str = "", peer: str = ""):
        self.identity = identity
        #: which device this connection is, for counting the devices sharing the server: the
        #: connection itself unless HELLO named its device (Tenants.name_device)
        self.device_key: object = identity
        self.name = identity.hex()[:16] if identity else "?"
        self.owner = owner
        self.peer = peer
        self.last_seen = t
        self.inferences: dict = {}
        self.recent_freed: deque = deque(maxlen=RECENT_FREED)
        self.computing = LoadAverage(t)
        self.client = ""
        self.version = None
        self.pending_jobs = 0
        self.messages = 0
        self.began = 0  # inferences begun on this connection
        # (zmq MessageTracker, bytes, inference tag) of RESULT / TRACE frames not yet sent
        self.unsent: deque = deque()
        self.unsent_bytes = 0

    def track(self, tracker, nbytes: int, tag: int) -> None:
        self.unsent.append((tracker, nbytes, tag))
        self.unsent_bytes += nbytes

    def reap(self) -> int:
        """Forgets the frames ZeroMQ has sent (or dropped); the bytes still queued for this
        device."""
        while self.unsent and self.unsent[0][0].done:
            self.unsent_bytes -= self.unsent.popleft()[1]
        return self.unsent_bytes

    def unsent_before(self, tag: int) -> int:
        """Bytes still queued for this device from other inferences than ``tag``."""
        return self.unsent_bytes - sum(n for _t, n, g in self.unsent if g == tag)

    @property
    def idle(self) -> bool:
        """Holds nothing the device waits for, and no results ZeroMQ still queues for it (reap
        first): may be evicted to make room (a later message from it makes a fresh session;
        nothing in the protocol needs the old one)."""
        return not self.inferences and not self.pending_jobs and not self.unsent


class FlopEstimate:
    """The server's FLOP rate for one device: calibrated at start, refined by measured inferences
    the server computed alone (the FLOPs it computed / the time its computing threads were on the
    inference's tiles), as an EWMA."""

    def __init__(self, calibrated: float):
        self.calibrated = float(calibrated)
        self.value = float(calibrated)
        self.samples = 0

    def record(self, entry: GraphEntry, flops: float, seconds: float) -> None:
        if seconds <= 0 or flops <= 0 or not math.isfinite(flops / seconds):
            return
        rate = flops / seconds
        w = FLOPS_EWMA_WEIGHT
        entry.flops = rate if entry.flops is None else (1 - w) * entry.flops + w * rate
        if flops >= FLOPS_MIN_SAMPLE:
            self.value = (1 - w) * self.value + w * rate
            self.samples += 1

    def for_graph(self, entry: GraphEntry | None) -> float:
        if entry is not None and entry.flops is not None:
            return entry.flops
        return self.value


#: The calibration GEMM: a mid-network 3x3 convolution of a ResNet at 224x224 (256 filters over
#: 14x14 positions, 3*3*128 inputs per output), about 115 MFLOP.
CALIBRATION_GEMM = (256, 196, 1152)
#: Share of (threads x single-thread GEMM rate) a whole tile graph sustains: per-tile overheads,
#: memory-bound layers (pooling, elementwise), dependency stalls. Measured inferences replace it.
CALIBRATION_EFFICIENCY = 0.6


def calibrate_flops(threads: int, repeats: int = 5, min_seconds: float = 0.25) -> float:
    """FLOP/s the server expects to give one device, before any inference was measured:
    best single-thread rate of the calibration GEMM x min(threads, CPUs) x
    CALIBRATION_EFFICIENCY. The best of runs spread over ``min_seconds``: a burst of other work
    on the core (another runtime's threads spinning down) must not halve the estimate."""
    import time

    from ..native import lib
    from ..runtime import default_threads

    m, n, k = CALIBRATION_GEMM
    start, best = time.perf_counter(), 0.0
    while True:
        b = lib.coacto_gemm_benchmark(m, n, k, repeats)
        if b > 0 and (best == 0 or b < best):
            best = b
        if time.perf_counter() - start >= min_seconds:
            break
    per_thread = 2.0 * m * n * k / best if best > 0 else 1e9
    return per_thread * max(1, min(int(threads), default_threads())) * CALIBRATION_EFFICIENCY
