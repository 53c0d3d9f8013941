"""Step latencies pinned to hand arithmetic from the device's and the model's numbers, op by op,
so that dropping, doubling or mispricing any op fails. Llama-3.1-8B (hidden 4096, 32 layers, 32
heads, 8 KV heads of 128, MLP 14336, vocabulary 128256) on TEST_DEVICE (bf16 353.9 TFLOP/s at 0.7,
HBM 1.759 TB/s at 0.6, attention at 0.7, no kernel or step overhead), tp 1, bf16."""

import dataclasses

import numpy as np
import pytest

from latency import ForwardKey, build_latency_model

PEAK = 353.9e12 * 0.7   # FLOP/s for GEMMs and attention (both 0.7 on TEST_DEVICE)
BW = 1.759e12 * 0.6     # bytes/s
H, L, HEADS, KV, D, FF, V = 4096, 32, 32, 8, 128, 14336, 128256


def touched(k: int, n: int, routed: float, skew: float = 0.8) -> float:
    """The share of n experts `routed` tokens pick at least once, each k of them, expert i (by popularity) picked
    with odds k x i^-skew / sum (a Zipf law, latency.routing.ROUTING_SKEW), none above 1: by hand."""
    weights = [i ** -skew for i in range(1, n + 1)]
    total = sum(weights)
    return sum(1 - (1 - min(1.0, k * w / total)) ** routed for w in weights) / n


def roof_ms(flops, bytes_):
    return max(flops / PEAK, bytes_ / BW) * 1e3


def hand(t: int, attention_flops: float, attention_bytes: float) -> dict:
    """ms per op of a step of `t` tokens and `t` sampled rows... with the given attention work."""
    def linear(params, tokens=t, in_out=2 * H):
        return roof_ms(2 * tokens * params, params * 2 + tokens * in_out * 2)

    return {
        "qkv_proj": L * linear(H * D * (HEADS + 2 * KV)),
        "o_proj": L * linear(HEADS * D * H),
        "mlp": L * linear(3 * H * FF),
        "attention": L * roof_ms(attention_flops, attention_bytes),
        "elementwise": L * (t * (8 * H + 3 * FF) * 2) / BW * 1e3,  # 8 hidden passes + 3 over the MLP width
    }


@pytest.fixture(scope="module")
def lm():
    return build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "TEST_DEVICE", quantization="bf16")


def _by_op(lm, key):
    bd = lm.breakdown([key])
    return dict(zip(bd["op"], bd["ms"], strict=True))


def test_one_decode_step_op_by_op(lm):
    ctx = 1024  # one request, one new token, context 1024 after it: it attends to all 1024 keys
    kv_bytes = ctx * 2 * KV * D * 2              # K and V of every cached token, bf16
    ops = hand(1, 2 * ctx * HEADS * (D + D), kv_bytes + HEADS * 2 * D * 2)
    ops["lm_head"] = roof_ms(2 * V * H, V * H * 2 + (H + V * 4 / 2) * 2)  # fp32 logits of one row
    got = _by_op(lm, ForwardKey(True, 1, 1, ctx))
    assert set(got) == set(ops)
    for op, ms in ops.items():
        assert got[op] == pytest.approx(ms, rel=1e-9), op
    assert lm.latency_ms([ForwardKey(True, 1, 1, ctx)])[0] == pytest.approx(sum(ops.values()), rel=1e-9)


def test_one_prefill_step_op_by_op(lm):
    q = 512  # a 512-token prompt: causal pairs 512 * 513 / 2
    pairs = q * (q + 1) / 2
    ops = hand(q, 2 * pairs * HEADS * (D + D), q * 2 * KV * D * 2 + q * HEADS * 2 * D * 2)
    ops["lm_head"] = roof_ms(2 * V * H, V * H * 2 + (H + V * 4 / 2) * 2)  # only the last row is sampled
    got = _by_op(lm, ForwardKey(False, 1, q, q))
    for op, ms in ops.items():
        assert got[op] == pytest.approx(ms, rel=1e-9), op
    assert lm.latency_ms([ForwardKey(False, 1, q, q)])[0] == pytest.approx(sum(ops.values()), rel=1e-9)
    # the bound of each op, by hand: a 512-token GEMM is compute-bound here, the decode GEMM memory-bound
    bounds = dict(zip(lm.breakdown([ForwardKey(False, 1, q, q)])["op"],
                      lm.breakdown([ForwardKey(False, 1, q, q)])["bound"], strict=True))
    assert bounds["mlp"] == "compute" and bounds["elementwise"] == "memory"


