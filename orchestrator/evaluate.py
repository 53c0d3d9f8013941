"""One evaluated point: a scenario's instance at one load (a concurrency, or a Poisson request rate),
simulated and checked for memory and the limits."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from functools import lru_cache

from latency import load_engine
from latency.memory import GIB
from orchestrator.jobs import Job
from orchestrator.scenario import Layout, Scenario
from simulator import PRICERS, Frontend, PrefillFirst, TokenBudget, Workload, plan, price, step_times
from simulator.benchmarks import protocol
from simulator.blocks import KVPool, kv_pool
from simulator.metrics import goodput, measure
from simulator.prompts import PromptPool

PHASE = {"agg": "both", "prefill": "prefill", "decode": "decode"}
#: the Poisson capacity search walks a geometric grid of rates: point n offers
#: RATE_BASE * RATE_GROWTH ** (n - 1) requests/s (5 % apart, from 0.01 req/s)
RATE_BASE, RATE_GROWTH = 0.01, 1.05
#: plans kept per process, least recently used out first, up to PLANS of them and PLAN_BYTES of their
#: arrays: a plan depends on the workload, the policy, the phase and the decode context rule, never
#: on the model, device or layout, so the layouts of a search and the scenarios of a plan family
#: share them. A family of the cluster-scale sweep holds up to 1,210 plans of ~16 kB each; 512 by
#: count alone made a worker plan 13 % of them again
PLANS, PLAN_BYTES = 8192, 512 * 1024**2


class PlanMemo:
    """The process's plans by their arguments. `made` counts the plans it had to make. A `shelf`
    (orchestrator.runner.PlanShelf on a Ray searcher; None inline) holds plans other processes made,
    by signature: a plan missing here is read from it before it is made, and one made here is offered
    to it with the seconds it took."""

    def __init__(self, plans: int = PLANS, budget: int = PLAN_BYTES):
        self.plans, self.budget = plans, budget
        self.memo: OrderedDict = OrderedDict()  # key -> (plan, bytes of its arrays)
        self.bytes = self.made = 0
        self.lock = threading.Lock()  # the web page plans in threads
        self.shelf = None

    def __call__(self, w: Workload, scheduler, phase: str, decode_context: str):
        key = (w, scheduler, phase, decode_context)
        with self.lock:
            hit = self.memo.get(key)
            if hit is not None:
                self.memo.move_to_end(key)
                return hit[0]
        shelf, planned = self.shelf, None
        if shelf is not None:
            signature = _plan_signature(w, scheduler, phase, decode_context)
            planned = shelf.get(signature)
        if planned is None:
            started = time.perf_counter()
            planned = plan(w, scheduler, phase=phase, decode_context=decode_context)
            if shelf is not None:
                shelf.offer(signature, planned, time.perf_counter() - started)
            with self.lock:
                self.made += 1
        self._keep(key, planned)
        return planned

    def _keep(self, key, planned) -> None:
        """Remember `planned`, the least recently used out beyond PLANS plans or PLAN_BYTES."""
        size = _array_bytes(planned)
        with self.lock:
            if key not in self.memo:
                self.memo[key] = (planned, size)
                self.bytes += size
            while self.memo and (len(self.memo) > self.plans or self.bytes > self.budget):
                self.bytes -= self.memo.popitem(last=False)[1][1]


def _array_bytes(p) -> int:
    """The bytes of a plan's arrays (its steps and finish records: what grows with a long plan)."""
    return sum(v.nbytes for v in vars(p).values() if hasattr(v, "nbytes"))


_plan = PlanMemo()


def use_shelf(shelf) -> None:
    """Read missing plans from `shelf` and offer it the ones made here (None: this process alone)."""
    _plan.shelf = shelf


#: measured points kept per process: scenarios that differ only in their limits (a sweep's limit grid)
#: evaluate many of the same points (42 % of a cluster-scale sweep's), and only goodput depends on limits
MEASURED = 1024
_measured: OrderedDict = OrderedDict()  # point_key -> (metrics, judged, the limits judged against)
_measured_lock = threading.Lock()  # the web page serves requests in threads


