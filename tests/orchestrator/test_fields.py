"""The field table drives flags, spec keys, columns and messages; the RFC's commands run as written."""

import subprocess
import sys

import pytest

from orchestrator.cli import build_parser
from orchestrator.fields import FIELDS, InputError, fields_for
from orchestrator.results import scenario_columns
from orchestrator.scenario import Scenario
from orchestrator.spec import SpecError, expand

RFC = ["optimize", "Qwen/Qwen3-32B", "--device", "TEST_DEVICE", "--num-devices", "1", "--input-length", "32768",
       "--output-length", "1024", "--tpot-limits", "1000"]
GRID = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 2048, "output_length": 64}


def run(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120)


def _first_row(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["role", "layout"])
    return lines[header + 1].split()


@pytest.mark.parametrize("extra, budget, chunks, effective", [
    (["--max-batched-tokens", "8192"], "8192", "4", "32768"),
    (["--max-batched-tokens", "4096"], "4096", "8", "32768"),
    (["--prefix-cache-hit-rate", "0.5", "--max-batched-tokens", "8192"], "8192", "2", "16384"),
])
def test_the_rfc_commands_run_as_written(extra, budget, chunks, effective):
    """RFC 3.4.3, without a quantisation flag: TEST_DEVICE's default is the reference tool's W8A8_DYNAMIC."""
    p = run(*RFC, *extra)
    assert p.returncode == 0, p.stderr
    assert "W8A8_DYNAMIC" in p.stdout
    row = _first_row(p.stdout)
    assert row[0] == "agg" and row[2] == budget and row[3] == "2" and row[9] == chunks and row[10] == effective


def test_every_field_has_a_flag_with_help_unit_and_default():
    text = build_parser()._subparsers._group_actions[0].choices["optimize"].format_help()
    for f in fields_for("optimize"):
        if f.flag != "MODEL":
            assert f.flag in text
    assert "[ms]" in text and "(default: 1.15)" in text and "max_num_seqs, else vLLM's 1024)" in " ".join(text.split())


def test_flags_spec_keys_and_columns_come_from_one_table():
    parser = build_parser()
    a = parser.parse_args([*RFC, "--max-num-seqs", "7", "--scheduler", "token-budget"])
    assert a.max_num_seqs == 7
    (item,) = expand({"grid": {**GRID, "max_num_seqs": [7], "scheduler": "token-budget"}})
    assert item.scenario.max_num_seqs == 7 and item.scenario.make_scheduler().max_num_seqs == 7
    cols = scenario_columns(item.scenario)
    assert cols["max_num_seqs"] == 7 and cols["quantization"] == "bf16"
    assert set(cols) == {f.column for f in FIELDS if f.column} | {"input_length_mix", "output_length_mix"}
    assert (cols["input_length"], cols["input_length_mix"]) == (2048, "")


def test_scheduler_options_reach_the_simulation():
    from orchestrator.evaluate import evaluate_point
    from orchestrator.jobs import Job
    from orchestrator.scenario import Layout

    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 2048, 64, (8192,), scheduler="token-budget")
    free = evaluate_point(s, Job("agg", Layout(1), 8192), 16)
    capped = evaluate_point(s.with_(max_num_seqs=4), Job("agg", Layout(1), 8192), 16)
    assert capped["makespan_ms"] > free["makespan_ms"]  # 4 at a time take longer than 16 at once
    slack = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 2048, 64, (4096,), slack_ratio=2.0)
    tight = evaluate_point(slack.with_(slack_ratio=1.0), Job("agg", Layout(1), 4096), 8)
    loose = evaluate_point(slack, Job("agg", Layout(1), 4096), 8)
    assert loose["num_steps"] < tight["num_steps"]


