"""``simulate``: D devices, each with its own link, and one N-core server, over a tile graph.

Times are seconds of simulated time from 0; rates are FLOP/s and bytes/s inside, Mbit/s and ms
at the interface (as the experiments state their settings).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .. import protocol as P
from ..errors import CoactoError
from ..inference import wire_ratios
from ..mobile import policies
from ..mobile.estimates import DEFAULT_RTT, WIRE_PRIOR
from ..tilegraph import TileGraph
from .cores import Cores, Durations, TileState
from .cpu import Cpu
from .device import SimDevice
from .events import EventLoop
from .graph import SimGraph, sim_graph
from .link import BandwidthTrace, TraceError, lte_trace, make_trace, wifi_trace
from .profiles import MachineProfile, ProfileError, engine_costs, load_profile
from .server import SimServer

log = logging.getLogger(__name__)

#: RTT when none is given: the client's estimate before it measures one (estimates.DEFAULT_RTT).
DEFAULT_RTT_MS = DEFAULT_RTT * 1e3
#: Seconds of simulated time after the last inference ends in which tiles already running finish
#: (their schedule is complete then); nothing after it changes a result.
DRAIN_S = 60.0


class SimError(CoactoError, ValueError):
    """Simulation settings that cannot be simulated (say which and what to give instead)."""


def _default(func, name: str):
    return inspect.signature(func).parameters[name].default


def _client_timeout() -> float:
    from ..mobile.client import Client
    return float(_default(Client.__init__, "timeout"))


def _heartbeat_s(timeout: float) -> float:
    """Session._hb_interval: a third of the client's timeout, at most the server's heartbeat_s
    (a third of its heartbeat_timeout)."""
    from ..server.server import Server
    return min(timeout / 3, float(_default(Server.__init__, "heartbeat_timeout")) / 3)


@dataclass
class InferenceResult:
    """One simulated inference. Times in seconds; ``schedule()`` lists every tile computed for
    it as (tile, side, worker, start, end), times from its submission."""

    device: int
    index: int
    policy: str
    latency_s: float
    t_submit: float
    t_end: float
    tiles_local: int
    tiles_server: int
    tiles_from_server: int
    tiles_sent: int
    bytes_sent: int
    bytes_received: int
    batches: int
    fallback: bool
    finished_by: str
    offloaded: bool
    split_layer: int | None
    decisions: int
    decided_sent: int
    estimates: dict
    fallback_reason: str | None = None
    server_skipped: str | None = None
    frontier: str | None = None         # which plan (policies.frontier)
    predicted_s: float | None = None    # what the plan predicted (dynamic, split)
    kept_work: bool = False             # computed from the start: a shared server (dynamic)
    _device_trace: tuple = field(default=None, repr=False)
    _server_trace: tuple | None = field(default=None, repr=False)

    def schedule(self) -> list[tuple[int, str, int, float, float]]:
        rows = []
        for side, trace in (("device", self._device_trace), ("server", self._server_trace)):
            if trace is None:
                continue
            t0, t1, worker = trace
            rows.extend((tile, side, worker[tile], t0[tile] - self.t_submit,
                         t1[tile] - self.t_submit) for tile in t0)
        rows.sort(key=lambda r: (r[3], r[1], r[2]))
        return rows

    def to_dict(self, schedule: bool = False) -> dict:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        if schedule:
            out["schedule"] = [list(r) for r in self.schedule()]
        return out


@dataclass
class SimResult:
    """Every inference (``inferences``, in completion order) and the statistics over those after
    the warm-up ones of each device."""

    inferences: list[InferenceResult]
    settings: dict
    measured: list[InferenceResult]
    wall_s: float = 0.0
    events: int = 0

    @property
    def latencies(self) -> np.ndarray:
        return np.array([r.latency_s for r in self.measured])

    @property
    def latency_s(self) -> float:
        """The median latency (p50)."""
        return self.p50

    @property
    def p50(self) -> float:
        return float(np.percentile(self.latencies, 50)) if self.measured else math.nan

    @property
    def p95(self) -> float:
        return float(np.percentile(self.latencies, 95)) if self.measured else math.nan

    @property
    def mean(self) -> float:
        return float(self.latencies.mean()) if self.measured else math.nan

    @property
    def throughput(self) -> float:
        """Measured inferences per second of simulated time, from the first one's submission to
        the last one's end (all devices together)."""
        if not self.measured:
            return math.nan
        span = max(r.t_end for r in self.measured) - min(r.t_submit for r in self.measured)
        return len(self.measured) / span if span > 0 else math.inf

    def summary(self) -> dict:
        m = self.measured
        return {
            "p50_ms": self.p50 * 1e3, "p95_ms": self.p95 * 1e3, "mean_ms": self.mean * 1e3,
            "throughput_per_s": self.throughput, "inferences": len(m),
            "fallbacks": sum(r.fallback for r in m),
            "tiles_local": float(np.mean([r.tiles_local for r in m])) if m else math.nan,
            "tiles_server": float(np.mean([r.tiles_server for r in m])) if m else math.nan,
            "tiles_sent": float(np.mean([r.tiles_sent for r in m])) if m else math.nan,
            "bytes_sent": float(np.mean([r.bytes_sent for r in m])) if m else math.nan,
            "finished_by": {k: sum(r.finished_by == k for r in m)
                            for k in ("device", "server", "both")},
        }

    def to_dict(self, schedule: bool = False) -> dict:
        return {"settings": self.settings, "summary": self.summary(),
                "inferences": [r.to_dict(schedule) for r in self.inferences],
                "wall_s": self.wall_s, "events": self.events}


