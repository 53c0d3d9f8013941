"""The KV cache's unit and how an engine admits requests into it.

One vocabulary for the admission rules: engine profiles name them (latency.engine.CAPACITY_SCHEDULERS).
vLLM allocates the cache in blocks of BLOCK_SIZE tokens (its default `--block-size`), which is what a
prefix-cache hit and KV-bound admission count in. When the cache is full, an engine admits requests by one
of KV_ADMISSIONS: "max-utilization" (vLLM's, and TensorRT-LLM's MAX_UTILIZATION: admit a request when its
prompt's blocks fit, preempt the newest running request when a decode needs a block) or
"guaranteed-no-evict" (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity scheduler: admit a request only
when its KV to the last token it may generate fits beside what every running request may reach; nothing
is ever preempted)."""

from latency.engine import CAPACITY_SCHEDULERS as KV_ADMISSIONS
from latency.engine import NO_EVICT

__all__ = ["BLOCK_SIZE", "KV_ADMISSIONS", "NO_EVICT", "held_kv_tokens"]

BLOCK_SIZE = 16


def held_kv_tokens(w, peak_kv_tokens: float, in_flight: int) -> float:
    """The KV tokens a load holds at its peak under its admission rule: what its plan without a pool held,
    or, admitted by NO_EVICT, every request in flight reserved to its last token (typical lengths)."""
    if w.kv_admission == NO_EVICT:
        return max(peak_kv_tokens, in_flight * (w.input_length + w.output_length))
    return peak_kv_tokens
