"""The planner's state (`simulator.timeline.plan`) and its plain step.

    workload, policy ──> PlanState ──────────────────────────────────────────────┐
                           │ queue     FIFO of prefill groups (count, done, event, kind)
                           │ pool      DecodePool: decode groups [count, end tick, first step, event, kind]
                           │ arrivals  Arrivals: events (step or ms), the client and its front end
                           │ book      ShapeBook: every distinct step shape, once
                           │ steps     step_shape, step_decode (and step_end, shape_ms when timed)
                           │ finished  finish records (count, event, first step, finish step, kind)
                           │ counters  kv_prefill, peak, left, clock; ahead (a policy answer asked early)
                           └─> play(answer) appends one step; a fast-forward (simulator.jumps) many

Every fast-forward reads and writes this one object; a step it takes is a step `play` would have
taken, so the plan is the same with it or without.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simulator.arrivals import Arrivals
from simulator.pool import DecodePool
from simulator.scheduler import QueueView, Scheduler
from simulator.shapebook import ShapeBook
from simulator.workload import Workload

#: float slack when rounding a mean context up: a mean a hair above a multiple stays on it
CONTEXT_EPS = 1e-9
_step = tuple.__new__  # makes a Step without NamedTuple's Python-level constructor


class Step(NamedTuple):
    """A plain step of decodes only that finished nobody, for the fast-forwards asked after it."""

    shape_id: int
    decodes: int
    context: int     # its decode key's seq_len


@dataclass(eq=False, slots=True)
class PlanState:
    """Everything the planner knows between two steps (see the module docstring)."""

    w: Workload
    scheduler: Scheduler
    phase: str
    fixed: int | None  # the decode key's context in "mid" mode, else None (the mean)
    round_to: int
    steps: tuple       # decode steps per kind (0 for every kind on a prefill-only instance)
    step_ms: object    # prices a new step shape while planning (timed plans), else None
    queue: deque = field(default_factory=deque)
    pool: DecodePool = None
    arrivals: Arrivals = None
    book: ShapeBook = None
    view: QueueView = None
    step_shape: list = field(default_factory=list)
    step_decode: list = field(default_factory=list)
    shape_ms: list = field(default_factory=list)
    step_end: list = field(default_factory=list)
    finished: list = field(default_factory=list)
    kv_prefill: float = 0.0
    peak: float = 0.0
    left: int = 0
    clock: float = 0.0
    ahead: object = None  # the policy's answer for the next step, when a fast-forward asked it already
    check: bool = False   # the last step may have brought the loop back to a state seen before
    timed: bool = False   # planned with its prices: Poisson, or a closed loop behind a front end
    closed: bool = False
    burst: bool = False
    kinds: object = None  # the workload's kinds of request (simulator.mix.RequestKinds)
    qlen: int = 1         # tokens a decode step computes per request (1 + MTP drafts)

    @classmethod
    def start(cls, w: Workload, scheduler: Scheduler, phase: str, fixed: int | None, round_to: int,
              step_ms=None) -> PlanState:
        """The state before the first step: the first requests sent (or, timed, on their way)."""
        kinds = w.kinds
        steps = tuple(0 for _ in kinds.decode_steps) if phase == "prefill" else kinds.decode_steps
        st = cls(w, scheduler, phase, fixed, round_to, steps, step_ms, timed=w.timed, closed=w.arrival == "closed",
                 burst=w.arrival == "burst", kinds=kinds, qlen=w.decode_query_len)
        st.pool = DecodePool(steps, w.tokens_per_decode_step, kinds.input)
        st.arrivals = Arrivals(w)
        st.book = ShapeBook(w.decode_query_len)
        st.view = QueueView(st.queue, 0, kinds.effective, w.max_batched_tokens, w.decode_query_len)
        st.left = st.arrivals.total
        if not w.timed:
            st.send(min(w.concurrency, st.arrivals.total), -1)
        elif w.arrival == "closed":
            st.arrivals.create_at(0.0, min(w.concurrency, st.arrivals.total))
        return st

    def send(self, count: int, step: int, ms: float = 0.0) -> None:
        """`count` requests reach the scheduler at the end of `step` (or at `ms`, timed)."""
        first = self.arrivals.sent
        event = self.arrivals.add(count, step, ms)
        for kind, n in self.kinds.runs(first, first + count):
            if self.phase == "decode":
                self.pool.join(n, step, event, kind)
            else:
                self.queue.append((n, 0, event, kind))

    def receive(self) -> None:
        """Timed: hand the scheduler the requests that reached it by the step about to start."""
        last_start = self.step_end[-1] - self.shape_ms[self.step_shape[-1]] if self.step_end else None
        self.clock, due = self.arrivals.arrived(self.clock, not self.queue and not self.pool.ready, last_start)
        step = len(self.step_shape) - 1
        for t in due:
            self.send(1, step, t)

    def answer(self):
        """The policy's answer for the next step (asked now unless a fast-forward asked it already)."""
        ready = self.view.ready_decode = self.pool.ready
        sp = self.ahead
        if sp is None:
            sp = self.scheduler.plan_step(self.view)
        else:
            self.ahead = None
        if not sp.takes and sp.decode == 0:
            waiting = sum(g[0] for g in self.queue)
            raise RuntimeError(f"scheduler {self.scheduler.name!r} made no progress with {waiting} requests "
                               f"waiting to prefill and {ready} ready to decode")
        if not 0 <= sp.decode <= ready:
            raise RuntimeError(f"scheduler {self.scheduler.name!r} asked {sp.decode} decodes of {ready} ready")
        return sp

    def play(self, sp) -> Step | None:
        """One step as the policy answered: its prefill takes, its decodes, requests finishing and
        (closed loop) their replacements. Returns the step if it was a pure-decode step that finished
        nobody (the only steps a fast-forward repeats), else None."""
        entries: dict[tuple[int, int], int] = {}
        firsts = ()
        if sp.takes:
            firsts, kv_added = apply_takes(self.queue, sp.takes, self.scheduler, self.kinds, entries)
            prompt = self.kinds.input
            for n, _, kind in firsts:
                self.kv_prefill -= n * prompt[kind]
            self.kv_prefill += kv_added
        d = sp.decode
        ctx = 0
        if d:  # the decode key's seq_len: "mid"'s fixed one, else the `d` oldest requests' mean context
            if self.fixed is None:
                prompts, generated = self.pool.oldest(d)
                ctx = round_context(mean_context(prompts, d, generated, self.qlen), self.round_to)
            else:
                ctx = self.fixed
        shape_id = self.book.one(tuple(sorted(entries.items())), d, ctx)
        step = len(self.step_shape)
        if self.timed:
            self.record(shape_id, d, firsts)
        else:
            self.step_shape.append(shape_id)
            self.step_decode.append(d)
        finished, pool, prompt = self.finished, self.pool, self.kinds.input
        done = len(finished)
        kv_decode = pool.advance(d, step, finished) if d else pool.kv_tokens()
        first_tokens_kv = 0
        for n, event, kind in firsts:
            first_tokens_kv += n * (prompt[kind] + 1)
            if self.steps[kind]:
                pool.join(n, step, event, kind)
            else:
                finished.append((n, event, step, step, kind))
        held = self.kv_prefill + kv_decode + first_tokens_kv
        if held > self.peak:
            self.peak = held
        finished_now = 0
        while done < len(finished):
            finished_now += finished[done][0]
            done += 1
        if finished_now:
            self.left -= finished_now
            self._replace(step, finished_now)
        elif not entries:
            return _step(Step, (shape_id, d, ctx))
        return None

    def record(self, shape_id: int, d: int, firsts=()) -> None:
        """Append one step of shape `shape_id` with `d` decodes that gave `firsts` (groups) their first
        token (priced and timed in a timed plan; its tokens streamed where that costs the front end time)."""
        if self.timed and shape_id == len(self.shape_ms):
            self.shape_ms.append(self.step_ms(self.book.shape(shape_id)))
        self.step_shape.append(shape_id)
        self.step_decode.append(d)
        if self.timed:
            self.clock += self.shape_ms[shape_id]
            self.step_end.append(self.clock)
            if self.arrivals.streams:
                self.arrivals.stream(self.clock, d + sum(n for n, _, _ in firsts))

    def _replace(self, step: int, finished_now: int) -> None:
        """A closed loop's client replaces the finished requests; a burst that finished requests while
        fresh ones wait may have settled into a period."""
        if self.closed:
            a = self.arrivals
            new = a.replacements(finished_now)
            if new and self.timed:  # the client sends them when it has the last token
                a.create_at(a.tokens_at(self.clock), new)
            elif new:
                self.send(new, step)
                self.check = True
        elif self.burst and fresh(self.queue) >= 0:
            self.check = True

    def contexts(self, prompts, d, generated, n: int) -> np.ndarray:
        """The decode keys' seq_len of `n` steps from their prompt tokens, decode counts and tokens
        generated (arrays), computed exactly as `play` computes one step's."""
        if self.fixed is not None:
            return np.full(n, self.fixed, dtype=np.int64)
        return round_context(mean_context(prompts, d, generated, self.qlen), self.round_to)


