"""`servesweep estimate`: one configuration end to end, and many from a CSV."""

import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.estimate import configure, estimate
from orchestrator.evaluate import evaluate_point
from orchestrator.jobs import Job
from orchestrator.scenario import Layout, Scenario

BASE = ["estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--num-devices", "2", "--input-length", "2048",
        "--output-length", "128"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120)


def test_one_configuration_prints_metrics_memory_and_breakdown():
    p = run(*BASE, "--tp-sizes", "1", "--concurrency", "32", "--arrival", "closed", "--scheduler", "token-budget")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "tp1pp1dp2" in out and "closed at concurrency 32 (256 prompts)" in out and "B=8192" in out
    assert "vLLM's defaults" in out  # the engine defaults are named
    for label in ("TTFT ms", "TPOT ms", "ITL ms", "E2E ms", "memory per device", "per-op breakdown"):
        assert label in out
    assert {"compute", "memory"} <= set(out.split())


def test_the_reserve_is_the_engine_s_own_unless_given():
    """--reserved-memory-gb defaults to what the engine's memory utilisation leaves (vLLM: a tenth
    of an H100's 79.6 GiB; TensorRT-LLM: its CUDA context, 551 MB, before its pool takes its fraction of the
    rest, which the row's reserve then counts), 10 GiB with an engine that names none; a given value wins."""
    base = {"model": "Qwen/Qwen3-8B", "device": "H100_SXM", "num_devices": 1, "input_length": 2048,
            "output_length": 128, "tp_sizes": (1,), "concurrency": 8, "arrival": "closed"}
    assert configure({**base, "engine": "vllm"}).reserved_memory_gb == pytest.approx(7.96)
    assert configure({**base, "engine": "trtllm"}).reserved_memory_gb == 551e6 / 2**30
    assert configure(base).reserved_memory_gb == 10.0
    assert configure({**base, "engine": "vllm", "reserved_memory_gb": 12.0}).reserved_memory_gb == 12.0
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--tp-sizes", "1", "--input-length", "2048",
            "--output-length", "128", "--concurrency", "8", "--arrival", "closed", "--engine", "vllm")
    assert p.returncode == 0, p.stderr
    assert "reserved 7.96 GiB" in p.stdout
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--tp-sizes", "1", "--input-length", "2048",
            "--output-length", "128", "--concurrency", "8", "--arrival", "closed", "--engine", "trtllm")
    assert p.returncode == 0, p.stderr
    # the context, and 0.2 of 79.6 GiB less it, 15.26 GiB of weights and 1.08 GiB of activations
    assert "weights 15.26 GiB" in p.stdout and "activations 1.08 GiB" in p.stdout, p.stdout
    assert f"reserved {0.2 * (79.6 - 0.513 - 15.26 - 1.08) + 0.513:.2f} GiB" in p.stdout, p.stdout
    assert "note: trtllm's KV pool takes 0.8 of what its weights and activations leave" in p.stdout, p.stdout


def test_estimate_equals_the_optimizer_point():
    s = configure({"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 2, "input_length": 2048,
                   "output_length": 128, "tp_sizes": (1,), "concurrency": 32, "arrival": "closed"})
    assert s.max_batched_tokens == (8192,)
    direct = evaluate_point(Scenario("Qwen/Qwen3-8B", "H200_SXM", 2, 2048, 128, (8192,), tp_sizes=(1,),
                                     arrival="closed"), Job("agg", Layout(1), 8192), 32)
    assert estimate(s) == direct


def test_poisson_estimate_uses_the_rate():
    s = configure({"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 1024,
                   "output_length": 64, "arrival": "poisson", "request_rate": 2.0, "num_prompts": 100})
    row = estimate(s)
    assert row["request_rate"] == 2.0 and row["num_prompts"] == 100
    assert row["request_throughput"] == pytest.approx(2.0, rel=0.3)  # below capacity it serves what it is offered


def test_from_csv_of_calibrate_s_spec_form_writes_our_error_beside_its_measured_times(tmp_path):
    """A CSV of spec keys with measured_ttft_ms and measured_tpot_ms (what calibrate reads) gets our error beside
    each measured time, as a silicon CSV does (they were columns kept but not read); an empty cell is estimated,
    not compared; a cell that is not a time > 0 is one line naming its row and column."""
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text("concurrency,measured_ttft_ms,measured_tpot_ms\n2,400,30\n4,,45\n")
    p = run(*BASE, "--from-csv", str(src), "--output", str(out), "--no-progress")
    assert p.returncode == 0 and "kept but not read" not in p.stderr, p.stderr
    got = pd.read_csv(out)
    assert got["ttft_error"].tolist()[0] == pytest.approx(got["ttft_ms"][0] / 400 - 1) and pd.isna(got["ttft_error"][1])
    assert got["tpot_error"].tolist() == pytest.approx([got["tpot_ms"][0] / 30 - 1, got["tpot_ms"][1] / 45 - 1])
    assert "against the measured runs: median |error| TTFT" in p.stdout and "1 runs have no measured" not in p.stdout
    src.write_text("concurrency,measured_ttft_ms\n2,soon\n")
    bad = run(*BASE, "--from-csv", str(src), "--output", str(out), "--no-progress")
    assert bad.returncode == 2 and "line 2, column measured_ttft_ms: 'soon' is not allowed" in bad.stderr


def test_from_csv_names_the_runs_held_back_ahead_of_the_engine(tmp_path):
    """A closed loop whose measured TTFT is far above ours at our TPOT ran fewer requests at once than its clients
    (Little's law: C x decode / (TTFT + decode), decode = (output - 1) x TPOT): the row says how many it ran and how
    many we run, and a note names it; a run measured as we predict it is not held back."""
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text("concurrency\n16\n32\n")
    common = (*BASE, "--arrival", "closed", "--from-csv", str(src), "--output", str(out), "--no-progress")
    assert run(*common).returncode == 0
    ours = pd.read_csv(out)
    decode = 127 * ours["tpot_ms"][0]
    late = ours["ttft_ms"][0] + 10 * decode  # requests wait ten decodes ahead of the engine
    src.write_text(f"concurrency,measured_ttft_ms,measured_tpot_ms\n16,{late},{ours['tpot_ms'][0]}\n"
                   f"32,{ours['ttft_ms'][1]},{ours['tpot_ms'][1]}\n")
    p = run(*common)
    assert p.returncode == 0, p.stderr
    got = pd.read_csv(out)
    assert got["measured_running"][0] == pytest.approx(16 * decode / (late + decode))  # about 1.5 of 16
    assert got["running"][0] == pytest.approx(16 * decode / (ours["ttft_ms"][0] + decode))
    assert got["held_back"].tolist() == [True, False]
    assert got["measured_running"][1] == pytest.approx(got["running"][1])
    assert "note: 1 closed-loop runs ran far fewer requests at once than we run" in p.stdout
    assert f"row 2: about {16 * decode / (late + decode):.0f} requests decoding, where we run" in p.stdout


