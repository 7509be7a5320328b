"""coacto vs its peers: latency in one process (same inputs, same threads, interleaved runs,
medians), peak resident memory in fresh processes (coacto.memory), one table for many models.

Two ways to measure latency (MODES): "back-to-back" (Contest: coacto and onnxruntime in blocks of
runs, each runtime's steady state) and "app" (AppContest: one inference per runtime and round,
each after a pause and other memory traffic, as an app that does other work between frames runs
them; OpenVINO is a second peer there when it is installed).

A model that cannot be benchmarked (not in the zoo, an operator the importer does not know, a
failure) becomes a row that says why; the other rows are still measured."""
from __future__ import annotations

import hashlib
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import CoactoError, UnsupportedOperatorError
from .peer import (OnnxruntimePeer, OpenVINOPeer, onnxruntime_session, openvino_message,
                   openvino_missing)

log = logging.getLogger(__name__)

#: Values of ``memory`` in bench_models: what coacto's memory child loads (see coacto.memory).
MEMORY_MODES = ("ctg", "onnx", "off")

#: Values of ``mode`` in bench_models / compare: how latency is measured (module docstring).
MODES = ("back-to-back", "app")

#: Outputs agree when max |got - reference| <= MATCH_REL x max |reference|, output by output.
MATCH_REL = 1e-4


def max_error(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |got - ref|, max |ref|)."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf"), float(np.abs(ref).max(initial=0.0))
    return float(np.abs(got - ref).max(initial=0.0)), float(np.abs(ref).max(initial=0.0))


def check_outputs(outs: dict, ref: dict) -> tuple[float, bool]:
    """(max relative error, match) of the outputs `ref` has (an absent one is an infinite error):
    every output within MATCH_REL x max |reference| of onnxruntime's."""
    errs = [max_error(outs[k], ref[k]) if k in outs else (float("inf"), 0.0) for k in ref]
    return (max((e / s if s else e for e, s in errs), default=0.0),
            all(e <= MATCH_REL * s for e, s in errs))


def onnxruntime_run(onnx_bytes: bytes, feeds, threads: int, repeat: int):
    sess = onnxruntime_session(onnx_bytes, threads)
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(names, feeds)
        times.append(time.perf_counter() - t0)
    return dict(zip(names, outs)), statistics.median(times) if times else float("nan")


#: A block: warm-up runs (at least WARM_RUNS, and for at least WARM_S seconds: a small model
#: needs more runs than a large one before its threads and cores are up to speed after a pause),
#: then COUNTED_RUNS timed runs; PAUSE_S between blocks.
WARM_RUNS, WARM_S, COUNTED_RUNS, PAUSE_S = 2, 0.04, 4, 0.1


class Contest:
    """coacto and onnxruntime on one tile graph at one thread count: both prepared once, then
    measured block by block (run_block), so that several contests can take turns and a
    disturbance of the machine spreads over all of them instead of ruining one."""

    def __init__(self, tg, onnx_bytes: bytes | None, threads: int, name: str = "",
                 feeds: dict | None = None):
        from .runtime import Runtime

        self.feeds = tg.example_feeds(0) if feeds is None else feeds
        self.row = {"mode": "back-to-back", "model": name, "threads": threads,
                    "tiles": tg.n_tiles}
        self.rt = Runtime(tg, threads=threads)
        outs = self.rt.run(self.feeds)  # warm-up: packs the weights
        self.sess = None
        if onnx_bytes is not None:
            self.sess = onnxruntime_session(onnx_bytes, threads)
            self.onames = [o.name for o in self.sess.get_outputs()]
            ref = dict(zip(self.onames, self.sess.run(self.onames, self.feeds)))
            self.row["max_rel_error"], self.row["match"] = check_outputs(
                outs, {k: ref[k] for k in outs})
        self.tc: list[float] = []
        self.to: list[float] = []

    @staticmethod
    def rounds_for(repeat: int) -> int:
        return blocks_for(repeat)

    def run_round(self, index: int) -> None:
        self.run_block()

    def run_block(self) -> None:
        """One block of coacto runs, a pause, one block of onnxruntime runs, a pause. Pauses let
        each runtime's idle threads stop spinning (onnxruntime's spin longer) before the other
        runs; the warm-up runs of a block are not counted, as after a pause either runtime is
        slower while its threads and idle cores wake up: what is compared is both steady states."""
        _timed_block(lambda: self.rt.run(self.feeds), self.tc)
        if self.sess is not None:
            _timed_block(lambda: self.sess.run(self.onames, self.feeds), self.to)

    def result(self) -> dict:
        row = dict(self.row)
        row["coacto_ms"] = statistics.median(self.tc) * 1e3
        row["coacto_best_ms"] = min(self.tc) * 1e3
        row["runs"] = len(self.tc)
        row["peak_activation_mb"] = self.rt.last_stats.get("peak_activation_bytes", 0) / 1e6
        if self.to:
            row["onnxruntime_ms"] = statistics.median(self.to) * 1e3
            row["onnxruntime_best_ms"] = min(self.to) * 1e3
            row["ratio"] = row["coacto_ms"] / row["onnxruntime_ms"]
            # the fastest runs: what each runtime does when nothing else on the machine interferes
            row["best_ratio"] = row["coacto_best_ms"] / row["onnxruntime_best_ms"]
        return row

    def close(self) -> None:
        self.rt.close()
        self.sess = None


