import subprocess
import sys

import pyarrow.parquet as pq
import pytest

BASE = ["optimize", "Qwen/Qwen3-32B", "--device", "TEST_DEVICE", "--num-devices", "1", "--input-length", "32768",
        "--output-length", "1024", "--tpot-limits", "1000"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120)


def test_rfc_example_end_to_end(tmp_path):
    out = tmp_path / "points.parquet"
    p = run(*BASE, "--max-batched-tokens", "8192", "--quantize-linear-action", "W8A8_DYNAMIC", "--output", str(out))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["role", "layout"])
    row = lines[header + 1].split()
    assert row[:4] == ["agg", "tp1pp1dp1", "8192", "2"] and row[9] == "4"
    table = pq.read_table(out).to_pandas()
    assert {"concurrency", "ttft_ms", "tpot_ms", "prefill_num_chunks", "model", "device"} <= set(table.columns)
    assert table["concurrency"].is_unique


def test_deprecated_flag_still_works():
    p = run(*BASE, "--max-prefill-tokens", "8192")
    assert p.returncode == 0 and "deprecated; use --max-batched-tokens" in p.stderr


def test_infeasible_is_exit_zero_with_an_explanation():
    p = run(*BASE, "--max-batched-tokens", "8192", "--ttft-limits", "50")
    assert p.returncode == 0
    assert "no configuration meets TTFT <= 50 ms" in p.stdout


@pytest.mark.parametrize("args, flag", [
    (["--max-batched-tokens", "0"], "--max-batched-tokens"),
    (["--prefix-cache-hit-rate", "1.0"], "--prefix-cache-hit-rate"),
    (["--tp-sizes", "3"], "--tp-sizes"),
    (["--tpot-limits", "0"], "--tpot-limits"),
    (["--scheduler", "lifo"], "--scheduler"),
    (["--num-devices", "x"], "--num-devices"),
])
def test_bad_input_is_one_line_exit_two(args, flag):
    p = run(*BASE, *args)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "Traceback" not in p.stderr


@pytest.mark.parametrize("args, flag", [
    (["--device", "NOPE"], "--device"), (["--input-length", "-4"], "--input-length"),
])
def test_bad_device_and_length(args, flag):
    base = list(BASE)
    i = base.index(args[0])
    base[i + 1] = args[1]
    p = run(*base)
    assert p.returncode == 2 and flag in p.stderr and len(p.stderr.strip().splitlines()) == 1


SILICON_HEADER = ("id,backend,backend_version,model_path,system,precision,isl,osl,batch_size,tp_size,pp_size,"
                  "moe_tp_size,moe_ep_size,attention_dp_size,silicon_ttft_ms,silicon_tpot_ms")


@pytest.mark.parametrize("command, flag", [
    (["estimate", "--from-csv", "RUNS", "--output", "OUT.csv"], "--output"),
    (["estimate", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--num-devices", "1", "--input-length", "512",
      "--output-length", "16", "--concurrency", "2", "--per-request", "OUT.parquet"], "--per-request"),
    ([*BASE[:-2], "--tpot-limits", "1000", "--output", "OUT.parquet"], "--output"),
    (["calibrate", "RUNS", "--output", "OUT.toml", "--no-progress"], "--output"),
    (["report", "RUN.parquet", "--out", "OUT"], "--out"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, command, flag):
    """A file where the output's folder would be: one line naming the flag, exit 2, before the estimates, search,
    fit or report (each wrote its answer last and failed there with a traceback); nothing written."""
    if command[0] == "report":  # the timeline of one run, written by estimate --per-request
        made = run("estimate", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--num-devices", "1", "--input-length",
                   "512", "--output-length", "16", "--concurrency", "2", "--per-request", str(tmp_path / "run.parquet"))
        assert made.returncode == 0, made.stderr
        command = [a.replace("RUN.parquet", str(tmp_path / "run.parquet")) for a in command]
    runs = tmp_path / "runs.csv"
    runs.write_text("\n".join([SILICON_HEADER, *(f"r{c},vllm,0.19.0,Qwen/Qwen3-8B,h100_sxm,,1024,128,{c},1,1,1,1,,"
                                                 f"{100 + 40 * c},9" for c in (1, 4, 8))]) + "\n")
    (tmp_path / "taken").write_text("a file, not a folder")
    out = tmp_path / "taken" / "answer"
    args = [a.replace("RUNS", str(runs)).replace("OUT", str(out)) for a in command]
    p = run(*args)
    err = p.stderr.strip().splitlines()
    expected = "a folder that can be written" if command[0] == "report" else "a file path that can be written"
    assert p.returncode == 2 and len(err) == 1 and flag in err[0] and expected in err[0], p.stderr
    assert "Traceback" not in p.stderr
    assert {x.name for x in tmp_path.iterdir()} - {"run.parquet", "run.steps.parquet"} == {"runs.csv", "taken"}


def test_the_command_freezes_its_memos_out_of_the_last_collection(capsys):
    """`servesweep` (orchestrator.cli.run) answers as `main` does, then leaves what it made to the end
    of the process uncollected (the interpreter's last collection would walk it: 20-30 ms)."""
    import gc

    from orchestrator.cli import run as command

    gc.unfreeze()
    try:
        assert command(["estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--num-devices", "1",
                        "--input-length", "2048", "--output-length", "64", "--concurrency", "8"]) == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert capsys.readouterr().out.startswith("Qwen/Qwen3-8B")


def test_a_question_loads_neither_ray_nor_pandas_and_a_burst_not_numpys_random():
    """Start-up is part of every answer: `optimize` without --output needs neither Ray nor pandas (nor the
    results writer), and a burst draws no client delay, so numpy.random is not loaded either."""
    probe = ("import sys\nfrom orchestrator.cli import main\nmain(sys.argv[1:])\n"
             "print(sorted(m for m in ('ray', 'pandas', 'numpy.random', 'orchestrator.results') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", probe, *BASE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "[]"


def test_a_closed_pipe_ends_quietly():
    p = subprocess.run(f"{sys.executable} -m orchestrator estimate Qwen/Qwen3-8B --device H200_SXM --num-devices 1 "
                       "--input-length 2048 --output-length 64 --concurrency 8 | head -1", shell=True,
                       capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("Qwen/Qwen3-8B") and "Traceback" not in p.stderr


def test_a_sweep_summary_names_the_scenario_fields_its_rows_differ_in():
    """Two best rows that differ only in prefix_caching (and benchmark) are told apart by those columns;
    fields equal in every row, and the ones the table always shows, are not repeated."""
    from orchestrator.cli.common import result_table, varying_columns

    base = {"model": "m", "device": "d", "num_devices": 1, "input_length": 8, "output_length": 4, "arrival": "closed",
            "ttft_limit_ms": 1.0, "tpot_limit_ms": 1.0, "engine": "vllm", "benchmark": "aiperf"}
    rows = [{**base, "prefix_caching": "on"}, {**base, "prefix_caching": "off", "benchmark": "steady"}]
    assert [c for _, c, _ in varying_columns(rows)] == ["benchmark", "prefix_caching"]
    assert varying_columns([rows[0], dict(rows[0])]) == []
    from orchestrator.cli.common import TABLE

    point = {**{c: 1 for _, c, _ in TABLE if c}, "tp": 1, "pp": 1, "dp": 1, "ep": 1}
    header = result_table([{**r, **point} for r in rows], scenario=True).splitlines()[0].split()
    assert header.index("benchmark") < header.index("prefix_caching") < header.index("role")
