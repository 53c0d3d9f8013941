"""ModelSpec: the shape of a transformer, parsed from a Hugging Face config.json (dense and MoE; GQA, MLA, sparse,
windowed and chunked attention; gated delta-net and Mamba-2 layers: each family's keys as `latency.families`
reads them), and the shipped models by name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from latency import families

DATA = Path(__file__).parent / "data" / "models"
#: the scale an FP8 indexer key carries (one fp32 a token and layer)
INDEX_SCALE_BYTES = 4


@dataclass(frozen=True)
class ModelSpec:
    """Everything the estimator needs about a model. MoE fields are 0 for dense models, MLA fields 0
    for GQA ones."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0          # layers with a dense MLP in a MoE model
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    max_position_embeddings: int = 0   # longest context the model was trained for; 0: not stated
    sliding_window: int = 0            # tokens a sliding-window layer attends to (0: none)
    num_sliding_layers: int = 0        # layers with sliding-window attention (the others attend to all)
    attention_chunk: int = 0           # tokens of a chunk a chunked-attention layer attends within (0: none)
    num_chunked_layers: int = 0        # layers with chunked local attention (Llama 4's RoPE layers)
    num_linear_layers: int = 0         # gated delta-net (linear attention) layers: a recurrent state a request
    linear_key_heads: int = 0          # ... its heads of keys and of values, their widths, the short
    linear_value_heads: int = 0        #     convolution's kernel and the bytes of a state element
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_bytes: int = 0
    attention_output_gate: bool = False  # full-attention layers project a gate as wide as their queries (Qwen3.5)
    full_kv_heads: int = 0             # full-attention layers' own KV heads, query-key and value widths and
    full_head_dim: int = 0             # whether their values are their keys (no value projection), where they
    full_v_head_dim: int = 0           # differ from the sliding layers' (Gemma 4's global layers, MiMo-V2's
    full_values_from_keys: bool = False  # full ones); 0: as every layer's
    compress_ratios: tuple = ()        # DeepSeek-V4: each layer's tokens a KV entry (0: its window alone)
    o_groups: int = 0                  # ... its output projection: the heads in groups, each to o_lora_rank,
    o_lora_rank: int = 0               #     then all to the hidden width
    mlp_matrices: int = 3              # an MLP's (and an expert's) matrices: gate, up, down; 2 where ungated (relu2)
    moe_latent_size: int = 0           # routed experts' width in and out where they work in a latent (0: hidden)
    num_mlp_free_layers: int = 0       # layers whose block has no MLP (Nemotron-H's attention blocks)
    index_topk: int = 0                # sparse attention: keys the indexer picks for each query (0: dense)
    index_heads: int = 0               # ... the indexer's heads, each index_head_dim wide
    index_head_dim: int = 0
    num_index_layers: int = 0          # ... layers that run an indexer (the others reuse an earlier one's pick)
    checkpoint_quantization: str = ""  # the published checkpoint's format (latency.quant names; "": bf16)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_sparse(self) -> bool:
        """Each query attends to the `index_topk` keys its layer's indexer scores highest."""
        return self.index_topk > 0

    @property
    def index_key_bytes(self) -> int:
        """One token's indexer key in a layer's index cache: FP8 values and an fp32 scale (vLLM's and SGLang's)."""
        return self.index_head_dim + INDEX_SCALE_BYTES if self.is_sparse else 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers - self.num_mlp_free_layers if self.is_moe else 0

    @property
    def vocab_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def expert_params(self) -> int:
        """One routed expert's weights: its matrices between the hidden state (or its latent) and its width."""
        return self.mlp_matrices * (self.moe_latent_size or self.hidden_size) * self.moe_intermediate_size

    @property
    def shared_expert_params(self) -> int:
        """A MoE layer's shared experts, at the hidden width, and a latent MoE's projections into and out of it."""
        shared = self.num_shared_experts * self.mlp_matrices * self.hidden_size * self.moe_intermediate_size
        return shared + 2 * self.hidden_size * self.moe_latent_size

    @property
    def num_local_layers(self) -> int:
        """Layers that attend to (and keep KV of) a part of the context: a sliding window or the current chunk."""
        return self.num_sliding_layers + self.num_chunked_layers

    @property
    def values_dim(self) -> int:
        """A (non-MLA) head's value width: `v_head_dim` where it differs from the keys' (MiMo-V2), else head_dim."""
        return self.v_head_dim or self.head_dim

    def compressed_layers(self, ratio: int) -> int:
        """DeepSeek-V4's layers that keep a KV entry every `ratio` tokens (0: their window alone)."""
        return sum(1 for r in self.compress_ratios if r == ratio)

    @property
    def num_full_layers(self) -> int:
        """Layers whose attention (and KV) spans the whole context."""
        return self.num_layers - self.num_local_layers - self.num_linear_layers

    @classmethod
    def from_config(cls, config: dict, name: str = "custom") -> ModelSpec:
        """Parse a Hugging Face config dict; a missing required key is an error naming it. A
        multimodal wrapper's `text_config` is the language model served. Routed experts are
        `num_experts`, `n_routed_experts` (DeepSeek) or `num_local_experts` (Mixtral, MiniMax,
        gpt-oss; their experts are `intermediate_size` wide and every layer is sparse)."""
        if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:
            config = {**config["text_config"], "quantization_config": config["text_config"].get(
                "quantization_config", config.get("quantization_config"))}
        config = families.mimo_v2(families.gemma4(families.nemotron_h(families.llama4(config))), name)
        config = families.deepseek_v4(families.minimax_m3(families.kimi_linear(config)), name)
        families.refuse_unknown(config, name)

        def need(key):
            if key not in config:
                raise ValueError(f"model config {name!r} lacks {key!r}")
            return config[key]

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        layers = need("num_hidden_layers")
        experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts") or 0
        local = bool(config.get("num_local_experts")) and not config.get("moe_intermediate_size")
        dense = 0
        if experts:
            if "first_k_dense_replace" in config:
                dense = config["first_k_dense_replace"]
            elif local:
                dense = 0  # Mixtral-style: every layer's MLP is the experts
            else:
                # Qwen-MoE: layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not
                # listed in mlp_only_layers
                mlp_only = set(config.get("mlp_only_layers") or [])
                step = config.get("decoder_sparse_step", 1) or 1
                dense = sum(1 for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
        spec = cls(
            name=name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            # a MoE model with no dense layer may leave its dense width out (Qwen3.5's)
            intermediate_size=config.get("intermediate_size") or (
                config.get("moe_intermediate_size") if experts and not dense else need("intermediate_size")),
            vocab_size=need("vocab_size"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=experts,
            experts_per_token=(config.get("num_experts_per_tok") or config.get("experts_per_token") or 0)
            if experts else 0,
            moe_intermediate_size=(need("intermediate_size") if local else config.get("moe_intermediate_size", 0))
            if experts else 0,
            num_shared_experts=families.shared_experts(config, name),
            num_dense_layers=dense,
            q_lora_rank=config.get("q_lora_rank") or 0,
            kv_lora_rank=config.get("kv_lora_rank") or 0,
            qk_nope_head_dim=config.get("qk_nope_head_dim") or 0,
            qk_rope_head_dim=config.get("qk_rope_head_dim") or 0,
            v_head_dim=config.get("v_head_dim") or 0,
            max_position_embeddings=families.context_length(config),
            checkpoint_quantization=families.checkpoint_quantization(config),
            **families.sliding(config, layers),
            **families.chunked(config, layers, name),
            **families.linear(config),
            mlp_matrices=families.mlp_matrices(config),
            moe_latent_size=int(config.get("moe_latent_size") or 0) if experts else 0,
            num_mlp_free_layers=int(config.get(families.MLP_FREE, 0)),
            **families.sparse(config, layers, name),
            **families.full_attention(config),
            **families.compressed(config),
        )
        spec.validate()
        return spec

    def validate(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"model {self.name!r}: {field} must be >= 1, got {getattr(self, field)}")
        for field in ("full_kv_heads", "full_head_dim", "full_v_head_dim", "v_head_dim"):
            if getattr(self, field) < 0:
                raise ValueError(f"model {self.name!r}: {field} must be >= 0, got {getattr(self, field)}")
        if self.is_moe and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"model {self.name!r}: experts_per_token must be in [1, {self.num_experts}]")
        if self.is_moe and self.moe_intermediate_size < 1:
            raise ValueError(f"model {self.name!r}: moe_intermediate_size must be >= 1")


#: published checkpoints whose config.json has a shipped model's architecture, every dimension alike
#: (layers, widths, heads, experts, attention kind), and the keys in which it differs: the name
#: stands for that config (later releases of one model; a base model beside its instruct one)
SAME_ARCHITECTURE = {
    "deepseek-ai/DeepSeek-R1": ("deepseek-ai/DeepSeek-V3", ()),
    "deepseek-ai/DeepSeek-R1-0528": ("deepseek-ai/DeepSeek-V3", ()),
    "deepseek-ai/DeepSeek-V3-0324": ("deepseek-ai/DeepSeek-V3", ()),
    "meta-llama/Llama-3.3-70B-Instruct": ("meta-llama/Llama-3.1-70B-Instruct", ()),
    "meta-llama/Llama-3.1-70B": ("meta-llama/Llama-3.1-70B-Instruct", ()),
    "meta-llama/Llama-3.1-8B": ("meta-llama/Llama-3.1-8B-Instruct", ()),
    "meta-llama/Llama-3.1-405B": ("meta-llama/Llama-3.1-405B-Instruct", ()),
    # the names AIConfigurator's support matrix and silicon runs give them
    "meta-llama/Meta-Llama-3.1-8B": ("meta-llama/Llama-3.1-8B-Instruct", ()),
    "meta-llama/Meta-Llama-3.1-70B": ("meta-llama/Llama-3.1-70B-Instruct", ()),
    "meta-llama/Meta-Llama-3.1-405B": ("meta-llama/Llama-3.1-405B-Instruct", ()),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": ("meta-llama/Llama-3.1-8B-Instruct", ()),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": ("meta-llama/Llama-3.1-70B-Instruct", ()),
    "meta-llama/Meta-Llama-3.1-405B-Instruct": ("meta-llama/Llama-3.1-405B-Instruct", ()),
    "deepseek-ai/DeepSeek-V3.1": ("deepseek-ai/DeepSeek-V3", ()),
    "moonshotai/Kimi-K2.6": ("moonshotai/Kimi-K2.5", ()),
    "MiniMaxAI/MiniMax-M2.7": ("MiniMaxAI/MiniMax-M2.5", (("max_position_embeddings", 204800),)),
    "moonshotai/Kimi-K2.7-Code": ("moonshotai/Kimi-K2.5", ()),
    "moonshotai/Kimi-K2-Instruct-0905": ("moonshotai/Kimi-K2-Instruct", (("max_position_embeddings", 262144),)),
    "moonshotai/Kimi-K2-Base": ("moonshotai/Kimi-K2-Instruct", ()),
    "moonshotai/Kimi-K2-Thinking": ("moonshotai/Kimi-K2.5", ()),  # its text model, INT4 weight-only experts
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mistralai/Mixtral-8x7B-v0.1", ()),
    "mistralai/Mixtral-8x22B-Instruct-v0.1": ("mistralai/Mixtral-8x22B-v0.1", (("vocab_size", 32768),)),
    # DeepSeek-R1's distillations keep their base's shapes (Llama 3.1 / 3.3, Qwen2.5 with 131,072 positions)
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": ("meta-llama/Llama-3.1-8B-Instruct", ()),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": ("meta-llama/Llama-3.1-70B-Instruct", ()),
    **{f"deepseek-ai/DeepSeek-R1-Distill-Qwen-{size}": (f"Qwen/Qwen2.5-{size}-Instruct",
                                                        (("max_position_embeddings", 131072),))
       for size in ("7B", "14B", "32B")},
    **{f"Qwen/Qwen2.5-{size}": (f"Qwen/Qwen2.5-{size}-Instruct", (("max_position_embeddings", 131072),))
       for size in ("7B", "14B", "32B", "72B")},
    "meta-llama/Llama-3.2-1B": ("meta-llama/Llama-3.2-1B-Instruct", ()),
    "meta-llama/Llama-3.2-3B": ("meta-llama/Llama-3.2-3B-Instruct", ()),
    # Qwen3-VL's language models (text prompts: the vision encoder is not priced), 262,144 positions
    **{f"Qwen/Qwen3-VL-{size}": (f"Qwen/Qwen3-{text}", (("max_position_embeddings", 262144),))
       for size, text in (("2B-Instruct", "1.7B"), ("4B-Instruct", "4B"), ("8B-Instruct", "8B"),
                          ("32B-Instruct", "32B"), ("32B-Thinking", "32B"), ("30B-A3B-Instruct", "30B-A3B"),
                          ("235B-A22B-Instruct", "235B-A22B"))},
    "Qwen/Qwen3.6-27B": ("Qwen/Qwen3.5-27B", ()),
    "Qwen/Qwen3.6-35B-A3B": ("Qwen/Qwen3.5-35B-A3B", ()),
    "zai-org/GLM-5.1": ("zai-org/GLM-5", ()),
    "zai-org/GLM-5.3": ("zai-org/GLM-5.2", ()),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("Qwen/Qwen3-235B-A22B", (("max_position_embeddings", 262144),)),
    "Qwen/Qwen3-235B-A22B-Thinking-2507": ("Qwen/Qwen3-235B-A22B", (("max_position_embeddings", 262144),)),
}


def shipped_models() -> list[str]:
    return sorted(p.stem.replace("--", "/") for p in DATA.glob("*.json"))


def known_models() -> list[str]:
    """Every name `load_model` knows without a config.json: the shipped ones and SAME_ARCHITECTURE's."""
    return sorted([*shipped_models(), *SAME_ARCHITECTURE])


def load_model(model: str | Path) -> ModelSpec:
    """A shipped name (e.g. "Qwen/Qwen3-32B") or one of SAME_ARCHITECTURE, a path to a config.json, or
    a folder holding one."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    overrides = ()
    if path.suffix == ".json" and path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
    else:
        name = str(model)
        shipped, overrides = SAME_ARCHITECTURE.get(name, (name, ()))
        path = DATA / (shipped.replace("/", "--") + ".json")
        if not path.is_file():
            raise ValueError(f"unknown model {str(model)!r}; shipped: {', '.join(known_models())}; "
                             "or give a path to a config.json")
    return _parse(str(path), path.stat().st_mtime_ns, name, overrides)


@lru_cache(maxsize=256)
def _parse(path: str, mtime_ns: int, name: str, overrides: tuple = ()) -> ModelSpec:
    """Each config is parsed once per version (a sweep validates thousands of scenarios)."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read model config {path}: {err}") from None
    return ModelSpec.from_config({**config, **dict(overrides)}, name=name)
