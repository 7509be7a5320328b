"""The discrete-event core: a clock and a heap of callbacks."""
from __future__ import annotations

import heapq
import itertools


class EventLoop:
    """Callbacks at simulated times (seconds); equal times run in the order they were scheduled,
    so what a handler causes at the same instant comes after what was already due."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn, *args) -> None:
        if t != t:  # NaN: unordered, it would break the heap's order for every later event
            raise ValueError(f"an event at time NaN ({getattr(fn, '__name__', fn)})")
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def run(self, until: float = float("inf"), stop=None) -> None:
        """Runs events up to ``until`` or until ``stop()`` is true after an event."""
        heap = self._heap
        while heap:
            t, _, fn, args = heap[0]
            if t > until:
                break
            heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if stop is not None and stop():
                break
