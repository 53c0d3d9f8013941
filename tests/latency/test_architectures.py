"""The MoE architectures people deploy now, parsed from their published config.json, the
sliding-window attention of gpt-oss, the sparse attention of DeepSeek-V3.2 and GLM-5 and the gated delta-net
layers of Qwen3.5 priced by hand."""

import json
from pathlib import Path

import numpy as np
import pytest

from latency import ForwardKey, build_latency_model, load_model
from latency.estimator import _causal_pairs, _chunked_pairs
from latency.model import ModelSpec
from tests.latency.test_pinned import touched


def test_shipped_moe_architectures_parse_as_published():
    oss = load_model("openai/gpt-oss-120b")
    assert (oss.num_experts, oss.experts_per_token, oss.moe_intermediate_size) == (128, 4, 2880)
    assert oss.num_dense_layers == 0
    assert (oss.sliding_window, oss.num_sliding_layers, oss.num_full_layers) == (128, 18, 18)
    minimax = load_model("MiniMaxAI/MiniMax-M2.5")
    assert (minimax.num_experts, minimax.experts_per_token, minimax.moe_intermediate_size) == (256, 8, 1536)
    assert minimax.num_sliding_layers == 0 and minimax.num_shared_experts == 0
    kimi = load_model("moonshotai/Kimi-K2.5")  # a DeepSeek-V3 text model inside a multimodal wrapper
    assert (kimi.num_experts, kimi.num_shared_experts, kimi.num_dense_layers, kimi.num_layers) == (384, 1, 1, 61)
    assert kimi.is_mla and kimi.kv_lora_rank == 512 and kimi.hidden_size == 7168
    qwen = load_model("Qwen/Qwen3-32B")  # a window declared but switched off
    assert qwen.num_sliding_layers == 0


@pytest.mark.parametrize(("key", "what"), [
    ("ssm_cfg", "state-space"), ("linear_attn_config", "linear"), ("hybrid_override_pattern", "hybrid state-space"),
    ("compress_ratios", "compressed attention"), ("hybrid_layer_pattern", "hybrid")])
def test_an_architecture_we_do_not_price_is_named(key, what):
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
              "vocab_size": 100, key: {}}
    with pytest.raises(ValueError, match=f"has '{key}': servesweep does not model {what}"):
        ModelSpec.from_config(config, "odd")
    config = {**config, key: None}
    del config[key]
    with pytest.raises(ValueError, match=r"layer_types \['mamba'\]"):
        ModelSpec.from_config({**config, "layer_types": ["mamba", "full_attention"]}, "odd")


@pytest.mark.parametrize(("q", "s", "window", "expect"), [
    (4, 4, 0, 10),      # 1 + 2 + 3 + 4
    (4, 4, 2, 7),       # 1 + 2 + 2 + 2
    (1, 1000, 128, 128),  # a decode token sees the window
    (3, 10, 128, 27),   # 8 + 9 + 10, all under the window
    (3, 130, 128, 128 * 2 + 128),  # positions 127, 128, 129 see 128 each
])
def test_causal_pairs_under_a_window_hand_computed(q, s, window, expect):
    assert _causal_pairs(np.array([q]), np.array([s]), window)[0] == expect


def test_sliding_layers_read_only_their_window():
    lm = build_latency_model("openai/gpt-oss-120b", device="H200_SXM", tp=1)
    m = lm.model
    # KV per token of context: the 18 full-attention layers, 8 KV heads x 64 x (K, V) x bf16
    assert lm.memory.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2
    short, long_ = lm.breakdown([ForwardKey(True, 64, 1, 1024), ForwardKey(True, 64, 1, 65536)]).pipe(
        lambda t: t[t["op"] == "attention"]["ms"].tolist())
    # a 64x longer context: the full layers read 64x the KV, the sliding ones the same 128 tokens
    assert 30 < long_ / short < 64
    assert m.num_full_layers + m.num_sliding_layers == m.num_layers


def test_gpt_oss_weights_hand_computed():
    """gpt-oss-120b as shipped (bf16 attention, MXFP4 experts at 4.25 bits) on one device: 36 layers
    of attention (64 heads, 8 KV heads of 64), 128 experts of 3 x 2880 x 2880 and a 2880 x 128 router,
    untied 201088-token embeddings and LM head in bf16."""
    lm = build_latency_model("openai/gpt-oss-120b", device="H200_SXM", tp=1, quantization="bf16+mxfp4")
    h, layers = 2880, 36
    attention = (h * 64 * (64 + 2 * 8) + 64 * 64 * h) * 2
    experts = 128 * 3 * h * h * 4.25 / 8
    router = h * 128 * 2
    vocab = 201088 * h * 2 * 2
    assert lm.memory_account.weights_bytes == pytest.approx(layers * (attention + experts + router) + vocab)


def test_experts_quantised_apart_and_fp4_where_the_device_has_it():
    from latency import load_device, parse_quantization

    q = parse_quantization("bf16+nvfp4")
    assert (q.weight_bytes, q.compute_dtype, q.experts_bytes, q.experts_dtype) == (2.0, "bf16", 0.5625, "fp4")
    plain = parse_quantization("fp8")
    assert (plain.experts_bytes, plain.experts_dtype) == (1.0, "fp8")
    with pytest.raises(ValueError, match="LINEAR\\+EXPERTS"):
        parse_quantization("bf16+fp3")
    assert load_device("B200").peak_flops("fp4") == 9000e12
    assert load_device("H200_SXM").peak_flops("fp4") == load_device("H200_SXM").peak_flops("bf16")  # weight-only
    assert load_model("openai/gpt-oss-120b").checkpoint_quantization == "bf16+mxfp4"
    assert load_model("moonshotai/Kimi-K2.5").checkpoint_quantization == "bf16+int4_wo"
    assert load_model("MiniMaxAI/MiniMax-M2.5").checkpoint_quantization == "fp8"
    assert load_model("Qwen/Qwen3-32B").checkpoint_quantization == ""


