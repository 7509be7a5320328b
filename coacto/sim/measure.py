"""``coacto profile``: measure this machine (and optionally its link to a server) and write a
profile the simulator reads.

Per thread count T, zoo models run on T computing threads with per-layer timing
(Runtime.profile), in ROUNDS rounds of ``runs`` runs; the round with the least busy time counts
(another process on a core inflates a round's busy time, never shrinks it). A layer's busy seconds are summed over the threads, so FLOPs over busy
seconds is the rate of one thread while T run together; the profile stores T times that (the
machine's rate). Tiles are cut as clients cut them for offloading (OFFLOAD_MIN_COLUMN_BLOCKS),
the partition the simulator simulates; fixed costs inside a tile's kernel are part of the rates.
The per-tile overhead is what the single-thread latency holds beyond the kernels' busy time
(scheduling, bookkeeping), per tile. The per-layer busy seconds of each profiled model are kept
too (``layers``, by model, with the tile graph's id): the simulator times a tile of that very
graph from its layer's measured time rather than from its class's average rate. A class no model exercises enough (under
MIN_CLASS_SECONDS of busy time) gets the rate of ``other`` and the profile says so.

With a server address, a Client runs cloud inferences against it and the profile records the
goodput and RTT the client measured (its own estimates). With ``engine``, the communication
engines' CPU costs per message and byte on both sides (coacto.sim.enginecost) go to the
profile's ``engine`` section.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..errors import CoactoError
from .profiles import OP_CLASSES, OTHER, PROFILE_DIR, op_class, profile_dict

log = logging.getLogger(__name__)

#: Models whose layers cover the op classes: conv / gemm (ResNet-50), depthwise (MobileNetV2),
#: elementwise and other (a DenseNet block's concatenations, a MobileNetV3 block's
#: squeeze-and-excitation products).
DEFAULT_MODELS = ("resnet50", "mobilenetv2", "densenet_block", "mobilenetv3_block")
#: Rounds of runs per model and thread count; the least disturbed one counts.
ROUNDS = 3
#: Calibrations of the server's GEMM (each as a starting coacto-server makes it).
CALIBRATION_TRIALS = 7
#: Busy time below which a class's rate is not trusted (clock reads and noise dominate).
MIN_CLASS_SECONDS = 2e-4


def measure_threads(models, threads: int, runs: int, progress) -> dict:
    """Busy seconds and FLOPs per op class, latency, tiles and busy time of each model at
    ``threads`` computing threads."""
    from ..runtime import Runtime

    secs = np.zeros(len(OP_CLASSES))
    flops = np.zeros(len(OP_CLASSES))
    rows = []
    per_layer = {}
    for name, tg, feeds in models:
        progress(f"  {name} at {threads} thread(s) ...")
        best = None
        with Runtime(tg, threads=threads) as rt:
            rt.run(feeds)  # packs the weights, warms the caches
            for _ in range(ROUNDS):
                times = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    rt.run(feeds)
                    times.append(time.perf_counter() - t0)
                layers = rt.profile(feeds, runs)
                busy = sum(row["seconds"] for row in layers)
                if best is None or busy < best[0]:
                    best = (busy, statistics.median(times), layers)
        _, latency, layers = best
        busy = 0.0
        for row in layers:
            c = op_class(tg.graph, row["layer"])
            secs[c] += row["seconds"]
            flops[c] += row["flops"]
            busy += row["seconds"]
        rows.append({"model": name, "threads": threads, "tiles": tg.n_tiles,
                     "latency_ms": latency * 1e3, "busy_ms": busy * 1e3,
                     "gflop": tg.total_flops / 1e9})
        per_layer[name] = {"graph_id": tg.graph_id, "n_layers": tg.n_layers,
                           "seconds": [row["seconds"] for row in layers]}
    return {"seconds": secs, "flops": flops, "models": rows, "layers": per_layer}


def measure_local_speedup(graphs, counts, runs: int, progress) -> dict:
    """Per model, the offloading graph's latency over the local graph's at each thread count
    (medians of ``runs`` x ROUNDS runs, the two graphs alternating): what a client gains on the
    work it does alone, which it computes on a graph cut for its threads (Engine.local_tg,
    coacto.compiler.repartition), while the simulator times the offloading graph's tiles."""
    from ..compiler import repartition
    from ..runtime import Runtime

    out = {}
    for name, tg, feeds in graphs:
        entry = out[name] = {"graph_id": tg.graph_id, "threads": {}}
        for t in counts:
            progress(f"  {name}: offloading and local graph at {t} thread(s) ...")
            local_tg = repartition(tg, threads=t)
            times: list[list[float]] = [[], []]
            with Runtime(tg, threads=t) as rt, Runtime(local_tg, share=rt) as local_rt:
                for _ in range(runs * ROUNDS):
                    for i, r in enumerate((rt, local_rt)):
                        t0 = time.perf_counter()
                        r.run(feeds)
                        times[i].append(time.perf_counter() - t0)
            entry["threads"][str(t)] = statistics.median(times[0]) / statistics.median(times[1])
    return out


