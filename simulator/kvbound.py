"""KV-bound admission and preemption, as vLLM V1's scheduler does them, request by request.

When the KV cache cannot hold every request in flight, the engine still runs: it admits what fits
and queues the rest. The pool is `kv_blocks` blocks of BLOCK_SIZE tokens; a request holds
ceil(tokens computed / BLOCK_SIZE) blocks, the token budget per step is B.

One block is vLLM's null block, never handed out. Each step:

1. Running requests, oldest first, each get min(what it needs, budget left) tokens (a decode 1, a
   started prefill its next chunk). If its blocks do not fit, the most recently admitted running
   request is preempted: its blocks are freed and it goes back to the front of the waiting queue,
   to be recomputed later (a prefill over its prompt and the tokens it had generated); this repeats
   until the blocks fit or the request preempted itself.
2. Only if nobody was preempted: waiting requests in FIFO order, while the budget lasts and fewer
   than max_num_seqs run, each admitted only when the blocks of its whole prompt (and any tokens it
   had generated) fit (vLLM 0.33's `scheduler_reserve_full_isl`); the first that does not fit stops
   admission.

The group timeline (`simulator.timeline`) cannot express this (a request's progress depends on
blocks, not only on counts), so a KV-bound workload is planned here, one request at a time, into
the same `Plan`. Only the token-budget policy is modelled (decode-first is the RFC's window policy,
which has no admission rule) and one decode token per step (no MTP).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from simulator.scheduler import TokenBudget
from simulator.shapebook import ShapeBook

#: vLLM's default KV block size (tokens)
BLOCK_SIZE = 16
#: blocks of the pool no request can hold: vLLM's block pool keeps one as its null block
NULL_BLOCKS = 1


class _Request:
    __slots__ = ("blocks", "cached", "computed", "event", "first", "kind", "out", "output", "prompt")

    def __init__(self, kind: int, prompt: int, output: int, cached: int, event: int):
        self.kind, self.prompt, self.output, self.event = kind, prompt, output, event
        self.computed = cached  # tokens in KV (a cached prefix counts from the start)
        self.out = 0            # output tokens sampled
        self.blocks = 0
        self.first = -2         # step of the first token (-2: none yet)
        self.cached = cached

    @property
    def tokens(self) -> int:
        """Tokens the request has: its prompt and what it has sampled (the last one not computed yet)."""
        return self.prompt + self.out


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class KVBoundPlanner:
    """The state of one KV-bound plan: the pool, the running list and the waiting queue."""

    def __init__(self, w, scheduler: TokenBudget, kv_blocks: int):
        self.w, self.scheduler = w, scheduler
        self.free = self.pool = kv_blocks - NULL_BLOCKS
        self.running: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        self.preemptions = 0
        self.peak_blocks = 0

    def step(self) -> list[tuple[_Request, int]]:
        """The (request, tokens) of one step, in the order the scheduler assigns them."""
        budget, cap = self.w.max_batched_tokens, self.scheduler.long_prefill_token_threshold or 0
        scheduled, before, i = [], self.preemptions, 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.tokens - r.computed, cap or math.inf, budget)
            if not self._fit(r, r.computed + n):
                break
            scheduled.append((r, n))
            budget -= n
            i += 1
        seats, preempted = self.scheduler.max_num_seqs or math.inf, self.preemptions > before
        while not preempted and self.waiting and budget > 0 and len(self.running) < seats:
            r = self.waiting[0]
            n = min(r.tokens - r.computed, cap or math.inf, budget)
            if blocks_for(r.tokens) - r.blocks > self.free:  # the whole prompt must fit to be admitted
                break
            self.waiting.popleft()
            self.running.append(r)
            self._take(r, r.computed + n)
            scheduled.append((r, n))
            budget -= n
        self.peak_blocks = max(self.peak_blocks, self.pool - self.free)
        return scheduled

    def _fit(self, r: _Request, tokens: int) -> bool:
        """Give `r` the blocks of `tokens`, preempting the newest running requests until they fit;
        False when `r` had to be preempted itself."""
        while blocks_for(tokens) - r.blocks > self.free:
            victim = self.running.pop()
            self.free += victim.blocks
            victim.blocks, victim.computed = 0, victim.cached
            self.waiting.appendleft(victim)
            self.preemptions += 1
            if victim is r:
                return False
        self._take(r, tokens)
        return True

    def _take(self, r: _Request, tokens: int) -> None:
        need = blocks_for(tokens) - r.blocks
        self.free -= need
        r.blocks += need

    def finish(self, r: _Request) -> None:
        self.running.remove(r)
        self.free += r.blocks
        r.blocks = 0


def plan_kv_bound(w, scheduler, kv_blocks: int, *, phase: str = "both", decode_context: str = "mean",
                  context_round: int = 128, step_ms=None):
    """Plan `w` under `scheduler` (token-budget) with a KV pool of `kv_blocks` blocks; a `Plan` like
    `simulator.timeline.plan`'s, with its `preemptions` and `kv_blocks` set."""
    from simulator.timeline import NO_FRONTEND, Plan, _Arrivals, _round_context

    _check(w, scheduler, kv_blocks, phase)
    timed, closed = w.timed, w.arrival == "closed"
    if timed and step_ms is None:
        raise ValueError("a timed workload is planned with its prices: pass step_ms")
    kinds = w.kinds
    planner = KVBoundPlanner(w, scheduler, kv_blocks)
    arrivals = _Arrivals(w)
    lookahead = arrivals.frontend.lookahead_steps if arrivals.frontend is not NO_FRONTEND else 0

    def send(count: int, step: int, ms: float = 0.0) -> None:
        first = arrivals.sent
        event = arrivals.add(count, step, ms)
        for kind, n in kinds.runs(first, first + count):
            for _ in range(n):
                planner.waiting.append(_Request(kind, kinds.input[kind], kinds.output[kind], kinds.cached[kind],
                                                event))

    if not timed:
        send(min(w.concurrency, arrivals.total), -1)
    elif closed:
        arrivals.create(np.zeros(min(w.concurrency, arrivals.total)))
    fixed = w.input_length + w.output_length // 2 + 1 if decode_context == "mid" else None
    book, shape_ms = ShapeBook(1), []
    step_shape, step_decode, step_end, finished = [], [], [], []
    clock, left = 0.0, arrivals.total
    while left:
        step = len(step_shape)
        if timed:
            seen = clock
            if not planner.waiting and not planner.running:
                clock = seen = max(clock, arrivals.next_time())
            elif lookahead and step_end:
                seen = step_end[-1] - shape_ms[step_shape[-1]]
            for t in arrivals.due(seen, clock):
                send(1, step - 1, t)
        scheduled = planner.step()
        if not scheduled:
            raise RuntimeError(f"a KV pool of {kv_blocks} blocks cannot hold one request of the workload")
        shape_id, d = _register(book, scheduled, fixed, context_round, _round_context)
        if timed and shape_id == len(shape_ms):
            shape_ms.append(step_ms(book.shape(shape_id)))
        step_shape.append(shape_id)
        step_decode.append(d)
        if timed:
            clock += shape_ms[shape_id]
            step_end.append(clock)
        done = _advance(planner, scheduled, step, finished, phase)
        left -= done
        if closed and done:
            new = arrivals.replacements(done)
            if new and timed:
                arrivals.create(np.full(new, clock + arrivals.frontend.return_ms))
            elif new:
                send(new, step)
    counts = np.ones(len(finished), dtype=np.int64)
    arrival, first, finish, kind = (np.array(col, dtype=np.int64) for col in zip(*finished, strict=True))
    return Plan(w, scheduler, phase, book.table(), np.array(step_shape, dtype=np.int64), counts, first, finish,
                float(planner.peak_blocks * BLOCK_SIZE), arrival, np.array(arrivals.steps, dtype=np.int64),
                np.array(arrivals.steady), np.array(step_decode, dtype=np.int64), kind,
                np.array(arrivals.ms) if timed else None, np.array(step_end) if timed else None,
                arrivals.frontend.return_ms if timed else 0.0, preemptions=planner.preemptions,
                kv_blocks=kv_blocks)


