"""The shared latency cache: ONE named Ray actor holding latencies by (fingerprint, key), and the
worker-side pricer that puts a per-process dict in front of it.

A worker plans every simulation of its task first, asks for all their keys in ONE `get_many`, prices
the misses locally in one vectorised call per latency model and sends them back with one
`put_many` it does not wait for; then it replays the simulations from its local dict.
"""

from __future__ import annotations

import ray

CACHE_NAME = "servesweep-latency-cache"
NAMESPACE = "servesweep"


@ray.remote(num_cpus=0)
class LatencyCache:
    """Latencies by (fingerprint, key); keys are plain tuples (a ForwardKey's fields, or a tuple of
    them for a fused step)."""

    def __init__(self):
        self.data: dict[tuple, float] = {}
        self.hits = self.misses = self.puts = 0

    def get_many(self, pairs: list) -> list:
        """Latencies of (fingerprint, key) pairs; None where missing."""
        out = [self.data.get(pair) for pair in pairs]
        found = sum(v is not None for v in out)
        self.hits += found
        self.misses += len(out) - found
        return out

    def put_many(self, pairs: list, values: list) -> None:
        for pair, v in zip(pairs, values, strict=True):
            self.data[pair] = v
        self.puts += len(pairs)

    def stats(self) -> dict:
        return {"entries": len(self.data), "hits": self.hits, "misses": self.misses, "puts": self.puts}

    def clear(self) -> None:
        self.data.clear()
        self.hits = self.misses = self.puts = 0


def get_cache():
    """The one cache actor of this Ray cluster, created on first use; it outlives the driver."""
    return LatencyCache.options(name=CACHE_NAME, namespace=NAMESPACE, get_if_exists=True,
                                lifetime="detached").remote()


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
