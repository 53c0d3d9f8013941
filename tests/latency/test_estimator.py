import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latency import ForwardKey, MeasuredLatency, build_latency_model, calibrate
from latency.memory import GIB
from tests.conftest import examples


def test_decode_one_request_is_bounded_by_weight_reads():
    lm = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", quantization="bf16")
    floor_ms = lm.weights_bytes / 4.8e12 * 1e3  # about 65.5 GB / 4.8 TB/s = 13.6 ms
    assert 65e9 < lm.weights_bytes < 66e9
    ms = lm.latency_ms([ForwardKey(True, 1, 1, 2048)])[0]
    assert floor_ms <= ms <= 2 * floor_ms


def test_prefill_costs_at_least_the_matmul_flops():
    lm = build_latency_model("Qwen/Qwen3-32B", "H200_SXM")
    params = 32.8e9 - 151936 * 5120  # embeddings are a lookup, not a matmul
    floor_ms = 2 * params * 8192 / 989.4e12 * 1e3
    assert lm.latency_ms([ForwardKey(False, 1, 8192, 8192)])[0] >= floor_ms


def test_tp2_halves_weight_bytes_per_device():
    one = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", tp=1)
    two = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", tp=2)
    assert two.weights_bytes == pytest.approx(one.weights_bytes / 2)
    assert two.kv_bytes_per_token == pytest.approx(one.kv_bytes_per_token / 2)


def test_moe_decode_reads_only_the_activated_experts():
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM")
    m, d = lm.model, lm.device
    bd = lm.breakdown([ForwardKey(True, 1, 1, 1024)]).set_index("op")
    achievable = d.hbm_bytes_per_s * d.eff_memory  # bytes/s the roofline grants a memory-bound op
    all_experts_ms = m.num_moe_layers * m.num_experts * m.expert_params * 2 / achievable * 1e3
    topk_ms = m.num_moe_layers * m.experts_per_token * m.expert_params * 2 / achievable * 1e3
    assert bd.loc["moe", "ms"] < all_experts_ms / 4
    assert bd.loc["moe", "ms"] >= topk_ms
    big = lm.breakdown([ForwardKey(True, 512, 1, 1024)]).set_index("op")
    assert big.loc["moe", "ms"] >= all_experts_ms * 0.99  # 512 tokens x top-8 touch every expert


