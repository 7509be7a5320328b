"""The native runtime as the simulator sees it: computing threads, the ready pool and the per-tile
state of each inference (native/src/runtime.c, offload.c).

What is kept from runtime.c:
- a tile becomes ready when its last parent completes, exactly once, by whoever completes it
  (a computing thread, the input being set, or a tile arriving from the network);
- a thread that completes a tile continues depth-first with one child that became ready and
  pushes the others to the ready pool; an idle thread pops the pool, shallowest depth bucket
  first, first in first out within a bucket (inferences of all tenants share the pool);
- a tile that arrives from outside while ready or waiting completes it and the thread's copy is
  dropped; a tile that arrives while a thread computes it is dropped (the thread's copy wins);
- tiles the plan does not let this side compute are parked until ``compute_all``;
- a cancelled inference's running tiles finish (a kernel is not interruptible), its queued ones
  are dropped when popped.

A tile's duration comes from a Durations table at the number of threads busy when it starts,
itself included: a profile's per-thread rate at that many threads (clocks, caches and memory
shared by busy cores; idle threads sleep) and a CPU quota shared by the busy threads.

Approximations: the pool is one set of depth buckets, not one row per thread with stealing (any
idle thread takes the shallowest ready tile; in runtime.c it prefers its own row); the
depth-first child is the first child that became ready (runtime.c prefers one whose main input
this thread computed); idle threads start at once (no spin or wake-up latency); a tile keeps the
rate it started with when other threads start or stop meanwhile.
"""
from __future__ import annotations

import collections

import numpy as np

from .graph import POOL_DEPTH_BUCKETS, SimGraph
from .profiles import op_class

NOT_READY, READY, RUNNING, COMPLETED = range(4)


class TileState:
    """One inference's tiles on one side (a coacto_inference): what is ready, running, done,
    and a trace of every tile computed here (start, end, worker)."""

    def __init__(self, cores: "Cores", g: SimGraph, local=None, on_local_complete=None,
                 on_done=None, on_output=None, tag=None, scale: float = 1.0):
        self.cores = cores
        self.g = g
        self.tag = tag
        # this inference's tiles take `scale` times their table's durations: a device's local
        # work runs on its local graph (coacto.sim.device, local_speedup)
        self.scale = float(scale)
        self.parents_left = list(g.n_parents)
        self.state = [NOT_READY] * g.n
        self.local = None if local is None else [bool(v) for v in local]
        self.compute_all_flag = False
        self.rest_last = False  # compute_all(rest_last=True): coacto_inference_compute_rest
        self.cancelled = False
        self.started = False
        self.on_local_complete = on_local_complete  # (tile, t): the send decision hook
        self.on_done = on_done                      # (t): every output tile is complete
        self.on_output = on_output                  # (tile, t): an output tile completed
        self.outputs_left = len(g.outputs)
        self.computed = 0
        self.external = 0
        self.dropped = 0
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.t0: dict[int, float] = {}
        self.t1: dict[int, float] = {}
        self.worker: dict[int, int] = {}

    def is_local(self, t: int) -> bool:
        return self.local is None or self.local[t] or self.compute_all_flag

    def _mark_started(self, now: float) -> None:
        if self.started:
            return
        self.started = True
        self.t_start = now
        for t in self.g.sources:
            if self.state[t] == NOT_READY:
                self.state[t] = READY
                if self.is_local(t):
                    self.cores.push(self, t)

    def complete(self, tile: int, now: float, local: bool, want_next: bool = False) -> int:
        """Completes ``tile`` (complete_tile in runtime.c); returns the child to continue with
        depth-first, or -1."""
        if local and self.on_local_complete is not None:
            self.on_local_complete(tile, now)
        self.state[tile] = COMPLETED
        nxt = -1
        state, left = self.state, self.parents_left
        for c in self.g.children[tile]:
            left[c] -= 1
            if left[c] or state[c] != NOT_READY:
                continue
            state[c] = READY
            if not self.is_local(c):
                continue  # parked
            if want_next and nxt < 0 and not (self.rest_last and self.local is not None
                                               and not self.local[c] and self.local[tile]):
                nxt = c
            else:
                self.cores.push(self, c)
        if self.g.is_output_list[tile]:
            if self.on_output is not None:
                self.on_output(tile, now)
            self.outputs_left -= 1
            if self.outputs_left == 0 and self.t_end is None:
                self.t_end = now
                if self.on_done is not None:
                    self.on_done(now)
        return nxt

    def set_inputs(self, now: float) -> None:
        """Completes the input tiles in order (set_input); their children go to the pool."""
        self._mark_started(now)
        for t in self.g.inputs:
            if self.state[t] in (NOT_READY, READY):
                self.state[t] = RUNNING
                self.complete(t, now, local=True)
        self.cores.dispatch(now)

    def put_tile(self, tile: int, now: float) -> bool:
        """A tile from outside; False when it lost the race (computed or being computed here)."""
        if self.cancelled:
            return False
        self._mark_started(now)
        if self.state[tile] in (NOT_READY, READY):
            self.state[tile] = RUNNING
            self.external += 1
            self.complete(tile, now, local=False)
            return True
        self.dropped += 1
        return False

    def compute_all(self, now: float, rest_last: bool = False) -> None:
        """Every remaining tile may be computed here; parked ready tiles are scheduled
        (``rest_last``: after the plan's own, coacto_inference_compute_rest)."""
        self.rest_last = bool(rest_last)  # (a plain one after a rest_last one: no order left)
        if self.compute_all_flag:
            return
        self.compute_all_flag = True
        if self.local is not None:
            for t in range(self.g.n):
                if self.state[t] == READY and not self.local[t]:
                    self.cores.push(self, t)
        self.cores.dispatch(now)

    def cancel(self) -> None:
        self.cancelled = True


