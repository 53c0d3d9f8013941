import re
import shutil
import subprocess
import sys

import matplotlib.image as mpimg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.dataset import read_table
from orchestrator.report import compare, pareto_front, write_report
from orchestrator.spec import expand
from orchestrator.sweep import run_sweep

AGG = {"grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": [2], "input_length": [1024, 4096],
                "output_length": [128], "max_batched_tokens": [2048, 8192], "ttft_limit_ms": [2000],
                "tpot_limit_ms": [15, 40]}}
PD = {"sweep": {"mode": "pd", "pd_devices": [1, 1]}, "grid": {**AGG["grid"], "max_batched_tokens": [4096]}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    run_sweep(expand(AGG), out, backend="inline", progress=False)
    run_sweep(expand(PD), out, backend="inline", progress=False, resume=True)
    return out


def test_report_writes_every_file(results, tmp_path):
    files = write_report(results, tmp_path / "report")
    names = {f.name for f in files}
    assert {"best.csv", "best.md", "index.html"} <= names
    assert any(n.startswith("curves_") for n in names)
    assert any(n.startswith("pareto_") for n in names)
    assert any(n.startswith("budget_") for n in names)
    for f in files:
        assert f.stat().st_size > 0
        if f.suffix == ".png":
            img = mpimg.imread(f)
            assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0
    best = read_table(results, "best")
    feasible_scenarios = best[best["feasible"]]["scenario_id"].nunique()
    csv = (tmp_path / "report" / "best.csv").read_text().splitlines()
    assert len(csv) == 1 + feasible_scenarios  # header + one row per scenario with a feasible best
    html = (tmp_path / "report" / "index.html").read_text()
    refs = re.findall(r"(?:src|href)='([^']+)'", html)
    assert refs and all((tmp_path / "report" / r).is_file() for r in refs)
    assert set(refs) == {n for n in names if n.endswith(".png")}


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=40))
def test_pareto_points_are_non_dominated(pts):
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    front = set(pareto_front(xs, ys))
    for i in range(len(pts)):
        dominated = any(xs[j] >= xs[i] and ys[j] >= ys[i] and (xs[j], ys[j]) != (xs[i], ys[i])
                        for j in range(len(pts)))
        if i in front:
            assert not dominated
        elif not dominated:  # left out only as an exact duplicate of a front point
            assert any((xs[j], ys[j]) == (xs[i], ys[i]) for j in front)


def test_compare_reports_changes(results, tmp_path):
    same = compare(results, results)
    assert same[-1] == "no best configuration changed"
    other = tmp_path / "other"
    shutil.copytree(results, other)
    path = next((other / "best").glob("*/*/*.parquet"))
    rows = pq.read_table(path).to_pandas()
    i = rows.index[rows["feasible"]][0]
    sid = rows.loc[i, "scenario_id"]
    rows.loc[rows["scenario_id"] == sid, "concurrency"] = rows.loc[i, "concurrency"] + 1
    rows.loc[rows["scenario_id"] == sid, "output_throughput"] *= 1.5
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), path)
    lines = compare(results, other)
    changed = [line for line in lines if line.startswith(sid)]
    assert len(changed) == 1 and "concurrency" in changed[0] and "(+50.0 %)" in changed[0]


def test_cli_report_and_compare(results, tmp_path):
    p = subprocess.run([sys.executable, "-m", "orchestrator", "report", str(results), "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "index.html" in p.stdout and (tmp_path / "r" / "index.html").is_file()
    p = subprocess.run([sys.executable, "-m", "orchestrator", "compare", str(results), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "B:" in p.stderr and len(p.stderr.strip().splitlines()) == 1
