"""What the latency package reads, pinned: shipped model configs against their published shapes,
the exact message of every bad device or model file, the range wording, and the memory of a step
computed by hand."""

import json

import pytest

from latency import build_latency_model, load_device, load_model
from latency.checks import describe
from latency.device import DATA as DEVICE_DATA
from latency.device import DEVICE_PATH_ENV

# (hidden, layers, heads, kv heads, head dim, intermediate, vocab, experts, per token, expert width,
#  shared, dense layers, q LoRA, KV LoRA, nope, rope, v, context): the models' published config.json
PUBLISHED = {
    "Qwen/Qwen3-8B": (4096, 36, 32, 8, 128, 12288, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40960),
    "Qwen/Qwen3-32B": (5120, 64, 64, 8, 128, 25600, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40960),
    "Qwen/Qwen3-30B-A3B": (2048, 48, 32, 4, 128, 6144, 151936, 128, 8, 768, 0, 0, 0, 0, 0, 0, 0, 40960),
    "Qwen/Qwen3-235B-A22B": (4096, 94, 64, 4, 128, 12288, 151936, 128, 8, 1536, 0, 0, 0, 0, 0, 0, 0, 40960),
    "meta-llama/Llama-3.1-8B-Instruct": (4096, 32, 32, 8, 128, 14336, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         131072),
    "meta-llama/Llama-3.1-70B-Instruct": (8192, 80, 64, 8, 128, 28672, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          131072),
    "deepseek-ai/DeepSeek-V3": (7168, 61, 128, 128, 56, 18432, 129280, 256, 8, 2048, 1, 3, 1536, 512, 128, 64,
                                128, 163840),
    "meta-llama/Llama-3.1-405B-Instruct": (16384, 126, 128, 8, 128, 53248, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           131072),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (6144, 62, 96, 8, 128, 8192, 151936, 160, 8, 2560, 0, 0, 0, 0, 0, 0, 0,
                                            262144),
    "openai/gpt-oss-20b": (2880, 24, 64, 8, 64, 2880, 201088, 32, 4, 2880, 0, 0, 0, 0, 0, 0, 0, 131072),
    "Qwen/Qwen3-0.6B": (1024, 28, 16, 8, 128, 3072, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40960),
    "Qwen/Qwen3-1.7B": (2048, 28, 16, 8, 128, 6144, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40960),
    "Qwen/Qwen3-4B": (2560, 36, 32, 8, 128, 9728, 151936, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40960),
    "XiaomiMiMo/MiMo-7B-Base": (4096, 36, 32, 8, 128, 11008, 151680, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768),
    # 288 routed experts of 1,280 and one shared, after 3 dense layers; 33 of 45 layers slide over 512 tokens
    "stepfun-ai/Step-3.7-Flash": (4096, 45, 64, 8, 128, 11264, 128896, 288, 8, 1280, 1, 3, 0, 0, 0, 0, 0, 65536),
    # Mixtral: 8 experts of the dense width, 2 a token, every layer sparse
    "mistralai/Mixtral-8x7B-v0.1": (4096, 32, 32, 8, 128, 14336, 32000, 8, 2, 14336, 0, 0, 0, 0, 0, 0, 0, 32768),
    "mistralai/Mixtral-8x22B-v0.1": (6144, 56, 48, 8, 128, 16384, 32000, 8, 2, 16384, 0, 0, 0, 0, 0, 0, 0, 65536),
    # Qwen2.5 Instruct (QKV bias not priced) and Llama 3.2's small models, their embedding shared with the output
    "Qwen/Qwen2.5-7B-Instruct": (3584, 28, 28, 4, 128, 18944, 152064, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768),
    "Qwen/Qwen2.5-14B-Instruct": (5120, 48, 40, 8, 128, 13824, 152064, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768),
    "Qwen/Qwen2.5-32B-Instruct": (5120, 64, 40, 8, 128, 27648, 152064, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768),
    "Qwen/Qwen2.5-72B-Instruct": (8192, 80, 64, 8, 128, 29568, 152064, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768),
    "meta-llama/Llama-3.2-1B-Instruct": (2048, 16, 32, 8, 64, 8192, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072),
    "meta-llama/Llama-3.2-3B-Instruct": (3072, 28, 24, 8, 128, 8192, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072),
    # DeepSeek-V3's layers with 384 experts, 64 heads and one dense layer
    "moonshotai/Kimi-K2-Instruct": (7168, 61, 64, 64, 112, 18432, 163840, 384, 8, 2048, 1, 1, 1536, 512, 128, 64,
                                    128, 131072),
}
#: the small Qwen3 models share their embedding with the output layer
TIED = {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.2-1B-Instruct",
        "meta-llama/Llama-3.2-3B-Instruct"}
FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
          "num_experts", "experts_per_token", "moe_intermediate_size", "num_shared_experts", "num_dense_layers",
          "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
          "max_position_embeddings")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_models_read_as_published(name):
    spec = load_model(name)
    assert tuple(getattr(spec, f) for f in FIELDS) == PUBLISHED[name]
    assert spec.name == name and spec.tie_word_embeddings is (name in TIED)


def test_moe_layer_rules_of_each_config_family(tmp_path):
    """DeepSeek names its experts n_routed_experts and its dense prefix first_k_dense_replace; Qwen-MoE
    makes layer i sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8, "intermediate_size": 128,
            "vocab_size": 100, "moe_intermediate_size": 32, "num_experts_per_tok": 2}

    def parse(**extra):
        (tmp_path / "config.json").write_text(json.dumps({**base, **extra}))
        return load_model(tmp_path)

    ds = parse(n_routed_experts=16, first_k_dense_replace=2, n_shared_experts=2, mlp_only_layers=[5])
    assert (ds.num_experts, ds.num_dense_layers, ds.num_moe_layers, ds.num_shared_experts) == (16, 2, 6, 2)
    qwen = parse(num_experts=16, decoder_sparse_step=2, mlp_only_layers=[1])
    assert (qwen.num_experts, qwen.num_dense_layers) == (16, 5)  # layers 0, 2, 4, 6 by the step, 1 as listed
    qwen = parse(num_experts=16, decoder_sparse_step=1, mlp_only_layers=[0, 7])
    assert qwen.num_dense_layers == 2 and qwen.experts_per_token == 2 and qwen.moe_intermediate_size == 32
    dense = parse(num_experts_per_tok=2)  # no experts: the MoE fields stay 0
    assert (dense.num_experts, dense.experts_per_token, dense.moe_intermediate_size, dense.num_dense_layers) == \
        (0, 0, 0, 0)
    assert dense.num_kv_heads == 4 and dense.head_dim == 16  # defaults: MHA, hidden / heads
    assert parse(tie_word_embeddings=True).vocab_params == 100 * 64
    assert parse(num_key_value_heads=2, head_dim=8).head_dim == 8
    with pytest.raises(ValueError, match="^model 'tmp_path[^']*'|experts_per_token must be in \\[1, 16\\]"):
        parse(num_experts=16, num_experts_per_tok=17)
    with pytest.raises(ValueError, match="moe_intermediate_size must be >= 1"):
        parse(num_experts=16, moe_intermediate_size=0)
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        parse(vocab_size=0)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in base.items() if k != "vocab_size"}))
    with pytest.raises(ValueError, match="lacks 'vocab_size'"):
        load_model(tmp_path)


@pytest.mark.parametrize("args, words", [
    ((True,), "an integer"),
    ((False,), "a number"),
    ((True, 1), "an integer >= 1"),
    ((False, 0, None, True), "a number > 0"),
    ((False, None, 1), "a number <= 1"),
    ((False, None, 1, False, True), "a number < 1"),
    ((False, 0, 1), "a number in [0, 1]"),
    ((False, 0, 1, True, True), "a number in (0, 1)"),
    ((True, 2, 8, False, True), "an integer in [2, 8)"),
    ((False, 0.5, 1.5, True, False), "a number in (0.5, 1.5]"),
])
def test_ranges_read_the_same_everywhere(args, words):
    assert describe(*args) == words


GOOD = (DEVICE_DATA / "H200_SXM.toml").read_text().replace('name = "H200_SXM"', 'name = "MINE"')


@pytest.mark.parametrize("edit, message", [
    (lambda t: t + "\n[[broken", "device file {p}: "),
    (lambda t: t.replace("hbm_gib = 140.4", "hbm_gib = -1"), "device file {p}: [memory] hbm_gib must be a number >= 0, "
                                                           "got -1"),
    (lambda t: t.replace("hbm_gib = 140.4", "hbm_gib = true"), "[memory] hbm_gib must be a number >= 0, got True"),
    (lambda t: t.replace("hbm_gib = 140.4", ""), "[memory] hbm_gib must be a number >= 0, got None"),
    (lambda t: t.replace("hbm_gib = 140.4", "hbm_gib = 0"), "device file {p}: [memory] hbm_gib must be > 0"),
    (lambda t: t.replace("devices_per_node = 8", "devices_per_node = 0"), "[interconnect] devices_per_node must be "
                                                                          "> 0"),
    (lambda t: t.replace("gemm = 0.78", "gemm = 0"), "device file {p}: [efficiency] gemm must be in (0, 1], got 0"),
    (lambda t: t.replace("memory = 0.", "memory = 1."), "[efficiency] memory must be in (0, 1], got 1."),
    (lambda t: t.replace('name = "MINE"', 'name = "OTHER"'), "device file {p}: name 'OTHER' must match the file "
                                                             "name 'MINE'"),
    (lambda t: t.replace('quantization = "bf16"', 'quantization = "W3A3"'), "device file {p}: [defaults] "
     "quantization: unknown "
                                                             "quantization 'W3A3'"),
    (lambda t: t.replace("[interconnect]", "[interconnect]\nscale_up_devices = 1.5"),
     "device file {p}: [interconnect] scale_up_devices must be an integer >= 0 (0 = one node), got 1.5"),
])
def test_every_bad_device_file_is_one_message_naming_file_table_and_key(tmp_path, monkeypatch, edit, message):
    path = tmp_path / "MINE.toml"
    path.write_text(edit(GOOD))
    monkeypatch.setenv(DEVICE_PATH_ENV, str(tmp_path))
    with pytest.raises(ValueError) as err:
        load_device("MINE")
    assert message.format(p=path) in str(err.value)


def test_a_good_device_file_keeps_its_name_source_defaults_and_scale_up(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_PATH_ENV, str(tmp_path))
    (tmp_path / "MINE.toml").write_text(GOOD.replace("[interconnect]", "[interconnect]\nscale_up_devices = 72"))
    dev = load_device("MINE")
    assert (dev.name, dev.default_quantization, dev.scale_up_domain) == ("MINE", "bf16", 72)
    assert dev.source == load_device("H200_SXM").source != ""
    assert load_device("H200_SXM").scale_up_domain == 8  # not given: one node
    (tmp_path / "MINE.toml").write_text(GOOD.replace('quantization = "bf16"', 'quantization = "FP8"'))
    assert load_device("MINE").default_quantization == "FP8"
    bare = "\n".join(line for line in GOOD.splitlines() if "[defaults]" not in line and "quantization" not in line)
    (tmp_path / "MINE.toml").write_text(bare.replace("source = ", "# "))
    assert (load_device("MINE").default_quantization, load_device("MINE").source) == ("bf16", "")
    assert load_device("ATLAS_800_A3_752T_128G_DIE").scale_up_domain == 768


def test_an_a3_die_is_half_a_910c_package():
    """ATLAS_800_A3_752T_128G_DIE is one die (16 a node, as CloudMatrix deploys them); the id's 752
    TFLOPS FP16, 128 GB and the package's 3.2 TB/s are two dies', as the Ascend tool's device of this
    name holds them (376 TFLOPS, 64 GiB, 1.6 TB/s a die)."""
    die = load_device("ATLAS_800_A3_752T_128G_DIE")
    assert 2 * die.peak_flops("fp16") == 752e12 and 2 * die.peak_flops("int8") == 1504e12
    assert (2 * die.hbm_gib, 2 * die.hbm_bytes_per_s) == (128, 3.2e12)
    assert die.devices_per_node == 16


def test_activation_and_kv_capacity_by_hand():
    """Llama-3.1-8B, tp 2, bf16 on H200 (131.3 GiB, 10 GiB reserved), a 4096-token step: activations are
    the tokens x (2 x hidden + the widest intermediate: gate+up over tp = 14336) x 2 bytes, plus
    fp32 logits of min(4096, 1024) rows over half the vocabulary."""
    lm = build_latency_model("meta-llama/Llama-3.1-8B-Instruct", "H200_SXM", tp=2)
    t, h = 4096, 4096
    act = t * (2 * h + 2 * 14336 / 2) * 2 + 1024 * 128256 / 2 * 4
    assert lm.activation_bytes(t) == pytest.approx(act, rel=1e-12)
    kv_per_token = 32 * 2 * (8 / 2) * 128 * 2  # layers x (K, V) x KV heads per device x head dim x bf16
    assert lm.kv_bytes_per_token == kv_per_token
    qkv = h * 128 * (32 / 2 + 2 * 8 / 2)
    per_layer = (qkv + 32 / 2 * 128 * h + 3 * h * 14336 / 2) * 2
    weights = 32 * per_layer + 2 * 128256 * h / 2 * 2  # untied embeddings and LM head, bf16
    assert lm.weights_bytes == pytest.approx(weights, rel=1e-12)
    pic = lm.memory_for(t)
    free = 140.4 * 2**30 - 10 * 2**30 - weights - act
    assert pic.kv_capacity_tokens == int(free // kv_per_token)
    assert (pic.hbm_gib, pic.reserved_gib) == (140.4, 10.0)
    assert pic.activation_gib == pytest.approx(act / 2**30) and pic.weights_gib == pytest.approx(weights / 2**30)
    moe = build_latency_model("Qwen/Qwen3-30B-A3B", "H200_SXM", tp=4, ep=4)
    widest = max(moe.qkv_params / 2048, 2 * 8 * 768 / 4)  # no dense layer: q/k/v width vs routed gate+up
    assert moe.activation_bytes(512) == pytest.approx(512 * (2 * 2048 + widest) * 2 + 512 * 151936 / 4 * 4,
                                                      rel=1e-12)


def test_an_engine_profile_names_a_bad_frontend_or_moe_key(tmp_path, monkeypatch):
    import latency.engine as engine

    monkeypatch.setattr(engine, "DATA", tmp_path)
    engine._load.cache_clear()
    (tmp_path / "odd.toml").write_text('step_ms = 1.0\n[frontend]\nclient_ms = 10\nthink_ms = 3\n')
    with pytest.raises(ValueError, match=r"odd.toml: \[frontend\] has unknown keys \['think_ms'\]"):
        engine.load_engine("odd")
    (tmp_path / "odd2.toml").write_text('[frontend]\nlookahead_steps = 2\n')
    with pytest.raises(ValueError, match="lookahead_steps"):
        engine.load_engine("odd2")
    (tmp_path / "odd4.toml").write_text('[frontend]\nrequests_per_client = 2.5\n')
    with pytest.raises(ValueError, match=r"odd4.toml: \[frontend\] requests_per_client.*2.5"):
        engine.load_engine("odd4")
    (tmp_path / "odd3.toml").write_text('[moe]\nbandwidth = 0\n')
    with pytest.raises(ValueError, match=r"\[moe\] bandwidth"):
        engine.load_engine("odd3")
    (tmp_path / "ok.toml").write_text('[frontend]\nclient_ms = 10\n[moe]\ncompute = 0.5\n')
    got = engine.load_engine("ok")
    assert dict(got.frontend) == {"client_ms": 10} and got.moe_compute == 0.5 and got.moe_bandwidth == 1.0
    assert got.moe_fp4_bandwidth == 0.0 and got.expert_bandwidth(True) == 1.0  # not said: as bandwidth
    (tmp_path / "fp4.toml").write_text('[moe]\nbandwidth = 0.6\nfp4_bandwidth = 0.8\n')
    got = engine.load_engine("fp4")
    assert (got.expert_bandwidth(False), got.expert_bandwidth(True)) == (0.6, 0.8)
    (tmp_path / "odd5.toml").write_text('[moe]\nfp4_bandwidth = -0.1\n')
    with pytest.raises(ValueError, match=r"odd5.toml: \[moe\] fp4_bandwidth"):
        engine.load_engine("odd5")
    (tmp_path / "odd6.toml").write_text('[moe]\nfp8_bandwidth = 0.5\n')
    with pytest.raises(ValueError, match=r"known: compute, bandwidth, fp4_bandwidth"):
        engine.load_engine("odd6")
    assert got.scheduler == "" and got.layer_us == 0.0  # not said
    (tmp_path / "deep.toml").write_text('layer_us = 14.5\n')
    assert engine.load_engine("deep").overhead_ms(0, 0, 64) == pytest.approx(14.5 * 64 / 1000)
    (tmp_path / "odd7.toml").write_text('layer_us = -1\n')
    with pytest.raises(ValueError, match=r"odd7.toml: layer_us"):
        engine.load_engine("odd7")
    (tmp_path / "odd4.toml").write_text('scheduler = 3\n')
    with pytest.raises(ValueError, match="odd4.toml: scheduler = 3 is not allowed"):
        engine.load_engine("odd4")
    engine._load.cache_clear()


@pytest.mark.parametrize(("launch", "message"), [("max_num_seqs = 2.5", r"odd.toml: \[launch\] max_num_seqs"),
                                                 ("max_running = 8", "known: max_batched_tokens, max_num_seqs")])
def test_an_engine_profile_s_launch_is_read_and_checked(tmp_path, monkeypatch, launch, message):
    import latency.engine as engine

    monkeypatch.setattr(engine, "DATA", tmp_path)
    engine._load.cache_clear()
    (tmp_path / "cap.toml").write_text("[launch]\nmax_num_seqs = 100\n")
    assert (engine.load_engine("cap").max_num_seqs, engine.load_engine("cap").max_batched_tokens) == (100, 0)
    (tmp_path / "odd.toml").write_text(f"[launch]\n{launch}\n")
    with pytest.raises(ValueError, match=message):
        engine.load_engine("odd")
    engine._load.cache_clear()


def test_each_shipped_engine_names_the_step_policy_it_runs():
    from latency import load_engine
    from simulator import SCHEDULERS

    assert {e: load_engine(e).scheduler for e in ("vllm", "sglang", "trtllm")} == {
        "vllm": "token-budget", "sglang": "prefill-first", "trtllm": "token-budget"}
    assert all(load_engine(e).scheduler in SCHEDULERS for e in ("vllm", "sglang", "trtllm"))
    assert load_engine("none").scheduler == ""


def test_an_engine_profile_s_fp8_kv_cache_and_dp_step_ms_are_checked(tmp_path, monkeypatch):
    """`fp8_kv_cache` is read as given (vLLM's and TensorRT-LLM's say true, SGLang's nothing: false);
    a value that is not true or false, or a negative `dp_step_ms`, is refused naming the file and key."""
    import latency.engine as engine
    from latency import load_engine

    assert (load_engine("vllm").fp8_kv_cache, load_engine("trtllm").fp8_kv_cache,
            load_engine("sglang").fp8_kv_cache) == (True, True, False)
    (tmp_path / "odd.toml").write_text('name = "odd"\nfp8_kv_cache = "yes"\n')
    monkeypatch.setattr(engine, "DATA", tmp_path)
    engine._load.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"odd.toml: fp8_kv_cache = 'yes' is not allowed; expected true or false"):
            load_engine("odd")
        (tmp_path / "slow.toml").write_text('name = "slow"\ndp_step_ms = -1\n')
        with pytest.raises(ValueError, match=r"slow.toml: dp_step_ms"):
            load_engine("slow")
        (tmp_path / "eager.toml").write_text('name = "eager"\nmoe_prefill_layer_us = -300\n')
        with pytest.raises(ValueError, match=r"eager.toml: moe_prefill_layer_us"):
            load_engine("eager")
        (tmp_path / "greedy.toml").write_text('name = "greedy"\ngpu_memory_utilization = 1.2\n')
        greedy = r"greedy.toml: gpu_memory_utilization must be a number in \[0, 1\], got 1.2"
        with pytest.raises(ValueError, match=greedy):
            load_engine("greedy")
    finally:
        engine._load.cache_clear()


@pytest.mark.parametrize(("text", "refused"), [
    ("reserved_gib = [[60, 5], [40, 9]]", r"reserved_gib = .* is not allowed; .*rising"),
    ("reserved_gib = [[60, -1]]", r"reserved_gib = .* is not allowed; .*GiB >= 0"),
    ("reserved_gib = [[0, 5]]", r"reserved_gib = .* is not allowed; .*bounds > 0"),
    ("reserved_gib = [[nan, 5]]", r"reserved_gib = .* is not allowed; .*bounds > 0"),
    ("reserved_gib = [60, 5]", r"reserved_gib = .* is not allowed; expected \[\[HBM below"),
    ('reserved_gib = [[60, "5"]]', r"reserved_gib = .* is not allowed; expected \[\[HBM below"),
    ("reserve = 8", r"\[memory\] has unknown keys \['reserve'\]"),
    ('rule = "vllm"', r"\[memory\] rule = 'vllm' is not allowed; expected one of sglang"),
    ('rule = "sglang"\nreserved_gib = [[inf, 8]]', r"gpu_memory_utilization, \[memory\] reserved_gib and \[memory\] "
                                                 r"rule each say"),
    ("reserved_gib = [[inf, 8]]\n[launch]\nmax_num_seqs = 8", None),
    ("reserved_gib = [[inf, 8]]\nfree_fraction = 0", r"free_fraction must be a number in \(0, 1\], got 0"),
    ("reserved_gib = [[inf, 8]]\nfree_fraction = 1.5", r"free_fraction must be a number in \(0, 1\], got 1.5"),
    ('reserved_gib = [[inf, 8]]\nfree_fraction = "0.9"', r"free_fraction must be a number"),
    ("reserved_gib = [[inf, 8]]\nfree_fraction = 0.9", None),
    ("reserved_gib = [[inf, 8]]\nkv_share = 0.05", r"kv_share must be a number in \[0.1, 2\], got 0.05"),
    ("reserved_gib = [[inf, 8]]\nkv_share = 2.5", r"kv_share must be a number in \[0.1, 2\], got 2.5"),
    ('reserved_gib = [[inf, 8]]\nkv_share = "half"', r"kv_share must be a number"),
    ("reserved_gib = [[inf, 8]]\nkv_share = 0.35", None),
])
def test_an_engine_profile_s_memory_table_is_checked(tmp_path, text, refused):
    """[memory] reserved_gib, (HBM below, GiB left free) pairs: the bounds > 0 and rising (the last may be inf), the
    GiB finite and >= 0; a bad one is refused naming the file and key, as is a profile that also names a memory
    utilisation (two answers to one question). A good one applies the first class whose bound exceeds the HBM."""
    from latency.engine import parse_profile

    path = tmp_path / "spare.toml"
    path.write_text(f'name = "spare"\n[memory]\n{text}\n')
    if refused:
        with pytest.raises(ValueError, match=rf"spare.toml: \[memory\] {refused}|spare.toml: {refused}"):
            parse_profile(path)
        return
    assert parse_profile(path).reserved_gib(179.1) == 8.0
    path.write_text('name = "spare"\ngpu_memory_utilization = 0.9\n[memory]\nreserved_gib = [[inf, 8]]\n')
    with pytest.raises(ValueError, match=r"spare.toml: gpu_memory_utilization, \[memory\] reserved_gib and "):
        parse_profile(path)
    path.write_text('name = "spare"\ngpu_memory_utilization = 0.9\n[memory]\nfree_fraction = 0.9\n')
    with pytest.raises(ValueError, match=r"spare.toml: \[memory\] free_fraction shares what weights leave free and "
                                         r"gpu_memory_utilization the whole GPU; keep one"):
        parse_profile(path)
    path.write_text('name = "spare"\n[memory]\nreserved_gib = [[60, 5], [inf, 12.5]]\n')
    assert [parse_profile(path).reserved_gib(h) for h in (45.0, 60.0, 179.1)] == [5.0, 12.5, 12.5]


def test_step_flash_slides_three_layers_of_four():
    """Step-3.7-Flash's layer_types: every fourth layer (0, 4, ..., 44) full, the other 33 over 512 tokens."""
    spec = load_model("stepfun-ai/Step-3.7-Flash")
    layers = (spec.num_sliding_layers, spec.sliding_window, spec.num_full_layers, spec.num_moe_layers)
    assert layers == (33, 512, 12, 42)


def test_sglang_s_reserve_by_its_own_rule_hand_computed():
    """SGLang 0.5.8's default memory fraction leaves free 512 MiB + 1.5 MiB a token of its chunk + 2 MiB a request
    of its largest CUDA graph + 1/8 GiB a GPU, with attention DP 4.5 MiB a graph request and rank (its batch above
    300), at least 10 GiB above 60 GiB: an H100 at tp 1 (chunk 8,192, graph 256) 13.125 GiB, at tp 8 (graph 512)
    14.5, 8 attention-DP ranks of tp 1 32.5; a B200 (chunk 16,384) 25.625; a 48 GiB L40S (4,096, 32) 6.6875."""
    from latency.reserve import sglang_reserved_gib

    assert sglang_reserved_gib(79.6) == (512 + 1.5 * 8192 + 2 * 256 + 128) / 1024 == 13.125
    assert sglang_reserved_gib(79.6, tp=8) == (512 + 1.5 * 8192 + 2 * 512 + 1024) / 1024 == 14.5
    assert sglang_reserved_gib(139.8, tp=1, attention_dp=8) == (14848 + 512 * 8 * 4.5) / 1024 == 32.5
    assert (sglang_reserved_gib(179.1), sglang_reserved_gib(44.4)) == (25.625, 6.6875)
    assert sglang_reserved_gib(79.6, tp=2, pp=2) == (512 + 1.5 * 8192 + 2 * 256 + 512) / 1024 == 13.5  # graph by tp