def resolve_graph(model_or_tg, tiles_per_layer: int | None = None,
                  min_column_blocks: int | None = None) -> TileGraph:
    """A TileGraph from a TileGraph, a zoo model name, an .onnx / .ctg path, ONNX bytes or a
    ModelProto, compiled as the client compiles it for offloading (OFFLOAD_MIN_COLUMN_BLOCKS)."""
    from .. import compiler
    from ..partition import OFFLOAD_MIN_COLUMN_BLOCKS

    if isinstance(model_or_tg, TileGraph):
        return compiler.check_offloadable(model_or_tg, SimError)
    mcb = OFFLOAD_MIN_COLUMN_BLOCKS if min_column_blocks is None else min_column_blocks
    if isinstance(model_or_tg, str):
        if model_or_tg.endswith(".ctg"):
            return compiler.check_offloadable(compiler.load(model_or_tg), SimError)
        from .. import zoo
        if model_or_tg in zoo.MODELS:
            model_or_tg = zoo.build(model_or_tg)
        elif not model_or_tg.endswith(".onnx"):
            raise SimError(f"{model_or_tg!r} is not a zoo model ({', '.join(zoo.MODELS)}) nor an "
                           f".onnx / .ctg file")
    return compiler.compile(model_or_tg, tiles_per_layer=tiles_per_layer, min_column_blocks=mcb)


def _traces(devices: int, bandwidth_mbps, trace, seed: int) -> list[BandwidthTrace]:
    if (bandwidth_mbps is None) == (trace is None):
        raise SimError("give exactly one of bandwidth_mbps (a number of Mbit/s) and trace (a list "
                       "of (t, Mbit/s) steps, a BandwidthTrace, 'lte' or 'wifi')")
    if trace is None:
        try:
            return [BandwidthTrace.constant(bandwidth_mbps)] * devices
        except TraceError as e:
            raise SimError(str(e)) from None
    if isinstance(trace, str):
        gen = {"lte": lte_trace, "wifi": wifi_trace}.get(trace)
        if gen is None:
            raise SimError(f"trace {trace!r}: name 'lte' or 'wifi' (synthetic), or give steps")
        return [gen(seed=seed + d) for d in range(devices)]  # each device its own fading
    if isinstance(trace, (list, tuple)) and trace and isinstance(trace[0], BandwidthTrace):
        if len(trace) != devices:
            raise SimError(f"{len(trace)} traces for {devices} devices: give one per device")
        return list(trace)
    return [make_trace(trace)] * devices


