"""`servesweep`: optimize one scenario, run a sweep, report on results."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from orchestrator.fields import InputError, fields_for
from orchestrator.modes import MODES, Mode, make_mode
from orchestrator.scenario import Scenario
from simulator.mix import Lengths


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr and exit code 2, never a usage dump or traceback."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


TABLE = [  # (header, column, format)
    ("role", "role", "{}"), ("layout", None, "{}"), ("B", "max_batched_tokens", "{}"), ("conc", "concurrency", "{}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("tok/s", "output_throughput", "{:.1f}"), ("tok/s/dev", "output_throughput_per_device", "{:.1f}"),
    ("TTFT ms", "ttft_slo_ms", "{:.1f}"), ("TPOT ms", "tpot_slo_ms", "{:.2f}"), ("chunks", "prefill_num_chunks", "{}"),
    ("E", "effective_input_length", "{}"), ("wgt GiB", "weights_gib", "{:.2f}"), ("KV GiB", "kv_gib", "{:.2f}"),
    ("act GiB", "activation_gib", "{:.2f}"), ("free GiB", "available_gib", "{:.2f}"),
]


def layout_label(row: dict) -> str:
    """tp2pp1dp4, tp1adp8pp1dp2ep8: attention ranks (adp) and expert groups (ep) shown when > 1."""
    adp = row.get("attention_dp", 1)
    return (f"tp{row['tp']}" + (f"adp{adp}" if adp > 1 else "") + f"pp{row['pp']}dp{row['dp']}"
            + (f"ep{row['ep']}" if row["ep"] > 1 else ""))


def lengths_label(s: Scenario) -> str:
    """input 4096, output 512; input uniform:100:200, output 64; trace:chat.csv@1a2b3c4d5e6f"""
    return str(s.request_mix) if s.request_mix else f"input {s.input_length}, output {s.output_length}"


def add_field_flags(p: argparse.ArgumentParser, command: str, require: bool = True) -> None:
    """Every scenario field of `command` as a flag (from the field table), grouped, with unit and default.
    `require=False` leaves required fields optional (a CSV may give them)."""
    groups = {}
    for f in fields_for(command):
        if f.flag == "MODEL":
            p.add_argument("model", metavar="MODEL", help=f.help, nargs=None if require else "?")
            continue
        group = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(f.group))
        unit = f" [{f.unit}]" if f.unit else ""
        default = "" if f.required else f" (default: {f.default_text()})"
        choices = f" {{{','.join(f.choices)}}}" if f.choices else ""
        metavar = f.name.upper().rstrip("S") if f.many else None
        kind = str if f.kind is Lengths else f.kind  # a length is parsed (and refused) with the scenario's fields
        group.add_argument(f.flag, *f.aliases, dest=f.name, type=kind, nargs="+" if f.many else None,
                           required=f.required and require, default=None, metavar=metavar,
                           help=f"{f.help}{choices}{unit}{default}")
        if f.deprecated:
            group.add_argument(f.deprecated, dest=f"deprecated_{f.name}", type=kind, nargs="+" if f.many else None,
                               help=argparse.SUPPRESS)


def scenario_from_args(a, command: str) -> Scenario:
    """The scenario of parsed flags: given flags, else the table's defaults."""
    return Scenario(**field_values(a, command))


def field_values(a, command: str) -> dict:
    """The field values the flags give (absent flags are left out)."""
    values = {}
    for f in fields_for(command):
        v = getattr(a, f.name, None)
        old = getattr(a, f"deprecated_{f.name}", None)
        if old is not None:
            print(f"servesweep: {f.deprecated} is deprecated; use {f.flag}", file=sys.stderr)
            v = v if v is not None else old
        if v is not None:
            if f.kind is Lengths:
                v = f.parse(v)
            values[f.name] = tuple(v) if f.many else v
    return values


