"""A plain reference of KV-bound admission and preemption (vLLM V1's rules, restated), to check
`simulator.kvbound` against: requests are dicts, the blocks in use are summed over every request
each time they are asked for, and arrivals are a burst or a closed loop refilled after each step."""

from __future__ import annotations

import math


def _blocks(tokens: int) -> int:
    return math.ceil(tokens / 16)


def kv_reference(w, scheduler, kv_blocks: int):
    """Returns (steps, requests, preemptions, peak blocks): steps[s] is the list of (request index,
    tokens, computed after, decode) in scheduling order, a decode being one token that completes a
    request that has sampled before; requests[i] has 'first' and 'finish' steps."""
    usable = kv_blocks - 1  # vLLM's null block
    prompts, outputs, cached = (x.tolist() for x in w.request_lengths())
    reqs, waiting, running = [], [], []
    cap = scheduler.long_prefill_token_threshold or 10**12

    def add():
        i = len(reqs)
        reqs.append({"prompt": prompts[i], "output": outputs[i], "cached": cached[i], "computed": cached[i],
                     "slots": 0, "out": 0, "first": None, "finish": None})
        waiting.append(i)

    def used() -> int:
        return sum(_blocks(r["slots"]) for r in reqs if r["slots"])

    for _ in range(min(w.concurrency, w.prompts)):
        add()
    steps, preemptions, peak = [], 0, 0
    while any(r["finish"] is None for r in reqs) or len(reqs) < w.prompts:
        budget, step, preempted = w.max_batched_tokens, [], False
        k = 0
        while k < len(running) and budget > 0:
            i = running[k]
            r = reqs[i]
            n = min(r["prompt"] + r["out"] - r["computed"], cap, budget)
            gone = False
            while used() - _blocks(r["slots"]) + _blocks(r["computed"] + n) > usable:
                victim = running.pop()
                reqs[victim]["slots"], reqs[victim]["computed"] = 0, reqs[victim]["cached"]
                waiting.insert(0, victim)
                preemptions += 1
                preempted = True
                if victim == i:
                    gone = True
                    break
            if gone:
                break
            r["slots"] = r["computed"] + n
            step.append((i, n))
            budget -= n
            k += 1
        while not preempted and waiting and budget > 0 and len(running) < (scheduler.max_num_seqs or 10**12):
            i = waiting[0]
            r = reqs[i]
            if used() + _blocks(r["prompt"] + r["out"]) > usable:
                break
            n = min(r["prompt"] + r["out"] - r["computed"], cap, budget)
            waiting.pop(0)
            running.append(i)
            r["slots"] = r["computed"] + n
            step.append((i, n))
            budget -= n
        assert step, "no progress"
        peak = max(peak, used())
        finished = 0
        record = []
        for i, n in step:
            r = reqs[i]
            decode = n == 1 and r["out"] > 0 and r["computed"] + 1 == r["prompt"] + r["out"]
            r["computed"] += n
            record.append((i, n, r["computed"], decode))
            if r["computed"] == r["prompt"] + r["out"]:
                r["out"] += 1
                if r["first"] is None:
                    r["first"] = len(steps)
                if r["out"] == r["output"]:
                    r["finish"] = len(steps)
                    r["slots"] = 0
                    running.remove(i)
                    finished += 1
        steps.append(record)
        if w.arrival == "closed":
            for _ in range(min(finished, w.prompts - len(reqs))):
                add()
    return steps, reqs, preemptions, peak
