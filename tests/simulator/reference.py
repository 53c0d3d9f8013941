"""An independent per-request simulator, written plainly (no groups, no ticks, no plan/replay
split), to check the group timeline against."""

from __future__ import annotations

import math

import numpy as np

from latency.keys import ForwardKey
from simulator.scheduler import SchedulerState, TokenBudget
from simulator.workload import Workload


class Req:
    def __init__(self):
        self.done = 0          # effective prompt tokens prefilled
        self.started = False
        self.steps = 0         # decode steps done
        self.first = None
        self.finish = None
        self.gone = False      # finished in an earlier step


def _decode_key(w, reqs, ids, decode_context, round_to=128):
    a = w.tokens_per_decode_step
    if decode_context == "mid":
        ctx = w.input_length + w.output_length // 2 + 1
    else:
        generated = sum(1 + a * reqs[i].steps for i in ids)
        mean = w.input_length + w.decode_query_len - 1 + generated / len(ids)
        ctx = math.ceil(mean / round_to - 1e-9) * round_to
    return ForwardKey(True, len(ids), w.decode_query_len, ctx)


def reference(w: Workload, scheduler, latency, decode_context="mean", phase="both"):
    """Returns (ttft list, tpot list, makespan, peak kv, keys per step)."""
    E, _B, I, N = w.effective_input_length, w.max_batched_tokens, w.input_length, w.concurrency
    a = w.tokens_per_decode_step
    steps_needed = 0 if phase == "prefill" else w.decode_steps
    reqs = [Req() for _ in range(N)]
    fifo = [] if phase == "decode" else list(range(N))
    decoding = []
    if phase == "decode":
        for r in reqs:
            r.done, r.first = E, 0.0
        decoding = list(range(N))
    t, peak, step_keys = 0.0, 0.0, []
    while any(r.finish is None for r in reqs):
        if isinstance(scheduler, TokenBudget):
            prefill, dec_ids = _token_budget(w, scheduler, reqs, fifo, decoding)
        else:
            prefill, dec_ids = _count_policy(w, scheduler, reqs, fifo, decoding)
        assert prefill or dec_ids, "no progress"
        entries = {}
        for i, tok in prefill:
            entries[(tok, reqs[i].done + tok)] = entries.get((tok, reqs[i].done + tok), 0) + 1
        pkeys = [ForwardKey(False, n, q, s) for (q, s), n in entries.items()]
        dkey = _decode_key(w, reqs, dec_ids, decode_context) if dec_ids else None
        keys = pkeys + ([dkey] if dkey else [])
        step_keys.append(tuple(sorted(keys)))
        if scheduler.fused:
            dur = sum(latency([k])[0] for k in keys)
        else:
            p_ms = sum(latency([k])[0] for k in pkeys)
            d_ms = latency([dkey])[0] if dkey else 0.0
            dur = scheduler.step_latency(p_ms, d_ms)
        t += dur
        new_decoders = []
        for i, tok in prefill:
            r = reqs[i]
            r.started = True
            r.done += tok
            if r.done == E:
                r.first = t
                fifo.remove(i)
                if steps_needed:
                    new_decoders.append(i)
                else:
                    r.finish = t
            elif scheduler.requeue:
                fifo.remove(i)
                fifo.append(i)
        for i in dec_ids:
            reqs[i].steps += 1
        kv = 0.0
        for r in reqs:
            if r.gone:
                continue
            if r.first is not None:
                kv += I + 1 + a * r.steps
            elif r.started:
                kv += w.cached_prefix_tokens + r.done
        peak = max(peak, kv)
        for i in dec_ids:
            if reqs[i].steps == steps_needed:
                reqs[i].finish = t
                decoding.remove(i)
        decoding.extend(new_decoders)
        for r in reqs:
            r.gone = r.finish is not None
    ttft = [r.first for r in reqs]
    R = w.decode_tokens if phase != "prefill" else 0
    tpot = [(r.finish - r.first) / R if R else 0.0 for r in reqs]
    return ttft, tpot, t, peak, step_keys


def _count_policy(w, scheduler, reqs, fifo, decoding):
    E, B = w.effective_input_length, w.max_batched_tokens
    if fifo:
        done = reqs[fifo[0]].done
        run = []
        for i in fifo:
            if reqs[i].done != done:
                break
            run.append(i)
        chunk = min(B, E - done)
    else:
        run, chunk = [], B
    dec = scheduler.decide(SchedulerState(len(decoding), len(run), chunk, B, w.decode_query_len))
    return [(i, chunk) for i in run[: dec.p_step]], decoding[: dec.d_step]


def _token_budget(w, sch: TokenBudget, reqs, fifo, decoding):
    E, budget = w.effective_input_length, w.max_batched_tokens
    seqs = sch.max_num_seqs or 10**9
    thr = sch.long_prefill_token_threshold or 10**9
    dec_ids = decoding[: min(len(decoding), budget // w.decode_query_len, seqs)]
    budget -= len(dec_ids) * w.decode_query_len
    running = len(decoding) + sum(1 for i in fifo if reqs[i].started)
    prefill = []
    for i in [i for i in fifo if reqs[i].started]:
        if budget <= 0:
            break
        tok = min(E - reqs[i].done, thr, budget)
        prefill.append((i, tok))
        budget -= tok
    for i in [i for i in fifo if not reqs[i].started]:
        if budget <= 0 or running >= seqs:
            break
        tok = min(E, thr, budget)
        prefill.append((i, tok))
        budget -= tok
        running += 1
    return prefill, dec_ids


def percentile(values, p):
    return float(np.percentile(np.asarray(values), p, method="inverted_cdf"))
