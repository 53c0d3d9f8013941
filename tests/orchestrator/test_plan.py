"""`servesweep plan`: minimal by brute force, its cost arithmetic, and vLLM's own flag names."""

import json
import math
import shlex
import subprocess
import sys

import pytest

from orchestrator.launch import serve_command, sglang_serve, trtllm_free_fraction, trtllm_serve, vllm_serve
from orchestrator.optimize import optimize
from orchestrator.plan import PlanOption, plan_deployment, vllm_bench
from orchestrator.scenario import Layout, Scenario

BASE = dict(model="Qwen/Qwen3-8B", device="H100_SXM", num_devices=1, input_length=2048, output_length=128,
            ttft_limits=(800.0,), tpot_limits=(25.0,), arrival="poisson", num_prompts=120, scheduler="token-budget",
            engine="vllm")
#: every flag the emitted commands may use, as vLLM spells it (vllm serve --help, vllm bench serve --help)
VLLM_SERVE_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                    "--enable-expert-parallel", "--max-model-len", "--max-num-batched-tokens", "--max-num-seqs",
                    "--enable-chunked-prefill", "--gpu-memory-utilization", "--quantization", "--kv-cache-dtype",
                    "--kv-transfer-config"}
VLLM_BENCH_FLAGS = {"--backend", "--model", "--dataset-name", "--random-input-len", "--random-output-len",
                    "--random-range-ratio", "--request-rate", "--num-prompts", "--percentile-metrics",
                    "--metric-percentiles"}


def run(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=300)


def test_the_plan_is_minimal_by_brute_force():
    """Every deployment of fewer devices, searched independently by `optimize` (any layout, any number of
    instances side by side), serves less than the target; the plan's own count serves it."""
    s = Scenario(**BASE)
    rate = 14.0
    options = plan_deployment(s, ["H100_SXM"], rate, max_devices=3)
    best = options[0]
    assert best.instances * best.capacity >= rate and best.devices >= 2
    for n in range(1, best.devices):
        served = max((b["request_throughput"] for b in optimize(s.with_(num_devices=n)).best), default=0.0)
        assert served < rate, n
    at = max(b["request_throughput"] for b in optimize(s.with_(num_devices=best.devices)).best)
    assert at >= rate * 0.95  # measured throughput of the capacity point: the offered rate, within noise
    assert [o.devices for o in options] == sorted(o.devices for o in options)


def test_cost_arithmetic_by_hand():
    row = {"request_throughput": 4.0, "output_throughput": 4.0 * 128}
    o = PlanOption("H100_SXM", Layout(2), 8192, 4.0, 3, 10.0, row, 2.5)
    assert o.devices == 6 and o.headroom == pytest.approx(3 * 4 / 10 - 1)
    assert o.cost["usd_per_hour"] == 15.0
    tokens_per_s = 10.0 * 128  # the target rate's output, not the instances' capacity
    assert o.cost["usd_per_mtok"] == pytest.approx(15.0 / (tokens_per_s * 3600) * 1e6)
    free = PlanOption("H100_SXM", Layout(2), 8192, 4.0, 3, 10.0, row, 0.0)
    assert math.isnan(free.cost["usd_per_hour"]) and math.isnan(free.cost["usd_per_mtok"])


