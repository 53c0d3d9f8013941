"""Benchmark protocols by name: how many requests a client sends, how many it sends first as a
warm-up (not measured), and what its means are over. A closed loop or Poisson stream is measured
as the named client measures it; a burst is the RFC's window whatever the protocol.

- `steady`: what a running deployment sees; warm-up and drain are left out (`measure` "steady").
- `aiperf`: `aiperf profile --concurrency C --num-requests 20*C --warmup-request-count 2*C`, as
  AIConfigurator's generated `bench_run.sh` runs it: 2C warm-up requests, then 20C measured, the
  drain included (num_prompts, when given, is the measured count; `Protocol.load`'s `per_client`, an
  engine profile's `[frontend] requests_per_client`, replaces the 20, as the script's
  AICONFIGURATOR_BENCH_MULTI_ROUND does). aiperf waits for every warm-up
  response before its profiling phase starts (its docs, tutorials/warmup.md: "By default, AIPerf
  waits indefinitely for all warmup responses before starting profiling"), so the measured phase
  starts from an idle engine, its C first requests at once; the warm-up is not played. Its prompts
  are not new ones: it makes `--num-dataset-entries` prompts (100 by default; its ConversationConfig:
  "reused until benchmarking is complete") and draws each request's at random, the warm-up's too,
  so an engine with a prefix cache serves most of them from it (`simulator.prompts`).
- `vllm-bench`: `vllm bench serve --max-concurrency C --num-prompts P`: every request counted, no
  warm-up; P defaults to the client's 1000, each its own random prompt (`--dataset-name random`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: aiperf's --num-dataset-entries default: the prompts it makes and reuses (its ConversationDefaults.NUM)
AIPERF_DATASET_ENTRIES = 100


@dataclass(frozen=True)
class Protocol:
    """Requests sent and warm-up per unit of concurrency (or fixed), and the measure they imply."""

    name: str
    measure: str                   # "steady" or "all"
    measured_per_concurrency: int = 0  # 0: the workload's own num_prompts rule
    warmup_per_concurrency: int = 0
    default_prompts: int = 0       # a fixed default request count (vllm bench serve's --num-prompts)
    warmup_drains: bool = False    # the client waits for every warm-up response before it measures
    prompt_pool: int = 0           # distinct prompts it draws each request's from at random; 0: every one new

    def load(self, arrival: str, concurrency: int, num_prompts: int, measure: str,
             per_client: int = 0) -> tuple[int, int, str]:
        """(num_prompts played, warm-up requests among them, measure) for a closed loop of `concurrency`
        or a Poisson stream where the user asked for `num_prompts` (0: the default). A Poisson stream
        has no concurrency to scale by: it sends num_prompts (or the stream's default), every one
        counted. A warm-up that drains before the measured phase is not played: the engine is idle
        when measuring starts, as it was before the warm-up. `per_client` (0: the protocol's own)
        replaces the measured requests per client of a protocol that counts them so (aiperf's)."""
        if self.name == "steady" or arrival == "burst":
            return num_prompts, 0, measure
        if arrival == "poisson":
            return num_prompts, 0, self.measure
        rounds = (per_client or self.measured_per_concurrency) if self.measured_per_concurrency else 0
        measured = num_prompts or rounds * concurrency or self.default_prompts
        warmup = 0 if self.warmup_drains else self.warmup_per_concurrency * concurrency
        return measured + warmup, warmup, self.measure

    def pool(self, arrival: str, concurrency: int) -> tuple[int, int]:
        """(prompts in the client's pool, pool draws before the played requests: a drained warm-up's)
        of a closed loop of `concurrency` or a Poisson stream; (0, 0) when every prompt is new."""
        if not self.prompt_pool or arrival == "burst":
            return 0, 0
        drained = self.warmup_per_concurrency * concurrency if self.warmup_drains and arrival == "closed" else 0
        return self.prompt_pool, drained


PROTOCOLS = {p.name: p for p in (
    Protocol("steady", "steady"),
    Protocol("aiperf", "all", measured_per_concurrency=20, warmup_per_concurrency=2, warmup_drains=True,
             prompt_pool=AIPERF_DATASET_ENTRIES),
    Protocol("vllm-bench", "all", default_prompts=1000),
)}
BENCHMARKS = tuple(PROTOCOLS)


def protocol(name: str) -> Protocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"benchmark must be one of {BENCHMARKS}, got {name!r}") from None