def test_tp2_adds_a_ring_all_reduce_per_attention_and_mlp_block():
    lm2 = build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "TEST_DEVICE", tp=2, quantization="bf16")
    t = 256
    msg = t * H * 2
    ring_s = 2 * (2 - 1) / 2 * msg / (196e9 * 0.7) + 2 * (2 - 1) * 2e-6  # 196 GB/s at 0.7, 2 us per hop
    got = _by_op(lm2, ForwardKey(False, 1, t, t))
    assert got["tp_comm"] == pytest.approx(2 * L * ring_s * 1e3, rel=1e-9)


def hand_step_ms(key: ForwardKey, gemm: float, attention: float, memory: float) -> float:
    """A whole step by hand, for `key.concurrency` identical requests, at the given efficiencies."""
    c, q, s = key.concurrency, key.query_len, key.seq_len
    t = c * q
    peak, bw = 353.9e12, 1.759e12 * memory

    def roof(flops, bytes_, eff):
        return max(flops / (peak * eff), bytes_ / bw) * 1e3

    def linear(params, tokens=t, in_out=2 * H):
        return roof(2 * tokens * params, params * 2 + tokens * in_out * 2, gemm)

    pairs = q * (s - q) + q * (q + 1) / 2
    att = roof(2 * c * pairs * HEADS * 2 * D, c * (s * 2 * KV * D * 2 + q * HEADS * 2 * D * 2), attention)
    per_layer = linear(H * D * (HEADS + 2 * KV)) + linear(HEADS * D * H) + linear(3 * H * FF) + att \
        + t * (8 * H + 3 * FF) * 2 / bw * 1e3
    return L * per_layer + linear(V * H, tokens=c, in_out=H + V * 4 / 2)


def test_calibration_recovers_efficiencies_from_a_hand_made_table(lm):
    import dataclasses

    import pandas as pd

    from latency import RooflineModel, calibrate

    truth = {"eff_gemm": 0.55, "eff_attention": 0.45, "eff_memory": 0.75}
    keys = [ForwardKey(False, b, n, n) for b in (1, 4) for n in (512, 2048, 8192)] + \
           [ForwardKey(True, b, 1, c) for b in (1, 16, 64, 256) for c in (1024, 8192)]
    table = pd.DataFrame([{**k._asdict(), "latency_ms": hand_step_ms(k, *truth.values())} for k in keys])
    assert lm.latency_ms([keys[0]])[0] == pytest.approx(hand_step_ms(keys[0], 0.7, 0.7, 0.6), rel=1e-9)
    cal = calibrate(lm, table, fields=tuple(truth))
    assert cal.median_error_before > 0.1 and cal.median_error_after < 1e-6
    for field, value in truth.items():
        assert cal.params[field] == pytest.approx(value, rel=1e-4), field
    start = RooflineModel(lm.model, dataclasses.replace(lm.device, eff_gemm=0.9), lm.parallel, lm.quant)
    assert calibrate(start, table, fields=tuple(truth)).params["eff_gemm"] == pytest.approx(0.55, rel=1e-4)
    before = [abs(lm.latency_ms([k])[0] / hand_step_ms(k, *truth.values()) - 1) for k in keys]
    assert cal.median_error_before == pytest.approx(float(np.median(before)), rel=1e-12)


def test_calibration_keeps_the_engine_and_names_what_it_cannot_fit(lm):
    import pandas as pd

    from latency import build_latency_model, calibrate

    keys = [ForwardKey(True, b, 1, 2048) for b in (1, 8, 64)] + [ForwardKey(False, 1, 1024, 1024)]
    table = pd.DataFrame([{**k._asdict(), "latency_ms": 2 * lm.latency_ms([k])[0]} for k in keys])
    vllm = build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "TEST_DEVICE", quantization="bf16", engine="vllm")
    cal = calibrate(vllm, table, fields=("eff_memory", "kernel_overhead_us"))
    assert cal.model.engine.name == "vllm" and set(cal.params) == {"eff_memory", "kernel_overhead_us"}
    assert cal.median_error_after < cal.median_error_before
    with pytest.raises(ValueError, match=r"^cannot calibrate \['eff_magic'\]; choose from \['eff_gemm', "):
        calibrate(lm, table, fields=("eff_magic",))
    with pytest.raises(ValueError, match="^the measured table exercises none of the calibrated fields$"):
        calibrate(lm, table, fields=("eff_communication",))  # tp 1: nothing is communicated
    # a field at 0 is probed at 1 us: the prefill row's attention set-up time moves it
    zero = lm.__class__(lm.model, dataclasses.replace(lm.device, prefill_attention_overhead_us=0.0), lm.parallel,
                        lm.quant)
    assert set(calibrate(zero, table, fields=("prefill_attention_overhead_us",)).params) == \
        {"prefill_attention_overhead_us"}
    with pytest.raises(ValueError, match="exercises none"):  # decode rows only: no prefill attention set-up
        calibrate(zero, table.iloc[:3], fields=("prefill_attention_overhead_us",))


