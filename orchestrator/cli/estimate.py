"""`servesweep estimate`: one configuration (or one per CSV row), no search."""

from __future__ import annotations

import sys

from orchestrator.cli.common import (
    BURST_NOTE,
    add_field_flags,
    aligned,
    check_writable,
    field_values,
    layout_label,
    lengths_label,
)
from orchestrator.fields import FIELD_BY_KEY, InputError
from orchestrator.layout_readings import READINGS


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="metrics, memory and a per-op breakdown of one configuration (no search)",
                       description="One configuration: a layout (--tp-sizes T, default all devices in one "
                       "instance), a budget (default vLLM's), and a load (--concurrency, or --request-rate "
                       "with --arrival poisson). --from-csv evaluates one configuration per row.")
    add_field_flags(p, "estimate", require=False)
    o = p.add_argument_group("many configurations")
    o.add_argument("--from-csv", help="a CSV with one configuration per row; columns are spec keys (model, device, "
                   "tp, concurrency, input_length, ...); a missing column or empty cell takes the flag or default. "
                   "A file of measured runs in NVIDIA AIConfigurator's silicon format (model_path, system, backend, "
                   "isl, osl, batch_size per attention-DP rank, tp_size, ..., silicon_ttft_ms, silicon_tpot_ms) is "
                   "read as the runs it measured, as aiperf drove them (SGLang from 0.5.6 launched as AIConfigurator's "
                   "generator launches it: mixed chunks, budget input + 1500, as many running as in flight), and our "
                   "error is written beside each measured metric (ttft_error, tpot_error: ours / measured - 1), as "
                   "it is beside a spec-key CSV's measured_ttft_ms and measured_tpot_ms (calibrate's form)")
    o.add_argument("--output", help="where --from-csv writes its rows (.csv or .parquet): the input columns "
                   "kept, the metric columns added, one row per input row in order")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    o.add_argument("--per-request", metavar="FILE.parquet", help="one configuration: write its requests (arrival, "
                   "first token, finish, lengths, cached tokens, TTFT/TPOT) to FILE and its steps to "
                   "FILE.steps.parquet; `servesweep report FILE` draws them")
    p.set_defaults(func=cmd_estimate)


ESTIMATE_METRICS = [("TTFT ms", "ttft"), ("TPOT ms", "tpot"), ("ITL ms", "itl"), ("E2E ms", "e2e")]


def print_errors(table, replaced: frozenset = frozenset(), silicon: bool = True) -> None:
    """Median |error| against measured runs, in all and per engine where several ran them; `replaced`: the spec
    keys a flag gave every run in place of its reading. A CSV of spec keys with measured_ttft_ms or measured_tpot_ms
    (`silicon` False) gets the first line alone, and the note on runs held back: its rows were not read, they say
    what ran."""
    from orchestrator.held_back import held_back_note

    errors = [c for c in ("ttft_error", "tpot_error") if c in table]

    def said(rows) -> str:
        rows = rows[rows[errors].notna().any(axis=1)]
        medians = ", ".join(f"{c.split('_')[0].upper()} {rows[c].abs().median():.1%}" for c in errors)
        return f"{medians} over {len(rows)} runs ({int(rows['kv_bound'].sum())} bound by the KV cache)"

    print(f"against the measured runs: median |error| {said(table)}")
    unmeasured = int(table[errors].isna().all(axis=1).sum())
    if unmeasured:
        print(f"note: {unmeasured} runs have no measured TTFT or TPOT (empty cells): estimated, not compared")
    held = held_back_note(table)
    if held:
        print(f"note: {held}")
    if not silicon:
        return
    engines = table.groupby("engine", sort=True)
    if engines.ngroups > 1:
        for engine, rows in engines:
            print(f"  {engine}: {said(rows)}")
    launch = [c for c in ("scheduler", "max_batched_tokens", "max_num_seqs") if c not in replaced]
    if "scheduler" in launch and "scheduler" in table and table["scheduler"].notna().any():
        generated = table[table["scheduler"].notna()]
        print(f"note: {len(generated)} runs ({', '.join(sorted(set(generated['engine'])))}) read as AIConfigurator's "
              f"generator launched them (their engine version; columns {', '.join(launch)}), the rest at the "
              "engines' defaults")
    if "release_read_as" in table and table["release_read_as"].notna().any():
        read_as = table[table["release_read_as"].notna()]
        found = ", ".join(f"{n} as {release}" for release, n in read_as["release_read_as"].value_counts().items())
        print(f"note: {len(read_as)} runs record no engine release; read as the release their campaign's other "
              f"runs (same engine, model, GPU, precision and run date) ran most: {found}")
    if "prefix_cache_evidence" in table and table["prefix_cache_evidence"].notna().any():
        served = table["prefix_cache_evidence"].dropna()
        print(f"note: {len(served)} runs' campaigns hold a run that needs more of its GPUs' dense peak than computing "
              f"every prompt allows ({'; '.join(sorted(set(served)))}): a prefix cache likely served their prompts. "
              "Read as the format's other rows, with it off; --prefix-caching on reads them with it, and calibrate "
              "on a few of them tries both")
    for column, (said, _) in READINGS.items():
        if column in table and table[column].notna().any():
            print(f"note: {int(table[column].notna().sum())} runs {said}")


