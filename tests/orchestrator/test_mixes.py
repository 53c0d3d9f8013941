"""Request mixes through the commands: one syntax for flags, spec values and CSV cells; traces; the
per-request tables and their report."""

import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.estimate import configure, estimate
from orchestrator.fields import FIELD_BY_NAME
from orchestrator.results import scenario_columns
from orchestrator.spec import SpecError, expand

BASE = ["Qwen/Qwen3-8B", "--device", "H200_SXM", "--num-devices", "1"]
GRID = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "output_length": 64,
        "tpot_limit_ms": 50}


def run(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120)


def test_one_syntax_for_flags_spec_values_and_csv_cells(tmp_path):
    flag = configure({"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1,
                      "input_length": FIELD_BY_NAME["input_length"].parse("uniform:100:300"),
                      "output_length": 32, "arrival": "closed", "concurrency": 8})
    (item,) = expand({"grid": {**GRID, "input_length": ["uniform:100:300"], "output_length": 32}})
    assert str(flag.input_length) == str(item.scenario.input_length) == "uniform:100:300"
    cols = scenario_columns(item.scenario)
    assert (cols["input_length"], cols["input_length_mix"], cols["output_length"], cols["output_length_mix"]) == \
        (200, "uniform:100:300", 32, "")
    fixed, mixed = expand({"grid": {**GRID, "input_length": [200, "uniform:100:300"]}})
    assert fixed.id != mixed.id and fixed.scenario.request_mix is None
    with pytest.raises(SpecError, match=r"^input_length = 'uniform:300': expected an integer >= 1, uniform:LOW:HIGH"):
        expand({"grid": {**GRID, "input_length": ["uniform:300"]}})
    src = tmp_path / "in.csv"
    pd.DataFrame({"input_length": ["uniform:100:300", "200"], "concurrency": [8, 8]}).to_csv(src, index=False)
    out = tmp_path / "out.csv"
    p = run("estimate", *BASE, "--output-length", "32", "--arrival", "closed", "--from-csv", str(src),
            "--output", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    got = pd.read_csv(out)
    assert got.loc[0, "ttft_ms"] == pytest.approx(estimate(flag)["ttft_ms"])
    assert got.loc[0, "ttft_ms"] != got.loc[1, "ttft_ms"]


def test_a_point_mass_mix_answers_exactly_as_the_plain_length():
    plain = configure({"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 700,
                       "output_length": 40, "arrival": "closed", "concurrency": 6})
    (item,) = expand({"grid": {**GRID, "input_length": ["bins:700-700@1"], "output_length": 40}})
    mixed = configure({**{f: getattr(plain, f) for f in ("model", "device", "num_devices", "output_length",
                                                         "arrival", "concurrency")},
                       "input_length": item.scenario.input_length})
    a, b = estimate(plain), estimate(mixed)
    assert a == b


def test_a_timed_trace_through_estimate_and_its_per_request_report(tmp_path):
    trace = tmp_path / "chat.csv"
    pd.DataFrame({"input_length": [800, 120, 3000, 64, 500, 2000], "output_length": [100, 20, 300, 8, 50, 120],
                  "arrival_time": [0.0, 0.05, 0.1, 0.3, 0.35, 0.9]}).to_csv(trace, index=False)
    per = tmp_path / "run.parquet"
    p = run("estimate", *BASE, "--trace", str(trace), "--per-request", str(per))
    assert p.returncode == 0, p.stderr
    assert "poisson at its own times (6 prompts), trace:chat.csv@" in p.stdout
    requests = pd.read_parquet(per)
    steps = pd.read_parquet(tmp_path / "run.steps.parquet")
    assert requests["arrival_ms"].tolist() == pytest.approx([0, 50, 100, 300, 350, 900])
    assert requests["input_length"].tolist() == [800, 120, 3000, 64, 500, 2000]
    assert (requests["first_token_ms"] > requests["arrival_ms"]).all()
    assert steps["prefill_tokens"].sum() == 800 + 120 + 3000 + 64 + 500 + 2000
    assert (steps["tokens"] <= steps["budget"]).all() and steps["end_ms"].is_monotonic_increasing
    mean_ttft = float(next(line for line in p.stdout.splitlines() if line.startswith("TTFT")).split()[2])
    measured = requests[requests["measured"]]  # warm-up and drain (the first and last 10 %) left out
    assert len(measured) == 4 and measured["ttft_ms"].mean() == pytest.approx(mean_ttft, abs=0.01)
    r = run("report", str(per))
    assert r.returncode == 0, r.stderr
    report = tmp_path / "run-report"
    assert (report / "index.html").is_file() and (report / "timeline.png").stat().st_size > 10_000
    bad = run("estimate", *BASE, "--trace", str(tmp_path / "none.csv"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--trace: " in bad.stderr


def test_a_mix_through_optimize_and_its_bad_values(tmp_path):
    p = run("optimize", *BASE, "--input-length", "bins:100-400@3,2000-4000@1", "--output-length", "uniform:16:64",
            "--tpot-limits", "30", "--arrival", "closed", "--tp-sizes", "1", "--max-batched-tokens", "4096",
            "--output", str(tmp_path / "o.parquet"))
    assert p.returncode == 0, p.stderr
    assert "input bins:100-400@3,2000-4000@1, output uniform:16:64" in p.stdout
    points = pd.read_parquet(tmp_path / "o.parquet")
    assert set(points["input_length_mix"]) == {"bins:100-400@3,2000-4000@1"}
    for args, message in ((["--input-length", "normal:1:2:3"], "--input-length: 'normal:1:2:3' is not allowed"),
                          (["--input-length", "uniform:30000:50000"], "input + output <= 40960"),
                          (["--output-length", "0"], "--output-length: '0' is not allowed")):
        bad = run("optimize", *BASE, "--input-length", "100", "--output-length", "8", *args)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, bad.stderr


def test_a_sweep_writes_the_requests_of_its_best_points_behind_a_flag(tmp_path):
    from orchestrator.dataset import read_table
    from orchestrator.sweep import run_sweep

    spec = {"grid": {**GRID, "input_length": ["uniform:200:600"], "arrival": "closed", "max_batched_tokens": [2048],
                     "tpot_limit_ms": [20, 40]}, "options": {"num_prompts": 48}}
    run_sweep(expand(spec), tmp_path / "out", backend="inline", progress=False, per_request=True)
    requests, best = read_table(tmp_path / "out", "requests"), read_table(tmp_path / "out", "best")
    assert set(requests["tpot_limit_ms"]) == set(best[best["feasible"]]["tpot_limit_ms"])
    for limit, group in requests.groupby("tpot_limit_ms"):
        row = best[best["tpot_limit_ms"] == limit].iloc[0]
        assert len(group) == row["num_prompts"] and group["input_length"].between(200, 600).all()
        assert group[group["measured"]]["tpot_ms"].mean() == pytest.approx(row["tpot_ms"])
    run_sweep(expand(spec), tmp_path / "plain", backend="inline", progress=False)
    assert read_table(tmp_path / "plain", "requests").empty
