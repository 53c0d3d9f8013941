"""`servesweep report` and `compare`: tables and plots of results, and how two sets differ."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.cli.common import check_writable_folder
from orchestrator.fields import InputError


def add_parser(sub) -> None:
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
    check_writable_folder("--out", out)
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
    check_writable_folder("--out", out)
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
