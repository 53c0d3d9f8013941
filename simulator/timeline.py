"""The chunked-prefill timeline on request groups, phase one: plan the schedule without latencies.

Decisions depend only on counts, so the whole schedule is planned first. The plan names every
distinct step shape; pricing them is ONE batched call (`simulator.pricing`), and `replay` turns
the prices into times. A group is `count` identical requests: in the prefill FIFO `(count, done)`,
in decode `[count, end_tick, first_step]`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from latency.keys import ForwardKey, StepShape
from simulator.scheduler import DecodeFirstWithSlack, QueueView, Scheduler
from simulator.workload import Workload

#: The decode key's context is the decoding requests' mean context rounded up to this many tokens,
#: so nearby steps share one key (and one cache entry).
DECODE_CONTEXT_ROUND = 128
PHASES = ("both", "prefill", "decode")
DECODE_CONTEXTS = ("mean", "mid")


@dataclass(frozen=True)
class Plan:
    """A planned schedule: step i has shape `shapes[step_shape[i]]`; finish records say that
    `counts[j]` requests got their first token at the end of step `first_step[j]` (-1: at t=0) and
    finished at the end of step `finish_step[j]`."""

    workload: Workload
    scheduler: Scheduler
    phase: str
    shapes: tuple[StepShape, ...]
    step_shape: np.ndarray
    counts: np.ndarray
    first_step: np.ndarray
    finish_step: np.ndarray
    peak_kv_tokens: float

    @property
    def num_steps(self) -> int:
        return len(self.step_shape)

    @cached_property
    def price_keys(self) -> tuple:
        """What must be priced: whole shapes for a fused policy, else the distinct ForwardKeys
        (in order of first use)."""
        if self.scheduler.fused:
            return self.shapes
        return tuple(dict.fromkeys(key for shape in self.shapes for key in shape))


class _DecodePool:
    """Requests past their first token. All ready requests usually decode together, so a global
    tick counter replaces per-group countdowns; a group finishes when the ticks reach its end.
    Groups stay ordered by end tick: the oldest decode first, so only newer groups are delayed."""

    def __init__(self, steps: int, tokens_per_step: float, prompt_tokens: int):
        self.groups: deque[list[int]] = deque()
        self.steps, self.rate, self.prompt = steps, tokens_per_step, prompt_tokens
        self.ticks = self.ready = self.steps_sum = 0  # steps_sum: decode steps done, all requests

    def join(self, count: int, first_step: int) -> None:
        end = self.ticks + self.steps
        last = self.groups[-1] if self.groups else None
        if last is not None and last[1] == end and last[2] == first_step:
            last[0] += count
        else:
            self.groups.append([count, end, first_step])
        self.ready += count

    def generated_sum(self, d: int) -> float:
        """Tokens generated so far (first token included) by the `d` oldest ready requests."""
        if d == self.ready:
            return d + self.rate * self.steps_sum
        total, left = 0.0, d
        for count, end, _ in self.groups:
            n = min(count, left)
            total += n * (1 + self.rate * (self.steps - (end - self.ticks)))
            left -= n
            if not left:
                break
        return total

    def kv_tokens(self) -> float:
        """KV tokens held: prompt plus generated tokens of every ready request."""
        return (self.prompt + 1) * self.ready + self.rate * self.steps_sum

    def advance(self, d: int, step: int, finished: list) -> float:
        """Decode the `d` oldest requests one step; move finished groups to `finished`.
        Returns the KV tokens held before the finished ones leave."""
        if d < self.ready:
            self._delay_after(d)
        self.ticks += 1
        self.steps_sum += d
        kv = self.kv_tokens()
        groups = self.groups
        while groups and groups[0][1] == self.ticks:
            count, _, first = groups.popleft()
            finished.append((count, first, step))
            self.ready -= count
            self.steps_sum -= count * self.steps
        return kv

    def _delay_after(self, d: int) -> None:
        """Requests beyond the `d` oldest skip this step: their end tick moves one later."""
        kept: deque[list[int]] = deque()
        left = d
        for count, end, first in self.groups:
            if left >= count:
                kept.append([count, end, first])
                left -= count
            elif left:
                kept.append([left, end, first])
                kept.append([count - left, end + 1, first])
                left = 0
            else:
                kept.append([count, end + 1, first])
        self.groups = kept


def _merge(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Fold neighbouring groups at the same prefill progress into one."""
    out: list[tuple[int, int]] = []
    for count, done in groups:
        if out and out[-1][1] == done:
            out[-1] = (out[-1][0] + count, done)
        else:
            out.append((count, done))
    return out


