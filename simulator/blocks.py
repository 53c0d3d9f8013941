"""The KV cache's unit and how an engine admits requests into it.

One vocabulary for the admission rules: engine profiles name them (latency.engine.CAPACITY_SCHEDULERS).
vLLM allocates the cache in blocks of BLOCK_SIZE tokens (its default `--block-size`), which is what a
prefix-cache hit and KV-bound admission count in. When the cache is full, an engine admits requests by one
of KV_ADMISSIONS: "max-utilization" (vLLM's, and TensorRT-LLM's MAX_UTILIZATION: admit a request when its
prompt's blocks fit, preempt the newest running request when a decode needs a block) or
"guaranteed-no-evict" (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity scheduler: admit a request only
when its KV to the last token it may generate fits beside what every running request may reach; nothing
is ever preempted)."""

import math
from typing import NamedTuple

from latency.engine import CAPACITY_SCHEDULERS as KV_ADMISSIONS
from latency.engine import NO_EVICT

__all__ = ["BLOCK_SIZE", "KV_ADMISSIONS", "NO_EVICT", "KVPool", "held_kv_tokens", "kv_pool"]

BLOCK_SIZE = 16


def held_kv_tokens(w, peak_kv_tokens: float, in_flight: int) -> float:
    """The KV tokens a load holds at its peak under its admission rule: what its plan without a pool held,
    or, admitted by NO_EVICT, every request in flight reserved to its last token (typical lengths)."""
    if w.kv_admission == NO_EVICT:
        return max(peak_kv_tokens, in_flight * (w.input_length + w.output_length))
    return peak_kv_tokens


class KVPool(NamedTuple):
    """The engine's KV pool a load may outgrow: its blocks, and the most KV tokens the load's plan without a
    pool may hold at its peak and still fit in it (negative: no plan fits, whatever it holds)."""

    blocks: int
    fits: float


def kv_pool(w, capacity_tokens: float, in_flight: int) -> KVPool:
    """The pool of `capacity_tokens` a load of `in_flight` requests is admitted into where its plan without
    one outgrows it: what that plan holds (`held_kv_tokens`) and a block a request in flight (the rounding)
    pass the capacity."""
    fits = capacity_tokens - BLOCK_SIZE * in_flight
    if held_kv_tokens(w, 0.0, in_flight) > fits:
        fits = -math.inf
    return KVPool(int(capacity_tokens // BLOCK_SIZE), fits)