def test_from_csv_keeps_rows_in_order_and_adds_metrics(tmp_path):
    src = tmp_path / "in.csv"
    pd.DataFrame({"id": ["a", "b", "c"], "concurrency": [1, 8, 4], "tp": [1, 2, 1],
                  "arrival": ["burst", "closed", ""]}).to_csv(src, index=False)
    out = tmp_path / "out.parquet"
    p = run(*BASE, "--from-csv", str(src), "--output", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "columns kept but not read: id" in p.stderr
    got = pd.read_parquet(out)
    assert list(got["id"]) == ["a", "b", "c"] and list(got["tp"]) == [1, 2, 1]
    assert list(got["num_prompts"]) == [1, 64, 4]  # closed: 8 x concurrency; an empty cell took the default burst
    assert got["ttft_ms"].notna().all() and (got["output_throughput"] > 0).all()
    single = run(*BASE, "--tp-sizes", "2", "--concurrency", "8", "--arrival", "closed")
    tpot = float(next(line for line in single.stdout.splitlines() if line.startswith("TPOT")).split()[2])
    assert got.loc[1, "tpot_ms"] == pytest.approx(tpot, abs=0.01)


@pytest.mark.parametrize("cells, message", [
    ({"concurrency": ["x"]}, "line 2, column concurrency: 'x' is not allowed; expected an integer >= 1"),
    ({"concurrency": [4], "tp": [3]}, "line 2, column tp: 3 is not allowed"),
    ({"concurrency": [1, 0]}, "line 3, column concurrency: 0 is not allowed"),
])
def test_a_bad_cell_is_one_line_naming_row_and_column(tmp_path, cells, message):
    src = tmp_path / "in.csv"
    pd.DataFrame(cells).to_csv(src, index=False)
    p = run(*BASE, "--from-csv", str(src), "--output", str(tmp_path / "o.csv"), "--no-progress")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


def test_missing_required_field_is_named():
    p = run("estimate", "Qwen/Qwen3-8B", "--input-length", "10", "--output-length", "4")
    assert p.returncode == 2 and "--device: not given" in p.stderr and p.stderr.count("\n") == 1


def test_moe_layouts_from_csv_columns_tp_attention_dp_moe_tp_ep(tmp_path):
    """The measured runs' layout columns: moe_tp alone fixes ep (tp x attention_dp / moe_tp); moe_tp and
    ep that disagree are one line naming the row and column."""
    moe = ["estimate", "Qwen/Qwen3-30B-A3B", "--device", "H200_SXM", "--num-devices", "8", "--input-length",
           "1024", "--output-length", "64", "--no-progress"]
    src = tmp_path / "in.csv"
    pd.DataFrame({"tp": [8, 1, 2], "attention_dp": [1, 8, 4], "moe_tp": [8, 1, ""], "ep": ["", "", 2],
                  "concurrency": [16, 64, 64]}).to_csv(src, index=False)
    out = tmp_path / "out.parquet"
    p = run(*moe, "--from-csv", str(src), "--output", str(out))
    assert p.returncode == 0, p.stderr
    got = pd.read_parquet(out)
    assert list(zip(got["ep"], got["moe_tp"], got["dp"], strict=True)) == [(1, 8, 1), (8, 1, 1), (2, 4, 1)]
    assert list(got["concurrency"]) == [16, 64, 64]
    single = run(*moe[:-1], "--tp", "1", "--attention-dp", "8", "--ep-size", "8", "--concurrency", "64")
    assert "tp1adp8pp1dp1ep8" in single.stdout
    tpot = float(next(line for line in single.stdout.splitlines() if line.startswith("TPOT")).split()[2])
    assert got.loc[1, "tpot_ms"] == pytest.approx(tpot, abs=0.01)
    pd.DataFrame({"tp": [2], "attention_dp": [4], "moe_tp": [2], "ep": [2], "concurrency": [8]}).to_csv(src,
                                                                                                      index=False)
    bad = run(*moe, "--from-csv", str(src), "--output", str(out))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "line 2, column moe_tp: 2 is not allowed; expected tp x attention_dp / ep = 8 / 2" in bad.stderr


def test_uneven_attention_dp_loads_run_at_the_busiest_ranks_pace():
    # 5 requests over 4 attention ranks: the balancer gives 2, 1, 1, 1; the lockstep step is the rank
    # of 2's, so latencies are those of 8 requests (2 a rank) and throughput 5/8 of theirs
    values = {"model": "Qwen/Qwen3-30B-A3B", "device": "H100_SXM", "num_devices": 4, "input_length": 1024,
              "output_length": 64, "tp_sizes": (1,), "attention_dp_sizes": (4,), "arrival": "closed",
              "scheduler": "token-budget", "num_prompts": 40}
    uneven = estimate(configure({**values, "concurrency": 5}))
    even = estimate(configure({**values, "concurrency": 8}))
    assert uneven["concurrency"] == 5 and even["concurrency"] == 8
    assert (uneven["ttft_ms"], uneven["tpot_ms"], uneven["peak_kv_tokens"]) == (
        even["ttft_ms"], even["tpot_ms"], even["peak_kv_tokens"])
    for column in ("request_throughput", "output_throughput", "output_throughput_per_device"):
        assert uneven[column] == pytest.approx(even[column] * 5 / 8)
    assert estimate(configure({**values, "concurrency": 3}))["ttft_ms"] < uneven["ttft_ms"]  # 1 a rank


def test_a_layout_implies_its_device_count(tmp_path):
    implied = configure({"model": "Qwen/Qwen3-30B-A3B", "device": "H100_SXM", "input_length": 1024,
                         "output_length": 64, "tp_sizes": (2,), "attention_dp_sizes": (2,), "pp": 1,
                         "concurrency": 4})
    assert implied.num_devices == 4
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--tp-sizes", "1", "--concurrency", "8",
            "--input-length", "1024", "--output-length", "128")
    assert p.returncode == 0, p.stderr
    assert "on 1 x H200_SXM, tp1pp1dp1" in p.stdout
    table = tmp_path / "layouts.csv"
    table.write_text("tp,concurrency\n1,4\n2,4\n")
    out = tmp_path / "out.csv"
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--input-length", "1024", "--output-length", "64",
            "--from-csv", str(table), "--output", str(out))
    assert p.returncode == 0, p.stderr
    rows = pd.read_csv(out)
    assert rows["tp"].tolist() == [1, 2] and rows["dp"].tolist() == [1, 1]  # one instance on tp devices


def test_estimate_with_no_layout_runs_on_one_device_as_vllm_serve_does_and_says_so():
    args = ["estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--concurrency", "8", "--input-length", "1024",
            "--output-length", "128"]
    p = run(*args)
    assert p.returncode == 0, p.stderr
    assert "on 1 x H200_SXM, tp1pp1dp1" in p.stdout
    assert "note: no --num-devices or --tp-sizes: one device (tp 1), as vllm serve runs without a layout" in p.stdout
    q = run(*args, "--num-devices", "1", "--tp-sizes", "1")
    assert q.returncode == 0 and "no --num-devices" not in q.stdout
    assert [line for line in p.stdout.splitlines() if "no --num-devices" not in line] == q.stdout.splitlines()


@pytest.mark.parametrize(("args", "message"), [
    (["--tp-sizes", "2", "--num-devices", "3"], "--tp-sizes: 2 is not allowed; expected a divisor of --num-devices 3 "
     "(with pp=1)"),
])
def test_a_device_count_the_layout_cannot_fill_names_both(args, message):
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--concurrency", "8", "--input-length", "1024",
            "--output-length", "128", *args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr


def test_ep_320_over_256_experts_with_redundant_copies():
    """CloudMatrix384's decode layout (DeepSeek, EP 320 over 256 routed + 64 redundant experts, one
    expert a die) is refused without the copies, naming the flag, and runs with them; a die then holds
    what a die of EP 256 over 256 dies holds (one expert, the same attention), so their weights agree."""
    args = ["estimate", "deepseek-ai/DeepSeek-V3", "--device", "ATLAS_800_A3_752T_128G_DIE", "--tp-sizes", "1",
            "--input-length", "1024", "--output-length", "16", "--role", "decode", "--no-progress"]
    wide = ["--attention-dp-sizes", "320", "--ep-size", "320", "--concurrency", "640"]
    refused = run(*args, *wide)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "ep=320 must divide the 256 experts" in refused.stderr and "--redundant-experts" in refused.stderr
    p = run(*args, *wide, "--redundant-experts", "64")
    assert p.returncode == 0, p.stderr
    assert "on 320 x ATLAS_800_A3_752T_128G_DIE, tp1adp320pp1dp1ep320" in p.stdout
    q = run(*args, "--attention-dp-sizes", "256", "--ep-size", "256", "--concurrency", "512")
    assert q.returncode == 0, q.stderr

    def weights(out):
        return next(line for line in out.splitlines() if line.startswith("memory per device")).split(",")[0]

    assert weights(p.stdout) == weights(q.stdout)
    on_one = run(*args, "--attention-dp-sizes", "1", "--ep-size", "1", "--concurrency", "8",
                 "--redundant-experts", "8", "--num-devices", "1")
    assert on_one.returncode == 2 and "--redundant-experts" in on_one.stderr and "Traceback" not in on_one.stderr


def test_an_engine_plays_its_own_step_policy_unless_told_another():
    """SGLang schedules prefill-first: with --engine sglang and no --scheduler the answer is played
    with it (the header names it, no note); asked for the RFC's decode-first, the answer says that
    SGLang schedules otherwise and how to get its policy back. --engine none keeps decode-first."""
    args = [*BASE, "--tp-sizes", "1", "--concurrency", "8", "--arrival", "closed"]
    p = run(*args, "--engine", "sglang")
    assert p.returncode == 0, p.stderr
    assert "prefill-first B=" in p.stdout and "schedules prefill-first" not in p.stdout
    q = run(*args, "--engine", "sglang", "--scheduler", "decode-first")
    assert q.returncode == 0, q.stderr
    assert ("note: sglang schedules prefill-first, this answer decode-first: for sglang's own schedule, "
            "--scheduler prefill-first") in q.stdout and "decode-first B=" in q.stdout

    def tpot(out):
        return next(line for line in out.splitlines() if line.startswith("TPOT ms"))

    assert tpot(p.stdout) != tpot(q.stdout)  # another policy, other numbers
    r = run(*args, "--engine", "vllm")
    assert r.returncode == 0 and "token-budget B=" in r.stdout, r.stderr
    assert "decode-first B=" in run(*args).stdout  # --engine none: the RFC's policy


def test_an_fp8_answer_says_the_engine_s_measured_runs_kept_an_fp8_kv_cache():
    """TensorRT-LLM's profile was fitted on FP8 runs with an FP8 KV cache: an FP8 answer with a bf16
    cache says so and how to match them; with --kv-cache-dtype fp8, or on SGLang (whose profile does
    not say it), or in bf16, no note."""
    args = [*BASE, "--tp-sizes", "1", "--concurrency", "8", "--scheduler", "token-budget"]
    note = "trtllm's measured FP8 runs kept an FP8 KV cache, this answer's is bf16: to match them, --kv-cache-dtype fp8"
    p = run(*args, "--engine", "trtllm", "--quantize-linear-action", "fp8")
    assert p.returncode == 0, p.stderr
    assert f"note: {note}" in p.stdout
    for extra in (["--engine", "trtllm", "--quantize-linear-action", "fp8", "--kv-cache-dtype", "fp8"],
                  ["--engine", "sglang", "--quantize-linear-action", "fp8"], ["--engine", "trtllm"]):
        q = run(*args, *extra)
        assert q.returncode == 0, q.stderr
        assert "FP8 KV cache" not in q.stdout, extra


