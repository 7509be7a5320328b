"""Machine profiles for the simulator: sustained FLOP rates per op class and thread count, the
per-tile overhead, and optionally the link a profile was measured over.

A profile is JSON in ``profiles/`` (docs/ARCHITECTURE.md §6), written by ``coacto profile`` on the machine
itself or derived from public figures (then its ``source`` says so)::

    {
      "name": "raspberry-pi-4",
      "format": 1,
      "source": "where every number comes from",
      "cores": 4,
      "gflops": {"1": {"conv": 2.9, "gemm": 3.4, "depthwise": 0.8, "elementwise": 0.4,
                       "other": 0.4},
                 "4": {...}},
      "tile_overhead_us": 20.0,
      "link": {"goodput_mbps": 94.0, "rtt_ms": 0.4}          (optional)
    }

``gflops[T][class]`` is what the whole machine sustains with T computing threads on tiles of that
op class (GFLOP/s, FLOPs as coacto counts them: a multiply-add is two). Between measured thread
counts the rate is interpolated linearly; beyond the largest one each further thread adds that
count's per-thread rate (optimistic: no memory-bandwidth ceiling is modelled). Threads beyond
``cores`` add nothing.

Profiles written by ``experiments/profile_machine.py`` (``xeon-avx512-2core.json``) carry no
per-class rates: every class then gets the FLOP rate the machine sustained on whole zoo models
(``models[].coacto_gflops_per_s``), and the per-tile overhead their ``tile_overhead`` figure.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CoactoError

log = logging.getLogger(__name__)

#: Op classes a profile rates separately (docs/ARCHITECTURE.md §6: "sustained FLOP/s per operator class").
OP_CLASSES = ("conv", "gemm", "depthwise", "elementwise", "other")
CONV, GEMM, DEPTHWISE, ELEMENTWISE, OTHER = range(len(OP_CLASSES))
PROFILE_FORMAT = 1
#: Where profiles live: profiles/ at the top of the repository (COACTO_PROFILES overrides).
PROFILE_DIR = Path(os.environ.get("COACTO_PROFILES")
                   or Path(__file__).resolve().parents[2] / "profiles")


class ProfileError(CoactoError, ValueError):
    """A machine profile that is missing, unreadable or lacks a field the simulator needs."""


def op_class(graph, li: int) -> int:
    """The op class (index into OP_CLASSES) of layer ``li`` of an ir.Graph.

    conv: spatial convolutions (kernel larger than 1x1, one group); gemm: 1x1 convolutions,
    fully connected layers (a kernel covering the whole input) and matrix products; depthwise:
    grouped convolutions; elementwise: BINARY, AFFINE, WHERE; other: pooling, normalisation,
    softmax, index maps (their FLOPs count output elements; their cost is memory traffic)."""
    layer = graph.layers[li]
    op = layer.op
    if op == "CONV":
        a = layer.attrs
        if a.get("pre"):  # a 1x1 expansion, then depthwise: most of the FLOPs are the GEMM's
            return GEMM
        if a.get("group", 1) > 1:
            return DEPTHWISE
        src = graph.layers[layer.inputs[0]].shape if layer.inputs else (1, 1, 1, 1)
        fully_connected = (a["kh"], a["kw"]) == tuple(src[2:4]) and tuple(layer.shape[2:4]) == (1, 1)
        return GEMM if a["kh"] * a["kw"] == 1 or fully_connected else CONV
    if op in ("MATMUL", "ATTENTION"):
        return GEMM
    if op in ("BINARY", "AFFINE", "WHERE"):
        return ELEMENTWISE
    return OTHER


@dataclass
class MachineProfile:
    """A loaded profile (see the module text)."""

    name: str
    cores: int
    gflops: dict[int, np.ndarray]  # threads -> GFLOP/s per op class (whole machine)
    tile_overhead_s: float
    source: str = ""
    link: dict | None = None
    per_class: bool = True  # False: one rate for every class (a profile_machine.py profile)
    path: str | None = None
    raw: dict = field(default_factory=dict, repr=False)

    def machine_flops(self, threads: int) -> np.ndarray:
        """FLOP/s per op class the whole machine sustains with ``threads`` computing threads."""
        if threads < 1:
            raise ProfileError(f"thread count must be at least 1, got {threads}")
        t = min(int(threads), self.cores)
        counts = sorted(self.gflops)
        if t in self.gflops:
            return self.gflops[t] * 1e9
        lower = [c for c in counts if c < t]
        upper = [c for c in counts if c > t]
        if not lower:  # below the smallest measured count: its per-thread rate
            c = counts[0]
            return self.gflops[c] / c * t * 1e9
        lo = lower[-1]
        if not upper:  # beyond the largest: each thread adds that count's per-thread rate
            return self.gflops[lo] / lo * t * 1e9
        hi = upper[0]
        w = (t - lo) / (hi - lo)
        return ((1 - w) * self.gflops[lo] + w * self.gflops[hi]) * 1e9

    def thread_flops(self, threads: int) -> np.ndarray:
        """FLOP/s per op class of one of ``threads`` computing threads running together."""
        return self.machine_flops(threads) / threads

    def calibrated_flops(self, threads: int) -> float | None:
        """What coacto.server.sessions.calibrate_flops announces on this machine with
        ``threads`` computing threads (the profile's ``server_calibration``: the calibration
        GEMM's single-thread rate), or None when the profile has none."""
        from ..server.sessions import CALIBRATION_EFFICIENCY

        cal = self.raw.get("server_calibration") or {}
        rate = cal.get("gemm_gflops_per_thread")
        if not isinstance(rate, (int, float)) or rate <= 0:
            return None
        return rate * 1e9 * max(1, min(int(threads), self.cores)) * CALIBRATION_EFFICIENCY

    def _quota(self, quota: float, period_ms: float, graph_id: str | None
               ) -> tuple[dict | None, dict | None]:
        """`coacto profile --quota`'s entry for this quota and period, and in it the model's
        (by tile graph id); None where not measured."""
        entry = None
        for q in (self.raw.get("quota") or {}).values():
            if isinstance(q, dict) and abs(float(q.get("quota", -1)) - quota) < 1e-9 \
                    and abs(float(q.get("period_ms", -1)) - period_ms) < 1e-9:
                entry = q
        if entry is None or graph_id is None:
            return entry, None
        return entry, next((m for m in (entry.get("models") or {}).values()
                            if m.get("graph_id") == graph_id), None)

    def quota_slowdown(self, quota: float, period_ms: float, graph_id: str | None = None
                       ) -> float | None:
        """The slowdown `coacto profile --quota` measured inside this quota and period: the
        model's own (by tile graph id) or the median over the measured models; None if not
        measured."""
        entry, model = self._quota(quota, period_ms, graph_id)
        if entry is None:
            return None
        return float((model or entry)["slowdown"])

    def quota_full_s(self, quota: float, period_ms: float, graph_id: str | None) -> float | None:
        """The full-speed latency (1 thread) over which `coacto profile --quota` measured this
        model's slowdown in this quota and period; None if it did not measure the model."""
        _, model = self._quota(quota, period_ms, graph_id)
        return float(model["full_ms"]) / 1e3 if model and model.get("full_ms") else None

    def local_speedup(self, graph_id: str, threads: int) -> float | None:
        """The offloading graph ``graph_id``'s latency over the local graph's (the one a client
        cuts for ``threads`` computing threads) on this machine, when `coacto profile` measured
        it (its ``local_speedup`` section); else None."""
        for entry in (self.raw.get("local_speedup") or {}).values():
            if isinstance(entry, dict) and entry.get("graph_id") == graph_id:
                try:
                    value = float((entry.get("threads") or {})[str(int(threads))])
                except (KeyError, TypeError, ValueError):
                    return None
                return value if value > 0 else None
        return None

    def layer_seconds(self, graph_id: str, n_layers: int) -> dict[int, np.ndarray] | None:
        """Busy seconds per layer (summed over threads) per measured thread count of the tile
        graph ``graph_id``, when `coacto profile` measured that graph; else None."""
        for entry in (self.raw.get("layers") or {}).values():
            if not isinstance(entry, dict) or entry.get("graph_id") != graph_id:
                continue
            out = {}
            for t, secs in (entry.get("seconds") or {}).items():
                try:
                    arr = np.asarray(secs, dtype=np.float64)
                    threads = int(t)
                except (TypeError, ValueError):
                    continue
                if arr.shape == (n_layers,) and threads >= 1 and (arr >= 0).all():
                    out[threads] = arr
            return out or None
        return None


@dataclass
class DeviceCosts:
    """CPU seconds (at the profile machine's full speed) the device's communication engine spends
    per event (coacto.sim.enginecost measures them): starting an inference (planning, the
    native inference, its inputs; per policy), finishing one (per policy), handing a message to
    the link (per message and per byte: taking the tiles out of the runtime, msgpack, ZeroMQ, the kernel's TCP), taking
    one in (per kind and per byte), a wake-up by the runtime (a tile queued for sending),
    finishing an inference; ``loop_s`` (the engine's time outside its handlers, per handled
    event) is added to each."""

    start_s: dict
    send_msg_s: float
    send_byte_s: float
    recv_msg_s: dict
    recv_byte_s: float
    finish_s: dict | float
    wake_s: float
    loop_s: float = 0.0
    scale: float = 1.0
    source: str = ""

    @classmethod
    def from_dict(cls, raw: dict, scale: float = 1.0, source: str = "") -> "DeviceCosts":
        try:
            fin = raw["finish_s"]
            fin = {k: float(v) for k, v in fin.items()} if isinstance(fin, dict) else float(fin)
            return cls(dict(raw["start_s"]), float(raw["send_msg_s"]), float(raw["send_byte_s"]),
                       dict(raw["recv_msg_s"]), float(raw["recv_byte_s"]), fin,
                       float(raw["wake_s"]), float(raw.get("loop_s", 0.0)), float(scale), source)
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{source or 'profile'}: the engine's device costs lack or "
                               f"misstate {e}; measure them again with `coacto profile "
                               f"--engine`") from None

    def start(self, policy: str) -> float:
        s = self.start_s.get(policy)
        if s is None:
            s = max(self.start_s.values()) if self.start_s else 0.0
        return (s + self.loop_s) * self.scale

    def send(self, nbytes: int) -> float:
        return (self.send_msg_s + self.send_byte_s * nbytes + self.loop_s) * self.scale

    def recv(self, kind: str, nbytes: int) -> float:
        m = self.recv_msg_s
        s = m.get(kind, m.get("stats", min(m.values()) if m else 0.0))
        return (s + self.recv_byte_s * nbytes + self.loop_s) * self.scale

    def finish(self, policy: str = "dynamic") -> float:
        f = self.finish_s
        if isinstance(f, dict):
            f = f.get(policy, max(f.values()) if f else 0.0)
        return (f + self.loop_s) * self.scale

    def wake(self) -> float:
        return (self.wake_s + self.loop_s) * self.scale


