"""The progress bar on stderr: scenarios done / total, points evaluated, latency-cache hit rate."""

from __future__ import annotations

import sys


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
