"""Step latencies pinned to hand arithmetic from the device's and the model's numbers, op by op,
so that dropping, doubling or mispricing any op fails. Llama-3.1-8B (hidden 4096, 32 layers, 32
heads, 8 KV heads of 128, MLP 14336, vocabulary 128256) on TEST_DEVICE (bf16 353.9 TFLOP/s at 0.7,
HBM 1.759 TB/s at 0.6, attention at 0.7, no kernel or step overhead), tp 1, bf16."""

import pytest

from latency import ForwardKey, build_latency_model

PEAK = 353.9e12 * 0.7   # FLOP/s for GEMMs and attention (both 0.7 on TEST_DEVICE)
BW = 1.759e12 * 0.6     # bytes/s
H, L, HEADS, KV, D, FF, V = 4096, 32, 32, 8, 128, 14336, 128256


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