def test_mxfp4_experts_stream_at_the_fp4_bandwidth_only_where_fp4_tensor_cores_run_them():
    """gpt-oss's MXFP4 experts (4.25 bits) run on B200's FP4 tensor cores, so a decode step's expert
    op streams them at the engine's FP4 share; on H200 they are weight-only, at its other share."""
    from latency import EngineProfile, parse_quantization

    q = parse_quantization("bf16+mxfp4")
    assert (q.experts_bytes, q.experts_dtype) == (4.25 / 8, "fp4")
    engine = EngineProfile("test", moe_bandwidth=0.5, moe_fp4_bandwidth=1.0)
    key = [ForwardKey(True, 256, 1, 1024)]  # 256 tokens x top-4 of 128 experts: nearly every expert is read
    moe = {}
    for device in ("B200", "H200_SXM"):
        lm = build_latency_model("openai/gpt-oss-120b", device=device, tp=1, quantization="bf16+mxfp4", engine=engine)
        t = lm.breakdown(key)
        moe[device] = float(t[t["op"] == "moe"]["ms"].iloc[0])
        assert lm.native_fp4_experts == (device == "B200")
        experts = 36 * 128 * 3 * 2880 * 2880 * 4.25 / 8 * touched(4, 128, 256)  # bytes of the experts read
        bandwidth = lm.device.hbm_bytes_per_s * lm.device.eff_memory * (1.0 if device == "B200" else 0.5)
        kernels = 36 * 3 * lm.device.kernel_overhead_us * 1e-3  # three kernels a layer
        # the expert weights dominate the op's bytes; the rest (router, activations) is < 1 %
        assert moe[device] == pytest.approx(experts / bandwidth * 1e3 + kernels, rel=0.01)
    assert moe["H200_SXM"] > 2 * moe["B200"]


def test_the_checkpoint_format_is_the_gpu_default_and_the_device_s_elsewhere():
    from orchestrator.scenario import Scenario

    assert Scenario("openai/gpt-oss-120b", "H200_SXM", 1, 1024, 16).quantization == "bf16+mxfp4"
    assert Scenario("Qwen/Qwen3-32B", "H200_SXM", 1, 1024, 16).quantization == "bf16"
    assert Scenario("openai/gpt-oss-120b", "TEST_DEVICE", 1, 1024, 16).quantization == "W8A8_DYNAMIC"


def test_an_engine_s_grouped_gemm_efficiency_scales_the_expert_op_alone():
    from latency.engine import EngineProfile

    lm = build_latency_model("MiniMaxAI/MiniMax-M2.5", device="H200_SXM", tp=4, quantization="fp8")
    key = ForwardKey(True, 8, 1, 2048)  # a decode step: the experts' weights are streamed (memory-bound)
    slow = lm.__class__(lm.model, lm.device, lm.parallel, lm.quant, engine=EngineProfile("x", moe_bandwidth=0.5))
    a, b = (m.breakdown([key]).set_index("op")["ms"] for m in (lm, slow))
    from latency.estimator import KERNELS

    moe_kernels = KERNELS["moe"] * lm.device.kernel_overhead_us * 1e-3 * lm.model.num_moe_layers  # launches stay
    assert b["moe"] - moe_kernels == pytest.approx(2 * (a["moe"] - moe_kernels), rel=1e-6)
    assert (b.drop("moe") == a.drop("moe")).all()


def test_an_engine_s_mla_decode_factor_scales_an_mla_model_s_decode_attention_alone():
    """DeepSeek-V3's decode attention takes the profile's factor times its roofline price; its prefill attention,
    every other op, and a model without MLA are as priced."""
    from latency.engine import EngineProfile

    def ops(model, factor, key):
        lm = build_latency_model(model, device="H200_SXM", tp=8)
        engine = EngineProfile("x", mla_decode_attention=factor)
        lm = lm.__class__(lm.model, lm.device, lm.parallel, lm.quant, engine=engine)
        return lm.breakdown([key]).set_index("op")["ms"]

    decode, prefill = ForwardKey(True, 64, 1, 4096), ForwardKey(False, 1, 2048, 2048)
    a, b = ops("deepseek-ai/DeepSeek-V3", 0.0, decode), ops("deepseek-ai/DeepSeek-V3", 1.85, decode)
    assert b["attention"] == pytest.approx(1.85 * a["attention"], rel=1e-9)
    assert (b.drop("attention") == a.drop("attention")).all()
    for model, key in (("deepseek-ai/DeepSeek-V3", prefill), ("Qwen/Qwen3-32B", decode)):
        assert (ops(model, 1.85, key) == ops(model, 0.0, key)).all()


@pytest.mark.parametrize(("device", "quantization", "native"), [
    ("B200", "nvfp4", True), ("H200_SXM", "nvfp4", False), ("B200", "fp8", False)])
def test_fp4_experts_on_fp4_tensor_cores_stream_at_their_own_efficiency(device, quantization, native):
    """An engine's fp4_bandwidth prices FP4 experts where the device computes FP4 (B200), its
    bandwidth everywhere else (weight-only FP4 on H200, FP8 experts on B200): same model, same step."""
    from latency.engine import EngineProfile
    from latency.estimator import KERNELS

    lm = build_latency_model("MiniMaxAI/MiniMax-M2.5", device=device, tp=4, quantization=quantization)
    key = ForwardKey(True, 8, 1, 2048)  # a decode step: the experts' weights are streamed (memory-bound)
    plain, fp4 = (lm.__class__(lm.model, lm.device, lm.parallel, lm.quant, engine=EngineProfile(
        "x", moe_bandwidth=0.5, moe_fp4_bandwidth=fp4_share)) for fp4_share in (0.0, 1.0))
    a, b = (m.breakdown([key]).set_index("op")["ms"] for m in (plain, fp4))
    launches = KERNELS["moe"] * lm.device.kernel_overhead_us * 1e-3 * lm.model.num_moe_layers
    assert b["moe"] - launches == pytest.approx((a["moe"] - launches) * (0.5 if native else 1.0), rel=1e-6)
    assert (b.drop("moe") == a.drop("moe")).all()


