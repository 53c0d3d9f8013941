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

#: the KV block a prefix cache hits in whole (vLLM's default block size, tokens)
PREFIX_BLOCK = 16
#: the seed stream of a pool's draws (apart from the arrival times', the lengths' and the front end's)
POOL_STREAM = 3


def cached_on_hit(prompt: np.ndarray) -> np.ndarray:
    """Prompt tokens a prefix-cache hit serves: whole blocks, at least one token left to compute."""
    return (prompt - 1) // PREFIX_BLOCK * PREFIX_BLOCK


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
    """`size` prompts a client draws from at random (seeded), `warmup` draws made before the played
    requests (a drained warm-up), the first `wave` played requests sent at once."""

    size: int
    warmup: int
    wave: int
    seed: int

    def draws(self, n: int) -> np.ndarray:
        """The pool entry of the warm-up's draws, then of the n played requests, in send order."""
        return np.random.default_rng([self.seed, POOL_STREAM]).integers(0, self.size, self.warmup + n)

    def hits(self, prompt_of_entry: np.ndarray, n: int, capacity: int | None) -> np.ndarray:
        """Whether each of the n played requests finds its prompt cached (`prompt_of_entry[j]`: entry
        j's prompt tokens; `capacity`: the tokens the cache keeps, None: all)."""
        cache, hit = PromptCache(capacity), np.zeros(n, dtype=bool)
        draws = self.draws(n).tolist()
        for entry in draws[: self.warmup]:
            cache.keep(entry, int(prompt_of_entry[entry]))
        played = draws[self.warmup:]
        for i, entry in enumerate(played):
            hit[i] = cache.hit(entry)
            if i >= self.wave:
                cache.keep(entry, int(prompt_of_entry[entry]))
            elif i == self.wave - 1:  # the wave's prompts are cached once the whole wave is sent
                for e in played[: self.wave]:
                    cache.keep(e, int(prompt_of_entry[e]))
        return hit
