"""What a simulation reports (RFC 3.1.5), computed from planned steps and their durations."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Metrics:
    """Times in ms, throughputs per second. `peak_kv_tokens` counts every token held in KV at the
    fullest step (cached prefix included).

    Latencies are over the measured requests: all of a burst; in a closed loop or Poisson stream
    those that are neither warm-up nor drain (`steady`; False when too few prompts leave none, and
    then every request counts). Throughputs of a steady run are completions over the window from
    the first to the last measured arrival, while the load is full; of a burst, N over the makespan.
    `ttft_slo_ms` / `tpot_slo_ms` are at the SLO percentile (the mean when none is given);
    `goodput` is the request throughput times the share of measured requests within both limits.
    `kv_bound`: the KV cache bound admission (requests waited for blocks; `preemptions` running ones
    were preempted and recomputed)."""

    concurrency: int
    ttft_ms: float
    tpot_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    itl_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    e2e_ms: float
    e2e_p50_ms: float
    e2e_p90_ms: float
    e2e_p99_ms: float
    ttft_slo_ms: float
    tpot_slo_ms: float
    makespan_ms: float
    request_throughput: float
    output_throughput: float
    output_throughput_per_device: float
    goodput: float
    num_devices: int
    num_steps: int
    decoding_requests: float
    preemptions: int
    kv_bound: bool
    prefill_num_chunks: int
    effective_input_length: int
    max_batched_tokens: int
    peak_kv_tokens: float
    arrival: str
    num_prompts: int
    request_rate: float
    measured_requests: int
    steady: bool

    def as_dict(self) -> dict:
        return asdict(self)


def weighted_percentiles(values: np.ndarray, counts: np.ndarray, ps=PERCENTILES) -> list[float]:
    """Nearest-rank percentiles of a sample where values[i] occurs counts[i] times: the
    ceil(p * n / 100)-th smallest value."""
    order = np.argsort(values, kind="stable")
    c = np.cumsum(counts[order])
    ranks = np.maximum(1, np.ceil(np.array(ps, dtype=np.float64) * int(c[-1]) / 100))
    return values[order[np.searchsorted(c, ranks, side="left")]].tolist()


def _mean(values: np.ndarray, counts: np.ndarray) -> float:
    return float((values * counts).sum() / counts.sum())


def _steady_window(w, arrival: np.ndarray, steady: np.ndarray) -> tuple[float, float] | None:
    """(first, last) steady arrival of a closed loop or Poisson stream measured "steady": while the
    load is full. None when the whole run counts (a burst, measure "all", no steady request)."""
    if w.arrival == "burst" or w.measure != "steady" or not steady.any():
        return None
    start, end = float(arrival[steady].min()), float(arrival[steady].max())
    return (start, end) if end > start else None


def _throughput(window, finish: np.ndarray, counts: np.ndarray, tokens: np.ndarray,
                makespan: float) -> tuple[float, float]:
    """(requests, output tokens) per second: completions inside the window, else every request over
    the makespan. `tokens[j]` is the output each request of record j hands back."""
    if window is not None:
        inside = (finish > window[0]) & (finish <= window[1])
        done = counts[inside].sum()
        if done:
            span = (window[1] - window[0]) / 1000.0
            return float(done) / span, float((counts * tokens)[inside].sum()) / span
    if makespan <= 0:
        return float("inf"), float("inf")
    return 1000.0 * float(counts.sum()) / makespan, 1000.0 * float((counts * tokens).sum()) / makespan


class Judged(NamedTuple):
    """The measured requests' TTFT and TPOT (ms) with how many requests each stands for, and the
    request throughput: what goodput judges against a limit pair."""

    ttft: np.ndarray
    tpot: np.ndarray
    counts: np.ndarray
    phase: str
    request_throughput: float


def goodput(judged: Judged, limits: tuple[float | None, float | None]) -> float:
    """Request throughput times the share of measured requests within both limits (a prefill
    instance is judged on TTFT alone, a decode instance on TPOT alone)."""
    ok = np.ones(len(judged.counts), dtype=bool)
    if limits[0] is not None and judged.phase != "decode":
        ok &= judged.ttft <= limits[0]
    if limits[1] is not None and judged.phase != "prefill":
        ok &= judged.tpot <= limits[1]
    c = judged.counts
    return judged.request_throughput * float(c[ok].sum()) / float(c.sum())


def replay(plan, durations: np.ndarray, num_devices: int = 1, slo_percentile: float | None = None,
           limits: tuple[float | None, float | None] = (None, None)) -> Metrics:
    """Times from step durations (a timed plan keeps its own clock): a group's first token / finish
    is the end of its step; its arrival the end of the step it came after, or its send time."""
    return measure(plan, durations, num_devices, slo_percentile, limits)[0]


def measure(plan, durations: np.ndarray, num_devices: int = 1, slo_percentile: float | None = None,
            limits: tuple[float | None, float | None] = (None, None)) -> tuple[Metrics, Judged]:
    """`replay`, and what its goodput was judged on (so another limit pair needs only `goodput`)."""
    w = plan.workload
    ends, arrival, first, finish = _record_times(plan, durations)
    counts = plan.counts
    kinds = w.kinds
    output = np.array(kinds.output, dtype=np.float64)[plan.kind]
    ttft = first - arrival if plan.phase != "decode" else np.zeros_like(first)
    r = output - 1 if plan.phase != "prefill" else np.zeros_like(output)
    tpot = np.divide(finish - first, r, out=np.zeros_like(first), where=r > 0)
    e2e = finish - arrival
    steady = plan.event_steady[plan.arrival]
    measured = steady if steady.any() else np.ones_like(steady)
    makespan = float(ends[-1])
    window, req_tput, out_tput = _rates(plan, ends, arrival, finish, output)
    wait = _queued_wait_ms(plan, req_tput)
    ttft, e2e = (ttft + wait if plan.phase != "decode" else ttft), e2e + wait
    c = counts[measured]
    tt, tp, ee = ttft[measured], tpot[measured], e2e[measured]
    itl, itl_w = _itl(plan, ends, window, w)
    slo = [slo_percentile] if slo_percentile else []
    tt_p, tp_p, ee_p = (weighted_percentiles(x, c, [*PERCENTILES, *slo]) for x in (tt, tp, ee))
    il_p = weighted_percentiles(itl, itl_w) if itl_w.sum() else [0.0] * len(PERCENTILES)
    ttft_slo = tt_p[-1] if slo else _mean(tt, c)
    tpot_slo = tp_p[-1] if slo else _mean(tp, c)
    judged = Judged(tt, tp, c, plan.phase, req_tput)
    return Metrics(
        concurrency=w.concurrency if plan.stand_in is None else plan.stand_in.clients,
        ttft_ms=_mean(tt, c), tpot_ms=_mean(tp, c),
        ttft_p50_ms=tt_p[0], ttft_p90_ms=tt_p[1], ttft_p99_ms=tt_p[2],
        tpot_p50_ms=tp_p[0], tpot_p90_ms=tp_p[1], tpot_p99_ms=tp_p[2],
        itl_ms=_mean(itl, itl_w) if itl_w.sum() else 0.0,
        itl_p50_ms=il_p[0], itl_p90_ms=il_p[1], itl_p99_ms=il_p[2],
        e2e_ms=_mean(ee, c), e2e_p50_ms=ee_p[0], e2e_p90_ms=ee_p[1], e2e_p99_ms=ee_p[2],
        ttft_slo_ms=ttft_slo, tpot_slo_ms=tpot_slo,
        makespan_ms=makespan,
        request_throughput=req_tput,
        output_throughput=out_tput,
        output_throughput_per_device=out_tput / num_devices,
        goodput=goodput(judged, limits),
        num_devices=num_devices,
        num_steps=plan.num_steps,
        decoding_requests=_decoding(plan, ends),
        preemptions=plan.preemptions, kv_bound=bool(plan.kv_blocks),
        prefill_num_chunks=w.prefill_num_chunks,
        effective_input_length=w.effective_input_length,
        max_batched_tokens=w.max_batched_tokens,
        peak_kv_tokens=plan.peak_kv_tokens,
        arrival=w.arrival, num_prompts=w.prompts if plan.stand_in is None else plan.stand_in.workload_prompts(w),
        request_rate=w.request_rate,
        measured_requests=int(c.sum()), steady=bool(steady.any()),
    ), judged


def _rates(plan, ends: np.ndarray, arrival: np.ndarray, finish: np.ndarray, output: np.ndarray):
    """(steady window, requests per second, output tokens per second) of a plan's replay; `output[j]` is
    the output length of the requests of finish record j."""
    window = _steady_window(plan.workload, arrival, plan.event_steady[plan.arrival])
    tokens = output if plan.phase != "prefill" else np.ones_like(output)  # a prefill instance hands over one
    return window, *_throughput(window, finish, plan.counts, tokens, float(ends[-1]))


def _queued_wait_ms(plan, request_throughput: float) -> float:
    """What the clients a stand-in loop leaves out add to each request's wait (0 for a loop planned as it is)."""
    if plan.stand_in is None or not 0 < request_throughput < float("inf"):
        return 0.0
    return plan.stand_in.extra_wait_ms(request_throughput)


