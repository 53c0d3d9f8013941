"""Arrival events of a workload: when requests reach the scheduler (at t=0, as replacements of a
closed loop, or at timed arrivals), which of them are measured, and the front end they pass."""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from simulator.frontend import NONE as NO_FRONTEND
from simulator.workload import Workload

#: the seed stream of the front end's handling times (apart from arrival times' and lengths')
FRONTEND_STREAM = 2
#: client delays drawn at once (numpy's stream drawn in pieces is the stream drawn whole)
DELAY_BLOCK = 1024
#: share of a Poisson stream's first and last arrivals left out of the metrics (warm-up, drain)
STEADY_MARGIN = 0.1


def measured_span(w: Workload, total: int) -> tuple[float, float]:
    """(first, end): requests first..end-1 are measured, an event of them steady (see `Arrivals`): a burst's
    all, a benchmark's after its warm-up, a closed loop's but the first and last `concurrency`, a Poisson
    stream's but the first and last STEADY_MARGIN."""
    if w.arrival == "burst":
        return -math.inf, math.inf
    if w.measure == "all":  # a benchmark counts every request after its warm-up
        return w.warmup_requests, math.inf
    if w.arrival == "closed":
        return w.concurrency, total - w.concurrency
    margin = STEADY_MARGIN * total
    return margin, total - margin