def test_aiperf_s_reused_prompts_hit_the_engine_s_prefix_cache_unless_it_is_off():
    """Under --benchmark aiperf the client draws every prompt from 100; vLLM caches prompts by default, so
    most requests compute one block: TTFT and TPOT fall, and the answer says why. With the cache off, or
    --engine none (which has none), or another protocol, every prompt is computed."""
    args = [*BASE, "--tp-sizes", "1", "--concurrency", "16", "--arrival", "closed", "--benchmark", "aiperf"]

    def ttft_tpot(out):  # the mean column of the TTFT and TPOT lines
        rows = {line.split()[0]: float(line.split()[2]) for line in out.splitlines()
                if line.startswith(("TTFT ms", "TPOT ms"))}
        return rows["TTFT"], rows["TPOT"]

    on, off = run(*args, "--engine", "vllm"), run(*args, "--engine", "vllm", "--prefix-caching", "off")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert "note: aiperf draws every prompt from 100 it reuses; its prefix cache serves" in on.stdout
    assert "the prefix cache is off, so each is computed again" in off.stdout
    # 160 played requests (vLLM's profile reads 10 a client) after 32 warm-up draws from 100 prompts, 16 at
    # once: request i >= 16 hits with chance 1 - 0.99^(32 + i), the first wave 1 - 0.99^32; the mean is 0.63
    expected = (16 * (1 - 0.99 ** 32) + sum(1 - 0.99 ** (32 + i) for i in range(16, 160))) / 160
    hits = next(line for line in on.stdout.splitlines() if line.startswith("prefix cache: "))
    assert abs(int(hits.split()[2].rstrip("%")) / 100 - expected) < 0.05 and "of the 160 requests" in hits
    assert "prefix cache: " not in off.stdout
    (t_on, p_on), (t_off, p_off) = ttft_tpot(on.stdout), ttft_tpot(off.stdout)
    assert t_on < t_off and p_on < p_off
    none = run(*args)  # --engine none: no prefix cache
    assert ttft_tpot(none.stdout) == ttft_tpot(run(*args, "--prefix-caching", "off").stdout)
    plain = run(*[a for a in args if a not in ("--benchmark", "aiperf")], "--engine", "vllm")
    assert "reuses" not in plain.stdout
    bad = run(*args, "--prefix-caching", "maybe")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--prefix-caching" in bad.stderr, bad.stderr
    assert "'maybe' is not allowed; expected one of on, off" in bad.stderr


MEASURED_HEADER = ("id,backend,backend_version,model_path,system,precision,gemm_quant_mode,moe_quant_mode,isl,osl,"
                   "batch_size,tp_size,pp_size,moe_tp_size,moe_ep_size,attention_dp_size,silicon_ttft_ms,"
                   "silicon_tpot_ms")


#: silicon rows that leave something out: two runs of a campaign with its release, one without (read as
#: theirs), one without in a campaign of no other run, and one with an empty attention DP under a MoE group of 2
LEFT_OUT_ROWS = [
    "2026_04_06_gpt_b200_c4_a,vllm,0.15.1,openai/gpt-oss-120b,b200_sxm,fp4,nvfp4,nvfp4,1024,256,4,1,1,1,1,1,50,4",
    "2026_04_06_gpt_b200_c4_b,vllm,0.15.1,openai/gpt-oss-120b,b200_sxm,fp4,nvfp4,nvfp4,1024,256,8,1,1,1,1,1,50,4",
    "2026_04_06_gpt_b200_c8_c,vllm,,openai/gpt-oss-120b,b200_sxm,fp4,nvfp4,nvfp4,1024,256,8,1,1,1,1,1,50,4",
    "2026_05_01_gpt_b200_c8_d,vllm,,openai/gpt-oss-120b,b200_sxm,fp4,nvfp4,nvfp4,1024,256,8,1,1,1,1,1,50,4",
    "mm_agg_1024x1024_c48_e,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,h200_sxm,fp8,fp8,fp8,1024,1024,16,1,1,2,1,,150,16"]


def estimate_measured(tmp_path, rows: list[str]):
    """`estimate --from-csv` of measured runs in AIConfigurator's format: (process, output table or None)."""
    src, out = tmp_path / "silicon.csv", tmp_path / "out.csv"
    src.write_text("\n".join([MEASURED_HEADER, *rows]) + "\n")
    p = run("estimate", "--from-csv", str(src), "--output", str(out), "--no-progress")
    return p, (pd.read_csv(out) if p.returncode == 0 else None)


def test_measured_runs_in_aiconfigurator_s_format_are_read_as_they_ran(tmp_path):
    """A silicon CSV as AIConfigurator publishes it: batch_size is one attention-DP rank's (16 x 4
    ranks = 64 in flight), an -FP8 checkpoint is its model in FP8 (vLLM keeps an FP8 KV cache for
    it), gpt-oss's nvfp4 label is its MXFP4 checkpoint, an NVFP4 label brings an FP8 cache; each
    row is what `estimate` says of the same configuration given as spec keys, with ours / measured - 1
    beside the measured metrics."""
    p, got = estimate_measured(tmp_path, [
        "a,vllm,0.19.0,MiniMaxAI/MiniMax-M2.5,b200_sxm,fp8,fp8,fp8,1024,1024,16,4,1,1,16,4,150,16",
        "b,vllm,0.12.0,Qwen/Qwen3-235B-A22B-FP8,h200_sxm,fp8,fp8,fp8,1024,256,8,4,1,4,1,1,120,12",
        "c,vllm,0.15.1,openai/gpt-oss-120b,b200_sxm,fp4,nvfp4,nvfp4,1024,256,4,1,1,1,1,1,50,4",
        "d,vllm,0.17.0,moonshotai/Kimi-K2.5,b200_sxm,fp4,nvfp4,nvfp4,1024,256,4,4,1,4,1,1,80,8"])
    assert p.returncode == 0, p.stderr
    assert "against the measured runs: median |error| TTFT" in p.stdout and "over 4 runs" in p.stdout
    assert "  vllm:" not in p.stdout  # one engine: no breakdown
    assert "note: 1 runs (vllm) read as AIConfigurator's generator launched them" in p.stdout  # 0.12 alone
    assert list(got["id"]) == ["a", "b", "c", "d"] and list(got["concurrency"]) == [64, 8, 4, 4]
    assert list(got["model"]) == ["MiniMaxAI/MiniMax-M2.5", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-120b",
                                  "moonshotai/Kimi-K2.5"]
    assert list(got["quantization"]) == ["fp8", "fp8", "bf16+mxfp4", "bf16+nvfp4"]
    assert list(got["kv_cache_dtype"]) == ["fp8"] * 4
    assert list(got["benchmark"]) == ["aiperf"] * 4 and list(got["arrival"]) == ["closed"] * 4
    assert list(got["prefix_caching"]) == ["off"] * 4  # AIConfigurator's launches: no prefix cache
    # vLLM before 0.14 ran without async scheduling; later ones at vLLM's default (on)
    assert got["async_scheduling"].fillna("").tolist() == ["", "off", "", ""]
    assert got["ttft_error"].tolist() == pytest.approx((got["ttft_ms"] / got["silicon_ttft_ms"] - 1).tolist())
    assert got["tpot_error"].tolist() == pytest.approx((got["tpot_ms"] / got["silicon_tpot_ms"] - 1).tolist())
    first = estimate(configure({"model": "MiniMaxAI/MiniMax-M2.5", "device": "B200", "engine": "vllm",
                                "quantization": "fp8", "kv_cache_dtype": "fp8", "input_length": 1024,
                                "output_length": 1024, "concurrency": 64, "tp_sizes": (4,),
                                "attention_dp_sizes": (4,), "ep": 16, "arrival": "closed",
                                "benchmark": "aiperf", "prefix_caching": "off", "max_batched_tokens": (8192,)}))
    assert got.loc[0, "ttft_ms"] == pytest.approx(first["ttft_ms"]) and got.loc[0, "tpot_ms"] == pytest.approx(
        first["tpot_ms"])