def _timed_block(fn, out: list[float]) -> None:
    start, runs = time.perf_counter(), 0
    while runs < WARM_RUNS or time.perf_counter() - start < WARM_S:
        fn()
        runs += 1
    for _ in range(COUNTED_RUNS):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    time.sleep(PAUSE_S)


def blocks_for(repeat: int) -> int:
    """Blocks that give at least `repeat` counted runs."""
    return max(1, -(-repeat // COUNTED_RUNS))


# ------------------------------------------------------------------------------ app mode

#: App mode's defaults: the pause before each inference (s) and the other memory traffic (MB).
APP_PAUSE_S, APP_TRAFFIC_MB = 0.1, 64.0


class MemoryTraffic:
    """What an app does between two inferences, as far as caches and TLBs see it: writes every
    byte of a buffer of `mb` megabytes (1e6 bytes), then reads it all back, so that what the
    last inference left in the caches (weights, activations, the page-table entries that map
    them) is replaced by something else. 0 MB: nothing."""

    def __init__(self, mb: float):
        n = int(mb * 1e6) // 8
        self.mb = mb
        self.buffer = np.ones(n, np.uint64) if n > 0 else None  # ones: its pages are mapped now
        self.value, self.sink = 0, 0

    def __call__(self) -> None:
        if self.buffer is None:
            return
        self.value += 1
        self.buffer.fill(self.value)
        self.sink = int(self.buffer.sum())  # uint64 wraps around; only the reading matters


class AppContest:
    """coacto and its peers on one tile graph at one thread count, run as an app runs them: per
    round (run_round) each runtime runs ONE inference, the order rotating from round to round,
    each inference preceded by a pause (`pause` s: the threads of every runtime go idle, the
    cores may sleep) and by `traffic` (other memory traffic: see MemoryTraffic). The first
    inference after loading is timed on its own ("first"). Peers: onnxruntime (the reference of
    the output check), and OpenVINO when it is installed and `openvino`; a peer whose outputs
    disagree with onnxruntime's is reported (`openvino_status`) and not timed."""

    def __init__(self, tg, onnx_bytes: bytes | None, threads: int, name: str = "",
                 feeds: dict | None = None, *, pause: float = APP_PAUSE_S,
                 traffic=None, openvino: bool = True):
        from .runtime import Runtime

        self.feeds = tg.example_feeds(0) if feeds is None else feeds
        self.pause = pause
        self.traffic = traffic if traffic is not None else MemoryTraffic(APP_TRAFFIC_MB)
        self.row = {"mode": "app", "model": name, "threads": threads, "tiles": tg.n_tiles,
                    "pause_s": pause, "traffic_mb": getattr(self.traffic, "mb", None)}
        self.runners: dict = {}   # runtime name -> () -> outputs, in the order of round 0
        self.first: dict[str, float] = {}
        self.times: dict[str, list[float]] = {}
        self.orders: list[list[str]] = []  # the order each round ran the runtimes in
        self.peers: list = []
        self.rt = Runtime(tg, threads=threads)
        try:
            self._prepare(onnx_bytes, threads, openvino)
        except BaseException:
            self.close()
            raise

    def _prepare(self, onnx_bytes: bytes | None, threads: int, openvino: bool) -> None:
        outs = self._first("coacto", lambda: self.rt.run(self.feeds))
        if onnx_bytes is None:
            return
        ort = OnnxruntimePeer(onnx_bytes, threads)
        self.peers.append(ort)
        ref = self._first("onnxruntime", lambda: ort.run(self.feeds))
        self.row["max_rel_error"], self.row["match"] = check_outputs(
            outs, {k: ref[k] for k in outs})
        if not openvino:
            return
        missing = openvino_missing()
        if missing:
            self.row["openvino_status"] = missing
            return
        try:
            ov = OpenVINOPeer(onnx_bytes, threads, self.feeds, ort.output_names)
            t0 = time.perf_counter()
            got = ov.run(self.feeds)
            first = time.perf_counter() - t0
        except Exception as e:  # an optional peer that cannot run the model: the row says why
            self.row["openvino_status"] = f"failed: {openvino_message(e)}"
            return
        self.peers.append(ov)
        self.row["openvino_config"] = ov.config
        err, match = check_outputs(got, ref)
        self.row["openvino_max_rel_error"], self.row["openvino_match"] = err, match
        if match:
            self.first["openvino"] = first
            self.runners["openvino"] = lambda: ov.run(self.feeds)
            self.times["openvino"] = []
        else:
            self.row["openvino_status"] = (f"MISMATCH with onnxruntime ({err:.2g} relative), "
                                           "not timed")

    def _first(self, name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        self.first[name] = time.perf_counter() - t0
        self.runners[name] = fn
        self.times[name] = []
        return out

    @staticmethod
    def rounds_for(repeat: int) -> int:
        return repeat

    def run_round(self, index: int) -> None:
        """Round `index`: every runtime once, starting with runtime `index` modulo their count
        (coacto, onnxruntime, openvino; then onnxruntime, openvino, coacto; ...)."""
        names = list(self.runners)
        k = index % len(names)
        order = names[k:] + names[:k]
        self.orders.append(order)
        for name in order:
            time.sleep(self.pause)
            self.traffic()
            t0 = time.perf_counter()
            self.runners[name]()
            self.times[name].append(time.perf_counter() - t0)

    def result(self) -> dict:
        row = dict(self.row)
        for name, times in self.times.items():
            if not times:
                continue
            med = statistics.median(times)
            p10, p90 = np.percentile(times, [10, 90])
            row[f"{name}_ms"] = med * 1e3
            row[f"{name}_first_ms"] = self.first[name] * 1e3
            row[f"{name}_best_ms"] = min(times) * 1e3
            row[f"{name}_p10_ms"] = float(p10) * 1e3
            row[f"{name}_p90_ms"] = float(p90) * 1e3
        row["runs"] = len(self.times["coacto"])
        row["peak_activation_mb"] = self.rt.last_stats.get("peak_activation_bytes", 0) / 1e6
        if "coacto_ms" not in row:
            return row
        row["coacto_first_ratio"] = row["coacto_first_ms"] / row["coacto_ms"]
        row["coacto_spread"] = (row["coacto_p90_ms"] - row["coacto_p10_ms"]) / row["coacto_ms"]
        peers = [n for n in self.times if n != "coacto" and f"{n}_ms" in row]
        row["peers"] = peers
        for n in peers:
            row[f"ratio_{n}"] = row["coacto_ms"] / row[f"{n}_ms"]
        if peers:
            best = min(peers, key=lambda n: row[f"{n}_ms"])
            row["best_peer"], row["best_peer_ms"] = best, row[f"{best}_ms"]
            row["ratio"] = row["coacto_ms"] / row["best_peer_ms"]
        return row

    def close(self) -> None:
        self.rt.close()
        self.runners.clear()
        self.peers.clear()


def make_contest(mode: str, tg, onnx_bytes: bytes | None, threads: int, name: str = "",
                 feeds: dict | None = None, *, pause: float = APP_PAUSE_S, traffic=None,
                 openvino: bool = True):
    """A Contest (mode "back-to-back") or an AppContest (mode "app")."""
    if mode == "back-to-back":
        return Contest(tg, onnx_bytes, threads, name, feeds)
    if mode == "app":
        return AppContest(tg, onnx_bytes, threads, name, feeds, pause=pause, traffic=traffic,
                          openvino=openvino)
    raise CoactoError(f"mode must be one of {MODES}, got {mode!r}")


def compare(tg, onnx_bytes: bytes | None, threads: int, repeat: int, name: str = "",
            feeds: dict | None = None, *, mode: str = "back-to-back",
            pause: float = APP_PAUSE_S, traffic_mb: float = APP_TRAFFIC_MB,
            openvino: bool = True) -> dict:
    """Median latency of coacto and its peers, runs interleaved (in blocks, or in app mode one
    inference each per round) so all see the same machine noise; outputs checked against
    onnxruntime (max |error| <= 1e-4 max |reference|)."""
    traffic = MemoryTraffic(traffic_mb) if mode == "app" else None
    contest = make_contest(mode, tg, onnx_bytes, threads, name, feeds, pause=pause,
                           traffic=traffic, openvino=openvino)
    try:
        for i in range(contest.rounds_for(repeat)):
            contest.run_round(i)
        return contest.result()
    finally:
        contest.close()


# ------------------------------------------------------------------------------ many models

@dataclass
class BenchModel:
    """One model of a benchmark: how to get its ONNX bytes and inputs, or why it cannot run."""

    name: str
    onnx_bytes: bytes | None = None
    feeds: dict | None = None
    status: str | None = None  # None: runnable; else the reason shown in the table
    graphs: dict = field(default_factory=dict)  # threads -> TileGraph

    def graphs_by_threads(self, threads: int):
        return self.graphs[threads]


def load_bench_model(spec: str, image_size: int | None = None) -> BenchModel:
    """An .onnx file or a zoo name -> BenchModel (status set when it does not exist)."""
    from . import zoo

    path = Path(spec)
    if path.suffix == ".onnx" or path.exists():
        try:
            return BenchModel(spec, onnx_bytes=path.read_bytes())
        except OSError as e:
            return BenchModel(spec, status=f"cannot read the file ({e.strerror})")
    if spec not in zoo.MODELS:
        return BenchModel(spec, status="not in the zoo")
    # image models take the size; sequence models keep their default length
    kw = {"image_size": image_size} if image_size and spec in zoo.DEFAULT_IMAGE_SIZE else {}
    try:
        model = zoo.build(spec, **kw)
    except (KeyError, ValueError) as e:
        return BenchModel(spec, status=f"cannot build it: {e}")
    return BenchModel(spec, onnx_bytes=model.SerializeToString(), feeds=zoo.input_feeds(model))


def _short(e: Exception) -> str:
    """One line for a table cell: the first line of the message, or for unsupported operators
    the nodes' own reasons (the first line only counts them)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if isinstance(e, UnsupportedOperatorError):
        reasons = [ln for ln in lines[1:] if not ln.startswith("Replace these")]
        if reasons:
            more = f" (+{len(reasons) - 2} more)" if len(reasons) > 2 else ""
            return "; ".join(reasons[:2]) + more
    return lines[0] if lines else type(e).__name__


def compile_bench_model(bm: BenchModel, threads: int, tiles: int | None, use_tuned: bool):
    """The TileGraph of `bm` for `threads` (a tuned profile's tile counts when one exists for
    this machine and thread count and use_tuned), compiled once per distinct parameter set."""
    from . import compiler, tune

    layer_tiles = None
    if use_tuned and tiles is None:
        layer_tiles = tune.tuned_layer_tiles(hashlib.sha256(bm.onnx_bytes).hexdigest(), threads)
    key = tuple(sorted((layer_tiles or {}).items()))
    for tg in bm.graphs.values():
        if (tuple(sorted((int(k), v) for k, v in tg.params.get("layer_tiles", {}).items())) == key
                and tg.params.get("threads") == threads):
            break
    else:
        tg = compiler.compile(bm.onnx_bytes, tiles_per_layer=tiles, layer_tiles=layer_tiles,
                              threads=threads)
    bm.graphs[threads] = tg
    return tg


def bench_models(specs: list[str], threads_list: list[int], repeat: int, *,
                 tiles: int | None = None, image_size: int | None = None, use_tuned: bool = True,
                 memory: str = "ctg", memory_runs: int = 5, progress=None,
                 mode: str = "back-to-back", pause: float = APP_PAUSE_S,
                 traffic_mb: float = APP_TRAFFIC_MB, openvino: bool = True) -> list[dict]:
    """One row per (model, thread count): latencies, ratio, 2-thread speedup, peak memory.
    Rows of models that cannot run carry a `status` instead of numbers.

    Every runnable (model, thread count) is prepared first; then all of them are measured in
    rounds, one block each per round (mode "back-to-back"), or one inference per runtime per
    round (mode "app": `repeat` rounds; `pause` and `traffic_mb` before each inference; see
    AppContest), so that a disturbance of a shared machine lasting a few seconds touches every
    row a little instead of one row entirely."""
    if memory not in MEMORY_MODES:
        raise CoactoError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
    if mode not in MODES:
        raise CoactoError(f"mode must be one of {MODES}, got {mode!r}")
    say = progress or (lambda msg: None)
    traffic = MemoryTraffic(traffic_mb) if mode == "app" else None
    rows: dict[tuple[str, int], dict] = {}
    contests: dict[tuple[str, int], Contest] = {}
    models: dict[str, BenchModel] = {}
    try:
        for spec in specs:
            say(f"{spec}: loading ...")
            bm = models[spec] = load_bench_model(spec, image_size)
            for threads in threads_list:
                if bm.status is None:
                    try:
                        tg = compile_bench_model(bm, threads, tiles, use_tuned)
                        contests[spec, threads] = make_contest(
                            mode, tg, bm.onnx_bytes, threads, spec,
                            bm.feeds or tg.example_feeds(0), pause=pause, traffic=traffic,
                            openvino=openvino)
                    except UnsupportedOperatorError as e:
                        bm.status = f"unsupported: {_short(e)}"
                    except CoactoError as e:
                        bm.status = f"failed: {_short(e)}"
                rows[spec, threads] = {"mode": mode, "model": spec, "threads": threads}
            if bm.status is not None:  # a later thread count failed: drop the earlier ones too
                for threads in threads_list:
                    c = contests.pop((spec, threads), None)
                    if c is not None:
                        c.close()
        n_rounds = Contest.rounds_for(repeat) if mode == "back-to-back" else repeat
        for b in range(n_rounds):
            if contests:
                say(f"latency ({mode}): round {b + 1}/{n_rounds} over {len(contests)} model and "
                    f"thread count pairs ...")
            for c in contests.values():
                c.run_round(b)
        for key, c in contests.items():
            tg = c.rt.graph
            rows[key].update(c.result())
            rows[key]["tuned"] = "layer_tiles" in tg.params
    finally:
        for c in contests.values():
            c.close()
    for (spec, threads), row in rows.items():
        bm = models[spec]
        if bm.status is not None:
            row["status"] = bm.status
        elif memory != "off":
            say(f"{spec}: {threads} thread(s), peak memory in fresh processes ...")
            try:
                row.update(_memory_row(bm, bm.graphs_by_threads(threads), threads, memory,
                                       memory_runs))
            except CoactoError as e:
                row["memory_error"] = _short(e)
    out = list(rows.values())
    for spec in specs:
        _add_speedups([r for r in out if r["model"] == spec])
    return out


def _memory_row(bm: BenchModel, tg, threads: int, mode: str, runs: int) -> dict:
    from .memory import peak_memory

    with tempfile.TemporaryDirectory(prefix="coacto-bench-") as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        onnx_path.write_bytes(bm.onnx_bytes)
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, **(bm.feeds or tg.example_feeds(0)))
        if mode == "ctg":
            coacto_model = tg.save(Path(tmp) / "model.ctg")
        else:
            coacto_model = onnx_path
        c = peak_memory("coacto", coacto_model, inputs, threads, runs)
        o = peak_memory("onnxruntime", onnx_path, inputs, threads, runs)
    out = {"coacto_mb": c["model_peak_bytes"] / 1e6, "onnxruntime_mb": o["model_peak_bytes"] / 1e6,
           "memory_mode": mode}
    if out["onnxruntime_mb"] > 0:
        out["memory_ratio"] = out["coacto_mb"] / out["onnxruntime_mb"]
    return out


def _add_speedups(rows: list[dict]) -> None:
    """coacto's (and onnxruntime's) speedup of each thread count over one thread, when the
    one-thread row was measured in the same run."""
    one = next((r for r in rows if r.get("threads") == 1 and "coacto_ms" in r), None)
    if one is None:
        return
    for r in rows:
        if "coacto_ms" in r:
            r["speedup"] = one["coacto_ms"] / r["coacto_ms"]
            r["best_speedup"] = one["coacto_best_ms"] / r["coacto_best_ms"]
            if "onnxruntime_ms" in r and "onnxruntime_ms" in one:
                r["onnxruntime_speedup"] = one["onnxruntime_ms"] / r["onnxruntime_ms"]


# ------------------------------------------------------------------------------ table

_COLUMNS = [  # header, width, row key, format
    ("model", 14, "model", "s"), ("thr", 4, "threads", "d"), ("tiles", 7, "tiles", "d"),
    ("coacto ms", 10, "coacto_ms", ".2f"), ("ort ms", 9, "onnxruntime_ms", ".2f"),
    ("ratio", 6, "ratio", ".2f"), ("best", 5, "best_ratio", ".2f"),
    ("speedup", 8, "speedup", ".2f"), ("best", 5, "best_speedup", ".2f"),
    ("ort speedup", 12, "onnxruntime_speedup", ".2f"), ("coacto MB", 10, "coacto_mb", ".1f"),
    ("ort MB", 8, "onnxruntime_mb", ".1f"), ("mem ratio", 10, "memory_ratio", ".2f"),
]


def _cell(row: dict, key: str, fmt: str, width: int, left: bool) -> str:
    v = row.get(key)
    text = "-" if v is None else format(v, fmt)
    if key == "tiles" and row.get("tuned"):
        text += "*"
    return f"{text:<{width}}" if left else f"{text:>{width}}"


def format_table(rows: list[dict]) -> str:
    """The rows of bench_models / compare as a text table with a legend (the app mode's own
    columns when the rows are of that mode)."""
    if any(r.get("mode") == "app" for r in rows):
        return _format_app_table(rows)
    name_width = max([14] + [len(str(r.get("model", ""))) + 2 for r in rows])
    columns = [(h, name_width if i == 0 else w, k, f) for i, (h, w, k, f) in enumerate(_COLUMNS)]
    head = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w, _, _) in enumerate(columns))
    head += "  check"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = "".join(_cell(r, k, f, w, i == 0) for i, (_, w, k, f) in enumerate(columns))
        if r.get("status"):
            check = r["status"]
        elif "match" not in r:
            check = "-"
        else:
            check = "matches" if r["match"] else f"MISMATCH ({r['max_rel_error']:.2g})"
        if r.get("memory_error"):
            check += f"; memory not measured: {r['memory_error']}"
        lines.append(f"{line}  {check}")
    lines.append("mode back-to-back: each runtime's steady state (blocks of warm-up runs, then "
                 f"{COUNTED_RUNS} timed runs, {PAUSE_S:g} s between blocks; --mode app measures "
                 "as an app runs a model between other work)")
    lines.append("ratio = coacto / onnxruntime latency (median; below 1: coacto is faster); "
                 "speedup = latency at 1 thread / latency at this thread count; best = the same "
                 "from each runtime's fastest run (what a shared machine's interference leaves)")
    lines += _legend_tail(rows)
    return "\n".join(lines)


def _legend_tail(rows: list[dict]) -> list[str]:
    """The legend lines both tables share: memory, tuned tile counts."""
    lines = []
    if any("coacto_mb" in r for r in rows):
        mode = next(r["memory_mode"] for r in rows if "memory_mode" in r)
        how = ("coacto runs the compiled .ctg" if mode == "ctg"
               else "coacto compiles the .onnx in the measured process")
        lines.append(f"MB = peak resident memory of a fresh process loading the model and running "
                     f"it, minus its resident size after importing the libraries ({how}; "
                     f"onnxruntime loads the .onnx)")
    if any(r.get("tuned") for r in rows):
        lines.append("* tile counts from a profile `coacto tune` wrote for this machine and "
                     "thread count (--no-tuned ignores it)")
    return lines


#: Short names of the peers in the app table.
PEER_ABBREV = {"onnxruntime": "ort", "openvino": "ov"}


def _fmt(v, fmt: str) -> str | None:
    return None if v is None else format(v, fmt)


def _vs_best(r: dict) -> str | None:
    if "ratio" not in r:
        return None
    return f"{r['ratio']:.2f} {PEER_ABBREV.get(r['best_peer'], r['best_peer'])}"


def _spread(r: dict, name: str = "coacto") -> str | None:
    if f"{name}_ms" not in r or f"{name}_p10_ms" not in r:
        return None
    lo = (r[f"{name}_p10_ms"] / r[f"{name}_ms"] - 1) * 100
    hi = (r[f"{name}_p90_ms"] / r[f"{name}_ms"] - 1) * 100
    return f"{round(lo):+d}/{round(hi):+d}%"


def _peer_spread(r: dict) -> str | None:
    """The best peer's spread beside coacto's: what the machine's own noise does to a runtime
    run in the same rounds."""
    return _spread(r, r["best_peer"]) if "best_peer" in r else None


_APP_COLUMNS = [  # header, width, row -> text (None: "-")
    ("model", 14, lambda r: str(r.get("model", ""))),
    ("thr", 4, lambda r: _fmt(r.get("threads"), "d")),
    ("tiles", 7, lambda r: None if "tiles" not in r
        else f"{r['tiles']}{'*' if r.get('tuned') else ''}"),
    ("coacto ms", 10, lambda r: _fmt(r.get("coacto_ms"), ".2f")),
    ("ort ms", 9, lambda r: _fmt(r.get("onnxruntime_ms"), ".2f")),
    ("ov ms", 9, lambda r: _fmt(r.get("openvino_ms"), ".2f")),
    ("vs best", 9, _vs_best),
    ("first", 6, lambda r: _fmt(r.get("coacto_first_ratio"), ".2f")),
    ("spread", 10, _spread),
    ("peer spread", 12, _peer_spread),
    ("coacto MB", 10, lambda r: _fmt(r.get("coacto_mb"), ".1f")),
    ("ort MB", 8, lambda r: _fmt(r.get("onnxruntime_mb"), ".1f")),
    ("mem ratio", 10, lambda r: _fmt(r.get("memory_ratio"), ".2f")),
]


def _app_check(r: dict) -> str:
    if r.get("status"):
        return r["status"]
    if "match" not in r:
        check = "-"
    else:
        check = "matches" if r["match"] else f"MISMATCH ({r['max_rel_error']:.2g})"
    ov = r.get("openvino_status")
    if ov is not None and not ov.startswith("not "):  # not installed / not asked for: a legend
        check += f"; openvino {ov}"
    if r.get("memory_error"):
        check += f"; memory not measured: {r['memory_error']}"
    return check


def _format_app_table(rows: list[dict]) -> str:
    name_width = max([14] + [len(str(r.get("model", ""))) + 2 for r in rows])
    columns = [(h, name_width if i == 0 else w, f) for i, (h, w, f) in enumerate(_APP_COLUMNS)]
    head = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w, _) in enumerate(columns))
    head += "  check"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for i, (_, w, f) in enumerate(columns):
            text = f(r)
            text = "-" if text is None else text
            cells.append(f"{text:<{w}}" if i == 0 else f"{text:>{w}}")
        lines.append("".join(cells) + "  " + _app_check(r))
    timed = next((r for r in rows if "coacto_ms" in r), None)
    if timed is not None:
        mb = timed.get("traffic_mb")
        traffic = f"{mb:g} MB of other memory traffic (written, then read)" if mb else \
            "no other memory traffic"
        lines.append(f"mode app: {timed['runs']} rounds; in each, every runtime runs one "
                     f"inference, the order rotating from round to round, each after a "
                     f"{timed['pause_s']:g} s pause and {traffic}")
    lines.append("ms = median; vs best = coacto / the fastest peer's median (ort: onnxruntime, "
                 "ov: OpenVINO; below 1: coacto is faster); first = coacto's first inference "
                 "after loading / its median; spread = coacto's 10th and 90th percentiles "
                 "relative to its median; peer spread = the same for the fastest peer")
    missing = next((r["openvino_status"] for r in rows
                    if str(r.get("openvino_status", "")).startswith("not installed")), None)
    if missing:
        lines.append(f"OpenVINO: {missing}")
    lines += _legend_tail(rows)
    return "\n".join(lines)
