"""The token-budget policy takes the same steps as vLLM 0.33's own V1 scheduler: every recorded
trace (bursts and a closed loop, `../shared/tools/vllmtrace/`) is reproduced step for step.
Set SERVESWEEP_VLLM_TRACES to a JSONL file of the same format to check other traces."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from simulator import TokenBudget, Workload, plan

TRACES = Path(os.environ.get("SERVESWEEP_VLLM_TRACES", Path(__file__).parents[1] / "data" / "vllm_traces_0.33.0.jsonl"))
CASES = [json.loads(line) for line in TRACES.read_text().splitlines() if line.strip()]


def _workload(case) -> Workload:
    closed = case["mode"] == "closed"
    return Workload(case["input_length"], case["output_length"], case["max_num_batched_tokens"], case["concurrency"],
                    arrival="closed" if closed else "burst", num_prompts=case.get("num_prompts", 0) if closed else 0)


def _scheduler(case) -> TokenBudget:
    return TokenBudget(max_num_seqs=case["max_num_seqs"],
                       long_prefill_token_threshold=case["long_prefill_token_threshold"] or None)


def _planned_steps(p) -> list[Counter]:
    """Per step: how many requests got how many tokens, prefill ("p") or decode ("d")."""
    out = []
    for shape_id in p.step_shape:
        c = Counter()
        for k in p.shapes[shape_id]:
            c[(k.query_len, "d" if k.is_decode else "p")] += k.concurrency
        out.append(c)
    return out


def _expand(values, counts) -> list[int]:
    return sorted(v for v, n in zip(values, counts, strict=True) for _ in range(n))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['mode']}-{c['input_length']}x{c['output_length']}-c{c['concurrency']}"
                                             for c in CASES])
def test_trace_is_reproduced_step_for_step(case):
    p = plan(_workload(case), _scheduler(case))
    recorded = [Counter((tok, kind) for _, tok, kind in step) for step in case["steps"]]
    assert p.num_steps == case["num_steps"]
    for i, (ours, theirs) in enumerate(zip(_planned_steps(p), recorded, strict=True)):
        assert ours == theirs, f"step {i}: ours {dict(ours)}, vLLM {dict(theirs)}"
    assert _expand(p.first_step, p.counts) == sorted(case["first_token_step"])
    assert _expand(p.finish_step, p.counts) == sorted(case["finish_step"])
    arrivals = _expand(p.event_step[p.arrival] + 1, p.counts)  # vLLM: the step it can first be scheduled
    assert arrivals == sorted(case["arrival_step"])