def _decoding(plan, ends: np.ndarray) -> float:
    """Requests decoding per step, weighted by the step's time: the load the engine ran (below the
    concurrency when the KV cache let fewer in)."""
    durations = np.diff(ends)
    total = durations.sum()
    return float((plan.step_decode * durations).sum() / total) if total > 0 else 0.0


def _record_times(plan, durations: np.ndarray):
    """(step ends with 0 first, and per finish record: arrival, first token, finish), in ms. A timed
    plan keeps its own clock, and its arrivals and tokens are the client's (sent, received); a
    decode-only instance receives requests prefilled elsewhere, so their
    first token is their arrival."""
    if plan.step_end_ms is not None:
        ends = np.concatenate(([0.0], plan.step_end_ms))
        arrival = plan.event_ms[plan.arrival]
    else:
        ends = np.concatenate(([0.0], np.cumsum(durations)))
        arrival = ends[plan.event_step[plan.arrival] + 1]
    delay = plan.token_delay_ms if plan.phase != "decode" else 0.0  # the client sees a token this much later
    streamed = plan.step_delivered_ms is not None and plan.phase != "decode"
    out = np.concatenate(([0.0], plan.step_delivered_ms)) if streamed else ends
    first = arrival if plan.phase == "decode" else out[plan.first_step + 1] + delay
    return ends, arrival, first, out[plan.finish_step + 1] + delay