INTRA, INTRA_HOP = 196e9 * 0.7, 2e-6    # TEST_DEVICE NVLink-class link at 0.7, per hop
INTER, INTER_HOP = 25e9 * 0.7, 10e-6    # between nodes of 8


QWEN3_30B = dict(h=2048, k=8, n_exp=128, layers=48, expert=3 * 2048 * 768, router=2048 * 128)


def _moe_ms(routed: int, ranks_tokens: int, devices: int) -> float:
    """Qwen3-30B-A3B's MoE layers for `routed` tokens over `devices` ep groups (tp / ep = 1), a device
    holding `ranks_tokens` of them: the experts the routed tokens activate, the busiest group's pairs."""
    q = QWEN3_30B
    active = touched(q["k"], q["n_exp"], routed)
    weights = (q["n_exp"] / devices) * active * q["expert"] * 2 + q["router"] * 2
    busiest = 1.2 * routed * q["k"] / devices
    flops = 2 * (busiest * q["expert"] + ranks_tokens * q["router"])
    return q["layers"] * roof_ms(flops, weights + (2 * ranks_tokens + 2 * busiest) * q["h"] * 2)


def test_moe_decode_under_tp_attention_reads_its_experts_and_all_reduces():
    """Qwen3-30B-A3B (48 MoE layers, 128 experts of 3 x 2048 x 768, 8 per token, router 2048 x 128),
    tp 4 with the experts over ep 4 groups: 16 requests decoding. Every device holds every token (tp
    attention), runs its 32 experts and the layer's all-reduce sums them: no token is exchanged."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=4, ep=4, quantization="bf16")
    t, q = 16, QWEN3_30B
    msg = t * q["h"] * 2
    tp_comm = 2 * q["layers"] * (2 * 3 / 4 * msg / INTRA + 2 * 3 * INTRA_HOP) * 1e3  # attention's and the MoE's
    got = _by_op(lm, ForwardKey(True, t, 1, 2048))
    assert got["moe"] == pytest.approx(_moe_ms(t, t, 4), rel=1e-9)
    assert got["tp_comm"] == pytest.approx(tp_comm, rel=1e-9)
    assert "ep_comm" not in got
    assert "mlp" not in got  # every layer is a MoE layer


def test_moe_decode_under_attention_dp_dispatches_and_combines():
    """The same model over 4 attention-DP ranks (tp 1, ep 4): 16 requests decoding on each. A rank's
    tokens go to their 8 experts, 3 of 4 copies to peers, and come back: dispatch + combine, one
    latency each; the layer routes the 64 tokens of all ranks."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=4, attention_dp=4, quantization="bf16")
    t, q = 16, QWEN3_30B
    msg = t * q["h"] * 2
    ep_comm = q["layers"] * 2 * (msg * q["k"] * 3 / 4 / INTRA + INTRA_HOP) * 1e3
    got = _by_op(lm, ForwardKey(True, t, 1, 2048))
    assert got["moe"] == pytest.approx(_moe_ms(4 * t, t, 4), rel=1e-9)
    assert got["ep_comm"] == pytest.approx(ep_comm, rel=1e-9)
    assert "tp_comm" not in got


