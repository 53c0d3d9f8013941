"""Step policies (RFC 3.1.4): which requests run in the next forward step, and with how many tokens.

Every policy answers one question for the timeline loop: given the prefill FIFO (groups of
`(count, done)` requests, `done` = effective prompt tokens already prefilled) and the number of
requests ready to decode, which groups advance by how many tokens, and how many requests decode.
The answer is a `StepPlan`; the loop applies it the same way for every policy (cf. vLLM V1's
single `{request: tokens}` dict). The values a policy sees and returns are slots dataclasses, not
frozen ones: the planner makes them every step, and a frozen one costs 2.5 times as much to make.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np

from latency.checks import check_int, check_number

#: The RFC's mixed-step slack: prefill + decode tokens may reach floor(B * 1.15).
DEFAULT_SLACK_RATIO = 1.15


@dataclass(slots=True)
class SchedulerState:
    """What a count-based policy (RFC 3.1.4) sees: only counts, never latencies.
    `decode_query_len` (not in the RFC) is 1 + MTP draft tokens: what one decode costs of the budget."""

    ready_decode: int
    pending_prefill: int
    chunk_query_len: int
    max_batched_tokens: int
    decode_query_len: int = 1


@dataclass(slots=True)
class StepDecision:
    """How many pending-prefill requests advance one chunk, how many requests decode."""

    p_step: int
    d_step: int


@dataclass(slots=True)
class QueueView:
    """The loop's state as a policy sees it (live: the planner updates it between steps, so a policy
    must not keep it). `prefill` is the FIFO, front first: groups of
    `(count, done, event, kind)` (`done`: prompt tokens prefilled); `effective[kind]` is the prompt
    tokens a request of that kind computes (after its cached prefix)."""

    prefill: Sequence[tuple[int, int, int, int]]
    ready_decode: int
    effective: Sequence[int]
    max_batched_tokens: int
    decode_query_len: int

    def remaining(self, group) -> int:
        """Prompt tokens each request of `group` still has to prefill."""
        return self.effective[group[3]] - group[1]


@dataclass(slots=True)
class StepPlan:
    """`takes`: (FIFO position, requests, tokens each) — at most one entry per (position, tokens);
    `decode`: requests that decode (oldest first)."""

    takes: tuple[tuple[int, int, int], ...]
    decode: int


class Scheduler(ABC):
    """A step policy. `fused`: the step is priced as one forward pass over all its entries;
    otherwise prefill and decode are priced apart and merged by `step_latency`.
    `requeue`: an advanced, unfinished prefill group goes to the back of the FIFO (breadth-first)
    instead of keeping its place (depth-first).

    The planner relies on three properties of `plan_step`: it depends on the view alone (a state seen
    before gets the same answer, so repeated steps and closed-loop periods are copied); with
    nothing waiting to prefill, a policy that decodes every ready request does so for fewer ready
    requests too (the decode tail is played at once); and an answer that takes n requests of a FIFO
    group, not all, is the same for any size of that group above n (a burst's period is copied while
    its fresh group shrinks)."""

    name: str = "scheduler"
    fused: bool = False
    requeue: bool = True

    @abstractmethod
    def plan_step(self, view: QueueView) -> StepPlan: ...

    def step_latency(self, prefill_latency, decode_latency):
        """A step's time from its prefill and decode passes' (numbers, or arrays of them)."""
        return prefill_latency + decode_latency

    def ramp_steps(self, ready: int, takes: int, chunk: int, budget: int, decode_query_len: int,
                   joins: int) -> float:
        """On a ramp this policy's answer decodes all `ready` requests and advances `takes` requests of
        the front FIFO group, larger than `takes`, by a `chunk`-token chunk; `joins` of them (all, or 0
        when the chunk is not their prompt's last) then decode too. How many steps in a row, this one
        included, it answers alike (the same takes, every ready request decoding) as `ready` grows by
        `joins` a step and the front group shrinks by `takes` (a requeueing policy's chunks going to the
        back of the FIFO); `math.inf` for as long as the front group lasts. 1 unless a policy knows:
        the planner then asks it every step."""
        return 1

    def stretch_steps(self, ready: int, takes: int, chunk: int, remaining: int, budget: int,
                      decode_query_len: int) -> float:
        """In a chunk stretch this policy's answer decodes all `ready` requests and advances the whole
        front FIFO group (`takes` requests, each with `remaining` prompt tokens to go) by a `chunk`
        that is not their last, and the group keeps its place. How many steps in a row, this one
        included, it answers alike as the group's prompts advance (nothing else changes). 1 unless a
        policy knows: the planner then asks it every step."""
        return 1

    def round_repeats(self, ready: int, count: int, chunk: int, remaining: int, budget: int,
                      decode_query_len: int) -> float:
        """This requeueing policy just played a round: every request of the lone FIFO group (`count`
        requests, each now with `remaining` prompt tokens to go) advanced by one `chunk`, not its last,
        beside the same `ready` decodes, and the group is whole again. How many more rounds it plays
        step for step alike as the prompts advance. 0 unless a policy knows: the planner then plays
        every round."""
        return 0

    def stream(self, ready: int, front: int, fresh: int, need: int, budget: int, decode_query_len: int, *,
               leaving: Sequence[int] = ()) -> list[tuple[int, int, int, int, int]] | None:
        """A token stream: the FIFO holds at most one started request (`front` prompt tokens to go; 0:
        none) and behind it `fresh` requests of `need` prompt tokens each, of one kind; every prompt
        completed starts decoding after its step, and `leaving[j]` decoding requests finish after step
        j. This policy's answers for the next steps (at most `len(leaving)`) while every ready request,
        one at least, decodes and something is left to prefill, in runs of steps answered alike, each
        as (steps, decodes, the started request's tokens, fresh prompts taken whole, tokens of a fresh
        prompt started); the first is this step's. None unless a policy knows: the planner then asks
        it every step."""
        return None


def chunks_before_last(remaining: int, chunk: int) -> int:
    """Chunks of `chunk` tokens that prompts with `remaining` tokens to go take before their last one."""
    return (remaining - 1) // chunk


class CountScheduler(Scheduler):
    """The RFC's interface: decide (p_step, d_step) from counts. The p_step requests come from the
    run of groups at the FIFO front that wait for the same chunk."""

    @abstractmethod
    def decide(self, state: SchedulerState) -> StepDecision: ...

    def prefill_cap(self, ready_decode: int, chunk: int, max_batched_tokens: int, decode_query_len: int) -> float:
        """The most requests `decide` can ever prefill in this state: the planner counts the pending
        run only that far (a long FIFO would cost a scan per step). Unbounded unless a policy says."""
        return math.inf

    def plan_step(self, view: QueueView) -> StepPlan:
        budget = view.max_batched_tokens
        front = view.prefill
        if front:
            head = front[0]
            chunk = min(budget, view.remaining(head))
            cap = self.prefill_cap(view.ready_decode, chunk, budget, view.decode_query_len)
            done, kind = head[1], head[3]
            run = 0
            pending = 0
            while run < len(front) and pending < cap:
                group = front[run]
                if group[1] != done or (group[3] != kind and min(budget, view.remaining(group)) != chunk):
                    break
                pending += group[0]
                run += 1
        else:
            pending, chunk, run = 0, budget, 0
        state = SchedulerState(view.ready_decode, pending, chunk, budget, view.decode_query_len)
        decision = self.decide(state)
        p, d = decision.p_step, decision.d_step
        if not (0 <= p <= pending and 0 <= d <= view.ready_decode):
            raise ValueError(
                f"{self.name} decided p_step={p}, d_step={d} with pending_prefill={pending}, "
                f"ready_decode={view.ready_decode}"
            )
        takes = []
        for pos in range(run):
            if p == 0:
                break
            n = min(p, front[pos][0])
            takes.append((pos, n, chunk))
            p -= n
        return StepPlan(tuple(takes), d)


@dataclass(frozen=True)
class DecodeFirstWithSlack(CountScheduler):
    """RFC default: every ready request decodes (up to B tokens), then as many pending requests prefill
    their next chunk as fit in floor(B * slack_ratio) - d_step tokens; the step costs the max of
    the prefill and decode passes (they overlap)."""

    slack_ratio: float = DEFAULT_SLACK_RATIO
    name: str = "decode-first"

    def __post_init__(self) -> None:
        check_number("slack_ratio", self.slack_ratio, low=1)

    def decide(self, state: SchedulerState) -> StepDecision:
        d_step, fit = self._step(state.ready_decode, state.chunk_query_len, state.max_batched_tokens,
                                 state.decode_query_len)
        return StepDecision(p_step=max(0, min(state.pending_prefill, fit)), d_step=d_step)

    def prefill_cap(self, ready_decode: int, chunk: int, max_batched_tokens: int, decode_query_len: int) -> float:
        return max(0, self._step(ready_decode, chunk, max_batched_tokens, decode_query_len)[1])

    def ramp_steps(self, ready: int, takes: int, chunk: int, budget: int, decode_query_len: int,
                   joins: int) -> float:
        """`_step` read backwards: with more requests waiting than `takes` = the chunks that fit, the
        answer holds while every ready request fits the budget and `takes` chunks still fit beside
        them (the fit only falls as the decodes grow; with none joining it never changes). A subclass
        deciding otherwise is asked every step."""
        if not self._decides_as_written():
            return 1
        if not joins:
            return math.inf
        spare = self._room(ready, budget, decode_query_len) - takes * chunk  # tokens beyond the chunks taken
        fit = budget // decode_query_len - ready  # decodes the budget holds beyond the ready ones
        return 1 + max(0, min(spare // (joins * decode_query_len), fit // joins))

    def stretch_steps(self, ready: int, takes: int, chunk: int, remaining: int, budget: int,
                      decode_query_len: int) -> float:
        """The chunk is the whole budget while more than it remains, and the fit beside the same
        decodes does not change: alike up to the last chunk."""
        if not self._decides_as_written():
            return 1
        return max(1, chunks_before_last(remaining, chunk))

    def round_repeats(self, ready: int, count: int, chunk: int, remaining: int, budget: int,
                      decode_query_len: int) -> float:
        """A round's view differs from the last one's only in how far the prompts are, and the chunk
        is the whole budget until the last: the rounds are alike up to the one taking it."""
        if not self._decides_as_written():
            return 0
        return chunks_before_last(remaining, chunk)

    def stream(self, ready: int, front: int, fresh: int, need: int, budget: int, decode_query_len: int, *,
               leaving: Sequence[int] = ()) -> list[tuple[int, int, int, int, int]] | None:
        """`_step` on a stream of whole prompts: every ready request decodes, then as many fresh prompts
        as fit beside them, until none fits. A started request or a prompt longer than the budget goes
        in chunks, round the FIFO: no stream."""
        if not self._decides_as_written():
            return None
        runs = []
        if front or need > budget:
            return runs
        for left in leaving:  # written for speed: a stream is thousands of steps
            if not ready or ready * decode_query_len > budget or not fresh:
                break
            whole = self._room(ready, budget, decode_query_len) // need  # `_step`, every ready one decoding
            if whole > fresh:
                whole = fresh
            if whole <= 0:
                break
            runs.append((1, ready, 0, whole, 0))
            fresh -= whole
            ready += whole - left
        return runs

    def _decides_as_written(self) -> bool:
        """Whether `decide` is this class's own: a subclass deciding otherwise is asked every step."""
        return type(self).decide is DecodeFirstWithSlack.decide and type(self)._step is DecodeFirstWithSlack._step

    def _step(self, ready: int, chunk: int, budget: int, qlen: int) -> tuple[int, int]:
        """(decodes, chunks that fit beside them): every ready request decodes up to the budget, then
        chunks fill floor(B * slack)."""
        d_step = min(ready, budget // qlen)
        return d_step, self._room(d_step, budget, qlen) // chunk

    def _room(self, decodes: int, budget: int, qlen: int) -> int:
        """Tokens left for prefill chunks in a step of `decodes` decodes: floor(B * slack) minus theirs."""
        return math.floor(budget * self.slack_ratio) - decodes * qlen

    def step_latency(self, prefill_latency, decode_latency):
        return np.maximum(prefill_latency, decode_latency)


@dataclass(frozen=True)
class TokenBudget(Scheduler):
    """vLLM V1: budget B per step; running decodes first (1 + MTP tokens each), then prefills in
    FIFO order (started ones first, depth-first), each cut to min(need, budget left, threshold).
    At most `max_num_seqs` requests run at once. The step is one fused forward pass."""

    max_num_seqs: int | None = None
    long_prefill_token_threshold: int | None = None  # None or 0 (vLLM's "off"): no cap
    name: str = "token-budget"
    fused: bool = True
    requeue: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs is not None:
            check_int("max_num_seqs", self.max_num_seqs)
        if self.long_prefill_token_threshold is not None:
            check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, low=0)

    def plan_step(self, view: QueueView) -> StepPlan:
        budget, qlen, ready, prefill = view.max_batched_tokens, view.decode_query_len, view.ready_decode, view.prefill
        seqs = self.max_num_seqs if self.max_num_seqs is not None else math.inf
        decode = min(ready, budget // qlen, seqs)
        if not prefill:
            return StepPlan((), decode)
        budget -= decode * qlen
        started = 0  # started requests keep their place at the FIFO front (depth-first)
        for group in prefill:
            if not group[1]:
                break
            started += group[0]
        slots = seqs - ready - started
        cap = self.long_prefill_token_threshold or budget
        effective = view.effective
        takes = []
        for pos, (count, done, _, kind) in enumerate(prefill):
            if budget <= 0:
                break
            if done == 0:  # waiting requests: only as many as there are free slots are admitted
                if count > slots:
                    count = int(slots)
                if count <= 0:
                    break
            need = min(effective[kind] - done, cap)
            full = min(count, budget // need)
            if full:
                takes.append((pos, full, need))
                budget -= full * need
            taken = full
            if full < count and budget > 0:
                takes.append((pos, 1, budget))
                budget = 0
                taken += 1
            if done == 0:
                slots -= taken
        return StepPlan(tuple(takes), decode)

    def stream(self, ready: int, front: int, fresh: int, need: int, budget: int, decode_query_len: int, *,
               leaving: Sequence[int] = ()) -> list[tuple[int, int, int, int, int]] | None:
        """`plan_step` on a token stream, without a view: what the decodes leave of the budget goes to
        the started request, then to whole fresh prompts, then to a part of the next one (which is
        then the started request). Without a cap on running requests or prefill chunks only."""
        if (type(self).plan_step is not TokenBudget.plan_step or self.max_num_seqs is not None
                or self.long_prefill_token_threshold):
            return None
        runs = []
        ends = list(compress(range(len(leaving)), leaving))  # steps after which requests finish
        ends.append(len(leaving) - 1)
        j = end = 0
        while j < len(leaving):
            spare = budget - ready * decode_query_len
            if not ready or spare <= 0 or not (front or fresh):
                break
            while ends[end] < j:
                end += 1
            if front > spare:  # the started request takes it all and is not done: alike until it is, or a finish
                steps = min((front - 1) // spare, ends[end] - j + 1)
                runs.append((steps, ready, spare, 0, 0))
                front -= steps * spare
                j += steps
                ready -= leaving[j - 1]
                continue
            took = front
            spare -= took
            whole = min(spare // need, fresh)
            spare -= whole * need
            fresh -= whole
            part = spare if fresh and spare else 0
            front = 0
            if part:
                fresh -= 1
                front = need - part
            runs.append((1, ready, took, whole, part))
            ready += whole + (1 if took else 0) - leaving[j]
            j += 1
        return runs

    def stretch_steps(self, ready: int, takes: int, chunk: int, remaining: int, budget: int,
                      decode_query_len: int) -> float:
        """With the decodes and the requests behind unchanged, the started request's chunk is what its
        need leaves of the budget until its need fits: alike up to the last chunk."""
        if type(self).plan_step is not TokenBudget.plan_step:
            return 1
        return max(1, chunks_before_last(remaining, chunk))


@dataclass(frozen=True)
class PrefillFirst(Scheduler):
    """SGLang's default: while a request waits to prefill, the step is a prefill batch of up to B
    tokens (started requests first, then whole prompts in FIFO order, the last one cut to what is
    left: `chunked_prefill_size`) and nobody decodes; otherwise every ready request decodes. A step
    never mixes the two (SGLang without --enable-mixed-chunk). One fused pass."""

    name: str = "prefill-first"
    fused: bool = True
    requeue: bool = False

    def plan_step(self, view: QueueView) -> StepPlan:
        if not view.prefill:
            return StepPlan((), view.ready_decode)
        budget = view.max_batched_tokens
        takes = []
        for pos, group in enumerate(view.prefill):
            need = view.remaining(group)
            full = min(group[0], budget // need)
            if full:
                takes.append((pos, full, need))
                budget -= full * need
            if full < group[0]:
                if budget > 0:
                    takes.append((pos, 1, budget))
                break
        return StepPlan(tuple(takes), 0)


#: the RFC's policy: what a step policy is when no engine names its own
DEFAULT_SCHEDULER = DecodeFirstWithSlack.name

SCHEDULERS: dict[str, type[Scheduler]] = {
    "decode-first": DecodeFirstWithSlack,
    "token-budget": TokenBudget,
    "prefill-first": PrefillFirst,
}


def make_scheduler(name: str, **options) -> Scheduler:
    """A registered policy by name, e.g. make_scheduler("token-budget", max_num_seqs=256)."""
    try:
        cls = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(SCHEDULERS)}") from None
    return cls(**options)
