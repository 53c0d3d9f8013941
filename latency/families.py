"""How each model family's config.json says its architecture: the readers `ModelSpec.from_config` applies
(a family's own keys read as the others', its layer kinds counted, its checkpoint's format named), and the
parts we do not price, refused by name."""

from __future__ import annotations

#: config keys of architectures whose cost we do not model: each names what is missing
UNMODELLED = {
    "linear_attn_config": "linear (non-softmax) attention layers",
    "full_attn_idxs": "hybrid linear/full attention layers",
    "ssm_cfg": "state-space (Mamba) layers",
    "mamba_expand": "state-space (Mamba) layers",
    "attn_layer_period": "hybrid attention/state-space layers",
    "hybrid_override_pattern": "hybrid state-space (Mamba) and attention layers",
    "layers_block_type": "hybrid state-space (Mamba) and attention layers",
    "mamba_num_heads": "state-space (Mamba) layers",
    "compress_ratios": "compressed attention (the KV cache of some layers kept one entry per few tokens)",
    "hc_mult": "hyper-connections (several residual streams a layer)",
    "hybrid_layer_pattern": "hybrid attention layers with heads of their own",
    "sparse_attention_config": "sparse attention",
    "global_head_dim": "layers of two head sizes (global layers wider than the local ones)",
    "num_kv_shared_layers": "layers that read another layer's KV cache",
    "per_layer_input_embeddings": "per-layer input embeddings (Gemma's E models)",
}


def refuse_unknown(config: dict, name: str) -> None:
    """A config whose architecture has a part we do not price is refused, naming the part."""
    for key, what in UNMODELLED.items():
        if key in config:
            raise ValueError(f"model config {name!r} has {key!r}: servesweep does not model {what}")
    types = set(config.get("layer_types") or ())
    sparse = {"deepseek_sparse_attention"} if config.get("index_topk") else set()  # nvidia's GLM-5.2 names them
    linear = {"linear_attention"} if LINEAR_KEYS <= config.keys() else set()  # Qwen3.5's gated delta-net
    known = {"full_attention", "sliding_attention"} | sparse | linear
    unknown = types - known
    if unknown:
        raise ValueError(f"model config {name!r} has layer_types {sorted(unknown)}: servesweep models "
                         f"{', '.join(sorted(known))} layers only (linear_attention with the gated delta-net "
                         "keys, deepseek_sparse_attention with index_topk)")


def checkpoint_quantization(config: dict) -> str:
    """The format a checkpoint's `quantization_config` declares, as a quantisation name: block FP8
    (fp8; fp8+mxfp4 where its `expert_dtype` is fp4, DeepSeek-V4), MXFP4 experts (bf16+mxfp4, gpt-oss), 4-bit
    groups of compressed-tensors (int4_wo for integers, nvfp4 for floats), the linear layers kept in bf16 when
    attention is left out."""
    qc = config.get("quantization_config") or {}
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    ignored = " ".join(str(x) for x in (qc.get("ignore") or qc.get("exclude_modules")
                                        or qc.get("modules_to_not_convert") or []))
    kept = "bf16+" if "self_attn" in ignored else ""
    if method == "fp8":  # DeepSeek-V4's experts FP4 (MXFP4 scales) beside it
        return kept + "fp8" if kept else ("fp8+mxfp4" if config.get("expert_dtype") == "fp4" else "fp8")
    if method == "mxfp4":
        return "bf16+mxfp4"
    if method == "nvfp4":
        return kept + "nvfp4"
    if method == "compressed-tensors" or (not method and qc.get("config_groups")):
        weights = [g.get("weights") or {} for g in (qc.get("config_groups") or {}).values()]
        if weights and all(w.get("num_bits") == 4 for w in weights):
            if "mxfp4" in str(qc.get("format")):  # Kimi-K3's experts: MXFP4 groups of 32
                return kept + "mxfp4"
            return kept + ("nvfp4" if weights[0].get("type") == "float" else "int4_wo")
    return ""


def sliding(config: dict, layers: int) -> dict:
    """Sliding-window layers: those `layer_types` names (gpt-oss: every other layer), or all layers
    when a window is set without types (Mistral) and `use_sliding_window` is not false (Qwen)."""
    window = config.get("sliding_window") or 0
    if not window or config.get("use_sliding_window") is False:
        return {}
    types = config.get("layer_types")
    count = sum(1 for t in types if t == "sliding_attention") if types else layers
    return {"sliding_window": int(window), "num_sliding_layers": count} if count else {}