def test_attention_dp_with_tp_dispatches_each_device_s_share_of_its_rank_s_tokens():
    """Qwen3-30B-A3B over 2 attention-DP ranks of tp 2 (4 devices, ep 4): a rank's 16 tokens are on
    both of its devices after attention's all-reduce; the experts' input is sequence parallel, so
    each device dispatches 8 of them (3 of 4 copies to peers) and takes them back, not all 16."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=2, ep=4, attention_dp=2, quantization="bf16")
    t, q = 16, QWEN3_30B
    share = t / 2 * q["h"] * 2
    ep_comm = q["layers"] * 2 * (share * q["k"] * 3 / 4 / INTRA + INTRA_HOP) * 1e3
    got = _by_op(lm, ForwardKey(True, t, 1, 2048))
    assert got["ep_comm"] == pytest.approx(ep_comm, rel=1e-9)
    # attention's all-reduce stays, once a layer (the MoE's is the all-to-all's combine)
    msg = t * q["h"] * 2
    assert got["tp_comm"] == pytest.approx(q["layers"] * (2 * 1 / 2 * msg / INTRA + 2 * 1 * INTRA_HOP) * 1e3,
                                           rel=1e-9)


def test_redundant_experts_are_slots_of_their_own():
    """Qwen3-30B-A3B (128 experts) with 8 redundant copies: 136 slots. ep 12 divides neither 128 nor
    136 (refused, naming both), ep 17 divides 136. On 8 devices (tp 1 x 8 ranks, ep 8) a device holds
    17 slots, each used by a token with chance k / 136 (a copy takes its share of its expert's
    tokens): the expert op prices them, and the weights grow by one expert a device; nothing else
    changes."""
    from latency import ParallelSpec, load_model

    spec = load_model("Qwen/Qwen3-30B-A3B")
    with pytest.raises(ValueError, match=r"ep=12 must divide the 128 \+ 8 redundant experts"):
        ParallelSpec(tp=1, ep=12, attention_dp=12, redundant_experts=8).validate(spec)
    with pytest.raises(ValueError, match="needs expert parallelism"):
        ParallelSpec(tp=8, redundant_experts=8)
    ParallelSpec(tp=1, ep=17, attention_dp=17, redundant_experts=8).validate(spec)  # 136 = 17 x 8
    plain = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=8, attention_dp=8, quantization="bf16")
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=8, attention_dp=8, quantization="bf16",
                             redundant_experts=8)
    t, h, k, slots, layers = 16, 2048, 8, 136, 48
    expert, router = 3 * h * 768, h * 128
    routed = 8 * t
    active = touched(k, slots, routed)
    weights = (slots / 8) * active * expert * 2 + router * 2
    busiest = 1.2 * routed * k / 8
    moe = layers * roof_ms(2 * (busiest * expert + t * router), weights + (2 * t + 2 * busiest) * h * 2)
    got, before = _by_op(lm, ForwardKey(True, t, 1, 2048)), _by_op(plain, ForwardKey(True, t, 1, 2048))
    assert got["moe"] == pytest.approx(moe, rel=1e-9)
    assert {op: ms for op, ms in got.items() if op != "moe"} == pytest.approx(
        {op: ms for op, ms in before.items() if op != "moe"}, rel=1e-12)
    grown = lm.weights_bytes - plain.weights_bytes
    assert grown == pytest.approx(layers * expert * 2, rel=1e-9)  # one more expert a device, every MoE layer
    assert lm.fingerprint != plain.fingerprint


def test_an_all_to_all_beyond_a_node_sends_one_copy_per_remote_node():
    """Qwen3-30B-A3B on 16 TEST_DEVICEs (nodes of 8): attention tp 1 x 16 ranks, experts over ep 16.
    A token's k = 8 copies go to 16 devices evenly: 7/16 of them to peers in its node over NVLink;
    the other node gets one copy over the network unless all 8 experts are local (1 - (1/2)^8),
    both at once; one round latency (the slower link's) each way."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=16, attention_dp=16, quantization="bf16")
    t, h, k, layers = 16, 2048, 8, 48
    tokens = t * h * 2
    each_way = max(tokens * k * 7 / 16 / INTRA, tokens * (1 - 0.5 ** 8) / INTER) + INTER_HOP
    assert _by_op(lm, ForwardKey(True, t, 1, 2048))["ep_comm"] == pytest.approx(layers * 2 * each_way * 1e3,
                                                                                 rel=1e-9)


def test_attention_dp_with_wide_ep_routes_every_rank_s_tokens_over_all_devices():
    """Qwen3-30B-A3B on 8 devices: attention tp 1 x 8 ranks, experts over ep 8 (16 each, whole).
    One rank's step of 16 decodes: its attention is a one-device attention of 16 requests; the MoE
    layer routes the 8 ranks' 128 tokens over 8 devices; the all-to-all spans 8 devices (one node)."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=8, attention_dp=8, quantization="bf16")
    t, h, k, n_exp, layers = 16, 2048, 8, 128, 48
    expert, router = 3 * h * 768, h * n_exp
    routed = 8 * t
    active = touched(k, n_exp, routed)
    weights = (n_exp / 8) * active * expert * 2 + router * 2
    busiest = 1.2 * routed * k / 8
    moe = layers * roof_ms(2 * (busiest * expert + t * router), weights + (2 * t + 2 * busiest) * h * 2)
    msg = t * h * 2
    ep_comm = layers * 2 * (msg * k * 7 / 8 / INTRA + INTRA_HOP) * 1e3
    got = _by_op(lm, ForwardKey(True, t, 1, 2048))
    assert got["moe"] == pytest.approx(moe, rel=1e-9)
    assert got["ep_comm"] == pytest.approx(ep_comm, rel=1e-9)
    assert "tp_comm" not in got  # attention tp 1: nothing to all-reduce
    one = _by_op(build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, quantization="bf16"),
                 ForwardKey(True, t, 1, 2048))
    assert got["attention"] == pytest.approx(one["attention"], rel=1e-12)  # a rank's attention is its own
    assert got["qkv_proj"] == pytest.approx(one["qkv_proj"], rel=1e-12)
    # without EP the experts are split 8 ways by tensor parallelism: every rank's tokens are gathered
    # and the results reduce-scattered over the 8 devices
    tp_moe = _by_op(build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, attention_dp=8,
                                        quantization="bf16"), ForwardKey(True, t, 1, 2048))
    gather = 2 * 7 / 8 * (8 * msg) / INTRA + 2 * 7 * INTRA_HOP
    assert tp_moe["ep_comm"] == pytest.approx(layers * gather * 1e3, rel=1e-9)
    weights = n_exp * active * expert / 8 * 2 + router * 2  # the experts read, an eighth of each
    flops = 2 * (routed * k / 8 * expert + t * router)
    assert tp_moe["moe"] == pytest.approx(layers * roof_ms(flops, weights + (2 * t + 2 * routed * k / 8) * h * 2),
                                          rel=1e-9)


def test_a_layout_the_engines_cannot_build_is_refused():
    from latency import ParallelSpec, load_model

    qwen, llama = load_model("Qwen/Qwen3-30B-A3B"), load_model("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ValueError, match="ep=3 must divide tp x attention_dp = 8"):
        ParallelSpec(tp=2, ep=3, attention_dp=4)
    with pytest.raises(ValueError, match="attention_dp=2 needs a MoE model"):
        ParallelSpec(tp=1, attention_dp=2).validate(llama)
    with pytest.raises(ValueError, match="ep=256 must divide the 128 experts"):
        ParallelSpec(tp=32, ep=256, attention_dp=8).validate(qwen)
    assert ParallelSpec(tp=2, ep=8, attention_dp=4).moe_tp == 1 and ParallelSpec(tp=2, ep=2, attention_dp=4).moe_tp == 4


def test_pipeline_and_inter_node_links():
    t = 128
    msg = t * H * 2
    pp = _by_op(build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "TEST_DEVICE", tp=2, pp=2,
                                    quantization="bf16"), ForwardKey(False, 1, t, t))
    assert pp["pp_comm"] == pytest.approx((msg / INTRA + INTRA_HOP) * 1e3, rel=1e-9)  # one hand-over, 2 stages
    wide = _by_op(build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "TEST_DEVICE", tp=16, quantization="bf16"),
                  ForwardKey(False, 1, t, t))
    ring = 2 * 15 / 16 * msg / INTER + 2 * 15 * INTER_HOP  # 16 devices span two nodes of 8
    assert wide["tp_comm"] == pytest.approx(2 * L * ring * 1e3, rel=1e-9)


def test_mla_attention_reads_the_latent_and_absorbs_in_decode():
    """DeepSeek-V3 at tp 8 (61 layers, hidden 7168, 128 heads; q LoRA 1536, KV latent 512 + rope 64,
    nope 128, v 128): the projections and attention of 8 requests decoding at context 4096, and of
    one 1024-token chunk after 1024 cached tokens (which re-expands the cached latent into K and V)."""
    lm = build_latency_model("deepseek-ai/DeepSeek-V3", "TEST_DEVICE", tp=8, quantization="bf16")
    h, heads, layers, tp = 7168, 128, 61, 8
    kv_b = 512 * heads * (128 + 128) / tp
    qkv = h * 1536 + 1536 * heads * (128 + 64) / tp + h * (512 + 64) + kv_b
    o = heads * 128 * h / tp

    def linear(params, t):
        return roof_ms(2 * t * params, params * 2 + t * 2 * h * 2)

    c, ctx = 8, 4096
    dev_heads, latent = heads / tp, 512 + 64
    att = roof_ms(2 * c * ctx * dev_heads * (latent + 512), c * (ctx * latent * 2 + dev_heads * (latent + 512) * 2))
    got = _by_op(lm, ForwardKey(True, c, 1, ctx))
    assert got["qkv_proj"] == pytest.approx(layers * linear(qkv, c), rel=1e-9)
    assert got["o_proj"] == pytest.approx(layers * linear(o, c), rel=1e-9)
    assert got["attention"] == pytest.approx(layers * att, rel=1e-9)
    q, s = 1024, 2048
    pairs = q * (s - q) + q * (q + 1) / 2
    flops = 2 * pairs * dev_heads * (192 + 128) + 2 * (s - q) * kv_b
    att = roof_ms(flops, s * latent * 2 + q * dev_heads * (192 + 128) * 2)
    assert _by_op(lm, ForwardKey(False, 1, q, s))["attention"] == pytest.approx(layers * att, rel=1e-9)


def test_deepseek_moe_layer_with_its_shared_expert_and_dense_prefix():
    """DeepSeek-V3 at tp 8 (ep 1): 3 dense layers, 58 MoE layers of 256 routed experts (8 a token) of
    3 x 7168 x 2048 plus one shared expert of the same size, router 7168 x 256; 8 decodes."""
    lm = build_latency_model("deepseek-ai/DeepSeek-V3", "TEST_DEVICE", tp=8, quantization="bf16")
    t, h, k, n_exp, tp = 8, 7168, 8, 256, 8
    expert, router, shared = 3 * h * 2048, h * n_exp, 1 * 3 * h * 2048 / tp
    active = touched(k, n_exp, t)
    weights = n_exp * active * expert / tp * 2 + (shared + router) * 2  # the experts read, an eighth of each
    per_device = t * k / tp  # no EP: no imbalance
    moe = 58 * roof_ms(2 * (per_device * expert + t * (shared + router)), weights + (2 * t + 2 * per_device) * h * 2)
    got = _by_op(lm, ForwardKey(True, t, 1, 4096))
    assert got["moe"] == pytest.approx(moe, rel=1e-9)
    dense = 3 * roof_ms(2 * t * 3 * h * 18432 / tp, 3 * h * 18432 / tp * 2 + t * 2 * h * 2)
    assert got["mlp"] == pytest.approx(dense, rel=1e-9)
    vocab = 129280
    lm_head = roof_ms(2 * t * vocab * h / tp, vocab * h / tp * 2 + t * (h + vocab / tp * 4 / 2) * 2)
    assert got["lm_head"] == pytest.approx(lm_head, rel=1e-9)  # tp splits the vocabulary


def test_two_expert_groups_wait_for_the_busier_one():
    """ep 2 of tp 2 (Qwen3-30B-A3B): the busier group computes 1.2 x its even share of 64 tokens' pairs."""
    two = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=2, ep=2, quantization="bf16")
    t, h, k = 64, 2048, 8
    expert, router = 3 * h * 768, h * 128
    active = touched(k, 128, t)
    busiest = 1.2 * t * k / 2
    weights = 64 * active * expert * 2 + router * 2  # 64 local experts, whole
    moe = 48 * roof_ms(2 * (busiest * expert + t * router), weights + (2 * t + 2 * busiest) * h * 2)
    assert _by_op(two, ForwardKey(True, t, 1, 1024))["moe"] == pytest.approx(moe, rel=1e-9)