def grid_rate(n: int) -> float:
    return RATE_BASE * RATE_GROWTH ** (n - 1)


def workload(s: Scenario, max_batched_tokens: int, n: int, rate: float | None = None) -> Workload:
    """The workload of search point `n`: concurrency n, or (Poisson) the n-th rate of the grid
    unless `rate` is given."""
    poisson = s.arrival == "poisson"
    bench = protocol(s.benchmark)
    frontend, per_client = front_end(s.engine)
    prompts, warmup, measured = bench.load(s.arrival, 1 if poisson else n, s.num_prompts if s.arrival != "burst" else 0,
                                           s.measure, per_client)
    pool = (PromptPool(*bench.pool(s.arrival, n), cached=s.prefix_caching == "on") if s.reused_prompts else None)
    return Workload(s.typical("input_length"), s.typical("output_length"), max_batched_tokens, 1 if poisson else n,
                    s.prefix_cache_hit_rate, s.mtp_tokens, s.mtp_acceptance_rates, arrival=s.arrival,
                    num_prompts=prompts, request_rate=(rate if rate is not None else grid_rate(n)) if poisson else 0.0,
                    burstiness=s.burstiness, seed=s.seed, measure=measured, mix=s.request_mix,
                    warmup_requests=warmup, frontend=frontend if s.arrival != "burst" else None,
                    prompt_pool=pool, kv_admission=s.capacity_scheduler)


def timed(s: Scenario) -> bool:
    """Whether the scenario's plans depend on time, so each is priced while planned with its job's layout
    (Poisson, or a closed loop behind a front end; `Workload.timed`, whatever the budget or concurrency)."""
    return workload(s, max(s.max_batched_tokens), 1).timed


def with_prompt_cache(w: Workload, lm) -> Workload:
    """`w` with the prompt tokens its engine's cache keeps of finished requests, where it reuses prompts:
    the KV pool beyond its requests in flight (a typical request each), least recently used out."""
    if w.prompt_pool is None or not w.prompt_pool.cached:
        return w
    mem = lm.memory_for(w.max_batched_tokens)
    capacity = mem.tokens_left(mem.requests_held(w.concurrency, w.input_length, w.output_length))
    in_flight = w.concurrency * (w.input_length + w.output_length)
    return replace(w, prompt_pool=replace(w.prompt_pool, cache_tokens=max(0, int(capacity - in_flight))))


def front_end(engine: str) -> tuple[Frontend | None, int]:
    """The engine profile's [frontend] table: its times (None when it names none), and the measured requests
    a closed-loop client sends (0: the benchmark protocol's own); a profile file edited since is read again."""
    return _front_end(load_engine(engine).frontend)


@lru_cache(maxsize=16)
def _front_end(table: tuple) -> tuple[Frontend | None, int]:
    times = {key: value for key, value in table if key != "requests_per_client"}
    return (Frontend(**times) if times else None), int(dict(table).get("requests_per_client", 0))


def direct_pricer(lm, keys, fused: bool):
    """Price a plan's keys with the latency model itself, in one call."""
    return price(lm, keys, fused)


def plan_point(s: Scenario, job: Job, n: int, rate: float | None = None):
    """Phase one of a point: the latency model and the planned schedule. A Poisson schedule depends
    on time, so its steps are priced while planned (a per-process step pricer remembers them). A load
    that outgrows the engine's KV pool is planned as admitted into it, and only that plan is used: a timed
    plan without the pool stops as soon as it outgrows it (`plan`'s peak_limit), and a load that
    outgrows it whatever its plan holds is not planned without it."""
    lm, scheduler = s.latency_model(job.layout), s.make_scheduler(n)
    w = with_prompt_cache(workload(s, job.max_batched_tokens, n, rate), lm)
    pool = _kv_pool(w, scheduler, job, lm)
    planned = _planned(w, scheduler, job.role, s.decode_context, lm, None if pool is None else pool.fits)
    if pool is not None and (planned is None or planned.peak_kv_tokens > pool.fits):
        try:
            return lm, _planned(replace(w, kv_blocks=pool.blocks), scheduler, job.role, s.decode_context, lm)
        except RuntimeError:  # the pool cannot hold one request: the point does not fit
            pass
    return lm, planned if planned is not None else _planned(w, scheduler, job.role, s.decode_context, lm)