@pytest.mark.parametrize("args, flag", [
    (["--slack-ratio", "0.9"], "--slack-ratio"), (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--long-prefill-token-threshold", "-1"], "--long-prefill-token-threshold"),
    (["--input-length", "40000"], "--input-length"),  # 40000 + 1024 > Qwen3-32B's 40960 positions
])
def test_bad_flag_is_one_line_naming_it(args, flag):
    p = run(*RFC, *args)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.split(": error: ")[1].startswith(flag)


def test_spec_messages_name_the_key_not_the_flag():
    with pytest.raises(SpecError, match=r"^max_num_seqs = 0: expected an integer >= 1$"):
        expand({"grid": {**GRID, "max_num_seqs": [0]}})
    with pytest.raises(SpecError, match=r"^input_length = 41000: expected input \+ output <= 40960"):
        expand({"grid": {**GRID, "input_length": 41000}})


def test_a_value_not_given_is_said_so_not_shown_as_none():
    """A required value the input left out reads "not given" in both styles, never "None"."""
    e = InputError("num_devices", None, "a device count")
    assert (e.render("flag"), e.render("key")) == ("--num-devices: not given; expected a device count",
                                                   "num_devices: not given; expected a device count")
    assert InputError("num_devices", 0, "an integer >= 1").render("key") == "num_devices = 0: expected an integer >= 1"


def test_one_checker_refuses_bools_everywhere():
    from latency.parallel import ParallelSpec
    from simulator import TokenBudget, Workload

    makers = (lambda: Workload(True, 8, 8, 1), lambda: ParallelSpec(tp=True), lambda: TokenBudget(max_num_seqs=True))
    for make in makers:
        with pytest.raises(ValueError, match="an integer >= 1, got True"):
            make()
    with pytest.raises(InputError):
        Scenario("Qwen/Qwen3-8B", "H200_SXM", True, 8, 8).validate()


def test_works_without_ray():
    """Everything but the Ray driver and the cache actor imports and runs with `ray` unimportable."""
    code = """
import sys
sys.modules["ray"] = None
import orchestrator.spec, orchestrator.scenario, orchestrator.dataset, orchestrator.report, orchestrator.optimize
import orchestrator.runner, orchestrator.cli, orchestrator.sweep
from orchestrator.spec import expand
from orchestrator.sweep import run_sweep
items = expand({"grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 512,
                         "output_length": 16, "max_batched_tokens": 2048, "tpot_limit_ms": 20}})
s = run_sweep(items, sys.argv[1], backend="inline", progress=False)
try:
    import orchestrator.cache
except ImportError:
    print("written", s.written)
"""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "written 1"


def test_no_orchestrator_module_is_over_400_lines():
    """One concept per module: the CLI is a package of one module per command, and no module of
    orchestrator/ grows past 400 lines."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "orchestrator"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
    commands = {p.stem for p in (root / "cli").glob("*.py")} - {"__init__", "common"}
    assert commands == {"optimize", "estimate", "sweep", "report", "cache", "plan", "ui", "calibrate"}


@pytest.mark.parametrize(("hbm_gib", "budget"), [(131.3, 8192), (155.0, 8192), (160.0, 16384), (167.6, 16384)])
def test_vllm_s_default_budget_tier_is_160_gib(hbm_gib, budget):
    """`vllm serve` takes 16384 tokens a step on devices of >= 160 GiB (B200's 167.6), 8192 below: a
    155 GiB device (166 GB, more than 160e9 bytes) is still in the lower tier."""
    import dataclasses

    from latency import load_device
    from orchestrator.engine_defaults import engine_default_budget

    device = dataclasses.replace(load_device("H200_SXM"), hbm_gib=hbm_gib)
    assert engine_default_budget(device) == budget


@pytest.mark.parametrize(("device", "release", "budget"), [
    ("B200", (0, 27, 0), 8192), ("B200", (0, 28, 0), 16384), ("B200", None, 16384), ("H200_SXM", (0, 28, 0), 8192)])
def test_vllm_s_large_budget_tier_came_in_0_28(device, release, budget):
    """A release before 0.28 had no 160 GiB tier: 8192 on B200 too; None is the current vLLM."""
    from latency import load_device
    from orchestrator.engine_defaults import engine_default_budget

    assert engine_default_budget(load_device(device), release) == budget