def test_mla_without_a_query_lora_projects_queries_directly(tmp_path):
    """A DeepSeek-V2-Lite-like config (q_lora_rank 0): q is one hidden x heads x (nope + rope) matrix."""
    import json

    from latency import load_model

    config = {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4, "intermediate_size": 10944,
              "vocab_size": 102400, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    lm = build_latency_model(load_model(tmp_path), "TEST_DEVICE", tp=2, quantization="bf16")
    q = 2048 * 16 * (128 + 64) / 2
    kv_b = 512 * 16 * (128 + 128) / 2
    assert lm.qkv_params == pytest.approx(q + 2048 * (512 + 64) + kv_b)
    assert lm.kv_bytes_per_token == 4 * (512 + 64) * 2  # the latent, whole on every rank


def test_edges_of_pricing_and_memory(lm):
    assert lm.latency_ms([]).shape == (0,) and lm.step_latency_ms([]).shape == (0,)
    bd = lm.breakdown([ForwardKey(False, 1, 2048, 2048)])
    assert bd["share"].sum() == pytest.approx(1.0) and (bd["share"] == bd["ms"] / bd["ms"].sum()).all()
    huge = build_latency_model("deepseek-ai/DeepSeek-V3", "H100_SXM", quantization="bf16")
    assert huge.memory_for(8192).kv_capacity_tokens == 0  # 671B on one device: nothing fits
    free = build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "H100_SXM", reserved_memory_gb=0.0)
    assert free.memory_for(8192).reserved_gib == 0.0
    with pytest.raises(ValueError, match="reserved_memory_gb must be >= 0, got -1"):
        build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "H100_SXM", reserved_memory_gb=-1)