def _check(w, scheduler, kv_blocks: int, phase: str) -> None:
    if not isinstance(scheduler, TokenBudget):
        raise ValueError(f"KV-bound admission is modelled for the token-budget policy (vLLM V1's), not "
                         f"{scheduler.name!r}")
    if w.mtp_tokens:
        raise ValueError("KV-bound admission with MTP draft tokens is not modelled")
    if phase != "both":
        raise ValueError(f"KV-bound admission is modelled for an aggregated instance, not phase {phase!r}")
    if not isinstance(kv_blocks, int) or kv_blocks < 1:
        raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")


def _register(book: ShapeBook, scheduled, fixed, context_round: int, round_context) -> tuple[int, int]:
    """The step's shape id and its decode count: prefill entries by (tokens, context after), decodes
    (one token of a request whose prompt and tokens are all in KV) with the mean context after."""
    entries: dict[tuple[int, int], int] = {}
    d = context = 0
    for r, n in scheduled:
        if n == 1 and r.computed == r.tokens - 1 and r.out:
            d += 1
            context += r.tokens
        else:
            key = (n, r.computed + n)
            entries[key] = entries.get(key, 0) + 1
    ctx = 0 if not d else fixed if fixed is not None else round_context(context / d, context_round)
    return book.one(tuple(sorted(entries.items())), d, ctx), d


def _advance(planner: KVBoundPlanner, scheduled, step: int, finished: list, phase: str) -> int:
    """Run the step: tokens computed, a token sampled by every request whose tokens are all in KV;
    the requests done leave (finish records: arrival event, first step, finish step, kind)."""
    done = 0
    for r, n in scheduled:
        r.computed += n
        if r.computed < r.tokens:
            continue  # a chunk of a prefill: nothing sampled
        r.out += 1
        if r.first == -2:
            r.first = step
        if r.out >= r.output:
            planner.finish(r)
            finished.append((r.event, r.first, step, r.kind))
            done += 1
    return done
