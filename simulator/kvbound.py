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

With `workload.kv_admission` "guaranteed-no-evict" (TensorRT-LLM's default capacity scheduler) a waiting
request is admitted only when the blocks of its prompt and every token it may generate fit beside those
every running request may reach (their sum, `reserved`, never passes the pool): a running request's next
block is always free, so step 1 never preempts. With "new-token-ratio" (SGLang's) it is admitted only when
its prompt's tokens still to compute and every token it may generate (at most CLIP_NEW_TOKENS) are fewer than
the free blocks' tokens less SGLang's new-token ratio of the tokens the running requests have left to generate
(`to_generate`; the ratio `NewTokenRatio`, NEW_TOKEN_SHARE once warm, set higher by a preemption and lowered by
each decode step after it) and less the outputs of those admitted in the step before it; step 1 may still
preempt.

The group timeline (`simulator.timeline`) cannot express this (a request's progress depends on
blocks, not only on counts), so a KV-bound workload is planned here, one request at a time, into
the same `Plan`: each step's unbroken run of decoding requests at the head of the running list kept as
one (`Decoders`), pure decode stretches fast-forwarded (`DecodeRun`); both switchable. The token-budget
policy is modelled, and SGLang's prefill-first (a step is a prefill batch of the started prompts and then
the requests admitted, nobody decoding; with none, every running request decodes); not decode-first (the
RFC's window policy, which has no admission rule), and one decode token per step (no MTP).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from itertools import islice

import numpy as np

from simulator.arrivals import Arrivals
from simulator.blocks import BLOCK_SIZE, CLIP_NEW_TOKENS, NEW_TOKEN_RATIO, NO_EVICT, NewTokenRatio
from simulator.plans import Plan
from simulator.planstate import round_context
from simulator.scheduler import PrefillFirst, TokenBudget
from simulator.shapebook import ShapeBook

__all__ = ["DecodeRun", "Decoders", "KVBoundPlanner", "plan_kv_bound"]
#: blocks of the pool no request can hold: vLLM's block pool keeps one as its null block
NULL_BLOCKS = 1


class _Request:
    __slots__ = ("blocks", "cached", "computed", "event", "first", "kind", "out", "output", "prompt", "seat", "t0")

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

    def __init__(self, w, scheduler: TokenBudget, kv_blocks: int, decoders: Decoders | None = None):
        self.w, self.scheduler = w, scheduler
        self.free = self.pool = kv_blocks - NULL_BLOCKS
        self.running: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        self.preemptions = 0
        self.peak_blocks = 0
        self.no_evict = w.kv_admission == NO_EVICT
        self.reserved = 0  # guaranteed-no-evict: the blocks the running requests may reach
        self.share = NewTokenRatio() if w.kv_admission == NEW_TOKEN_RATIO else None
        self.to_generate = 0  # new-token-ratio: the tokens the running requests have left to generate
        self.decoders = decoders or Decoders()
        self.prefill_first = isinstance(scheduler, PrefillFirst)

    def step(self) -> tuple[int, list[tuple[_Request, int]]]:
        """(decoders of the head run, the (request, tokens) of the others) of one step, in the order the
        scheduler assigns them: the head's decoders (`Decoders`) take a token each when all of them do."""
        if self.prefill_first:
            return self._prefill_first_step()
        budget = self.w.max_batched_tokens
        cap = self.scheduler.long_prefill_token_threshold or budget
        before = self.preemptions
        head = self.decoders.schedule(self, budget)
        scheduled, budget = self._schedule(islice(self.running, head, None), budget - head, cap)
        self._admit(scheduled, budget, cap, self.preemptions > before)
        return head, scheduled

    def _prefill_first_step(self) -> tuple[int, list[tuple[_Request, int]]]:
        """SGLang's default step: a prefill batch of the started prompts and then the requests admitted, up to
        the budget, nobody decoding; where there is none, every running request decodes."""
        budget, before = self.w.max_batched_tokens, self.preemptions
        started = (r for r in islice(self.running, self.decoders.size, None)  # not decoding: prompt (or recompute)
                   if r.out == 0 or r.computed < r.tokens - 1)  # left; lazily, past what a preemption pops
        scheduled, budget = self._schedule(started, budget, budget)
        self._admit(scheduled, budget, budget, self.preemptions > before)
        if scheduled:
            return 0, scheduled
        head = self.decoders.schedule(self, math.inf)
        scheduled, _ = self._schedule(islice(self.running, head, None), math.inf, math.inf)
        return head, scheduled

    def _schedule(self, requests, budget, cap) -> tuple[list[tuple[_Request, int]], int]:
        """Each running request of `requests` in turn gets min(what it needs, `cap`, the budget left), its blocks
        taken (preempting the newest where they do not fit); returns (the scheduled, the budget left)."""
        scheduled, free = [], self.free
        for r in requests:  # per request per step; the list's iterator sees a preemption pop its end
            if budget <= 0:
                break
            n = r.prompt + r.out - r.computed
            if n > cap:
                n = cap
            if n > budget:
                n = budget
            need = (r.computed + n + BLOCK_SIZE - 1) // BLOCK_SIZE - r.blocks
            if need <= free:
                free -= need
                r.blocks += need
            else:
                self.free = free
                fitted = self._fit(r, r.computed + n)
                free = self.free
                if not fitted:
                    break
            scheduled.append((r, n))
            budget -= n
        self.free = free
        return scheduled, budget

    def _admit(self, scheduled: list, budget, cap, preempted: bool) -> None:
        """Waiting requests in FIFO order, while the budget lasts, seats are free and each fits by the
        admission rule (none after a preemption), each given min(its prompt left, `cap`, the budget left)."""
        seats = getattr(self.scheduler, "max_num_seqs", None) or math.inf
        promised = 0  # new-token-ratio: the outputs of the requests this step admitted
        share = self.share.value if self.share is not None else 0.0
        while not preempted and self.waiting and budget > 0 and len(self.running) < seats:
            r = self.waiting[0]
            n = min(r.tokens - r.computed, cap, budget)
            if self.no_evict:  # its KV to the last token must fit beside the running requests' own
                whole = blocks_for(r.prompt + r.output)
                if self.reserved + whole > self.pool:
                    break
                self.reserved += whole
            elif self.share is not None:  # its prompt and output beside a share of what the running have left
                output = min(r.output - r.out, CLIP_NEW_TOKENS)
                if r.tokens - r.computed + output >= (self.free * BLOCK_SIZE - share * self.to_generate - promised):
                    break
                promised += output if n == r.tokens - r.computed else 0  # a cut prompt's output: at its last chunk
                self.to_generate += r.output - r.out
            elif blocks_for(r.tokens) - r.blocks > self.free:  # the whole prompt must fit to be admitted
                break
            self.waiting.popleft()
            self.running.append(r)
            self._take(r, r.computed + n)
            scheduled.append((r, n))
            budget -= n
        self.peak_blocks = max(self.peak_blocks, self.pool - self.free)

    def decoded(self, steps: int, retracted: bool) -> None:
        """New-token-ratio: after a step that retracted (preempted), the share SGLang sets from the requests kept;
        else `steps` decode steps lower it (0 for a step that computed prompt tokens)."""
        if self.share is None:
            return
        if retracted:
            may = sum(r.output for r in self.running)
            self.share.retracted(may - self.to_generate, may, len(self.running))
        else:
            self.share.steps += steps

    def _fit(self, r: _Request, tokens: int) -> bool:
        """Give `r` the blocks of `tokens`, preempting the newest running requests until they fit;
        False when `r` had to be preempted itself."""
        while blocks_for(tokens) - r.blocks > self.free:
            if self.preempt_last() is r:
                return False
        self._take(r, tokens)
        return True

    def preempt_last(self) -> _Request:
        """Preempt the newest running request: its blocks freed, back to the front of the waiting queue."""
        victim = self.running.pop()
        self.free += victim.blocks
        self.to_generate -= victim.output - victim.out
        victim.blocks, victim.computed = 0, victim.cached
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def _take(self, r: _Request, tokens: int) -> None:
        need = blocks_for(tokens) - r.blocks
        self.free -= need
        r.blocks += need

    def finish(self, r: _Request) -> None:
        """`r` done: out of the running list (and the head's decoders), its blocks freed."""
        self.running.remove(r)
        self.free += r.blocks
        r.blocks = 0
        if self.no_evict:
            self.reserved -= blocks_for(r.prompt + r.output)


class Decoders:
    """Fast path for the unbroken run of decoding requests at the head of the running list (each holds its
    prompt and every sampled token but the last in KV, so it takes one token a step). Claim: such a request
    takes one token in the next step too while the budget covers the whole run, until it finishes. Where the
    run needs more blocks than are free, its first request that does not fit preempts from the tail: first
    the requests behind the run (they take no token before), then the run's own from its end, until what is
    left of the run fits; a request behind the run that does not fit preempts from the tail back to itself.
    The run's progress is kept as one step count (`tick`) less each request's count when it joined (`t0`),
    so a step costs it a few operations, not one per request: the blocks it needs by the residues of its
    requests' tokens, its summed context, its finishes from a heap (a preempted request's entry left stale,
    known by its `seat`). A step whose budget does not cover the run, and a decode run over part of the
    running list, settle it first: each request's own numbers written back. `enabled = False` plays every
    request."""

    enabled = True

    def __init__(self):
        self.size = self.tick = self.joined = 0
        self.residues = [0] * BLOCK_SIZE  # requests whose (tokens computed - t0) % BLOCK_SIZE is the index
        self.base = 0                      # sum of prompt + out - t0: their tokens sum to base + size * tick
        self.ends: list[tuple[int, int, _Request]] = []  # (tick of the step it finishes in, join order, request)

    def schedule(self, planner: KVBoundPlanner, budget: int) -> int:
        """The head's decoders this step (0: none, or they are settled to be played one by one), their
        blocks taken."""
        if not self.size:
            return 0
        if budget < self.size:
            self.settle(planner)
            return 0
        need = self.residues[-self.tick % BLOCK_SIZE]  # those whose next token opens a block
        while need > planner.free and len(planner.running) > self.size:
            planner.preempt_last()  # the run's first request that does not fit preempts from the tail
        while need > planner.free:  # then from the run's own end
            self._leave(planner.running[-1])
            planner.preempt_last()
            need = self.residues[-self.tick % BLOCK_SIZE]
        planner.free -= need
        return self.size

    def run(self, planner: KVBoundPlanner, step: int, finished: list) -> tuple[int, int]:
        """The head's step: a token sampled by each, those done leave (in running order). Returns (their
        summed context, requests done)."""
        context = self.base + self.size * self.tick  # prompt and sampled tokens, as _run counts a decode's
        done = []
        while self._next_end() == self.tick:  # ties leave in seat order: the running list's
            done.append(heapq.heappop(self.ends))
        self.tick += 1
        for _, _, r in done:
            self._leave(r)
            planner.finish(r)
            finished.append((r.event, r.first, step, r.kind))
        return context, len(done)

    def extend(self, planner: KVBoundPlanner) -> None:
        """Take in the decoding requests that now follow the head run."""
        if not self.enabled:
            return
        running = planner.running
        while self.size < len(running):
            r = running[self.size]
            if r.out == 0 or r.computed != r.prompt + r.out - 1:
                return
            r.t0, r.seat = self.tick, self.joined
            self.residues[(r.computed - r.t0) % BLOCK_SIZE] += 1
            self.base += r.prompt + r.out - r.t0
            heapq.heappush(self.ends, (r.t0 + r.output - r.out - 1, r.seat, r))
            self.joined += 1
            self.size += 1

    def settle(self, planner: KVBoundPlanner) -> None:
        """Write each head request's own numbers back (blocks: those its computed tokens fill) and empty the head."""
        for r in planner.running[:self.size]:
            self._write_back(r)
        self.size = self.base = 0
        self.residues = [0] * BLOCK_SIZE
        self.ends = []

    def covers(self, planner: KVBoundPlanner) -> bool:
        """Whether every running request is in the head run."""
        return 0 < self.size == len(planner.running)

    def summary(self, planner: KVBoundPlanner) -> tuple[int, int, np.ndarray, int]:
        """What DecodeRun asks of the running requests when the head run covers them, from its counts:
        (their tokens summed, the blocks their tokens fill, how many hold c tokens computed with c % B = q for
        each q, the steps before the first finishes)."""
        by_residue = self._by_residue()
        filled = planner.pool - planner.free + int(by_residue[0])  # a request whose next token opens a block
        return self.base + self.size * self.tick, filled, by_residue, self._next_end() - self.tick

    def advance(self, planner: KVBoundPlanner, k: int) -> None:
        """k decode steps of the whole head run (no one finishes in them), their new blocks taken."""
        blocks = sum(n * (-(-(q + k) // BLOCK_SIZE) - (q > 0)) for q, n in enumerate(self._by_residue()) if n)
        self.tick += k
        planner.free -= blocks

    def _by_residue(self) -> list[int]:
        """How many head requests hold c tokens computed with c % BLOCK_SIZE = q, for each q."""
        return [self.residues[(q - self.tick) % BLOCK_SIZE] for q in range(BLOCK_SIZE)]

    def _next_end(self) -> int | None:
        """The tick of the run's next finish (entries of requests preempted from it dropped)."""
        while self.ends and self.ends[0][2].seat != self.ends[0][1]:
            heapq.heappop(self.ends)
        return self.ends[0][0] if self.ends else None

    def _leave(self, r: _Request) -> None:
        """`r` leaves the head (it finished or is preempted): its shares out, its heap entry stale, its own
        numbers written back."""
        self.residues[(r.computed - r.t0) % BLOCK_SIZE] -= 1
        self.base -= r.prompt + r.out - r.t0
        r.seat = -1
        self._write_back(r)
        self.size -= 1

    def _write_back(self, r: _Request) -> None:
        """A head request's own numbers at this tick (blocks: those its computed tokens fill)."""
        moved = self.tick - r.t0
        r.computed += moved
        r.out += moved
        r.blocks = blocks_for(r.computed)


class DecodeRun:
    """Fast-forward over pure decode steps. Claim: a step in which every running request decoded
    and nobody was preempted, admitted or finished is followed by the same step, one token further,
    while nobody finishes, the running requests' blocks fit the pool (free blocks only shrink then,
    so a waiting request that did not fit still does not; under new-token-ratio admission, where the
    share held for the running requests shrinks too, only while nobody waits), the decode key's rounded
    mean context holds and (timed) no request reaches the scheduler (behind a front end that streams at
    a cost, whose backlog moves the next arrival step by step, asked before each step). `enabled = False`
    plays every step."""

    enabled = True

    def steps(self, planner: KVBoundPlanner, d: int, ctx: int, fixed, round_to: int) -> int:
        """How many such steps follow (0: none)."""
        running = planner.running
        R = len(running)
        if not self.enabled or d != R or not R or (planner.share is not None and planner.waiting):
            return 0  # (new-token-ratio: what the running have left shrinks each step, so a waiting request may fit)
        if planner.decoders.covers(planner):
            total, filled, by_residue, finish = planner.decoders.summary(planner)
        else:
            tokens = np.fromiter((r.tokens for r in running), dtype=np.int64, count=R)
            total, (filled, by_residue) = int(tokens.sum()), _filled(tokens)
            finish = min(r.output - r.out for r in running) - 1
        if finish <= 0:  # before the pool's count, which costs a few numpy calls
            return 0
        return max(0, min(finish, _fitting(R, filled, by_residue, planner.pool),
                          math.inf if fixed is not None else _same_context(total, R, ctx, round_to)))


def _fitting_steps(tokens: np.ndarray, pool: int) -> int:
    """The first j >= 0 at which requests of `tokens` tokens, each j further, need more than `pool` blocks."""
    return _fitting(len(tokens), *_filled(tokens), pool)


def _filled(tokens: np.ndarray) -> tuple[int, np.ndarray]:
    """(the blocks requests of `tokens` tokens fill, how many of them have (t + B - 1) % B = a, for each a)."""
    q, a = np.divmod(tokens + BLOCK_SIZE - 1, BLOCK_SIZE)
    return int(q.sum()), np.bincount(a, minlength=BLOCK_SIZE)


def _fitting(R: int, filled: int, by_residue: np.ndarray, pool: int) -> int:
    """`_fitting_steps` of R requests whose tokens fill `filled` blocks, by_residue[a] of them with
    (t + B - 1) % B = a: sum ceil((t + j) / B) = filled + R m + #{a >= B - s} for j = B m + s."""
    counts, over, first = [int(n) for n in by_residue], 0, math.inf  # over: #{a >= B - s}
    for s in range(BLOCK_SIZE):  # sixteen integers: a loop costs less than numpy's calls
        first = min(first, BLOCK_SIZE * max(0, (pool - filled - over) // R + 1) + s)
        over += counts[BLOCK_SIZE - 1 - s]
    return first


def _same_context(total: int, R: int, ctx: int, round_to: int) -> int:
    """Steps j >= 0 whose decode context (total + R j) / R rounds to `ctx` (the key grows with j)."""
    def same(j: int) -> bool:
        return round_context((total + R * j) / R, round_to) == ctx

    if not same(0):
        return 0
    j = max(0, int(ctx - total / R))
    while j > 0 and not same(j):
        j -= 1
    while same(j + 1):
        j += 1
    return j + 1


class _KVPlan:
    """One KV-bound plan being made: the planner, the arrivals, the steps and their shapes, the clock."""

    def __init__(self, w, scheduler, kv_blocks: int, step_ms, decode_context: str, context_round: int, *,
                 run: DecodeRun | None = None, decoders: Decoders | None = None):
        self.w, self.step_ms, self.run, self.round_context = w, step_ms, run or DecodeRun(), round_context
        self.planner = KVBoundPlanner(w, scheduler, kv_blocks, decoders)
        self.arrivals = Arrivals(w)
        self.timed = w.timed
        self.fixed = w.input_length + w.output_length // 2 + 1 if decode_context == "mid" else None
        self.round_to = context_round
        self.book, self.shape_ms = ShapeBook(1), []
        self.step_shape, self.step_decode, self.step_end, self.finished = [], [], [], []
        self.clock = 0.0

    def send(self, count: int, step: int, ms: float = 0.0) -> None:
        a, kinds = self.arrivals, self.w.kinds
        first = a.sent
        event = a.add(count, step, ms)
        for kind, n in kinds.runs(first, first + count):
            for _ in range(n):
                self.planner.waiting.append(_Request(kind, kinds.input[kind], kinds.output[kind],
                                                     kinds.cached[kind], event))

    def arrive(self, step: int) -> None:
        """Timed: hand the scheduler what reached it (jumping the clock when the engine is idle)."""
        for t in self._reached(not self.planner.waiting and not self.planner.running):
            self.send(1, step - 1, t)

    def _reached(self, idle: bool) -> list[float]:
        """Timed: the send times of the requests that reached the scheduler by the step about to start (the clock
        moved as `Arrivals.arrived` moves it)."""
        last_start = self.step_end[-1] - self.shape_ms[self.step_shape[-1]] if self.step_end else None
        self.clock, due = self.arrivals.arrived(self.clock, idle, last_start)
        return due

    def play(self) -> int:
        """One step (and the decode run after it); returns the requests that finished."""
        step, before = len(self.step_shape), self.planner.preemptions
        head, scheduled = self.planner.step()
        if not head and not scheduled:
            raise RuntimeError(f"a KV pool of {self.planner.pool + NULL_BLOCKS} blocks cannot hold one request "
                               "of the workload")
        decoders = self.planner.decoders
        head_context, head_done = decoders.run(self.planner, step, self.finished) if head else (0, 0)
        entries, d, context, sampled, done = _run(self.planner, scheduled, step, self.finished)
        d, context, sampled, done = d + head, context + head_context, sampled + head, done + head_done
        self.planner.to_generate -= sampled
        self.planner.decoded(int(head + len(scheduled) == d), self.planner.preemptions > before)
        decoders.extend(self.planner)
        ctx = 0 if not d else self.fixed if self.fixed is not None else self.round_context(context / d, self.round_to)
        shape_id = self.book.one(tuple(sorted(entries.items())), d, ctx)
        self._record(shape_id, d, 1, sampled if self.arrivals.streams else 0)
        if not done and self.planner.preemptions == before and head + len(scheduled) == d:
            self._decode_run(shape_id, d, ctx)
        return done

    def _decode_run(self, shape_id: int, d: int, ctx: int) -> None:
        k = self.run.steps(self.planner, d, ctx, self.fixed, self.round_to)
        if k <= 0:
            return
        if self.timed and self.arrivals.streams:  # asked before each step; the steps taken are recorded
            k = self._streamed_before_arrival(shape_id, d, k)
        else:
            k = self._before_arrival(k) if self.timed else k
            self._record(shape_id, d, k, d)
        if k <= 0:
            return
        planner = self.planner
        planner.to_generate -= d * k
        planner.decoded(k, False)
        if planner.decoders.covers(planner):
            planner.decoders.advance(planner, k)
        else:  # Decoders off: with it on, every request of an all-decode step joins its head run
            for r in planner.running:
                r.computed += k
                r.out += k
                planner._take(r, r.computed)
        planner.peak_blocks = max(planner.peak_blocks, planner.pool - planner.free)

    def _streamed_before_arrival(self, shape_id: int, d: int, k: int) -> int:
        """Of k steps behind a front end that streams at a cost, those that start before a request reaches the
        scheduler, recorded: asked before each step as the loop asks (`arrive`; the chunks of the steps before
        hold back the requests behind them), without planning the step."""
        for j in range(k):
            if self._reached(idle=False):
                return j
            self._record(shape_id, d, 1, d)
        return k

    def _before_arrival(self, k: int) -> int:
        """Of k steps, those that start before the next request reaches the scheduler."""
        nxt = self.arrivals.next_time()
        if nxt is None:
            return k
        dur = self.shape_ms[self.step_shape[-1]]
        for j in range(k):
            start = self.clock + j * dur
            if nxt <= (start - dur if self.arrivals.frontend.lookahead_steps else start):
                return j
        return k

    def _record(self, shape_id: int, d: int, k: int, chunks: int) -> None:
        """k steps of one shape, each with `d` decodes and `chunks` requests that got a token."""
        if self.timed and shape_id == len(self.shape_ms):
            self.shape_ms.append(self.step_ms(self.book.shape(shape_id)))
        self.step_shape.extend([shape_id] * k)
        self.step_decode.extend([d] * k)
        if self.timed:
            for _ in range(k):
                self.clock += self.shape_ms[shape_id]
                self.step_end.append(self.clock)
                if self.arrivals.streams:
                    self.arrivals.stream(self.clock, chunks)

    def replace(self, done: int) -> None:
        """Closed loop: the client replaces the requests that finished."""
        a = self.arrivals
        new = a.replacements(done)
        if new and self.timed:
            a.create_at(a.tokens_at(self.clock), new)  # the client has the last token
        elif new:
            self.send(new, len(self.step_shape) - 1)


def plan_kv_bound(w, scheduler, kv_blocks: int, *, phase: str = "both", decode_context: str = "mean",
                  context_round: int = 128, step_ms=None, run: DecodeRun | None = None,
                  decoders: Decoders | None = None):
    """Plan `w` under `scheduler` (token-budget) with a KV pool of `kv_blocks` blocks; a `Plan` like
    `simulator.timeline.plan`'s, with its `preemptions` and `kv_blocks` set. `run` is the decode-run
    fast-forward (DecodeRun(); one with enabled False plays every step), `decoders` the head run of
    decoding requests kept as one (Decoders(); one with enabled False plays every request)."""
    _check(w, scheduler, kv_blocks, phase)
    if w.timed and step_ms is None:
        raise ValueError("a timed workload is planned with its prices: pass step_ms")
    k = _KVPlan(w, scheduler, kv_blocks, step_ms, decode_context, context_round, run=run, decoders=decoders)
    a, closed = k.arrivals, w.arrival == "closed"
    if not k.timed:
        k.send(min(w.concurrency, a.total), -1)
    elif closed:
        a.create_at(0.0, min(w.concurrency, a.total))
    left = a.total
    while left:
        if k.timed:
            k.arrive(len(k.step_shape))
        done = k.play()
        left -= done
        if closed and done:
            k.replace(done)
    counts = np.ones(len(k.finished), dtype=np.int64)
    arrival, first, finish, kind = (np.array(col, dtype=np.int64) for col in zip(*k.finished, strict=True))
    timed = k.timed
    return Plan(w, scheduler, phase, k.book.table(), np.array(k.step_shape, dtype=np.int64), counts, first, finish,
                float(k.planner.peak_blocks * BLOCK_SIZE), arrival, np.array(a.steps, dtype=np.int64),
                np.array(a.steady), np.array(k.step_decode, dtype=np.int64), kind,
                np.array(a.ms) if timed else None, np.array(k.step_end) if timed else None,
                a.frontend.return_ms if timed else 0.0, a.delivered_ms() if timed else None,
                preemptions=k.planner.preemptions, kv_blocks=kv_blocks)


def _check(w, scheduler, kv_blocks: int, phase: str) -> None:
    if not isinstance(scheduler, (TokenBudget, PrefillFirst)):
        raise ValueError(f"KV-bound admission is modelled for the token-budget (vLLM V1's) and prefill-first "
                         f"(SGLang's) policies, not {scheduler.name!r}")
    if w.mtp_tokens:
        raise ValueError("KV-bound admission with MTP draft tokens is not modelled")
    if phase != "both":
        raise ValueError(f"KV-bound admission is modelled for an aggregated instance, not phase {phase!r}")
    if not isinstance(kv_blocks, int) or kv_blocks < 1:
        raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")


def _run(planner: KVBoundPlanner, scheduled, step: int, finished: list) -> tuple[dict, int, int, int, int]:
    """Run the step in one pass: each request's entry in the step's shape as scheduled (a prefill chunk by
    (tokens, context after); a decode, one token of a request whose prompt and tokens are all in KV, by its
    context), its tokens computed, a token sampled by every request whose tokens are then all in KV, and the
    requests done leave (finish records: arrival event, first step, finish step, kind). Returns (prefill
    entries, decodes, their summed context, requests sampled, requests done)."""
    entries: dict[tuple[int, int], int] = {}
    d = context = sampled = done = 0
    for r, n in scheduled:
        tokens, computed = r.prompt + r.out, r.computed
        if n == 1 and computed == tokens - 1 and r.out:
            d += 1
            context += tokens
        else:
            key = (n, computed + n)
            entries[key] = entries.get(key, 0) + 1
        r.computed = computed = computed + n
        if computed < tokens:
            continue  # a chunk of a prefill: nothing sampled
        sampled += 1
        r.out += 1
        if r.first == -2:
            r.first = step
        if r.out >= r.output:
            planner.finish(r)
            finished.append((r.event, r.first, step, r.kind))
            done += 1
    return entries, d, context, sampled, done