def _planned(w: Workload, scheduler, role: str, decode_context: str, lm, peak_limit: float | None = None):
    """The plan of a workload: memoised when it depends on counts only, priced while planned when timed.
    None once it holds more KV tokens than `peak_limit` (timed), or at once where the limit is below 0 (any
    plan holds more: none is made)."""
    if peak_limit is not None and peak_limit < 0:
        return None
    if w.timed:
        PLANS_MADE.append(_plan_signature(w, scheduler, role, decode_context, lm.fingerprint))
        return plan(w, scheduler, phase=PHASE[role], decode_context=decode_context,
                    step_ms=PRICERS.get(lm, scheduler), peak_limit=peak_limit)
    made = _plan.made
    planned = _plan(w, scheduler, PHASE[role], decode_context)
    if _plan.made > made:
        PLANS_MADE.append(_plan_signature(w, scheduler, role, decode_context))
    return planned


#: signatures of the plans this process made since `take_plans_made` was last asked: a sweep counts
#: plans made against distinct plans (two workers planning one family both count)
PLANS_MADE: list[str] = []


def _plan_signature(w, scheduler, role: str, decode_context: str, fingerprint: str = "") -> str:
    """What a plan depends on, as a short digest (a timed plan also on the prices: the fingerprint)."""
    import hashlib

    text = repr((w, scheduler.name, sorted(vars(scheduler).items()), role, decode_context, fingerprint))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def take_plans_made() -> list[str]:
    made = PLANS_MADE[:]
    PLANS_MADE.clear()
    return made


def _kv_pool(w: Workload, scheduler, job: Job, lm) -> KVPool | None:
    """The engine's KV pool a load is admitted into where its cache may bind (`kv_pool`). None: admission is
    not modelled here (decode-first, MTP, a prefill or decode instance)."""
    if not isinstance(scheduler, (TokenBudget, PrefillFirst)) or job.role != "agg" or w.mtp_tokens:
        return None
    in_flight = w.prompts if w.arrival != "closed" else min(w.prompts, w.concurrency)
    seats = getattr(scheduler, "max_num_seqs", None) or in_flight  # (prefill-first has no cap)
    mem = lm.memory_for(w.max_batched_tokens)
    running = mem.requests_held(min(in_flight, seats), w.input_length, w.output_length)  # each with its state
    return kv_pool(w, mem.tokens_left(running), in_flight)


def point_key(s: Scenario, job: Job, n: int, rate: float | None = None) -> tuple:
    """What a point's simulation depends on: the scenario without its limits, the job and the load."""
    return s.without_limits, job, n, rate


def finish_point(s: Scenario, job: Job, planned, prices, n: int, rate: float | None = None) -> dict:
    """Phase two: replay the plan with its prices; the row of the point (remembered, see `known_point`)."""
    limits = _limits(s)
    m, judged = measure(planned, step_times(planned, prices), job.layout.rank_devices, s.slo_percentile or None,
                        limits)
    with _measured_lock:
        if len(_measured) >= MEASURED:
            _measured.popitem(last=False)
        _measured[point_key(s, job, n, rate)] = (m, judged, limits)
    return _row(s, job, m)


def measured_before(key: tuple) -> bool:
    """Whether the point of this `point_key` was measured in this process (and is still remembered)."""
    return key in _measured