def measure_link(address: str, model: str, inferences: int, progress) -> dict:
    """Goodput and RTT a Client measures against ``address`` over cloud inferences of ``model``."""
    from .. import zoo
    from ..mobile.client import Client

    progress(f"link to {address}: {inferences} cloud inferences of {model} ...")
    onnx_model = zoo.build(model)
    feeds = zoo.input_feeds(onnx_model)
    with Client(address, onnx_model, threads=1, policy="cloud") as client:
        client.connect()
        for _ in range(inferences):
            client.infer(feeds)
        est = client.estimates
        stats = client.last_stats
    if stats.get("fallback"):
        raise CoactoError(f"the inferences against {address} fell back to the device "
                          f"({stats.get('fallback_reason')}); check the server and try again")
    return {"goodput_mbps": est["bandwidth_est_mbps"], "rtt_ms": est["rtt_est_ms"],
            "server": address, "goodput_samples": est["goodput_samples"],
            "rtt_samples": est["rtt_samples"],
            "how": f"coacto.Client estimates after {inferences} cloud inferences of {model}"}


def run_profile(name: str, threads=None, models=DEFAULT_MODELS, runs: int = 5,
                server: str | None = None, link_inferences: int = 5, output=None,
                progress=lambda msg: None, engine: bool = False, only=(),
                engine_model: str = "resnet50", engine_inferences: int = 3,
                quota: float | None = None, period_ms: float | None = None,
                quota_models=None) -> tuple[dict, Path]:
    """Measures this machine, writes the profile (profiles/NAME.json or ``output``) and returns
    (profile, path). ``engine``: also the communication engines' CPU costs
    (coacto.sim.enginecost); ``quota`` / ``period_ms``: also the slowdown inside that CPU quota
    (coacto.sim.quota); ``only``: just those sections ("engine", "quota", "local": the local
    graphs' speedup, coacto.sim.measure.measure_local_speedup), merged into the existing
    profile."""
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise CoactoError(f"profile name {name!r}: use letters, digits and dashes (the file is "
                          f"profiles/NAME.json)")
    unknown = set(only) - {"engine", "quota", "local"}
    if unknown:
        raise CoactoError(f"--only takes engine, quota and/or local, not "
                          f"{', '.join(sorted(unknown))}")
    if ("quota" in only or quota is not None) and not (quota and period_ms):
        raise CoactoError("a quota measurement needs --quota (cores, e.g. 0.25) and --period-ms")
    path = Path(output) if output else PROFILE_DIR / f"{name}.json"
    if only:
        if not path.exists():
            raise CoactoError(f"{path} does not exist: measure the machine first (coacto profile "
                              f"--name {name}), then add sections with --only")
        try:
            prof = json.loads(path.read_text())
        except ValueError as e:
            raise CoactoError(f"{path}: not a readable profile ({e})") from None
    else:
        prof = _measure(name, threads, models, runs, server, link_inferences, progress)
    if set(only) & {"engine", "quota"}:  # the local speedup alone leaves the rest as it was
        prof["server_calibration"] = measure_calibration(progress)
    if engine or "engine" in only:
        prof["engine"] = _engine(engine_model, engine_inferences, progress)
    if quota is not None:
        from .quota import key, measure_quota

        qm = list(quota_models or [m for m in prof.get("layers") or models])
        prof.setdefault("quota", {})[key(quota, period_ms)] = measure_quota(
            quota, period_ms, qm, progress=progress)
    if "local" in only:
        counts = _thread_counts(threads, runs)
        names = list(quota_models or prof.get("layers") or models)
        table = prof.setdefault("local_speedup", {})  # the models and counts measured now
        for model, entry in measure_local_speedup(_offload_graphs(names, progress), counts,
                                                  runs, progress).items():
            old = table.get(model)
            if isinstance(old, dict) and old.get("graph_id") == entry["graph_id"]:
                old.setdefault("threads", {}).update(entry["threads"])
            else:
                table[model] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prof, indent=1) + "\n")
    return prof, path


def _thread_counts(threads, runs: int) -> list[int]:
    """The thread counts to measure (default: 1 to this process's CPUs), sorted; checks them
    and ``runs``."""
    from ..runtime import default_threads

    counts = sorted(set(threads or range(1, default_threads() + 1)))
    if not counts or counts[0] < 1:
        raise CoactoError("thread counts must be positive integers")
    if runs < 1:
        raise CoactoError("runs must be at least 1")
    return counts