#: the keys a gated delta-net layer's shape is read from (Qwen3-Next, Qwen3.5)
LINEAR_KEYS = frozenset({"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                         "linear_value_head_dim", "linear_conv_kernel_dim"})
#: bytes of a recurrent state element by the config's `mamba_ssm_dtype` (the model's dtype where it names none)
STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def linear(config: dict) -> dict:
    """Gated delta-net layers (Qwen3.5's `linear_attention` layer_types, 3 of 4): per request a state of
    value heads x key width x value width, and a short convolution's last `linear_conv_kernel_dim` - 1
    inputs, whatever the context; full-attention layers gated where `attn_output_gate` says so."""
    gate = {"attention_output_gate": True} if config.get("attn_output_gate") else {}
    layers = sum(1 for kind in config.get("layer_types") or () if kind == "linear_attention")
    if not layers:
        return gate
    return {**gate, "num_linear_layers": layers, "linear_key_heads": int(config["linear_num_key_heads"]),
            "linear_value_heads": int(config["linear_num_value_heads"]),
            "linear_key_dim": int(config["linear_key_head_dim"]),
            "linear_value_dim": int(config["linear_value_head_dim"]),
            "linear_conv_kernel": int(config["linear_conv_kernel_dim"]),
            "linear_state_bytes": STATE_BYTES.get(str(config.get("mamba_ssm_dtype")), 2)}


def shared_experts(config: dict, name: str) -> int:
    """Shared experts: `n_shared_experts` of the routed width, or one `shared_expert_intermediate_size` wide
    (Qwen3.5) counted in routed widths (it must be a whole number of them)."""
    if not config.get("shared_expert_intermediate_size"):
        return config.get("n_shared_experts") or 0
    width, routed = config["shared_expert_intermediate_size"], config.get("moe_intermediate_size") or 0
    if not routed or width % routed:
        raise ValueError(f"model config {name!r} has a shared expert {width} wide beside routed ones {routed} wide: "
                         "servesweep models shared experts a whole number of routed widths wide")
    return width // routed


#: activations of an ungated MLP (up and down matrices only): squared ReLU (Nemotron-H)
UNGATED_ACTIVATIONS = frozenset({"relu2"})


def mlp_matrices(config: dict) -> int:
    """An MLP's (and an expert's) matrices: gate, up and down; up and down where its activation is ungated."""
    return 2 if (config.get("mlp_hidden_act") or config.get("hidden_act")) in UNGATED_ACTIVATIONS else 3


#: the key `nemotron_h` counts its MLP-free blocks under (not a config key of any family)
MLP_FREE = "_mlp_free_layers"
#: Nemotron-H's block kinds (`hybrid_override_pattern` letters, `layers_block_type` words): Mamba-2 mixer,
#: attention, MoE, dense MLP
NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}


def nemotron_h(config: dict) -> dict:
    """Nemotron-H's blocks (each a mixer or an MLP) in the keys the other families use: a layer a mixer, its
    Mamba-2 ones as recurrent layers of `mamba_num_heads` x `mamba_head_dim` x `ssm_state_size` (its B and C
    projections `n_groups` wide, as a delta-net's keys), every MLP block after one and the attention blocks
    without one. A stack of more MLP blocks than mixers is refused."""
    if config.get("model_type") != "nemotron_h":
        return config
    blocks = [NEMOTRON_BLOCKS.get(b, b) for b in (config.get("hybrid_override_pattern") or
                                                     config.get("layers_block_type") or ())]
    mixers = [b for b in blocks if b in ("mamba", "attention")]
    mlps = [b for b in blocks if b in ("moe", "mlp")]
    if len(mlps) > len(mixers) or set(blocks) - set(NEMOTRON_BLOCKS.values()):
        return config  # refused below, naming the pattern
    out = {k: v for k, v in config.items() if k not in ("hybrid_override_pattern", "layers_block_type",
                                                         "mamba_num_heads")}
    moe = mlps.count("moe")
    return {**out, "num_hidden_layers": len(mixers), MLP_FREE: len(mixers) - len(mlps),
            "layer_types": ["linear_attention" if b == "mamba" else "full_attention" for b in mixers],
            "linear_num_key_heads": config.get("n_groups"), "linear_num_value_heads": config.get("mamba_num_heads"),
            "linear_key_head_dim": config.get("ssm_state_size"), "linear_value_head_dim": config.get("mamba_head_dim"),
            "linear_conv_kernel_dim": config.get("conv_kernel"),
            "mamba_ssm_dtype": config.get("mamba_ssm_cache_dtype"), "first_k_dense_replace": mlps.count("mlp"),
            "n_routed_experts": config.get("n_routed_experts") if moe else 0,
            "shared_expert_intermediate_size": config.get("moe_shared_expert_intermediate_size") if moe else None}


def llama4(config: dict) -> dict:
    """Llama 4's text config in the keys the other families use: a MoE layer every
    `interleave_moe_layer_step` (Qwen's decoder_sparse_step rule), experts `intermediate_size` wide beside one
    shared expert, dense layers `intermediate_size_mlp` wide."""
    if config.get("model_type") != "llama4_text":
        return config
    return {**config, "num_experts": config.get("num_local_experts"), "num_local_experts": None,
            "moe_intermediate_size": config.get("intermediate_size"), "n_shared_experts": 1,
            "intermediate_size": config.get("intermediate_size_mlp", config.get("intermediate_size")),
            "decoder_sparse_step": config.get("interleave_moe_layer_step", 1)}


def chunked(config: dict, layers: int, name: str) -> dict:
    """Chunked local attention (Llama 4): a RoPE layer's query attends to the keys of its own chunk of
    `attention_chunk_size` tokens; the NoPE layers (`no_rope_layers` 0; by default every fourth) to all."""
    chunk = config.get("attention_chunk_size") or 0
    if not chunk:
        return {}
    if config.get("model_type") != "llama4_text":
        raise ValueError(f"model config {name!r} has 'attention_chunk_size': servesweep models Llama 4's chunked "
                         "(local) attention layers only")
    rope = config.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
    return {"attention_chunk": int(chunk), "num_chunked_layers": sum(1 for flag in rope if flag)}


def sparse(config: dict, layers: int, name: str) -> dict:
    """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): an indexer of `index_n_heads` x `index_head_dim`
    scores every earlier key of each query and MLA attends to the `index_topk` best (grouped-query heads in
    MiniMax-M3). GLM-5.2's `indexer_types` lets a "shared" layer reuse an earlier layer's pick: only "full" ones
    run an indexer."""
    topk = config.get("index_topk") or 0
    if not topk:
        return {}
    kinds = config.get("indexer_types")
    indexed = sum(1 for kind in kinds if kind == "full") if kinds else layers
    return {"index_topk": int(topk), "index_heads": int(config.get("index_n_heads") or 0),
            "index_head_dim": int(config.get("index_head_dim") or 0), "num_index_layers": indexed}


#: the keys the Gemma 4 and MiMo-V2 readers state their full-attention layers' own shape under (not config keys
#: of any family): KV heads, query-key width, value width, values read from the keys' projection
FULL_KEYS = ("_full_kv_heads", "_full_head_dim", "_full_v_head_dim", "_full_values_from_keys")


def full_attention(config: dict) -> dict:
    """The full-attention layers' own shape, where a reader stated one (`FULL_KEYS`)."""
    kv, width, values, from_keys = (config.get(key) for key in FULL_KEYS)
    if not (kv or width):
        return {}
    return {"full_kv_heads": int(kv or 0), "full_head_dim": int(width or 0), "full_v_head_dim": int(values or 0),
            "full_values_from_keys": bool(from_keys)}


def gemma4(config: dict) -> dict:
    """Gemma 4's text config in the keys the other families use: sliding layers of `head_dim` x
    `num_key_value_heads`, global (full) ones of `global_head_dim` x `num_global_key_value_heads` whose values
    are their keys' projection (`attention_k_eq_v`: no value projection, K and V both cached); in the MoE
    (`enable_moe_block`) a dense MLP `intermediate_size` wide beside the routed experts on every layer, read as
    a shared expert. Per-layer input embeddings and layers that share another's KV are refused."""
    if config.get("model_type") != "gemma4_text":
        return config
    out = {k: v for k, v in config.items() if k not in ("global_head_dim", "num_global_key_value_heads",
                                                         "attention_k_eq_v", "top_k_experts")}
    if not config.get("num_kv_shared_layers"):
        out.pop("num_kv_shared_layers", None)
    if config.get("hidden_size_per_layer_input"):
        out["per_layer_input_embeddings"] = config["hidden_size_per_layer_input"]  # refused below, by name
    moe = bool(config.get("enable_moe_block") and config.get("num_experts"))
    return {**out, "num_experts": config.get("num_experts") if moe else 0,
            "num_experts_per_tok": config.get("top_k_experts") if moe else 0,
            "shared_expert_intermediate_size": config.get("intermediate_size") if moe else None,
            "_full_kv_heads": config.get("num_global_key_value_heads") or config.get("num_key_value_heads"),
            "_full_head_dim": config.get("global_head_dim") or config.get("head_dim"),
            "_full_values_from_keys": bool(config.get("attention_k_eq_v"))}


def mimo_v2(config: dict, name: str) -> dict:
    """MiMo-V2-Flash's config in the keys the other families use: `hybrid_layer_pattern` 1 a sliding layer of
    the `swa_*` heads (window `sliding_window`), 0 a full one of the model-wide heads, keys and values of their
    own widths (`head_dim`, `v_head_dim`); `moe_layer_freq` 0 a dense layer."""
    if config.get("model_type") != "mimo_v2_flash":
        return config
    pattern = config.get("hybrid_layer_pattern") or []
    if set(pattern) - {0, 1} or len(pattern) != config.get("num_hidden_layers"):
        raise ValueError(f"model config {name!r} has hybrid_layer_pattern {pattern}: servesweep reads one 0 (full) "
                         "or 1 (sliding window) a layer")
    if config.get("swa_num_attention_heads", config.get("num_attention_heads")) != config.get("num_attention_heads"):
        raise ValueError(f"model config {name!r} has sliding layers of {config['swa_num_attention_heads']} query "
                         f"heads beside {config['num_attention_heads']}: servesweep models one query head count")
    out = {k: v for k, v in config.items() if k not in ("hybrid_layer_pattern", "attention_chunk_size")}
    freq = config.get("moe_layer_freq")
    dense = [i for i, f in enumerate(freq) if not f] if isinstance(freq, list) else []
    return {**out, "layer_types": ["sliding_attention" if kind else "full_attention" for kind in pattern],
            "num_key_value_heads": config.get("swa_num_key_value_heads") or config.get("num_key_value_heads"),
            "head_dim": config.get("swa_head_dim") or config.get("head_dim"),
            "v_head_dim": config.get("swa_v_head_dim") or config.get("v_head_dim"),
            "mlp_only_layers": dense,
            "_full_kv_heads": config.get("num_key_value_heads"), "_full_head_dim": config.get("head_dim"),
            "_full_v_head_dim": config.get("v_head_dim")}


def minimax_m3(config: dict) -> dict:
    """MiniMax-M3's sparse attention (`sparse_attention_config`) in DeepSeek's keys: grouped-query layers attend
    to the `sparse_topk_blocks` blocks of `sparse_block_size` tokens an indexer of `sparse_num_index_heads` x
    `sparse_index_dim` picks, and the query's own (local) block; its dense layers are `dense_intermediate_size`
    wide. The layers `sparse_attention_freq` leaves dense (its first 3 of 60) are priced as the sparse ones, with
    no indexer, as AIConfigurator prices them: below the top-k's 2,176 keys they cost the same."""
    msa = config.get("sparse_attention_config")
    if not isinstance(msa, dict) or "sparse_topk_blocks" not in msa:  # (NVIDIA's copy names no model_type)
        return config
    out = {k: v for k, v in config.items() if k != "sparse_attention_config"}
    blocks = msa.get("sparse_topk_blocks", 0) + msa.get("sparse_local_block", 0) + msa.get("sparse_init_block", 0)
    freq, moe = msa.get("sparse_attention_freq"), config.get("moe_layer_freq")
    if isinstance(moe, list):
        out["first_k_dense_replace"] = moe.index(1) if 1 in moe else len(moe)
    return {**out, "intermediate_size": config.get("dense_intermediate_size") or config.get("intermediate_size"),
            "moe_intermediate_size": config.get("moe_intermediate_size") or config.get("intermediate_size"),
            "index_topk": blocks * msa.get("sparse_block_size", 0), "index_n_heads": msa.get("sparse_num_index_heads"),
            "index_head_dim": msa.get("sparse_index_dim"),
            "indexer_types": ["full" if f else "shared" for f in freq] if isinstance(freq, list) else None}


#: DeepSeek-V4's compressed layers: a KV entry every SPARSE_RATIO tokens, of which an indexer picks `index_topk`
#: (CSA), or every DENSE_RATIO tokens, all attended (HCA); 0 a layer of its window alone (AIConfigurator's three)
SPARSE_RATIO, DENSE_RATIO = 4, 128
#: the keys DeepSeek-V4's reader hands `compressed` (not config keys of any family)
COMPRESSED_KEYS = ("_compress_ratios", "_window")


def deepseek_v4(config: dict, name: str) -> dict:
    """DeepSeek-V4's config in the keys the other families use: one KV head of `head_dim` (keys and values one
    entry) in every layer over a `sliding_window` of its latest tokens, and per `compress_ratios` (the first
    `num_hidden_layers`; the last is its MTP layer's) a compressed cache beside it; the CSA layers' indexer is
    DeepSeek's sparse attention's (`index_topk` entries). Its hyper-connections' residual streams (`hc_mult`) mix
    with a few small matrices, not priced."""
    if "compress_ratios" not in config or "o_groups" not in config:
        return config
    layers = config.get("num_hidden_layers") or 0
    ratios = tuple(config["compress_ratios"][:layers])
    if set(ratios) - {0, SPARSE_RATIO, DENSE_RATIO} or len(ratios) != layers:
        raise ValueError(f"model config {name!r} has compress_ratios {sorted(set(ratios))} over {len(ratios)} of "
                         f"{layers} layers: servesweep reads 0, {SPARSE_RATIO} and {DENSE_RATIO}, one a layer")
    out = {k: v for k, v in config.items() if k not in ("compress_ratios", "hc_mult", "hc_eps", "hc_sinkhorn_iters")}
    return {**out, "_compress_ratios": ratios, "_window": config.get("sliding_window") or 0,
            "use_sliding_window": False,
            "indexer_types": ["full" if r == SPARSE_RATIO else "shared" for r in ratios]}


def compressed(config: dict) -> dict:
    """DeepSeek-V4's compressed layers and grouped output projection, where its reader stated them."""
    ratios, window = (config.get(key) for key in COMPRESSED_KEYS)
    if not ratios:
        return {}
    return {"compress_ratios": tuple(ratios), "sliding_window": int(window), "o_groups": int(config["o_groups"]),
            "o_lora_rank": int(config.get("o_lora_rank") or 0)}


def kimi_linear(config: dict) -> dict:
    """Kimi-K3's config (Kimi Linear) in the keys the other families use: `linear_attn_config` names its KDA
    layers and its full (MLA) ones, counted from 1; a KDA layer (Kimi Delta Attention) is a gated delta-net of
    `num_heads` key and value heads of `head_dim` (a state of head_dim x head_dim each, in float32) after a short
    convolution of `short_conv_kernel_size`; its MLA layers gate their output (`mla_use_output_gate`); its
    routed experts work in a `routed_expert_hidden_size` latent beside `num_shared_experts` at the hidden width."""
    linear = config.get("linear_attn_config")
    if config.get("model_type") != "kimi_linear" or not isinstance(linear, dict):
        return config
    kda, layers = set(linear.get("kda_layers") or ()), config.get("num_hidden_layers") or 0
    out = {k: v for k, v in config.items() if k != "linear_attn_config"}
    width, heads = linear.get("head_dim"), linear.get("num_heads")
    return {**out, "layer_types": ["linear_attention" if i + 1 in kda else "full_attention" for i in range(layers)],
            "linear_num_key_heads": heads, "linear_num_value_heads": heads, "linear_key_head_dim": width,
            "linear_value_head_dim": width, "linear_conv_kernel_dim": linear.get("short_conv_kernel_size"),
            "mamba_ssm_dtype": "float32", "attn_output_gate": bool(config.get("mla_use_output_gate")),
            "num_experts_per_tok": config.get("num_experts_per_token"),
            "n_shared_experts": config.get("num_shared_experts"),
            "moe_latent_size": config.get("routed_expert_hidden_size")}


def context_length(config: dict) -> int:
    """Positions the model serves: `max_position_embeddings`, or a YaRN / dynamic rope scaling's
    factor x its original length when the config declares one (how Qwen3 reaches 128k)."""
    context = config.get("max_position_embeddings") or 0
    rope = config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type")
    if kind in ("yarn", "dynamic") and rope.get("factor") and rope.get("original_max_position_embeddings"):
        context = max(context, int(rope["factor"] * rope["original_max_position_embeddings"]))
    return context