def known_point(s: Scenario, job: Job, n: int, rate: float | None = None) -> dict | None:
    """The row of a point measured in this process before, for this scenario or one that differs only
    in its limits (judged again against these limits: its goodput); None if it was not."""
    key = point_key(s, job, n, rate)
    with _measured_lock:
        seen = _measured.get(key)
        if seen is None:
            return None
        _measured.move_to_end(key)
    m, judged, judged_at = seen
    limits = _limits(s)
    if judged_at != limits:
        m = replace(m, goodput=goodput(judged, limits))
    return _row(s, job, m)


def _limits(s: Scenario) -> tuple:
    """The limit pair goodput is judged against: the scenario's only one (none if it has several)."""
    pairs = s.limit_pairs()
    return pairs[0] if len(pairs) == 1 else (None, None)


def _row(s: Scenario, job: Job, m) -> dict:
    row = point_row(s, job.layout, job.role, m, s.latency_model(job.layout).memory_for(m.max_batched_tokens))
    if len(s.limit_pairs()) > 1:
        row["goodput"] = math.nan  # several limit pairs: goodput has no single meaning
    return row


def evaluate_point(s: Scenario, job: Job, n: int, pricer=direct_pricer, rate: float | None = None) -> dict:
    """Simulate one instance of `job` at search point `n` (or `rate`); throughputs in the row are for
    all dp instances. `pricer(lm, keys, fused)` prices the plan's distinct keys (a cache may stand
    in front). A point measured before (`known_point`) is not simulated again."""
    row = known_point(s, job, n, rate)
    if row is not None:
        return row
    lm, planned = plan_point(s, job, n, rate)
    return finish_point(s, job, planned, planned_prices(lm, planned, pricer), n, rate)


def planned_prices(lm, planned, pricer=direct_pricer):
    """Prices aligned with `planned.price_keys`: a timed plan's from the step pricer that priced each step while
    it was planned (its clock ran on them; pricing them again in one call gives the same floats and costs a
    KV-bound loop of 512 clients 15 ms of its 250), any other's from `pricer`."""
    if planned.workload.timed:
        return PRICERS.get(lm, planned.scheduler).prices(planned)
    return pricer(lm, planned.price_keys, planned.scheduler.fused)


def point_row(s: Scenario, layout: Layout, role: str, m, mem) -> dict:
    """The row of a point: `m` are one attention rank's metrics (the instance's when attention_dp = 1);
    rates scale to the instance (x attention_dp) and to all dp instances; memory stays per device."""
    ranks = layout.attention_dp
    dp = s.num_devices // layout.devices
    kv_gib = m.peak_kv_tokens * mem.kv_bytes_per_token / GIB
    in_flight = m.request_throughput * m.e2e_ms / 1000.0  # Little's law
    held = round(in_flight) if m.arrival == "poisson" else m.concurrency  # requests holding a state
    held = mem.requests_held(held, s.typical("input_length"), s.typical("output_length"))  # (at once)
    kv_tokens = mem.tokens_left(held)  # what their states (linear-attention layers', windows) leave
    return {
        "role": role, "tp": layout.tp, "pp": layout.pp, "dp": dp, "ep": layout.ep,
        "attention_dp": ranks, "moe_tp": layout.moe_tp,
        "concurrency": ranks * (max(1, round(in_flight)) if m.arrival == "poisson" else m.concurrency),
        "max_batched_tokens": m.max_batched_tokens,
        "arrival": m.arrival, "request_rate": m.request_rate * ranks, "num_prompts": m.num_prompts * ranks,
        "ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms,
        "ttft_p50_ms": m.ttft_p50_ms, "ttft_p90_ms": m.ttft_p90_ms, "ttft_p99_ms": m.ttft_p99_ms,
        "tpot_p50_ms": m.tpot_p50_ms, "tpot_p90_ms": m.tpot_p90_ms, "tpot_p99_ms": m.tpot_p99_ms,
        "itl_ms": m.itl_ms, "itl_p50_ms": m.itl_p50_ms, "itl_p90_ms": m.itl_p90_ms, "itl_p99_ms": m.itl_p99_ms,
        "e2e_ms": m.e2e_ms, "e2e_p50_ms": m.e2e_p50_ms, "e2e_p90_ms": m.e2e_p90_ms, "e2e_p99_ms": m.e2e_p99_ms,
        "ttft_slo_ms": m.ttft_slo_ms, "tpot_slo_ms": m.tpot_slo_ms,
        "makespan_ms": m.makespan_ms,
        "request_throughput": m.request_throughput * ranks * dp,
        "output_throughput": m.output_throughput * ranks * dp,
        "output_throughput_per_device": m.output_throughput_per_device,
        "goodput": m.goodput * ranks * dp,
        "measured_requests": m.measured_requests * ranks, "steady": m.steady,
        "num_steps": m.num_steps, "prefill_num_chunks": m.prefill_num_chunks,
        "decoding_requests": m.decoding_requests * ranks, "kv_bound": m.kv_bound, "preemptions": m.preemptions * ranks,
        "effective_input_length": m.effective_input_length, "peak_kv_tokens": m.peak_kv_tokens,
        "kv_capacity_tokens": kv_tokens, "weights_gib": mem.weights_gib, "kv_gib": kv_gib,
        "activation_gib": mem.activation_gib, "reserved_gib": mem.reserved_gib,
        "available_gib": (mem.hbm_gib - mem.reserved_gib - mem.weights_gib - mem.activation_gib - kv_gib
                          - held * mem.state_bytes_per_request / GIB),
        "fits_memory": m.peak_kv_tokens <= kv_tokens,
        **costs(s.usd_per_device_hour * s.num_devices, m.output_throughput * ranks * dp),
    }


