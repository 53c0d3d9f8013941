"""What is served: lengths, token budget, concurrency, prefix cache, MTP (RFC 2.2, 3.1.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from latency.checks import check_int, check_number
from simulator.blocks import KV_ADMISSIONS
from simulator.frontend import Frontend
from simulator.mix import RequestMix
from simulator.prompts import PromptPool, cached_on_hit


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
    """Requests of `input_length` / `output_length` tokens, or drawn from `mix` (then the two
    lengths are the mix's typical request, for display only). `arrival` "burst": `concurrency`
    requests all at t=0 (the RFC's candidate window); "closed": at most `concurrency` in flight,
    each finished request replaced by a new one from the next step on, `num_prompts` in all (what
    `vllm bench serve --max-concurrency` sends); "poisson": `num_prompts` requests at
    `request_rate` per second with gamma(`burstiness`) inter-arrival times (as `vllm bench serve
    --request-rate --burstiness`), seeded; the server admits them all (`concurrency` is not a cap;
    the scheduler's max_num_seqs is).

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
    mix: RequestMix | None = None  # per-request lengths; None: every request input_length / output_length
    warmup_requests: int = 0      # measure "all": the first this many requests are a benchmark's warm-up, not measured
    kv_blocks: int = 0            # a KV pool of this many 16-token blocks admits requests as vLLM does; 0: unbounded
    kv_admission: str = KV_ADMISSIONS[0]  # how a full pool admits (simulator.blocks.KV_ADMISSIONS)
    frontend: Frontend | None = None  # the API server between client and scheduler (closed, poisson); None: none
    prompt_pool: PromptPool | None = None  # prompts the client reuses, and the engine's cache of them; None: all new

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
        check_int("warmup_requests", self.warmup_requests, 0)
        check_int("kv_blocks", self.kv_blocks, 0)
        if self.kv_admission not in KV_ADMISSIONS:
            raise ValueError(f"kv_admission must be one of {KV_ADMISSIONS}, got {self.kv_admission!r}")
        if self.prompt_pool is not None and not isinstance(self.prompt_pool, PromptPool):
            raise ValueError(f"prompt_pool must be a simulator.prompts.PromptPool, got {self.prompt_pool!r}")
        if self.prompt_pool is not None and self.mix is not None and self.mix.trace is not None:
            raise ValueError("prompt_pool does not apply to a trace: a trace's requests are replayed as they are")
        if self.warmup_requests and self.measure != "all":
            raise ValueError(f"warmup_requests={self.warmup_requests} is a benchmark protocol's: "
                             "it needs measure 'all'")
        check_int("seed", self.seed, 0)
        check_number("burstiness", self.burstiness, low=0, low_open=True)
        timed_trace = self.mix is not None and self.mix.trace is not None and self.mix.trace.timed
        if self.arrival == "poisson":  # 0 replays a timed trace at its own times
            check_number("request_rate", self.request_rate, low=0, low_open=not timed_trace)
        if self.frontend is not None and not isinstance(self.frontend, Frontend):
            raise ValueError(f"frontend must be a simulator.frontend.Frontend, got {self.frontend!r}")
        if self.arrival == "burst" and self.num_prompts not in (0, self.concurrency):
            raise ValueError(f"a burst sends its concurrency ({self.concurrency}) prompts; num_prompts="
                             f"{self.num_prompts} needs arrival 'closed' or 'poisson'")

    @property
    def timed(self) -> bool:
        """Whether the schedule depends on time, so it is priced while planned: a Poisson stream, and a
        closed loop whose replacements pass a front end (they reach the scheduler at times, not steps)."""
        if self.arrival == "poisson":
            return True
        return self.arrival == "closed" and self.frontend is not None and self.frontend.active

    @property
    def prompts(self) -> int:
        """Requests sent in all (num_prompts resolved; a trace sends its requests)."""
        trace = self.mix.trace if self.mix is not None else None
        return sent_prompts(self.arrival, self.concurrency, self.num_prompts, None if trace is None else len(trace))

    def arrival_times_ms(self):
        """Poisson: the seeded send time of every request (the first at 0), in ms. A timed trace
        keeps its own times, scaled to `request_rate` on average when one is given."""
        trace = self.mix.trace if self.mix is not None else None
        if trace is not None and trace.timed:
            times = np.resize(np.array(trace.arrival_time), self.prompts) * 1000.0
            span = times[-1] - times[0]
            if self.request_rate and span > 0:
                times = times * (len(times) - 1) / (span / 1000.0) / self.request_rate
            return times
        rng = np.random.default_rng(self.seed)
        gaps = rng.gamma(self.burstiness, 1.0 / (self.request_rate * self.burstiness), self.prompts - 1)
        return np.concatenate(([0.0], np.cumsum(gaps))) * 1000.0

    def request_lengths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prompt, output, cached prompt tokens) of every request in send order. A trace is taken in
        file order (repeated if more prompts are sent); distributions are sampled with `seed` (a
        stream apart from the arrival times'); with a prompt pool each request is a pool entry, and
        with prefix caching a held prompt is served from the cache (`simulator.prompts`)."""
        n = self.prompts
        mix = self.mix
        pool = self.prompt_pool
        if mix is None and pool is None:
            return *self._lengths(n), np.full(n, self.cached_prefix_tokens, dtype=np.int64)
        cached = hit = None
        if pool is not None:  # each request is one of the pool's prompts, with that prompt's lengths
            draws = pool.draws(n, self.seed)
            entry_in, entry_out = self._lengths(pool.size)
            inputs, outputs = entry_in[draws[pool.warmup:]], entry_out[draws[pool.warmup:]]
            hit = pool.hits(draws, entry_in, self.concurrency if self.arrival != "poisson" else 1)
        elif mix.trace is not None:
            t = mix.trace
            inputs, outputs = np.resize(np.array(t.input_length), n), np.resize(np.array(t.output_length), n)
            cached = np.resize(np.array(t.cached_tokens), n) if t.cached_tokens is not None else None
        else:
            inputs, outputs = self._lengths(n)
        by_rate = np.floor(inputs * self.prefix_cache_hit_rate).astype(np.int64)
        cached = by_rate if cached is None else np.where(cached < 0, by_rate, cached)  # < 0: not given
        if hit is not None:  # a miss is served at the rate, a hit its whole prompt but the last block
            cached = np.where(hit, np.maximum(cached_on_hit(inputs), by_rate), by_rate)
        cached = np.minimum(cached, inputs - 1)  # at least one prompt token is computed
        return inputs.astype(np.int64), outputs.astype(np.int64), cached.astype(np.int64)

    def _lengths(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n (prompt, output) lengths: the fixed ones, or drawn from the mix with `seed` (a stream apart
        from the arrival times')."""
        if self.mix is None:
            return np.full(n, self.input_length, dtype=np.int64), np.full(n, self.output_length, dtype=np.int64)
        rng = np.random.default_rng([self.seed, 1])
        return self.mix.input.sample(rng, n), self.mix.output.sample(rng, n)

    @cached_property
    def kinds(self) -> RequestKinds:
        """The distinct requests of the workload and which one each request is."""
        if self.mix is None and self.prompt_pool is None:
            return RequestKinds.single(self.input_length, self.output_length, self.cached_prefix_tokens,
                                       self.prompts, self.tokens_per_decode_step)
        return RequestKinds.of(*self.request_lengths(), self.tokens_per_decode_step)

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
        return decode_steps(self.output_length, self.tokens_per_decode_step)

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


def sent_prompts(arrival: str, concurrency: int, num_prompts: int, trace_requests: int | None) -> int:
    """Requests a workload sends in all: `num_prompts` if given, else a trace's requests (closed or
    Poisson), else concurrency (burst), POISSON_PROMPTS or PROMPTS_PER_CONCURRENCY x concurrency."""
    if num_prompts:
        return num_prompts
    if trace_requests is not None and arrival != "burst":
        return trace_requests
    if arrival == "poisson":
        return POISSON_PROMPTS
    return concurrency if arrival == "burst" else PROMPTS_PER_CONCURRENCY * concurrency


def decode_steps(output_length: int, tokens_per_step: float) -> int:
    """Decode steps after the first token to produce the other output_length - 1 tokens."""
    if output_length <= 1:
        return 0
    return math.ceil((output_length - 1) / tokens_per_step - 1e-12)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: it holds an array
class RequestKinds:
    """Requests with the same (prompt, output, cached) are one kind; the timeline groups requests by
    kind. Arrays per kind: `input`, `output`, `cached`, `effective` (prompt tokens to compute),
    `decode_steps`; `kind_of[i]` is request i's kind (None: every request is kind 0)."""

    input: tuple[int, ...]
    output: tuple[int, ...]
    cached: tuple[int, ...]
    effective: tuple[int, ...]
    decode_steps: tuple[int, ...]
    kind_of: np.ndarray | None

    @classmethod
    def single(cls, input_length, output_length, cached, prompts, tokens_per_step) -> RequestKinds:
        return cls((input_length,), (output_length,), (cached,), (input_length - cached,),
                   (decode_steps(output_length, tokens_per_step),), None)

    @classmethod
    def of(cls, inputs, outputs, cached, tokens_per_step) -> RequestKinds:
        index: dict[tuple[int, int, int], int] = {}
        kind_of = np.array([index.setdefault(key, len(index)) for key in zip(inputs.tolist(), outputs.tolist(),
                                                                             cached.tolist(), strict=True)])
        keys = list(index)
        i, o, c = (tuple(k[j] for k in keys) for j in range(3))
        return cls(i, o, c, tuple(a - b for a, b in zip(i, c, strict=True)),
                   tuple(decode_steps(x, tokens_per_step) for x in o), kind_of if len(keys) > 1 else None)

    def runs(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(kind, requests) of requests lo..hi-1 in order, consecutive requests of one kind together."""
        if self.kind_of is None:
            return [(0, hi - lo)]
        out: list[tuple[int, int]] = []
        for k in self.kind_of[lo:hi].tolist():
            if out and out[-1][0] == k:
                out[-1] = (k, out[-1][1] + 1)
            else:
                out.append((k, 1))
        return out