def test_weight_only_int4_experts_keep_only_part_of_b200_s_bandwidth_lead():
    """Kimi-K2.5's INT4 weight-only experts on B200 stream at the device's weight_only_experts share
    (0.67) of the expert efficiency, on H100 at 1.38 of it (the upcast, not HBM, bounds them there);
    its NVFP4 checkpoint (FP4 tensor cores) and the same INT4 checkpoint on H200 (no share: 1) do not.
    Hand-computed from a decode step that reads most experts: 256 tokens x top-8 of 384, tp 8 (each device an
    eighth of each expert)."""
    from latency import EngineProfile
    from latency.estimator import KERNELS
    engine = EngineProfile("test", moe_bandwidth=0.5, moe_fp4_bandwidth=0.5)
    key = [ForwardKey(True, 256, 1, 1024)]
    read = touched(8, 384, 256)  # 0.91 of the experts (latency.routing.ROUTING_SKEW's routing), by hand
    for device, quantization, share in (("B200", "bf16+int4_wo", 0.67), ("H200_SXM", "bf16+int4_wo", 1.0),
                                        ("B200", "bf16+nvfp4", 1.0), ("H100_SXM", "bf16+int4_wo", 1.38)):
        lm = build_latency_model("moonshotai/Kimi-K2.5", device=device, tp=8, quantization=quantization,
                                 engine=engine)
        assert lm.weight_only_share == share
        t = lm.breakdown(key).set_index("op")["ms"]
        m = lm.model
        experts = m.num_moe_layers * m.num_experts * read * m.expert_params / 8 * lm.quant.experts_bytes
        bandwidth = lm.device.hbm_bytes_per_s * lm.device.eff_memory * 0.5 * share
        launches = KERNELS["moe"] * lm.device.kernel_overhead_us * 1e-3 * m.num_moe_layers
        # the experts' weights are nearly all of the op's bytes (shared expert, router, activations < 2 %)
        assert t["moe"] - launches == pytest.approx(experts / bandwidth * 1e3, rel=0.03)


@pytest.mark.parametrize("device, share, native", [("H100_SXM", 1.38, False), ("H200_SXM", 1.0, False),
                                                   ("B200", 1.0, True)])
def test_mxfp4_experts_without_fp4_tensor_cores_are_weight_only(device, share, native):
    """gpt-oss-120b's MXFP4 experts are upcast in the kernel where the GPU has no FP4 tensor cores
    (Hopper), so they take the device's weight-only share (H100's 1.38, H200's 1); on B200 they run
    on its FP4 tensor cores and take none."""
    lm = build_latency_model("openai/gpt-oss-120b", device=device, tp=2, quantization="bf16+mxfp4")
    assert (lm.weight_only_share, lm.native_fp4_experts) == (share, native)


def test_fp8_linear_layers_stream_weights_at_the_device_s_fp8_memory_efficiency():
    """A decode step of one request on H200 (memory-bound qkv, o and MLP GEMMs): FP8 weights stream at
    the device file's fp8_memory (0.66, the engines' measured FP8 decode GEMMs), bf16 ones at its memory
    (0.8); a device file that names none (A100) keeps memory for FP8 too. Hand-computed from the layers'
    weight bytes; the weights are all but a few kB of each op's bytes at one token."""
    from latency.estimator import KERNELS

    key = [ForwardKey(True, 1, 1, 1024)]
    for device, quantization, w_bytes in (("H200_SXM", "fp8", 1.0), ("H200_SXM", "bf16", 2.0),
                                          ("A100_SXM_80G", "fp8", 1.0)):
        lm = build_latency_model("Qwen/Qwen3-32B", device=device, tp=1, quantization=quantization)
        d = lm.device
        eff = (d.eff_fp8_memory or d.eff_memory) if quantization == "fp8" else d.eff_memory
        assert eff == {("H200_SXM", "fp8"): 0.66, ("H200_SXM", "bf16"): 0.8, ("A100_SXM_80G", "fp8"): d.eff_memory}[
            (device, quantization)]
        t = lm.breakdown(key).set_index("op")["ms"]
        L = lm.model.num_layers
        for op, params in (("qkv_proj", lm.qkv_params), ("o_proj", lm.o_params), ("mlp", lm.mlp_params)):
            launches = KERNELS[op] * d.kernel_overhead_us * 1e-3 * L
            expected = params * w_bytes / (d.hbm_bytes_per_s * eff) * 1e3 * L
            assert t[op] - launches == pytest.approx(expected, rel=0.002), (device, quantization, op)


def _h200_with(tmp_path, *lines: str) -> Path:
    """H200's device file with `lines` added to its [efficiency] table, written under tmp_path."""
    from latency.device import DATA

    text = (DATA / "H200_SXM.toml").read_text().replace("[efficiency]", "[efficiency]\n" + "\n".join(lines), 1)
    path = tmp_path / "H200_SXM.toml"
    path.write_text(text)
    return path


def test_a_device_file_s_fp8_efficiencies_are_checked(tmp_path):
    """fp8_gemm, fp8_memory and fp8_kv_memory are fractions in (0, 1], 0 or absent meaning as gemm, memory
    and memory."""
    from latency.device import DATA, DeviceSpec, load_device

    text = (DATA / "H200_SXM.toml").read_text()
    path = tmp_path / "H200_SXM.toml"
    for bad in ("1.5", "-0.1", "true", '"x"'):
        path.write_text(text.replace("fp8_memory = 0.66", f"fp8_memory = {bad}"))
        with pytest.raises(ValueError, match=r"\[efficiency\] fp8_memory must be in \(0, 1\]"):
            DeviceSpec.from_file(path)
    path.write_text(text.replace("fp8_memory = 0.66", "fp8_gemm = 0.5"))
    spec = DeviceSpec.from_file(path)
    assert spec.linear_efficiency("fp8") == (0.5, spec.eff_memory)
    assert spec.linear_efficiency("bf16") == (spec.eff_gemm, spec.eff_memory)
    shipped = load_device("H200_SXM")
    assert shipped.linear_efficiency("fp8") == (0.78, 0.66)
    assert shipped.kv_memory_efficiency(1) == shipped.kv_memory_efficiency(2) == shipped.eff_memory  # not set
    spec = DeviceSpec.from_file(_h200_with(tmp_path, "fp8_kv_memory = 0.55"))
    assert spec.kv_memory_efficiency(1) == 0.55 and spec.kv_memory_efficiency(2) == spec.eff_memory


def test_attention_reads_an_fp8_kv_cache_at_the_device_s_fp8_kv_memory_efficiency(tmp_path):
    """A decode step of 64 requests at 8k context on an H200 whose file sets fp8_kv_memory 0.55 (what the
    engines' measured FP8-KV decode attention gives; the shipped file does not set it): an FP8 cache is
    read at 0.55 of the bandwidth, a bf16 one at the device's memory 0.8 (memory-bound: GQA reads each KV
    once). Hand-computed from the KV bytes the step reads."""
    from latency.estimator import KERNELS

    device = str(_h200_with(tmp_path, "fp8_kv_memory = 0.55"))
    key = [ForwardKey(True, 64, 1, 8192)]
    for kv, kv_bytes, eff in (("fp8", 1.0, 0.55), ("bf16", 2.0, 0.8)):
        lm = build_latency_model("Qwen/Qwen3-32B", device=device, tp=1, kv_cache_dtype=kv)
        d, m = lm.device, lm.model
        assert d.kv_memory_efficiency(kv_bytes) == eff
        t = lm.breakdown(key).set_index("op")["ms"]
        kv_read = 64 * 8192 * 2 * m.num_kv_heads * m.head_dim * kv_bytes
        queries = 64 * m.num_heads * 2 * m.head_dim * 2  # each query in and out, bf16
        launches = KERNELS["attention"] * d.kernel_overhead_us * 1e-3
        expected = (kv_read + queries) / (d.hbm_bytes_per_s * eff) * 1e3 + launches
        assert t["attention"] == pytest.approx(expected * m.num_layers, rel=1e-6), kv