def test_emitted_commands_use_only_vllm_flags_and_fit_our_memory():
    s = Scenario(**{**BASE, "model": "Qwen/Qwen3-30B-A3B", "num_devices": 4, "quantization": "FP8",
                    "kv_cache_dtype": "fp8", "input_length": Scenario(**BASE).input_length})
    o = PlanOption("H100_SXM", Layout(1, 1, 4, 4), 4096, 3.0, 2, 5.0, {"request_throughput": 1,
                                                                         "output_throughput": 1}, 0.0)
    serve, notes = vllm_serve(s, o)
    words = shlex.split(serve)
    assert words[:3] == ["vllm", "serve", "Qwen/Qwen3-30B-A3B"] and not notes
    flags = {w for w in words if w.startswith("--")}
    assert flags <= VLLM_SERVE_FLAGS
    assert _value(words, "--data-parallel-size") == "4" and "--enable-expert-parallel" in words
    assert _value(words, "--quantization") == "fp8" and _value(words, "--kv-cache-dtype") == "fp8"
    mem = s.latency_model(o.layout).memory_for(4096)
    assert float(_value(words, "--gpu-memory-utilization")) <= (mem.hbm_gib - mem.reserved_gib) / mem.hbm_gib
    assert mem.kv_capacity_tokens > 0  # never a configuration our memory picture says does not fit
    # with vLLM's own reserve (the --engine vllm default) the command asks for vLLM's own 0.90
    own = s.with_(engine="vllm", reserved_memory_gb=None)
    assert _value(shlex.split(vllm_serve(own, o)[0]), "--gpu-memory-utilization") == "0.90"
    mixed = s.with_(input_length=_lengths("uniform:1000:3000"))
    bench = shlex.split(vllm_bench(mixed, o)[0])
    assert {w for w in bench if w.startswith("--")} <= VLLM_BENCH_FLAGS
    assert _value(bench, "--random-input-len") == "2000" and _value(bench, "--random-range-ratio") == "0.5"
    assert _value(bench, "--request-rate") == "2.5"  # one instance's share of 5 req/s over 2
    _, notes = vllm_bench(s.with_(input_length=_lengths("lognormal:2000:0.5:100:8000")), o)
    assert len(notes) == 1 and "typical length" in notes[0]
    _, int8 = vllm_serve(s.with_(quantization="W8A8_DYNAMIC", kv_cache_dtype="int8"), o)
    assert len(int8) == 2  # what no vLLM flag says is a note, never an invented flag
    from orchestrator.plan import option_dict

    one = Scenario(**BASE)  # the scenario plan starts from: one device; an instance of 4 is priced as such
    got = option_dict(one.with_(model="Qwen/Qwen3-30B-A3B"), o, commands=True)
    assert _value(shlex.split(got["vllm_serve"]), "--tensor-parallel-size") == "1" and got["predicted_tpot_ms"] > 0


#: every flag trtllm-serve and SGLang's launch_server may get, as they spell them (trtllm-serve --help,
#: python -m sglang.launch_server --help)
TRTLLM_SERVE_FLAGS = {"--backend", "--tp_size", "--pp_size", "--ep_size", "--max_batch_size", "--max_num_tokens",
                      "--max_seq_len", "--kv_cache_free_gpu_memory_fraction"}
SGLANG_SERVE_FLAGS = {"--model-path", "--port", "--tp-size", "--dp-size", "--enable-dp-attention", "--ep-size",
                      "--pp-size", "--context-length", "--chunked-prefill-size", "--max-running-requests",
                      "--mem-fraction-static", "--enable-mixed-chunk", "--quantization", "--kv-cache-dtype",
                      "--disable-radix-cache", "--disaggregation-mode"}