def solo_latency(g: SimGraph, threads: int, durations: Durations, make_cpu=None,
                 runs: int = 1) -> float:
    """Latency of one inference alone on ``threads`` computing threads from the inputs (the
    runtime's schedule, no network); with ``make_cpu`` (loop -> Cpu) on that CPU model, the
    best of ``runs`` back-to-back runs (Client.calibrate's best of runs: under a CFS quota each
    starts at another phase of the period)."""
    loop = EventLoop()
    cpu = make_cpu(loop) if make_cpu is not None else None
    cores = Cores(loop, threads, durations, cpu=cpu)
    best = math.inf
    for _ in range(max(1, runs)):
        t0 = loop.now
        ts = TileState(cores, g)
        ts.set_inputs(t0)
        loop.run()
        if ts.t_end is None:
            return 0.0
        best = min(best, ts.t_end - t0)
    return best


def _sequence(policy, inferences: int, options: dict) -> list[tuple[str, int, dict]]:
    if isinstance(policy, str):
        return [(policy, inferences, options)]
    try:
        seq = [(str(item[0]), int(item[1]), dict(item[2]) if len(item) > 2 else {})
               for item in policy]
    except (TypeError, ValueError, IndexError):
        seq = []
    if not seq or any(n < 1 for _, n, _ in seq):
        raise SimError("policy must be a policy name or a list of (policy, inferences[, "
                       "options]) with at least one inference each")
    return seq


