"""The shared latency cache: ONE named Ray actor holding latencies by (fingerprint, key), and the
worker-side pricer that puts a per-process dict in front of it.

A worker asks for all keys of one simulation in one `get_many`, prices the misses locally in one
vectorised call and sends them back with one `put_many` it does not wait for.
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

    def get_many(self, fingerprint: str, keys: list) -> list:
        out = [self.data.get((fingerprint, k)) for k in keys]
        found = sum(v is not None for v in out)
        self.hits += found
        self.misses += len(out) - found
        return out

    def put_many(self, fingerprint: str, keys: list, values: list) -> None:
        for k, v in zip(keys, values, strict=True):
            self.data[(fingerprint, k)] = v
        self.puts += len(keys)

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
    Counts what it priced itself (`priced`) and what the cache served (`local_hits`, `remote_hits`)."""

    def __init__(self, cache=None):
        self.cache = cache
        self.local: dict[tuple, float] = {}
        self.priced = self.local_hits = self.remote_hits = self.lookups = 0

    def __call__(self, lm, keys, fused: bool):
        from simulator import price

        fp = lm.fingerprint
        plain_keys = [plain(k) for k in keys]
        out = [self.local.get((fp, k)) for k in plain_keys]
        self.lookups += len(out)
        todo = [i for i, v in enumerate(out) if v is None]
        self.local_hits += len(out) - len(todo)
        if todo and self.cache is not None:
            remote = ray.get(self.cache.get_many.remote(fp, [plain_keys[i] for i in todo]))
            for i, v in zip(todo, remote, strict=True):
                out[i] = v
            self.remote_hits += sum(v is not None for v in remote)
            todo = [i for i in todo if out[i] is None]
        if todo:
            values = price(lm, [keys[i] for i in todo], fused).tolist()
            self.priced += len(todo)
            for i, v in zip(todo, values, strict=True):
                out[i] = v
            if self.cache is not None:
                self.cache.put_many.remote(fp, [plain_keys[i] for i in todo], values)
        for k, v in zip(plain_keys, out, strict=True):
            self.local[(fp, k)] = v
        return out

    def take_stats(self) -> dict:
        stats = {"priced": self.priced, "local_hits": self.local_hits, "remote_hits": self.remote_hits,
                 "lookups": self.lookups}
        self.priced = self.local_hits = self.remote_hits = self.lookups = 0
        return stats
