"""Period copies: a closed loop's (or a burst's) period, found by cycle detection, copied."""

from __future__ import annotations

from simulator.jumps.base import Jump
from simulator.planstate import fresh


class PeriodCopies(Jump):
    """Claim: the planner's future depends only on its FIFO and decode groups relative to the step
    and the arrival events (the scheduler sees nothing else), so once that state equals one seen
    before, the steps, finishes and replacements since repeat, shifted in time: a closed loop's while
    its prompts last, a burst's while its waiting fresh group still holds more than the period
    takes of it. Untimed plans of one kind of request only."""

    name, stage = "period", "before"

    def __init__(self, free_fresh: bool) -> None:
        self.cycle: _Cycle | None = _Cycle(free_fresh)

    @classmethod
    def make(cls, st) -> PeriodCopies | None:
        if (st.closed or st.burst) and not st.timed and len(st.kinds.input) == 1:
            return cls(free_fresh=st.burst)
        return None

    def try_jump(self, st, _) -> int | None:
        if not st.check or self.cycle is None:
            return None
        st.check = False
        a, step = st.arrivals, len(st.step_shape)
        now = (step, len(a.steps), len(st.finished), a.sent, st.left)
        before = self.cycle.seen(st.queue, st.pool, step, now[1], now)
        if before is None:
            return None
        copies = _period_copies(before, now, a, st.queue, st.closed)
        st.left -= _repeat_period(st, before, now, copies)
        self.cycle = None
        return (len(st.step_shape) - step) or None


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
            i = fresh(queue)
            fifo[i] = (-1, *fifo[i][1:])
        return (tuple(fifo),
                tuple((n, end - ticks, step - first, events - e, k) for n, end, first, e, k in pool.groups))


def _period_copies(before: tuple, now: tuple, arrivals, queue, closed: bool) -> int:
    """How many more times the period between marks `before` and `now` plays alike: a closed loop's
    while its prompts last (every replacement of a copy sent in full); a burst's while its waiting
    fresh group, which loses the period's finished requests each time, still holds more than the
    period's steps take of it (then the policy answers as it did)."""
    served = before[4] - now[4]
    if closed:
        return (arrivals.total - now[3]) // (now[3] - before[3])
    return (queue[fresh(queue)][0] - 1) // served if served > 0 else 0


def _repeat_period(st, before: tuple, now: tuple, copies: int) -> int:
    """Copy the steps, finishes and replacements between marks `before` and `now` `copies` times, and
    shift the waiting and decoding groups to the end of the copies (a burst's fresh group gives the
    requests the copies finish). Marks are (step, events, finish records, requests sent, requests
    left). Returns the requests finished in the copies."""
    t0, e0, f0, _, left0 = before
    t, e, f, _, left = now
    if not copies:
        return 0
    arrivals, queue, finished = st.arrivals, st.queue, st.finished
    p, de = t - t0, e - e0
    st.step_shape.extend(st.step_shape[t0:t] * copies)
    st.step_decode.extend(st.step_decode[t0:t] * copies)
    period = finished[f0:f]
    events = list(zip(arrivals.sizes[e0:e], arrivals.steps[e0:e], strict=True))
    for j in range(1, copies + 1):
        finished.extend((n, event + j * de, first + j * p, end + j * p, kind)
                        for n, event, first, end, kind in period)
        for size, sent_at in events:
            arrivals.add(size, sent_at + j * p)
    shift, de, served = copies * p, copies * de, copies * (left0 - left)
    if not events:  # a burst: the fresh group gave what the copies finish
        i = fresh(queue)
        n, done, event, kind = queue[i]
        queue[i] = (n - served, done, event, kind)
    queue.extend([(n, done, event + de, kind) for n, done, event, kind in
                  [queue.popleft() for _ in range(len(queue))]])
    for group in st.pool.groups:
        group[2] += shift
        group[3] += de
    return served