def simulate(model_or_tg, policy: str = "dynamic", *, device="raspberry-pi-4",
             server="threadripper-3990x", server_cores: int | None = None,
             device_threads: int | None = None, devices: int = 1,
             bandwidth_mbps: float | None = None, trace=None, rtt_ms: float = DEFAULT_RTT_MS,
             quota: float | None = None, inferences: int = 1, warmup: int = 0, seed: int = 0,
             timeout: float | None = None, start_jitter_s: float = 0.0,
             device_flops: float | None = None, server_flops: float | None = None,
             tiles_per_layer: int | None = None, split_layer: int | None = None,
             fl_layer: int | None = None, device_share: float | None = None,
             quota_period_ms: float | None = None, device_cpus: float | None = None,
             server_cpus: float | None = None, device_costs=None, server_costs=None,
             device_costs_scale: float = 1.0, server_costs_scale: float = 1.0,
             initial_goodput_mbps: float | None = None, probe: bool = False,
             calibrate_runs: int = 4, burst_bytes: float = 0.0,
             quota_slowdown: float | None = None, transfer: str = "lossless",
             wire=None, local_speedup: float | None = None) -> SimResult:
    """Simulates ``inferences`` back-to-back inferences on each of ``devices`` devices running
    ``policy`` against one server (see docs/SIMULATOR.md).

    ``device`` / ``server``: profiles (a name in profiles/, a path, a dict or a MachineProfile);
    ``device_threads``: computing threads per device (default: the profile's cores);
    ``server_cores``: the server's computing threads (default: its profile's cores);
    ``quota``: the device's CPU quota in cores (a cgroup's quota / period; 0.25 = a quarter of one
    core shared by its threads), None for none; ``bandwidth_mbps`` or ``trace``: the link, both
    directions (a trace: (t, Mbit/s) steps, a BandwidthTrace, 'lte' or 'wifi' (synthetic), or one
    BandwidthTrace per device); ``rtt_ms``: round-trip propagation; ``warmup``: inferences per
    device left out of the statistics; ``seed``: synthetic traces and start jitter;
    ``start_jitter_s``: devices start at uniform random times in [0, this);
    ``device_flops`` / ``server_flops``: the rates the device plans with (default: what the real
    client and server measure, the model's FLOPs over its simulated solo latency on each side;
    ``server_flops="calibrated"``: what a server announces before it has measured the model,
    its profile's calibration GEMM rate as coacto.server.sessions.calibrate_flops computes it;
    the settings' ``server_flops_measured`` is what the simulated server measured meanwhile);
    ``timeout``: the client's (default: coacto.Client's); ``tiles_per_layer``: when compiling;
    ``split_layer`` / ``fl_layer`` / ``device_share``: fix split / fl as the Client options do.

    ``policy`` may also be a sequence [(policy, inferences[, options]), ...] that each device runs
    in order as one Client (its estimates carry over, as in the experiments); ``inferences`` is
    then their total.

    The CPU each side runs on (coacto.sim.cpu): ``device_cpus`` cores for the device's threads
    (default: its profile's cores; the testbed pins it to one), ``server_cpus`` for the server's
    (default: one per computing thread); ``quota_period_ms``: the quota's CFS period (throttling
    in periods, as the kernel does; None: a smooth share). ``device_costs`` /
    ``server_costs``: the communication engines' CPU costs (coacto.sim.profiles.DeviceCosts /
    ServerCosts): None takes them from the side's profile when it has an ``engine`` section
    (`coacto profile --engine`), False leaves them out, a profile name / path / dict takes that
    profile's, times ``*_costs_scale`` (another machine's CPU).

    ``device_flops`` given is kept for the whole run, as Client(device_flops=...) keeps it;
    otherwise the device calibrates as Client.calibrate does (the best of ``calibrate_runs`` solo
    runs on its CPU model) and refines it with its local runs. ``initial_goodput_mbps``: the
    goodput the client assumes before it has measured any (default: the link's first rate, as
    a client given --bandwidth); ``probe``: it sends the session's goodput probe first;
    ``burst_bytes``: each link direction is a token bucket of that depth (tc tbf's burst).
    ``quota_slowdown``: inside the quota the device computes this much slower than the quota
    alone says (cold caches every period); default: what `coacto profile --quota` measured for
    this quota and period (the model's own, else the median), 1 when not measured.
    ``transfer``: the clients' tile encoding (coacto.Client's ``transfer``); each tile takes its
    layer's share of bytes on the wire, ``wire`` (per layer; default: measured by one local
    inference of the graph's example inputs, coacto.inference.wire_ratios).
    ``local_speedup``: how much faster the device computes what it does alone (policy local,
    dynamic's gate), on the graph a real client cuts for its threads, than the offloading graph
    the simulation times (its tiles' durations divided by this); default: what `coacto profile`
    measured for this graph and thread count on the device's machine, else 1.
    """
    t_wall = time.perf_counter()
    if transfer not in P.TRANSFER_MODES:
        raise SimError(f"transfer must be one of {', '.join(P.TRANSFER_MODES)}, got {transfer!r}")
    options0 = {}
    keys = {"split": ("split_layer",), "fl": ("fl_layer", "device_share")}
    if isinstance(policy, str):
        if policy not in policies.POLICIES:
            raise SimError(f"unknown policy {policy!r}; choose one of "
                           f"{', '.join(policies.POLICIES)}")
        given = {"split_layer": split_layer, "fl_layer": fl_layer, "device_share": device_share}
        options0 = {key: given[key] for key in keys.get(policy, ()) if given[key] is not None}
    for name, v in (("devices", devices), ("inferences", inferences)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SimError(f"{name} must be a positive integer, got {v!r}")
    sequence = _sequence(policy, inferences, options0)
    for p, _, _ in sequence:
        if p not in policies.POLICIES:
            raise SimError(f"unknown policy {p!r}; choose one of {', '.join(policies.POLICIES)}")
    inferences = sum(n for _, n, _ in sequence)
    if not (isinstance(warmup, int) and 0 <= warmup < inferences):
        raise SimError(f"warmup must be an integer from 0 to inferences - 1, got {warmup!r}")
    if quota_period_ms is not None and (quota is None or not quota_period_ms > 0):
        raise SimError("quota_period_ms needs a quota and must be a positive number of ms")
    if not (rtt_ms >= 0):
        raise SimError(f"rtt_ms must be >= 0, got {rtt_ms!r}")
    if quota is not None and not (quota > 0):
        raise SimError(f"quota must be a positive number of cores (0.25: a quarter of one), got "
                       f"{quota!r}")
    tg = resolve_graph(model_or_tg, tiles_per_layer)
    g = sim_graph(tg)
    if transfer == "raw":
        wire = None
    elif wire is None:
        try:
            wire = wire_ratios(tg, transfer)
        except (CoactoError, KeyError, ValueError) as e:  # a synthetic graph the runtime cannot run
            log.info("simulating %s transfers at dense tile sizes: the graph does not run "
                     "here (%s)", transfer, e)
            wire = np.full(tg.n_layers, WIRE_PRIOR[transfer])
    elif len(wire) != tg.n_layers:
        raise SimError(f"wire needs one ratio per layer ({tg.n_layers}), got {len(wire)}")
    dev_prof: MachineProfile = load_profile(device)
    srv_prof: MachineProfile = load_profile(server)
    k = dev_prof.cores if device_threads is None else int(device_threads)
    n = srv_prof.cores if server_cores is None else int(server_cores)
    if k < 1 or n < 1:
        raise SimError(f"device_threads and server_cores must be at least 1, got {k} and {n}")
    traces = _traces(devices, bandwidth_mbps, trace, seed)
    timeout = _client_timeout() if timeout is None else float(timeout)

    try:
        dev_costs = engine_costs(dev_prof if device_costs is None else device_costs, "device",
                                 device_costs_scale)
        srv_costs = engine_costs(srv_prof if server_costs is None else server_costs, "server",
                                 server_costs_scale)
    except ProfileError as e:
        raise SimError(str(e)) from None
    period = None if quota_period_ms is None else quota_period_ms / 1e3
    dcpus = float(device_cpus or dev_prof.cores)
    scpus = float(server_cpus or n)
    dev_cpu_model = dev_costs is not None or period is not None
    srv_cpu_model = srv_costs is not None

    def make_dev_cpu(loop):
        return Cpu(loop, dcpus, quota, period) if dev_cpu_model else None

    def make_srv_cpu(loop):
        return Cpu(loop, scpus) if srv_cpu_model else None

    slowdown = quota_slowdown
    if slowdown is None and quota is not None and quota_period_ms is not None:
        slowdown = dev_prof.quota_slowdown(quota, quota_period_ms, tg.graph_id)
    slowdown = float(slowdown or 1.0)
    if dev_costs is not None and slowdown != 1.0:
        dev_costs = dataclasses.replace(dev_costs, scale=dev_costs.scale * slowdown)
    tile_scale = slowdown
    full_s = dev_prof.quota_full_s(quota, quota_period_ms, tg.graph_id) \
        if quota_slowdown is None and quota is not None and quota_period_ms is not None else None
    if full_s:
        # The slowdown is over the model's measured full-speed latency: the simulated tiles'
        # are anchored to it (a model of many small layers simulates a few percent slower
        # alone than it ran, and in 1 ms windows of every 4 that decides whole periods)
        plain = solo_latency(g, 1, Durations(g, dev_prof))
        if plain > 0:
            tile_scale = slowdown * full_s / plain
    dev_dur = Durations(g, dev_prof, quota=None if dev_cpu_model else quota, scale=tile_scale)
    srv_dur = Durations(g, srv_prof)
    if local_speedup is None:
        local_speedup = dev_prof.local_speedup(tg.graph_id, k) or 1.0
    if not (isinstance(local_speedup, (int, float)) and local_speedup > 0):
        raise SimError(f"local_speedup must be a positive number, got {local_speedup!r}")
    dev_solo = solo_latency(g, k, dev_dur, make_dev_cpu)
    srv_solo = solo_latency(g, n, srv_dur, make_srv_cpu)
    fixed = device_flops is not None
    if fixed:
        est_device = float(device_flops)
    else:  # Client.calibrate: the best of its runs
        best = solo_latency(g, k, dev_dur, make_dev_cpu, runs=calibrate_runs) \
            if dev_cpu_model else dev_solo
        est_device = tg.total_flops / best if best > 0 else 1e12
    if server_flops == "calibrated":  # what a server announces before it measured the model
        server_flops = srv_prof.calibrated_flops(n)
        if server_flops is None:
            raise SimError(f"the server profile {srv_prof.name} has no calibration rate; "
                           f"measure it with `coacto profile` or give server_flops")
    est_server = server_flops or (tg.total_flops / srv_solo if srv_solo > 0 else 1e12)

    loop = EventLoop()
    sim = _Sim(loop, tg, g)
    sim.server = SimServer(loop, g, n, srv_dur, est_server, cpu=make_srv_cpu(loop),
                           costs=srv_costs)
    rng = np.random.default_rng(seed)
    rtt = rtt_ms / 1e3
    hb = _heartbeat_s(timeout)
    for d in range(devices):
        b0 = traces[d].rate_at(0.0) if initial_goodput_mbps is None \
            else initial_goodput_mbps * 1e6 / 8
        dev = SimDevice(sim, d, threads=k, durations=dev_dur, uplink_trace=traces[d],
                        downlink_trace=traces[d], rtt=rtt, bandwidth0=b0,
                        device_flops=est_device, server_flops=est_server, timeout=timeout,
                        heartbeat_s=hb, cpu=make_dev_cpu(loop), costs=dev_costs,
                        device_flops_fixed=fixed, probe=probe, burst_bytes=burst_bytes,
                        wire=wire, local_speedup=local_speedup)
        sim.devices.append(dev)
        t0 = float(rng.uniform(0.0, start_jitter_s)) if start_jitter_s > 0 else 0.0
        dev.start(sequence, t0)
    total = devices * inferences
    loop.run(stop=lambda: sum(len(dv.records) for dv in sim.devices) >= total)
    for dev in sim.devices:  # tiles still running finish; heartbeats stop
        dev.closed = True
    loop.run(until=loop.now + DRAIN_S)

    results = []
    for dev in sim.devices:
        for rec in dev.records:
            srv = sim.server.traces.get((dev.index, rec["inference"]))
            results.append(InferenceResult(
                device=rec["device"], index=rec["inference"], policy=rec["policy"],
                latency_s=rec["latency_s"], t_submit=rec["t_submit"], t_end=rec["t_end"],
                tiles_local=rec["tiles_local"], tiles_server=srv.computed if srv else 0,
                tiles_from_server=rec["tiles_from_server"], tiles_sent=rec["tiles_sent"],
                bytes_sent=rec["bytes_sent"], bytes_received=rec["bytes_received"],
                batches=rec["batches"], fallback=rec["fallback"], finished_by=rec["finished_by"],
                offloaded=rec["offloaded"], split_layer=rec["split_layer"],
                # counted after the drain: a tile running when the inference ended still
                # completes, and the runtime decides on it like on any other
                decisions=len(rec["_job"].native.decisions),
                decided_sent=sum(1 for d in rec["_job"].native.decisions if d[1]),
                estimates=rec["estimates"], fallback_reason=rec["fallback_reason"],
                server_skipped=rec["server_skipped"], frontier=rec["frontier"],
                predicted_s=rec["predicted_s"], kept_work=rec["_job"].kept_work,
                _device_trace=rec["_trace"],
                _server_trace=(srv.t0, srv.t1, srv.worker) if srv else None))
    results.sort(key=lambda r: (r.t_end, r.device))
    measured = [r for r in results if r.index > warmup]
    settings = {
        "model": model_or_tg if isinstance(model_or_tg, str) else tg.graph.model_hash[:12],
        "tiles": tg.n_tiles, "gflop": tg.total_flops / 1e9,
        "policy": policy if isinstance(policy, str) else [[p, n] for p, n, _ in sequence],
        "device": dev_prof.name, "device_threads": k, "quota": quota,
        "server": srv_prof.name, "server_cores": n, "devices": devices,
        "bandwidth_mbps": bandwidth_mbps,
        "trace": None if trace is None else (trace if isinstance(trace, str) else traces[0].name
                                             or "steps"),
        "rtt_ms": rtt_ms, "inferences": inferences, "warmup": warmup, "seed": seed,
        "timeout_s": timeout, "device_solo_ms": dev_solo * 1e3, "server_solo_ms": srv_solo * 1e3,
        "device_flops_est": est_device, "device_flops_fixed": fixed,
        "server_flops_est": est_server, "server_busy_s": sim.server.cores.busy_s,
        "server_flops_measured": sim.server.measured_flops,
        "quota_period_ms": quota_period_ms, "quota_slowdown": slowdown,
        "quota_tile_scale": tile_scale,
        "device_cpus": dcpus, "server_cpus": scpus,
        "device_costs": None if dev_costs is None else f"{dev_costs.source} x{dev_costs.scale:g}",
        "server_costs": None if srv_costs is None else f"{srv_costs.source} x{srv_costs.scale:g}",
        "device_engine_busy_s": sum(dv.cpu.engine_busy_s for dv in sim.devices if dv.cpu),
        "server_io_busy_s": sim.server.cpu.engine_busy_s if sim.server.cpu else 0.0,
        "initial_goodput_mbps": initial_goodput_mbps, "probe": probe, "burst_bytes": burst_bytes,
        "transfer": transfer, "local_speedup": local_speedup,
    }
    return SimResult(results, settings, measured, wall_s=time.perf_counter() - t_wall,
                     events=loop.events)


class _Sim:
    """What the devices share: the loop, the graph and the server."""

    def __init__(self, loop: EventLoop, tg: TileGraph, g: SimGraph):
        self.loop, self.tg, self.g = loop, tg, g
        self.server: SimServer | None = None
        self.devices: list[SimDevice] = []


def local_slowdown(model_or_tg, latency_s: float, *, runs: int = 2, **kw) -> float:
    """The ``quota_slowdown`` for which this simulator's own device runs ``model_or_tg`` locally
    (one Client, ``policy="local"``) in ``latency_s``: the device's speed inside its quota as a
    latency measured at the time of a real run says it (the experiments measure it beside every
    setting, as they measure the link; `coacto profile --quota` measured it on another minute).
    ``kw``: simulate()'s device settings (device, device_threads, device_cpus, quota,
    quota_period_ms, device_costs, device_flops, ...), which must include the quota and period.
    Under CFS windows the local latency is a staircase in the slowdown; see
    coacto.sim.quota.step_middle."""
    from .quota import step_middle

    if kw.get("quota") is None or kw.get("quota_period_ms") is None:
        raise SimError("local_slowdown needs the device's quota and quota_period_ms")
    if not (isinstance(latency_s, (int, float)) and latency_s > 0):
        raise SimError(f"latency_s must be a positive number of seconds, got {latency_s!r}")
    kw = {k: v for k, v in kw.items()
          if k not in ("quota_slowdown", "warmup", "inferences", "policy")}

    def local(s: float) -> float:
        r = simulate(model_or_tg, [("local", runs + 1)], warmup=1, quota_slowdown=s, **kw)
        return r.p50

    return step_middle(local, latency_s, kw["quota_period_ms"] / 1e3, lo=0.5, hi=4.0,
                       iterations=14)