def test_sglang_runs_from_0_5_6_are_read_as_aiconfigurator_s_generator_launched_them(tmp_path):
    """SGLang 0.5.6.post2 on: prompt chunks mixed into the decode steps (token budget), the budget
    --max-prefill-tokens = prompt + 1500 capped at the default chunk (8192 on H200), as many running
    requests as in flight; an older SGLang or a build without a release number keeps the engine's
    defaults. Each reading is what `estimate` says of the same spec keys."""
    p, got = estimate_measured(tmp_path, [
        "a,sglang,0.5.6.post2,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,,,1000,100,160,1,1,1,1,1,1600,27",
        "b,sglang,0.5.8.post1,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,,,8000,100,20,1,1,1,1,1,700,34",
        "c,sglang,0.5.1.post1,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,,,1000,100,160,1,1,1,1,1,1600,27",
        "d,sglang,nightly-5b8c30d,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,,,1000,100,160,1,1,1,1,1,1600,27",
        "e,trtllm,1.2.0rc6.post1,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,,,1000,100,160,1,1,1,1,1,70,11"])
    assert p.returncode == 0, p.stderr
    assert "note: 3 runs (sglang, trtllm) read as AIConfigurator's generator launched them" in p.stdout
    assert got["scheduler"].fillna("").tolist() == ["token-budget", "token-budget", "", "", "token-budget"]
    # TensorRT-LLM 1.2 (Dynamo 0.8's, beside SGLang 0.5.6.post2): batch + prompt + 1500 in 32-token blocks
    trt_budget = -(-(160 + 1000 + 1500) // 32) * 32
    assert got["max_batched_tokens"].fillna(0).tolist() == [1000 + 1500, 8192, 0, 0, trt_budget]
    assert got["max_num_seqs"].fillna(0).tolist() == [160, 20, 0, 0, 160]
    common = {"model": "meta-llama/Llama-3.1-8B-Instruct", "device": "H200_SXM", "engine": "sglang",
              "quantization": "fp8", "input_length": 1000, "output_length": 100, "concurrency": 160,
              "tp_sizes": (1,), "arrival": "closed", "benchmark": "aiperf", "prefix_caching": "off"}
    mixed = estimate(configure(common | {"scheduler": "token-budget", "max_batched_tokens": (2500,),
                                         "max_num_seqs": 160}))
    default = estimate(configure(common))
    assert got.loc[0, "tpot_ms"] == pytest.approx(mixed["tpot_ms"]) and got.loc[0, "ttft_ms"] == pytest.approx(
        mixed["ttft_ms"])
    assert got.loc[2, "tpot_ms"] == pytest.approx(default["tpot_ms"]) and got.loc[3, "tpot_ms"] == pytest.approx(
        default["tpot_ms"])
    # prefill-first stops the decodes for every prompt; mixed chunks do not: the cohort waits longer
    assert default["ttft_ms"] > mixed["ttft_ms"]
    trt = estimate(configure(common | {"engine": "trtllm", "kv_cache_dtype": "fp8", "scheduler": "token-budget",
                                       "max_batched_tokens": (trt_budget,), "max_num_seqs": 160}))
    assert got.loc[4, "ttft_ms"] == pytest.approx(trt["ttft_ms"]) and got.loc[4, "tpot_ms"] == pytest.approx(
        trt["tpot_ms"])


def test_vllm_0_12_runs_are_read_as_aiconfigurator_s_generator_launched_them(tmp_path):
    """vLLM 0.12 (Dynamo 0.8's): a token budget of the batch on a rank + prompt + 1500 (128 + 1024 + 1500 =
    2652), as many running requests as in flight, no async scheduling; 0.11 and 0.15 keep vLLM's
    defaults (0.11 without async scheduling). The reading is what `estimate` says of the same keys."""
    p, got = estimate_measured(tmp_path, [
        f"{name},vllm,{release},Qwen/Qwen3-32B,h100_sxm,,,,1024,128,128,2,1,1,1,1,690,80"
        for name, release in (("a", "0.12.0"), ("b", "0.11.2"), ("c", "0.15.1"))])
    assert p.returncode == 0, p.stderr
    assert "note: 1 runs (vllm) read as AIConfigurator's generator launched them" in p.stdout
    assert got["scheduler"].fillna("").tolist() == ["token-budget", "", ""]
    assert got["max_batched_tokens"].fillna(0).tolist() == [128 + 1024 + 1500, 0, 0]
    assert got["max_num_seqs"].fillna(0).tolist() == [128, 0, 0]
    assert got["async_scheduling"].fillna("").tolist() == ["off", "off", ""]
    common = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "engine": "vllm", "input_length": 1024,
              "output_length": 128, "concurrency": 128, "tp_sizes": (2,), "arrival": "closed",
              "benchmark": "aiperf", "prefix_caching": "off", "async_scheduling": "off"}
    generated = estimate(configure(common | {"scheduler": "token-budget", "max_batched_tokens": (2652,),
                                             "max_num_seqs": 128}))
    default = estimate(configure(common))
    assert got.loc[0, "ttft_ms"] == pytest.approx(generated["ttft_ms"])
    assert got.loc[1, "ttft_ms"] == pytest.approx(default["ttft_ms"])
    # a budget of 2,652 tokens takes two 1,024-token prompts a step: a cohort that finishes together is
    # prefilled two by two beside the decodes instead of eight at once, so the loop's phase spreads (its
    # TTFT falls) and more decode steps carry a prompt chunk (its TPOT rises)
    assert generated["ttft_ms"] < default["ttft_ms"] and generated["tpot_ms"] > default["tpot_ms"]


def test_a_flag_replaces_how_a_measured_row_was_read_never_what_it_measured(tmp_path):
    """A team that knows its runs cached prompts, or ran another budget, says so with the flag: it replaces the
    row's reading (prefix cache off, the generated launch's budget) in every run and in the output; a layout
    flag does not move the layout the row measured. The same keys configured by hand price the same."""
    rows = ["a,vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,,,1024,128,64,2,1,1,1,1,300,30"]
    src, out = tmp_path / "silicon.csv", tmp_path / "out.csv"
    src.write_text("\n".join([MEASURED_HEADER, *rows]) + "\n")
    p = run("estimate", "--from-csv", str(src), "--output", str(out), "--no-progress", "--prefix-caching", "on",
            "--max-batched-tokens", "8192", "--tp-sizes", "4")
    assert p.returncode == 0, p.stderr
    got = pd.read_csv(out)
    assert (got.loc[0, "prefix_caching"], got.loc[0, "max_batched_tokens"], got.loc[0, "tp"]) == ("on", 8192, 2)
    assert got.loc[0, "max_num_seqs"] == 64  # the generated launch's other reading stays
    assert "note: --max-batched-tokens, --prefix-caching given: in every run in place of how its row was" in p.stdout
    assert "(their engine version; columns scheduler, max_num_seqs)" in p.stdout  # the budget is the flag's
    common = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "engine": "vllm", "input_length": 1024,
              "output_length": 128, "concurrency": 64, "tp_sizes": (2,), "arrival": "closed", "benchmark": "aiperf",
              "async_scheduling": "off", "scheduler": "token-budget", "max_num_seqs": 64}
    cached = estimate(configure(common | {"prefix_caching": "on", "max_batched_tokens": (8192,)}))
    assert got.loc[0, "ttft_ms"] == pytest.approx(cached["ttft_ms"])
    _, read = estimate_measured(tmp_path, rows)
    assert read.loc[0, "prefix_caching"] == "off" and got.loc[0, "ttft_ms"] < read.loc[0, "ttft_ms"]
    from orchestrator.runs import read_runs  # calibrate's runs: the flag is stated and its value is the one run

    calibrated = read_runs([str(src)], {"prefix_caching": "on"})[0]
    assert calibrated.values["prefix_caching"] == "on" and "prefix_caching" in calibrated.states


def test_vllm_runs_before_0_28_on_b200_are_read_with_the_8192_token_budget_their_release_defaulted_to(tmp_path):
    """vLLM's 16,384-token default budget on devices of >= 160 GiB came in 0.28 (`get_batch_defaults`): a
    0.19 run on B200 is read with 8,192; a 0.28 run and a nightly there, and a 0.19 run on H200 (8,192
    either way), keep the defaults. The reading is what `estimate` says of the same keys."""
    p, got = estimate_measured(tmp_path, [
        f"{name},vllm,{release},Qwen/Qwen3-32B,{gpu},,,,8192,128,64,2,1,1,1,1,900,30"
        for name, release, gpu in (("a", "0.19.0", "b200_sxm"), ("b", "0.28.0", "b200_sxm"),
                                   ("c", "nightly-5b8c30d", "b200_sxm"), ("d", "0.19.0", "h200_sxm"))])
    assert p.returncode == 0, p.stderr
    assert got["max_batched_tokens"].fillna(0).tolist() == [8192, 0, 0, 0]
    common = {"model": "Qwen/Qwen3-32B", "device": "B200", "engine": "vllm", "input_length": 8192,
              "output_length": 128, "concurrency": 64, "tp_sizes": (2,), "arrival": "closed",
              "benchmark": "aiperf", "prefix_caching": "off"}
    older = estimate(configure(common | {"max_batched_tokens": (8192,)}))
    default = estimate(configure(common))
    assert got.loc[0, "ttft_ms"] == pytest.approx(older["ttft_ms"])
    assert got.loc[1, "ttft_ms"] == pytest.approx(default["ttft_ms"])
    assert older["ttft_ms"] != pytest.approx(default["ttft_ms"], rel=0.05)  # the reading matters here


@pytest.mark.parametrize("text, release", [("0.5.6.post2", (0, 5, 6)), ("v1.2.0rc6.post1", (1, 2, 0)),
                                           ("0.5.10", (0, 5, 10)), ("nightly-5b8c30d62b754b57", None),
                                           ("", None), ("1.0", (1, 0, 0)), ("v0.11rc1", (0, 11, 0))])
def test_an_engine_version_is_read_as_its_release(text, release):
    from orchestrator.measured_runs import version

    assert version(text) == release


@pytest.mark.parametrize("cells, message", [
    ("a,vllm,0.1,Qwen/Qwen3-32B,mi300x,,,,1024,128,8,1,1,1,1,1,100,10",
     "line 2, column system: 'mi300x' is not allowed; expected one of a100_pcie, a100_sxm, a30, b200_sxm, b300_sxm, "
     "b60, gb200, gb300, h100_pcie, h100_sxm, h200_sxm, l4, l40s, rtx_pro_6000_server"),
    ("a,tgi,0.1,Qwen/Qwen3-32B,h100_sxm,,,,1024,128,8,1,1,1,1,1,100,10",
     "line 2, column backend: 'tgi' is not allowed; expected one of vllm, sglang, trtllm"),
    ("a,vllm,0.1,Qwen/Qwen3-32B,h100_sxm,fp8,w4a8,w4a8,1024,128,8,1,1,1,1,1,100,10",
     "line 2, columns gemm_quant_mode/moe_quant_mode/precision: 'w4a8/w4a8/fp8' is not allowed"),
    ("a,vllm,0.1,Qwen/Qwen3-32B,h100_sxm,,,,1024,128,8,2.5,1,1,1,1,100,10",
     "line 2, column tp_size: '2.5' is not allowed; expected an integer >= 1"),  # not read as tp 2
    ("a,vllm,0.1,Qwen/Qwen3-32B,h100_sxm,,,,0,128,8,1,1,1,1,1,100,10",
     "line 2, column isl: '0' is not allowed; expected an integer >= 1"),
    ("a,vllm,0.1,Qwen/Qwen3-32B,h100_sxm,,,,1024,128,8,1,1,1,1,1,fast,10",
     "line 2, column silicon_ttft_ms: 'fast' is not allowed; expected a measured time in ms > 0"),  # was a traceback
    ("a,vllm,0.1,Qwen/Qwen3-32B,h100_sxm,,,,1024,128,8,1,1,1,1,1,100,-10",
     "line 2, column silicon_tpot_ms: '-10' is not allowed; expected a measured time in ms > 0"),  # was an error
    ("a,vllm,0.1,Foo/Bar-7B,h100_sxm,,,,1024,128,8,1,1,1,1,1,100,10",
     "line 2, column model_path: 'Foo/Bar-7B' is not allowed; expected a shipped model ("),  # was column moe_tp
])
def test_a_measured_run_we_cannot_read_is_one_line_naming_row_and_column(tmp_path, cells, message):
    p, _ = estimate_measured(tmp_path, [cells])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


