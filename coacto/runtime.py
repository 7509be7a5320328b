"""Runtime: local inference on the native tile runtime (coacto.native), in coacto's API and in
onnxruntime's (get_inputs, get_outputs, run(output_names, feeds))."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import overload

import numpy as np

from . import ir
from .errors import CoactoError, InputError
from .inference import NativeInference
from .native import NativeRuntime, native_graph
# Re-exported, not used here: experiments, fuzzers and users' scripts import the C boundary's
# names from coacto.runtime.
from .native import NativeGraph, check, ffi, gemm_kernel_name, lib, read_tile_trace  # noqa: F401
from .reference import check_integer_input
from .tilegraph import TileGraph

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- onnxruntime's API

#: ONNX element type -> onnxruntime's type string, for the element types coacto's inputs take
#: and its integer-valued outputs are returned as.
_ORT_TYPES = {1: "tensor(float)", 2: "tensor(uint8)", 3: "tensor(int8)", 4: "tensor(uint16)",
              5: "tensor(int16)", 6: "tensor(int32)", 7: "tensor(int64)", 9: "tensor(bool)",
              12: "tensor(uint32)", 10: "tensor(float16)", 11: "tensor(double)"}


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime's ``InferenceSession.get_inputs()`` describes it:
    ``name``, ``shape`` (a list of ints; a compiled graph's shapes are all fixed, so where
    onnxruntime shows a symbolic dimension such as ``"batch"`` this holds the compiled size) and
    ``type`` (onnxruntime's string: ``"tensor(float)"``, or ``"tensor(int64)"`` and the like for
    token ids and masks). ``dtype`` is the same type as numpy's, to build feeds with."""

    name: str
    shape: list
    type: str

    @property
    def dtype(self) -> np.dtype:
        element = self.type[len("tensor("):-1]
        return np.dtype({"float": "float32"}.get(element, element))


def graph_inputs(tg: TileGraph) -> list[NodeArg]:
    """The inputs of a tile graph in the ONNX model's order, as NodeArgs."""
    g = tg.graph
    return [NodeArg(name, [int(d) for d in g.layers[li].onnx_shape],
                    _ORT_TYPES[int(g.layers[li].attrs.get("dtype", 1))])
            for name, li in g.inputs.items()]


def graph_outputs(tg: TileGraph) -> list[NodeArg]:
    """The outputs of a tile graph in the ONNX model's order, as NodeArgs."""
    g = tg.graph
    return [NodeArg(name, [int(d) for d in g.layers[li].onnx_shape],
                    _ORT_TYPES[int(g.output_dtypes.get(name, 1))])
            for name, li in g.outputs.items()]


def output_selection(tg: TileGraph, output_names) -> list[str]:
    """onnxruntime's ``output_names`` checked against the graph: None (or an empty list, as
    onnxruntime reads it) means every output in the model's order."""
    known = list(tg.graph.outputs)
    if output_names is None or (isinstance(output_names, (list, tuple)) and not output_names):
        return known
    if isinstance(output_names, str) or not isinstance(output_names, (list, tuple)) or \
            not all(isinstance(n, str) for n in output_names):
        raise InputError(f"output_names must be a list of output names or None (every output), "
                         f"got {output_names!r}; the model's outputs are {known}")
    unknown = [n for n in output_names if n not in tg.graph.outputs]
    if unknown:
        raise InputError(f"unknown output name(s) {unknown}; the model's outputs are {known}")
    return list(output_names)


