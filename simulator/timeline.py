"""The chunked-prefill timeline on request groups, phase one: plan the schedule without latencies.

Decisions depend only on counts, so the whole schedule is planned first. The plan names every
distinct step shape; pricing them is ONE batched call (`simulator.pricing`), and `replay` turns
the prices into times. A group is `count` identical requests: in the prefill FIFO `(count, done)`,
in decode `[count, end_tick, first_step]`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from latency.keys import StepShapes
from simulator.frontend import NONE as NO_FRONTEND
from simulator.scheduler import DecodeFirstWithSlack, QueueView, Scheduler, chunks_before_last
from simulator.shapebook import ShapeBook
from simulator.workload import Workload

#: The decode key's context is the decoding requests' mean context rounded up to this many tokens,
#: so nearby steps share one key (and one cache entry).
DECODE_CONTEXT_ROUND = 128
#: float slack when rounding a mean context up: a mean a hair above a multiple stays on it
CONTEXT_EPS = 1e-9
PHASES = ("both", "prefill", "decode")
#: the seed stream of the front end's handling times (apart from arrival times' and lengths')
FRONTEND_STREAM = 2
#: share of a Poisson stream's first and last arrivals left out of the metrics (warm-up, drain)
STEADY_MARGIN = 0.1
DECODE_CONTEXTS = ("mean", "mid")
#: the tail is computed at once from this many decode groups on; fewer finish in fewer steps than
#: its numpy calls cost
TAIL_GROUPS = 8


@dataclass(frozen=True)
class Plan:
    """A planned schedule: step i has shape `shapes[step_shape[i]]`; finish records say that
    `counts[j]` requests of arrival event `arrival[j]` and kind `kind[j]` (`workload.kinds`) got their
    first token at the end of step `first_step[j]` (-1: at t=0) and finished at the end of step
    `finish_step[j]`.

    Arrival event e came at the end of step `event_step[e]` (-1: at t=0) or, in a timed plan
    (Poisson), at `event_ms[e]`; `event_steady[e]` says whether its requests are measured (not
    warm-up or drain). A timed plan was priced while planned: `step_end_ms` holds its clock."""

    workload: Workload
    scheduler: Scheduler
    phase: str
    shapes: StepShapes
    step_shape: np.ndarray
    counts: np.ndarray
    first_step: np.ndarray
    finish_step: np.ndarray
    peak_kv_tokens: float
    arrival: np.ndarray
    event_step: np.ndarray
    event_steady: np.ndarray
    step_decode: np.ndarray
    kind: np.ndarray
    event_ms: np.ndarray | None = None
    step_end_ms: np.ndarray | None = None
    token_delay_ms: float = 0.0  # a token reaches the client this long after its step ends (front end)
    preemptions: int = 0  # KV-bound plans: running requests preempted (freed, recomputed later)
    kv_blocks: int = 0    # KV-bound plans: the pool they were admitted to (blocks of 16 tokens); 0: unbounded

    @property
    def num_steps(self) -> int:
        return len(self.step_shape)

    @cached_property
    def entry_index(self) -> tuple:
        """((shape, key) of every prefill entry, (shape, key) of every decode entry): positions in
        `shapes` and `price_keys`, in shape order, for pricing the steps of an unfused policy."""
        position = {key: i for i, key in enumerate(self.price_keys)}
        prefill: tuple[list[int], list[int]] = ([], [])
        decode: tuple[list[int], list[int]] = ([], [])
        for s, shape in enumerate(self.shapes):
            for key in shape:
                side = decode if key.is_decode else prefill
                side[0].append(s)
                side[1].append(position[key])
        return tuple((np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)) for a, b in (prefill, decode))

    @cached_property
    def price_keys(self) -> tuple:
        """What must be priced: whole shapes for a fused policy, else the distinct ForwardKeys
        (in order of first use)."""
        if self.scheduler.fused:
            return self.shapes
        return tuple(dict.fromkeys(key for shape in self.shapes for key in shape))


class _DecodePool:
    """Requests past their first token, in the order they joined (the oldest decode first, so only
    newer groups are delayed when not all fit). All ready requests usually decode together, so a
    global tick counter replaces per-group countdowns; a group finishes when the ticks reach its
    end. With one kind of request the groups are also ordered by end tick, and finishing pops the
    front; a mix keeps `next_end` and scans when it comes."""

    def __init__(self, steps: tuple[int, ...], tokens_per_step: float, prompts: tuple[int, ...]):
        self.groups: deque[list[int]] = deque()
        self.steps, self.rate, self.prompts = steps, tokens_per_step, prompts
        self.ticks = self.ready = self.steps_sum = 0  # steps_sum: decode steps done, all requests
        self.prompt_sum = 0       # prompt tokens of the ready requests
        self.next_end = math.inf  # the earliest end tick
        self.ordered = True       # end ticks never decrease along the groups

    def join(self, count: int, first_step: int, event: int, kind: int) -> None:
        end = self.ticks + self.steps[kind]
        last = self.groups[-1] if self.groups else None
        if last is not None and last[1] == end and last[2] == first_step and last[3] == event and last[4] == kind:
            last[0] += count
        else:
            if last is not None and end < last[1]:
                self.ordered = False
            self.groups.append([count, end, first_step, event, kind])
        self.ready += count
        self.prompt_sum += count * self.prompts[kind]
        self.next_end = min(self.next_end, end)

    def join_ramp(self, groups: list[list[int]]) -> None:
        """Join a ramp's groups at once: one kind and event, one group a step, end ticks in order and
        none before the groups already here of that kind (no two merge, unlike `join`)."""
        last = self.groups[-1] if self.groups else None
        if last is not None and groups[0][1] < last[1]:
            self.ordered = False
        self.groups.extend(groups)
        count = sum(g[0] for g in groups)
        self.ready += count
        self.prompt_sum += count * self.prompts[groups[0][4]]
        self.next_end = min(self.next_end, groups[0][1])

    def oldest(self, d: int) -> tuple[int, float]:
        """(prompt tokens, tokens generated so far, first token included) of the `d` oldest ready
        requests: the running sums when all decode, else a walk over the oldest groups."""
        if d == self.ready:
            return self.prompt_sum, d + self.rate * self.steps_sum
        prompts, generated, left = 0, 0.0, d
        for count, end, _, _, kind in self.groups:
            n = min(count, left)
            prompts += n * self.prompts[kind]
            generated += n * (1 + self.rate * (self.steps[kind] - (end - self.ticks)))
            left -= n
            if not left:
                break
        return prompts, generated

    def kv_tokens(self) -> float:
        """KV tokens held: prompt plus generated tokens of every ready request."""
        return _kv_held(self.prompt_sum, self.ready, self.rate, self.steps_sum)

    def advance(self, d: int, step: int, finished: list) -> float:
        """Decode the `d` oldest requests one step; move finished groups to `finished`.
        Returns the KV tokens held before the finished ones leave."""
        if d < self.ready:
            self._delay_after(d)
        self.ticks += 1
        self.steps_sum += d
        kv = self.kv_tokens()
        if self.next_end == self.ticks:
            self._finish(step, finished)
        return kv

    def pass_stream(self, step: int, n: int, joins, event: int, kind: int, decoded: int, finished: list) -> int:
        """Pass a stream's `n` steps from `step` on, every ready request decoding, `decoded` decode steps
        in all: the groups whose end comes leave (finish records in the loop's order), then the
        `joins[j]` requests whose prompts completed in step j join, one group a step. Returns the
        requests finished."""
        start, left = self.ticks, 0
        groups = self.groups
        while groups and groups[0][1] <= start + n:
            group = groups.popleft()
            self._leave(group, step + group[1] - start - 1, finished)
            left += group[0]
        at = np.flatnonzero(joins)
        if len(at):
            self.join_ramp([[c, start + j + 1 + self.steps[kind], step + j, event, kind]
                            for j, c in zip(at.tolist(), joins[at].tolist(), strict=True)])
        self.ticks = start + n
        self.steps_sum += decoded
        self.next_end = groups[0][1] if groups else math.inf
        return left

    def _finish(self, step: int, finished: list) -> None:
        groups, ticks = self.groups, self.ticks
        if self.ordered:
            while groups and groups[0][1] == ticks:
                self._leave(groups.popleft(), step, finished)
        else:
            kept = deque()
            for group in groups:
                if group[1] == ticks:
                    self._leave(group, step, finished)
                else:
                    kept.append(group)
            self.groups = kept
            self.ordered = _ordered(kept)
        g = self.groups
        self.next_end = (g[0][1] if self.ordered else min(x[1] for x in g)) if g else math.inf

    def _leave(self, group: list[int], step: int, finished: list) -> None:
        count, _, first, event, kind = group
        finished.append((count, event, first, step, kind))
        self.ready -= count
        self.steps_sum -= count * self.steps[kind]
        self.prompt_sum -= count * self.prompts[kind]

    def _delay_after(self, d: int) -> None:
        """Requests beyond the `d` oldest skip this step: their end tick moves one later."""
        kept: deque[list[int]] = deque()
        left = d
        for count, end, first, event, kind in self.groups:
            if left >= count:
                kept.append([count, end, first, event, kind])
                left -= count
            elif left:
                kept.append([left, end, first, event, kind])
                kept.append([count - left, end + 1, first, event, kind])
                left = 0
            else:
                kept.append([count, end + 1, first, event, kind])
        self.groups = kept
        self.next_end = min(g[1] for g in kept)
        if not self.ordered:
            self.ordered = _ordered(kept)


def _before_each(values: np.ndarray) -> np.ndarray:
    """What the steps before each one add up to (0 for the first): a step's state from per-step changes."""
    return np.concatenate(([0], np.cumsum(values)[:-1]))


def _kv_held(prompts, ready, rate: float, steps_done):
    """KV tokens of `ready` decoding requests: their prompts, first tokens and `rate` tokens per
    decode step done (numbers for one step, arrays for many)."""
    return prompts + ready + rate * steps_done


def _ordered(groups) -> bool:
    """End ticks never decrease along the groups."""
    ends = [g[1] for g in groups]
    return all(a <= b for a, b in zip(ends, ends[1:], strict=False))


class _Arrivals:
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
        self.rng = np.random.default_rng([w.seed, FRONTEND_STREAM])
        if w.arrival == "poisson":
            self.create(w.arrival_times_ms())

    def add(self, count: int, step: int, ms: float = 0.0) -> int:
        """Record `count` arrivals at the end of `step`; returns the event index."""
        w, lo, hi = self.w, self.sent, self.sent + count
        if w.arrival == "burst":
            steady = True
        elif w.measure == "all":  # a benchmark counts every request after its warm-up
            steady = lo >= w.warmup_requests
        elif w.arrival == "closed":
            steady = lo >= w.concurrency and hi <= self.total - w.concurrency
        else:
            margin = STEADY_MARGIN * self.total
            steady = lo >= margin and hi <= self.total - margin
        self.steps.append(step)
        self.sizes.append(count)
        self.ms.append(ms)
        self.steady.append(steady)
        self.sent = hi
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
        sent = np.asarray(ready_ms, dtype=np.float64) + self.frontend.client_delay(self.rng, len(ready_ms))
        kind_of, prompt = self.w.kinds.kind_of, self.w.kinds.input
        for t in sent.tolist():
            heapq.heappush(self.waiting, (t, self.made, prompt[0 if kind_of is None else kind_of[self.made]]))
            self.made += 1

    def _serve(self, until: float) -> None:
        """The API server takes the requests sent by `until`, one at a time in send order (none sent
        later can come before them: the client sends only at or after the clock)."""
        while self.waiting and self.waiting[0][0] <= until:
            self._serve_next()

    def _serve_next(self) -> None:
        t, _, prompt = heapq.heappop(self.waiting)
        self.free_ms = max(t, self.free_ms) + self.frontend.service_ms(prompt)
        self.at.append(self.free_ms)
        self.sent_ms.append(t)

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


class _Cycle:
    """Brent's cycle detection over a loop's states at its events (a closed loop's replacements, a
    burst's finishes): the loop settles into a period (one request's life), and from a state seen
    before the same steps, finishes and replacements follow, shifted in time. States are compared
    relative to the step and the arrival event they are seen at; a cheap summary first, the whole
    state only when the summary matches. O(1) saved states, whatever the loop's length: the last
    two Brent saved (a state saved in a transient is replaced by one that may be in the period,
    and the one before stays comparable for a window longer, so a period is found about half a
    window sooner).

    A burst's fresh group (its requests not started yet) shrinks every period, so its count is left
    out of a burst's state (`free_fresh`): a policy that takes n of a group, not all, takes as many of
    it at any size above n (the `Scheduler` contract), and the copies stop while it still holds more
    than a step takes."""

    def __init__(self, free_fresh: bool = False) -> None:
        self.power = self.lam = 1
        self.free_fresh = free_fresh
        self.saved: list[tuple] = []  # (summary, state, mark): the last two saved, the newest first

    def seen(self, queue, pool, step: int, events: int, mark: tuple) -> tuple | None:
        """The mark of a saved state the current one equals (the newest such), else None."""
        summary = (len(queue), len(pool.groups), pool.ready, pool.steps_sum)
        state = None
        for saved in self.saved:
            if saved[0] == summary:
                state = state or self._state(queue, pool, step, events)
                if saved[1] == state:
                    return saved[2]
        if self.power == self.lam:
            self.saved = [(summary, state or self._state(queue, pool, step, events), mark), *self.saved[:1]]
            self.power *= 2
            self.lam = 0
        self.lam += 1
        return None

    def _state(self, queue, pool, step: int, events: int) -> tuple:
        """The loop's state as the future sees it: FIFO and decode groups relative to `step` and the
        arrival event count (the scheduler sees only this; the KV held and decode sums derive from it)."""
        ticks = pool.ticks
        fifo = [(n, done, events - e, k) for n, done, e, k in queue]
        if self.free_fresh:
            i = _fresh(queue)
            fifo[i] = (-1, *fifo[i][1:])
        return (tuple(fifo),
                tuple((n, end - ticks, step - first, events - e, k) for n, end, first, e, k in pool.groups))


def plan(
    workload: Workload,
    scheduler: Scheduler | None = None,
    *,
    phase: str = "both",
    decode_context: str = "mean",
    context_round: int = DECODE_CONTEXT_ROUND,
    step_ms=None,
) -> Plan:
    """Play the scheduler over `workload` until every request has its `output_length` tokens.

    phase "prefill" models a prefill-only instance (requests leave at their first token),
    "decode" a decode-only one (requests arrive with their prompt prefilled and first token out).
    A Poisson workload depends on time: `step_ms(shape) -> ms` prices each new step shape while
    planning (see `simulator.pricing.StepPricer`).
    """
    scheduler = scheduler or DecodeFirstWithSlack()
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if decode_context not in DECODE_CONTEXTS:
        raise ValueError(f"decode_context must be one of {DECODE_CONTEXTS}, got {decode_context!r}")
    if not isinstance(context_round, int) or context_round < 1:
        raise ValueError(f"context_round must be an integer >= 1, got {context_round!r}")
    w = workload
    if w.kv_blocks:
        from simulator.kvbound import plan_kv_bound

        return plan_kv_bound(w, scheduler, w.kv_blocks, phase=phase, decode_context=decode_context,
                             context_round=context_round, step_ms=step_ms)
    timed, closed = w.timed, w.arrival == "closed"
    if timed and step_ms is None:
        raise ValueError("a timed workload (Poisson, or a closed loop behind a front end) is planned with its "
                         "prices: pass step_ms")
    B, qlen, kinds = w.max_batched_tokens, w.decode_query_len, w.kinds
    prompt = kinds.input
    steps = tuple(0 for _ in kinds.decode_steps) if phase == "prefill" else kinds.decode_steps
    if phase == "decode" and not all(steps):
        raise ValueError("a decode-only instance needs output_length >= 2 for every request (nothing to decode)")
    pool = _DecodePool(steps, w.tokens_per_decode_step, prompt)
    queue: deque[tuple[int, int, int, int]] = deque()  # (requests, prompt tokens done, arrival event, kind)
    arrivals = _Arrivals(w)

    def send(count: int, step: int, ms: float = 0.0) -> None:
        first = arrivals.sent
        event = arrivals.add(count, step, ms)
        for kind, n in kinds.runs(first, first + count):
            if phase == "decode":
                pool.join(n, step, event, kind)
            else:
                queue.append((n, 0, event, kind))

    if not timed:
        send(min(w.concurrency, arrivals.total), -1)
    elif closed:
        arrivals.create(np.zeros(min(w.concurrency, arrivals.total)))
    # "mid": every decode key has the context of a request halfway through its output
    fixed = w.input_length + w.output_length // 2 + 1 if decode_context == "mid" else None
    book = ShapeBook(qlen)
    shape_ms: list[float] = []
    step_shape: list[int] = []
    step_decode: list[int] = []
    step_end: list[float] = []
    finished: list[tuple[int, int, int, int, int]] = []
    kv_prefill = 0
    peak = 0.0
    left = arrivals.total
    clock = 0.0
    view = QueueView(queue, 0, kinds.effective, B, qlen)  # the live FIFO; ready_decode set every step
    burst = w.arrival == "burst"
    cycle = _Cycle(free_fresh=burst) if (closed or burst) and not timed and len(kinds.input) == 1 else None
    check = False  # the last step sent replacements (closed) or finished requests (burst): a state that may repeat
    ahead = None  # the policy's answer for this step, if a ramp asked it already
    rounds = scheduler.requeue and not timed
    # a burst of one kind whose policy plays token streams without being asked (`Scheduler.stream`)
    streams = burst and len(kinds.input) == 1 and steps[0] > 0 and scheduler.stream(1, 0, 0, 1, 1, 1, ()) is not None
    round_mark = None  # (step, lone FIFO group, ready, finish records) where a round may have begun
    while left:
        step = len(step_shape)
        if rounds and len(queue) == 1 and ahead is None:
            copies = _round_copies(round_mark, scheduler, queue[0], pool, step, len(finished), book,
                                   step_shape, step_decode, kinds, B, qlen)
            if copies:
                kv_prefill += _repeat_round(round_mark, copies, queue, pool, qlen, fixed, context_round, book,
                                            step_shape, step_decode)
                step = len(step_shape)
            round_mark = (step, queue[0], pool.ready, len(finished))
        if check:
            now = (step, len(arrivals.steps), len(finished), arrivals.sent, left)
            before = cycle.seen(queue, pool, step, now[1], now)
            if before is not None:
                copies = _period_copies(before, now, arrivals, queue, closed)
                left -= _repeat_period(before, now, copies, step_shape, step_decode, finished, arrivals, queue,
                                       pool)
                cycle, step = None, len(step_shape)
            check = False
        if timed:
            last_start = step_end[-1] - shape_ms[step_shape[-1]] if step_end else None
            clock, due = arrivals.arrived(clock, not queue and not pool.ready, last_start)
            for t in due:
                send(1, step - 1, t)
        view.ready_decode = pool.ready
        sp = ahead or scheduler.plan_step(view)
        ahead = None
        d = sp.decode
        if not sp.takes and d == 0:
            raise RuntimeError(
                f"scheduler {scheduler.name!r} made no progress with {sum(g[0] for g in queue)} requests "
                f"waiting to prefill and {pool.ready} ready to decode"
            )
        if not 0 <= d <= pool.ready:
            raise RuntimeError(f"scheduler {scheduler.name!r} asked {d} decodes of {pool.ready} ready")
        if (d == pool.ready and not (queue or timed) and arrivals.sent == arrivals.total
                and len(pool.groups) >= TAIL_GROUPS):
            # the tail: nothing waits or will arrive and every ready request decodes, to the end
            tail_peak = _decode_tail(pool, step, qlen, fixed, context_round, book, step_shape,
                                     step_decode, finished)
            peak = max(peak, kv_prefill + tail_peak)
            break
        if not timed and len(sp.takes) == 1 and d == pool.ready:  # what ramps and stretches have in common
            if _ramps(sp, queue, pool, kinds, scheduler.requeue):
                # the KV peak: the step after a ramp step holds all it held and more
                ahead, kv_added = _ramp(sp, scheduler, view, queue, pool, kinds, step, qlen, fixed, context_round,
                                        book, step_shape, step_decode)
                kv_prefill += kv_added
                continue
            stretch = _stretch_steps(sp, scheduler, queue, pool, kinds, B, qlen)
            if stretch:
                # the KV peak, as on a ramp: every step of a stretch holds more than the one before
                kv_prefill += _stretch(stretch, sp, queue, pool, kinds, qlen, fixed, context_round, book,
                                       step_shape, step_decode)
                continue
        if streams and d == pool.ready and pool.ready and sp.takes:  # after ramps and stretches: cheaper
            streamed = _stream(sp, scheduler, queue, pool, kinds, step, B, qlen, fixed, context_round, book,
                               step_shape, step_decode, finished, kv_prefill)
            if streamed is not None:
                kv_prefill, stream_peak, finished_now = streamed
                peak = max(peak, stream_peak)
                left -= finished_now
                check = bool(finished_now) and cycle is not None and _fresh(queue) >= 0
                continue
        entries: dict[tuple[int, int], int] = {}
        if sp.takes:
            firsts, kv_added = _apply_takes(queue, sp.takes, scheduler, kinds, entries)
            for n, _, kind in firsts:
                kv_prefill -= n * prompt[kind]
            kv_prefill += kv_added
        else:
            firsts = []
        ctx = _decode_key_context(pool, d, qlen, fixed, context_round)
        shape_id = book.one(tuple(sorted(entries.items())), d, ctx)
        if timed and shape_id == len(shape_ms):
            shape_ms.append(step_ms(book.shape(shape_id)))
        step_shape.append(shape_id)
        step_decode.append(d)
        if timed:
            clock += shape_ms[shape_id]
            step_end.append(clock)
        done = len(finished)
        kv_decode = pool.advance(d, step, finished) if d else pool.kv_tokens()
        first_tokens_kv = 0
        for n, event, kind in firsts:
            first_tokens_kv += n * (prompt[kind] + 1)
            if steps[kind]:
                pool.join(n, step, event, kind)
            else:
                finished.append((n, event, step, step, kind))
        peak = max(peak, kv_prefill + kv_decode + first_tokens_kv)
        finished_now = 0
        while done < len(finished):
            finished_now += finished[done][0]
            done += 1
        left -= finished_now
        if closed and finished_now:
            new = arrivals.replacements(finished_now)
            if new and timed:  # the client sends them when it has the last token
                arrivals.create(np.full(new, clock + arrivals.frontend.return_ms))
            elif new:
                send(new, step)
                check = cycle is not None
        elif burst and finished_now and cycle is not None and _fresh(queue) >= 0:
            check = True  # requests finished while fresh ones wait: the burst may settle into a period
        if not entries and d == pool.ready and not queue and not finished_now:
            # a pure-decode stretch: the next steps repeat this one until a request finishes, the
            # decode key's context moves, or (Poisson) a request arrives; take them at once
            run = _repeats(pool, d, ctx, qlen, fixed, context_round)
            if timed:
                run = _before_arrival(run, clock, shape_ms[shape_id], arrivals.next_time(), step_end)
                clock = step_end[-1]
            if run:
                step_shape.extend([shape_id] * run)
                step_decode.extend([d] * run)
                pool.ticks += run
                pool.steps_sum += run * d  # the KV peak: the next step holds more (it decodes these too)
    counts, arrival, first, finish, kind = (np.array(col, dtype=np.int64) for col in zip(*finished, strict=True))
    return Plan(w, scheduler, phase, book.table(), np.array(step_shape, dtype=np.int64), counts,
                first, finish, float(peak), arrival, np.array(arrivals.steps, dtype=np.int64),
                np.array(arrivals.steady), np.array(step_decode, dtype=np.int64), kind,
                np.array(arrivals.ms) if timed else None, np.array(step_end) if timed else None,
                arrivals.frontend.return_ms if timed else 0.0)


def _fresh(queue: deque) -> int:
    """Where a burst's fresh group (requests with nothing prefilled; one event and kind, so at most
    one group) waits in the FIFO: the front for a requeueing policy, behind the started ones for a
    depth-first one; -1 if none is left."""
    for i in (0, -1):
        if queue and not queue[i][1]:
            return i % len(queue)
    return -1


def _period_copies(before: tuple, now: tuple, arrivals: _Arrivals, queue: deque, closed: bool) -> int:
    """How many more times the period between marks `before` and `now` plays alike: a closed loop's
    while its prompts last (every replacement of a copy sent in full); a burst's while its waiting
    fresh group, which loses the period's finished requests each time, still holds more than the
    period's steps take of it (then the policy answers as it did)."""
    served = before[4] - now[4]
    if closed:
        return (arrivals.total - now[3]) // (now[3] - before[3])
    return (queue[_fresh(queue)][0] - 1) // served if served > 0 else 0


def _repeat_period(before: tuple, now: tuple, copies: int, step_shape: list, step_decode: list, finished: list,
                   arrivals: _Arrivals, queue: deque, pool: _DecodePool) -> int:
    """The loop is in the state it was in at mark `before`: copy the steps, finishes and
    replacements since then `copies` times, and shift the waiting and decoding groups to the end of
    the copies (a burst's fresh group gives the requests the copies finish). Marks are (step,
    events, finish records, requests sent, requests left). Returns the requests finished in the copies."""
    t0, e0, f0, _, left0 = before
    t, e, f, _, left = now
    if not copies:
        return 0
    p, de = t - t0, e - e0
    step_shape.extend(step_shape[t0:t] * copies)
    step_decode.extend(step_decode[t0:t] * copies)
    period = finished[f0:f]
    events = list(zip(arrivals.sizes[e0:e], arrivals.steps[e0:e], strict=True))
    for j in range(1, copies + 1):
        finished.extend((n, event + j * de, first + j * p, end + j * p, kind)
                        for n, event, first, end, kind in period)
        for size, sent_at in events:
            arrivals.add(size, sent_at + j * p)
    shift, de, served = copies * p, copies * de, copies * (left0 - left)
    if not events:  # a burst: the fresh group gave what the copies finish
        i = _fresh(queue)
        n, done, event, kind = queue[i]
        queue[i] = (n - served, done, event, kind)
    queue.extend([(n, done, event + de, kind) for n, done, event, kind in
                  [queue.popleft() for _ in range(len(queue))]])
    for group in pool.groups:
        group[2] += shift
        group[3] += de
    return served


def _stream(sp, scheduler, queue: deque, pool: _DecodePool, kinds, step: int, budget: int, qlen: int,
            fixed: int | None, round_to: int, book: ShapeBook, step_shape: list, step_decode: list,
            finished: list, kv_prefill: float):
    """Play a token stream from `step` on in bulk, if the FIFO holds one (at most one started request,
    then fresh ones, of one event and kind) and the policy says its answers (`Scheduler.stream`), the
    first being `sp`: for up to a request's decode steps, so nobody who starts decoding in it
    finishes in it; requests that finish meanwhile leave as the loop would let them. Returns (the
    prefill KV tokens after it, the most KV a step held, requests finished), or None."""
    start = _stream_start(queue, pool)
    if start is None:
        return None
    done, fresh, event, kind = start
    need, prompt, steps = kinds.effective[kind], kinds.input[kind], pool.steps[kind]
    front = need - done if done else 0  # the started request's prompt tokens to go
    if not scheduler.stream(pool.ready, front, fresh, need, budget, qlen, (0,)):
        return None  # no stream here: asked for its first step alone, before its finishes are worked out
    ticks = pool.ticks
    leaving = [0] * steps  # requests finishing after each step, while every ready request decodes
    for count, end, *_ in pool.groups:
        if end > ticks + steps:
            break
        leaving[end - ticks - 1] += count
    runs = scheduler.stream(pool.ready, front, fresh, need, budget, qlen, leaving)
    if not runs or _stream_takes(runs[0][1:], front, need) != (sp.takes, sp.decode):
        return None
    runs = np.array(runs, dtype=np.int64)
    d, took, whole, part = np.repeat(runs[:, 1:], runs[:, 0], axis=0).T
    n = len(d)
    # the prompts are prefilled one after another, so the tokens taken so far say how far into its
    # prompt the started request is before each step
    tokens = took + whole * need + part
    into = (done + np.concatenate(([0], np.cumsum(tokens)))) % need
    fronts = np.where(into > 0, need - into, 0)  # the started request's tokens to go (0: none)
    before = fronts[:-1]
    joins = whole + ((took > 0) & (took == before))
    gone = np.array(leaving[:n], dtype=np.int64)
    # the decode pool before each step (joins and finishes land after their step)
    joined = _before_each(joins - gone)
    ready = pool.ready + joined
    if not np.array_equal(d, ready):
        j = int(np.flatnonzero(d != ready)[0])
        raise RuntimeError(f"scheduler {scheduler.name!r} streamed {d[j]} decodes of {ready[j]} ready")
    prompts = pool.prompt_sum + prompt * joined
    steps_done = pool.steps_sum + _before_each(d) - steps * _before_each(gone)
    if fixed is None:
        ctx = _round_context(_mean_context(prompts, d, d + pool.rate * steps_done, qlen), round_to)
    else:
        ctx = np.full(n, fixed, dtype=np.int64)
    starts = whole + (part > 0)
    kv = kv_prefill + np.cumsum(tokens + starts * kinds.cached[kind] - joins * prompt)
    held = kv + _kv_held(prompts, d, pool.rate, steps_done + d) + joins * (prompt + 1)
    step_shape.extend(_stream_shapes(book, need, before, took, whole, part, d, ctx))
    step_decode.extend(d.tolist())
    finished_now = pool.pass_stream(step, n, joins, event, kind, int(d.sum()), finished)
    front, fresh = int(fronts[-1]), fresh - int(starts.sum())
    queue.clear()
    if front:
        queue.append((1, need - front, event, kind))
    if fresh:
        queue.append((fresh, 0, event, kind))
    return float(kv[-1]), float(held.max()), finished_now


def _stream_shapes(book: ShapeBook, need: int, fronts, took, whole, part, decodes, contexts) -> list[int]:
    """The ids of a stream's step shapes: the started request's chunk, whole fresh prompts, a fresh
    prompt's first part, the decodes. The started request's chunk alone is the commonest step."""
    seqs = need - fronts + took
    others = {}
    mixed = np.flatnonzero((took == 0) | (whole > 0) | (part > 0)).tolist()
    if mixed:
        tok_l, seq_l, whole_l, part_l = took.tolist(), seqs.tolist(), whole.tolist(), part.tolist()
        for j in mixed:
            t, w, p = tok_l[j], whole_l[j], part_l[j]
            entries = [((t, seq_l[j]), 1)] if t else []
            if w:
                entries.append(((need, need), w))
            if p:
                entries.append(((p, p), 1))
            others[j] = tuple(sorted(entries)) if len(entries) > 1 else tuple(entries)  # never two alike
    return book.chunks(took, 1, seqs, decodes, contexts, others)


def _stream_takes(answer: tuple, front: int, need: int) -> tuple:
    """The (takes, decodes) of the `StepPlan` a stream's answer stands for: the started request's chunk
    (it is at the FIFO front if `front`), then the fresh group's whole prompts and started one."""
    d, took, whole, part = answer
    takes = [(0, 1, took)] if took else []
    behind = 1 if front else 0
    if whole:
        takes.append((behind, whole, need))
    if part:
        takes.append((behind, 1, part))
    return tuple(takes), d


def _stream_start(queue: deque, pool: _DecodePool):
    """(prompt tokens the started request has prefilled (0: none started), fresh requests, their event,
    kind) if the FIFO and decode pool hold a token stream, else None."""
    if not pool.ordered or not 1 <= len(queue) <= 2:
        return None
    count, done, event, kind = queue[-1]
    if done:
        return None
    if len(queue) == 1:
        return 0, count, event, kind
    started = queue[0]
    if started[0] != 1 or not started[1] or started[2:] != (event, kind):
        return None
    return started[1], count, event, kind


def _round_copies(mark: tuple | None, scheduler, group: tuple, pool: _DecodePool, step: int, finishes: int,
                  book: ShapeBook, step_shape: list, step_decode: list, kinds, budget: int, qlen: int) -> int:
    """How many more times the round since `mark` plays alike (0 if the steps since are no round):
    the lone FIFO group is whole again, every request one chunk (not its last) further, beside the
    same decodes, nobody finished; as many more as the policy says (`Scheduler.round_repeats`), up to
    the round before the last chunk and before a decode group finishes."""
    if mark is None:
        return 0
    t0, (count, done0, event, kind), ready, finishes0 = mark
    count_now, done, event_now, kind_now = group
    chunk, length = done - done0, step - t0
    if not (length and chunk > 0 and (count_now, event_now, kind_now) == (count, event, kind)
            and pool.ready == ready and finishes == finishes0):
        return 0
    remaining = kinds.effective[kind] - done
    copies = min(scheduler.round_repeats(ready, count, chunk, remaining, budget, qlen),
                 chunks_before_last(remaining, chunk))
    if ready:
        copies = min(copies, (pool.next_end - pool.ticks - 1) // length)
    if copies < 1 or any(d != ready for d in step_decode[t0:step]):
        return 0
    for shape_id in set(step_shape[t0:step]):  # every step since took requests of the group to `done`
        prefill = [key for key in book.shape(shape_id) if not key.is_decode]
        if len(prefill) != 1 or (prefill[0].query_len, prefill[0].seq_len) != (chunk, done):
            return 0
    return int(copies)


def _repeat_round(mark: tuple, copies: int, queue: deque, pool: _DecodePool, qlen: int, fixed: int | None,
                  round_to: int, book: ShapeBook, step_shape: list, step_decode: list) -> int:
    """Play the round since `mark` `copies` more times (see `_round_copies`): the same takes, each
    copy's chunks one chunk further into the prompts, the decode keys' contexts as the loop would
    compute them. Returns the prefill KV tokens the copies added."""
    t0, (count, done0, event, kind), ready, _ = mark
    chunk = queue[0][1] - done0
    length = len(step_shape) - t0
    round_shapes = np.array(step_shape[t0:], dtype=np.int64)
    total = copies * length
    if not ready:
        ctx = np.zeros(total, dtype=np.int64)
    elif fixed is None:
        steps_done = pool.steps_sum + ready * np.arange(total)
        ctx = _round_context(_mean_context(pool.prompt_sum, ready, ready + pool.rate * steps_done, qlen), round_to)
    else:
        ctx = np.full(total, fixed, dtype=np.int64)
    # a step's shape follows from (copy, the round's shape it repeats, decode context): make each once,
    # in order of first use as the loop would
    copy = np.repeat(np.arange(1, copies + 1), length)
    codes = np.stack((copy, np.tile(round_shapes, copies), ctx), axis=1)
    unique, first, inverse = np.unique(codes, axis=0, return_index=True, return_inverse=True)
    made = np.argsort(first, kind="stable")
    j, shape, cj = unique[made].T
    prefill = [book.shape(shape_id)[0] for shape_id in shape.tolist()]  # a round's step has one (`_round_copies`)
    ids = np.empty(len(unique), dtype=np.int64)
    ids[made] = book.chunks(chunk, [key.concurrency for key in prefill],
                            [key.seq_len + jj * chunk for key, jj in zip(prefill, j.tolist(), strict=True)], ready, cj)
    step_shape.extend(ids[inverse.ravel()].tolist())
    step_decode.extend([ready] * total)
    queue[0] = (count, queue[0][1] + copies * chunk, event, kind)
    if ready:
        pool.ticks += total
        pool.steps_sum += total * ready
    return copies * count * chunk


def _decode_tail(pool: _DecodePool, step: int, qlen: int, fixed: int | None, round_to: int, book: ShapeBook,
                 step_shape: list, step_decode: list, finished: list) -> float:
    """Play the tail at once: from `step` on every ready request decodes every step (nothing waits to
    prefill or will arrive) until the last group finishes; the decode count falls as groups finish
    and the key's context is computed per step exactly as `_decode_key_context` would. Appends the
    steps, their shapes and the finish records (in the order the loop would make them); returns
    the most KV held by a step."""
    groups = pool.groups
    count, end, first, event, kind = (np.array(col, dtype=np.int64) for col in zip(*groups, strict=True))
    last = end - pool.ticks - 1  # the tail step each group finishes in
    n = int(last.max()) + 1
    prompt = count * np.array(pool.prompts, dtype=np.int64)[kind]
    decoded = count * np.array(pool.steps, dtype=np.int64)[kind]
    # requests, prompt tokens, decode steps leaving after each step (sums of integers, exact in float64)
    gone = np.stack([np.bincount(last, weights=v, minlength=n) for v in (count, prompt, decoded)]).astype(np.int64)
    before = np.zeros((3, n), dtype=np.int64)
    np.cumsum(gone[:, :-1], axis=1, out=before[:, 1:])
    d = pool.ready - before[0]
    prompts = pool.prompt_sum - before[1]
    steps_done = pool.steps_sum + _before_each(d) - before[2]
    if fixed is None:
        ctx = _round_context(_mean_context(prompts, d, d + pool.rate * steps_done, qlen), round_to)
    else:
        ctx = np.full(n, fixed, dtype=np.int64)
    change = np.flatnonzero((d[1:] != d[:-1]) | (ctx[1:] != ctx[:-1])) + 1
    starts = np.concatenate(([0], change))
    ids = book.decodes(d[starts].tolist(), ctx[starts].tolist())
    step_shape.extend(np.repeat(np.array(ids, dtype=np.int64), np.diff(np.append(starts, n))).tolist())
    step_decode.extend(d.tolist())
    order = np.argsort(last, kind="stable")
    finished.extend(zip(count[order].tolist(), event[order].tolist(), first[order].tolist(),
                        (step + last[order]).tolist(), kind[order].tolist(), strict=True))
    groups.clear()
    return float(_kv_held(prompts, d, pool.rate, steps_done + d).max())


def _ramps(sp, queue: deque, pool: _DecodePool, kinds, requeue: bool) -> bool:
    """A ramp step: every ready request decodes, and some but not all requests of the front FIFO group
    advance one chunk: their prompt's last (they start decoding), or, with a policy that requeues
    them, an earlier one (a round: they go to the back of the FIFO); nobody finishes."""
    if not (queue and sp.takes):
        return False
    count, done, _, kind = queue[0]
    n, tok = _front_take(sp, pool.ready, count)
    need = kinds.effective[kind]
    if not (n and 0 < tok and done + tok <= need) or pool.next_end <= pool.ticks + (1 if sp.decode else 0):
        return False  # an impossible take is the loop's to name
    return pool.steps[kind] > 0 if done + tok == need else requeue


def _front_take(sp, ready: int, count: int) -> tuple[int, int]:
    """(requests, tokens each) of a ramp answer: `sp` decodes all `ready` and advances some but not
    all `count` requests of the front group; (0, 0) if `sp` is no ramp answer."""
    if len(sp.takes) != 1 or sp.decode != ready:
        return 0, 0
    pos, n, tok = sp.takes[0]
    return (n, tok) if pos == 0 and 0 < n < count else (0, 0)


def _ramp(sp, scheduler, view, queue: deque, pool: _DecodePool, kinds, step: int, qlen: int, fixed: int | None,
          round_to: int, book: ShapeBook, step_shape: list, step_decode: list):
    """Play ramp steps (see `_ramps`) from `step` on, the first with the policy's answer `sp`: the
    policy is asked for a step (with the front group shrunk, the chunks taken requeued and the ready
    count grown by the steps before) unless it said its last answer holds (`Scheduler.ramp_steps`),
    and nothing else of the loop runs; the decode keys' contexts are computed at once, as the loop
    would. Stops before a step that is not a ramp step of the same chunk or that finishes a request.
    Returns the policy's answer for the step after the ramp if it was asked, and the prefill KV
    tokens the ramp added (a chunk's tokens; a cached prefix with the first chunk; a finished
    prompt's leave for the decode pool)."""
    count, done, event, kind = queue[0]
    n, tok = _front_take(sp, pool.ready, count)
    seq = done + tok
    joins = seq == kinds.effective[kind]  # the prompts complete and start decoding, else a round
    steps = pool.steps[kind] if joins else 0
    prompt = kinds.input[kind]
    ready, ticks = pool.ready, 0   # ticks: decode steps played in the ramp
    takes, decodes = [], []
    end = pool.next_end - pool.ticks  # ticks until the first decode group finishes
    moved = 0  # requests of a round not yet requeued
    holds = scheduler.ramp_steps(ready, n, tok, view.max_batched_tokens, qlen, n if joins else 0)
    while True:
        takes.append(n)
        decodes.append(ready)
        if ready:
            ticks += 1
        if joins:
            end = min(end, ticks + steps)  # the group joining now finishes `steps` ticks on
            ready += n
        else:
            moved += n
        count -= n
        holds -= 1
        if end <= ticks + 1:  # the next step finishes somebody
            sp = None
            break
        if holds > 0 and n < count:
            continue  # the policy answers the next step alike
        _ramp_sync(queue, view, count, done, event, kind, moved, seq, ready)
        moved = 0
        sp = scheduler.plan_step(view)
        n, took = _front_take(sp, ready, count)
        if not n or took != tok:
            break
        holds = scheduler.ramp_steps(ready, n, tok, view.max_batched_tokens, qlen, n if joins else 0)
    _ramp_sync(queue, view, count, done, event, kind, moved, seq, ready)
    p, d = np.array(takes, dtype=np.int64), np.array(decodes, dtype=np.int64)
    joined = _before_each(p) if joins else np.zeros(len(p), dtype=np.int64)
    prompts = pool.prompt_sum + prompt * joined
    steps_done = pool.steps_sum + _before_each(d)
    live = d > 0
    safe = np.where(live, d, 1)
    if fixed is None:
        mean = _mean_context(prompts, safe, safe + pool.rate * steps_done, qlen)
        ctx = np.where(live, _round_context(mean, round_to), 0)
    else:
        ctx = np.where(live, fixed, 0)
    step_shape.extend(book.chunks(tok, p, seq, d, ctx))
    clock = pool.ticks + np.cumsum(live)  # the decode pool's ticks after each step, when its prefills join
    if joins:
        pool.join_ramp([[nj, end, step + j, event, kind]
                        for j, (nj, end) in enumerate(zip(takes, (clock + steps).tolist(), strict=True))])
    pool.ticks = int(clock[-1])
    step_decode.extend(decodes)
    pool.steps_sum += int(d.sum())
    taken = int(p.sum())  # as `_apply_takes` and the loop count them
    added = taken * (tok + (0 if done else kinds.cached[kind]))
    return sp, added - (taken * prompt if joins else 0)


def _stretch_steps(sp, scheduler, queue: deque, pool: _DecodePool, kinds, budget: int, qlen: int) -> int:
    """The steps of a chunk stretch starting with the policy's answer `sp`, a single take with every
    ready request decoding (0 if it starts none): the whole front group advances one chunk, not its
    prompt's last, keeping its place (a depth-first policy, or the only group), for as many steps as
    the policy says its answer holds (`Scheduler.stretch_steps`) and nobody finishes. One step is
    left to the loop."""
    if not queue:
        return 0
    pos, n, tok = sp.takes[0]
    count, done, _, kind = queue[0]
    remaining = kinds.effective[kind] - done
    if not (pos == 0 and n == count and 0 < tok < remaining and (not scheduler.requeue or len(queue) == 1)):
        return 0
    k = chunks_before_last(remaining, tok)
    if k < 2:
        return 0
    k = min(scheduler.stretch_steps(pool.ready, n, tok, remaining, budget, qlen), k)
    if pool.ready:
        k = min(k, pool.next_end - pool.ticks - 1)
    return int(k) if k >= 2 else 0


def _stretch(k: int, sp, queue: deque, pool: _DecodePool, kinds, qlen: int, fixed: int | None, round_to: int,
             book: ShapeBook, step_shape: list, step_decode: list) -> int:
    """Play the `k` steps of a chunk stretch (see `_stretch_steps`), the first with the policy's answer
    `sp`; the decode keys' contexts as the loop would compute them. Returns the prefill KV tokens the
    chunks added (a cached prefix with the first)."""
    count, done, event, kind = queue[0]
    _, n, tok = sp.takes[0]
    ready = pool.ready
    if not ready:
        ctx = np.zeros(k, dtype=np.int64)
    elif fixed is None:
        generated = ready + pool.rate * (pool.steps_sum + ready * np.arange(k))
        ctx = _round_context(_mean_context(pool.prompt_sum, ready, generated, qlen), round_to)
    else:
        ctx = np.full(k, fixed, dtype=np.int64)
    seqs = np.arange(done + tok, done + tok * k + 1, tok)
    step_shape.extend(book.chunks(tok, n, seqs, ready, ctx))
    step_decode.extend([ready] * k)
    queue[0] = (count, done + tok * k, event, kind)
    if ready:
        pool.ticks += k
        pool.steps_sum += k * ready
    return n * tok * k + (0 if done else n * kinds.cached[kind])


def _ramp_sync(queue: deque, view, count: int, done: int, event: int, kind: int, moved: int, seq: int,
               ready: int) -> None:
    """Bring the FIFO and the policy's view up to a ramp's step: the front group's count, a round's
    `moved` chunks requeued (merged as `_push_back` would)."""
    queue[0] = (count, done, event, kind)
    if moved:
        _push_back(queue, (moved, seq, event, kind))
    view.ready_decode = ready


def _repeats(pool: _DecodePool, d: int, ctx: int, qlen: int, fixed: int | None, round_to: int) -> int:
    """How many more pure-decode steps of all `d` ready requests keep the decode key `ctx` and
    finish nobody: up to the step before the first end, while the rounded mean context (computed
    exactly as `_decode_key_context` would, from the decode steps done) stays the same."""
    run = pool.next_end - pool.ticks - 1
    if fixed is not None or run <= 0:
        return max(run, 0)

    def same(j: int) -> bool:  # the j-th next step (0-based) keeps the key
        generated = d + pool.rate * (pool.steps_sum + j * d)
        return _round_context(_mean_context(pool.prompt_sum, d, generated, qlen), round_to) == ctx

    if same(run - 1):
        return run  # the mean only grows: if the last step keeps the key, all do
    # the mean grows by `rate` a step: start from the closed-form crossing, then settle it exactly
    first = _mean_context(pool.prompt_sum, d, d + pool.rate * pool.steps_sum, qlen)
    j = max(0, min(run - 1, int((ctx - first) / pool.rate)))
    while j > 0 and not same(j - 1):
        j -= 1
    while same(j):
        j += 1
    return j


def _before_arrival(run: int, clock: float, step: float, next_arrival: float | None, step_end: list) -> int:
    """Of `run` repeated steps of `step` ms, those that start before the next arrival is due;
    their end times are appended to `step_end` (added one by one, as the loop's clock would)."""
    for j in range(run):
        if next_arrival is not None and next_arrival <= clock:
            return j
        clock += step
        step_end.append(clock)
    return run


def _decode_key_context(pool: _DecodePool, d: int, qlen: int, fixed: int | None, round_to: int) -> int:
    """seq_len of the step's decode key: `fixed` ("mid" mode), else the mean context of the `d`
    oldest decoding requests after the step, rounded up to `round_to`; 0 when nobody decodes."""
    if not d:
        return 0
    if fixed is not None:
        return fixed
    prompts, generated = pool.oldest(d)
    return _round_context(_mean_context(prompts, d, generated, qlen), round_to)


def _mean_context(prompts, d, generated, qlen: int):
    """Mean context after a step of `d` decoding requests that hold `prompts` prompt tokens and have
    generated `generated` tokens: numbers for one step, arrays for many (the same float operations)."""
    return prompts / d + qlen - 1 + generated / d


def _round_context(mean, round_to: int):
    """The decode key's seq_len: the mean context rounded up to `round_to` (a number, or an array)."""
    if isinstance(mean, np.ndarray):
        return (np.ceil(mean / round_to - CONTEXT_EPS) * round_to).astype(np.int64)
    return math.ceil(mean / round_to - CONTEXT_EPS) * round_to


def _apply_takes(queue: deque, takes, scheduler, kinds, entries):
    """Advance the chosen prefill groups in the FIFO `queue` (in place; only the front groups up to
    the last one taken are touched, so a step costs its takes, not the queue's length); return the
    (requests, arrival event, kind) whose prompt is now complete, and the KV tokens the step added."""
    by_pos: dict[int, list[tuple[int, int]]] = {}
    size = len(queue)
    for pos, n, tok in takes:
        if not 0 <= pos < size or n < 1 or tok < 1:
            raise RuntimeError(f"scheduler {scheduler.name!r} made an invalid take {(pos, n, tok)}")
        if pos in by_pos:
            by_pos[pos].append((n, tok))
        else:
            by_pos[pos] = [(n, tok)]
    popleft = queue.popleft
    head = [popleft() for _ in range(max(by_pos) + 1)]
    front: list[tuple[int, int, int, int]] = []
    back: list[tuple[int, int, int, int]] = []
    firsts: list[tuple[int, int, int]] = []
    kv_added = 0
    stay = back if scheduler.requeue else front
    none = ()
    for pos, (count, done, event, kind) in enumerate(head):
        left, need = count, kinds.effective[kind]
        for n, tok in by_pos.get(pos, none):
            seq = done + tok
            left -= n
            if seq > need or left < 0:
                raise RuntimeError(f"scheduler {scheduler.name!r} over-advanced group {(count, done)}")
            kv_added += n * tok + (n * kinds.cached[kind] if done == 0 else 0)
            entries[(tok, seq)] = entries.get((tok, seq), 0) + n
            if seq == need:
                firsts.append((n, event, kind))
            else:
                stay.append((n, seq, event, kind))
        if left:
            front.append((left, done, event, kind))
    queue.extendleft(reversed(front))
    for group in back:
        _push_back(queue, group)
    return firsts, kv_added


def _push_back(queue: deque, group: tuple[int, int, int, int]) -> None:
    if queue and queue[-1][1:] == group[1:]:
        queue[-1] = (queue[-1][0] + group[0], *group[1:])
    else:
        queue.append(group)