def _add_optimize(sub) -> None:
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
    o.add_argument("--processes", type=int, default=None, help="search in this many processes, the jobs of one "
                   "budget together (default: the CPUs this process may use); 1 = this process only")
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
BURST_NOTE = ("burst: every request arrives at t=0 (the RFC's candidate window), so TTFT includes waiting behind "
              "every prefill before it; for the steady load a deployment sees, use --arrival closed "
              "(spec: arrival = \"closed\")")


def cmd_optimize(a) -> int:
    from orchestrator.optimize import optimize
    from orchestrator.results import scenario_columns, write_parquet

    s = scenario_from_args(a, "optimize")
    if a.top_n < 1:
        raise InputError("--top-n", a.top_n, "an integer >= 1")
    mode = _mode(a)
    started = time.perf_counter()
    processes = a.processes if a.processes is not None else len(os.sched_getaffinity(0))
    if processes < 1:
        raise InputError("--processes", processes, "an integer >= 1")
    result = optimize(s, mode, processes=processes)
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
        print(_table(rows[: a.top_n], percentile=s.slo_percentile))
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
        cols = scenario_columns(s)
        path = write_parquet([{**cols, **p} for p in result.points], a.output)
        print(f"\n{len(result.points)} evaluated points written to {path}")
    return 0


SCENARIO_TABLE = [("model", "model", "{}"), ("device", "device", "{}"), ("devs", "num_devices", "{}"),
                  ("in", "input_length", "{}"), ("out", "output_length", "{}"), ("arrival", "arrival", "{}"),
                  ("TTFT<=", "ttft_limit_ms", "{}"),
                  ("TPOT<=", "tpot_limit_ms", "{}")]


def _table(rows: list[dict], scenario: bool = False, percentile: float = 0.0) -> str:
    """Rows as text; TTFT and TPOT are shown where the limits apply: the mean, or `percentile`."""
    spec = (SCENARIO_TABLE if scenario else []) + TABLE
    tag = f"p{percentile:g} " if percentile else ""
    cells = [[h.replace("TTFT ", f"TTFT {tag}").replace("TPOT ", f"TPOT {tag}") for h, _, _ in spec]]
    for r in rows:
        cells.append([layout_label(r) if c is None else f.format(r[c]) for _, c, f in spec])
    widths = [max(len(row[i]) for row in cells) for i in range(len(spec))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in cells)


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run every scenario of a TOML spec; results to a Parquet dataset")
    p.add_argument("spec", help="sweep spec (TOML); see examples/")
    p.add_argument("--output", help="results directory (default results/<run-id>/)")
    p.add_argument("--resume", action="store_true", help="continue a run in --output; finished scenarios are kept")
    p.add_argument("--address", help="join this Ray cluster (or set RAY_ADDRESS); default: embedded Ray")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    p.add_argument("--inline", action="store_true", help="no Ray: evaluate in this process")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--top-n", type=int, default=20)
    p.add_argument("--per-request", action="store_true", help="also write the requests of each scenario's best "
                   "points (table requests/: arrival, first token, finish, lengths, TTFT, TPOT), re-simulated on "
                   "the driver")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(a) -> int:
    from orchestrator.spec import SpecError, expand, load_spec
    from orchestrator.sweep import default_output, init_ray, run_sweep

    if a.resume and not a.output:
        raise InputError("--resume", True, "together with --output DIR of the run to continue")
    if a.num_cpus is not None and a.num_cpus < 1:
        raise InputError("--num-cpus", a.num_cpus, "an integer >= 1")
    try:
        spec = load_spec(a.spec)
        items = expand(spec)
    except SpecError as err:
        print(f"servesweep sweep: error: {err}", file=sys.stderr)
        return 2
    output = str(a.output or default_output())
    from orchestrator.dataset import Dataset

    try:
        Dataset(output).files("best")
    except (OSError, ValueError) as err:
        raise InputError("--output", output, f"a writable directory or URI ({str(err).splitlines()[0]})") from None
    if not a.inline:
        init_ray(a.address, a.num_cpus)
    try:
        summary = run_sweep(items, output, resume=a.resume, backend="inline" if a.inline else "ray",
                            progress=not a.no_progress, spec=spec, per_request=a.per_request)
    except FileExistsError as err:
        print(f"servesweep sweep: error: --output: {err}", file=sys.stderr)
        return 2
    from orchestrator.dataset import read_table

    table = read_table(summary.output, "best")
    best = _best_per_scenario(table.to_dict("records") if len(table) else [])
    print(f"{summary.total} scenarios: {summary.written} run, {summary.skipped} already finished; "
          f"{summary.points} points, {summary.priced} keys priced, {summary.seconds:.1f} s; "
          f"{summary.plans_made} plans made of {summary.distinct_plans} distinct, "
          f"workers {summary.workers}, {100 * summary.efficiency:.0f} % busy"
          + (f", idle tail {summary.idle_tail:.1f} s" if summary.workers > 1 else "")
          + (f"; {summary.retried} parts run again after a lost worker or node" if summary.retried else ""))
    if best:
        print(f"best configuration per scenario (top {min(a.top_n, len(best))} by output tok/s/device):")
        print(_table(best[: a.top_n], scenario=True))
        if any(b.get("arrival") == "burst" for b in best):
            print(f"note: {BURST_NOTE}")
    for b in summary.infeasible[:5]:  # of this run
        print(f"{b['scenario_id']}: {b['message']}")
    print(f"results: {summary.output}/ (points/, best/, manifest.json)")
    return 0


