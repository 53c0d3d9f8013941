"""The worker-side pricer: a per-process dict in front of the shared latency cache
(`orchestrator.cache`), then the latency model. Without a cache it is a plain local cache; Ray is
imported only through a cache that is given.
"""

from __future__ import annotations

import math
import time

#: the shared cache's answers for a missing key: price it yourself and share it, or another worker is
MINE, PENDING = "mine", "pending"


def plain(key) -> tuple:
    """A key as builtin tuples, for the shared cache (a ForwardKey is a tuple of its fields; a fused
    step shape a tuple of them): equal and hashing alike, without our class on the wire."""
    if key and isinstance(key[0], tuple):
        return tuple(tuple(k) for k in key)
    return tuple(key)


#: what asking the shared cache costs per key (9.6 ms for 1,000 keys measured here, one caller):
#: a backend cheaper than this per key prices locally and never asks
SHARED_KEY_MS = 0.01
#: seconds between asks for keys another worker is pricing
PENDING_POLL_S = 0.02
#: key lists whose prices are kept whole (a memoised plan's keys priced for one model are looked up
#: again by every scenario that shares them); emptied when full
PRICE_LISTS = 2048


class CachedPricer:
    """A pricer for `evaluate_point`: a per-process dict, then (for backends that cost more per key
    than asking, `cost_per_key_ms` > SHARED_KEY_MS) the cluster's shared cache, then the latency
    model. A key the shared cache lacks is claimed, priced by its claimant alone, and shared.
    Counts what it priced itself (`priced`), what the caches served (`local_hits`, `remote_hits`) and
    its calls to the shared cache (`round_trips`)."""

    def __init__(self, cache=None, owner: str = ""):
        import uuid

        self.cache = cache
        self.owner = owner or uuid.uuid4().hex
        self.local: dict[str, dict] = {}  # fingerprint -> {key: ms}
        self.lists: dict[tuple[str, int], tuple[tuple, list[float]]] = {}  # (fp, id(keys)) -> (keys, prices)
        self.priced = self.local_hits = self.remote_hits = self.lookups = self.round_trips = 0

    def prefetch(self, requests) -> None:
        """Make every key of `requests` [(latency model, keys, fused)] local: cheap backends price
        their misses in one call per model; expensive ones go through the shared cache."""
        wanted: dict[tuple, tuple] = {}  # (fp, key) -> (lm, key, fused)
        for lm, keys, fused in requests:
            fp = lm.fingerprint
            self.lookups += len(keys)
            if self._whole(fp, keys) is not None:
                self.local_hits += len(keys)
                continue
            known = self.local.setdefault(fp, {})
            missing = [k for k in keys if k not in known]
            self.local_hits += len(keys) - len(missing)
            for k in missing:
                pair = (fp, k)
                if pair in wanted:
                    self.local_hits += 1
                else:
                    wanted[pair] = (lm, k, fused)
        if not wanted:
            return
        shared = [p for p, (lm, _, _) in wanted.items() if self.cache is not None and shared_backend(lm)]
        self._price([p for p in wanted if self.cache is None or not shared_backend(wanted[p][0])], wanted)
        while shared:
            shared = self._through_cache(shared, wanted)

    def _through_cache(self, pairs, wanted) -> list:
        """One claim round: take what is known, price what we claimed, return what others are pricing."""
        answers = self.cache.claim_many([(fp, plain(k)) for fp, k in pairs], self.owner)
        self.round_trips += 1
        mine, pending = [], []
        for pair, v in zip(pairs, answers, strict=True):
            if v == MINE:
                mine.append(pair)
            elif v == PENDING:
                pending.append(pair)
            else:
                self.local[pair[0]][pair[1]] = v
                self.remote_hits += 1
        self._price(mine, wanted, share=True)
        if pending:
            time.sleep(PENDING_POLL_S)
        return pending

    def _price(self, pairs, wanted, share: bool = False) -> None:
        from simulator import price

        groups: dict[tuple, list] = {}
        for pair in pairs:
            lm, _, fused = wanted[pair]
            groups.setdefault((pair[0], fused), []).append(pair)
        for (_, fused), group in groups.items():
            lm = wanted[group[0]][0]
            values = price(lm, [wanted[p][1] for p in group], fused).tolist()
            self.local[group[0][0]].update(zip([k for _, k in group], values, strict=True))
            self.priced += len(group)
            if share:
                self.cache.put_many([(fp, plain(k)) for fp, k in group], values)
                self.round_trips += 1

    def lookup(self, lm, keys) -> list[float]:
        """Latencies of keys made local by `prefetch`."""
        fp = lm.fingerprint
        prices = self._whole(fp, keys)
        if prices is None:
            prices = list(map(self.local[fp].__getitem__, keys))
            if len(self.lists) >= PRICE_LISTS:
                self.lists.clear()
            self.lists[(fp, id(keys))] = (keys, prices)  # holding `keys` keeps its id from being reused
        return prices

    def _whole(self, fp: str, keys) -> list[float] | None:
        """The prices of this very key list for this model, if looked up before."""
        held = self.lists.get((fp, id(keys)))
        return held[1] if held is not None and held[0] is keys else None

    def __call__(self, lm, keys, fused: bool):
        self.prefetch([(lm, keys, fused)])
        return self.lookup(lm, keys)

    def take_stats(self) -> dict:
        stats = {"priced": self.priced, "local_hits": self.local_hits, "remote_hits": self.remote_hits,
                 "lookups": self.lookups, "round_trips": self.round_trips}
        self.priced = self.local_hits = self.remote_hits = self.lookups = self.round_trips = 0
        return stats


def shared_backend(lm) -> bool:
    """Whether pricing a key of `lm` costs more than asking the shared cache for it."""
    return getattr(lm, "cost_per_key_ms", math.inf) > SHARED_KEY_MS