def _itl(plan, ends: np.ndarray, window, w) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token latency of every decode step (its duration over the tokens it advances each
    request), weighted by the requests decoding in it; a steady run counts the steps that end in
    its window."""
    durations = np.diff(ends)
    weights = plan.step_decode.astype(np.float64)
    if window is not None:
        end_of_step = ends[1:]
        inside = (end_of_step > window[0]) & (end_of_step <= window[1])
        if (weights * inside).sum():
            weights = weights * inside
    return durations / w.tokens_per_decode_step, weights


def per_request(plan, durations: np.ndarray) -> dict[str, np.ndarray]:
    """One row per request, in send order of its arrival event: arrival, first token and finish (ms),
    TTFT, TPOT, E2E, and its lengths. Requests of one record share their times."""
    ends, arrival, first, finish = _record_times(plan, durations)
    kinds = plan.workload.kinds
    order = np.lexsort((plan.first_step, plan.arrival))
    rows = np.repeat(order, plan.counts[order])
    output = np.array(kinds.output)[plan.kind]
    decode = np.maximum(output - 1, 0) if plan.phase != "prefill" else np.zeros_like(output)
    out = {
        "arrival_ms": arrival[rows], "first_token_ms": first[rows], "finish_ms": finish[rows],
        "input_length": np.array(kinds.input)[plan.kind][rows], "output_length": output[rows],
        "cached_tokens": np.array(kinds.cached)[plan.kind][rows],
    }
    if plan.stand_in is not None:  # each request was sent as much earlier as the clients left out queue
        out["arrival_ms"] = out["arrival_ms"] - _queued_wait_ms(plan, _rates(plan, ends, arrival, finish, output)[1])
    out["ttft_ms"] = out["first_token_ms"] - out["arrival_ms"]
    out["tpot_ms"] = np.divide(out["finish_ms"] - out["first_token_ms"], decode[rows],
                               out=np.zeros(len(rows)), where=decode[rows] > 0)
    out["e2e_ms"] = out["finish_ms"] - out["arrival_ms"]
    out["measured"] = plan.event_steady[plan.arrival][rows]
    return out


def per_step(plan, durations: np.ndarray) -> dict[str, np.ndarray]:
    """One row per step: start and end (ms), prefill tokens and entries, requests decoding, tokens
    against the budget."""
    ends = plan.step_end_ms if plan.step_end_ms is not None else np.cumsum(durations)
    starts = ends - durations  # a timed plan may idle between steps: a step starts its duration before its end
    prefill = np.array([sum(k.tokens for k in shape if not k.is_decode) for shape in plan.shapes])
    chunks = np.array([sum(k.concurrency for k in shape if not k.is_decode) for shape in plan.shapes])
    decode_tokens = np.array([sum(k.tokens for k in shape if k.is_decode) for shape in plan.shapes])
    ids = plan.step_shape
    return {"step": np.arange(len(ids)), "start_ms": starts, "end_ms": ends, "prefill_tokens": prefill[ids],
            "prefill_requests": chunks[ids], "decode_requests": plan.step_decode,
            "tokens": (prefill + decode_tokens)[ids], "budget": np.full(len(ids), plan.workload.max_batched_tokens)}
