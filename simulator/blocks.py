"""The KV cache's unit and how an engine admits requests into it.

One vocabulary for the admission rules: engine profiles name them (latency.engine.CAPACITY_SCHEDULERS).
vLLM allocates the cache in blocks of BLOCK_SIZE tokens (its default `--block-size`), which is what a
prefix-cache hit and KV-bound admission count in. When the cache is full, an engine admits requests by one
of KV_ADMISSIONS: "max-utilization" (vLLM's, and TensorRT-LLM's MAX_UTILIZATION: admit a request when its
prompt's blocks fit, preempt the newest running request when a decode needs a block) or
"guaranteed-no-evict" (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity scheduler: admit a request only
when its KV to the last token it may generate fits beside what every running request may reach; nothing
is ever preempted) or "new-token-ratio" (SGLang's PrefillAdder: admit a request when its prompt and every
token it may generate, at most CLIP_NEW_TOKENS, fit in the free cache less its new-token ratio (`NewTokenRatio`)
of the tokens the running requests have left to generate; a decode that finds no block preempts as vLLM's does)."""

import math
from typing import NamedTuple

from latency.engine import CAPACITY_SCHEDULERS as KV_ADMISSIONS
from latency.engine import NEW_TOKEN_RATIO, NO_EVICT

__all__ = ["BLOCK_SIZE", "CLIP_NEW_TOKENS", "KV_ADMISSIONS", "NEW_TOKEN_DECAY", "NEW_TOKEN_RATIO", "NEW_TOKEN_SHARE",
           "NO_EVICT", "RETRACT_DECODE_STEPS", "KVPool", "NewTokenRatio", "held_kv_tokens", "kv_pool"]

BLOCK_SIZE = 16
#: SGLang's new-token ratio (sglang/srt/environ.py and managers/scheduler.py, 0.5.8.post1): it starts at
#: SGLANG_INIT_NEW_TOKEN_RATIO and each decode batch lowers it by INIT x (1 - SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR) /
#: SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS down to INIT x FACTOR (NEW_TOKEN_SHARE, where a benchmark's warm-up has left
#: it); a retraction sets it to what the requests kept have decoded and SGLANG_RETRACT_DECODE_STEPS more each, over
#: what they may generate (schedule_batch.retract_decode), from where it falls again
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO_FACTOR, NEW_TOKEN_RATIO_DECAY_STEPS = 0.7, 0.14, 600
NEW_TOKEN_SHARE = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_DECAY = (INIT_NEW_TOKEN_RATIO - NEW_TOKEN_SHARE) / NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20
#: the most tokens SGLang reserves for one request's output (its SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION); here for
#: the request admitted (the running ones' left to generate are counted whole)
CLIP_NEW_TOKENS = 4096


def held_kv_tokens(w, peak_kv_tokens: float, in_flight: int) -> float:
    """The KV tokens a load holds at its peak under its admission rule: what its plan without a pool held,
    or, admitted by NO_EVICT, every request in flight reserved to its last token (typical lengths); admitted by
    NEW_TOKEN_RATIO, as much and a block more each (and two for the null block and the rounding): SGLang's rule,
    which counts free tokens where requests hold whole blocks, refuses nobody while that fits."""
    whole = w.input_length + w.output_length
    if w.kv_admission == NO_EVICT:
        return max(peak_kv_tokens, in_flight * whole)
    if w.kv_admission == NEW_TOKEN_RATIO:  # its rule counts in tokens what is held in blocks: a block each to spare
        return max(peak_kv_tokens, in_flight * (whole + BLOCK_SIZE) + 2 * BLOCK_SIZE)
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


class NewTokenRatio:
    """SGLang's share of what the running requests have left to generate that its admission holds back: the
    value a retraction set, less NEW_TOKEN_DECAY for each decode step since (counted, so a run of steps taken
    at once lowers it exactly as steps taken one by one), not below NEW_TOKEN_SHARE."""

    __slots__ = ("since", "steps")

    def __init__(self):
        self.since, self.steps = NEW_TOKEN_SHARE, 0

    @property
    def value(self) -> float:
        return max(self.since - self.steps * NEW_TOKEN_DECAY, NEW_TOKEN_SHARE)

    def retracted(self, decoded: int, may_generate: int, kept: int) -> None:
        """After a retraction: the `kept` requests have decoded `decoded` tokens of the `may_generate` they may."""
        self.since, self.steps = min(1.0, (decoded + RETRACT_DECODE_STEPS * kept) / (may_generate + 1)), 0
