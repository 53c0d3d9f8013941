"""An independent per-request simulator, written plainly (no groups, no ticks, no plan/replay
split), to check the group timeline against."""

from __future__ import annotations

import math

import numpy as np

from latency.keys import ForwardKey
from simulator.scheduler import TokenBudget
from simulator.workload import Workload


class Req:
    def __init__(self, arrival: float, prompt: int, output: int, cached: int, steps: int):
        self.arrival = arrival  # ms
        self.prompt, self.output, self.cached = prompt, output, cached
        self.E = prompt - cached  # prompt tokens to compute
        self.steps_needed = steps
        self.done = 0          # effective prompt tokens prefilled
        self.started = False
        self.steps = 0         # decode steps done
        self.first = None
        self.finish = None
        self.first_step = self.finish_step = None  # the steps that gave its first and last token
        self.gone = False      # finished in an earlier step


def _decode_key(w, reqs, ids, decode_context, round_to=128):
    a = w.tokens_per_decode_step
    if decode_context == "mid":
        ctx = w.input_length + w.output_length // 2 + 1
    else:
        generated = sum(1 + a * reqs[i].steps for i in ids)
        prompts = sum(reqs[i].prompt for i in ids)
        mean = prompts / len(ids) + w.decode_query_len - 1 + generated / len(ids)
        ctx = math.ceil(mean / round_to - 1e-9) * round_to
    return ForwardKey(True, len(ids), w.decode_query_len, ctx)


def reference(w: Workload, scheduler, latency, decode_context="mean", phase="both", context_round=128):
    """Returns (requests, makespan, peak kv, keys per step, end time of each step); each request has
    .arrival, .first, .finish (ms), in the order they were sent. Arrivals: a burst at t=0; a closed
    loop refilled at the end of each step; or Poisson send times admitted when a step starts."""
    a = w.tokens_per_decode_step
    prompts, outputs, cached = w.request_lengths()
    total = w.prompts
    sends = list(w.arrival_times_ms()) if w.arrival == "poisson" else []
    reqs, fifo, decoding = [], [], []
    fe = w.frontend if w.frontend is not None and w.frontend.active else None
    made = []    # front end: every request the client made, as [send time, index, at the scheduler]
    rng = np.random.default_rng([w.seed, 2])

    def client_sends(ready):  # each sent after its client delay
        for t in (np.array(ready, dtype=float) + fe.client_delay(rng, len(ready))).tolist():
            made.append([t, len(made), None])

    streams = fe is not None and fe.stream_us > 0
    batches = []  # front end that streams at a cost: (end of step, requests that got a token in it)

    def server(until):
        """The API server from the start, recomputed: every step's response chunks at the step's end and
        the requests sent by `until` at their send times. Chunks go first whenever both wait; a request
        once started is not interrupted; a request starts by `until` (none are known to come later). Returns
        when the last chunk of each step went out."""
        for r in made:  # recomputed: a time from a call that looked further ahead does not stand
            r[2] = None
        queue = sorted(r for r in made if r[0] <= until)
        free, out, i = 0.0, [], 0

        def serve_while(ok):
            nonlocal free, i
            while i < len(queue) and ok(max(queue[i][0], free)):
                r = queue[i]
                free = max(r[0], free) + fe.request_ms + fe.prompt_token_us * 1e-3 * int(prompts[r[1]])
                r[2] = free
                i += 1

        for end, n in batches:
            serve_while(lambda start, end=end: start < end)
            free = max(end, free) + n * fe.stream_us * 1e-3
            out.append(free)
        serve_while(lambda start: not batches or start <= until)
        return out

    def through(until):  # the API server takes them one at a time, in send order
        server(until)
        return sorted((r[2], r[0]) for r in made if r[2] is not None and r[0] <= until)

    def send(t):
        i = len(reqs)
        steps = 0 if phase == "prefill" else math.ceil((outputs[i] - 1) / a - 1e-12)
        r = Req(t, int(prompts[i]), int(outputs[i]), int(cached[i]), steps)
        reqs.append(r)
        if phase == "decode":
            r.done, r.first = r.E, t
            decoding.append(len(reqs) - 1)
        else:
            fifo.append(len(reqs) - 1)

    if fe is not None:
        client_sends(sends if w.arrival == "poisson" else [0.0] * min(w.concurrency, total))
    elif w.arrival != "poisson":
        for _ in range(min(w.concurrency, total)):
            send(0.0)
    t, peak, step_keys, step_ends, dur = 0.0, 0.0, [], [], 0.0
    while len(reqs) < total or any(r.finish is None for r in reqs):
        if fe is not None:
            seen = t - dur if fe.lookahead_steps and step_ends else t  # async: scheduled a step ahead
            if not fifo and not decoding:
                t = seen = max(t, through(math.inf)[len(reqs)][0])
            for at, sent in through(t)[len(reqs):]:
                if at <= seen:
                    send(sent)
        elif w.arrival == "poisson":
            if not fifo and not decoding:
                t = max(t, sends[len(reqs)])
            while len(reqs) < total and sends[len(reqs)] <= t:
                send(sends[len(reqs)])
        if isinstance(scheduler, TokenBudget):
            prefill, dec_ids = _token_budget(w, scheduler, reqs, fifo, decoding)
        elif scheduler.name == "prefill-first":
            prefill, dec_ids = _prefill_first(w, reqs, fifo, decoding)
        else:
            prefill, dec_ids = _decode_first(w, scheduler.slack_ratio, reqs, fifo, decoding)
        assert prefill or dec_ids, "no progress"
        entries = {}
        for i, tok in prefill:
            entries[(tok, reqs[i].done + tok)] = entries.get((tok, reqs[i].done + tok), 0) + 1
        pkeys = [ForwardKey(False, n, q, s) for (q, s), n in entries.items()]
        dkey = _decode_key(w, reqs, dec_ids, decode_context, context_round) if dec_ids else None
        keys = pkeys + ([dkey] if dkey else [])
        step_keys.append(tuple(sorted(keys)))
        if scheduler.fused:
            dur = sum(latency([k])[0] for k in keys)
        else:  # decode-first: prefill and decode passes overlap, the step costs the longer one
            p_ms = sum(latency([k])[0] for k in pkeys)
            d_ms = latency([dkey])[0] if dkey else 0.0
            dur = max(p_ms, d_ms)
        t += dur
        step_ends.append(t)
        new_decoders = []
        for i, tok in prefill:
            r = reqs[i]
            r.started = True
            r.done += tok
            if r.done == r.E:
                r.first, r.first_step = t, len(step_ends) - 1
                fifo.remove(i)
                if r.steps_needed:
                    new_decoders.append(i)
                else:
                    r.finish, r.finish_step = t, len(step_ends) - 1
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
                kv += r.prompt + 1 + a * r.steps
            elif r.started:
                kv += r.cached + r.done
        peak = max(peak, kv)
        for i in dec_ids:
            if reqs[i].steps == reqs[i].steps_needed:
                reqs[i].finish, reqs[i].finish_step = t, len(step_ends) - 1
                decoding.remove(i)
        if streams:
            batches.append((t, len(dec_ids) + sum(1 for i, _ in prefill if reqs[i].done == reqs[i].E)))
        decoding.extend(new_decoders)
        finished_now = sum(1 for r in reqs if r.finish is not None and not r.gone)
        for r in reqs:
            r.gone = r.finish is not None
        if w.arrival == "closed":
            new = min(finished_now, total - (len(made) if fe is not None else len(reqs)))
            if fe is not None and new:  # the client has the last tokens when the step's chunks went out
                client_sends([(server(t)[-1] if streams else t) + fe.return_ms] * new)
            for _ in range(new if fe is None else 0):
                send(t)
    if fe is not None and phase != "decode":  # the client sees every token return_ms after it went out
        out = server(math.inf) if streams else step_ends
        for r in reqs:
            r.first = out[r.first_step] + fe.return_ms
            r.finish = out[r.finish_step] + fe.return_ms
    return reqs, t, peak, step_keys, step_ends