@pytest.mark.parametrize("path, ours", [
    ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B"), ("nvidia/Llama-3.1-8B-Instruct-FP8",
                                                           "meta-llama/Llama-3.1-8B-Instruct"),
    ("nvidia/DeepSeek-R1-FP4", "deepseek-ai/DeepSeek-R1"), ("nvidia/Llama-3.3-70B-Instruct-FP8",
                                                           "meta-llama/Llama-3.3-70B-Instruct"),
    ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "meta-llama/Llama-3.3-70B-Instruct"),
    ("nvidia/DeepSeek-R1-Distill-Llama-70B-FP8", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B"),
    ("someone/Unknown-7B", "someone/Unknown-7B")])
def test_a_checkpoint_name_is_read_as_the_model_it_is(path, ours):
    """Format suffixes say the weights, not another model; another publisher's copy is the original of
    that name; a name we do not know is kept, for the model check to name."""
    from orchestrator.measured_runs import our_model

    assert our_model(path) == ours


def test_runs_of_the_checkpoints_aiconfigurator_names_are_answered_as_our_models(tmp_path):
    """AIConfigurator's names for models we price (Meta-Llama-3.1-*, an FP8-Static-PerTensor or NVFP4 copy,
    the 405B, gpt-oss-20b, Qwen3-Coder-480B, Kimi-K2.6, MiniMax-M2.7) are answered, each as the model it is."""
    p, got = estimate_measured(tmp_path, [
        "a,vllm,0.12.0,meta-llama/Meta-Llama-3.1-70B,h200_sxm,fp8,fp8,,1024,256,16,4,1,1,1,1,150,12",
        "b,trtllm,1.2.0rc6.post1,openai/gpt-oss-20b,h100_sxm,fp4,nvfp4,nvfp4,1024,256,16,1,1,1,1,1,50,4",
        "c,sglang,0.5.6.post2,Qwen/Qwen3-32B-FP8-Static-PerTensor,h200_sxm,fp8,fp8,,4096,512,32,2,1,1,1,1,300,15",
        "d,trtllm,1.2.0rc6.post1,nvidia/DeepSeek-V3.1-NVFP4,b200_sxm,fp4,nvfp4,nvfp4,1024,1024,16,1,1,1,8,8,500,20",
        "e,vllm,0.12.0,meta-llama/Meta-Llama-3.1-405B,b200_sxm,fp8,fp8,,1024,256,8,8,1,1,1,1,400,30",
        "f,sglang,0.5.6.post2,Qwen/Qwen3-Coder-480B-A35B-Instruct,h200_sxm,fp8,fp8,fp8,1024,256,16,8,1,1,8,1,400,30",
        "g,vllm,0.12.0,nvidia/Kimi-K2.6-NVFP4,b200_sxm,fp4,nvfp4,nvfp4,1024,256,16,8,1,1,8,1,400,30",
        "h,vllm,0.12.0,nvidia/MiniMax-M2.7-NVFP4,b200_sxm,fp4,nvfp4,nvfp4,1024,256,16,4,1,1,4,1,400,30"])
    assert p.returncode == 0, p.stderr
    assert list(got["model"]) == [
        "meta-llama/Meta-Llama-3.1-70B", "openai/gpt-oss-20b", "Qwen/Qwen3-32B", "deepseek-ai/DeepSeek-V3.1",
        "meta-llama/Meta-Llama-3.1-405B", "Qwen/Qwen3-Coder-480B-A35B-Instruct", "moonshotai/Kimi-K2.6",
        "MiniMaxAI/MiniMax-M2.7"]
    assert got["fits_memory"].all() and (got["ttft_ms"] > 0).all() and (got["tpot_ms"] > 0).all()
    assert list(got["quantization"])[:3] == ["fp8", "bf16+mxfp4", "fp8"]  # gpt-oss's nvfp4 label: its MXFP4


def test_runs_on_the_newer_systems_of_aiconfigurator_s_matrix_are_answered(tmp_path):
    """gb200, b300_sxm and gb300 rows are read on their own devices: an NVL72 rack's 16 GPUs of wide EP on
    one NVLink domain, B300's larger pool holding more KV than B200's; the PCIe cards too, their all-reduce
    over PCIe slower than NVLink's."""
    rows = [f"{s},vllm,0.19.0,Qwen/Qwen3-32B,{s},fp8,fp8,,4096,512,64,2,1,1,1,1,150,12"
            for s in ("b200_sxm", "gb200", "b300_sxm", "gb300")]
    p, got = estimate_measured(tmp_path, [
        *rows, "w,trtllm,1.2.0rc6.post1,deepseek-ai/DeepSeek-V3,gb200,fp4,nvfp4,nvfp4,1024,1024,32,1,1,1,16,16,150,12"])
    assert p.returncode == 0, p.stderr
    assert list(got["device"]) == ["B200", "GB200", "B300_SXM", "GB300", "GB200"]
    kv = dict(zip(got["device"][:4], got["kv_capacity_tokens"][:4], strict=True))
    assert kv["B200"] < kv["GB200"] < kv["B300_SXM"] < kv["GB300"]
    assert (got["ep"].iloc[4], got["attention_dp"].iloc[4]) == (16, 16)
    p, got = estimate_measured(tmp_path, [f"{s},vllm,0.19.0,Qwen/Qwen3-8B,{s},bf16,,,1024,256,16,2,1,1,1,1,150,12"
                                          for s in ("h100_sxm", "l40s", "rtx_pro_6000_server", "b60")])
    assert p.returncode == 0, p.stderr
    assert list(got["device"]) == ["H100_SXM", "L40S", "RTX_PRO_6000_SERVER", "B60"]
    tpot = got["tpot_ms"].tolist()  # 3.35, 1.79, 0.86 TB/s; Intel's B60 0.456 TB/s at half of it
    assert tpot[0] < tpot[2] < tpot[1] < tpot[3]


def test_every_system_aiconfigurator_names_is_read_on_its_own_device(tmp_path):
    """The PCIe systems AIConfigurator 0.12 names without silicon data of its own are read too, decode as slow as
    their HBM (A100 PCIe 1.94 TB/s, H100 PCIe 2.0, A30 0.93, L4 0.30) and their all-reduce over PCIe."""
    systems = ("h100_sxm", "h100_pcie", "a100_pcie", "a30", "l4")
    p, got = estimate_measured(tmp_path, [f"{s},vllm,0.19.0,Qwen/Qwen3-8B,{s},bf16,,,1024,256,8,1,1,1,1,1,150,12"
                                          for s in systems])
    assert p.returncode == 0, p.stderr
    assert list(got["device"]) == ["H100_SXM", "H100_PCIE", "A100_PCIE_80G", "A30", "L4"]
    tpot = dict(zip(got["device"], got["tpot_ms"], strict=True))
    assert tpot["H100_SXM"] < tpot["H100_PCIE"] < tpot["A100_PCIE_80G"] < tpot["A30"] < tpot["L4"]
    assert 0.9 < (tpot["L4"] / tpot["A30"]) / (0.933 / 0.3) < 1.1  # weights streamed: the bandwidths' ratio


def test_every_quant_mode_of_the_format_is_read_side_by_side(tmp_path):
    """The linear layers' mode and the experts' apart (TensorRT-LLM's block-FP8 DeepSeek with W4A8 experts,
    gpt-oss's native MXFP4 under bf16, FP8 under NVFP4 experts); a dense model's 4-bit label quantises its
    linear layers (an NVFP4 Llama is not bf16); SmoothQuant is W8A8."""
    p, got = estimate_measured(tmp_path, [
        "a,trtllm,1.2.0rc6.post1,deepseek-ai/DeepSeek-V3,b200_sxm,fp8,fp8_block,w4afp8,1024,1024,16,8,1,1,8,1,150,12",
        "b,trtllm,1.2.0rc6.post1,openai/gpt-oss-120b,h200_sxm,fp4,bfloat16,w4a16_mxfp4,1024,256,16,1,1,1,1,1,50,4",
        "c,sglang,0.5.6.post2,Qwen/Qwen3-235B-A22B,b200_sxm,fp4,fp8,nvfp4,1024,256,16,4,1,1,4,1,150,12",
        "d,vllm,0.19.0,meta-llama/Llama-3.1-70B-Instruct,b200_sxm,fp4,nvfp4,nvfp4,1024,256,16,2,1,1,1,1,150,12",
        "e,vllm,0.19.0,meta-llama/Llama-3.1-70B-Instruct,h100_sxm,int4,,,1024,256,16,2,1,1,1,1,150,12",
        "f,trtllm,1.2.0rc6.post1,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,int8,sq,,1024,256,16,1,1,1,1,1,50,4",
        "g,vllm,0.19.0,meta-llama/Llama-3.1-70B-Instruct,b200_sxm,bf16,,,1024,256,16,2,1,1,1,1,150,12"])
    assert p.returncode == 0, p.stderr
    assert list(got["quantization"]) == ["fp8+w4afp8", "bf16+mxfp4", "fp8+nvfp4", "nvfp4", "int4_wo", "w8a8", "bf16"]
    # d's linear layers at 4.5 bits against its bf16 twin's 16; the embeddings and output layer (3 % of the
    # weights) stay at 16, so the ratio lies just above 4.5 / 16
    nvfp4, bf16 = got["weights_gib"].iloc[3], got["weights_gib"].iloc[6]
    assert 4.5 / 16 < nvfp4 / bf16 < 4.5 / 16 + 0.04