class Arrivals:
    """Arrival events of a workload: the first requests at t=0, then replacements (closed loop) or
    timed arrivals (Poisson). Warm-up and drain are not measured: in a closed loop the first
    `concurrency` requests (a burst no steady system sees) and the last `concurrency` (sent while
    the loop drains); in a Poisson stream the first and last STEADY_MARGIN of the arrivals. With
    measure "all" every request is measured, as benchmark clients report.

    In a timed plan the client's requests pass the front end (`simulator.frontend`): request i is
    sent at `sent_ms[i]` and reaches the scheduler at `at[i]`; an event's time is its send time."""

    def __init__(self, w: Workload):
        self.w, self.total = w, w.prompts
        self.steps: list[int] = []
        self.sizes: list[int] = []
        self.ms: list[float] = []
        self.steady: list[bool] = []
        self.sent = 0  # requests handed to the scheduler
        self.frontend = w.frontend if w.frontend is not None and w.frontend.active else NO_FRONTEND
        self.waiting: list[tuple] = []  # timed: (send time, order made, prompt) not through the API server yet
        self.made = 0                   # timed: requests the client has made
        self.sent_ms: list[float] = []  # timed: send time of every request through the API server
        self.at: list[float] = []       # timed: when each reaches the scheduler
        self.free_ms = 0.0              # when the API server is free of the requests before
        self.streams = self.frontend.stream_us > 0  # timed: it spends time on every response chunk
        self.delivered: list[float] = []  # timed, streaming: when each step's chunks went out
        self.rng = None  # the client delays' seeded stream, made at the first delay (numpy.random costs ~10 ms to load)
        self.delays: list[float] = []  # client delays drawn ahead, in order (the stream drawn in pieces is the same)
        self.steady_from, self.steady_to = measured_span(w, self.total)
        if w.arrival == "poisson":
            self.create(w.arrival_times_ms())

    def add(self, count: int, step: int, ms: float = 0.0) -> int:
        """Record `count` arrivals at the end of `step`; returns the event index."""
        lo = self.sent
        self.sent = hi = lo + count
        self.steps.append(step)
        self.sizes.append(count)
        self.ms.append(ms)
        self.steady.append(lo >= self.steady_from and hi <= self.steady_to)
        return len(self.steps) - 1

    @property
    def created(self) -> int:
        """Requests the client has made: handed to the scheduler, or still on their way (timed)."""
        return self.made if self.made else self.sent

    def replacements(self, finished: int) -> int:
        """Closed loop: requests sent to replace `finished` ones (until all prompts are sent)."""
        return min(finished, self.total - self.created)

    def create(self, ready_ms) -> None:
        """Timed: the client may send requests at `ready_ms`; it sends each after its client delay,
        and the API server takes them in the order sent."""
        for t in np.asarray(ready_ms, dtype=np.float64).tolist():
            self._make(t)

    def create_at(self, ready_ms: float, count: int) -> None:
        """Timed: the client may send `count` requests at `ready_ms` (as `create` of that many times)."""
        kinds = self.w.kinds
        if kinds.kind_of is not None:
            for _ in range(count):
                self._make(ready_ms)
            return
        prompt, waiting, made = kinds.input[0], self.waiting, self.made
        for i in range(made, made + count):  # `_make` of one kind of request
            heapq.heappush(waiting, (ready_ms + self._delay(), i, prompt))
        self.made = made + count

    def _make(self, ready_ms: float) -> None:
        kinds = self.w.kinds
        prompt = kinds.input[0 if kinds.kind_of is None else kinds.kind_of[self.made]]
        heapq.heappush(self.waiting, (ready_ms + self._delay(), self.made, prompt))
        self.made += 1

    def _delay(self) -> float:
        """The next client delay of the workload's seeded stream, drawn DELAY_BLOCK at a time."""
        if not self.frontend.client_ms:
            return 0.0
        if not self.delays:
            if self.rng is None:
                self.rng = np.random.default_rng([self.w.seed, FRONTEND_STREAM])
            self.delays = self.frontend.client_delay(self.rng, DELAY_BLOCK).tolist()[::-1]
        return self.delays.pop()

    def _serve(self, until: float, before_chunks: bool = False) -> None:
        """The API server takes the requests sent by `until`, one at a time in send order (none sent
        later can come before them: the client sends only at or after the clock). Where it streams at a
        cost, response chunks go first: a request starts only once the chunks before it are out, and by
        `until` (before it, when a step's chunks arrive then); the rest wait for a later call."""
        waiting = self.waiting
        if not waiting or waiting[0][0] > until:
            return
        if not self.streams:
            self.free_ms = self._take(waiting, until, self.free_ms)
            return
        while waiting and waiting[0][0] <= until:
            start = max(waiting[0][0], self.free_ms)
            if start > until or (before_chunks and start == until):
                return
            self.free_ms = self._take(waiting, until, self.free_ms, most=1)

    def _take(self, waiting: list, until: float, free_ms: float, most: float = math.inf) -> float:
        """The server, free from `free_ms`, takes the requests sent by `until` in send order (at most `most`);
        returns when it is free again."""
        service, at, sent = self.frontend.service_ms, self.at, self.sent_ms
        taken = 0
        while taken < most and waiting and waiting[0][0] <= until:
            t, _, prompt = heapq.heappop(waiting)
            free_ms = max(t, free_ms) + service(prompt)
            at.append(free_ms)
            sent.append(t)
            taken += 1
        return free_ms

    def stream(self, end_ms: float, chunks: int) -> None:
        """Timed: a step ending at `end_ms` hands the API server `chunks` response chunks, which it sends
        once the request it may be taking is through, before any request still waiting (`delivered`:
        when the last has gone out). Asked only where the server streams at a cost (`streams`)."""
        self._serve(end_ms, before_chunks=True)
        self.free_ms = max(self.free_ms, end_ms) + chunks * self.frontend.stream_us * 1e-3
        self.delivered.append(self.free_ms)

    def tokens_at(self, end_ms: float) -> float:
        """Timed: when the client has the tokens of the last step, which ended at `end_ms`."""
        return (self.delivered[-1] if self.delivered else end_ms) + self.frontend.return_ms

    def delivered_ms(self) -> np.ndarray | None:
        """A timed plan's `step_delivered_ms`: when each step's chunks went out (None: at no cost)."""
        return np.array(self.delivered) if self.streams else None

    def due(self, seen: float, clock: float) -> list[float]:
        """Timed: send times of the requests that reached the scheduler by `seen`, not handed to it yet."""
        self._serve(clock)
        end = bisect.bisect_right(self.at, seen, lo=self.sent)
        return self.sent_ms[self.sent:end]

    def arrived(self, clock: float, idle: bool, last_start: float | None) -> tuple[float, list[float]]:
        """Timed: (the clock, send times of the requests the scheduler sees at a step starting then).
        An idle engine's clock jumps to the next arrival; with async lookahead the scheduler sees
        what had arrived when the last step (starting at `last_start`) began."""
        seen = clock
        if idle:
            clock = seen = max(clock, self.next_time())
        elif self.frontend.lookahead_steps and last_start is not None:
            seen = last_start
        return clock, self.due(seen, clock)

    def next_time(self) -> float | None:
        """Timed: when the next request reaches the scheduler, if nothing new is sent before it (the
        engine idle, or within a run that finishes nobody); None when none is on its way."""
        if self.sent < len(self.at):
            return self.at[self.sent]
        if not self.waiting:
            return None
        t, _, prompt = self.waiting[0]
        return max(t, self.free_ms) + self.frontend.service_ms(prompt)