def test_skewed_routing_touches_k_experts_for_one_token_and_fewer_than_even_routing_for_a_batch():
    """One token picks k distinct experts whatever the skew (its odds sum to k); a batch touches fewer experts
    than even routing (1 - (1 - k / n)^t), more as it grows, and all of them in the end; without skew it is even
    routing exactly. The roofline's share is the hand-rolled one."""
    from latency.routing import touched_share

    for k, n in ((8, 256), (4, 128), (8, 384), (2, 8)):
        assert n * touched_share(k, n, 1) == pytest.approx(k, rel=1e-12)
        shares = [touched_share(k, n, t) for t in (1, 4, 16, 64, 256, 4096, 10**6)]
        assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0, abs=1e-6)
        for t, share in zip((4, 16, 64), shares[1:4], strict=True):
            assert share < 1 - (1 - k / n) ** t
            assert share == pytest.approx(touched(k, n, t), rel=1e-12)
        assert list(touched_share(k, n, np.array([1.0, 16.0]))) == pytest.approx(shares[:3:2], rel=1e-12)
        assert touched(k, n, 16, skew=0) == pytest.approx(1 - (1 - k / n) ** 16, rel=1e-12)


def test_moe_prefill_is_bound_by_the_expert_gemms():
    """Qwen3-30B-A3B on one device, a 16384-token prefill: 16384 x 8 token-expert pairs of 3 x 2048 x 768
    plus the router over 16384 tokens, all 128 experts read; compute-bound, so every flop counts."""
    lm = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", quantization="bf16")
    t, h, k, n_exp, layers = 16384, 2048, 8, 128, 48
    expert, router = 3 * h * 768, h * n_exp
    flops = 2 * (t * k * expert + t * router)
    weights = n_exp * touched(k, n_exp, t) * expert * 2 + router * 2
    assert flops / PEAK > (weights + (2 * t + 2 * t * k) * h * 2) / BW  # the GEMMs bind, not the bytes
    got = _by_op(lm, ForwardKey(False, 1, t, t))
    assert got["moe"] == pytest.approx(layers * roof_ms(flops, weights + (2 * t + 2 * t * k) * h * 2), rel=1e-9)


def test_attention_dp_ranks_pay_the_engine_s_per_step_time_of_dp():
    """An engine's `dp_step_ms` (the DP ranks agreeing on each step) is added to every step of a layout
    with attention DP, once a step, and to no other: 1.5 ms a step, 20 us a request, 3 ms with DP."""
    from latency import EngineProfile, build_latency_model

    engine = EngineProfile("test", step_ms=1.5, request_us=20.0, dp_step_ms=3.0)
    key = ForwardKey(True, 8, 1, 2048)
    plain = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=2, ep=2, engine=engine)
    ranks = build_latency_model("Qwen/Qwen3-30B-A3B", "TEST_DEVICE", tp=1, ep=2, attention_dp=2, engine=engine)
    assert _by_op(plain, key)["overhead"] == pytest.approx(1.5 + 8 * 20e-3, rel=1e-12)
    assert _by_op(ranks, key)["overhead"] == pytest.approx(1.5 + 3.0 + 8 * 20e-3, rel=1e-12)
