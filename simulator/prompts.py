"""A benchmark client's prompt pool and the engine's prefix cache: which requests find their prompt
cached.

aiperf does not make a new prompt per request: it makes `--num-dataset-entries` prompts (100 by
default) and draws each request's from them at random, with replacement, "reused until benchmarking
is complete" (its ConversationConfig). An engine with a prefix cache (vLLM V1's
`--enable-prefix-caching`, on by default; SGLang's radix cache; TensorRT-LLM's KV block reuse) then
computes only the last block of a prompt it has seen and still holds: vLLM hits whole 16-token
blocks and always computes at least one token, so a hit leaves `prompt - floor((prompt - 1) / 16) *
16` tokens to compute. The cache keeps finished prompts in the KV pool's free blocks, least
recently used first out (`PromptCache`). A request sent in the same wave as the first one with its
prompt (the C requests a closed loop sends at once) finds nothing cached: that prompt is still being
computed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from latency.checks import check_int
from simulator.blocks import BLOCK_SIZE

#: the seed stream of a pool's draws (apart from the arrival times', the lengths' and the front end's)
POOL_STREAM = 3


def cached_on_hit(prompt: np.ndarray) -> np.ndarray:
    """Prompt tokens a prefix-cache hit serves: whole KV blocks, at least one token left to compute."""
    return (prompt - 1) // BLOCK_SIZE * BLOCK_SIZE


class PromptCache:
    """The prompts the engine's KV pool still holds, least recently used first out, within
    `capacity` tokens (None: every prompt is kept)."""

    def __init__(self, capacity: int | None):
        self.capacity, self.held, self.tokens = capacity, OrderedDict(), 0

    def hit(self, entry: int) -> bool:
        """Whether `entry` is held; a hit makes it the most recently used."""
        if entry in self.held:
            self.held.move_to_end(entry)
            return True
        return False

    def keep(self, entry: int, tokens: int) -> None:
        """Hold `entry` (`tokens` long), dropping the least recently used ones it does not fit beside."""
        if entry in self.held or (self.capacity is not None and tokens > self.capacity):
            return
        self.held[entry] = tokens
        self.tokens += tokens
        while self.capacity is not None and self.tokens > self.capacity:
            self.tokens -= self.held.popitem(last=False)[1]


@dataclass(frozen=True)
class PromptPool:
    """A client that draws every prompt at random from `size` it reuses, `warmup` of its draws made
    before the played requests (a drained warm-up), against an engine that caches prompts
    (`cached`), keeping `cache_tokens` prompt tokens of finished requests (None: all)."""

    size: int
    warmup: int = 0
    cached: bool = False
    cache_tokens: int | None = None

    def __post_init__(self) -> None:
        check_int("prompt_pool.size", self.size, 1)
        check_int("prompt_pool.warmup", self.warmup, 0)
        if self.cache_tokens is not None:
            check_int("prompt_pool.cache_tokens", self.cache_tokens, 0)

    def draws(self, n: int, seed: int) -> np.ndarray:
        """The pool entry of the warm-up's draws, then of the n played requests, in send order."""
        return np.random.default_rng([seed, POOL_STREAM]).integers(0, self.size, self.warmup + n)

    def hits(self, draws: np.ndarray, prompt_of_entry: np.ndarray, wave: int) -> np.ndarray:
        """Whether each played request finds its prompt cached: `draws` are `draws()`'s (the warm-up's
        first), `prompt_of_entry[j]` entry j's prompt tokens, and the first `wave` played requests are
        sent at once. All False when the engine does not cache prompts."""
        draws = draws.tolist()
        played = draws[self.warmup:]
        hit = np.zeros(len(played), dtype=bool)
        if not self.cached:
            return hit
        cache = PromptCache(self.cache_tokens)
        for entry in draws[: self.warmup]:
            cache.keep(entry, int(prompt_of_entry[entry]))
        for i, entry in enumerate(played):
            hit[i] = cache.hit(entry)
            if i >= wave:
                cache.keep(entry, int(prompt_of_entry[entry]))
            elif i == wave - 1:  # the wave's prompts are cached once the whole wave is sent
                for e in played[:wave]:
                    cache.keep(e, int(prompt_of_entry[e]))
        return hit