def test_cells_a_dataframe_writes_for_no_value_are_read_as_empty(tmp_path):
    """"None" and "nan" where pandas or Python wrote no value, 4.0 where a column of ints had gaps: read as the
    format leaves them; a run with no measured metric is estimated and left out of the median."""
    p, got = estimate_measured(tmp_path, [
        "a,vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,bf16,,,1024,256,16,2,1,1,1,1,150,12",
        "b,trtllm,1.2.0rc6.post1,Qwen/Qwen3-235B-A22B-FP8,h200_sxm,fp8,fp8_block,fp8_block,1024,256,16,4.0,1.0,nan,"
        "4.0,None,150,12",
        "c,vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,bf16,,,1024,256,16,2,1,1,1,1,None,nan"])
    assert p.returncode == 0, p.stderr
    assert list(got["tp"]) == [2, 4, 2] and list(got["ep"]) == [1, 4, 1]
    assert got["ttft_error"].isna().tolist() == [False, False, True]
    assert "over 2 runs" in p.stdout and "note: 1 runs have no measured TTFT or TPOT" in p.stdout


def test_measured_runs_of_several_engines_are_summed_up_per_engine(tmp_path):
    p, got = estimate_measured(tmp_path, [
        "a,trtllm,1.0.0rc3,Qwen/Qwen3-32B,h100_sxm,fp8,,,1024,128,8,2,1,1,1,1,165,11.9",
        "b,trtllm,1.0.0rc3,Qwen/Qwen3-32B,h100_sxm,fp8,,,4096,512,16,2,1,1,1,1,773,16.1",
        "c,vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,,,1024,1024,32,2,1,1,1,1,237,20.1"])
    assert p.returncode == 0, p.stderr
    trt = got[got["engine"] == "trtllm"]
    lines = p.stdout.splitlines()
    assert lines[-3] == (f"  trtllm: TTFT {trt['ttft_error'].abs().median():.1%}, TPOT "
                         f"{trt['tpot_error'].abs().median():.1%} over 2 runs (0 bound by the KV cache)")
    assert lines[-2].startswith("  vllm: TTFT ") and lines[-2].endswith("over 1 runs (0 bound by the KV cache)")
    assert lines[-1].startswith("note: 1 runs (vllm) read as AIConfigurator's generator launched them")


@pytest.mark.parametrize("model, first", [
    ("someone/Unknown-7B", "a shipped model ("),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "meta-llama/Llama-3.1-8B-Instruct (that checkpoint is "
     "meta-llama/Llama-3.1-8B-Instruct in another format or from another publisher: its weight format goes in "
     "--quantize-linear-action), or a shipped model ("),
    ("Llama-3.1-8B-Instruct",
     "meta-llama/Llama-3.1-8B-Instruct (the shipped model of that name), or a shipped model ("),
])
def test_a_model_we_do_not_know_is_one_line_listing_the_shipped_ones(model, first):
    """The allowed values are the shipped names (not the loader's sentence again), after the shipped model a
    checkpoint in another format or from another publisher, or a name without its publisher, stands for."""
    p = run("estimate", model, "--device", "H200_SXM", "--tp-sizes", "1", "--input-length", "8",
            "--output-length", "1", "--concurrency", "4")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"MODEL: '{model}' is not allowed; expected {first}" in p.stderr
    assert "meta-llama/Llama-3.1-8B-Instruct, " in p.stderr and "or a config.json" in p.stderr
    assert "unknown model" not in p.stderr


def test_async_scheduling_hides_vllm_s_time_per_step_and_is_its_default():
    """vLLM schedules ahead by default (on): every step of a burst of Qwen3-32B on two H100 (each far
    above the 0.923 ms host time) is that much shorter than with it off, so TPOT differs by exactly
    vLLM's step_ms; another engine is off by default."""
    from latency import load_engine

    common = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "engine": "vllm", "input_length": 1024,
              "output_length": 256, "concurrency": 16, "tp_sizes": (2,), "arrival": "burst"}
    on, off = configure(common), configure(common | {"async_scheduling": "off"})
    assert on.async_scheduling == "on" and configure(common | {"engine": "trtllm"}).async_scheduling == "off"
    assert estimate(off)["tpot_ms"] - estimate(on)["tpot_ms"] == pytest.approx(load_engine("vllm").step_ms)


def test_runs_without_a_release_are_read_as_their_campaign_s_and_an_empty_attention_dp_as_the_moe_group(tmp_path):
    """A run whose release is empty is read as the release its campaign's other runs (same engine, model,
    GPU, precision and run date) ran most (here 0.15.1: B200 at the 8192-token budget it had before 0.28);
    one whose campaign names none keeps the defaults. A run that leaves attention_dp_size empty while its
    MoE group (moe_tp 2 x ep 1) spans more devices than tp 1 is read as 2 attention-DP ranks, at the
    concurrency its id names, never refused."""
    p, got = estimate_measured(tmp_path, LEFT_OUT_ROWS)
    assert p.returncode == 0, p.stderr
    assert "note: 1 runs record no engine release; read as the release their campaign's other runs" in p.stdout
    assert "1 as 0.15.1" in p.stdout
    assert got["release_read_as"].fillna("").tolist() == ["", "", "0.15.1", "", ""]
    assert got["max_batched_tokens"].fillna(0).tolist() == [8192, 8192, 8192, 0, 0]  # 0.15.1 on B200: 8192
    assert list(got["attention_dp"]) == [1, 1, 1, 1, 2] and got["concurrency"].iloc[-1] == 48
    assert "read as vLLM's data-parallel attention under one MoE group" in p.stdout


def test_a_moe_group_stated_as_one_device_under_several_is_read_as_left_empty(tmp_path):
    """moe_tp_size 1 and moe_ep_size 1 under tp 2 x 4 attention-DP ranks (a collector's defaults, not a layout: the
    experts must lie on some of the 8 devices) is read as the columns left empty, the engine's default, to the same
    figures and said so; a dense model's 1 x 1 means nothing and is read as before."""
    moe = "a,vllm,0.11.0,Qwen/Qwen3-30B-A3B,h100_sxm,bf16,,,1024,128,8,2,1,{},{},4,100,10"
    p, got = estimate_measured(tmp_path, [moe.format(1, 1), moe.format("", ""),
                                          "d,vllm,0.11.0,Qwen/Qwen3-8B,h100_sxm,bf16,,,1024,128,8,2,1,1,1,,100,10"])
    assert p.returncode == 0, p.stderr
    assert "note: 1 runs of a MoE model give moe_tp_size and moe_ep_size 1 under more than one device" in p.stdout
    assert got["moe_layout_read_as"].fillna("").tolist() == ["moe_tp 8", "", ""]
    assert got[["moe_tp", "ep", "ttft_ms", "tpot_ms"]].iloc[0].tolist() == \
        got[["moe_tp", "ep", "ttft_ms", "tpot_ms"]].iloc[1].tolist()


def test_a_tp_that_counts_every_device_under_attention_dp_is_read_as_a_rank_s(tmp_path):
    """tp 8, 8 attention-DP ranks and moe_ep 8 (SGLang's --tp 8 --dp 8 --enable-dp-attention, as AIConfigurator's
    generator writes SGLang's tp: moe_tp x moe_ep) is 8 devices, not 64: read as tp 1 a rank, to the same figures as
    the row the format writes for it (tp 1, 8 ranks, moe_ep 8), and said so; never refused (it was: moe_tp x ep must
    equal tp x attention_dp). A row whose ranks do not divide its tp is refused as before."""
    row = "a,sglang,0.5.6.post2,MiniMaxAI/MiniMax-M2.5,h200_sxm,fp8,fp8,fp8,1024,128,4,{},1,1,8,{},100,10"
    p, got = estimate_measured(tmp_path, [row.format(8, 8), row.format(1, 8)])
    assert p.returncode == 0, p.stderr
    assert "note: 1 runs give a tp_size that counts every device of their instance under attention DP" in p.stdout
    assert got["tp_read_as"].fillna("").tolist() == ["tp 1 x 8 attention-DP ranks", ""]
    assert list(got["tp"]) == [1, 1] and list(got["attention_dp"]) == [8, 8] and list(got["concurrency"]) == [32, 32]
    assert got[["ttft_ms", "tpot_ms"]].iloc[0].tolist() == got[["ttft_ms", "tpot_ms"]].iloc[1].tolist()
    p, _ = estimate_measured(tmp_path, [row.format(8, 3)])
    assert p.returncode == 2 and "column moe_tp" in p.stderr, p.stderr


def test_a_run_whose_columns_restate_its_id_s_layout_as_attention_dp_ranks_is_read_as_its_id_s(tmp_path):
    """One export of the collector writes an expert-parallel run named `_c64_tp4_ep4_` as tp 4, 4 attention-DP
    ranks, moe_ep 16 and 16 requests a rank; the other as tp 4, moe_ep 4 and 64 requests, and both measure
    alike. Both are read as the id's 4 devices (the same estimate); a row whose columns say another layout
    than its id's, and one whose id names none, are read by their columns."""
    p, got = estimate_measured(tmp_path, [
        "2026_03_25_mm_h100_vllm_fp8_agg_1024x1024_c64_tp4_0_ep4_0_223,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,"
        "h100_sxm,fp8,fp8,fp8,1024,1024,64,4,1,1,4,1,191.2,25.66",
        "2026_04_06_mm_h100_vllm_fp8_agg_1024x1024_c64_tp4_ep4_1327,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,"
        "h100_sxm,fp8,fp8,fp8,1024,1024,16,4,1,1,16,4,192.0,25.69",
        "2026_04_06_mm_h100_vllm_fp8_agg_1024x1024_c64_tp4_ep4_9,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,"
        "h100_sxm,fp8,fp8,fp8,1024,1024,8,4,1,1,16,4,150,20",
        "mm_no_layout_named,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,h100_sxm,fp8,fp8,fp8,1024,1024,16,4,1,1,16,4,150,20"])
    assert p.returncode == 0, p.stderr
    assert "note: 1 runs restate their id's layout" in p.stdout
    assert got["layout_read_as"].fillna("").tolist() == ["", "tp4 ep4", "", ""]
    assert list(got["concurrency"]) == [64, 64, 32, 64] and list(got["attention_dp"]) == [1, 1, 4, 4]
    assert list(got["ep"]) == [4, 4, 16, 16]
    assert got["ttft_ms"].iloc[0] == got["ttft_ms"].iloc[1] and got["tpot_ms"].iloc[0] == got["tpot_ms"].iloc[1]