def test_a_profile_s_memory_multiplier_moves_the_device_s_fp8_efficiencies_with_it(tmp_path):
    """`calibrate` fits [efficiency] memory as a multiplier on the device's: on an FP8 deployment it must
    reach the FP8 linear layers and an FP8 KV cache too, or a calibration could not move their steps.
    0.5 x memory halves 0.8, 0.66 and 0.55 alike; gemm leaves them alone."""
    from latency import EngineProfile
    from latency.device import DeviceSpec
    from latency.estimator import KERNELS

    path = _h200_with(tmp_path, "fp8_kv_memory = 0.55")
    h200 = DeviceSpec.from_file(path)
    half = EngineProfile("test", efficiency=(("memory", 0.5),)).scaled_device(h200)
    assert (half.eff_memory, half.eff_fp8_memory, half.eff_fp8_kv_memory) == (0.4, 0.33, 0.275)
    assert half.eff_gemm == h200.eff_gemm and half.eff_fp8_gemm == 0.0
    gemm = EngineProfile("test", efficiency=(("gemm", 0.5),)).scaled_device(h200)
    assert (gemm.eff_gemm, gemm.eff_fp8_memory, gemm.eff_fp8_kv_memory) == (0.39, 0.66, 0.55)
    key = [ForwardKey(True, 8, 1, 2048)]
    options = dict(device=str(path), quantization="fp8", kv_cache_dtype="fp8")
    plain = build_latency_model("Qwen/Qwen3-32B", **options)
    slow = build_latency_model("Qwen/Qwen3-32B", engine=EngineProfile("test", efficiency=(("memory", 0.5),)),
                               **options)
    a, b = plain.breakdown(key).set_index("op")["ms"], slow.breakdown(key).set_index("op")["ms"]
    for op in ("qkv_proj", "mlp", "attention"):  # memory-bound at 8 tokens: their bytes take twice as long
        launches = KERNELS[op] * h200.kernel_overhead_us * 1e-3 * plain.model.num_layers
        assert b[op] - launches == pytest.approx(2 * (a[op] - launches), rel=1e-3), op


def test_sparse_attention_parsed_with_its_indexer():
    """DeepSeek-V3.2: every layer runs an indexer of 64 x 128 and attends to 2,048 keys; GLM-5.2 runs one in
    21 of 78 layers ("full" indexer_types), the others reuse an earlier pick; GLM-5.1 is GLM-5's config."""
    v32 = load_model("deepseek-ai/DeepSeek-V3.2")
    assert (v32.index_topk, v32.index_heads, v32.index_head_dim, v32.num_index_layers) == (2048, 64, 128, 61)
    assert v32.is_mla and v32.index_key_bytes == 128 + 4
    glm = load_model("zai-org/GLM-5.2")
    assert (glm.index_topk, glm.index_heads, glm.num_index_layers, glm.num_layers) == (2048, 32, 21, 78)
    assert load_model("zai-org/GLM-5.1").num_index_layers == 78


def test_minimax_m3_sparse_attention_over_grouped_query_heads():
    """MiniMax-M3: 60 grouped-query layers (64 query heads, 4 KV heads of 128) attend to 16 picked blocks of 128
    tokens and their own, 2,176 keys; 57 run an indexer of 4 x 128; 3 dense layers 12,288 wide, 57 MoE layers of
    128 experts 3,072 wide (top 4) and a shared one. A decode token's attention costs the same at 64k and 128k
    tokens of context but for its indexer's scores; the KV cache holds every token, and its index key."""
    m = load_model("MiniMaxAI/MiniMax-M3")
    assert (m.index_topk, m.index_heads, m.index_head_dim, m.num_index_layers) == (2176, 4, 128, 57)
    assert not m.is_mla and (m.num_heads, m.num_kv_heads, m.head_dim, m.num_full_layers) == (64, 4, 128, 60)
    assert (m.num_dense_layers, m.intermediate_size, m.num_experts, m.experts_per_token, m.num_shared_experts) == \
        (3, 12288, 128, 4, 1)
    lm = build_latency_model("MiniMaxAI/MiniMax-M3", device="B200", tp=4)
    assert lm.memory.kv_bytes_per_token == 60 * 2 * 1 * 128 * 2 + 57 * (128 + 4)
    short = lm._attention_parts(True, 64.0, 1.0, 65536.0, False)[0]
    long_ = lm._attention_parts(True, 64.0, 1.0, 131072.0, False)[0]
    index = (lm._indexer(64.0, 1.0, 131072.0) - lm._indexer(64.0, 1.0, 65536.0)) * 57 / 60
    assert long_ - short == pytest.approx(index)


def test_sparse_attention_reads_its_top_k_and_an_index_key_of_every_token():
    """A decode step of DeepSeek-V3.2 attends to 2,048 keys however long the context: past 2,048 tokens only
    the indexer's part grows (it scores every key); its KV per token is the MLA latent (576 values) and an
    index key (128 FP8 values + an fp32 scale) in each of the 61 layers."""
    lm = build_latency_model("deepseek-ai/DeepSeek-V3.2", device="H200_SXM", tp=8)
    assert lm.memory.kv_bytes_per_token == 61 * (576 * 2 + 132)
    peak = lm.device.peak_flops("bf16")

    def core(s):  # one layer's attention without its indexer
        return lm._attention_entries(True, 64.0, 1.0, s, peak, False, lm.full_heads)[0] - lm._indexer(64.0, 1.0, s)

    assert core(4096.0) == pytest.approx(core(2048.0)) == pytest.approx(core(131072.0))
    assert core(1024.0) < core(2048.0)
    def indexer(s):
        return lm._indexer(64.0, 1.0, s)

    # beyond its kernels' launch, it grows with the keys it scores: doubling 64k to 128k adds twice 32k to 64k's
    assert indexer(131072.0) - indexer(65536.0) == pytest.approx(2 * (indexer(65536.0) - indexer(32768.0)), rel=0.01)
    assert indexer(131072.0) > 5 * indexer(4096.0)