def expected_metrics(w, reqs, step_keys, step_ends, phase, limits=(None, None), slo=None, devices=1):
    """The metrics the README defines, computed plainly from per-request times: warm-up and drain
    left out by arrival events (requests sent at one moment), the throughput window from the first
    to the last measured arrival, ITL from decode step durations."""
    import numpy as np

    n, c = len(reqs), w.concurrency
    events, start = [], 0
    for i in range(1, n + 1):  # an event: consecutive sends at one moment (Poisson: every request)
        if i == n or w.arrival == "poisson" or reqs[i].arrival != reqs[i - 1].arrival:
            events.append((start, i))
            start = i
    steady = [False] * n
    for lo, hi in events:
        if w.arrival == "burst" or w.measure == "all":
            ok = True
        elif w.arrival == "closed":
            ok = lo >= c and hi <= n - c
        else:
            ok = lo >= 0.1 * n and hi <= 0.9 * n
        for i in range(lo, hi):
            steady[i] = ok
    measured = [r for r, ok in zip(reqs, steady, strict=True) if ok] or reqs

    def decode_tokens(r):
        return r.output - 1 if phase != "prefill" else 0

    def handed_back(r):  # a prefill instance hands over the first token
        return r.output if phase != "prefill" else 1

    ttft = [0.0 if phase == "decode" else r.first - r.arrival for r in measured]
    tpot = [(r.finish - r.first) / decode_tokens(r) if decode_tokens(r) else 0.0 for r in measured]
    e2e = [r.finish - r.arrival for r in measured]
    makespan = step_ends[-1]
    done, tokens, span = n, sum(handed_back(r) for r in reqs), makespan
    if w.arrival != "burst" and w.measure == "steady" and any(steady):
        lo, hi = min(r.arrival for r in measured), max(r.arrival for r in measured)
        finished = [r for r in reqs if lo < r.finish <= hi]
        if hi > lo and finished:
            done, tokens, span = len(finished), sum(handed_back(r) for r in finished), hi - lo
    durations = np.diff([0.0, *step_ends]) / w.tokens_per_decode_step
    weights = np.array([sum(k.concurrency for k in keys if k.is_decode) for keys in step_keys], dtype=float)
    if w.arrival != "burst" and w.measure == "steady" and any(steady):
        lo, hi = min(r.arrival for r in measured), max(r.arrival for r in measured)
        inside = np.array([lo < e <= hi for e in step_ends])
        if (weights * inside).sum():
            weights = weights * inside
    ok = [(limits[0] is None or phase == "decode" or a <= limits[0])
          and (limits[1] is None or phase == "prefill" or b <= limits[1]) for a, b in zip(ttft, tpot, strict=True)]
    rate = 1000 * done / span
    out_rate = 1000 * tokens / span
    out = {"makespan_ms": makespan, "request_throughput": rate, "output_throughput": out_rate,
           "output_throughput_per_device": out_rate / devices, "concurrency": c, "num_prompts": n,
           "measured_requests": len(measured), "goodput": rate * sum(ok) / len(ok),
           "steady": any(steady) if w.arrival != "burst" and w.measure == "steady" else True}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_ms"] = sum(values) / len(values)
        for q in (50, 90, 99):
            out[f"{name}_p{q}_ms"] = percentile(values, q)
    out["ttft_slo_ms"] = percentile(ttft, slo) if slo else out["ttft_ms"]
    out["tpot_slo_ms"] = percentile(tpot, slo) if slo else out["tpot_ms"]
    if weights.sum():
        out["itl_ms"] = float((durations * weights).sum() / weights.sum())
        keep = weights > 0
        for q in (50, 90, 99):
            out[f"itl_p{q}_ms"] = float(np.percentile(np.repeat(durations[keep], weights[keep].astype(int)), q,
                                                      method="inverted_cdf"))
    return out


