"""Shared latency cache under load: get_many calls per second with many concurrent callers, for 1, 2
and 4 shards (a fresh local Ray; callers are Ray tasks that each make CALLS calls of KEYS keys).

    python bench/cache.py [--callers 8] [--calls 200] [--keys 100] [--cpus 2]

A worker of a sweep makes one claim call per simulation with an expensive backend (none with the
roofline), so calls/s per shard over a sweep's simulations/s per worker says how many workers a
shard keeps up with.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--callers", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--cpus", type=int, default=2)
    a = ap.parse_args()
    import ray

    from orchestrator.cache import LatencyCache, ShardedCache

    ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    def caller(cache, seed: int, calls: int, keys: int) -> int:
        pairs = [("fp", (True, seed * 100_000 + i, 1, 128)) for i in range(keys)]
        cache.put_many(pairs, [1.0] * keys)
        for _ in range(calls):
            cache.get_many(pairs)
        return calls

    print(f"{'shards':>6} {'callers':>7} {'calls':>7} {'seconds':>8} {'calls/s':>9} {'calls/s/shard':>14} "
          f"{'keys/s':>10}")
    for shards in (1, 2, 4):
        cache = ShardedCache([LatencyCache.remote() for _ in range(shards)])
        ray.get(caller.remote(cache, 999, 1, a.keys))  # warm: actors and workers up
        t0 = time.perf_counter()
        done = sum(ray.get([caller.remote(cache, i, a.calls, a.keys) for i in range(a.callers)]))
        wall = time.perf_counter() - t0
        # a caller's get_many over n shards is n actor calls: count what the shards served
        served = sum(s["calls"] for s in cache.stats())
        print(f"{shards:>6} {a.callers:>7} {done:>7} {wall:>8.2f} {done / wall:>9.0f} {served / wall / shards:>14.0f} "
              f"{done * a.keys / wall:>10.0f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
