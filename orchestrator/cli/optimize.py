"""`servesweep optimize`: the throughput optimizer for one scenario."""

from __future__ import annotations

import sys
import time

from orchestrator.cli.common import (
    BURST_NOTE,
    add_field_flags,
    check_writable,
    layout_label,
    lengths_label,
    processes_of,
    result_table,
    scenario_from_args,
)
from orchestrator.fields import InputError
from orchestrator.modes import MODES, Mode, make_mode


def add_parser(sub) -> None:
    p = sub.add_parser("optimize", help="best concurrency, parallelism and PD split for one scenario",
                       description="The throughput optimizer (the reference tool's flags).")
    add_field_flags(p, "optimize")
    m = p.add_argument_group("search mode")
    m.add_argument("--disagg", action="store_true", help=MODES["disagg"].help)
    m.add_argument("--enable-optimize-prefill-decode-ratio", action="store_true", help=MODES["pd"].help)
    m.add_argument("--prefill-devices-per-instance", type=int, help="devices of one prefill instance (PD split)")
    m.add_argument("--decode-devices-per-instance", type=int, help="devices of one decode instance (PD split)")
    o = p.add_argument_group("output")
    o.add_argument("--top-n", type=int, default=5, help="rows shown per limit pair (default: 5)")
    o.add_argument("--output", help="write every evaluated point to this Parquet file")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (it appears once a "
                   "search has run a second)")
    o.add_argument("--processes", type=int, default=None, help="search in this many processes, the jobs of one "
                   "budget together (they share plans), a timed scenario's jobs apart (theirs are their own) "
                   "(default: the CPUs this process may use); 1 = this process only")
    p.set_defaults(func=cmd_optimize)


def _mode(a) -> Mode:
    if a.enable_optimize_prefill_decode_ratio:
        for flag, v in (("--prefill-devices-per-instance", a.prefill_devices_per_instance),
                        ("--decode-devices-per-instance", a.decode_devices_per_instance)):
            if v is None:
                raise InputError(flag, v, "an integer >= 1 (needed by the PD-ratio search)")
        return make_mode("pd", prefill_devices=a.prefill_devices_per_instance,
                         decode_devices=a.decode_devices_per_instance)
    return make_mode("disagg" if a.disagg else "agg")


#: what a burst result measures, printed with every one


def cmd_optimize(a) -> int:
    from orchestrator.optimize import optimize
    from orchestrator.progress import SearchProgress

    s = scenario_from_args(a, "optimize")
    if a.top_n < 1:
        raise InputError("--top-n", a.top_n, "an integer >= 1")
    if a.output:
        check_writable("--output", a.output)
    mode = _mode(a)
    started = time.perf_counter()
    processes = processes_of(a)
    progress = SearchProgress(enabled=not a.no_progress)
    try:
        result = optimize(s, mode, processes=processes, progress=progress)
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    for note in s.default_notes + ([BURST_NOTE] if s.arrival == "burst" else []):
        print(f"note: {note}")
    for item in result.infeasible:
        print(item["message"])
    for ttft, tpot in s.limit_pairs():
        rows = [b for b in result.best if b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot]
        if not rows:
            continue
        rows.sort(key=lambda r: -r["output_throughput"])
        head = ", ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", ttft), ("TPOT", tpot)) if v is not None)
        print(f"\n{s.model} ({s.quantization}, KV {s.kv_cache_dtype}) on {s.num_devices} x {s.device}, "
              f"{lengths_label(s)}, {s.scheduler}"
              f"{', ' + head if head else ''}: top {min(a.top_n, len(rows))}")
        print(result_table(rows[: a.top_n], percentile=s.slo_percentile))
        for r in rows[: a.top_n]:
            if r.get("kv_bound"):
                print(f"note: {r['role']} {layout_label(r)} B={r['max_batched_tokens']} "
                      f"concurrency {r['concurrency']}: "
                      f"the KV cache bound the load (requests waited for blocks, {r['preemptions']} preemptions; "
                      f"{r['decoding_requests']:.1f} decoding on average); it meets the limits as the engine runs it")
    for split in result.splits:
        print(f"\nPD split (TTFT <= {split['ttft_limit_ms']}, TPOT <= {split['tpot_limit_ms']}): "
              f"{split['prefill_instances']} x P(tp{split['prefill_tp']}, conc {split['prefill_concurrency']}) + "
              f"{split['decode_instances']} x D(tp{split['decode_tp']}, conc {split['decode_concurrency']}); "
              f"P QPS {split['p_qps']:.3f}, D QPS {split['d_qps']:.3f}, pd_ratio {split['pd_ratio']:.3f}; "
              f"serves {split['served_qps']:.3f} req/s = {split['served_qps_per_device']:.4f} req/s/device, "
              f"{split['output_throughput_per_device']:.1f} tok/s/device")
    layouts = len({(p["role"], p["tp"], p.get("attention_dp", 1), p["ep"], p["max_batched_tokens"])
                   for p in result.points})
    print(f"\n{len(result.points)} points evaluated over {layouts} instance types in {elapsed:.2f} s", file=sys.stderr)
    if a.output:
        from orchestrator.results import scenario_columns, write_parquet  # with uuid and shutil: only to write

        cols = scenario_columns(s)
        path = write_parquet([{**cols, **p} for p in result.points], a.output, once=True)
        print(f"\n{len(result.points)} evaluated points written to {path}")
    return 0