def _decode_first(w, slack_ratio, reqs, fifo, decoding):
    """The RFC's policy, restated: all ready requests decode (at most B / (1 + MTP) of them); the
    front run of requests waiting for the same chunk (same progress, same chunk size) prefills while
    the step stays within floor(B * slack)."""
    B, q = w.max_batched_tokens, w.decode_query_len
    dec_ids = decoding[: B // q]
    if not fifo:
        return [], dec_ids
    done = reqs[fifo[0]].done
    chunk = min(B, reqs[fifo[0]].E - done)
    run = []
    for i in fifo:
        if reqs[i].done != done or min(B, reqs[i].E - done) != chunk:
            break
        run.append(i)
    fit = max(0, (math.floor(B * slack_ratio) - len(dec_ids) * q) // chunk)
    return [(i, chunk) for i in run[:fit]], dec_ids


def _token_budget(w, sch: TokenBudget, reqs, fifo, decoding):
    budget = w.max_batched_tokens
    seqs = sch.max_num_seqs or 10**9
    thr = sch.long_prefill_token_threshold or 10**9
    dec_ids = decoding[: min(len(decoding), budget // w.decode_query_len, seqs)]
    budget -= len(dec_ids) * w.decode_query_len
    running = len(decoding) + sum(1 for i in fifo if reqs[i].started)
    prefill = []
    for i in [i for i in fifo if reqs[i].started]:
        if budget <= 0:
            break
        tok = min(reqs[i].E - reqs[i].done, thr, budget)
        prefill.append((i, tok))
        budget -= tok
    for i in [i for i in fifo if not reqs[i].started]:
        if budget <= 0 or running >= seqs:
            break
        tok = min(reqs[i].E, thr, budget)
        prefill.append((i, tok))
        budget -= tok
        running += 1
    return prefill, dec_ids


def _prefill_first(w, reqs, fifo, decoding):
    """SGLang: a prefill batch of up to B tokens (started first, then FIFO) while anyone waits, the
    last prompt cut to what is left; otherwise every decoding request decodes. Never both."""
    if not fifo:
        return [], list(decoding)
    budget, prefill = w.max_batched_tokens, []
    for i in sorted(fifo, key=lambda i: not reqs[i].started):  # started ones first, FIFO otherwise
        if budget <= 0:
            break
        tok = min(reqs[i].E - reqs[i].done, budget)
        prefill.append((i, tok))
        budget -= tok
    return prefill, []


def percentile(values, p):
    return float(np.percentile(np.asarray(values), p, method="inverted_cdf"))
