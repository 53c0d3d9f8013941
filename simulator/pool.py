"""The decode pool: requests past their first token, as groups of identical requests, with the
running sums the planner reads every step (ready count, prompt tokens, decode steps done)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class DecodePool:
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
        return kv_held(self.prompt_sum, self.ready, self.rate, self.steps_sum)

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

    def pass_stream(self, step: int, n: int, joins, origin: tuple[int, int], decoded: int, finished: list) -> int:
        """Pass a stream's `n` steps from `step` on, every ready request decoding, `decoded` decode steps
        in all: the groups whose end comes leave (finish records in the loop's order), then the
        `joins[j]` requests (of `origin`: arrival event, kind) whose prompts completed in step j join,
        one group a step. Returns the requests finished."""
        event, kind = origin
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
            self.ordered = ordered(kept)
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
            self.ordered = ordered(kept)


def kv_held(prompts, ready, rate: float, steps_done):
    """KV tokens of `ready` decoding requests: their prompts, first tokens and `rate` tokens per
    decode step done (numbers for one step, arrays for many)."""
    return prompts + ready + rate * steps_done


def ordered(groups) -> bool:
    """End ticks never decrease along the groups."""
    ends = [g[1] for g in groups]
    return all(a <= b for a, b in zip(ends, ends[1:], strict=False))
