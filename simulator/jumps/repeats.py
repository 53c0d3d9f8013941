"""Pure-decode repeats: a step of decodes only, repeated while nothing changes its key."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, repeat

from simulator.jumps.base import Jump
from simulator.planstate import mean_context, round_context


class DecodeRepeats(Jump):
    """Claim: after a step that decoded every ready request and prefilled nothing, with nothing waiting
    and nobody finished, the next steps are the same step until a request finishes, the decode key's
    rounded mean context moves (computed exactly as `PlanState.play` does) or, timed, a
    request arrives: they are appended at once."""

    name, stage = "repeats", "after"

    def try_jump(self, st, step) -> int | None:
        pool = st.pool
        if step.decodes != pool.ready or st.queue:
            return None
        run = _repeats(st, step.decodes, step.context)
        if st.timed:
            run = _before_arrival(st, run, st.shape_ms[step.shape_id], step.decodes)
        if not run:
            return None
        st.step_shape.extend([step.shape_id] * run)
        st.step_decode.extend([step.decodes] * run)
        pool.ticks += run
        pool.steps_sum += run * step.decodes  # the KV peak: the next step holds more (it decodes these too)
        return run


def _repeats(st, d: int, ctx: int) -> int:
    """How many more pure-decode steps of all `d` ready requests keep the decode key `ctx` and finish
    nobody: up to the step before the first end, while the rounded mean context stays the same."""
    pool = st.pool
    run = pool.next_end - pool.ticks - 1
    if st.fixed is not None or run <= 0:
        return max(run, 0)
    qlen, round_to = st.qlen, st.round_to

    def same(j: int) -> bool:  # the j-th next step (0-based) keeps the key
        generated = d + pool.rate * (pool.steps_sum + j * d)
        return round_context(mean_context(pool.prompt_sum, d, generated, qlen), round_to) == ctx

    if same(run - 1):
        return run  # the mean only grows: if the last step keeps the key, all do
    # the mean grows by `rate` a step: start from the closed-form crossing, then settle it exactly
    first = mean_context(pool.prompt_sum, d, d + pool.rate * pool.steps_sum, qlen)
    j = max(0, min(run - 1, int((ctx - first) / pool.rate)))
    while j > 0 and not same(j - 1):
        j -= 1
    while same(j):
        j += 1
    return j


def _before_arrival(st, run: int, step_ms: float, decodes: int) -> int:
    """Of `run` repeated steps of `step_ms`, those that start before the next arrival is due; their end
    times are appended to the clock (added one by one, as the loop's clock would) and, where the front
    end streams at a cost, their `decodes` chunks streamed as `PlanState.record` streams them (the next
    arrival asked again after each: a request sent meanwhile waits behind them)."""
    a = st.arrivals
    next_arrival, clock = a.next_time(), st.clock
    if not a.streams:  # the clock of each step, added one by one as the loop adds them, then the first past the arrival
        clocks = list(accumulate(repeat(step_ms, run), initial=clock))
        j = run if next_arrival is None else bisect_left(clocks, next_arrival, 0, run)
        st.step_end.extend(clocks[1:j + 1])
        st.clock = clocks[j]
        return j
    for j in range(run):
        if next_arrival is not None and next_arrival <= clock:
            st.clock = clock
            return j
        clock += step_ms
        st.step_end.append(clock)
        a.stream(clock, decodes)
        next_arrival = a.next_time()
    st.clock = clock
    return run