def _best_per_scenario(rows: list[dict]) -> list[dict]:
    best: dict[str, dict] = {}
    for r in rows:
        if r["feasible"] and (r["scenario_id"] not in best
                              or r["output_throughput"] > best[r["scenario_id"]]["output_throughput"]):
            best[r["scenario_id"]] = r
    return sorted(best.values(), key=lambda r: -r["output_throughput_per_device"])


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="tables, plots and index.html of a results directory")
    p.add_argument("results", help="a results directory or URI of `sweep`, or a RUN.parquet of "
                   "`estimate --per-request` (its timeline)")
    p.add_argument("--out", help="report directory (default RESULTS/report)")
    p.add_argument("--max-plots", type=int, default=12, help="figures per kind at most")
    p.set_defaults(func=cmd_report)
    c = sub.add_parser("compare", help="how the best configurations differ between two result sets")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(func=cmd_compare)


def _results_dir(flag: str, path: str) -> str:
    from orchestrator.dataset import Dataset

    try:
        finished = Dataset(path).files("best")
    except (OSError, ValueError) as err:
        raise InputError(flag, path, f"a readable results directory or URI ({str(err).splitlines()[0]})") from None
    if not finished:
        raise InputError(flag, path, "results written by `servesweep sweep` (a directory or URI with best/ files)")
    return path


def cmd_report(a) -> int:
    from orchestrator.report import write_report

    if a.results.endswith(".parquet"):
        return _report_run(a)
    results = _results_dir("RESULTS", a.results)
    if a.max_plots < 0:
        raise InputError("--max-plots", a.max_plots, "an integer >= 0")
    out = a.out or (f"report-{results.rstrip('/').rsplit('/', 1)[-1]}" if "://" in results
                    else str(Path(results) / "report"))
    try:
        files = write_report(results, out, a.max_plots)
    except ValueError as err:
        print(f"servesweep report: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {out}/index.html ({len(files)} files)")
    for f in files:
        print(f"  {f}")
    return 0


def _report_run(a) -> int:
    """`report RUN.parquet`: the timeline of one run written by `estimate --per-request`."""
    from orchestrator.estimate import steps_path
    from orchestrator.timeline_report import write_run_report

    for path in (a.results, steps_path(a.results)):
        if not Path(path).is_file():
            raise InputError("RESULTS", path, "a file written by `estimate --per-request` (and its .steps.parquet)")
    out = a.out or a.results[: -len(".parquet")] + "-report"
    files = write_run_report(a.results, steps_path(a.results), out)
    print(f"report: {out}/index.html ({len(files)} files)")
    return 0