def test_a_shared_indexer_is_priced_in_the_layers_that_run_one():
    """GLM-5 and GLM-5.2 differ only in how many layers run an indexer (78 and 21) and how long a context
    they take: a step's attention differs by 57 indexers, its other ops not at all."""
    shapes = [(ForwardKey(False, 1, 8192, 8192), ForwardKey(True, 32, 1, 30000))]
    every, shared = (build_latency_model(name, device="B200", tp=8) for name in ("zai-org/GLM-5", "zai-org/GLM-5.2"))
    a, b = (lm.breakdown(list(shapes[0])).groupby("op")["ms"].sum() for lm in (every, shared))
    indexers = sum(float(every._indexer(float(k.concurrency), float(k.query_len), float(k.seq_len)))
                   for k in shapes[0])
    assert a["attention"] - b["attention"] == pytest.approx(57 * indexers)
    assert a.drop(["attention", "qkv_proj"]).equals(b.drop(["attention", "qkv_proj"]))
    assert a["qkv_proj"] > b["qkv_proj"]  # 57 indexers' projections fewer


def test_sparse_prefill_is_cheaper_than_dense_mla_only_past_the_top_k():
    """Sparse MLA computes in the latent (576 + 512 wide a head) where dense MLA's prefill expands K and V
    (192 + 128): for a short prompt the sparse kernel does more work, for a long one far less on a rank of all
    128 heads (attention DP). The indexer scores every pair with its 64 heads on every rank, so at tp 8
    (16 heads a rank) a 128k context's chunk costs about as much as dense MLA's."""
    sparse, dense = (build_latency_model(name, device="H200_SXM", tp=1)
                     for name in ("deepseek-ai/DeepSeek-V3.2", "deepseek-ai/DeepSeek-V3"))

    def attention(lm, prompt):
        t = lm.breakdown([ForwardKey(False, 1, 4096, prompt)])
        return float(t[t["op"] == "attention"]["ms"].sum())

    # past the top-k, a pair costs the indexer 2 x 64 x 128 FP8 FLOPs (half as long as bf16's) where dense MLA
    # spends 2 x heads x (192 + 128) bf16 ones: 8,192 / 81,920 = 0.1 of it with 128 heads a rank, 8,192 / 10,240 =
    # 0.8 with 16 (tp 8); the sparse kernel's 2,048 keys a query add a few hundredths at 128k
    assert attention(sparse, 4096) > attention(dense, 4096)
    assert 0.1 < attention(sparse, 131072) / attention(dense, 131072) < 0.2
    sparse, dense = (build_latency_model(name, device="H200_SXM", tp=8)
                     for name in ("deepseek-ai/DeepSeek-V3.2", "deepseek-ai/DeepSeek-V3"))
    assert 0.7 < attention(sparse, 131072) / attention(dense, 131072) < 0.9


@pytest.mark.parametrize(("q", "s", "chunk", "expect"), [
    (4, 4, 2, 6),          # positions 0..3 see 1 + 2 + 1 + 2
    (3, 10, 4, 7),         # positions 7, 8, 9 see 4, 1, 2
    (1, 8193, 8192, 1),    # the first token of a new chunk sees itself
    (8192, 8192, 8192, 8192 * 8193 / 2),  # one whole chunk: causal
])
def test_chunked_pairs_hand_computed(q, s, chunk, expect):
    assert _chunked_pairs(np.array([q]), np.array([s]), chunk)[0] == expect
    assert _chunked_pairs(q, s, chunk) == expect  # one entry's numbers, as the timed planner prices them


def test_llama4_moe_layers_and_chunked_attention_parsed():
    """Llama 4: 36 of 48 layers (the RoPE ones) attend within chunks of 8,192 tokens, every fourth (NoPE) to
    all; Scout's every layer has 16 experts and a shared one, Maverick's every other has 128 and a shared one,
    its others a dense MLP 16,384 wide: 109B and 400B weights."""
    scout = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    maverick = load_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    for m in (scout, maverick):
        assert (m.attention_chunk, m.num_chunked_layers, m.num_full_layers) == (8192, 36, 12)
        assert (m.moe_intermediate_size, m.num_shared_experts, m.experts_per_token) == (8192, 1, 1)
    assert (scout.num_experts, scout.num_moe_layers, maverick.num_experts, maverick.num_moe_layers) == (16, 48, 128, 24)
    assert maverick.intermediate_size == 16384
    billions = [build_latency_model(m, device="B200", tp=8).memory_account.weights_bytes * 8 / 2 / 1e9
                for m in ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct")]
    assert billions == [pytest.approx(109, rel=0.02), pytest.approx(400, rel=0.02)]  # as Meta publishes them
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
              "vocab_size": 100, "attention_chunk_size": 16}
    with pytest.raises(ValueError, match="Llama 4's chunked"):
        ModelSpec.from_config(config, "odd")


def test_chunked_layers_read_only_their_chunk():
    """A decode token of Llama 4 reads its chunk's KV in 36 layers and the whole context in 12: from 64k to
    128k tokens of context only the 12 full layers' reads double; KV a token is theirs alone."""
    lm = build_latency_model("meta-llama/Llama-4-Scout-17B-16E-Instruct", device="H200_SXM", tp=4)
    assert lm.memory.kv_bytes_per_token == 12 * 2 * (8 / 4) * 128 * 2  # K and V of 2 KV heads a device
    full, local, _, _ = lm._attention_parts(True, 64.0, 1.0, 65536.0, False)
    full2, local2, _, _ = lm._attention_parts(True, 64.0, 1.0, 131072.0, False)
    assert local == pytest.approx(local2) and full2 > 1.8 * full


def test_qwen3_5_gated_delta_net_layers_parsed():
    """Qwen3.5: 3 layers of 4 are gated delta-nets (a state of 48 value heads x 128 x 128 in float32 a request),
    every fourth full attention with a gate as wide as its queries; the MoE ones' shared expert is one routed
    width, and they leave their dense width out; Qwen3.6 is Qwen3.5's architecture."""
    dense = load_model("Qwen/Qwen3.5-27B")
    assert (dense.num_linear_layers, dense.num_full_layers, dense.attention_output_gate) == (48, 16, True)
    assert (dense.linear_key_heads, dense.linear_value_heads, dense.linear_key_dim, dense.linear_state_bytes) == \
        (16, 48, 128, 4)
    moe = load_model("Qwen/Qwen3.5-35B-A3B")
    assert (moe.num_experts, moe.num_shared_experts, moe.moe_intermediate_size, moe.num_moe_layers) == (256, 1, 512, 40)
    assert load_model("Qwen/Qwen3.6-27B").num_linear_layers == 48
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
              "vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 48}
    with pytest.raises(ValueError, match="a whole number of routed widths"):
        ModelSpec.from_config(config, "odd")