def select_outputs(outputs: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    """The arrays of ``names`` in that order; a name asked for twice gets its own copy."""
    seen: set[str] = set()
    out = []
    for name in names:
        out.append(outputs[name].copy() if name in seen else outputs[name])
        seen.add(name)
    return out


class _FeedsOnly:
    """The default of Runtime.run's first parameter: run(feeds=...) is the dict form."""

    def __repr__(self) -> str:
        return "<feeds only>"


_FEEDS_ONLY = _FeedsOnly()


# ---------------------------------------------------------------------------- Runtime

def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


#: at most this many warm-up inferences (Runtime(warmup=True) with several threads)
WARMUP_RUNS_MAX = 4
#: with several threads, the warm-up makes this many times the arena it reached resident
ARENA_SLACK = 2.0


def _minor_faults() -> int | None:
    """This process's minor page faults so far (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Runtime:
    """Runs a TileGraph on the native tile runtime.

    ``threads`` computing threads (default: the CPUs this process may use); pass ``share=other``
    to run on another Runtime's threads and ready pool (several models, one pool). ``run`` may be
    called from several Python threads at once: each call is one inference in flight. As in
    onnxruntime, ``get_inputs()`` / ``get_outputs()`` describe the model and
    ``run(output_names, feeds)`` returns a list; ``run(feeds)`` returns a dict.

    ``cancel()`` (from any thread, or a signal handler) stops the runs in flight: each raises
    InferenceCancelled. Ctrl-C during ``run`` on the main thread stops the native work too and
    raises KeyboardInterrupt. Either way the work stops within milliseconds (a long tile stops at
    its next piece of about 128 MFLOP) and the Runtime is ready for the next run.

    ``warmup`` (default True): the Runtime runs an inference on example inputs when it is made
    (with several threads, up to WARMUP_RUNS_MAX while one maps new memory, and then
    ARENA_SLACK times the activation memory it reached is made resident: memory a later run's
    buffers may reach, held from the start),
    so that the first ``run`` is at the steady speed rather than paying for what a first
    inference touches first (activation buffers and scratch mapped and faulted in, the weights of
    a loaded ``.ctg`` read from its file, the threads' stacks): as onnxruntime prepares a session
    before its first run. ``warmup=False`` makes the Runtime at once.
    """

    def __init__(self, graph: TileGraph, threads: int | None = None, share: "Runtime | None" = None,
                 warmup: bool = True):
        if not isinstance(graph, TileGraph):
            raise CoactoError("Runtime needs a TileGraph: use coacto.compile('model.onnx') or "
                              "coacto.load('model.ctg')")
        self.graph = graph
        if share is not None:
            self._rt = share._rt
        else:
            if threads is None:
                threads = default_threads()
            if not isinstance(threads, int) or threads < 1 or threads > 1024:
                raise CoactoError(f"threads must be an integer from 1 to 1024, got {threads!r}")
            self._rt = NativeRuntime(threads)
        self._threads = self._rt.threads
        self._native = native_graph(graph)
        # reentrant: cancel() may run in a signal handler on a thread that holds it in run()
        self._lock = threading.RLock()
        self._running: set = set()  # the NativeInferences of the runs in flight
        self._active = 0
        self._closed = False
        self.last_stats: dict = {}
        if warmup:
            try:
                feeds = graph.example_feeds()
                # With several threads, which buffers are live together, and where the arena
                # places them, depends on how the threads meet the tiles: a second inference
                # can still map memory the first did not (MobileNetV2 at 2 threads: 950-1250
                # pages, 7 ms against 2.8), so warm-up runs go on while one faults in pages.
                for _ in range(WARMUP_RUNS_MAX if self._threads > 1 else 1):
                    before = _minor_faults()
                    self._run(feeds, None)
                    if before is None or _minor_faults() == before:
                        break
                if self._threads > 1:
                    # A later inference can still reach further: MobileNetV2 at 2 threads
                    # placed its buffers in 12-18 MiB across runs, up to 1.38x what the warm-up
                    # had reached, and faulted in 700-1200 pages while it ran (up to 2x its
                    # time). Twice that is made resident now: half again was not enough when
                    # another process held the other CPU through the warm-up (its runs, mostly on
                    # one thread, reached 5.5 MiB, and the first run on two 9.7).
                    _, touched = self._native.arena_bytes()
                    self._native.arena_prefault(int(touched * ARENA_SLACK))
            except CoactoError as e:  # synthetic inputs a model refuses: the first run warms up
                log.debug("warm-up inference skipped: %s", e)
            self.last_stats = {}

    @property
    def threads(self) -> int:
        return self._threads

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cancel(self) -> int:
        """Stops every run of this Runtime in flight now (each raises InferenceCancelled) and
        returns how many. Safe from any thread and from a signal handler; it does not wait. A
        run that starts afterwards is not affected."""
        with self._lock:  # no logging here: a signal handler may interrupt a log call
            running = list(self._running)
            for inf in running:
                inf.cancel()
        return len(running)

    def close(self) -> None:
        """Releases this Runtime: its threads stop once no other Runtime shares them and no
        inference is still running on them."""
        self._closed = True
        self._rt = None

    def _check_feeds(self, feeds) -> dict[int, np.ndarray]:
        if not isinstance(feeds, dict):
            raise InputError("run() takes a dict {input_name: numpy array}; the model's inputs are "
                             + _describe(self.graph))
        expected = self.graph.inputs
        unknown = [k for k in feeds if k not in expected]
        missing = [k for k in expected if k not in feeds]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown input(s) {unknown}")
            if missing:
                parts.append(f"missing input(s) {missing}")
            raise InputError("; ".join(parts) + "; the model's inputs are " + _describe(self.graph))
        out = {}
        for name, value in feeds.items():
            arr = value if isinstance(value, np.ndarray) else None
            if arr is None:
                raise InputError(f"input {name!r} must be a numpy array, got {type(value).__name__}")
            layer = self.graph.graph.layers[self.graph.graph.inputs[name]]
            if ir.integer_input(layer):
                if tuple(arr.shape) != tuple(expected[name]):
                    raise InputError(f"input {name!r} has shape {tuple(arr.shape)}, the model "
                                     f"takes {tuple(expected[name])}")
                check_integer_input(name, layer, arr)
                out[self.graph.graph.inputs[name]] = arr
                continue
            takes = np.dtype(ir.FLOAT_NUMPY_TYPES.get(layer.attrs.get("dtype"), np.float32))
            if arr.dtype != takes:
                raise InputError(f"input {name!r} has dtype {arr.dtype}, the model takes {takes}; "
                                 f"convert it with x.astype(np.{takes})")
            if tuple(arr.shape) != tuple(expected[name]):
                raise InputError(f"input {name!r} has shape {tuple(arr.shape)}, the model takes "
                                 f"{tuple(expected[name])}; reshape the data or compile the model "
                                 f"with input_shapes={{{name!r}: {tuple(arr.shape)}}}")
            out[self.graph.graph.inputs[name]] = arr
        return out

    def profile(self, feeds: dict, runs: int = 10) -> list[dict]:
        """Runs `runs` inferences with per-layer timing and returns one row per layer: name, op,
        output shape, tiles, FLOPs, mean busy seconds per inference (summed over threads), the
        layer's share of the total, and whether it computes a 1x1 convolution of its input as
        its prologue (graphs for a local Runtime: coacto.compile with threads). Shows where the
        time goes."""
        from .partition import layer_flops

        self._native.set_profiling(True)
        try:
            for _ in range(max(1, runs)):
                self.run(feeds)
            secs = self._native.layer_seconds() / max(1, runs)
        finally:
            self._native.set_profiling(False)
        g, plan = self.graph.graph, self.graph.plan
        total = float(secs.sum()) or 1.0
        return [{"layer": li, "name": layer.name, "op": layer.op, "shape": list(layer.shape),
                 "tiles": int(plan.layer_first_tile[li + 1] - plan.layer_first_tile[li]),
                 "flops": layer_flops(g, li), "seconds": float(secs[li]),
                 "share": float(secs[li]) / total, "prologue": bool(layer.attrs.get("pre"))}
                for li, layer in enumerate(g.layers)]

    def trace(self, feeds: dict, runs: int = 5) -> dict:
        """Runs `runs` inferences with tile timing and returns the timeline of the fastest:
        `events` (one per computed tile: worker, start and duration in microseconds from the
        inference's first tile, layer, op, tile bounds), `wall_us`, `busy_us` per worker, and
        `waits`: where idle workers waited longest, per layer whose tile ended the wait. The
        events load into chrome://tracing or Perfetto via `chrome_trace`."""
        self._native.set_profiling(True)
        best = None
        try:
            for _ in range(max(1, runs)):
                self.run(feeds)
                t0, t1, worker = self._native.tile_trace()
                done = worker >= 0
                if not done.any():
                    continue
                wall = float(t1[done].max() - t0[done].min())
                if best is None or wall < best[0]:
                    best = (wall, t0.copy(), t1.copy(), worker.copy())
        finally:
            self._native.set_profiling(False)
        if best is None:
            raise CoactoError("no tile was computed on this runtime; nothing to trace")
        wall, t0, t1, worker = best
        g, plan = self.graph.graph, self.graph.plan
        base = float(t0[worker >= 0].min())
        events, busy, waits = [], [0.0] * self.threads, {}
        for w in range(self.threads):
            tiles = np.flatnonzero(worker == w)
            tiles = tiles[np.argsort(t0[tiles])]
            prev_end = base
            for t in tiles:
                li = int(plan.tile_layer[t])
                start, dur = (t0[t] - base) * 1e6, (t1[t] - t0[t]) * 1e6
                gap = (t0[t] - prev_end) * 1e6
                if gap > 0:
                    waits[li] = waits.get(li, 0.0) + gap
                prev_end = t1[t]
                busy[w] += dur
                layer = g.layers[li]
                events.append({"worker": w, "start_us": start, "dur_us": dur, "layer": layer.name,
                               "op": layer.op, "tile": int(t),
                               "bounds": [int(v) for v in plan.tile_bounds[t]]})
            end_gap = (base + wall - prev_end) * 1e6
            if end_gap > 0:
                waits[-1] = waits.get(-1, 0.0) + end_gap
        events.sort(key=lambda e: e["start_us"])
        wait_rows = sorted(({"layer": g.layers[li].name if li >= 0 else "(end of inference)",
                             "op": g.layers[li].op if li >= 0 else "", "idle_us": us}
                            for li, us in waits.items()), key=lambda r: -r["idle_us"])
        return {"wall_us": wall * 1e6, "threads": self.threads, "runs": max(1, runs),
                "busy_us": busy, "events": events, "waits": wait_rows}

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs (name, shape, type), as onnxruntime's InferenceSession has them."""
        return graph_inputs(self.graph)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs (name, shape, type), as onnxruntime's InferenceSession has them."""
        return graph_outputs(self.graph)

    @overload
    def run(self, feeds: dict, timeout: float | None = None) -> dict[str, np.ndarray]: ...

    @overload
    def run(self, output_names: list[str] | None, feeds: dict,
            timeout: float | None = None) -> list[np.ndarray]: ...

    def run(self, output_names=_FEEDS_ONLY, feeds=None, timeout=None):
        """One inference, in either of two forms (told apart by the first argument's type):

        ``run(feeds)`` -> {output name: array}: {input name: array} in, ONNX names and shapes.
        ``run(output_names, feeds)`` -> [array, ...]: onnxruntime's form, the arrays in the
        order of ``output_names`` (None: every output in the model's order); an unknown name
        raises InputError before anything runs.

        ``timeout``: seconds before the run stops with InferenceTimeout (None: no limit)."""
        if output_names is _FEEDS_ONLY:  # run(feeds=...)
            return self._run(feeds, timeout)
        if isinstance(output_names, dict):  # run(feeds) or run(feeds, timeout)
            if feeds is not None:
                if timeout is not None or not isinstance(feeds, (int, float)):
                    raise InputError("run() takes run(feeds) or run(output_names, feeds), with "
                                     "output_names a list of names or None; got a dict, then "
                                     f"{type(feeds).__name__}")
                timeout = feeds
            return self._run(output_names, timeout)
        names = output_selection(self.graph, output_names)
        return select_outputs(self._run(feeds, timeout), names)

    def _run(self, feeds: dict, timeout: float | None) -> dict[str, np.ndarray]:
        if self._closed:
            raise CoactoError("this Runtime is closed; create a new one")
        rt = self._rt  # held for the whole inference, even if close() runs meanwhile
        if rt is None:
            raise CoactoError("this Runtime is closed; create a new one")
        self._check_feeds(feeds)
        rt.heads_up()
        with NativeInference(rt, self.graph) as inf:
            inf.set_inplace()  # every tile is computed here
            with self._lock:
                self._running.add(inf)
            try:
                inf.set_inputs(feeds)
                inf.wait(timeout)
                outputs = inf.outputs()
                self.last_stats = inf.stats()
            except BaseException:
                # Ctrl-C, a timeout, a cancel: the computing threads drop this inference's work
                # now; leaving the block then waits only for the piece each thread is in
                inf.cancel()
                raise
            finally:
                with self._lock:
                    self._running.discard(inf)
        return outputs


def chrome_trace(trace: dict) -> dict:
    """A Runtime.trace timeline in the Trace Event format (chrome://tracing, Perfetto)."""
    events = [{"name": e["layer"], "cat": e["op"], "ph": "X", "pid": 0, "tid": e["worker"],
               "ts": e["start_us"], "dur": e["dur_us"],
               "args": {"tile": e["tile"], "bounds": e["bounds"]}} for e in trace["events"]]
    events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": w,
                "args": {"name": f"worker {w}"}} for w in range(trace["threads"])]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _describe(tg: TileGraph) -> str:
    return ", ".join(f"{a.name!r} {tuple(a.shape)} {a.dtype}" for a in graph_inputs(tg))