def before_each(values: np.ndarray) -> np.ndarray:
    """What the steps before each one add up to (0 for the first): a step's state from per-step changes."""
    return np.concatenate(([0], np.cumsum(values)[:-1]))


def mean_context(prompts, d, generated, qlen: int):
    """Mean context after a step of `d` decoding requests that hold `prompts` prompt tokens and have
    generated `generated` tokens: numbers for one step, arrays for many (the same float operations)."""
    return prompts / d + qlen - 1 + generated / d


def round_context(mean, round_to: int):
    """The decode key's seq_len: the mean context rounded up to `round_to` (a number, or an array)."""
    if isinstance(mean, np.ndarray):
        return (np.ceil(mean / round_to - CONTEXT_EPS) * round_to).astype(np.int64)
    return math.ceil(mean / round_to - CONTEXT_EPS) * round_to


def fresh(queue: deque) -> int:
    """Where a burst's fresh group (requests with nothing prefilled; one event and kind, so at most
    one group) waits in the FIFO: the front for a requeueing policy, behind the started ones for a
    depth-first one; -1 if none is left."""
    for i in (0, -1):
        if queue and not queue[i][1]:
            return i % len(queue)
    return -1


def apply_takes(queue: deque, takes, scheduler, kinds, entries):
    """Advance the chosen prefill groups in the FIFO `queue` (in place; only the front groups up to
    the last one taken are touched, so a step costs its takes, not the queue's length); return the
    (requests, arrival event, kind) whose prompt is now complete, and the KV tokens the step added."""
    if len(takes) == 1 and takes[0][0] == 0:
        return _take_front(queue, takes[0], scheduler, kinds, entries)
    return _take_each(queue, takes, scheduler, kinds, entries)


