"""`servesweep`: optimize one scenario, run a sweep, report on results."""

from __future__ import annotations

import argparse
import sys

from orchestrator.scenario import AUTO_MAX_BATCHED_TOKENS, DEFAULT_MAX_CONCURRENCY, InputError, Scenario


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr and exit code 2, never a usage dump or traceback."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


TABLE = [  # (header, column, format)
    ("role", "role", "{}"), ("layout", None, "{}"), ("B", "max_batched_tokens", "{}"), ("conc", "concurrency", "{}"),
    ("tok/s", "output_throughput", "{:.1f}"), ("tok/s/dev", "output_throughput_per_device", "{:.1f}"),
    ("TTFT ms", "ttft_ms", "{:.1f}"), ("TPOT ms", "tpot_ms", "{:.2f}"), ("chunks", "prefill_num_chunks", "{}"),
    ("E", "effective_input_length", "{}"), ("wgt GiB", "weights_gib", "{:.2f}"), ("KV GiB", "kv_gib", "{:.2f}"),
    ("act GiB", "activation_gib", "{:.2f}"), ("free GiB", "available_gib", "{:.2f}"),
]


def _add_optimize(sub) -> None:
    p = sub.add_parser("optimize", help="best concurrency, parallelism and PD split for one scenario")
    p.add_argument("model", help="shipped model name or path to a config.json (or its folder)")
    p.add_argument("--device", required=True)
    p.add_argument("--num-devices", type=int, required=True)
    p.add_argument("--input-length", type=int, required=True)
    p.add_argument("--output-length", type=int, required=True)
    p.add_argument("--max-batched-tokens", type=int, nargs="+",
                   help=f"token budget per step and chunk size; default: best of {AUTO_MAX_BATCHED_TOKENS}")
    p.add_argument("--max-prefill-tokens", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--ttft-limits", type=float, nargs="+", default=[])
    p.add_argument("--tpot-limits", type=float, nargs="+", default=[])
    p.add_argument("--prefix-cache-hit-rate", type=float, default=0.0)
    p.add_argument("--tp-sizes", type=int, nargs="+", default=[])
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--disagg", action="store_true")
    p.add_argument("--enable-optimize-prefill-decode-ratio", action="store_true")
    p.add_argument("--prefill-devices-per-instance", type=int)
    p.add_argument("--decode-devices-per-instance", type=int)
    p.add_argument("--num-mtp-tokens", type=int, default=0)
    p.add_argument("--mtp-acceptance-rates", type=float, nargs="+", default=[])
    p.add_argument("--quantize-linear-action", default="bf16")
    p.add_argument("--kv-cache-dtype", default="bf16")
    p.add_argument("--reserved-memory-gb", type=float, default=10.0, help="GiB kept free per device")
    p.add_argument("--scheduler", default="decode-first")
    p.add_argument("--decode-context", default="mean", choices=["mean", "mid"])
    p.add_argument("--max-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY)
    p.add_argument("--top-n", type=int, default=5)
    p.add_argument("--output", help="write every evaluated point to this Parquet file")
    p.set_defaults(func=cmd_optimize)


def _scenario(a) -> Scenario:
    budgets = a.max_batched_tokens
    if a.max_prefill_tokens:
        print("servesweep: --max-prefill-tokens is deprecated; use --max-batched-tokens", file=sys.stderr)
        budgets = budgets or a.max_prefill_tokens
    return Scenario(
        model=a.model, device=a.device, num_devices=a.num_devices, input_length=a.input_length,
        output_length=a.output_length, max_batched_tokens=tuple(budgets or AUTO_MAX_BATCHED_TOKENS),
        ttft_limits=tuple(a.ttft_limits), tpot_limits=tuple(a.tpot_limits),
        prefix_cache_hit_rate=a.prefix_cache_hit_rate, tp_sizes=tuple(a.tp_sizes), pp=a.pp_size, ep=a.ep_size,
        quantization=a.quantize_linear_action, kv_cache_dtype=a.kv_cache_dtype,
        reserved_memory_gb=a.reserved_memory_gb, scheduler=a.scheduler, decode_context=a.decode_context,
        mtp_tokens=a.num_mtp_tokens, mtp_acceptance_rates=tuple(a.mtp_acceptance_rates),
        max_concurrency=a.max_concurrency)


def _pd_devices(a, s: Scenario):
    if not a.enable_optimize_prefill_decode_ratio:
        return None
    p, q = a.prefill_devices_per_instance, a.decode_devices_per_instance
    for flag, v in (("--prefill-devices-per-instance", p), ("--decode-devices-per-instance", q)):
        if v is None or v < 1 or v > s.num_devices:
            raise InputError(flag, v, f"an integer in [1, {s.num_devices}] (needed by the PD-ratio search)")
    if p + q > s.num_devices:
        raise InputError("--decode-devices-per-instance", q, f"at most --num-devices - P = {s.num_devices - p}")
    for flag, v in (("--prefill-devices-per-instance", p), ("--decode-devices-per-instance", q)):
        try:
            s.with_(tp_sizes=(v,), num_devices=v).layouts()
        except ValueError as err:
            raise InputError(flag, v, str(err)) from None
    return p, q


def cmd_optimize(a) -> int:
    from orchestrator.optimize import optimize
    from orchestrator.results import scenario_columns, write_parquet

    s = _scenario(a)
    if a.top_n < 1:
        raise InputError("--top-n", a.top_n, "an integer >= 1")
    s.validate()
    pd_devices = _pd_devices(a, s)
    result = optimize(s, disagg=a.disagg, pd_devices=pd_devices)
    for item in result.infeasible:
        print(item["message"])
    for ttft, tpot in s.limit_pairs():
        rows = [b for b in result.best if b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot]
        if not rows:
            continue
        rows.sort(key=lambda r: -r["output_throughput"])
        head = ", ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", ttft), ("TPOT", tpot)) if v is not None)
        print(f"\n{s.model} on {s.num_devices} x {s.device}, input {s.input_length}, output {s.output_length}"
              f"{', ' + head if head else ''}: top {min(a.top_n, len(rows))}")
        print(_table(rows[: a.top_n]))
    for split in result.splits:
        print(f"\nPD split (TTFT <= {split['ttft_limit_ms']}, TPOT <= {split['tpot_limit_ms']}): "
              f"{split['prefill_instances']} x P(tp{split['prefill_tp']}, conc {split['prefill_concurrency']}) + "
              f"{split['decode_instances']} x D(tp{split['decode_tp']}, conc {split['decode_concurrency']}); "
              f"P QPS {split['p_qps']:.3f}, D QPS {split['d_qps']:.3f}, pd_ratio {split['pd_ratio']:.3f}; "
              f"serves {split['served_qps']:.3f} req/s = {split['served_qps_per_device']:.4f} req/s/device, "
              f"{split['output_throughput_per_device']:.1f} tok/s/device")
    if a.output:
        cols = scenario_columns(s)
        path = write_parquet([{**cols, **p} for p in result.points], a.output)
        print(f"\n{len(result.points)} evaluated points written to {path}")
    return 0