def test_a_run_listed_again_under_an_id_that_names_no_layout_is_read_as_its_copy_s_id(tmp_path):
    """The other export lists the same run as `..._c64_cfg635`: every cell but the id the named run's. It is read as
    the named id's 4 devices, as its copy is (the same estimate, `layout_id` naming the copy); a run that differs
    from it in one measured digit is not a copy and keeps its columns' 16 devices; the copy of a run whose columns
    say its id's layout as it is (the first export's) is read by those columns, as its twin, and names no copy."""
    named = ("2026_04_06_mm_h100_vllm_fp8_agg_1024x1024_c64_tp4_ep4_1327,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,"
             "h100_sxm,fp8,fp8,fp8,1024,1024,16,4,1,1,16,4,192.0,25.69")
    plain = ("2026_03_25_mm_h100_vllm_fp8_agg_1024x1024_c64_tp4_0_ep4_0_223,vllm,0.18.0,MiniMaxAI/MiniMax-M2.5,"
             "h100_sxm,fp8,fp8,fp8,1024,1024,64,4,1,1,4,1,191.2,25.66")
    cells, plain_cells = named.split(",", 1)[1], plain.split(",", 1)[1]
    p, got = estimate_measured(tmp_path, [named, f"mm_c64_cfg635,{cells}", f"mm_c64_cfg636,{cells[:-1]}8", plain,
                                          f"mm_c64_cfg637,{plain_cells}"])
    assert p.returncode == 0, p.stderr
    assert "note: 2 runs restate their id's layout" in p.stdout
    assert got["layout_id"].fillna("").tolist() == ["", named.split(",")[0], "", "", ""]
    assert got["layout_read_as"].fillna("").tolist() == ["tp4 ep4", "tp4 ep4", "", "", ""]
    assert list(got["attention_dp"]) == [1, 1, 4, 1, 1] and list(got["ep"]) == [4, 4, 16, 4, 4]
    assert got["ttft_ms"].iloc[0] == got["ttft_ms"].iloc[1] != got["ttft_ms"].iloc[2]
    assert got["ttft_ms"].iloc[3] == got["ttft_ms"].iloc[4]


def test_tensorrt_llm_admits_as_its_guaranteed_no_evict_capacity_scheduler_and_max_utilization_on_request():
    """A KV-bound load on TensorRT-LLM: its default capacity scheduler never preempts (each request's KV to
    its last token is reserved on admission); MAX_UTILIZATION, asked for, admits more and preempts as
    vLLM does; vLLM's own default is that. A sweep id is unchanged at the engine's own value."""
    from orchestrator.modes import make_mode
    from orchestrator.spec import scenario_id

    base = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "tp_sizes": (1,), "input_length": 4096,
            "output_length": 1024, "concurrency": 64, "arrival": "closed", "num_prompts": 128}
    own = configure({**base, "engine": "trtllm"})
    assert own.capacity_scheduler == "guaranteed-no-evict"
    no_evict = estimate(own)
    assert no_evict["kv_bound"] and no_evict["preemptions"] == 0
    evicting = estimate(configure({**base, "engine": "trtllm", "capacity_scheduler": "max-utilization"}))
    assert evicting["kv_bound"] and evicting["preemptions"] > 0
    assert configure({**base, "engine": "vllm"}).capacity_scheduler == "max-utilization"
    agg = make_mode("agg")
    assert scenario_id(own, agg) == scenario_id(own.with_(capacity_scheduler="guaranteed-no-evict"), agg)
    assert scenario_id(own, agg) != scenario_id(own.with_(capacity_scheduler="max-utilization"), agg)
    p = run("estimate", "Qwen/Qwen3-32B", "--device", "H100_SXM", "--tp-sizes", "1", "--input-length", "10",
            "--output-length", "4", "--capacity-scheduler", "fifo")
    assert p.returncode == 2 and "--capacity-scheduler: 'fifo' is not allowed; expected one of max-utilization, " \
        "guaranteed-no-evict" in p.stderr


def test_sglang_leaves_free_what_its_rule_says_for_each_layout_and_a_given_reserve_for_every_one():
    """SGLang's reserve grows with its GPUs (13.125 GiB an H100 at tp 1, 14.5 at tp 8) where the engine's own is
    used; a reserve given holds for every layout; vLLM's is its utilisation's rest whatever the layout."""
    base = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "num_devices": 8, "input_length": 1024,
            "output_length": 128, "concurrency": 8, "arrival": "closed", "num_prompts": 16}
    own = {tp: estimate(configure(base | {"engine": "sglang", "tp_sizes": (tp,)})) for tp in (1, 8)}
    assert (own[1]["reserved_gib"], own[8]["reserved_gib"]) == (13.125, 14.5)
    given = estimate(configure(base | {"engine": "sglang", "tp_sizes": (8,), "reserved_memory_gb": 12.0}))
    vllm = [estimate(configure(base | {"engine": "vllm", "tp_sizes": (tp,)}))["reserved_gib"] for tp in (1, 8)]
    assert given["reserved_gib"] == 12.0 and vllm[0] == vllm[1] == pytest.approx(0.1 * 79.6, rel=0.01)
    # 2.5 GiB more free at tp 8: 81,920 tokens of 64 layers x one KV head of 128 (K and V) in bf16 a GPU
    more = given["kv_capacity_tokens"] - own[8]["kv_capacity_tokens"]
    assert more == pytest.approx(2.5 * 1024**3 / (64 * 512), abs=1)


def test_sglang_queues_a_load_its_cache_cannot_hold_by_its_own_admission_and_says_so():
    """SGLang on one H100 (13.1 GiB left free by its memory fraction: ~16,100 tokens of Qwen3-32B's KV), 64 clients
    of 4,096 + 2,048 tokens: its prefill-first policy is played KV-bound (it was refused as not fitting), admitted
    by its new-token-ratio rule, which runs fewer and preempts less than vLLM's rule on the same pool (2.4 against
    2.7 decoding, 26 against 120 preemptions); estimate names the rule."""
    base = {"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "tp_sizes": (1,), "input_length": 4096,
            "output_length": 2048, "concurrency": 64, "arrival": "closed", "num_prompts": 128, "engine": "sglang"}
    own = configure(base)
    assert (own.capacity_scheduler, own.scheduler, own.reserved_memory_gb) == ("new-token-ratio", "prefill-first",
                                                                              13.125)
    sglang = estimate(own)
    vllm_rule = estimate(configure({**base, "capacity_scheduler": "max-utilization"}))
    assert sglang["kv_bound"] and sglang["fits_memory"] and sglang["decoding_requests"] < 3
    assert vllm_rule["kv_bound"] and sglang["decoding_requests"] < vllm_rule["decoding_requests"]
    assert sglang["preemptions"] < vllm_rule["preemptions"]  # a prompt is admitted with room for its output
    p = run("estimate", "Qwen/Qwen3-32B", "--device", "H100_SXM", "--tp-sizes", "1", "--engine", "sglang",
            "--input-length", "4096", "--output-length", "2048", "--concurrency", "64", "--arrival", "closed",
            "--num-prompts", "128")
    assert p.returncode == 0 and "KV cache bound the load: requests waited for blocks, admitted by new-token-ratio;" \
        in p.stdout and "DOES NOT FIT" not in p.stdout


def test_a_hundred_million_clients_answer_with_their_queue_in_ttft_and_columns_apart():
    """A closed loop of 10^8 clients on one H200 (vLLM seats 1024, its KV pool fewer): planned as a loop of
    2048 that keeps the engine as busy, the others' wait in TTFT (Little's law: clients = throughput x E2E,
    with the client's own time), the per-op breakdown's decode step the engine's own (no more than its
    seats), and every table's columns apart at 10^9 ms."""
    clients = 10**8
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--num-devices", "1", "--engine", "vllm",
            "--arrival", "closed", "--concurrency", str(clients), "--input-length", "1000", "--output-length", "200")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"note: {clients} clients a rank, more than the engine runs at once: planned as a loop of 2048" in out
    rows = {line.split()[0]: [float(x) for x in line.split()[2:]] for line in out.splitlines()
            if line.lstrip().startswith(("TTFT ms", "TPOT ms", "E2E ms"))}
    assert all(len(values) == 4 for values in rows.values())  # mean, p50, p90, p99: apart
    throughput = float(out.split("throughput: ")[1].split(" req/s")[0])
    assert rows["E2E"][0] > 1e9 and throughput * rows["E2E"][0] / 1000 == pytest.approx(clients, rel=1e-3)
    assert rows["TTFT"][0] > 0.99 * rows["E2E"][0]  # nearly all of it is the queue
    breakdown = out.split("per-op breakdown of a typical step:")[1]
    assert "decode" in breakdown