def _take_each(queue: deque, takes, scheduler, kinds, entries):
    """`apply_takes` of any takes: the groups up to the last one taken popped, advanced and put back."""
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
        push_back(queue, group)
    return firsts, kv_added


def _take_front(queue: deque, take: tuple[int, int, int], scheduler, kinds, entries):
    """`apply_takes` of one take from the front group, the step's only one (most steps): the same queue,
    entries, first tokens and KV as `_take_each` gives (tests/simulator), without sorting takes by position."""
    _, n, tok = take
    if not queue or n < 1 or tok < 1:
        raise RuntimeError(f"scheduler {scheduler.name!r} made an invalid take {take}")
    count, done, event, kind = queue.popleft()
    seq, left, need = done + tok, count - n, kinds.effective[kind]
    if seq > need or left < 0:
        raise RuntimeError(f"scheduler {scheduler.name!r} over-advanced group {(count, done)}")
    entries[(tok, seq)] = entries.get((tok, seq), 0) + n
    if left:
        queue.appendleft((left, done, event, kind))
    firsts = []
    if seq == need:
        firsts.append((n, event, kind))
    elif scheduler.requeue:
        push_back(queue, (n, seq, event, kind))
    else:
        queue.appendleft((n, seq, event, kind))
    return firsts, n * tok + (n * kinds.cached[kind] if done == 0 else 0)


def push_back(queue: deque, group: tuple[int, int, int, int]) -> None:
    """Requeue `group` at the back of the FIFO, merged with the last group if it is alike."""
    if queue and queue[-1][1:] == group[1:]:
        queue[-1] = (queue[-1][0] + group[0], *group[1:])
    else:
        queue.append(group)
