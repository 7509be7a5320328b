"""Auto-tuning of tile counts per layer (ASPEN's loop) and the cache of tuned profiles.

The default tile counts come from a FLOP heuristic that knows nothing of the device. `tune`
measures instead: starting from the default, it changes the tile count of one *group* of layers
at a time (the layers of one op and one feature-map size, e.g. the 14x14 convolutions of a
ResNet), halving or doubling it, and keeps a change only when the model got faster by more than
the measurement noise. The noise band comes from the measurements themselves (the spread of the
paired candidate / incumbent ratios over the rounds), capped at ``noise`` (5%): on a quiet machine
small gains count, on a noisy one only clear ones. Every candidate is measured interleaved with
the incumbent, in the same rounds, so machine drift hits both alike. At the end the tuned and the
default configuration are measured against each other once more, over more rounds, and that
ratio is what is reported and stored: tuning never claims a gain it did not measure.

A profile is a small JSON file in ``profile_dir()`` (``$COACTO_PROFILE_DIR``, else
``$XDG_CACHE_HOME/coacto/profiles``, else ``~/.cache/coacto/profiles``) named after the model's
hash, the machine's fingerprint and the thread count; ``coacto compile / run / bench`` pass its
``layer_tiles`` to coacto.compile when one matches (``--no-tuned`` ignores it). Tile counts change
the tile graph and so its id: an offloading device and server both use the default partition.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import CoactoError
from .machine import cache_sizes, cpu_model

log = logging.getLogger(__name__)

#: Format of the profile files this coacto writes and reads.
PROFILE_FORMAT = 1
#: Cap on the noise band: a candidate within this fraction of the incumbent is never taken.
DEFAULT_NOISE = 0.05
#: Tile counts a layer may be given (the partitioner clamps to what the layer can be cut into).
MAX_LAYER_TILES = 256


# ------------------------------------------------------------------------------ cache

def profile_dir() -> Path:
    """Where profiles live: $COACTO_PROFILE_DIR, else the user's cache folder."""
    env = os.environ.get("COACTO_PROFILE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "coacto" / "profiles"


def machine_info() -> dict:
    """What makes tuned tile counts valid on a machine: processor, CPU count, GEMM kernel (and,
    for the record, the caches)."""
    from .native import gemm_kernel_name
    from .runtime import default_threads

    return {"cpu": cpu_model(), "machine": platform.machine(), "cpus": default_threads(),
            "gemm_kernel": gemm_kernel_name(), "caches": cache_sizes()}


def machine_fingerprint(info: dict | None = None) -> str:
    """12 hex digits identifying machine_info()."""
    info = machine_info() if info is None else info
    canon = json.dumps({k: info[k] for k in ("cpu", "machine", "cpus", "gemm_kernel")},
                       sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def profile_path(model_hash: str, threads: int, fingerprint: str | None = None) -> Path:
    """The file a profile of this model, machine and thread count is stored in."""
    fp = fingerprint or machine_fingerprint()
    return profile_dir() / f"{model_hash[:16]}-{fp}-t{int(threads)}.json"


def load_profile(model_hash: str, threads: int) -> dict | None:
    """The profile of this model for this machine and thread count, or None. A file that is
    unreadable, of another format or partitioner version, or for another model is ignored (with
    a warning naming it, so the user can delete it or tune again)."""
    from .partition import PARTITIONER_VERSION

    path = profile_path(model_hash, threads)
    if not path.exists():
        return None
    try:
        prof = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("ignoring the tuned profile %s: cannot read it (%s)", path, e)
        return None
    problems = []
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT:
        problems.append("another format")
    elif prof.get("model_hash") != model_hash or prof.get("threads") != int(threads):
        problems.append("written for another model or thread count")
    elif prof.get("partitioner") != PARTITIONER_VERSION:
        problems.append(f"partitioner version {prof.get('partitioner')}, this coacto has "
                        f"{PARTITIONER_VERSION}")
    elif not isinstance(prof.get("layer_tiles"), dict) or not all(
            str(k).isdigit() and isinstance(v, int) and v >= 1
            for k, v in prof["layer_tiles"].items()):
        problems.append("malformed layer_tiles")
    if problems:
        log.warning("ignoring the tuned profile %s (%s); run `coacto tune` again", path,
                    problems[0])
        return None
    return prof


def layer_tiles_of(prof: dict | None) -> dict[int, int] | None:
    """{layer: tiles} of a loaded profile (None: no profile, or the default is best)."""
    if not prof or not prof["layer_tiles"]:
        return None
    return {int(k): int(v) for k, v in prof["layer_tiles"].items()}


def tuned_layer_tiles(model_hash: str, threads: int) -> dict[int, int] | None:
    """{layer: tiles} of a stored profile (None: no profile, or the default is best)."""
    return layer_tiles_of(load_profile(model_hash, threads))


def check_profile_dir() -> Path:
    """The profile folder, created if missing, after checking that a profile can be written
    there: `coacto tune` calls this before it spends minutes measuring."""
    folder = profile_dir()
    hint = ("set COACTO_PROFILE_DIR to a writable folder, or pass --no-save to tune without "
            "storing the result")
    if folder.exists() and not folder.is_dir():
        raise CoactoError(f"the profile folder {folder} is a file, not a folder; {hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CoactoError(f"cannot write profiles to {folder} ({e.strerror or e}); {hint}") from e
    return folder


def save_profile(profile: dict) -> Path:
    """Writes a profile (atomically: a reader never sees half a file) and returns its path."""
    path = profile_path(profile["model_hash"], profile["threads"],
                        profile["machine"]["fingerprint"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(profile, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------------------ measuring

class _Bench:
    """Paired latency measurements of tile graphs on one set of computing threads."""

    def __init__(self, threads: int, feeds: dict, runs: int):
        from .runtime import Runtime

        self._Runtime = Runtime
        self.threads = threads
        self.feeds = feeds
        self.runs = runs
        self._pool = None  # a Runtime whose threads every candidate shares
        self.runtimes: dict[int, object] = {}

    def runtime(self, tg):
        key = id(tg)
        if key not in self.runtimes:
            if self._pool is None:
                self._pool = self._Runtime(tg, threads=self.threads)
                self.runtimes[key] = self._pool
            else:
                self.runtimes[key] = self._Runtime(tg, share=self._pool)
            # (a Runtime packs the weights and warms its buffers with one inference when made)
        return self.runtimes[key]

    def forget(self, tg) -> None:
        rt = self.runtimes.pop(id(tg), None)
        if rt is not None and rt is not self._pool:
            rt.close()

    def paired(self, a, b, rounds: int) -> tuple[float, float, float]:
        """Medians of a and b (seconds) and the noise band of their ratio, from `rounds` rounds
        of `runs` runs each, alternating which goes first."""
        ra, rb = self.runtime(a), self.runtime(b)
        ta, tb, ratios = [], [], []
        for r in range(rounds):
            order = ((ra, ta), (rb, tb)) if r % 2 == 0 else ((rb, tb), (ra, ta))
            for rt, out in order:
                rt.run(self.feeds)  # first run of a block: caches of the other configuration
                times = []
                for _ in range(self.runs):
                    t0 = time.perf_counter()
                    rt.run(self.feeds)
                    times.append(time.perf_counter() - t0)
                out.append(statistics.median(times))
            ratios.append(tb[-1] / ta[-1])
        return statistics.median(ta), statistics.median(tb), _noise_band(ratios)


def _noise_band(ratios: list[float]) -> float:
    """How far from 1 the median of paired ratios may be by chance: two standard errors of the
    median, estimated robustly (the median absolute deviation x 1.4826 estimates the standard
    deviation; the median's standard error is 1.2533 of it over sqrt(n)). A gain smaller than
    this is noise."""
    if len(ratios) < 3:
        return float("inf")
    med = statistics.median(ratios)
    mad = statistics.median(abs(r - med) for r in ratios)
    return 1.4826 * mad * 1.2533 / math.sqrt(len(ratios)) * 2.0


# ------------------------------------------------------------------------------ tuning

@dataclass
class TuneResult:
    """What tune() measured and decided."""

    layer_tiles: dict[int, int]      # overrides of the default (empty: the default is best)
    default_ms: float
    tuned_ms: float
    steps: list[dict] = field(default_factory=list)
    profile: dict | None = None
    path: Path | None = None

    @property
    def ratio(self) -> float:
        return self.tuned_ms / self.default_ms


def layer_groups(graph) -> list[tuple[str, list[int]]]:
    """Layers tuned together: same op (convolutions split into grouped / dense) and same number
    of columns, i.e. one stage of a CNN or one kind of layer of a transformer."""
    groups: dict[tuple, list[int]] = {}
    for li, layer in enumerate(graph.layers):
        if layer.op == "INPUT":
            continue
        kind = layer.op
        if layer.op == "CONV":
            kind = ("CONV 1x1+dw" if layer.attrs.get("pre") else
                    "CONV dw" if layer.attrs.get("group", 1) > 1 else "CONV")
        groups.setdefault((kind, layer.columns), []).append(li)
    out = []
    for (kind, cols), layers in groups.items():
        n, _, h, w = graph.layers[layers[0]].shape
        where = f"{h}x{w}" if n == 1 else f"{n}x{h}x{w}"
        out.append((f"{kind} on {where} maps ({len(layers)} layer{'s' if len(layers) > 1 else ''})",
                    layers))
    return out


def _counts(plan) -> list[int]:
    return [(len(c) - 1) * (len(r) - 1) for c, r in zip(plan.col_bounds, plan.row_bounds)]


class _Candidates:
    """Tile graphs of one imported model under different per-layer counts, sharing one weight
    blob and its packed weights (only the tiles differ), built once each."""

    def __init__(self, graph, base_tg):
        self.graph = graph
        self.base = base_tg
        self.default_counts = _counts(base_tg.plan)

    def build(self, counts: list[int]):
        from .compiler import repartition

        overrides = {li: c for li, c in enumerate(counts)
                     if c != self.default_counts[li] and self.graph.layers[li].op != "INPUT"}
        return repartition(self.base, layer_tiles=overrides,
                           threads=self.base.params.get("threads")), overrides


def tune(model, threads: int, *, feeds: dict | None = None, budget_s: float = 120.0,
         rounds: int = 7, runs: int = 3, noise: float = DEFAULT_NOISE, final_rounds: int = 15,
         progress=None, save: bool = True) -> TuneResult:
    """Tunes the tile counts of `model` (ONNX path, bytes or ModelProto) for `threads` computing
    threads on this machine; see the module's docstring. ``budget_s`` bounds the search (the final
    measurement comes on top); ``rounds`` x ``runs`` runs per configuration and candidate.
    Writes the profile when ``save`` (returned in ``.path``)."""
    from .compiler import import_graph, partition_graph
    from .partition import PARTITIONER_VERSION

    say = progress or (lambda msg: None)
    if not isinstance(threads, int) or threads < 1:
        raise CoactoError(f"threads must be a positive integer, got {threads!r}")
    if rounds < 3 or runs < 1:
        raise CoactoError("tuning needs at least 3 rounds of at least 1 run per configuration")
    if save:
        check_profile_dir()
    graph = import_graph(model, local=True)  # the layers coacto.compile(threads=...) makes
    default_tg = partition_graph(graph, threads=threads)
    if feeds is None:
        rng = np.random.default_rng(0)
        feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in default_tg.inputs.items()}
    cands = _Candidates(graph, default_tg)
    bench = _Bench(threads, feeds, runs)
    groups = _order_groups(layer_groups(graph), default_tg, bench)

    best_tg, best_counts = default_tg, list(cands.default_counts)
    steps: list[dict] = []
    tried: set[tuple] = {tuple(best_counts)}
    t_start = time.monotonic()
    say(f"tuning {len(groups)} layer groups at {threads} thread(s), budget {budget_s:.0f} s, "
        f"{rounds} rounds x {runs} runs per comparison")
    def out_of_time() -> bool:
        return time.monotonic() - t_start >= budget_s

    improved, passes = True, 0
    while improved and not out_of_time():
        improved, passes = False, passes + 1
        for gi, (gname, layers) in enumerate(groups):
            for factor in (0.5, 2.0):
                if out_of_time():
                    break
                counts = list(best_counts)
                for li in layers:
                    counts[li] = max(1, min(MAX_LAYER_TILES, int(round(counts[li] * factor))))
                cand_tg, _ = cands.build(counts)
                counts = _counts(cand_tg.plan)  # what the partitioner made of the request
                if tuple(counts) in tried:
                    continue
                tried.add(tuple(counts))
                t_best, t_cand, band = bench.paired(best_tg, cand_tg, rounds)
                band = min(band, noise)
                gain = 1.0 - t_cand / t_best
                keep = gain > band
                old = [best_counts[li] for li in layers]
                new = [counts[li] for li in layers]
                steps.append({"pass": passes, "group": gname, "tiles_from": old, "tiles_to": new,
                              "best_ms": t_best * 1e3, "candidate_ms": t_cand * 1e3,
                              "noise": band, "kept": keep})
                say(f"[pass {passes}, group {gi + 1}/{len(groups)}] {gname}: tiles "
                    f"{_span(old)} -> {_span(new)}: {t_cand * 1e3:.2f} ms vs {t_best * 1e3:.2f} ms "
                    f"({-gain:+.1%}, noise {band:.1%}) -> {'kept' if keep else 'dropped'}")
                if keep:
                    if best_tg is not default_tg:
                        bench.forget(best_tg)
                    best_tg, best_counts, improved = cand_tg, counts, True
                    break
                bench.forget(cand_tg)
    if out_of_time():
        say(f"time budget ({budget_s:.0f} s) spent; stopping the search")
    say(f"final check: tuned vs default, {final_rounds} rounds ...")
    candidate_ms = None
    if best_tg is default_tg:
        t_def = t_tuned = bench.paired(default_tg, default_tg, 3)[0]
    else:
        t_def, t_tuned, band = bench.paired(default_tg, best_tg, final_rounds)
        if 1.0 - t_tuned / t_def <= min(band, noise):
            # The search's gains did not hold up beyond the noise: the default stays.
            say(f"the tuned configuration measured {t_tuned * 1e3:.2f} ms vs the default's "
                f"{t_def * 1e3:.2f} ms, within the noise ({min(band, noise):.1%}): keeping the "
                f"default")
            candidate_ms = t_tuned * 1e3
            best_tg, best_counts, t_tuned = default_tg, list(cands.default_counts), t_def
    _, overrides = cands.build(best_counts)
    result = TuneResult(layer_tiles=overrides, default_ms=t_def * 1e3, tuned_ms=t_tuned * 1e3,
                        steps=steps)
    info = machine_info()
    result.profile = {
        "format": PROFILE_FORMAT, "model_hash": graph.model_hash, "threads": threads,
        "machine": dict(info, fingerprint=machine_fingerprint(info)),
        "partitioner": PARTITIONER_VERSION,
        "layer_tiles": {str(k): int(v) for k, v in sorted(overrides.items())},
        "default_ms": result.default_ms, "tuned_ms": result.tuned_ms, "ratio": result.ratio,
        "rejected_candidate_ms": candidate_ms,
        "default_tiles": default_tg.n_tiles, "tuned_tiles": best_tg.n_tiles,
        "rounds": rounds, "runs": runs, "final_rounds": final_rounds, "noise_cap": noise,
        "search_seconds": time.monotonic() - t_start, "steps": steps,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if save:
        try:
            result.path = save_profile(result.profile)
        except OSError as e:  # the folder changed during the search: report what was measured
            raise CoactoError(
                f"tuned {result.tuned_ms:.2f} ms against the default's {result.default_ms:.2f} ms, "
                f"but the profile could not be written to {profile_dir()} "
                f"({e.strerror or e}); layer tiles: {result.profile['layer_tiles']}") from e
    return result


def _span(counts: list[int]) -> str:
    lo, hi = min(counts), max(counts)
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _order_groups(groups, tg, bench: _Bench):
    """Groups by measured time, most expensive first (one profiled run of the default graph);
    groups with no measurable time are dropped: their tiles cannot matter."""
    from .native import ffi, lib, native_graph

    rt = bench.runtime(tg)
    ng = native_graph(tg)
    lib.coacto_graph_set_profiling(ng.handle, 1)
    for _ in range(3):
        rt.run(bench.feeds)
    lib.coacto_graph_set_profiling(ng.handle, 0)
    secs = ffi.new("double[]", tg.n_layers)
    lib.coacto_graph_layer_seconds(ng.handle, secs, tg.n_layers)
    total = sum(secs[i] for i in range(tg.n_layers)) or 1.0
    timed = [(sum(secs[li] for li in layers) / total, name, layers) for name, layers in groups]
    timed.sort(key=lambda t: -t[0])
    return [(f"{name}, {share:.0%} of the time", layers) for share, name, layers in timed
            if share >= 0.005]