def cmd_estimate(a) -> int:
    from orchestrator.estimate import (
        backend_notes,
        breakdown,
        configure,
        estimate,
        estimate_many,
        prompt_cache_hits,
        stand_in_note,
    )
    from orchestrator.measured_runs import replaced_readings
    from orchestrator.results import write_frame

    values = field_values(a, "estimate")
    if a.from_csv:
        if not a.output:
            raise InputError("--output", None, "a .csv or .parquet path (needed with --from-csv)")
        if not a.output.endswith((".csv", ".parquet")):
            raise InputError("--output", a.output, "a path ending in .csv or .parquet")
        check_writable("--output", a.output)
        table, unknown = estimate_many(a.from_csv, values, progress=not a.no_progress)
        if unknown:
            print(f"servesweep estimate: columns kept but not read: {', '.join(unknown)}", file=sys.stderr)
        write_frame(table, a.output)
        print(f"{len(table)} configurations estimated; written to {a.output}")
        if "silicon_ttft_ms" not in table and {"ttft_error", "tpot_error"} & set(table.columns):
            print_errors(table, silicon=False)
        elif "ttft_error" in table:
            replaced = replaced_readings(values)
            print_errors(table, frozenset(replaced))
            if replaced:
                print(f"note: {', '.join(FIELD_BY_KEY[key].flag for key in replaced)} given: in every run in place "
                      "of how its row was read")
        return 0
    if a.output:
        raise InputError("--output", a.output, "only with --from-csv (one configuration prints its answer)")
    if a.per_request and not a.per_request.endswith(".parquet"):
        raise InputError("--per-request", a.per_request, "a path ending in .parquet")
    if a.per_request:
        check_writable("--per-request", a.per_request)
    s = configure(values)
    row = estimate(s)
    if values.get("num_devices") is None and not values.get("tp_sizes"):
        print("note: no --num-devices or --tp-sizes: one device (tp 1), as vllm serve runs without a layout")
    if a.per_request:
        from orchestrator.estimate import run_tables, steps_path

        requests, steps = run_tables(s)
        write_frame(requests, a.per_request)
        write_frame(steps, steps_path(a.per_request))
        print(f"{len(requests)} requests and {len(steps)} steps written to {a.per_request} and "
              f"{steps_path(a.per_request)}", file=sys.stderr)
    rate = f"{s.request_rate:g} req/s" if s.request_rate else "its own times"
    load = rate if s.arrival == "poisson" else f"concurrency {s.concurrency}"
    print(f"{s.model} ({s.quantization}, KV {s.kv_cache_dtype}) on {s.num_devices} x {s.device}, "
          f"{layout_label(row)}, {s.role}, "
          f"{s.arrival} at {load} ({row['num_prompts']} prompts"
          f"{', measured as ' + s.benchmark if s.benchmark != 'steady' and s.arrival != 'burst' else ''}), "
          f"{lengths_label(s)}, "
          f"{s.scheduler} B={row['max_batched_tokens']}")
    queued = stand_in_note(s)
    for note in s.default_notes + backend_notes(s) + ([BURST_NOTE] if s.arrival == "burst" else []) + \
            ([queued] if queued else []):
        print(f"note: {note}")
    print(aligned([["", "mean", "p50", "p90", "p99"]] +
                  [[label] + [f"{row[c]:.2f}" for c in (f"{k}_ms", f"{k}_p50_ms", f"{k}_p90_ms", f"{k}_p99_ms")]
                   for label, k in ESTIMATE_METRICS], left=1))
    print(f"throughput: {row['request_throughput']:.3f} req/s, {row['output_throughput']:.1f} output tok/s "
          f"({row['output_throughput_per_device']:.1f} per device), goodput {row['goodput']:.3f} req/s; "
          f"{row['measured_requests']} requests measured{'' if row['steady'] else ' (no steady window: all)'}")
    print(f"memory per device: weights {row['weights_gib']:.2f} GiB, KV peak {row['kv_gib']:.2f} GiB "
          f"({row['peak_kv_tokens']:.0f} of {row['kv_capacity_tokens']} tokens), activations "
          f"{row['activation_gib']:.2f} GiB, free {row['available_gib']:.2f} GiB, "
          f"reserved {row['reserved_gib']:.2f} GiB"
          f"{'' if row['fits_memory'] else '  -- DOES NOT FIT'}")
    hits = prompt_cache_hits(s)
    if hits is not None:
        print(f"prefix cache: {hits[0]:.0%} of the {hits[1]} requests found their prompt cached (the cache kept "
              f"{hits[2]} prompt tokens beside the requests in flight)")
    if row["kv_bound"]:
        print(f"KV cache bound the load: requests waited for blocks, admitted by {s.capacity_scheduler}; "
              f"{row['decoding_requests']:.1f} decoding on average of {row['concurrency']} in flight, "
              f"{row['preemptions']} preemptions (recomputed)")
    table = breakdown(s, row)
    print("\nper-op breakdown of a typical step:")
    print(table.to_string(index=False, formatters={"ms": "{:.3f}".format, "share": "{:.1%}".format}))
    return 0
