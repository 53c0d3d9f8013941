"""What is served: lengths, token budget, concurrency, prefix cache, MTP (RFC 2.2, 3.1.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from latency.checks import check_int, check_number


@dataclass(frozen=True)
class PrefillChunk:
    """One prefill chunk of a request: `query_len` new tokens, `seq_len` context after it."""

    index: int
    query_len: int
    seq_len: int


@dataclass(frozen=True)
class Workload:
    """`concurrency` identical requests that all arrive at t=0 (the RFC's candidate window).

    `mtp_tokens` draft tokens are verified in each decode step; `mtp_acceptance_rates[i]` is the
    probability that draft i is accepted, so a step advances 1 + sum(rates[:mtp_tokens]) tokens.
    """

    input_length: int
    output_length: int
    max_batched_tokens: int
    concurrency: int
    prefix_cache_hit_rate: float = 0.0
    mtp_tokens: int = 0
    mtp_acceptance_rates: tuple[float, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_int("input_length", self.input_length, 1)
        check_int("output_length", self.output_length, 1)
        check_int("max_batched_tokens", self.max_batched_tokens, 1)
        check_int("concurrency", self.concurrency, 1)
        check_int("mtp_tokens", self.mtp_tokens, 0)
        rate = check_number("prefix_cache_hit_rate", self.prefix_cache_hit_rate, low=0, high=1, high_open=True)
        if self.effective_input_length < 1:
            raise ValueError(
                f"prefix_cache_hit_rate={rate} leaves effective_input_length="
                f"{self.effective_input_length} for input_length={self.input_length}; it must be >= 1"
            )
        if self.max_batched_tokens < 1 + self.mtp_tokens:
            raise ValueError(
                f"max_batched_tokens={self.max_batched_tokens} cannot hold one decode step of "
                f"1 + mtp_tokens={self.mtp_tokens} tokens"
            )
        rates = tuple(self.mtp_acceptance_rates)
        object.__setattr__(self, "mtp_acceptance_rates", rates)
        if len(rates) < self.mtp_tokens:
            raise ValueError(
                f"mtp_acceptance_rates needs {self.mtp_tokens} values (one per MTP token), got {len(rates)}"
            )
        for r in rates:
            check_number("mtp_acceptance_rates", r, low=0, high=1)

    @property
    def cached_prefix_tokens(self) -> int:
        return math.floor(self.input_length * self.prefix_cache_hit_rate)

    @property
    def effective_input_length(self) -> int:
        return self.input_length - self.cached_prefix_tokens

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after the first one (the RFC's R)."""
        return self.output_length - 1

    @property
    def decode_query_len(self) -> int:
        return 1 + self.mtp_tokens

    @property
    def tokens_per_decode_step(self) -> float:
        return 1.0 + sum(self.mtp_acceptance_rates[: self.mtp_tokens])

    @property
    def decode_steps(self) -> int:
        """Decode steps a request needs after its first token."""
        if self.decode_tokens == 0:
            return 0
        return math.ceil(self.decode_tokens / self.tokens_per_decode_step - 1e-12)

    def chunk_plan(self) -> list[PrefillChunk]:
        return chunk_plan(self.effective_input_length, self.max_batched_tokens)

    @property
    def prefill_num_chunks(self) -> int:
        return -(-self.effective_input_length // self.max_batched_tokens)


def chunk_plan(effective_input_length: int, max_batched_tokens: int) -> list[PrefillChunk]:
    """Chunks of at most `max_batched_tokens` over the effective prompt (RFC 3.1.3)."""
    check_int("effective_input_length", effective_input_length, 1)
    check_int("max_batched_tokens", max_batched_tokens, 1)
    chunks, done = [], 0
    while done < effective_input_length:
        q = min(max_batched_tokens, effective_input_length - done)
        done += q
        chunks.append(PrefillChunk(len(chunks), q, done))
    return chunks
