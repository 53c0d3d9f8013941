"""Progress bars on stderr: a sweep's scenarios done / total, points evaluated and latency-cache hit rate; an
optimize search's jobs done and points evaluated."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool = True):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="scenario", file=sys.stderr, disable=not enabled, dynamic_ncols=True,
                        mininterval=0.2)
        self.points = self.priced = self.lookups = self.round_trips = 0

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.priced / self.lookups if self.lookups else 0.0

    def point(self, stats: dict, n: int = 1) -> None:
        self.points += n
        self.priced += stats["priced"]
        self.lookups += stats["lookups"]
        self.round_trips += stats.get("round_trips", 0)

    def scenario_done(self) -> None:
        self.bar.set_postfix(points=self.points, cache_hit=f"{100 * self.hit_rate:.1f}%", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


#: how long a search runs before its bar appears: most optimize searches take a fraction of a second and pay neither
#: tqdm's import nor a bar; a search that runs for minutes (small token budgets, no limits) shows where it is
SHOW_AFTER_S = 1.0


class SearchProgress:
    """The bar on stderr of one search (optimize's jobs, plan's instance sizes): its `unit`s done of all, the points
    evaluated, the time; shown once the search has run `show_after_s`."""

    def __init__(self, enabled: bool = True, show_after_s: float = SHOW_AFTER_S, desc: str = "optimize",
                 unit: str = "job"):
        self.enabled, self.show_after_s, self.desc, self.unit = enabled, show_after_s, desc, unit
        self.started = time.perf_counter()
        self.jobs = self.done = self.points = 0
        self.bar = None

    def begin(self, jobs: int) -> None:
        self.jobs = jobs

    def update(self, points: int = 0, jobs: int = 0) -> None:
        """`points` more evaluated and `jobs` more done; the bar redrawn (made once it is due)."""
        self.points += points
        self.done += jobs
        if not self.enabled or (self.bar is None and time.perf_counter() - self.started < self.show_after_s):
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.jobs, unit=self.unit, desc=self.desc, file=sys.stderr, dynamic_ncols=True,
                            mininterval=0.2)
        self.bar.set_postfix(points=self.points, refresh=False)
        self.bar.update(self.done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
