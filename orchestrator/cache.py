"""The shared latency cache: ONE named Ray actor holding latencies by (fingerprint, key).
The worker-side pricer that puts a per-process dict in front of it is `orchestrator.pricer`.

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
    """The one cache actor of this Ray cluster, created on first use; it outlives the driver. It is
    placed on the driver's node when it can be, and restarted (empty: it is only a cache) if its
    node is lost; calls to it are retried meanwhile."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return LatencyCache.options(name=CACHE_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                                max_restarts=-1, max_task_retries=-1, scheduling_strategy=here).remote()