def test_a_plan_on_tensorrt_llm_or_sglang_launches_that_engine_with_the_memory_it_was_priced_with(tmp_path):
    """--engine trtllm plans `trtllm-serve`, --engine sglang SGLang's launch_server (a calibrated profile its
    base's; none vLLM's), each in its own flag names; the instance counts every GPU in tp (attention-DP ranks
    too); TensorRT-LLM's free_gpu_memory_fraction is its profile's 0.8 where it keeps its own reserve (the pool
    priced) and less where a reserve is given; SGLang's --mem-fraction-static what its reserve leaves."""
    o = PlanOption("H200_SXM", Layout(2, 1, 8, 4), 4096, 3.0, 1, 3.0, {"request_throughput": 1,
                                                                       "output_throughput": 1}, 0.0)
    moe = dict(BASE, model="Qwen/Qwen3-30B-A3B", device="H200_SXM", num_devices=8, kv_cache_dtype="fp8")
    trt = Scenario(**{**moe, "engine": "trtllm", "scheduler": None})
    words = shlex.split(trtllm_serve(trt, o)[0])
    assert words[:2] == ["trtllm-serve", "Qwen/Qwen3-30B-A3B"] and {w for w in words if w[:2] == "--"} <= \
        TRTLLM_SERVE_FLAGS
    assert (_value(words, "--tp_size"), _value(words, "--ep_size"), _value(words, "--max_num_tokens")) == (
        "8", "8", "4096")
    assert _value(words, "--kv_cache_free_gpu_memory_fraction") == "0.80"
    notes = trtllm_serve(trt, o)[1]
    assert "enable_chunked_prefill: true; enable_attention_dp: true; kv_cache_config: {dtype: fp8}" in notes[0]
    given = trt.with_(reserved_memory_gb=20.0)  # 20 GiB held before its fraction: less of what TRT sees free
    mem = given.latency_model(o.layout).memory_for(4096)
    fraction = trtllm_free_fraction(given, o)
    assert fraction < 0.8
    seen_free = mem.hbm_gib - (551e6 / 2**20 + 392) / 1024 - mem.weights_gib - mem.activation_gib
    assert fraction * seen_free <= mem.kv_capacity_gib + mem.kv_bytes_per_token / 1024**3 < (fraction + 0.01) * \
        seen_free
    sgl = Scenario(**{**moe, "engine": "sglang", "scheduler": "token-budget", "prefix_caching": "off"})
    words = shlex.split(sglang_serve(sgl, o)[0])
    assert words[:3] == ["python", "-m", "sglang.launch_server"] and {w for w in words if w[:2] == "--"} <= \
        SGLANG_SERVE_FLAGS
    assert (_value(words, "--tp-size"), _value(words, "--dp-size"), _value(words, "--chunked-prefill-size")) == (
        "8", "4", "4096")
    assert {"--enable-dp-attention", "--enable-mixed-chunk", "--disable-radix-cache"} <= set(words)
    assert _value(words, "--port") == "8000"  # where `vllm bench serve` asks (SGLang's own is 30000)
    mem = sgl.latency_model(o.layout).memory_for(4096)
    assert float(_value(words, "--mem-fraction-static")) == math.floor(
        (mem.hbm_gib - mem.reserved_gib) / mem.hbm_gib * 100) / 100
    assert _value(words, "--kv-cache-dtype") == "fp8_e4m3"
    engines = {e: serve_command(Scenario(**{**moe, "engine": e}), o)[0] for e in ("none", "vllm", "trtllm", "sglang")}
    assert engines == {"none": "vllm", "vllm": "vllm", "trtllm": "trtllm", "sglang": "sglang"}
    from orchestrator.launch import serving_engine

    (tmp_path / "mine.toml").write_text('name = "mine"\nbase = "trtllm"\nstep_ms = 0.5\n')
    (tmp_path / "own.toml").write_text('name = "own"\nstep_ms = 0.5\n')
    assert serving_engine(str(tmp_path / "mine.toml")) == "trtllm" and serving_engine(str(tmp_path / "own.toml")) \
        == "vllm"


def test_a_calibrated_kv_share_launches_with_the_engine_s_own_memory_flag(tmp_path):
    """A profile calibrated to runs that held half their engine's pool prices the plan with half of it, and launches
    the engine with the memory flag it was measured with (the base's), saying why: vLLM's
    --gpu-memory-utilization, SGLang's --mem-fraction-static, TensorRT-LLM's free fraction as their bases give; a
    profile whose runs ran one request fewer than their clients says so."""
    from orchestrator.calibrate import base_profile
    from orchestrator.profile_files import to_toml

    o = PlanOption("H100_SXM", Layout(1), 8192, 3.0, 1, 3.0, {"request_throughput": 1, "output_throughput": 1}, 0.0)
    for engine, flag in (("vllm", "--gpu-memory-utilization"), ("sglang", "--mem-fraction-static"),
                         ("trtllm", "--kv_cache_free_gpu_memory_fraction")):
        data = base_profile(engine)
        data.setdefault("memory", {})["kv_share"] = 0.5
        data.setdefault("launch", {})["below_clients"] = 1
        (tmp_path / f"{engine}-half.toml").write_text(to_toml(data))
        shipped = Scenario(**{**BASE, "engine": engine, "scheduler": None})
        half = shipped.with_(engine=str(tmp_path / f"{engine}-half.toml"))
        pools = [s.latency_model(o.layout).memory_for(8192).kv_capacity_tokens for s in (shipped, half)]
        assert pools[1] == pytest.approx(pools[0] / 2, abs=1)
        (_, own, _), (_, calibrated, notes) = serve_command(shipped, o), serve_command(half, o)
        assert _value(shlex.split(calibrated), flag) == _value(shlex.split(own), flag), engine
        assert any("held 0.5 of the KV pool" in n for n in notes)
        assert any("ran 1 request(s) fewer than their clients" in n for n in notes)


