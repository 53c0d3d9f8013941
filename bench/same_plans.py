"""Plans of this tree against another checkout's, workload for workload: speed work must not change a
schedule. Random bursts and closed loops (mixes, phases, MTP, prefix hits, both policies, both
decode-context rules), timed ones (Poisson streams, closed loops behind a front end, some streaming at
a cost, priced by a fixed affine function of the step) and KV-bound ones (a small pool of blocks); every
step's shape, every finish record, the arrival events, the clock and the KV peak.

    git worktree add /tmp/before <commit>
    python bench/same_plans.py /tmp/before [--workloads 2000] [--seed 0]

Prints how many plans were compared, how many differ (the first few named) and both trees' planning time.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent.parent)


def load(root: str):
    """The simulator package of the tree at `root` (imported afresh)."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("simulator", "latency")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        import simulator.mix as mix
        import simulator.scheduler as scheduler
        import simulator.timeline as timeline
        import simulator.workload as workload
    finally:
        sys.path.pop(0)
    return timeline, workload, scheduler, mix


def cases(n: int, seed: int):
    rnd = random.Random(seed)
    for i in range(n):
        c = rnd.choice([1, 2, 5, 16, 64, 128])
        arrival = rnd.choice(["burst", "closed"])
        yield i, {
            "input": rnd.choice([10, 37, 100, 300, 1000, 4000]), "output": rnd.choice([2, 5, 23, 100, 500]),
            "budget": rnd.choice([16, 64, 256, 2048, 8192]), "concurrency": c, "arrival": arrival,
            "prompts": rnd.choice([c + 1, 3 * c, 8 * c, 20 * c + 3]) if arrival == "closed" else 0,
            "hit": rnd.choice([0.0, 0.5]), "mtp": rnd.choice([0, 1]), "measure": rnd.choice(["steady", "all"]),
            "policy": rnd.choice(["decode-first", "token-budget", "token-budget-capped"]),
            "context": rnd.choice(["mean", "mid"]), "phase": rnd.choice(["both", "both", "prefill", "decode"]),
            "mix": rnd.choice([None, None, ("uniform:1:400", "uniform:2:90"),
                               ("bins:10-30@1,300-500@2", "bins:2-5@1,50-80@1")]),
            "timed": rnd.choice([None, None, None, None, "poisson", "frontend", "streamed"]),
            "kv_blocks": rnd.choice([0, 0, 0, 0, 0, 40, 400]),
        }


def plan_of(tree, case: dict, seed: int):
    timeline, workload, scheduler, mix = tree
    capped = scheduler.TokenBudget(max_num_seqs=max(1, case["concurrency"] // 2))
    policy = {"decode-first": scheduler.DecodeFirstWithSlack(), "token-budget": scheduler.TokenBudget(),
              "token-budget-capped": capped}[case["policy"]]
    lengths = case["mix"] and mix.RequestMix(mix.Lengths.parse(case["mix"][0]), mix.Lengths.parse(case["mix"][1]))
    arrival, timing = case["arrival"], {"num_prompts": case["prompts"]}
    if case["timed"] == "poisson":
        arrival, timing = "poisson", {"num_prompts": 3 * case["concurrency"] + 5, "request_rate": 50.0}
    elif case["timed"] in ("frontend", "streamed") and arrival == "closed":
        from simulator.frontend import Frontend

        stream_us = 50.0 if case["timed"] == "streamed" else 0.0  # a server that streams at a cost
        timing["frontend"] = Frontend(request_ms=0.5, return_ms=1.0, client_ms=2.0, stream_us=stream_us)
    kv = case["kv_blocks"] if case["policy"] != "decode-first" and not case["mtp"] and case["phase"] == "both" else 0
    w = workload.Workload(case["input"], case["output"], case["budget"], case["concurrency"], case["hit"], case["mtp"],
                          (0.6,) * case["mtp"], arrival=arrival,
                          measure=case["measure"], mix=lengths or None, seed=seed, kv_blocks=kv, **timing)
    step_ms = affine if w.timed else None
    try:
        return timeline.plan(w, policy, phase=case["phase"], decode_context=case["context"], step_ms=step_ms)
    except RuntimeError as refused:  # a pool too small for one request: refused alike, or it differs
        return ("refused", str(refused))


def affine(shape) -> float:
    """A step's price for timed plans: 1 ms plus 0.01 ms a token it computes."""
    return 1.0 + 0.01 * sum(k.concurrency * k.query_len for k in shape)


def fingerprint(p) -> tuple:
    if isinstance(p, tuple):
        return p
    timed = (p.event_ms.tolist(), p.step_end_ms.tolist()) if p.step_end_ms is not None else None
    shapes = [tuple((k.is_decode, k.concurrency, k.query_len, k.seq_len) for k in shape) for shape in p.shapes]
    records = sorted(zip(p.counts.tolist(), p.arrival.tolist(), p.first_step.tolist(), p.finish_step.tolist(),
                         p.kind.tolist(), strict=True))
    return (shapes, p.step_shape.tolist(), records, p.peak_kv_tokens, p.event_step.tolist(),
            p.event_steady.tolist(), p.step_decode.tolist(), timed, p.preemptions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", help="a checkout of another commit (git worktree add DIR COMMIT)")
    ap.add_argument("--workloads", type=int, default=2000, help="random workloads to compare (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    runs = list(cases(args.workloads, args.seed))
    prints, seconds = {}, {}
    for name, root in (("other", args.other), ("this", HERE)):
        tree = load(root)
        gc.collect()
        gc.freeze()  # the first tree's plans, kept for the comparison, are not walked by the second's collections
        t0 = time.perf_counter()
        prints[name] = []
        for i, case in runs:
            if case["phase"] == "decode" and case["output"] < 2 and not case["mix"]:
                prints[name].append(None)  # a decode instance needs something to decode
                continue
            try:
                prints[name].append(fingerprint(plan_of(tree, case, i)))
            except ValueError as refused:  # refused alike by both trees, or it shows as a difference
                prints[name].append(("refused", str(refused)))
        seconds[name] = time.perf_counter() - t0
    differ = [i for (i, case), a, b in zip(runs, prints["other"], prints["this"], strict=True) if a != b]
    print(f"{len(runs)} workloads, {len(differ)} plans differ; planning {seconds['other']:.2f} s there, "
          f"{seconds['this']:.2f} s here")
    for i in differ[:5]:
        print("  differs:", dict(runs)[i])
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