def test_qwen3_5_weights_and_recurrent_state_hand_computed():
    """Qwen3.5-27B on one device in bf16: 16 gated attention layers (24 query and gate heads, 4 KV heads of 256),
    48 gated delta-nets (in: queries and keys 16 x 128, values and output gate 48 x 128, two gates a value head;
    out 48 x 128), 64 MLPs 17,408 wide, untied 248,320-token embeddings; KV a token in the 16 attention layers
    only, and a request's state in the 48 others: 48 x 128 x 128 float32 and 3 inputs of the convolution."""
    lm = build_latency_model("Qwen/Qwen3.5-27B", device="H200_SXM", tp=1)
    h = 5120
    attention = h * 256 * (2 * 24 + 2 * 4) + 24 * 256 * h
    linear = h * (2 * 2048 + 2 * 6144 + 2 * 48) + 6144 * h
    params = 16 * attention + 48 * linear + 64 * 3 * h * 17408 + 2 * 248320 * h
    assert lm.memory_account.weights_bytes == pytest.approx(2 * params, rel=1e-12)
    assert lm.memory.kv_bytes_per_token == 16 * 2 * 4 * 256 * 2
    state = 48 * (48 * 128 * 128 * 4 + (2 * 2048 + 6144) * 3 * 2)
    mem = lm.memory
    assert mem.state_bytes_per_request == state
    assert mem.state_tokens == -(-state // mem.kv_bytes_per_token)
    assert mem.tokens_left(10) == mem.kv_capacity_tokens - 10 * mem.state_tokens
    dense = build_latency_model("Qwen/Qwen3-32B", device="H200_SXM", tp=1).memory
    assert (dense.state_tokens, dense.tokens_left(10)) == (0, dense.kv_capacity_tokens)


def test_a_gated_delta_net_layer_costs_the_same_at_any_context():
    """A decode step's delta-net layers read and write each request's state whatever its context; its attention
    layers read a context 16 times longer in 16 times the time, near enough."""
    lm = build_latency_model("Qwen/Qwen3.5-27B", device="H200_SXM", tp=2)
    short, _, state, _ = lm._attention_parts(True, 64.0, 1.0, 4096.0, False)
    long_, _, state2, _ = lm._attention_parts(True, 64.0, 1.0, 65536.0, False)
    assert state == state2 and 10 < long_ / short < 16
    bytes_ = 2 * 64 * lm.state_bytes_layer  # the state read and written bound its time, beside 3 kernels' launch
    kernels = 3 * lm.device.kernel_overhead_us * 1e-3
    assert state == pytest.approx(bytes_ / (lm.device.hbm_bytes_per_s * lm.device.eff_memory) * 1e3 + kernels)


def test_a_layout_must_split_the_delta_net_heads_as_the_attention_ones():
    """Qwen3.5-27B: its 24 attention heads and 4 KV heads take tp 4 and tp 12, but its delta-nets' 16 key heads
    do not take tp 12 (the engines shard their heads over tp)."""
    build_latency_model("Qwen/Qwen3.5-27B", device="H200_SXM", tp=4)
    from latency import ParallelSpec

    with pytest.raises(ValueError, match="16 key and 48 value heads"):
        ParallelSpec(tp=12).validate(load_model("Qwen/Qwen3.5-27B"))


def test_nemotron_h_blocks_read_as_layers_of_a_mixer_and_an_mlp():
    """Nemotron-3-Nano's 52 blocks: 23 Mamba-2 mixers each before a MoE block, 6 attention blocks with no MLP;
    read as 29 layers, 23 recurrent (64 heads x 64 x a 128-wide state; B and C 8 x 128), 23 MoE of 128 ungated
    (squared-ReLU) experts top-6 and two shared ones' width: 31.7B weights, as published (31.6B)."""
    m = load_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B")
    assert (m.num_layers, m.num_linear_layers, m.num_full_layers, m.num_mlp_free_layers) == (29, 23, 6, 6)
    assert (m.num_moe_layers, m.num_experts, m.experts_per_token, m.num_shared_experts) == (23, 128, 6, 2)
    assert (m.mlp_matrices, m.linear_value_heads, m.linear_value_dim, m.linear_key_dim) == (2, 64, 64, 128)
    h, inter = 2688, 1856
    attention = h * 128 * (32 + 2 * 2) + 32 * 128 * h
    mamba = h * (2 * 8 * 128 + 2 * 64 * 64 + 2 * 64) + 64 * 64 * h
    moe = 128 * 2 * h * inter + 2 * 2 * h * inter + h * 128
    params = 6 * attention + 23 * mamba + 23 * moe + 2 * 131072 * h
    lm = build_latency_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", device="B200", tp=1)
    assert lm.memory_account.weights_bytes == pytest.approx(2 * params, rel=1e-12)
    assert params == pytest.approx(31.6e9, rel=0.01)  # as NVIDIA publishes it


def test_a_latent_moe_s_experts_work_in_its_latent():
    """Nemotron-3-Super: 512 routed experts between a 1,024-wide latent and 2,688 (ungated), beside two shared
    experts' width at the hidden 4,096 and the projections into and out of the latent; 121B weights."""
    m = load_model("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B")
    assert m.moe_latent_size == 1024 and m.expert_params == 2 * 1024 * 2688
    assert m.shared_expert_params == 2 * 2 * 4096 * 2688 + 2 * 4096 * 1024
    lm = build_latency_model("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B", device="B200", tp=8)
    assert lm.memory_account.weights_bytes * 8 / 2 == pytest.approx(120e9, rel=0.02)  # as NVIDIA publishes it


def test_a_dense_nemotron_h_prices_its_mlp_blocks_and_refuses_more_mlps_than_mixers(tmp_path):
    """A dense stack (M - M * -: two MLP blocks, three mixers) prices two dense MLPs; more MLP blocks than
    mixers is not a stack of layers and is refused."""
    config = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 5,
              "hybrid_override_pattern": "M-M*-", "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1,
              "ssm_state_size": 16, "conv_kernel": 4, "mlp_hidden_act": "relu2"}
    m = ModelSpec.from_config(config, "tiny")
    assert (m.num_layers, m.num_linear_layers, m.num_mlp_free_layers, m.is_moe, m.mlp_matrices) == (3, 2, 1, False, 2)
    assert m.linear_state_bytes == 2  # no mamba_ssm_cache_dtype: the model's own
    (tmp_path / "config.json").write_text(json.dumps(config))
    lm = build_latency_model(str(tmp_path), device="H100_SXM", tp=1)
    assert lm.dense_layers == 2 and lm.mlp_params == 2 * 64 * 128  # up and down, no gate
    with pytest.raises(ValueError, match="hybrid state-space"):
        ModelSpec.from_config({**config, "hybrid_override_pattern": "M--"}, "odd")