@dataclass
class ServerCosts:
    """CPU seconds (at the profile machine's full speed) the server's I/O thread spends per
    message taken in (per kind and per byte: BEGIN, TILES with its ACK and put_tiles, HEARTBEAT
    with its STATS, CANCEL) and sent (RESULT per message and byte, DONE); ``loop_s`` is added to
    each (see DeviceCosts)."""

    recv_msg_s: dict
    recv_byte_s: float
    send_msg_s: dict
    send_byte_s: float
    loop_s: float = 0.0
    scale: float = 1.0
    source: str = ""

    @classmethod
    def from_dict(cls, raw: dict, scale: float = 1.0, source: str = "") -> "ServerCosts":
        try:
            return cls(dict(raw["recv_msg_s"]), float(raw["recv_byte_s"]),
                       dict(raw["send_msg_s"]), float(raw["send_byte_s"]),
                       float(raw.get("loop_s", 0.0)), float(scale), source)
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{source or 'profile'}: the engine's server costs lack or "
                               f"misstate {e}; measure them again with `coacto profile "
                               f"--engine`") from None

    def recv(self, kind: str, nbytes: int) -> float:
        m = self.recv_msg_s
        s = m.get(kind, m.get("heartbeat", min(m.values()) if m else 0.0))
        return (s + self.recv_byte_s * nbytes + self.loop_s) * self.scale

    def send(self, kind: str, nbytes: int) -> float:
        s = self.send_msg_s.get(kind, 0.0)
        return (s + self.send_byte_s * nbytes + self.loop_s) * self.scale