def _offload_graphs(models, progress) -> list:
    """(name, tile graph cut for offloading, example inputs) of each zoo model."""
    from .. import compiler, zoo
    from ..partition import OFFLOAD_MIN_COLUMN_BLOCKS

    unknown = [m for m in models if m not in zoo.MODELS]
    if unknown:
        raise CoactoError(f"not zoo models: {', '.join(unknown)} (zoo: {', '.join(zoo.MODELS)})")
    graphs = []
    for m in models:
        progress(f"compiling {m} ...")
        onnx_model = zoo.build(m)
        tg = compiler.compile(onnx_model, min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)
        graphs.append((m, tg, zoo.input_feeds(onnx_model)))
    return graphs


def _engine(model: str, inferences: int, progress) -> dict:
    from .enginecost import measure_engine

    return measure_engine(model, inferences, progress=progress)


def _measure(name, threads, models, runs, server, link_inferences, progress) -> dict:
    from ..native import check_isa, gemm_kernel_name
    from ..machine import cache_sizes, cpu_model
    from ..runtime import default_threads

    counts = _thread_counts(threads, runs)
    graphs = _offload_graphs(models, progress)
    gflops, notes, rows, overhead_us = {}, [], [], None
    layer_tables: dict = {}
    for t in counts:
        progress(f"{t} thread(s):")
        m = measure_threads(graphs, t, runs, progress)
        rows.extend(m["models"])
        for model_name, lt in m["layers"].items():
            entry = layer_tables.setdefault(model_name, {"graph_id": lt["graph_id"],
                                                         "n_layers": lt["n_layers"],
                                                         "seconds": {}})
            entry["seconds"][str(t)] = lt["seconds"]
        rates = np.zeros(len(OP_CLASSES))
        trusted = m["seconds"] >= MIN_CLASS_SECONDS
        if not trusted[OTHER]:
            raise CoactoError("the models exercised too little of the 'other' class to rate it; "
                              "add a model with pooling or normalisation (--models)")
        for c in range(len(OP_CLASSES)):
            src = c if trusted[c] and m["flops"][c] > 0 else OTHER
            if src != c and t == counts[0]:
                notes.append(f"{OP_CLASSES[c]}: too little busy time in these models; rated as "
                             f"'other'")
            rates[c] = m["flops"][src] / m["seconds"][src] * t / 1e9
        gflops[t] = dict(zip(OP_CLASSES, rates.tolist()))
        if t == 1:  # at one thread nothing idles: latency - busy is the runtime's own time
            per_tile = [(r["latency_ms"] - r["busy_ms"]) * 1e3 / r["tiles"] for r in m["models"]]
            overhead_us = max(0.0, statistics.median(per_tile))
    if overhead_us is None:
        notes.append("tile_overhead_us: not measured (1 thread was not among the counts); 0")
        overhead_us = 0.0
    link = None
    if server:
        link = measure_link(server, models[0], link_inferences, progress)
    source = (f"measured on this machine by `coacto profile` ({time.strftime('%Y-%m-%d')}): "
              f"per-layer busy time of zoo models {', '.join(models)} (offloading partition) at "
              f"{', '.join(map(str, counts))} thread(s), means of {runs} runs, the least "
              f"busy of {ROUNDS} rounds"
              + (f"; link: {link['how']} against {server}" if link else ""))
    prof = profile_dict(name, os.cpu_count() or max(counts), gflops, overhead_us, source, link,
                        measured=time.strftime("%Y-%m-%d"),
                        cpu={"model": cpu_model(), "machine": platform.machine(),
                             "cores": os.cpu_count(), "usable": default_threads(),
                             "caches": cache_sizes(), "isa_cap": check_isa()},
                        gemm_kernel=gemm_kernel_name(), runs=runs, models=rows,
                        notes=notes, layers=layer_tables,
                        local_speedup=measure_local_speedup(graphs, counts, runs, progress),
                        server_calibration=measure_calibration(progress))
    return prof


def measure_calibration(progress) -> dict:
    """The single-thread rate of the GEMM coacto-server calibrates with at start
    (coacto.server.sessions.calibrate_flops): what a server announces for a model it has not
    measured yet is that times its threads times CALIBRATION_EFFICIENCY."""
    from ..server.sessions import CALIBRATION_EFFICIENCY, calibrate_flops

    progress("the server's calibration GEMM ...")
    keep = os.sched_getaffinity(0)
    cpu = max(keep)  # where the experiments pin the server
    try:
        os.sched_setaffinity(0, {cpu})
        rates = [calibrate_flops(1) / CALIBRATION_EFFICIENCY for _ in range(CALIBRATION_TRIALS)]
    finally:
        os.sched_setaffinity(0, keep)
    return {"gemm_gflops_per_thread": statistics.median(rates) / 1e9,
            "trials_gflops": [r / 1e9 for r in rates],
            "how": f"coacto.server.sessions.calibrate_flops(1) / CALIBRATION_EFFICIENCY on CPU "
                   f"{cpu} (where the experiments pin the server), the median of "
                   f"{CALIBRATION_TRIALS} calibrations (each the best of its GEMM runs over "
                   f"0.25 s, as a starting server does)"}
