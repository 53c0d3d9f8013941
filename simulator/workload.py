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


#: how requests arrive: all at t=0 (the RFC's window), a closed loop of `concurrency` in flight, or
#: an open Poisson stream at `request_rate`
ARRIVALS = ("burst", "closed", "poisson")
#: which requests the metrics are over: the steady ones (no warm-up, no drain), or all of them
MEASURES = ("steady", "all")
#: a closed loop with num_prompts = 0 sends this many prompts per unit of concurrency
PROMPTS_PER_CONCURRENCY = 8
#: a Poisson stream with num_prompts = 0 sends this many (`vllm bench serve`'s default)
POISSON_PROMPTS = 1000


@dataclass(frozen=True)
class Workload:
    """Identical requests. `arrival` "burst": `concurrency` requests all at t=0 (the RFC's candidate
    window); "closed": at most `concurrency` in flight, each finished request replaced by a new one
    from the next step on, `num_prompts` in all (what `vllm bench serve --max-concurrency` sends);
    "poisson": `num_prompts` requests at `request_rate` per second with gamma(`burstiness`)
    inter-arrival times (as `vllm bench serve --request-rate --burstiness`), seeded; the server
    admits them all (`concurrency` is not a cap; the scheduler's max_num_seqs is).

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
    arrival: str = "burst"
    num_prompts: int = 0          # 0: concurrency for a burst, PROMPTS_PER_CONCURRENCY x concurrency otherwise
    request_rate: float = 0.0     # requests per second (poisson)
    burstiness: float = 1.0       # gamma shape of inter-arrival times; 1 = Poisson
    seed: int = 0
    measure: str = "steady"       # "all": every request counts, warm-up and drain too (as benchmark clients)

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
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.measure not in MEASURES:
            raise ValueError(f"measure must be one of {MEASURES}, got {self.measure!r}")
        check_int("num_prompts", self.num_prompts, 0)
        check_int("seed", self.seed, 0)
        check_number("burstiness", self.burstiness, low=0, low_open=True)
        if self.arrival == "poisson":
            check_number("request_rate", self.request_rate, low=0, low_open=True)
        if self.arrival == "burst" and self.num_prompts not in (0, self.concurrency):
            raise ValueError(f"a burst sends its concurrency ({self.concurrency}) prompts; num_prompts="
                             f"{self.num_prompts} needs arrival 'closed' or 'poisson'")

    @property
    def prompts(self) -> int:
        """Requests sent in all (num_prompts resolved)."""
        if self.num_prompts:
            return self.num_prompts
        if self.arrival == "poisson":
            return POISSON_PROMPTS
        return self.concurrency if self.arrival == "burst" else PROMPTS_PER_CONCURRENCY * self.concurrency

    def arrival_times_ms(self):
        """Poisson: the seeded send time of every request (the first at 0), in ms."""
        import numpy as np

        rng = np.random.default_rng(self.seed)
        gaps = rng.gamma(self.burstiness, 1.0 / (self.request_rate * self.burstiness), self.prompts - 1)
        return np.concatenate(([0.0], np.cumsum(gaps))) * 1000.0

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