def cmd_compare(a) -> int:
    from orchestrator.report import compare

    try:
        lines = compare(_results_dir("A", a.a), _results_dir("B", a.b))
    except ValueError as err:
        print(f"servesweep compare: error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _add_estimate(sub) -> None:
    p = sub.add_parser("estimate", help="metrics, memory and a per-op breakdown of one configuration (no search)",
                       description="One configuration: a layout (--tp-sizes T, default all devices in one "
                       "instance), a budget (default vLLM's), and a load (--concurrency, or --request-rate "
                       "with --arrival poisson). --from-csv evaluates one configuration per row.")
    add_field_flags(p, "estimate", require=False)
    o = p.add_argument_group("many configurations")
    o.add_argument("--from-csv", help="a CSV with one configuration per row; columns are spec keys (model, device, "
                   "tp, concurrency, input_length, ...); a missing column or empty cell takes the flag or default")
    o.add_argument("--output", help="where --from-csv writes its rows (.csv or .parquet): the input columns "
                   "kept, the metric columns added, one row per input row in order")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    o.add_argument("--per-request", metavar="FILE.parquet", help="one configuration: write its requests (arrival, "
                   "first token, finish, lengths, cached tokens, TTFT/TPOT) to FILE and its steps to "
                   "FILE.steps.parquet; `servesweep report FILE` draws them")
    p.set_defaults(func=cmd_estimate)


ESTIMATE_METRICS = [("TTFT ms", "ttft"), ("TPOT ms", "tpot"), ("ITL ms", "itl"), ("E2E ms", "e2e")]


def cmd_estimate(a) -> int:
    from orchestrator.estimate import breakdown, configure, estimate, estimate_many

    values = field_values(a, "estimate")
    if a.from_csv:
        if not a.output:
            raise InputError("--output", None, "a .csv or .parquet path (needed with --from-csv)")
        if not a.output.endswith((".csv", ".parquet")):
            raise InputError("--output", a.output, "a path ending in .csv or .parquet")
        table, unknown = estimate_many(a.from_csv, values, progress=not a.no_progress)
        if unknown:
            print(f"servesweep estimate: columns kept but not read: {', '.join(unknown)}", file=sys.stderr)
        if a.output.endswith(".parquet"):
            table.to_parquet(a.output, index=False)
        else:
            table.to_csv(a.output, index=False)
        print(f"{len(table)} configurations estimated; written to {a.output}")
        return 0
    if a.output:
        raise InputError("--output", a.output, "only with --from-csv (one configuration prints its answer)")
    if a.per_request and not a.per_request.endswith(".parquet"):
        raise InputError("--per-request", a.per_request, "a path ending in .parquet")
    s = configure(values)
    row = estimate(s)
    if a.per_request:
        from orchestrator.estimate import run_tables, steps_path

        requests, steps = run_tables(s)
        requests.to_parquet(a.per_request, index=False)
        steps.to_parquet(steps_path(a.per_request), index=False)
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
    for note in s.default_notes + ([BURST_NOTE] if s.arrival == "burst" else []):
        print(f"note: {note}")
    print(f"{'':10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for label, k in ESTIMATE_METRICS:
        print(f"{label:10}" + "".join(f"{row[c]:>10.2f}" for c in
                                      (f"{k}_ms", f"{k}_p50_ms", f"{k}_p90_ms", f"{k}_p99_ms")))
    print(f"throughput: {row['request_throughput']:.3f} req/s, {row['output_throughput']:.1f} output tok/s "
          f"({row['output_throughput_per_device']:.1f} per device), goodput {row['goodput']:.3f} req/s; "
          f"{row['measured_requests']} requests measured{'' if row['steady'] else ' (no steady window: all)'}")
    print(f"memory per device: weights {row['weights_gib']:.2f} GiB, KV peak {row['kv_gib']:.2f} GiB "
          f"({row['peak_kv_tokens']:.0f} of {row['kv_capacity_tokens']} tokens), activations "
          f"{row['activation_gib']:.2f} GiB, free {row['available_gib']:.2f} GiB"
          f"{'' if row['fits_memory'] else '  -- DOES NOT FIT'}")
    if row["kv_bound"]:
        print(f"KV cache bound the load: requests waited for blocks as vLLM queues them; "
              f"{row['decoding_requests']:.1f} decoding on average of {row['concurrency']} in flight, "
              f"{row['preemptions']} preemptions (recomputed)")
    table = breakdown(s, row)
    print("\nper-op breakdown of a typical step:")
    print(table.to_string(index=False, formatters={"ms": "{:.3f}".format, "share": "{:.1%}".format}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="servesweep", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log what happens to stderr (-v: info, -vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_optimize(sub)
    _add_estimate(sub)
    _add_sweep(sub)
    _add_report(sub)
    _add_cache(sub)
    _add_plan(sub)
    _add_ui(sub)
    return parser


def _add_ui(sub) -> None:
    p = sub.add_parser("ui", help="a local web page: build commands, run estimates and searches, explore results")
    p.add_argument("--results", help="a results directory or URI to open in the Explore tab")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; every call needs "
                   "the token in the printed URL: listen elsewhere only on a network you trust)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.set_defaults(func=cmd_ui)


def cmd_ui(a) -> int:
    from orchestrator.ui import LOOPBACK, serve

    if not 0 <= a.port <= 65535:
        raise InputError("--port", a.port, "an integer in [0, 65535]")
    if a.host not in LOOPBACK:
        print(f"servesweep ui: warning: listening on {a.host}: anyone who reaches it with the token can run "
              "searches on this machine", file=sys.stderr)
    try:
        server = serve(a.host, a.port, a.results)
    except OSError as err:
        raise InputError("--port", a.port, f"a free port on {a.host} ({err.strerror or err})") from None
    print(f"servesweep ui: {server.url} (Ctrl-C stops it)", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


#: what `plan` deploys unless told otherwise: the commands it prints are vLLM's
PLAN_DEFAULTS = {"scheduler": "token-budget", "engine": "vllm"}


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="the fewest devices that serve a request rate under the limits, its cost, "
                       "and the vLLM commands to deploy and check it",
                       description="For each device type and instance size, the Poisson capacity of every "
                       "layout and budget; the answer needs the fewest devices (then the lowest cost). "
                       "Defaults to vLLM's token-budget scheduler and framework time (--scheduler, --engine).")
    add_field_flags(p, "plan")
    g = p.add_argument_group("plan")
    g.add_argument("--device", nargs="+", required=True, metavar="D", help="device types to consider")
    g.add_argument("--request-rate", type=float, required=True, help="requests per second to serve [req/s]")
    g.add_argument("--max-devices", type=int, default=8, help="devices at most (default: 8)")
    g.add_argument("--device-price", nargs="+", default=[], metavar="D=USD_PER_HOUR",
                   help="price per device-hour, overriding the device file's [cost] usd_per_hour")
    g.add_argument("--top-n", type=int, default=3, help="runner-up options shown (default: 3)")
    g.add_argument("--format", choices=("text", "json"), default="text", help="json: machine-readable, on stdout")
    p.set_defaults(func=cmd_plan)


def _prices(items: list[str], devices: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        device, _, usd = item.partition("=")
        try:
            value = float(usd)
        except ValueError:
            value = -1.0
        if device not in devices or value < 0:
            raise InputError("--device-price", item, f"D=USD_PER_HOUR with D one of {', '.join(devices)} and a "
                             "price >= 0")
        prices[device] = value
    return prices


def cmd_plan(a) -> int:
    import json

    from orchestrator.plan import option_dict, plan_deployment

    if a.request_rate <= 0:
        raise InputError("--request-rate", a.request_rate, "a rate > 0 (req/s)")
    if a.max_devices < 1:
        raise InputError("--max-devices", a.max_devices, "an integer >= 1")
    if a.top_n < 0:
        raise InputError("--top-n", a.top_n, "an integer >= 0")
    values = {**PLAN_DEFAULTS, **field_values(a, "plan")}
    s = Scenario(**values, device=a.device[0], num_devices=1, arrival="poisson")
    for device in a.device:  # each device type is checked before the search starts
        s.with_(device=device).validate()
    prices = _prices(a.device_price, a.device)
    options = plan_deployment(s, a.device, a.request_rate, a.max_devices, prices)
    limits = ", ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", s.ttft_limits[0] if s.ttft_limits else None),
                                                       ("TPOT", s.tpot_limits[0] if s.tpot_limits else None)) if v)
    if not options:
        message = (f"no deployment of at most {a.max_devices} x {' or '.join(a.device)} serves {a.request_rate:g} "
                   f"req/s under {limits or 'memory'}; raise --max-devices or relax a limit")
        print(json.dumps({"plan": None, "message": message}) if a.format == "json" else message)
        return 0
    best = [option_dict(s, options[0], commands=True)] + [option_dict(s, o) for o in options[1:1 + a.top_n]]
    if a.format == "json":
        print(json.dumps({"request_rate": a.request_rate, "plan": best[0], "runners_up": best[1:]}, indent=2))
        return 0
    _print_plan(s, a, best, limits)
    return 0


def _print_plan(s, a, best, limits) -> None:
    top = best[0]
    print(f"{s.model}: {a.request_rate:g} req/s of {lengths_label(s)} under {limits or 'no limits'}"
          + (f" (p{s.slo_percentile:g})" if s.slo_percentile else ""))
    for i, o in enumerate(best):
        cost = (f", ${o['usd_per_hour']:.2f}/h, ${o['usd_per_mtok']:.3f}/M output tokens"
                if o["usd_per_hour"] == o["usd_per_hour"] else "")
        print(f"{'plan' if i == 0 else 'or  '}: {o['devices']} x {o['device']} = {o['instances']} x "
              f"{layout_label({**o, 'dp': 1})} B={o['max_batched_tokens']}, {o['capacity_per_instance']:.2f} req/s "
              f"per instance, headroom {100 * o['headroom']:.0f} %{cost}")
    print(f"\ndeploy each of the {top['instances']} instance(s):\n  {top['vllm_serve']}")
    for note in top["notes"]:
        print(f"  note: {note}")
    print(f"check one instance at its share of the load (predicted TTFT {top['predicted_ttft_ms']:.1f} ms, "
          f"TPOT {top['predicted_tpot_ms']:.2f} ms):\n  {top['vllm_bench_serve']}")


def _add_cache(sub) -> None:
    p = sub.add_parser("cache", help="the Ray cluster's shared latency cache: stats or clear (for operators)")
    p.add_argument("action", choices=("stats", "clear"), help="stats: entries, hits, misses, evictions per shard; "
                   "clear: empty every shard")
    p.add_argument("--address", help="the Ray cluster (default RAY_ADDRESS)")
    p.set_defaults(func=cmd_cache)


def cmd_cache(a) -> int:
    import os

    address = a.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise InputError("--address", None, "a Ray cluster address (or RAY_ADDRESS): the cache lives on a cluster")
    from orchestrator.sweep import init_ray

    init_ray(address)
    return cache_command(a.action)


def cache_command(action: str) -> int:
    """Print the shards' stats, or clear them, on the Ray cluster this process is connected to."""
    from orchestrator.cache import CACHE_NAME, existing_cache

    cache = existing_cache(CACHE_NAME)
    if cache is None:
        print("no latency cache on this cluster (a sweep with an expensive latency backend creates it)")
        return 0
    if action == "clear":
        cache.clear()
        print(f"cleared {len(cache.shards)} shard(s)")
        return 0
    print(f"{'shard':>5} {'entries':>9} {'max':>9} {'hits':>9} {'misses':>9} {'evicted':>8} {'calls':>8}")
    for i, st in enumerate(cache.stats()):
        print(f"{i:>5} {st['entries']:>9} {st['max_entries']:>9} {st['hits']:>9} {st['misses']:>9} "
              f"{st['evicted']:>8} {st['calls']:>8}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from orchestrator.evaluate import collect_rarely

    collect_rarely()
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return args.func(args)
    except InputError as err:
        print(f"servesweep {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servesweep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`servesweep ... | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
