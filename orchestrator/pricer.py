"""The worker-side pricer: a per-process dict in front of the shared latency cache actor
(`orchestrator.cache`), then the latency model. Without an actor it is a plain local cache; Ray is
imported only when an actor is given.
"""

from __future__ import annotations


def plain(key) -> tuple:
    if isinstance(key, tuple):  # a fused step shape
        return tuple(plain(k) for k in key)
    return (key.is_decode, key.concurrency, key.query_len, key.seq_len)


class CachedPricer:
    """A pricer for `evaluate_point`: local dict, then the shared actor, then the latency model.
    Counts what it priced itself (`priced`) and what the caches served (`local_hits`, `remote_hits`)."""

    def __init__(self, cache=None):
        self.cache = cache
        self.local: dict[tuple, float] = {}
        self.priced = self.local_hits = self.remote_hits = self.lookups = 0

    def prefetch(self, requests) -> None:
        """Make every key of `requests` [(latency model, keys, fused)] local: one get_many for all
        misses, one pricing call per model for what the cache lacks, one put_many."""
        wanted: dict[tuple, tuple] = {}  # (fp, plain key) -> (lm, key, fused)
        for lm, keys, fused in requests:
            fp = lm.fingerprint
            for k in keys:
                pair = (fp, plain(k))
                self.lookups += 1
                if pair in self.local or pair in wanted:
                    self.local_hits += 1
                else:
                    wanted[pair] = (lm, k, fused)
        if not wanted:
            return
        pairs = list(wanted)
        if self.cache is not None:
            import ray

            found = ray.get(self.cache.get_many.remote(pairs))
            for pair, v in zip(pairs, found, strict=True):
                if v is not None:
                    self.local[pair] = v
                    self.remote_hits += 1
            pairs = [p for p, v in zip(pairs, found, strict=True) if v is None]
        self._price(pairs, wanted)

    def _price(self, pairs, wanted) -> None:
        from simulator import price

        groups: dict[tuple, list] = {}
        for pair in pairs:
            lm, _, fused = wanted[pair]
            groups.setdefault((pair[0], fused), []).append(pair)
        for (_, fused), group in groups.items():
            lm = wanted[group[0]][0]
            values = price(lm, [wanted[p][1] for p in group], fused).tolist()
            self.local.update(zip(group, values, strict=True))
            self.priced += len(group)
            if self.cache is not None:
                self.cache.put_many.remote(group, values)

    def lookup(self, lm, keys) -> list[float]:
        """Latencies of keys made local by `prefetch`."""
        fp = lm.fingerprint
        return [self.local[(fp, plain(k))] for k in keys]

    def __call__(self, lm, keys, fused: bool):
        self.prefetch([(lm, keys, fused)])
        return self.lookup(lm, keys)

    def take_stats(self) -> dict:
        stats = {"priced": self.priced, "local_hits": self.local_hits, "remote_hits": self.remote_hits,
                 "lookups": self.lookups}
        self.priced = self.local_hits = self.remote_hits = self.lookups = 0
        return stats