def test_the_breakdown_s_decode_step_is_what_the_engine_runs_at_once():
    """The typical decode step holds the engine's seats at most, and what the KV pool let decode where it
    bound; a small loop's holds its concurrency."""
    from orchestrator.estimate import typical_steps

    base = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "tp_sizes": (1,), "engine": "vllm",
            "arrival": "closed", "input_length": 1000, "output_length": 200}
    for clients, most in ((10**6, 1024), (16, 16)):
        s = configure({**base, "concurrency": clients})
        row = estimate(s)
        decode = [k for k in typical_steps(s, row) if k.is_decode][0]
        assert decode.concurrency <= most
        if row["kv_bound"]:
            assert decode.concurrency == pytest.approx(row["decoding_requests"], abs=1)
        else:
            assert decode.concurrency == clients


def test_a_profile_s_streaming_front_end_holds_a_fast_loop_back(tmp_path):
    """An engine profile may charge its API server per response chunk ([frontend] stream_us): a small
    model at high concurrency on eight GPUs, whose steps stream tens of thousands of chunks a second,
    then runs fewer requests at once and its TTFT grows, while a profile without it is unchanged; a
    negative time is refused naming the file and key."""
    base = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 8, "input_length": 1024,
            "output_length": 256, "tp_sizes": (8,), "concurrency": 256, "arrival": "closed", "num_prompts": 1024}
    plain = tmp_path / "plain.toml"
    plain.write_text('name = "plain"\nstep_ms = 0.5\n[frontend]\nclient_ms = 5.0\n')
    streaming = tmp_path / "streaming.toml"
    streaming.write_text('name = "streaming"\nstep_ms = 0.5\n[frontend]\nclient_ms = 5.0\nstream_us = 100.0\n')
    free, held = (estimate(configure({**base, "engine": str(path)})) for path in (plain, streaming))
    # 100 us a chunk sends 10,000 a second; the free loop's ~11 ms steps of ~226 decodes stream ~20,000:
    # about half of them can run
    assert held["decoding_requests"] < 0.8 * free["decoding_requests"]
    assert held["ttft_ms"] > 2 * free["ttft_ms"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[frontend]\nstream_us = -1\n')
    p = run("estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--tp-sizes", "1", "--input-length", "64",
            "--output-length", "8", "--concurrency", "4", "--arrival", "closed", "--engine", str(bad))
    assert p.returncode == 2 and "bad.toml: [frontend] stream_us" in p.stderr, p.stderr


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
@pytest.mark.parametrize("clients", [8, 64, 512])
def test_a_load_is_admitted_into_the_pool_exactly_when_its_plan_outgrows_it(engine, clients):
    """Where a plan without a pool may stop (its KV peak past the pool's `fits`) is where the pool binds:
    its held KV (every request to its last token under TensorRT-LLM's NO_EVICT) and a block a request in
    flight past the cache, at peaks below, at and above the line; and a KV-bound timed loop (planned
    without playing its unbounded plan to the end) gives the row of the pool it binds."""
    from orchestrator.estimate import busiest_point
    from orchestrator.evaluate import _kv_pool, plan_point, with_prompt_cache, workload
    from simulator import StepPricer, plan
    from simulator.blocks import BLOCK_SIZE, held_kv_tokens

    s = configure({"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "tp_sizes": (2,), "engine": engine,
                   "input_length": 4096, "output_length": 1024, "concurrency": clients, "arrival": "closed",
                   "num_prompts": 2 * clients})
    job, n, _ = busiest_point(s)
    lm = s.latency_model(job.layout)
    w = with_prompt_cache(workload(s, job.max_batched_tokens, n), lm)
    pool = _kv_pool(w, s.make_scheduler(), job, lm)
    capacity = lm.memory_for(w.max_batched_tokens).kv_capacity_tokens
    assert pool.blocks == int(capacity // BLOCK_SIZE)
    for peak in (0.0, max(pool.fits, 0.0), max(pool.fits + 1, 0.0), capacity / 2, capacity, 2 * capacity):
        binds = held_kv_tokens(w, peak, n) + BLOCK_SIZE * n > capacity
        assert (peak > pool.fits) == binds, peak
    assert w.timed
    _, planned = plan_point(s, job, n)
    whole = plan(w, s.make_scheduler(), step_ms=StepPricer(lm, s.make_scheduler()))
    assert bool(planned.kv_blocks) == (whole.peak_kv_tokens > pool.fits)
    if planned.kv_blocks:
        from dataclasses import replace

        bound = plan(replace(w, kv_blocks=pool.blocks), s.make_scheduler(),
                     step_ms=StepPricer(lm, s.make_scheduler()))
        assert list(planned.step_shape) == list(bound.step_shape) and planned.preemptions == bound.preemptions


def test_every_quantisation_the_silicon_format_names_is_read():
    """A silicon row's gemm_quant_mode and moe_quant_mode are names of AIConfigurator's GEMMQuantMode and
    MoEQuantMode: every one is read, none refused (NVFP4 weights beside 16-bit activations, w4a16_nvfp4, are
    NVFP4 experts, as its GEMM mode of that name is)."""
    common = pytest.importorskip("aiconfigurator_core.sdk.common")
    from orchestrator.measured_runs import labelled_quantization

    for mode in common.GEMMQuantMode:
        labelled_quantization({"gemm_quant_mode": mode.name})
    for mode in common.MoEQuantMode:
        labelled_quantization({"gemm_quant_mode": "fp8_block", "moe_quant_mode": mode.name})
        labelled_quantization({"moe_quant_mode": mode.name})
    assert labelled_quantization({"moe_quant_mode": "w4a16_nvfp4"}) == "bf16+nvfp4"
    assert labelled_quantization({"gemm_quant_mode": "fp8", "moe_quant_mode": "w4a16_nvfp4"}) == "fp8+nvfp4"


def test_profiles_that_move_only_the_front_end_share_their_step_prices_and_rows_are_as_priced_afresh(tmp_path):
    """A timed plan's step pricer is found by the latency model's fingerprint, so calibrate's candidate profiles
    that move only the front end price each step once between them; each row is what a fresh pricer gives."""
    from simulator import PRICERS

    specs = {}
    for name, request_ms in (("a", 2.0), ("b", 9.0)):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'name = "{name}"\nbase = "vllm"\nstep_ms = 0.4\n[frontend]\nrequest_ms = {request_ms}\n')
        specs[name] = {"model": "Qwen/Qwen3-8B", "device": "H100_SXM", "engine": str(path), "input_length": 2048,
                       "output_length": 256, "concurrency": 48, "arrival": "closed", "num_prompts": 96}
    PRICERS.clear()
    shared = {name: estimate(configure(spec)) for name, spec in specs.items()}
    assert len(PRICERS.pricers) == 1  # one pricer served both profiles
    for name, spec in specs.items():
        PRICERS.clear()
        assert estimate(configure(spec)) == shared[name]
    assert shared["b"]["ttft_ms"] > shared["a"]["ttft_ms"]  # 7 ms more a request, serial: the front end matters


def test_each_request_in_flight_holds_its_recurrent_state_beside_its_kv():
    """Qwen3.5-27B on one H100: each request's delta-net state (147 MiB, 2,349 KV tokens' worth) comes out of
    the pool its context shares, so 96 clients of 1,100 tokens (106k of context, 326k with their states) are
    bound by the cache where 32 are not: 95 of them, each its state and 1,050 tokens on average, fit the pool at
    once, and the row's capacity is what their states leave."""
    from latency import build_latency_model

    common = {"model": "Qwen/Qwen3.5-27B", "device": "H100_SXM", "engine": "vllm", "input_length": 1000,
              "output_length": 100, "arrival": "closed"}
    few, many = (estimate(configure(common | {"concurrency": c})) for c in (32, 96))
    mem = build_latency_model("Qwen/Qwen3.5-27B", device="H100_SXM", tp=1).memory
    state = mem.state_tokens
    # 48 layers x (48 x 128 x 128 float32 + 10,240 x 3 bf16 convolution inputs) = 153,944,064 bytes, over the
    # 65,536 of a token of KV: 2,349 tokens
    assert state == 2349 and few["kv_capacity_tokens"] - many["kv_capacity_tokens"] == 63 * state
    held = [r["available_gib"] + r["kv_gib"] for r in (few, many)]  # the HBM the states leave
    assert held[0] - held[1] == pytest.approx(63 * mem.state_bytes_per_request / 1024**3)
    pool = many["kv_capacity_tokens"] + 95 * state  # the KV pool before any state
    assert pool // (state + 1050) == 95  # the requests it holds at once
    assert 96 * 1100 < pool and many["kv_bound"] and not few["kv_bound"]
    assert many["peak_kv_tokens"] <= many["kv_capacity_tokens"] and many["fits_memory"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_timed_plan_is_replayed_at_the_prices_it_was_planned_with(engine):
    """A timed plan's steps are priced while it is planned (its clock runs on them); its row replays those
    prices, which are the floats pricing its keys again in one call gives, and so are they after the step
    pricer was let go (priced anew). A KV-bound closed loop behind SGLang's or vLLM's front end."""
    from orchestrator.estimate import busiest_point
    from orchestrator.evaluate import direct_pricer, plan_point, planned_prices
    from simulator import PRICERS

    s = configure({"model": "Qwen/Qwen3-32B", "device": "H100_SXM", "tp_sizes": (2,), "engine": engine,
                   "input_length": 4096, "output_length": 256, "concurrency": 96, "arrival": "closed",
                   "num_prompts": 192})
    job, n, _ = busiest_point(s)
    lm, planned = plan_point(s, job, n)
    again = direct_pricer(lm, planned.price_keys, planned.scheduler.fused)
    assert planned.workload.timed and planned.kv_blocks and len(set(again.tolist())) > 1  # steps of many prices
    assert planned_prices(lm, planned).tolist() == again.tolist()
    PRICERS.clear()
    assert planned_prices(lm, planned).tolist() == again.tolist()