def test_plan_prints_the_engine_s_own_launch():
    p = run("plan", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--request-rate", "4", "--input-length", "1024",
            "--output-length", "64", "--ttft-limits", "1500", "--tpot-limits", "40", "--max-devices", "1",
            "--engine", "trtllm", "--format", "json")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)["plan"]
    assert plan["serving_engine"] == "trtllm" and plan["serve"].startswith("trtllm-serve Qwen/Qwen3-8B ")
    assert "vllm_serve" not in plan and "--kv_cache_free_gpu_memory_fraction 0.80" in plan["serve"]


def test_plan_end_to_end_with_a_mix_as_json():
    p = run("plan", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--request-rate", "6", "--input-length",
            "uniform:512:1536", "--output-length", "64", "--ttft-limits", "1500", "--tpot-limits", "40",
            "--max-devices", "2", "--num-prompts", "100", "--device-price", "H100_SXM=2", "--format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    plan = out["plan"]
    assert plan["devices"] <= 2 and plan["usd_per_hour"] == 2.0 * plan["devices"]
    assert plan["instances"] * plan["capacity_per_instance"] >= 6
    assert "--random-range-ratio" in plan["vllm_bench_serve"] and plan["predicted_ttft_ms"] <= 1500
    bad = run("plan", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--request-rate", "6", "--input-length", "512",
              "--output-length", "64", "--device-price", "B200=3")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--device-price: 'B200=3'" in bad.stderr
    none = run("plan", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--request-rate", "500", "--input-length", "512",
               "--output-length", "64", "--tpot-limits", "10", "--max-devices", "1", "--num-prompts", "60")
    assert none.returncode == 0 and none.stdout.startswith("no deployment of at most 1 x H100_SXM")


def _lengths(text):
    from simulator.mix import Lengths

    return Lengths.parse(text)


def _value(words, flag):
    return words[words.index(flag) + 1]


def test_a_prefill_decode_split_is_the_best_of_each_side():
    """With `pd`, a split competes: its prefill side is the fewest devices of prefill instances that
    take the rate under the TTFT limit, its decode side the same under the TPOT limit, each found by
    brute force over the instance sizes; its devices are their sum, its headroom the smaller one's."""
    from orchestrator.plan import SplitOption, instance_options

    s = Scenario(**BASE)
    rate, most = 10.0, 3
    options = plan_deployment(s, ["H100_SXM"], rate, max_devices=most, pd=True)
    split = next(o for o in options if isinstance(o, SplitOption))
    for side, role in ((split.prefill, "prefill"), (split.decode, "decode")):
        every = [o for k in range(1, most + 1) for o in instance_options(s, "H100_SXM", k, rate, role)]
        assert side.role == role and side.devices == min(o.devices for o in every)
        assert side.instances * side.capacity >= rate > (side.instances - 1) * side.capacity
    assert split.devices == split.prefill.devices + split.decode.devices <= most
    assert split.headroom == min(split.prefill.headroom, split.decode.headroom)
    assert split.prefill.row["role"] == "prefill" and split.decode.row["tpot_slo_ms"] <= 25.0
    assert split.prefill.row["ttft_slo_ms"] <= 800.0
    assert not any(isinstance(o, SplitOption) for o in plan_deployment(s, ["H100_SXM"], rate, most))
    assert [o.sort_key() for o in options] == sorted(o.sort_key() for o in options)


def test_plan_with_a_split_end_to_end_as_json():
    p = run("plan", "Qwen/Qwen3-8B", "--device", "H100_SXM", "--request-rate", "6", "--input-length", "4096",
            "--output-length", "256", "--ttft-limits", "1000", "--tpot-limits", "20", "--max-devices", "3", "--disagg",
            "--format", "json", "--top-n", "0")
    assert p.returncode == 0, p.stderr
    plan, others = json.loads(p.stdout)["plan"], json.loads(p.stdout)["runners_up"]
    assert [o["role"] for o in others] == ["agg"]  # the best aggregated plan beside it, whatever --top-n
    assert plan["role"] == "split" and plan["devices"] == plan["prefill"]["devices"] + plan["decode"]["devices"]
    for side in ("prefill", "decode"):
        serve = shlex.split(plan[side]["vllm_serve"])
        assert serve[serve.index("--kv-transfer-config") + 1] == '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    assert "--request-rate 6 " in plan["vllm_bench_serve"] and "router" in plan["notes"][0]
    assert plan["predicted_ttft_ms"] <= 1000 and plan["predicted_tpot_ms"] <= 20


def test_with_no_ttft_limit_a_plan_counts_only_rates_the_instance_keeps_up_with():
    """A TPOT limit alone does not bound the queue: an instance offered more than it serves still decodes
    within the limit while its waiting line grows. The capacity is the highest rate it keeps up with
    (serves at least KEEPS_UP of it), not the top of the rate grid; it is below what the instance
    serves when overloaded, and the point at twice it is refused for the offered rate."""
    from orchestrator.estimate import configure, estimate
    from orchestrator.evaluate import KEEPS_UP, first_failure
    from orchestrator.plan import instance_options
    from orchestrator.scenario import Scenario

    s = Scenario(model="Qwen/Qwen3-8B", device="H100_SXM", num_devices=1, input_length=1000, output_length=100,
                 tpot_limits=(50.0,), num_prompts=100, scheduler="token-budget", engine="vllm")
    (option,) = instance_options(s, "H100_SXM", 1, 2.0)
    flooded = estimate(configure({"model": "Qwen/Qwen3-8B", "device": "H100_SXM", "input_length": 1000,
                                  "output_length": 100, "arrival": "poisson", "request_rate": 1000.0,
                                  "num_prompts": 100, "engine": "vllm"}))
    assert option.capacity <= flooded["request_throughput"] / KEEPS_UP
    assert option.row["request_throughput"] >= KEEPS_UP * option.capacity
    assert first_failure(flooded, None, 50.0) == "the offered rate (the instance falls behind it)"


def test_the_plan_s_bar_counts_each_instance_size_and_every_point(capsys):
    """`plan` searches every instance size of every device type (and side, with --disagg); its bar, shown once the
    search has run a second (here at once), counts those sizes and every point evaluated, and ends with them all:
    as many points as the searches of every layout and budget of each size evaluate, searched again one by one."""
    from orchestrator.jobs import Job
    from orchestrator.optimize import search_job
    from orchestrator.progress import SearchProgress

    s = Scenario(**BASE)
    bar = SearchProgress(show_after_s=0.0, desc="plan", unit="size")
    options = plan_deployment(s, ["H100_SXM"], 14.0, max_devices=2, pd=True, progress=bar)
    bar.close()
    assert (bar.jobs, bar.done) == (6, 6) and options  # agg, prefill and decode instances of 1 and 2 devices
    assert "6/6 [" in capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    points = 0
    for role in ("agg", "prefill", "decode"):
        for k in (1, 2):
            one = s.with_(num_devices=k)
            for layout in [lay for lay in one.layouts() if lay.devices == k]:
                points += sum(len(search_job(one, Job(role, layout, b)).points) for b in one.max_batched_tokens)
    assert bar.points == points > 6


def test_a_plan_searched_in_two_processes_is_the_plan_searched_in_one():
    """With --processes 2 the instance sizes are searched in forked processes, largest first: the same options in the
    same order, split included, and the bar hears of every size and point."""
    from orchestrator.forked import can_fork
    from orchestrator.progress import SearchProgress

    assert can_fork()  # else plan falls back to one process and this test would compare a run with itself
    s = Scenario(**BASE)
    one, two = SearchProgress(enabled=False), SearchProgress(enabled=False)
    alone = plan_deployment(s, ["H100_SXM", "H200_SXM"], 14.0, max_devices=2, pd=True, progress=one)
    forked = plan_deployment(s, ["H100_SXM", "H200_SXM"], 14.0, max_devices=2, pd=True, progress=two, processes=2)
    assert [repr(o) for o in forked] == [repr(o) for o in alone] and len(alone) > 2
    assert (two.jobs, two.done, two.points) == (one.jobs, one.done, one.points) == (12, 12, one.points)