class Durations:
    """Seconds per tile on one thread when ``busy`` threads of this side compute (see the module
    text); a table per busy count, made when first needed."""

    def __init__(self, g: SimGraph, profile, overhead_s: float | None = None,
                 quota: float | None = None, scale: float = 1.0):
        self.g, self.profile = g, profile
        self.overhead = profile.tile_overhead_s if overhead_s is None else overhead_s
        self.quota = quota
        self.scale = float(scale)  # a slowdown measured inside a quota (coacto.sim.quota)
        self._tables: dict[int, list[float]] = {}
        # this very graph measured by `coacto profile`: its layers' times, not class averages
        self.layers = profile.layer_seconds(g.tg.graph_id, g.tg.n_layers) \
            if hasattr(profile, "layer_seconds") else None

    def speed(self, busy: int) -> float:
        """The share of a core each of ``busy`` threads gets (a cgroup quota in cores), over the
        measured slowdown."""
        return (1.0 if self.quota is None else min(1.0, self.quota / busy)) / self.scale

    def get(self, busy: int) -> list[float]:
        table = self._tables.get(busy)
        if table is None:
            if self.layers:
                table = self._tables[busy] = self.g.durations_from_layers(
                    self._layer_secs(busy), self.overhead, self.speed(busy))
            else:
                table = self._tables[busy] = self.g.durations(self.profile.thread_flops(busy),
                                                              self.overhead, self.speed(busy))
        return table

    def _layer_secs(self, busy: int):
        """Per-layer seconds at ``busy`` threads: measured, or the nearest measured count's
        scaled by the class rates per thread (the profile's thread scaling)."""
        if busy in self.layers:
            return self.layers[busy]
        near = min(self.layers, key=lambda t: (abs(t - busy), t))
        ratio = self.profile.thread_flops(near) / self.profile.thread_flops(busy)  # per class
        cls = np.array([op_class(self.g.tg.graph, li) for li in range(self.g.tg.n_layers)])
        return self.layers[near] * ratio[cls]


class Cores:
    """The computing threads of one runtime (a device's, or the server's shared by all tenants).

    Without a ``cpu`` a tile takes its Durations time from when it starts; with one
    (coacto.sim.cpu.Cpu) that time is its CPU demand and the Cpu decides when it is done (the
    communication thread's work and a quota's throttling delay it)."""

    def __init__(self, loop, n_workers: int, durations: Durations, name: str = "", cpu=None):
        self.loop = loop
        self.name = name
        self.n = int(n_workers)
        self.durations = durations
        self.cpu = cpu
        self.idle = list(range(self.n - 1, -1, -1))  # pop() gives the lowest index
        self.pool = [collections.deque() for _ in range(POOL_DEPTH_BUCKETS + 1)]  # + the rest
        self.pending = 0
        self.busy_s = 0.0

    def push(self, inf: TileState, tile: int) -> None:
        # runtime.c pool_push: a rest that comes last goes to the queue after the depth buckets
        rest = inf.rest_last and inf.local is not None and not inf.local[tile]
        self.pool[POOL_DEPTH_BUCKETS if rest else inf.g.bucket[tile]].append((inf, tile))
        self.pending += 1

    def _pop(self):
        for q in self.pool:
            while q:
                inf, tile = q.popleft()
                self.pending -= 1
                if not inf.cancelled and inf.state[tile] == READY:
                    return inf, tile
        return None

    def dispatch(self, now: float) -> None:
        """Idle threads take ready tiles; those starting together share the busy count."""
        starts = []
        while len(starts) < len(self.idle) and self.pending:
            item = self._pop()
            if item is None:
                break
            starts.append(item)
        if not starts:
            return
        busy = self.n - len(self.idle) + len(starts)
        for inf, tile in starts:
            self._start(self.idle.pop(), inf, tile, now, busy)

    def _start(self, w: int, inf: TileState, tile: int, now: float, busy: int) -> None:
        inf.state[tile] = RUNNING
        if self.cpu is not None:
            inf.t0[tile], inf.worker[tile] = now, w
            self.cpu.start_tile(self.durations.get(busy)[tile] * inf.scale, self._finish_cpu, w,
                                inf, tile)
            return
        end = now + self.durations.get(busy)[tile] * inf.scale
        inf.t0[tile], inf.t1[tile], inf.worker[tile] = now, end, w
        self.busy_s += end - now
        self.loop.at(end, self._finish, w, inf, tile)

    def _finish_cpu(self, w: int, inf: TileState, tile: int) -> None:
        now = self.loop.now
        inf.t1[tile] = now
        self.busy_s += now - inf.t0[tile]
        self._finish(w, inf, tile)

    def _finish(self, w: int, inf: TileState, tile: int) -> None:
        now = self.loop.now
        inf.computed += 1
        nxt = inf.complete(tile, now, local=True, want_next=True)
        if nxt >= 0 and not inf.cancelled and inf.state[nxt] == READY:
            self._start(w, inf, nxt, now, self.n - len(self.idle))
        else:  # no child, or the inference was cancelled meanwhile: the chain ends here
            self.idle.append(w)
            self.idle.sort(reverse=True)
        self.dispatch(now)