SCENARIO_TABLE = [("model", "model", "{}"), ("device", "device", "{}"), ("devs", "num_devices", "{}"),
                  ("in", "input_length", "{}"), ("out", "output_length", "{}"), ("TTFT<=", "ttft_limit_ms", "{}"),
                  ("TPOT<=", "tpot_limit_ms", "{}")]


def _table(rows: list[dict], scenario: bool = False) -> str:
    spec = (SCENARIO_TABLE if scenario else []) + TABLE
    cells = [[h for h, _, _ in spec]]
    for r in rows:
        layout = f"tp{r['tp']}pp{r['pp']}dp{r['dp']}" + (f"ep{r['ep']}" if r["ep"] > 1 else "")
        cells.append([layout if c is None else f.format(r[c]) for _, c, f in spec])
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
    output = a.output or default_output()
    mode = spec.get("sweep", {}).get("mode", "agg")
    if not a.inline:
        init_ray(a.address, a.num_cpus)
    try:
        summary = run_sweep(items, output, mode=mode, resume=a.resume, backend="inline" if a.inline else "ray",
                            progress=not a.no_progress, spec=spec)
    except FileExistsError as err:
        print(f"servesweep sweep: error: --output: {err}", file=sys.stderr)
        return 2
    from orchestrator.dataset import read_table

    table = read_table(summary.output, "best")
    best = _best_per_scenario(table.to_dict("records") if len(table) else [])
    print(f"{summary.total} scenarios: {summary.written} run, {summary.skipped} already finished; "
          f"{summary.points} points, {summary.priced} keys priced, {summary.seconds:.1f} s")
    if best:
        print(f"best configuration per scenario (top {min(a.top_n, len(best))} by output tok/s/device):")
        print(_table(best[: a.top_n], scenario=True))
    infeasible = [b for b in summary.best if not b["feasible"]]  # of this run
    for b in infeasible[:5]:
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
    p.add_argument("results")
    p.add_argument("--out", help="report directory (default RESULTS/report)")
    p.add_argument("--max-plots", type=int, default=12, help="figures per kind at most")
    p.set_defaults(func=cmd_report)
    c = sub.add_parser("compare", help="how the best configurations differ between two result sets")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(func=cmd_compare)


def _results_dir(flag: str, path: str):
    from pathlib import Path

    if not (Path(path) / "best").is_dir():
        raise InputError(flag, path, "a results directory written by `servesweep sweep` (with a best/ folder)")
    return Path(path)


def cmd_report(a) -> int:
    from orchestrator.report import write_report

    results = _results_dir("RESULTS", a.results)
    if a.max_plots < 0:
        raise InputError("--max-plots", a.max_plots, "an integer >= 0")
    out = a.out or results / "report"
    try:
        files = write_report(results, out, a.max_plots)
    except ValueError as err:
        print(f"servesweep report: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {out}/index.html ({len(files)} files)")
    for f in files:
        print(f"  {f}")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="servesweep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_optimize(sub)
    _add_sweep(sub)
    _add_report(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as err:
        print(f"servesweep {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servesweep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