def test_gemma4_layers_of_two_head_sizes_hand_computed():
    """Gemma-4-26B-A4B: 25 sliding layers (16 query heads and 8 KV heads of 256, over 1,024 tokens) and 5 global
    ones (2 KV heads of 512, values from the keys' projection: no value weights); every layer's dense MLP 2,112
    wide beside 128 experts 704 wide (top 8), read as 3 shared experts; tied 262,144-token embeddings. 25.2B
    weights, as Google publishes it; KV a token in the 5 global layers alone, and a request's 1,024-token window
    in the 25 others (200 MiB in bf16)."""
    m = load_model("google/gemma-4-26B-A4B")
    assert (m.num_sliding_layers, m.num_full_layers, m.sliding_window) == (25, 5, 1024)
    assert (m.num_kv_heads, m.head_dim, m.full_kv_heads, m.full_head_dim, m.full_values_from_keys) == \
        (8, 256, 2, 512, True)
    assert (m.num_experts, m.experts_per_token, m.num_shared_experts, m.num_dense_layers) == (128, 8, 3, 0)
    lm = build_latency_model("google/gemma-4-26B-A4B", device="H200_SXM", tp=1)
    h = 2816
    sliding = h * (16 * 256 + 8 * 2 * 256) + 16 * 256 * h
    glob = h * (16 * 512 + 2 * 512) + 16 * 512 * h  # queries and keys only: the values are the keys
    moe = 128 * 3 * h * 704 + 3 * 3 * h * 704 + h * 128
    params = 25 * sliding + 5 * glob + 30 * moe + 262144 * h
    assert lm.memory_account.weights_bytes == pytest.approx(2 * params, rel=1e-12)
    assert params == pytest.approx(25.2e9, rel=0.01)
    mem = lm.memory
    assert mem.kv_bytes_per_token == 5 * 2 * 2 * 512 * 2
    assert mem.state_bytes_per_request == 25 * 1024 * 2 * 8 * 256 * 2 == 200 * 2**20


def test_gemma4_global_layers_attend_with_their_own_heads():
    """A decode token's global layer reads 2 KV heads of 512 (K and V) a token, a sliding one 8 of 256 over at
    most 1,024 tokens: from 64k to 128k tokens of context only the global layers' reads double, and a global
    layer priced with the sliding layers' heads would read twice its KV (decode attention is memory-bound)."""
    lm = build_latency_model("google/gemma-4-26B-A4B", device="H200_SXM", tp=1)
    assert (lm.full_heads.kv_elems, lm.local_heads.kv_elems) == (2 * 1024, 8 * 512)
    assert (lm.full_heads.qk_decode, lm.local_heads.qk_decode) == (512, 256)
    full, local, _, _ = lm._attention_parts(True, 64.0, 1.0, 65536.0, False)
    full2, local2, _, _ = lm._attention_parts(True, 64.0, 1.0, 131072.0, False)
    assert local == pytest.approx(local2) and full2 > 1.8 * full
    peak = lm.device.peak_flops("bf16")
    as_sliding = lm._attention_entries(True, 64.0, 1.0, 65536.0, peak, False, lm.local_heads)[0]
    assert 0.45 < full / as_sliding < 0.55  # 2 x 1,024 elements a token against 8 x 512


def test_a_model_s_full_layers_alike_its_sliding_ones_price_as_one_shape():
    """full_* fields naming the sliding layers' own shape change no price (gpt-oss-120b, to the bit)."""
    from dataclasses import replace

    from latency import ParallelSpec, RooflineModel, load_device, parse_quantization

    plain = load_model("openai/gpt-oss-120b")
    same = replace(plain, full_kv_heads=plain.num_kv_heads, full_head_dim=plain.head_dim)
    keys = [ForwardKey(True, 64, 1, 4096), ForwardKey(False, 1, 2048, 2048)]
    prices = [RooflineModel(m, load_device("H200_SXM"), ParallelSpec(tp=2), parse_quantization("bf16+mxfp4"))
              for m in (plain, same)]
    assert prices[0].latency_ms(keys).tolist() == prices[1].latency_ms(keys).tolist()
    assert prices[0].memory.kv_capacity_tokens == prices[1].memory.kv_capacity_tokens


def test_mimo_v2_flash_hybrid_pattern_read_as_sliding_and_full_layers():
    """MiMo-V2-Flash: `hybrid_layer_pattern` 1 a sliding layer (39, 8 KV heads over 128 tokens), 0 a full one
    (9, 4 KV heads); keys 192 wide and values 128 in both; the first layer's MLP dense; 309B weights, as
    Xiaomi publishes it."""
    m = load_model("XiaomiMiMo/MiMo-V2-Flash")
    assert (m.num_sliding_layers, m.num_full_layers, m.sliding_window) == (39, 9, 128)
    assert (m.num_kv_heads, m.full_kv_heads, m.head_dim, m.values_dim, m.full_v_head_dim) == (8, 4, 192, 128, 128)
    assert (m.num_experts, m.experts_per_token, m.num_dense_layers, m.num_moe_layers) == (256, 8, 1, 47)
    lm = build_latency_model("XiaomiMiMo/MiMo-V2-Flash", device="H200_SXM", tp=4)
    assert lm.memory.kv_bytes_per_token == 9 * (4 / 4) * (192 + 128) * 2  # one KV head a device, K and V
    h = 4096
    sliding = h * (64 * 192 + 8 * (192 + 128)) + 64 * 128 * h
    full = h * (64 * 192 + 4 * (192 + 128)) + 64 * 128 * h
    params = 39 * sliding + 9 * full + 3 * h * 16384 + 47 * (256 * 3 * h * 2048 + h * 256) + 2 * 152576 * h
    assert params == pytest.approx(309e9, rel=0.01)


