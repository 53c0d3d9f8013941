"""Concurrency search: the highest concurrency that meets every limit, without assuming monotonicity.

Bracket by doubling, bisect (k-section when `width` > 1), then verify the neighbours of the answer;
if a point above it turns out feasible, search on from there. Every point is evaluated at most once.
Given a `margin` (how near a row is to each limit, 1 at it), the bracket aims where the last two feasible
points, extended in a straight line, reach a limit (up to AIM_REACH times the last one, past doubling
where the line says so), and the bisection probes where the lines between its ends cross the limit
(the midpoint after a probe that did not halve the bracket): guesses that only choose the next probe,
so the answer is still the one bracketing and bisection find where feasibility is monotone.

The search is a generator: it yields the concurrencies it needs and receives their rows. One driver
runs it inline (`drive`); the Ray driver runs many searches at once and packs their requests into
tasks. Same code, same points, same answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

Evaluate = Callable[[list[int]], list[dict]]
Feasible = Callable[[dict], bool]
#: how near a row is to each of its limits: below 1 within it, 1 at it, above 1 past it
Margin = Callable[[dict], tuple[float, ...]]
#: yields a batch of concurrencies to evaluate, is sent {concurrency: row}, returns its result
Search = Generator[list[int], dict, object]
#: the farthest an aimed probe goes, in multiples of the highest feasible point: a limit's straight line
#: through two points may send the search past doubling, not without bound (lines from small
#: concurrencies run steeper or flatter than the curve they start)
AIM_REACH = 4


@dataclass
class SearchResult:
    best: dict | None            # the feasible point with the most throughput
    highest_feasible: int        # 0 when nothing is feasible
    rows: dict[int, dict]        # every evaluated point, by concurrency


def need(rows: dict[int, dict], ns) -> Generator[list[int], dict, dict[int, dict]]:
    """Ask the driver for the rows of `ns` not evaluated yet; return the rows of all of `ns`."""
    todo = sorted({n for n in ns if n not in rows})
    if todo:
        got = yield todo
        missing = [n for n in todo if n not in got]
        if missing:
            raise RuntimeError(f"the evaluator returned no row for concurrencies {missing}")
        rows.update(got)
    return {n: rows[n] for n in ns}


def search(feasible: Feasible, max_concurrency: int, width: int = 1, rows: dict | None = None,
           metric: str = "output_throughput", margin: Margin | None = None, aim: bool = True) -> Search:
    """`rows` may hold points evaluated before (another limit pair of the same instance); `margin`
    (optional) lets the bisection probe where the limits' lines cross, and with `aim` the bracket aim
    where the limit lies instead of doubling past it (without: the doubling ladder plans share)."""
    rows = {} if rows is None else rows
    lo, start = 0, 1  # lo: highest feasible so far (0 = none)
    while True:
        lo, hi = yield from _bracket(rows, feasible, start, lo, max_concurrency, width, margin if aim else None)
        if hi is not None:
            lo, hi = yield from _bisect(rows, feasible, lo, hi, width, margin)
        above = [n for n in (lo + 2, lo + 3) if hi is not None and n <= max_concurrency]
        got = yield from need(rows, [n for n in [lo - 1, *above] if n >= 1])
        jump = next((n for n in above if feasible(got[n])), None)
        if jump is None:
            break
        lo, start = jump, jump  # non-monotone: feasibility came back above the boundary
    ok = [r for r in rows.values() if feasible(r)]
    best = max(ok, key=lambda r: (r[metric], -r["concurrency"]), default=None)
    return SearchResult(best, lo, rows)


def drive(gen: Generator, evaluate: Evaluate):
    """Run a search generator to the end, evaluating its requests inline."""
    try:
        ns = next(gen)
        while True:
            ns = gen.send(dict(zip(ns, evaluate(ns), strict=True)))
    except StopIteration as stop:
        return stop.value


def search_concurrency(evaluate: Evaluate, feasible: Feasible, max_concurrency: int, width: int = 1,
                       metric: str = "output_throughput", margin: Margin | None = None,
                       aim: bool = True) -> SearchResult:
    return drive(search(feasible, max_concurrency, width, metric=metric, margin=margin, aim=aim), evaluate)


def _bracket(rows, feasible, start, lo, cap, width, margin=None):
    """Double (or aim, given a `margin` and one probe at a time) from `start` until a point fails;
    returns (last feasible, first infeasible or None)."""
    n = start
    while n <= cap:
        batch = [n]
        while len(batch) < width and (ahead := _capped(batch[-1], 2 * batch[-1], cap)) <= cap:
            batch.append(ahead)
        got = yield from need(rows, batch)
        for b in batch:
            if not feasible(got[b]):
                return lo, b
            lo = b
        n = _capped(lo, _aim(rows, feasible, margin, lo) if width == 1 else 2 * lo, cap)
    return lo, None


def _capped(n: int, ahead: int, cap: int) -> int:
    """The probe after `n`: `ahead`, or the cap itself once where `ahead` passes it."""
    return cap if n < cap < ahead else ahead


def _aim(rows, feasible, margin, n: int) -> int:
    """The probe after feasible `n`: where the first limit's straight line through the two highest feasible
    points up to `n` reaches 1 (the limit), at most AIM_REACH x n; 2n where no limit rises; always above n."""
    if margin is None:
        return 2 * n
    known = sorted((c for c, r in rows.items() if c <= n and feasible(r)), reverse=True)[:2]
    if len(known) < 2:
        return 2 * n
    (n1, n0), ahead = known, None
    for m1, m0 in zip(margin(rows[n1]), margin(rows[n0]), strict=True):
        if m0 < m1:  # rising: reaches 1 ahead (or is at it: then the next point)
            reach = math.floor(n1 + (1 - m1) * (n1 - n0) / (m1 - m0))
            ahead = reach if ahead is None else min(ahead, reach)
    if ahead is None:
        return 2 * n
    return max(n + 1, min(AIM_REACH * n, ahead))


def _bisect(rows, feasible, lo, hi, width, margin=None):
    """Narrow (feasible lo, infeasible hi) to adjacent integers, `width` probes per round. Given a `margin`
    (and one probe a round), a round probes where the limits' straight lines between lo and hi cross 1,
    unless the round before it did not halve the bracket: then the midpoint (at most twice bisection's rounds)."""
    halved = True
    while hi - lo > 1:
        if margin is not None and width == 1 and halved:
            probes = [_interpolate(rows, margin, lo, hi)]
        else:
            step = (hi - lo) / (width + 1)
            probes = sorted({min(hi - 1, max(lo + 1, round(lo + step * (i + 1)))) for i in range(width)})
        before = hi - lo
        got = yield from need(rows, probes)
        for p in probes:
            if not feasible(got[p]):
                hi = p
                break
            lo = p
        halved = 2 * (hi - lo) <= before
    return lo, hi


def _interpolate(rows, margin, lo: int, hi: int) -> int:
    """The concurrency strictly between feasible `lo` and infeasible `hi` where the first limit past 1 at hi
    crosses 1 on its straight line from lo; the midpoint where no limit explains hi (memory, say)."""
    crossings = [lo + (1 - a) * (hi - lo) / (b - a)
                 for a, b in zip(margin(rows[lo]), margin(rows[hi]), strict=True) if b > 1 >= a]
    if not crossings:
        return (lo + hi) // 2
    return min(hi - 1, max(lo + 1, math.floor(min(crossings))))
