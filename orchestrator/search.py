"""Concurrency search: the highest concurrency that meets every limit, without assuming monotonicity.

Bracket by doubling, bisect (k-section when evaluations run in parallel), then verify the
neighbours of the answer; if a point above it turns out feasible, search on from there. Every
point is evaluated at most once (memoised); evaluations arrive in batches so a Ray backend can run
a whole round at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Evaluate = Callable[[list[int]], list[dict]]
Feasible = Callable[[dict], bool]


@dataclass
class SearchResult:
    best: dict | None            # the feasible point with the most throughput
    highest_feasible: int        # 0 when nothing is feasible
    rows: dict[int, dict]        # every evaluated point, by concurrency
    rounds: int


class Memo:
    """Evaluates each concurrency once; `__call__` takes a batch and returns the rows by concurrency."""

    def __init__(self, evaluate: Evaluate):
        self.evaluate, self.rows, self.rounds = evaluate, {}, 0

    def __call__(self, ns) -> dict[int, dict]:
        todo = sorted({n for n in ns if n not in self.rows})
        if todo:
            self.rounds += 1
            for n, row in zip(todo, self.evaluate(todo), strict=True):
                self.rows[n] = row
        return {n: self.rows[n] for n in ns}


def search_concurrency(evaluate: Evaluate, feasible: Feasible, max_concurrency: int, width: int = 1,
                       memo: Memo | None = None, metric: str = "output_throughput") -> SearchResult:
    """`width` points per round: 1 for inline runs, about the number of workers for Ray."""
    memo = memo or Memo(evaluate)
    ok = lambda n: feasible(memo([n])[n])  # noqa: E731
    lo, hi = 0, None  # lo feasible (0 = none yet), hi infeasible
    start = 1
    while True:
        lo, hi = _bracket(memo, feasible, start, lo, max_concurrency, width)
        if hi is not None:
            lo, hi = _bisect(memo, feasible, lo, hi, width)
        # verify neighbours: lo - 1 (should be feasible) and two above hi
        above = [n for n in (lo + 2, lo + 3) if n <= max_concurrency and hi is not None]
        memo([n for n in [lo - 1, *above] if n >= 1])
        jump = next((n for n in above if ok(n)), None)
        if jump is None:
            break
        lo, start = jump, jump  # non-monotone: feasibility came back above the boundary
    feasible_rows = [r for r in memo.rows.values() if feasible(r)]
    best = max(feasible_rows, key=lambda r: (r[metric], -r["concurrency"]), default=None)
    return SearchResult(best, lo, memo.rows, memo.rounds)


def _bracket(memo, feasible, start, lo, cap, width):
    """Double from `start` until a point fails; returns (last feasible, first infeasible or None)."""
    n = start
    while n <= cap:
        batch = []
        m = n
        while len(batch) < width and m <= cap:
            batch.append(m)
            m = m * 2 if m < cap else cap + 1
            if m > cap and batch[-1] < cap:
                m = cap
        rows = memo(batch)
        for b in batch:
            if feasible(rows[b]):
                lo = b
            else:
                return lo, b
        n = m
    return lo, None


def _bisect(memo, feasible, lo, hi, width):
    """Narrow (feasible lo, infeasible hi) to adjacent integers, `width` probes per round."""
    while hi - lo > 1:
        step = (hi - lo) / (width + 1)
        probes = sorted({min(hi - 1, max(lo + 1, round(lo + step * (i + 1)))) for i in range(width)})
        rows = memo(probes)
        new_lo, new_hi = lo, hi
        for p in probes:
            if feasible(rows[p]):
                new_lo = p
            else:
                new_hi = p
                break
        lo, hi = new_lo, new_hi
    return lo, hi