@pytest.mark.parametrize(("key", "value", "what"), [("num_kv_shared_layers", 2, "another layer's KV"),
                                                     ("hidden_size_per_layer_input", 256, "per-layer input")])
def test_a_gemma4_part_we_do_not_price_is_named(key, value, what):
    config = json.loads((Path(__file__).parents[2] / "latency/data/models/google--gemma-4-31B-it.json").read_text())
    with pytest.raises(ValueError, match=what):
        ModelSpec.from_config({**config, key: value}, "gemma-e")
    assert ModelSpec.from_config({**config, key: 0}, "gemma").full_head_dim == 512


def test_deepseek_v4_compressed_layers_parsed_and_weighed_as_published():
    """DeepSeek-V4-Flash: 43 layers of one 512-wide KV entry over a 128-token window, 21 CSA layers (an entry
    every 4 tokens, an indexer of 64 x 128 picking 512), 20 HCA layers (an entry every 128 tokens), 2 of their
    window alone; queries through a 1,024 rank, the output in 8 groups through 1,024; 256 experts 2,048 wide
    (top 6) and a shared one; FP8 with FP4 experts. 287B weights (published: 284B); Pro 1.59T (1.6T)."""
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    assert tuple(m.compressed_layers(r) for r in (4, 128, 0)) == (21, 20, 2) and m.num_index_layers == 21
    assert (m.num_kv_heads, m.head_dim, m.sliding_window, m.index_topk, m.o_groups, m.o_lora_rank) == \
        (1, 512, 128, 512, 8, 1024)
    assert m.checkpoint_quantization == "fp8+mxfp4" and not m.is_mla and m.num_sliding_layers == 0
    lm = build_latency_model("deepseek-ai/DeepSeek-V4-Flash", device="B200", tp=1, quantization="bf16")
    h, w, rank = 4096, 512, 1024
    index = rank * 64 * 128 + h * (128 + 64)
    attention = 43 * (h * rank + rank * 64 * w + h * w + 64 * w * rank + 8 * rank * h) \
        + 21 * (2 * h * 2 * w + index) + 20 * 2 * h * w
    moe = 43 * (256 * 3 * h * 2048 + 3 * h * 2048 + h * 256)
    params = attention + moe + 2 * 129280 * h
    assert lm.memory_account.weights_bytes == pytest.approx(2 * params, rel=1e-9)
    assert params == pytest.approx(284e9, rel=0.015)
    pro = build_latency_model("deepseek-ai/DeepSeek-V4-Pro", device="B200", tp=8, quantization="bf16")
    assert pro.memory_account.weights_bytes * 8 / 2 == pytest.approx(1.6e12, rel=0.015)


def test_deepseek_v4_kv_a_token_is_its_compressed_entries_and_a_request_holds_its_windows():
    """A token of context costs a quarter of an entry and of an index key in each CSA layer and 1/128 of an
    entry in each HCA layer; every layer's window of 128 entries is a request's own."""
    lm = build_latency_model("deepseek-ai/DeepSeek-V4-Flash", device="B200", tp=4, kv_cache_dtype="fp8")
    mem = lm.memory
    assert mem.kv_bytes_per_token == 21 * (512 + 128 + 4) / 4 + 20 * 512 / 128
    assert mem.state_bytes_per_request == 43 * 128 * 512


def test_deepseek_v4_decode_attention_reads_its_window_and_compressed_entries():
    """A decode token at 64k tokens of context reads 128 + 512 entries in a CSA layer (its indexer scanning
    16k), 128 + 512 in an HCA layer, 128 in a window layer; at 128k the HCA layers read 512 more each and the
    indexers scan twice as much, nothing else: the difference is those bytes at the KV cache's bandwidth."""
    lm = build_latency_model("deepseek-ai/DeepSeek-V4-Flash", device="B200", tp=4, kv_cache_dtype="fp8")
    short = lm._attention_parts(True, 64.0, 1.0, 65536.0, False)[0]
    long_ = lm._attention_parts(True, 64.0, 1.0, 131072.0, False)[0]
    bandwidth = lm.device.hbm_bytes_per_s * lm.device.kv_memory_efficiency(1.0)
    hca = 20 * 64 * 512 * 512 / bandwidth * 1e3  # 512 more entries of 512 FP8 bytes, 64 requests, 20 layers
    index = 21 * (lm._indexer(64.0, 1.0, 131072.0, 4) - lm._indexer(64.0, 1.0, 65536.0, 4))
    assert (long_ - short) * 43 == pytest.approx(hca + index, rel=1e-6)
    assert short * 43 > 21 * lm._indexer(64.0, 1.0, 65536.0, 4)  # the entries' reads beside the indexers'


def test_kimi_k3_kda_and_mla_layers_and_latent_experts():
    """Kimi-K3: of 93 layers (counted from 1 in `linear_attn_config`), 69 KDA layers read as gated delta-nets of 96
    key and value heads of 128 (a float32 state of 128 x 128 each, a 4-wide convolution) and 24 MLA layers with an
    output gate; 896 experts 3,072 wide (top 16) in a 3,584 latent, two shared at the hidden width, the first
    layer dense; its experts MXFP4. 2.79T weights (published: 2.8T); KV a token in the 24 MLA layers alone."""
    m = load_model("moonshotai/Kimi-K3")
    assert (m.num_linear_layers, m.num_full_layers, m.is_mla, m.attention_output_gate) == (69, 24, True, True)
    assert (m.linear_key_heads, m.linear_value_dim, m.linear_conv_kernel, m.linear_state_bytes) == (96, 128, 4, 4)
    assert (m.num_experts, m.experts_per_token, m.moe_latent_size, m.num_shared_experts, m.num_dense_layers) == \
        (896, 16, 3584, 2, 1)
    assert m.checkpoint_quantization == "bf16+mxfp4"
    lm = build_latency_model("moonshotai/Kimi-K3", device="B200", tp=8, quantization="bf16")
    assert lm.memory_account.weights_bytes * 8 / 2 == pytest.approx(2.8e12, rel=0.01)
    mem = lm.memory
    assert mem.kv_bytes_per_token == 24 * (512 + 64) * 2
    assert mem.state_bytes_per_request == 69 * (96 / 8 * 128 * 128 * 4 + 3 * 96 * 128 / 8 * 3 * 2)
