"""A silicon campaign's prompt cache by evidence: a run whose measured throughput needs more of its GPUs' dense peak
than computing every prompt allows says so for its campaign's runs, which are still read with the cache off."""

import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.runs import read_runs
from orchestrator.served_prompts import PEAK_SHARE, peak_share, with_cache_evidence
from tests.orchestrator.test_estimate import MEASURED_HEADER

#: vLLM 0.12's Llama-3.1-8B FP8 on one H200 at 2,000 x 100 tokens and 64 clients (the reference set's), and a
#: run of the same campaign at 8,000 x 100 and 16 clients that needs no more than a third of the peak
BEYOND = ("nvidia_l8_2000x100_c64,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,h200_sxm,fp8,,,2000,100,64,1,1,1,1,,"
          "121.73,9.74")
WITHIN = ("nvidia_l8_8000x100_c16,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,h200_sxm,fp8,,,8000,100,16,1,1,1,1,,"
          "447.24,15.53")
#: another campaign (another GPU): its runs keep the reading of the format
OTHER = ("meta_l8_h100_2000x100_c64,vllm,0.12.0,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,,,,2000,100,64,1,1,1,1,,"
         "400,40")


def cells(row: str) -> dict:
    return dict(zip(MEASURED_HEADER.split(","), row.split(","), strict=True))


def test_the_share_of_the_peak_a_run_needs_is_its_linear_layers_flops_over_its_time():
    """Llama-3.1-8B: 32 layers of 4,096 x 128 x (2 x 32 + 2 x 8) attention and 3 x 4,096 x 14,336 MLP weights, and
    a 128,256 x 4,096 head: 7,504,658,432 parameters. 64 requests of 2,100 tokens every 121.73 + 99 x 9.74 ms need
    2 x 7.50e9 x 2,100 x 64 / 1.08599 s = 1.857e15 FLOP/s, 0.939 of one H200's FP8 peak (1,978.9 TFLOP/s)."""
    params = 32 * (4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336) + 128256 * 4096
    assert params == 7_504_658_432
    need = 2 * params * 2100 * 64 / ((121.73 + 99 * 9.74) / 1e3)
    assert peak_share(cells(BEYOND)) == pytest.approx(need / 1978.9e12, rel=1e-9)
    within = 2 * params * 8100 * 16 / ((447.24 + 99 * 15.53) / 1e3)  # 16 of 8,100 tokens every 1.985 s: 0.495
    assert peak_share(cells(WITHIN)) == pytest.approx(within / 1978.9e12, rel=1e-9)
    assert peak_share(cells(BEYOND)) > PEAK_SHARE > peak_share(cells(WITHIN))
    moe = cells(OTHER) | {"model_path": "Qwen/Qwen3-30B-A3B"}
    assert peak_share(moe) == 0.0  # a MoE token touches a share of the parameters: no bound here
    assert peak_share(cells(OTHER) | {"silicon_ttft_ms": ""}) == 0.0  # unmeasured: no evidence
    for bad in ({"tp_size": "0"}, {"osl": "0", "silicon_ttft_ms": "10"}, {"system": "tpu"}, {"batch_size": "x"}):
        assert peak_share(cells(OTHER) | bad) == 0.0  # a bad cell is no evidence (to_spec names it)


def test_a_campaign_with_a_run_beyond_the_peak_says_so_in_each_of_its_runs():
    read = with_cache_evidence([cells(r) for r in (WITHIN, BEYOND, OTHER)])
    assert [bool(c.get("prefix_cache_evidence")) for c in read] == [True, True, False]
    assert read[0]["prefix_cache_evidence"] == "nvidia_l8_2000x100_c64 needs 94% of its GPUs' dense peak"


def test_estimate_from_csv_says_so_reads_them_off_and_a_flag_reads_them_on(tmp_path):
    (tmp_path / "runs.csv").write_text("\n".join([MEASURED_HEADER, WITHIN, BEYOND, OTHER]) + "\n")
    outs = []
    for extra in ([], ["--prefix-caching", "on"]):
        out = tmp_path / f"out{len(outs)}.csv"
        p = subprocess.run([sys.executable, "-m", "orchestrator", "estimate", "--from-csv", str(tmp_path / "runs.csv"),
                            "--output", str(out), "--no-progress", *extra], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        outs.append((pd.read_csv(out), p.stdout))
    (read, said), (given, _) = outs
    assert read["prefix_caching"].tolist() == ["off"] * 3 and given["prefix_caching"].tolist() == ["on"] * 3
    assert "note: 2 runs' campaigns hold a run that needs more of its GPUs' dense peak" in said
    assert read["prefix_cache_evidence"].notna().tolist() == [True, True, False]
    # aiperf's 100 reused prompts served from the cache: the runs compute a block of each prompt
    assert (given["tpot_ms"] < 0.9 * read["tpot_ms"]).all()
    runs = read_runs([tmp_path / "runs.csv"], {})
    assert "a cache likely served its campaign's prompts (nvidia_l8_2000x100_c64 needs 94%" in runs[0].note
    assert runs[0].values["prefix_caching"] == "off" and "prefix_caching" not in runs[0].states  # calibrate tries on