def engine_costs(spec, side: str, scale: float = 1.0):
    """DeviceCosts (side "device") or ServerCosts ("server") from a profile (name, path, dict,
    MachineProfile) that holds an ``engine`` section, or a costs object; None when the profile
    has none."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, (DeviceCosts, ServerCosts)):
        return spec
    prof = load_profile(spec)
    section = (prof.raw.get("engine") or {}).get(side)
    if section is None:
        return None
    cls = DeviceCosts if side == "device" else ServerCosts
    return cls.from_dict(section, scale, f"{prof.name} (engine.{side})")


def _resolve(spec) -> Path:
    if isinstance(spec, Path) or spec.endswith(".json") or os.sep in spec:
        return Path(spec)
    return PROFILE_DIR / f"{spec}.json"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json")) if PROFILE_DIR.is_dir() else []


def load_profile(spec) -> MachineProfile:
    """A MachineProfile from a name in profiles/, a path to a JSON file, a dict, or a
    MachineProfile (returned as is)."""
    if isinstance(spec, MachineProfile):
        return spec
    path = None
    if isinstance(spec, dict):
        raw = spec
    else:
        path = _resolve(spec)
        if not path.exists():
            names = ", ".join(available_profiles()) or "none"
            raise ProfileError(f"no profile {str(spec)!r} ({path} does not exist); name one of "
                               f"profiles/ ({names}), give a path to a JSON file, or write one "
                               f"with `coacto profile --name NAME` on the machine")
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ProfileError(f"{path}: cannot read the profile ({e}); fix the JSON or write it "
                               f"again with `coacto profile`") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path or 'profile'}: a profile is a JSON object (see "
                           f"coacto/sim/profiles.py for its fields)")
    where = str(path) if path else f"profile {raw.get('name', '?')!r}"
    legacy = "gflops" not in raw and "models" in raw
    prof = _from_legacy(raw, where) if legacy else _from_raw(raw, where)
    prof.path = str(path) if path else None
    return prof


def _need(raw: dict, key: str, where: str, what: str):
    if key not in raw:
        raise ProfileError(f"{where}: the field {key!r} is missing ({what}); add it, or write the "
                           f"profile again with `coacto profile`")
    return raw[key]


def _positive(value, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0) \
            or math.isinf(value):
        raise ProfileError(f"{where}: {what} must be a positive number, got {value!r}")
    return float(value)


def _from_raw(raw: dict, where: str) -> MachineProfile:
    name = _need(raw, "name", where, "the machine's name")
    cores = _need(raw, "cores", where, "how many cores the machine has")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ProfileError(f"{where}: 'cores' must be a positive integer, got {cores!r}")
    table = _need(raw, "gflops", where, "GFLOP/s per thread count and op class")
    if not isinstance(table, dict) or not table:
        raise ProfileError(f"{where}: 'gflops' must map thread counts to rates per op class, "
                           f"e.g. {{\"1\": {{\"conv\": 2.0, ...}}}}")
    gflops = {}
    for key, rates in table.items():
        try:
            threads = int(key)
        except (TypeError, ValueError):
            threads = 0
        if threads < 1:
            raise ProfileError(f"{where}: 'gflops' keys are thread counts (\"1\", \"4\", ...), "
                               f"got {key!r}")
        if not isinstance(rates, dict):
            raise ProfileError(f"{where}: gflops[{key!r}] must map op classes "
                               f"({', '.join(OP_CLASSES)}) to GFLOP/s")
        missing = [c for c in OP_CLASSES if c not in rates]
        if missing:
            raise ProfileError(f"{where}: gflops[{key!r}] lacks the op class(es) "
                               f"{', '.join(missing)}; give a rate for each of "
                               f"{', '.join(OP_CLASSES)}")
        gflops[threads] = np.array([_positive(rates[c], where, f"gflops[{key!r}][{c!r}]")
                                    for c in OP_CLASSES])
    overhead_us = _need(raw, "tile_overhead_us", where, "the runtime's cost per tile, microseconds")
    if isinstance(overhead_us, bool) or not isinstance(overhead_us, (int, float)) \
            or not (overhead_us >= 0):
        raise ProfileError(f"{where}: 'tile_overhead_us' must be a number >= 0, got "
                           f"{overhead_us!r}")
    source = _need(raw, "source", where, "where the numbers come from")
    link = raw.get("link")
    if link is not None and not isinstance(link, dict):
        raise ProfileError(f"{where}: 'link' must be an object with goodput_mbps and rtt_ms")
    return MachineProfile(str(name), cores, gflops, float(overhead_us) * 1e-6, str(source), link,
                          True, raw=raw)


def _from_legacy(raw: dict, where: str) -> MachineProfile:
    """A profile of experiments/profile_machine.py: one rate (the median over its models) per
    thread count for every class."""
    by_threads: dict[int, list[float]] = {}
    for row in raw.get("models") or []:
        rate, threads = row.get("coacto_gflops_per_s"), row.get("threads")
        if isinstance(rate, (int, float)) and rate > 0 and isinstance(threads, int) and threads > 0:
            by_threads.setdefault(threads, []).append(float(rate))
    if not by_threads:
        raise ProfileError(f"{where}: no model has 'coacto_gflops_per_s' and 'threads'; measure "
                           f"the machine again with `coacto profile`")
    gflops = {t: np.full(len(OP_CLASSES), float(np.median(v))) for t, v in by_threads.items()}
    overhead = [r.get("us_per_tile") for r in raw.get("tile_overhead") or []
                if r.get("threads") == 1 and r.get("send", "none") == "none"]
    overhead_us = float(overhead[0]) if overhead and isinstance(overhead[0], (int, float)) else 0.0
    cores = (raw.get("cpu") or {}).get("cores") or max(by_threads)
    log.info("%s: no per-class rates; every class at the rate of whole models", where)
    return MachineProfile(str(raw.get("name", "unnamed")), int(cores), gflops, overhead_us * 1e-6,
                          str(raw.get("how", "")), raw.get("link"), False, raw=raw)


def profile_dict(name: str, cores: int, gflops: dict, tile_overhead_us: float, source: str,
                 link: dict | None = None, **extra) -> dict:
    """The JSON object of a profile (what ``coacto profile`` writes)."""
    out = {"name": name, "format": PROFILE_FORMAT, "source": source, "cores": int(cores),
           "gflops": {str(t): {c: float(r[c]) for c in OP_CLASSES}
                      for t, r in sorted(gflops.items())},
           "tile_overhead_us": float(tile_overhead_us)}
    if link:
        out["link"] = link
    out.update(extra)
    return out
