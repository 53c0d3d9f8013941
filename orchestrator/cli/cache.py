"""`servesweep cache`: the cluster's shared latency cache, for operators."""

from __future__ import annotations

from orchestrator.fields import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the Ray cluster's shared latency cache: stats or clear (for operators)")
    p.add_argument("action", choices=("stats", "clear"), help="stats: entries, hits, misses, evictions per shard; "
                   "clear: empty every shard")
    p.add_argument("--address", help="the Ray cluster (default RAY_ADDRESS)")
    p.set_defaults(func=cmd_cache)


def cmd_cache(a) -> int:
    import os

    address = a.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise InputError("--address", None, "a Ray cluster address (or RAY_ADDRESS): the cache lives on a cluster")
    from orchestrator.sweep import init_ray

    init_ray(address)
    return cache_command(a.action)


def cache_command(action: str) -> int:
    """Print the shards' stats, or clear them, on the Ray cluster this process is connected to."""
    from orchestrator.cache import CACHE_NAME, existing_cache

    cache = existing_cache(CACHE_NAME)
    if cache is None:
        print("no latency cache on this cluster (a sweep with an expensive latency backend creates it)")
        return 0
    if action == "clear":
        cache.clear()
        print(f"cleared {len(cache.shards)} shard(s)")
        return 0
    print(f"{'shard':>5} {'entries':>9} {'max':>9} {'hits':>9} {'misses':>9} {'evicted':>8} {'calls':>8}")
    for i, st in enumerate(cache.stats()):
        print(f"{i:>5} {st['entries']:>9} {st['max_entries']:>9} {st['hits']:>9} {st['misses']:>9} "
              f"{st['evicted']:>8} {st['calls']:>8}")
    return 0
