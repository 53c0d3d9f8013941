"""The shared latency cache: named Ray actors (shards) holding latencies by (fingerprint, key), for
latency backends that cost more per key than asking (orchestrator.pricer decides). A key lives on
the shard its hash picks; each shard keeps at most `max_entries` (least recently used leave first).

A key is priced once per cluster: `claim_many` answers a missing key with MINE to the first caller,
who prices it and `put_many`s it, and with PENDING to the others, who ask again shortly; a claim
whose owner does not answer within CLAIM_TIMEOUT_S passes to the next caller (the owner died).
"""

from __future__ import annotations

import math
import time
import zlib
from collections import OrderedDict

import ray

from orchestrator.pricer import MINE, PENDING

CACHE_NAME = "servesweep-latency-cache"
NAMESPACE = "servesweep"
#: entries per shard before the least recently used are evicted (~150 bytes each: ~150 MB a shard)
MAX_ENTRIES = 1_000_000
#: Ray workers one shard serves: a shard answered 165-450 calls/s here (bench/cache.py), a worker makes
#: at most ~20 (one per task of >= 50 ms), so 8-22 workers a shard
WORKERS_PER_SHARD = 16
#: seconds after which an unanswered claim passes to the next caller
CLAIM_TIMEOUT_S = 60.0
__all__ = ["MINE", "PENDING", "LatencyCache", "ShardedCache", "get_cache"]


@ray.remote(num_cpus=0)
class LatencyCache:
    """One shard: latencies by (fingerprint, key); keys are plain tuples (a ForwardKey's fields, or
    a tuple of them for a fused step)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, claim_timeout_s: float = CLAIM_TIMEOUT_S):
        self.data: OrderedDict[tuple, float] = OrderedDict()
        self.claims: dict[tuple, tuple[str, float]] = {}
        self.max_entries, self.claim_timeout_s = max_entries, claim_timeout_s
        self.hits = self.misses = self.puts = self.evicted = self.calls = 0

    def get_many(self, pairs: list) -> list:
        """Latencies of (fingerprint, key) pairs; None where missing."""
        self.calls += 1
        return [self._get(pair) for pair in pairs]

    def claim_many(self, pairs: list, owner: str) -> list:
        """Per pair: its latency, MINE (price it and put it), or PENDING (another caller prices it)."""
        self.calls += 1
        now = time.monotonic()
        out = []
        for pair in pairs:
            value = self._get(pair)
            if value is None:
                claim = self.claims.get(pair)
                if claim is None or claim[0] == owner or now - claim[1] > self.claim_timeout_s:
                    self.claims[pair] = (owner, now)
                    value = MINE
                else:
                    value = PENDING
            out.append(value)
        return out

    def put_many(self, pairs: list, values: list) -> None:
        self.calls += 1
        for pair, v in zip(pairs, values, strict=True):
            self.data[pair] = v
            self.data.move_to_end(pair)
            self.claims.pop(pair, None)
        self.puts += len(pairs)
        while len(self.data) > self.max_entries:
            self.data.popitem(last=False)
            self.evicted += 1

    def _get(self, pair):
        value = self.data.get(pair)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
            self.data.move_to_end(pair)
        return value

    def stats(self) -> dict:
        return {"entries": len(self.data), "hits": self.hits, "misses": self.misses, "puts": self.puts,
                "evicted": self.evicted, "calls": self.calls, "claims": len(self.claims),
                "max_entries": self.max_entries}

    def clear(self) -> None:
        self.data.clear()
        self.claims.clear()
        self.hits = self.misses = self.puts = self.evicted = self.calls = 0


class ShardedCache:
    """The cache's shards as one: a key's shard is its hash modulo the shard count. Picklable (it
    holds actor handles), so tasks receive it as an argument."""

    def __init__(self, shards: list):
        self.shards = shards

    def split(self, pairs: list) -> dict[int, list[int]]:
        """Positions of `pairs` by shard."""
        by_shard: dict[int, list[int]] = {}
        for i, pair in enumerate(pairs):
            by_shard.setdefault(shard_of(pair, len(self.shards)), []).append(i)
        return by_shard

    def claim_many(self, pairs: list, owner: str) -> list:
        return self._scatter("claim_many", pairs, owner)

    def get_many(self, pairs: list) -> list:
        return self._scatter("get_many", pairs)

    def put_many(self, pairs: list, values: list) -> None:
        """Fire and forget: the caller does not wait."""
        for shard, idx in self.split(pairs).items():
            self.shards[shard].put_many.remote([pairs[i] for i in idx], [values[i] for i in idx])

    def _scatter(self, method: str, pairs: list, *args) -> list:
        parts = self.split(pairs)
        refs = {s: getattr(self.shards[s], method).remote([pairs[i] for i in idx], *args) for s, idx in parts.items()}
        out: list = [None] * len(pairs)
        for s, values in zip(refs, ray.get(list(refs.values())), strict=True):
            for i, v in zip(parts[s], values, strict=True):
                out[i] = v
        return out

    def stats(self) -> list[dict]:
        return ray.get([s.stats.remote() for s in self.shards])

    def clear(self) -> None:
        ray.get([s.clear.remote() for s in self.shards])

    def __eq__(self, other) -> bool:
        return isinstance(other, ShardedCache) and [s._actor_id for s in self.shards] == \
            [s._actor_id for s in other.shards]

    def __hash__(self) -> int:
        return hash(tuple(s._actor_id for s in self.shards))


def shard_of(pair: tuple, shards: int) -> int:
    """A stable hash (the same in every process, unlike hash()) modulo the shard count."""
    return zlib.crc32(repr(pair).encode()) % shards


def default_shards() -> int:
    """One shard per WORKERS_PER_SHARD CPUs of the cluster."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, math.ceil(cpus / WORKERS_PER_SHARD))


def get_cache(shards: int | None = None, max_entries: int = MAX_ENTRIES, name: str = CACHE_NAME) -> ShardedCache:
    """The cache of this Ray cluster, its shards created on first use; they outlive the driver. A
    cluster keeps the shard count it was first given (the shards are found by name). Shards are placed
    on the driver's node when they can be, and restarted (empty: it is only a cache) if their node is
    lost; calls to them are retried meanwhile."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)

    def shard(i: int):
        return LatencyCache.options(name=f"{name}-{i}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                                    max_restarts=-1, max_task_retries=-1, scheduling_strategy=here).remote(max_entries)

    count = _existing_shards(name) or shards or default_shards()
    return ShardedCache([shard(i) for i in range(count)])


def existing_cache(name: str = CACHE_NAME) -> ShardedCache | None:
    """The cache's shards if this cluster has them (none are created)."""
    count = _existing_shards(name)
    return ShardedCache([ray.get_actor(f"{name}-{i}", namespace=NAMESPACE) for i in range(count)]) if count else None


def _existing_shards(name: str) -> int:
    count = 0
    while True:
        try:
            ray.get_actor(f"{name}-{count}", namespace=NAMESPACE)
        except ValueError:
            return count
        count += 1
