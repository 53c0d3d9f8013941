import json
from pathlib import Path

import pytest

from latency import ParallelSpec, load_device, load_model, parse_quantization, shipped_devices, shipped_models
from latency.device import DATA as DEVICE_DATA
from latency.device import DEVICE_PATH_ENV, DeviceSpec
from latency.model import DATA as MODEL_DATA

SHIPPED = ["Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B",
           "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "deepseek-ai/DeepSeek-V3"]
DEVICES = ["TEST_DEVICE", "ATLAS_800_A2_376T_64G", "ATLAS_800_A2_313T_64G", "ATLAS_800_A2_280T_64G",
           "ATLAS_800_A3_752T_128G_DIE", "A100_SXM_80G", "H100_SXM", "H200_SXM", "B200", "GB200", "B300_SXM", "GB300",
           "L40S", "RTX_PRO_6000_SERVER", "H100_PCIE", "A100_PCIE_80G", "A30", "L4"]
#: (bf16, fp8, fp4 dense TFLOP/s, HBM GiB as nvidia-smi reports it, TB/s, GPUs on one NVLink domain): their datasheets
BLACKWELL = {"B200": (2250, 4500, 9000, 179.1, 8.0, 8), "GB200": (2500, 5000, 10000, 185.0, 8.0, 72),
             "B300_SXM": (2250, 4500, 14000, 268.6, 7.75, 8), "GB300": (2500, 5000, 15000, 277.5, 8.0, 72)}


def test_every_required_model_and_device_ships():
    assert set(SHIPPED) <= set(shipped_models())
    assert set(DEVICES) <= set(shipped_devices())
    for name in DEVICES:
        assert load_device(name).source


@pytest.mark.parametrize("name", sorted(BLACKWELL))
def test_blackwell_devices_read_as_their_datasheets(name):
    d = load_device(name)
    assert (d.bf16_tflops, d.fp8_tflops, d.fp4_tflops, d.hbm_gib, d.hbm_bandwidth_tbps,
            d.scale_up_domain) == BLACKWELL[name]
    b200 = load_device("B200")  # the same tensor cores and HBM3e: its efficiencies, no run of these measured
    assert (d.eff_gemm, d.eff_memory, d.eff_fp8_memory) == (b200.eff_gemm, b200.eff_memory, b200.eff_fp8_memory)


def test_model_kinds_parse():
    moe = load_model("Qwen/Qwen3-30B-A3B")
    assert (moe.num_experts, moe.experts_per_token, moe.num_moe_layers) == (128, 8, 48)
    ds = load_model("deepseek-ai/DeepSeek-V3")
    assert ds.is_mla and ds.num_dense_layers == 3 and ds.num_moe_layers == 58 and ds.num_shared_experts == 1
    dense = load_model("meta-llama/Llama-3.1-8B-Instruct")
    assert not dense.is_moe and dense.head_dim == 128


def test_model_from_path_and_folder(tmp_path):
    cfg = json.loads((MODEL_DATA / "Qwen--Qwen3-8B.json").read_text())
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_model(folder).hidden_size == 4096
    assert load_model(folder / "config.json").name == "my-model"


def test_unknown_model_lists_shipped():
    with pytest.raises(ValueError, match="unknown model 'nope/X'.*Qwen/Qwen3-32B"):
        load_model("nope/X")


def test_a_later_release_of_a_shipped_architecture_loads_under_its_own_name():
    """DeepSeek-R1's config.json is DeepSeek-V3's, Llama-3.3-70B's Llama-3.1-70B's; Qwen3-235B's 2507
    releases differ only in serving 262,144 positions natively."""
    import dataclasses

    for name, shipped in (("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"),
                          ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct")):
        got, same = dataclasses.asdict(load_model(name)), dataclasses.asdict(load_model(shipped))
        assert got.pop("name") == name and same.pop("name") == shipped and got == same
    later, first = load_model("Qwen/Qwen3-235B-A22B-Instruct-2507"), load_model("Qwen/Qwen3-235B-A22B")
    assert (later.max_position_embeddings, first.max_position_embeddings) == (262144, 40960)
    assert dataclasses.replace(later, name=first.name, max_position_embeddings=40960) == first
    with pytest.raises(ValueError, match="unknown model 'deepseek-ai/DeepSeek-R2'.*deepseek-ai/DeepSeek-R1"):
        load_model("deepseek-ai/DeepSeek-R2")


def test_distillations_and_base_models_load_as_the_shapes_they_keep():
    """DeepSeek-R1's Llama distillations are Llama 3.1's shapes; its Qwen ones and Qwen2.5's base models Qwen2.5
    Instruct's with 131,072 positions (the Instruct configs say 32,768 and extend by YaRN)."""
    import dataclasses

    for name, shipped, positions in (
            ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "meta-llama/Llama-3.1-70B-Instruct", 131072),
            ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "Qwen/Qwen2.5-32B-Instruct", 131072),
            ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct", 131072),
            ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct", 131072)):
        got = load_model(name)
        assert got.max_position_embeddings == positions
        assert dataclasses.replace(got, name=shipped, max_position_embeddings=0) == \
            dataclasses.replace(load_model(shipped), max_position_embeddings=0)


def test_config_missing_key_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_model(tmp_path)


def test_user_device_file_and_malformed_field(tmp_path, monkeypatch):
    text = (DEVICE_DATA / "H200_SXM.toml").read_text()
    (tmp_path / "MY_GPU.toml").write_text(text.replace('name = "H200_SXM"', 'name = "MY_GPU"'))
    (tmp_path / "BAD_GPU.toml").write_text(text.replace('name = "H200_SXM"', 'name = "BAD_GPU"')
                                           .replace("gemm = 0.78", "gemm = 1.5"))
    monkeypatch.setenv(DEVICE_PATH_ENV, str(tmp_path))
    assert load_device("MY_GPU").hbm_bandwidth_tbps == 4.8
    assert "MY_GPU" in shipped_devices()
    with pytest.raises(ValueError, match=r"BAD_GPU.toml: \[efficiency\] gemm must be in \(0, 1\], got 1.5"):
        load_device("BAD_GPU")
    with pytest.raises(ValueError, match="unknown device 'NOPE'.*H200_SXM"):
        load_device("NOPE")


def test_parallel_validation():
    qwen = load_model("Qwen/Qwen3-32B")
    ParallelSpec(tp=8).validate(qwen)
    ParallelSpec(tp=16).validate(qwen)  # 8 KV heads replicated over 16 ranks
    with pytest.raises(ValueError, match="tp=3 must divide the 64 attention heads"):
        ParallelSpec(tp=3).validate(qwen)
    with pytest.raises(ValueError, match="ep=2 needs a MoE model"):
        ParallelSpec(tp=2, ep=2).validate(qwen)
    with pytest.raises(ValueError, match="ep=4 must divide tp x attention_dp = 2"):
        ParallelSpec(tp=2, ep=4)
    with pytest.raises(ValueError, match="does not match 8 devices"):
        ParallelSpec(tp=2, dp=2).validate(qwen, num_devices=8)
    import dataclasses

    moe = dataclasses.replace(load_model("Qwen/Qwen3-30B-A3B"), num_experts=12)
    with pytest.raises(ValueError, match="ep=8 must divide the 12 experts"):
        ParallelSpec(tp=8, ep=8).validate(moe)


def test_quantization_names():
    assert parse_quantization("W8A8_DYNAMIC").weight_bytes == 1.0
    assert parse_quantization("DISABLED").compute_dtype == "bf16"
    assert parse_quantization("FP8").compute_dtype == "fp8"
    assert parse_quantization("w4a16").weight_bytes == 0.5
    assert parse_quantization("bf16", "int8").kv_bytes == 1.0
    with pytest.raises(ValueError, match="unknown quantization 'W3A3'"):
        parse_quantization("W3A3")


def test_context_length_follows_yarn_rope_scaling(tmp_path):
    config = json.loads((Path(__file__).parents[2] / "latency/data/models/Qwen--Qwen3-8B.json").read_text())
    assert load_model("Qwen/Qwen3-8B").max_position_embeddings == 40960
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(tmp_path).max_position_embeddings == 131072


def _without(text: str, *prefixes: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(prefixes))


def test_a_device_file_s_optional_keys_take_their_defaults_and_bad_prices_are_named(tmp_path):
    """No name (the file's stem), no scale-up domain (one node), no [cost] (no price), no [defaults]
    (bf16); an efficiency of exactly 1 is allowed; a price must be a number >= 0."""
    text = _without((DEVICE_DATA / "H100_SXM.toml").read_text(), "name", "[defaults]", "quantization")
    path = tmp_path / "PLAIN.toml"
    path.write_text(text.replace("gemm = 0.78", "gemm = 1"))
    d = DeviceSpec.from_file(path)
    assert (d.name, d.scale_up_devices, d.usd_per_hour, d.default_quantization, d.eff_gemm) == \
        ("PLAIN", 0, 0.0, "bf16", 1)
    priced = tmp_path / "PRICED.toml"
    priced.write_text(text + "\n[cost]\nusd_per_hour = 2.5\n")
    assert DeviceSpec.from_file(priced).usd_per_hour == 2.5
    for bad in ("-1.0", "true", '"cheap"'):
        priced.write_text(text + f"\n[cost]\nusd_per_hour = {bad}\n")
        with pytest.raises(ValueError, match=r"\[cost\] usd_per_hour must be a number >= 0, got "):
            DeviceSpec.from_file(priced)


def test_each_collective_appears_exactly_when_its_parallelism_does():
    """tp > 1 all-reduces, pp > 1 sends activations between stages, ep > 1 over attention-DP ranks
    exchanges tokens all-to-all and attention DP without EP gathers; EP under tp attention exchanges
    nothing (every device holds every token; the all-reduce sums the experts); one device communicates
    nothing."""
    from latency import ForwardKey, build_latency_model

    key = [ForwardKey(True, 8, 1, 1024)]

    def comm(model, **layout):
        ops = build_latency_model(model, "H100_SXM", **layout).breakdown(key).set_index("op")["ms"]
        return {op for op in ("tp_comm", "ep_comm", "pp_comm") if ops.get(op, 0) > 0}

    assert comm("Qwen/Qwen3-8B") == set()
    assert comm("Qwen/Qwen3-8B", tp=2) == {"tp_comm"}
    assert comm("Qwen/Qwen3-8B", pp=2) == {"pp_comm"}
    assert comm("Qwen/Qwen3-30B-A3B", ep=2, attention_dp=2) == {"ep_comm"}
    assert comm("Qwen/Qwen3-30B-A3B", attention_dp=2) == {"ep_comm"}
    assert comm("Qwen/Qwen3-30B-A3B", tp=2, ep=2) == {"tp_comm"}
    assert comm("Qwen/Qwen3-30B-A3B", tp=2, ep=4, attention_dp=2) == {"tp_comm", "ep_comm"}