def test_memory_picture_matches_reference_weights():
    # the Ascend tool reports 64 - 10 reserved - 16.28 KV - 5.74 left = 31.98 "GB" (GiB) of weights
    lm = build_latency_model("Qwen/Qwen3-32B", "TEST_DEVICE", quantization="W8A8_DYNAMIC")
    assert lm.memory.weights_gib == pytest.approx(31.98, rel=0.005)
    assert lm.kv_bytes_per_token == 64 * 2 * 8 * 128 * 2
    mem = lm.memory_for(8192)
    assert mem.kv_capacity_tokens == int((64 * GIB - 10 * GIB - lm.weights_bytes - lm.activation_bytes(8192))
                                         // lm.kv_bytes_per_token)


def test_kv_layouts():
    # GQA with tp > kv heads: each rank keeps one KV head
    assert build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM", tp=8).kv_bytes_per_token == 48 * 2 * 128 * 2
    # MLA keeps the latent (512 + 64) per layer
    assert build_latency_model("deepseek-ai/DeepSeek-V3", "H200_SXM", tp=8).kv_bytes_per_token == 61 * 576 * 2
    assert build_latency_model("Qwen/Qwen3-8B", "H200_SXM", kv_cache_dtype="fp8").kv_bytes_per_token \
        == 36 * 2 * 8 * 128


def test_fused_step_reads_weights_once():
    lm = build_latency_model("Qwen/Qwen3-8B", "H200_SXM")
    a, b = ForwardKey(False, 1, 512, 512), ForwardKey(True, 32, 1, 2048)
    assert lm.step_latency_ms([(a,)])[0] == pytest.approx(lm.latency_ms([a])[0])
    fused = lm.step_latency_ms([(a, b)])[0]
    assert max(lm.latency_ms([a, b])) < fused < sum(lm.latency_ms([a, b]))


def test_breakdown_names_what_bounds_each_op():
    """(The per-op figures themselves are pinned by hand in test_pinned.py.)"""
    lm = build_latency_model("Qwen/Qwen3-8B", "H200_SXM", tp=2)
    bd = lm.breakdown([ForwardKey(False, 1, 4096, 4096), ForwardKey(True, 1, 1, 4096)])
    bound = {(k.is_decode, op): b for k, op, b in zip(bd["key"], bd["op"], bd["bound"], strict=True)}
    assert bound[(False, "mlp")] == "compute" and bound[(True, "mlp")] == "memory"  # 4096 tokens vs one
    assert bound[(False, "tp_comm")] == bound[(True, "tp_comm")] == "communication"


models = st.sampled_from([("Qwen/Qwen3-8B", 1), ("Qwen/Qwen3-32B", 4), ("Qwen/Qwen3-30B-A3B", 2),
                          ("deepseek-ai/DeepSeek-V3", 8), ("meta-llama/Llama-3.1-70B-Instruct", 8)])
devices = st.sampled_from(["H200_SXM", "TEST_DEVICE", "ATLAS_800_A2_376T_64G", "B200"])


@settings(max_examples=examples(60), deadline=None)
@given(model=models, device=devices, dec=st.booleans(), c=st.integers(1, 512), q=st.integers(1, 4096),
       s=st.integers(0, 32768), field=st.sampled_from(["concurrency", "query_len", "seq_len"]),
       grow=st.integers(1, 4096))
def test_latency_never_falls_when_a_key_grows(model, device, dec, c, q, s, field, grow):
    lm = build_latency_model(model[0], device, tp=model[1])
    base = ForwardKey(dec, c, q, q + s)
    bigger = base._asdict()
    bigger[field] += grow
    if field == "query_len":
        bigger["seq_len"] += grow
    ms = lm.latency_ms([base, ForwardKey(**bigger)])
    assert ms[1] >= ms[0] * (1 - 1e-12)


def test_measured_backend_interpolates_inside_and_refuses_outside(tmp_path):
    rows = [{"is_decode": True, "concurrency": c, "query_len": 1, "seq_len": s, "latency_ms": 1 + c + s / 100}
            for c in (1, 8) for s in (1000, 3000)]
    import pandas as pd

    path = tmp_path / "steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    lm = MeasuredLatency(path)
    got = lm.latency_ms([ForwardKey(True, 1, 1, 1000), ForwardKey(True, 8, 1, 2000), ForwardKey(True, 4, 1, 1500)])
    assert got == pytest.approx([12.0, 29.0, 20.0])  # exact at a corner; linear in between
    with pytest.raises(ValueError, match="seq_len=4000 is outside the measured grid"):
        lm.latency_ms([ForwardKey(True, 1, 1, 4000)])
    with pytest.warns(UserWarning, match="clamped"):
        assert MeasuredLatency(path, outside="clamp").latency_ms([ForwardKey(True, 1, 1, 9000)])[0] == 32.0
    with pytest.raises(ValueError, match="no prefill rows"):
        lm.latency_ms([ForwardKey(False, 1, 100, 100)])


def test_calibration_leaves_fields_the_table_cannot_see():
    import pandas as pd

    truth = build_latency_model("Qwen/Qwen3-8B", "H200_SXM")  # tp=1: no communication in any row
    keys = [ForwardKey(False, 1, n, n) for n in (512, 4096)] + [ForwardKey(True, b, 1, 2048) for b in (1, 64)]
    table = pd.DataFrame([{**k._asdict(), "latency_ms": v} for k, v in zip(keys, truth.latency_ms(keys), strict=True)])
    cal = calibrate(truth, table)
    assert "eff_communication" not in cal.params
    assert cal.model.device.eff_communication == truth.device.eff_communication


def test_engine_profile_adds_its_framework_time_to_every_step():
    from latency import EngineProfile, load_engine

    keys = [ForwardKey(True, 64, 1, 2048), ForwardKey(False, 2, 4096, 4096)]
    shapes = [(keys[0],), tuple(keys)]
    bare = build_latency_model("Qwen/Qwen3-8B", "H200_SXM")
    engine = EngineProfile("test", step_ms=1.5, layer_us=10.0, request_us=20.0, request_layer_us=0.25, token_us=0.5)
    with_engine = build_latency_model("Qwen/Qwen3-8B", "H200_SXM", engine=engine)
    added = with_engine.step_latency_ms(shapes) - bare.step_latency_ms(shapes)
    # step 1: 64 requests, 64 tokens; step 2: 66 requests, 64 + 8192 tokens; Qwen3-8B has 36 layers,
    # so a step costs 1.5 ms + 36 x 10 us and a request 20 us + 36 x 0.25 us = 29 us
    step = 1.5 + 0.36
    assert added == pytest.approx([step + (29 * 64 + 0.5 * 64) / 1000, step + (29 * 66 + 0.5 * 8256) / 1000])
    assert with_engine.fingerprint != bare.fingerprint
    # the per-layer shares follow the model's depth: Qwen3-32B's 64 layers, 28 more of 10 us a step
    # and of 0.25 us a request
    deep = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", engine=engine)
    bare = build_latency_model("Qwen/Qwen3-32B", "H200_SXM")
    deep_added = deep.step_latency_ms(shapes) - bare.step_latency_ms(shapes)
    assert deep_added - added == pytest.approx([(10 * 28 + 0.25 * 28 * 64) / 1000, (10 * 28 + 0.25 * 28 * 66) / 1000])
    assert load_engine("none").overhead_ms(10, 10, 64) == 0.0
    with pytest.raises(ValueError, match="unknown engine"):
        load_engine("nope")


def test_a_step_with_prompt_tokens_pays_the_engine_s_moe_prefill_time_in_each_moe_layer():
    """Qwen3-235B-A22B has 94 layers, all MoE: at 300 us a MoE layer a step with a prompt chunk (alone
    or mixed with decodes, or one prefill key) costs 28.2 ms more, a decode-only step nothing; a dense
    model has no MoE layer to pay it in."""
    from latency import EngineProfile

    engine = EngineProfile("test", moe_prefill_layer_us=300.0)
    decode, prompt = ForwardKey(True, 8, 1, 2048), ForwardKey(False, 1, 512, 512)
    shapes = [(decode,), (decode, prompt), (prompt,)]
    moe = dict(model="Qwen/Qwen3-235B-A22B", device="H100_SXM", tp=4, quantization="fp8")
    added = (build_latency_model(**moe, engine=engine).step_latency_ms(shapes)
             - build_latency_model(**moe).step_latency_ms(shapes))
    assert added == pytest.approx([0.0, 94 * 0.3, 94 * 0.3])
    keys_added = (build_latency_model(**moe, engine=engine).latency_ms([decode, prompt])
                  - build_latency_model(**moe).latency_ms([decode, prompt]))
    assert keys_added == pytest.approx([0.0, 94 * 0.3])
    dense = dict(model="Qwen/Qwen3-32B", device="H100_SXM", tp=4)
    assert build_latency_model(**dense, engine=engine).step_latency_ms(shapes) == pytest.approx(
        build_latency_model(**dense).step_latency_ms(shapes))


def test_async_scheduling_hides_the_time_per_step_behind_the_gpu_s():
    """With async scheduling a step costs max(its GPU time, step_ms), not their sum: a 5 ms step of
    Qwen3-32B on one H100 stays 5 ms under a 1.5 ms host time, and a step shorter than the host time
    waits for it. The per-request and per-layer times are GPU time and stay added."""
    from latency import EngineProfile

    keys = [ForwardKey(True, 8, 1, 2048), ForwardKey(True, 1, 1, 16)]
    sync = EngineProfile("test", step_ms=1.5, request_layer_us=0.25)
    bare = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", engine=EngineProfile("test", request_layer_us=0.25))
    gpu = bare.latency_ms(keys)
    synced = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", engine=sync).latency_ms(keys)
    hidden = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", engine=sync, async_scheduling=True).latency_ms(keys)
    assert synced == pytest.approx(gpu + 1.5)
    assert hidden == pytest.approx(np.maximum(gpu, 1.5))
    assert gpu[0] > 1.5  # the 8-request step hides the host time entirely
    tiny = build_latency_model("Qwen/Qwen3-8B", "H200_SXM", tp=8, engine=dataclasses.replace(sync, step_ms=50.0),
                               async_scheduling=True)
    assert tiny.latency_ms(keys) == pytest.approx([50.0, 50.0])  # the host is the bottleneck
    parts = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", engine=sync, async_scheduling=True).breakdown(keys[:1])
    assert parts["ms"].sum() == pytest.approx(hidden[0])


def test_every_step_of_a_moe_model_pays_the_engine_s_time_per_moe_layer():
    """moe_layer_us x the MoE layers, every step (Qwen3-235B-A22B: 94 of them at 28 us: 2.632 ms);
    a dense model has none to pay."""
    from latency import EngineProfile

    engine = EngineProfile("test", moe_layer_us=28.0)
    keys = [ForwardKey(True, 8, 1, 2048), ForwardKey(False, 1, 512, 512)]
    moe = dict(model="Qwen/Qwen3-235B-A22B", device="H100_SXM", tp=4, quantization="fp8")
    added = build_latency_model(**moe, engine=engine).latency_ms(keys) - build_latency_model(**moe).latency_ms(keys)
    assert added == pytest.approx([94 * 0.028] * 2)
    dense = dict(model="Qwen/Qwen3-32B", device="H100_SXM", tp=4)
    assert build_latency_model(**dense, engine=engine).latency_ms(keys) == pytest.approx(
        build_latency_model(**dense).latency_ms(keys))


def test_sglang_s_moe_layers_pay_vllm_s_expert_path_in_decode_and_prefill_steps():
    """SGLang's shipped profile carries vLLM's expert path as a whole (the same Triton kernel family):
    a MoE layer costs 28 us beyond the roofline in every step, DeepSeek-V3's 58 of them 1.624 ms, and
    a step with prompt tokens 200 us more a MoE layer, 11.6 ms (its host launches, as vLLM's)."""
    from latency import load_engine

    sglang, vllm = load_engine("sglang"), load_engine("vllm")
    decode_ms = sglang.overhead_ms(1, 1, 61, moe_layers=58) - sglang.overhead_ms(1, 1, 61)
    assert decode_ms == pytest.approx(58 * 0.028)
    assert sglang.moe_prefill_ms(58) == pytest.approx(58 * 0.200)
    assert (sglang.moe_layer_us, sglang.moe_bandwidth, sglang.moe_prefill_layer_us) == (
        vllm.moe_layer_us, vllm.moe_bandwidth, vllm.moe_prefill_layer_us)


def test_an_engine_that_names_its_memory_utilisation_leaves_the_rest_free():
    """vLLM takes 90 % of each GPU (--gpu-memory-utilization): on an H100 (79.6 GiB as it reports
    itself) 7.96 GiB stay free, and the KV pool is what the 90 % leaves after weights and
    activations. An engine that names none keeps the fixed 10 GiB."""
    from latency import load_engine

    vllm = load_engine("vllm")
    assert vllm.gpu_memory_utilization == 0.9
    assert vllm.reserved_gib(79.6) == pytest.approx(7.96)
    assert load_engine("none").reserved_gib(79.6) == 10.0
    lm = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", reserved_memory_gb=vllm.reserved_gib(79.6))
    pool = 0.9 * 79.6 * GIB - lm.weights_bytes - lm.activation_bytes(8192)
    assert lm.memory_for(8192).kv_capacity_tokens == int(pool // (64 * 2 * 8 * 128 * 2))  # bf16 K and V, 8 heads


def test_sglang_leaves_free_what_its_default_memory_fraction_reserves_for_the_device():
    """SGLang's --mem-fraction-static is (GPU memory - reserved) / GPU memory (its _handle_gpu_memory_settings):
    reserved = 512 MiB + 1.5 MiB a token of its default chunk + 2 MiB a request of its largest CUDA graph + tp / 8
    GiB, at least 10 GiB above 60 GiB. At tp 1: an H100 (8,192-token chunk, graphs to 256) 512 + 12,288 + 512 +
    128 MiB = 13.125 GiB; an H200 the same; a B200 (16,384, 512) 512 + 24,576 + 1,024 + 128 MiB = 25.625 GiB; an
    L40S (45 GiB: 4,096, 32) 512 + 6,144 + 64 + 128 MiB = 6.6875 GiB. The KV pool is what is left after weights
    and activations, so SGLang's B200 pool is 15.6 GiB smaller than the fixed 10 GiB left it."""
    from latency import load_engine

    sglang = load_engine("sglang")
    mib = {79.6: 512 + 8192 * 1.5 + 256 * 2 + 128, 140.4: 512 + 8192 * 1.5 + 256 * 2 + 128,
           179.1: 512 + 16384 * 1.5 + 512 * 2 + 128, 45.0: 512 + 4096 * 1.5 + 32 * 2 + 128}
    for hbm, reserved in mib.items():
        assert sglang.reserved_gib(hbm) == reserved / 1024, hbm
    assert sglang.gpu_memory_utilization == 0
    kv = {gib: build_latency_model("Qwen/Qwen3-32B", "B200", reserved_memory_gb=gib).memory_for(8192)
          for gib in (10.0, sglang.reserved_gib(179.1))}
    per_token = 64 * 2 * 8 * 128 * 2  # bf16 K and V, 8 heads, 64 layers
    assert kv[10.0].kv_capacity_tokens - kv[25.625].kv_capacity_tokens == pytest.approx(15.625 * GIB / per_token, abs=2)


def test_tensorrt_llm_s_kv_pool_is_its_fraction_of_what_its_profiling_peak_leaves():
    """TensorRT-LLM sizes its pool as (total - peak) x free_gpu_memory_fraction (its KvCacheCreator), the peak
    being the weights, the activations of a max_num_tokens step and what is not torch's (the CUDA context, 551 MB,
    and NCCL's buffers, 342 MiB at 2 GPUs, 392 MiB from 4): Qwen3-32B in FP8 on one H100 (79.6 GiB, no NCCL) at 0.8
    keeps 0.8 of 79.6 GiB - 525.5 MiB - weights - activations, and the rest of it counts as reserved."""
    from latency import load_engine
    from latency.reserve import trtllm_reserved_gib

    trt = load_engine("trtllm")
    assert (trt.reserve_rule, trt.kv_free_fraction) == ("trtllm", 0.8)
    assert trtllm_reserved_gib(79.6) == 551e6 / 2**30
    assert trtllm_reserved_gib(79.6, tp=2) == (551e6 / 2**20 + 342) / 1024
    assert trtllm_reserved_gib(140.4, tp=2, attention_dp=4) == trtllm_reserved_gib(79.6, tp=8) == (
        551e6 / 2**20 + 392) / 1024
    lm = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", quantization="fp8", kv_cache_dtype="fp8",
                             reserved_memory_gb=trtllm_reserved_gib(79.6), engine="trtllm")
    mem = lm.memory_for(8192)
    free = 79.6 * GIB - 551e6 - lm.weights_bytes - lm.activation_bytes(8192)
    assert mem.kv_capacity_tokens == int(0.8 * free // (64 * 2 * 8 * 128))  # fp8 K and V, 8 heads, 64 layers
    assert mem.reserved_gib == pytest.approx((551e6 + 0.2 * free) / GIB)
    assert mem.hbm_gib - mem.reserved_gib - mem.weights_gib - mem.activation_gib == pytest.approx(
        mem.kv_capacity_tokens * mem.kv_bytes_per_token / GIB, abs=1 / 1024)
    whole = build_latency_model("Qwen/Qwen3-32B", "H100_SXM", quantization="fp8", kv_cache_dtype="fp8",
                                reserved_memory_gb=trtllm_reserved_gib(79.6)).memory_for(8192)
    assert whole.kv_capacity_tokens == int(free // (64 * 2 * 8 * 128))  # an engine without a fraction: all of it


def test_a_calibrated_kv_share_scales_the_pool_and_the_rest_counts_as_reserved():
    """A profile's [memory] kv_share (what calibrate fits where runs queued for KV blocks) takes that share of the
    pool its engine's rule gives: Qwen3-32B in FP8 on one H100 under TensorRT-LLM's rule keeps 0.8 x 0.5 of what
    its reserve, weights and activations leave, the rest reserved; a share above 1 takes at most all the weights
    and activations leave, the reserve included."""
    from latency.engine import EngineProfile
    from latency.reserve import trtllm_reserved_gib

    held = trtllm_reserved_gib(79.6)
    engines = {share: EngineProfile("trt", reserve_rule="trtllm", kv_free_fraction=0.8, kv_share=share)
               for share in (1.0, 0.5, 2.0)}
    lms = {share: build_latency_model("Qwen/Qwen3-32B", "H100_SXM", quantization="fp8", kv_cache_dtype="fp8",
                                      reserved_memory_gb=held, engine=e) for share, e in engines.items()}
    lm, per_token = lms[1.0], 64 * 2 * 8 * 128  # fp8 K and V, 8 heads, 64 layers
    unheld = 79.6 * GIB - lm.weights_bytes - lm.activation_bytes(8192)
    free = unheld - held * GIB
    half, double = lms[0.5].memory_for(8192), lms[2.0].memory_for(8192)
    assert half.kv_capacity_tokens == int(0.4 * free // per_token)
    assert half.reserved_gib == pytest.approx(held + 0.6 * free / GIB)
    assert double.kv_capacity_tokens == int(unheld // per_token)  # 1.6 x free is more than is left: all of it
    assert double.reserved_gib == pytest.approx(0.0, abs=1e-9)
    assert lm.fingerprint == lms[0.5].fingerprint  # a step's price does not read it


def test_fingerprint_names_the_pricing_code_version(monkeypatch):
    """A long-lived shared cache must not serve prices of another release of the pricing code."""
    import latency.estimator as estimator

    before = build_latency_model("Qwen/Qwen3-8B", "H200_SXM").fingerprint
    assert before == build_latency_model("Qwen/Qwen3-8B", "H200_SXM").fingerprint
    monkeypatch.setattr(estimator, "pricing_code_version", lambda: "another-release")
    assert build_latency_model("Qwen/Qwen3-8B", "H200_SXM").fingerprint != before


def test_profiles_alike_in_what_a_price_reads_share_one_fingerprint_and_every_price():
    """The fingerprint leaves out what no step's price reads (latency.engine.UNPRICED: labels, front end, launch,
    admission, memory share), so calibrate's candidates that move only those share their prices; every field a
    price reads changes it."""
    from latency.engine import UNPRICED, EngineProfile

    base = EngineProfile("mine", base="vllm", step_ms=0.5, request_layer_us=0.3, moe_layer_us=20.0)
    other = dataclasses.replace(
        base, name="theirs", source="elsewhere", frontend=(("request_ms", 6.0), ("stream_us", 50.0)),
        scheduler="prefill-first", prefix_caching=True, fp8_kv_cache=True, max_batched_tokens=4096, max_num_seqs=100,
        below_clients=1, capacity_scheduler="guaranteed-no-evict", gpu_memory_utilization=0.8,
        reserved_by_hbm=((60.0, 5.0),), reserve_rule="sglang", kv_free_fraction=0.8, kv_share=0.5)
    assert {f for f in UNPRICED if getattr(other, f) == getattr(base, f)} == {"base"}
    keys = [ForwardKey(True, 3, 1500, 4000), ForwardKey(False, 40, 1, 6000)]
    shapes = [(keys[0],), (keys[1],), tuple(keys)]
    for model in ("Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B"):
        a, b = (build_latency_model(model, "H200_SXM", tp=2, engine=e) for e in (base, other))
        assert a.fingerprint == b.fingerprint
        assert a.step_latency_ms(shapes).tolist() == b.step_latency_ms(shapes).tolist()
    plain = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", tp=2, engine=base).fingerprint
    for name, moved in priced_fields_moved(base, skip=()):
        assert build_latency_model("Qwen/Qwen3-32B", "H200_SXM", tp=2, engine=moved).fingerprint != plain, name


def priced_fields_moved(base, skip: tuple):
    """(field, `base` with it moved) for every field of EngineProfile a price reads (not UNPRICED but `base` and
    the [efficiency] table, which are), but `skip`."""
    from latency.engine import UNPRICED, EngineProfile

    changed = {"base": "sglang", "efficiency": (("gemm", 0.9),)}
    for f in dataclasses.fields(EngineProfile):
        if (f.name in UNPRICED and f.name not in changed) or f.name in skip:
            continue
        if f.name in changed:
            value = changed[f.name]
        else:
            value = not getattr(base, f.name) if f.type == "bool" else getattr(base, f.name) + 0.25
        yield f.name, dataclasses.replace(base, **{f.name: value})



def test_profiles_alike_but_in_their_overheads_share_the_parts_of_every_step():
    """`parts_fingerprint` leaves out what only a step's overhead and host time read (latency.engine.OVERHEADS):
    calibrate's candidates that move only those share the parts `ShapeParts` remembers, and each prices a step as
    its own `step_latency_ms` does (a MoE model, whose prompt steps pay moe_prefill_layer_us); every other field a
    price reads changes it."""
    from latency.engine import OVERHEADS, EngineProfile
    from latency.estimator import ShapeParts

    base = EngineProfile("mine", base="vllm", step_ms=0.5, request_layer_us=0.3, moe_layer_us=20.0,
                         moe_prefill_layer_us=200.0)
    keys = [ForwardKey(True, 3, 1, 4000), ForwardKey(False, 1, 1500, 6000), ForwardKey(True, 64, 1, 900)]
    shapes = [(keys[0],), (keys[1],), tuple(sorted(keys)), (keys[2],), tuple(sorted(keys[1:]))]
    first = build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM", tp=2, engine=base)
    for f in OVERHEADS:
        value = not getattr(base, f) if f == "async_scheduling" else getattr(base, f) + 0.25
        moved = build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM", tp=2,
                                    engine=dataclasses.replace(base, **{f: value}))
        assert moved.parts_fingerprint == first.parts_fingerprint and moved.fingerprint != first.fingerprint, f
        assert ShapeParts(moved).parts is ShapeParts(first).parts
        own = moved.step_latency_ms(shapes).tolist()
        assert [ShapeParts(moved)(shape) for shape in shapes] == own
        assert (own != first.step_latency_ms(shapes).tolist()) == (f != "dp_step_ms"), f  # (dp: attention DP only)
    plain = first.parts_fingerprint
    for name, moved in priced_fields_moved(base, skip=OVERHEADS):
        model = build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM", tp=2, engine=moved)
        assert model.parts_fingerprint != plain, name


#: models whose steps are priced by every part of `_price`: dense, sliding-window attention with MXFP4
#: experts, MLA with a MoE prefill time (SGLang's), EP experts with TensorRT-LLM's per-layer times, sparse MLA
#: with indexers in some layers, chunked attention beside full, gated delta-nets beside gated attention
PART_MODELS = [("Qwen/Qwen3-32B", "H200_SXM", {"tp": 2}, "vllm"),
               ("openai/gpt-oss-120b", "H100_SXM", {"tp": 2}, "vllm"),
               ("deepseek-ai/DeepSeek-V3", "H200_SXM", {"tp": 8}, "sglang"),
               ("Qwen/Qwen3-235B-A22B", "H100_SXM", {"tp": 4, "ep": 4}, "trtllm"),
               ("meta-llama/Llama-3.1-8B-Instruct", "B200", {"tp": 1}, "none"),
               ("zai-org/GLM-5.2", "B200", {"tp": 8}, "vllm"),
               ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "H200_SXM", {"tp": 8}, "sglang"),
               ("Qwen/Qwen3.5-35B-A3B", "H100_SXM", {"tp": 2}, "vllm")]
entries = st.builds(lambda dec, c, q, extra: ForwardKey(dec, c, 1 if dec else q, (1 if dec else q) + extra),
                    st.booleans(), st.integers(1, 256), st.integers(1, 8192), st.integers(0, 16384))


@settings(max_examples=examples(150), deadline=None)
@given(case=st.sampled_from(PART_MODELS), steps=st.lists(st.lists(entries, min_size=1, max_size=4), min_size=1,
                                                          max_size=12))
def test_shapes_priced_from_remembered_parts_cost_what_the_whole_shape_costs(case, steps):
    """The timed planner's fast path (`ShapeParts`) gives every step shape the price `step_latency_ms`
    gives it, to the bit, whatever parts it remembered from the shapes before (they share token counts
    and entries, and each shape's neighbours, priced with it, meet a shape of a decode more)."""
    from latency.estimator import ShapeParts

    model, device, parallel, engine = case
    lm = build_latency_model(model, device, engine=engine, **parallel)
    parts = ShapeParts(lm)
    shapes = [tuple(sorted(entries)) for entries in steps]
    shapes += shapes[: len(shapes) // 2]  # some again, from memory
    shapes += [tuple(sorted((*shape, ForwardKey(True, 1, 1, 129)))) for shape in shapes]  # a decode more
    whole = lm.step_latency_ms(shapes)
    assert [parts(shape) for shape in shapes] == whole.tolist()