def costs(usd_per_hour: float, output_tokens_per_s: float) -> dict:
    """$/hour of the devices and $ per million output tokens at that throughput; NaN when no price is known."""
    if not usd_per_hour:
        return {"usd_per_hour": math.nan, "usd_per_mtok": math.nan}
    per_mtok = usd_per_hour / (output_tokens_per_s * 3600) * 1e6 if output_tokens_per_s > 0 else math.inf
    return {"usd_per_hour": usd_per_hour, "usd_per_mtok": per_mtok}


def meets(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> bool:
    """Memory, then the limits that apply to the row's role (prefill: TTFT; decode: TPOT; agg: both)."""
    return first_failure(row, ttft_limit, tpot_limit) is None


#: a Poisson point the instance keeps up with serves at least this share of the offered rate: a finite
#: stream's last requests drain after its arrivals end (100 prompts at 20 req/s: 0.83, 1,000: 0.95), while
#: one it falls behind serves what the instance can, a falling share of the offered rate (at twice its
#: capacity, half). Without it a search with no TTFT limit takes any rate, the queue growing without bound
KEEPS_UP = 0.8


def _judged(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> list[tuple[str, float, float]]:
    """(what, the row's value, the most it may be) of each limit a row is judged by after memory, in
    order: keeping up with the offered rate (Poisson), then TTFT, then TPOT, each at the SLO percentile
    (or the mean), those that apply to the row's role (prefill: TTFT; decode: TPOT; agg: both)."""
    out = []
    if row.get("arrival") == "poisson":
        out.append(("the offered rate (the instance falls behind it)", KEEPS_UP * row.get("request_rate", 0.0),
                    row["request_throughput"]))
    if ttft_limit is not None and row["role"] != "decode":
        out.append(("TTFT", row["ttft_slo_ms"], ttft_limit))
    if tpot_limit is not None and row["role"] != "prefill":
        out.append(("TPOT", row["tpot_slo_ms"], tpot_limit))
    return out


def limit_margin(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> tuple[float, ...]:
    """How near a row is to each limit `first_failure` judges it by (memory aside), 1 at the limit. The
    search aims with them (orchestrator.search)."""
    return tuple(value / most for _, value, most in _judged(row, ttft_limit, tpot_limit) if most > 0)


def first_failure(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> str | None:
    """What fails first: memory, then the limits `_judged` lists, in its order."""
    if not row["fits_memory"]:
        return "memory"
    return next((what for what, value, most in _judged(row, ttft_limit, tpot_limit) if value > most), None)