def plan(
    workload: Workload,
    scheduler: Scheduler | None = None,
    *,
    phase: str = "both",
    decode_context: str = "mean",
    context_round: int = DECODE_CONTEXT_ROUND,
) -> Plan:
    """Play the scheduler over `workload` until every request has its `output_length` tokens.

    phase "prefill" models a prefill-only instance (requests leave at their first token),
    "decode" a decode-only one (requests arrive with their prompt prefilled and first token out).
    """
    scheduler = scheduler or DecodeFirstWithSlack()
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if decode_context not in DECODE_CONTEXTS:
        raise ValueError(f"decode_context must be one of {DECODE_CONTEXTS}, got {decode_context!r}")
    if not isinstance(context_round, int) or context_round < 1:
        raise ValueError(f"context_round must be an integer >= 1, got {context_round!r}")
    w = workload
    E, B, I, N = w.effective_input_length, w.max_batched_tokens, w.input_length, w.concurrency
    qlen, cached = w.decode_query_len, w.cached_prefix_tokens
    steps = 0 if phase == "prefill" else w.decode_steps
    if phase == "decode" and not steps:
        raise ValueError("a decode-only instance needs output_length >= 2 (nothing to decode)")
    pool = _DecodePool(steps, w.tokens_per_decode_step, I)
    queue: list[tuple[int, int]] = []
    if phase == "decode":
        pool.join(N, -1)
    else:
        queue = [(N, 0)]
    mid_context = I + w.output_length // 2 + 1
    shape_ids: dict[tuple, int] = {}
    shapes: list[StepShape] = []
    step_shape: list[int] = []
    finished: list[tuple[int, int, int]] = []
    kv_prefill = 0
    peak = 0.0
    left = N
    while left:
        step = len(step_shape)
        sp = scheduler.plan_step(QueueView(queue, pool.ready, E, B, qlen))
        d = sp.decode
        if not sp.takes and d == 0:
            raise RuntimeError(
                f"scheduler {scheduler.name!r} made no progress with {sum(c for c, _ in queue)} requests "
                f"waiting to prefill and {pool.ready} ready to decode"
            )
        if not 0 <= d <= pool.ready:
            raise RuntimeError(f"scheduler {scheduler.name!r} asked {d} decodes of {pool.ready} ready")
        entries: dict[tuple[int, int], int] = {}
        if sp.takes:
            queue, first_tokens, kv_added = _apply_takes(queue, sp.takes, scheduler, E, cached, entries)
            kv_prefill += kv_added - first_tokens * I
        else:
            first_tokens = 0
        ctx = _decode_key_context(pool, d, I, qlen, mid_context if decode_context == "mid" else None,
                                  context_round)
        signature = (tuple(sorted(entries.items())), d, ctx)
        shape_id = shape_ids.get(signature)
        if shape_id is None:
            shape_id = shape_ids[signature] = len(shapes)
            shapes.append(_shape(entries, d, qlen, ctx))
        step_shape.append(shape_id)
        done = len(finished)
        kv_decode = pool.advance(d, step, finished) if d else pool.kv_tokens()
        if first_tokens:
            if steps:
                pool.join(first_tokens, step)
            else:
                finished.append((first_tokens, step, step))
        peak = max(peak, kv_prefill + kv_decode + first_tokens * (I + 1))
        while done < len(finished):
            left -= finished[done][0]
            done += 1
    counts, first, finish = (np.array(col, dtype=np.int64) for col in zip(*finished, strict=True))
    step_ids = np.array(step_shape, dtype=np.int64)
    return Plan(w, scheduler, phase, tuple(shapes), step_ids, counts, first, finish, float(peak))


def _decode_key_context(pool: _DecodePool, d: int, prompt: int, qlen: int, fixed: int | None,
                        round_to: int) -> int:
    """seq_len of the step's decode key: `fixed` ("mid" mode), else the mean context of the `d`
    oldest decoding requests after the step, rounded up to `round_to`; 0 when nobody decodes."""
    if not d:
        return 0
    if fixed is not None:
        return fixed
    mean = prompt + qlen - 1 + pool.generated_sum(d) / d
    return math.ceil(mean / round_to - 1e-9) * round_to


def _shape(entries: dict[tuple[int, int], int], d: int, qlen: int, ctx: int) -> StepShape:
    keys = [ForwardKey(False, n, tok, seq) for (tok, seq), n in entries.items()]
    if d:
        keys.append(ForwardKey(True, d, qlen, ctx))
    return tuple(sorted(keys))


def _apply_takes(queue, takes, scheduler, E, cached, entries):
    """Advance the chosen prefill groups; return the new FIFO, the requests whose prompt is now
    complete, and the KV tokens the step added."""
    by_pos: dict[int, list[tuple[int, int]]] = {}
    for pos, n, tok in takes:
        if not 0 <= pos < len(queue) or n < 1 or tok < 1:
            raise RuntimeError(f"scheduler {scheduler.name!r} made an invalid take {(pos, n, tok)}")
        by_pos.setdefault(pos, []).append((n, tok))
    front: list[tuple[int, int]] = []
    back: list[tuple[int, int]] = []
    first_tokens = kv_added = 0
    stay = back if scheduler.requeue else front
    for pos, (count, done) in enumerate(queue):
        left = count
        for n, tok in by_pos.get(pos, ()):
            seq = done + tok
            left -= n
            if seq > E or left < 0:
                raise RuntimeError(f"scheduler {scheduler.name!r} over-advanced group {(count, done)}")
            kv_added += n * tok + (n * cached if done == 0 else 0)
            entries[(tok, seq)] = entries.get((tok, seq), 0) + n
            if seq == E:
                first_tokens += n
            else:
                stay.append((n, seq))
        if left:
            front.append((left, done))
    return _merge(front + back if scheduler.requeue else front), first_tokens, kv_added
