"""The CPU one side runs on: its computing threads, its communication thread, a CPU quota.

A ``Cpu`` is a fluid model of ``cores`` cores shared by
* the computing threads' tiles (any number at once): each running tile progresses at the same
  rate, at most one core, ``min(1, what is left / running tiles)``;
* one communication thread (the device's engine, the server's I/O thread): a FIFO of tasks,
  each some CPU seconds, run one at a time with priority over the tiles, at most one core.
  On the device that is the engine's nice 0 against its computing threads' nice 10 (CFS gives
  it about 90%, and it preempts them on wake-up); on the server, an I/O thread that sleeps most
  of the time preempts a computing thread when it wakes (CFS's sleeper credit). Strict priority
  is the approximation of both.

CPU demands are seconds of one full core (the profile's rates at the number of busy threads,
fixed when a tile starts); the model turns them into wall time.

A quota (a cgroup's ``cfs_quota_us / cfs_period_us``, in cores) caps the cores' total:
* ``period`` None: smoothly, at ``min(cores, quota)`` at every instant;
* ``period`` given (seconds): as the CFS bandwidth controller does, the group may use
  ``quota * period`` CPU seconds per period, at up to ``cores`` cores, and is throttled (nothing
  of it runs) from when that budget is spent until the next period boundary; unused budget does
  not carry over. With 25% of one core and a 4 ms period that is 1 ms of full speed, then 3 ms
  of nothing: a message that arrives while the device is throttled waits for the next period.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import math

_EPS = 1e-12


class Cpu:
    """See the module text. ``start_tile(demand, fn, *args)`` and ``run(cost, fn, *args)`` call
    ``fn(*args)`` at the simulated time the work is done."""

    def __init__(self, loop, cores: float, quota: float | None = None,
                 period: float | None = None, name: str = ""):
        if not cores > 0:
            raise ValueError(f"cores must be positive, got {cores!r}")
        if quota is not None and not quota > 0:
            raise ValueError(f"quota must be positive, got {quota!r}")
        if period is not None and not (period > 0 and quota is not None):
            raise ValueError("a period needs a quota and must be positive")
        self.loop = loop
        self.name = name
        self.cores = float(cores)
        self.quota = None if quota is None else float(quota)
        self.period = None if period is None else float(period)
        self.budget = None if period is None else self.quota * self.period
        self.t = 0.0                # time the state below holds for
        self.v = 0.0                # the tiles' virtual time: full-core seconds of one tile
        self._tiles: list = []      # (v_end, seq, fn, args)
        self._tasks: collections.deque = collections.deque()  # [remaining, fn, args]
        self._seq = itertools.count()
        self._k = 0                 # period index
        self._used = 0.0            # budget used in period _k
        self._version = 0
        self._r = self._e = 0.0     # current rates: per tile, communication thread
        self.engine_busy_s = 0.0    # CPU seconds the communication thread ran
        self.tile_cpu_s = 0.0       # CPU seconds the tiles got
        self.throttled_s = 0.0      # wall seconds the group was throttled with work waiting

    # ------------------------------------------------------------------ interface

    @property
    def running(self) -> int:
        return len(self._tiles)

    @property
    def engine_queue(self) -> int:
        return len(self._tasks)

    def start_tile(self, demand: float, fn, *args) -> None:
        self._settle(self.loop.now)
        heapq.heappush(self._tiles, (self.v + max(0.0, demand), next(self._seq), fn, args))
        self._rates()
        self._schedule()

    def run(self, cost: float, fn, *args) -> None:
        """A task of ``cost`` CPU seconds for the communication thread, after those queued."""
        self._settle(self.loop.now)
        self._tasks.append([max(0.0, float(cost)), fn, args])
        self._rates()
        self._schedule()

    # ------------------------------------------------------------------ the fluid model

    def _throttled(self) -> bool:
        return self.budget is not None and self._used >= self.budget - _EPS

    def _capacity(self) -> float:
        if self.quota is None:
            return self.cores
        if self.period is None:
            return min(self.cores, self.quota)
        return 0.0 if self._throttled() else self.cores

    def _rates(self) -> None:
        cap = self._capacity()
        self._e = min(1.0, cap) if self._tasks else 0.0
        n = len(self._tiles)
        self._r = min(1.0, (cap - self._e) / n) if n else 0.0

    def _settle(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            r, e = self._r, self._e
            if r:
                self.v += r * dt
                self.tile_cpu_s += r * dt * len(self._tiles)
            if e and self._tasks:
                self._tasks[0][0] -= e * dt
                self.engine_busy_s += e * dt
            if self.budget is not None:
                if (self._tiles or self._tasks) and not (r or e):
                    self.throttled_s += dt
                self._used += (e + r * len(self._tiles)) * dt
            self.t = t
        if self.period is not None:
            k = int(math.floor(t / self.period + 1e-9))
            if k > self._k:
                self._k, self._used = k, 0.0
        self._rates()

    def _schedule(self) -> None:
        self._version += 1
        t = self.t
        nxt = math.inf
        if self._tiles and self._r > 0:
            nxt = t + max(0.0, self._tiles[0][0] - self.v) / self._r
        if self._tasks and self._e > 0:
            nxt = min(nxt, t + max(0.0, self._tasks[0][0]) / self._e)
        if self.period is not None and (self._tiles or self._tasks):
            end = (self._k + 1) * self.period
            if self._throttled():
                nxt = min(nxt, end)
            else:
                use = self._e + self._r * len(self._tiles)
                if use > 0:
                    nxt = min(nxt, t + (self.budget - self._used) / use, end)
        if nxt < math.inf:
            self.loop.at(max(nxt, t), self._tick, self._version)

    def _tick(self, version: int) -> None:
        if version != self._version:
            return
        now = self.loop.now
        self._settle(now)
        if self.period is not None and self._throttled() and now >= (self._k + 1) * self.period - 1e-9:
            self._k, self._used = self._k + 1, 0.0  # the boundary this tick was for
            self._rates()
        done_tasks = []
        while self._tasks and self._tasks[0][0] <= _EPS * max(1.0, self.engine_busy_s):
            _, fn, args = self._tasks.popleft()
            done_tasks.append((fn, args))
        done_tiles = []
        tol = _EPS * max(1.0, self.v)
        while self._tiles and self._tiles[0][0] <= self.v + tol:
            _, _, fn, args = heapq.heappop(self._tiles)
            done_tiles.append((fn, args))
        self._rates()
        self._schedule()
        for fn, args in done_tasks:
            fn(*args)
        for fn, args in done_tiles:
            fn(*args)
