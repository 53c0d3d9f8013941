"""KV-bound planning speed: the measured runs whose KV cache binds, timed apart from the others.

Every measured run of ../shared/reference/ is estimated as `estimate --from-csv` reads it (shipped profiles).

    python bench/kv_bound.py [--runs 3] [--against DIR]

A run whose pool cannot hold every request in flight is planned request by request (simulator/kvbound.py):
those few runs take most of the time of the measured files and of a calibration on them. The table gives,
for the KV-bound runs and for the others, their count and the seconds their estimates took (the median of
`--runs` passes, each from an empty point memo), and the slowest run. `--against DIR` also times a checkout
at DIR (a `git worktree` of another commit) in a process of its own, interleaved, for before/after figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference"
FILES = ("measured_serving.csv", "measured_serving_moe.csv")
#: the columns that make two exported rows one run (the files export some runs twice)
SAME_RUN = ["backend", "backend_version", "model_path", "system", "precision", "isl", "osl", "silicon_ttft_ms",
            "silicon_tpot_ms"]


def time_runs(passes: int) -> dict:
    """{"kv": [seconds per pass], "other": [...], "kv_runs": n, "other_runs": n, "slowest": (s, run)} here."""
    import pandas as pd

    from orchestrator import evaluate
    from orchestrator.estimate import configure, estimate
    from orchestrator.runs import read_runs

    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for name in FILES:
            table = pd.read_csv(REFERENCE / name, dtype=str, keep_default_na=False).drop_duplicates(subset=SAME_RUN)
            path = Path(folder) / name
            table.to_csv(path, index=False)
            runs += read_runs([path], {})
    specs = [configure(dict(r.values)) for r in runs]
    out = {"kv": [], "other": [], "slowest": (0.0, "")}
    for _ in range(passes):
        evaluate._measured.clear()  # each pass simulates every run again
        spent, bound = {"kv": 0.0, "other": 0.0}, 0
        for run, spec in zip(runs, specs, strict=True):
            started = time.perf_counter()
            row = estimate(spec)
            seconds = time.perf_counter() - started
            spent["kv" if row["kv_bound"] else "other"] += seconds
            bound += bool(row["kv_bound"])
            out["slowest"] = max(out["slowest"], (seconds, run.where))
        for key, seconds in spent.items():
            out[key].append(seconds)
    out["kv_runs"], out["other_runs"] = bound, len(runs) - bound
    return out


def in_process_of(root: Path, passes: int) -> dict:
    """time_runs in a fresh process importing the packages of the checkout at `root`."""
    code = (f"import json, sys; sys.path[:0] = [{str(root)!r}, {str(Path(__file__).parent)!r}]; "
            f"from kv_bound import time_runs; print(json.dumps(time_runs({passes})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(label: str, result: dict) -> None:
    kv, other = statistics.median(result["kv"]), statistics.median(result["other"])
    print(f"| {label} | {result['kv_runs']} | {kv:.1f} | {result['other_runs']} | {other:.1f} | "
          f"{result['slowest'][0]:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="passes over the runs (the median is reported); default 3")
    ap.add_argument("--against", type=Path, help="also time the checkout at this directory (another commit)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        print(f"--runs {args.runs}: expected an integer >= 1", file=sys.stderr)
        return 2
    if args.against is not None and not (args.against / "simulator" / "kvbound.py").is_file():
        print(f"--against {args.against}: expected a servesweep checkout (no simulator/kvbound.py there)",
              file=sys.stderr)
        return 2
    print("| checkout | KV-bound runs | their s | other runs | their s | slowest run s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, root in (("here", ROOT), ("against", args.against)):
        if root is not None:
            report(f"{label} ({root})", in_process_of(root, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
