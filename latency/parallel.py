"""ParallelSpec: how one model instance is split over devices, and how many instances run."""

from __future__ import annotations

from dataclasses import dataclass

from latency.checks import check_int
from latency.model import ModelSpec


@dataclass(frozen=True)
class ParallelSpec:
    """One instance is `attention_dp` attention ranks of tp x pp devices; dp instances serve side by
    side. The MoE layers of an instance span all tp x attention_dp devices of a stage: the routed
    experts are split over `ep` groups of `moe_tp` = tp x attention_dp / ep devices each (vLLM
    --data-parallel-size with --enable-expert-parallel, SGLang --enable-dp-attention). Dense models
    keep attention_dp = 1 (their data parallelism is dp). `redundant_experts` extra copies of the
    busiest experts (EPLB's; vLLM --num-redundant-experts) make the ep groups share num_experts +
    redundant_experts expert slots, so EP 320 runs 256 experts plus 64 copies, one slot a device."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    attention_dp: int = 1
    redundant_experts: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "attention_dp"):
            check_int(name, getattr(self, name))
        check_int("redundant_experts", self.redundant_experts, low=0)
        if self.redundant_experts and self.ep == 1:
            raise ValueError(f"redundant_experts={self.redundant_experts} needs expert parallelism (ep > 1): "
                             "without it every device holds every expert")
        if self.moe_devices % self.ep:
            raise ValueError(f"ep={self.ep} must divide tp x attention_dp = {self.moe_devices}")

    @property
    def moe_devices(self) -> int:
        """Devices a MoE layer of one stage spans: every attention rank's tp group."""
        return self.tp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        """Devices each expert is split over."""
        return self.moe_devices // self.ep

    def expert_slots(self, model: ModelSpec) -> int:
        """Routed experts plus their redundant copies: what the ep groups share out."""
        return model.num_experts + self.redundant_experts

    @property
    def rank_devices(self) -> int:
        """Devices of one attention rank: what one scheduler's batch runs on."""
        return self.tp * self.pp

    @property
    def devices_per_instance(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def num_devices(self) -> int:
        return self.devices_per_instance * self.dp

    def validate(self, model: ModelSpec, num_devices: int | None = None) -> None:
        if num_devices is not None and num_devices != self.num_devices:
            raise ValueError(f"tp*pp*attention_dp*dp = {self.num_devices} does not match {num_devices} devices")
        if model.num_heads % self.tp:
            raise ValueError(f"tp={self.tp} must divide the {model.num_heads} attention heads of {model.name}")
        for kv in {model.num_kv_heads, model.full_kv_heads or model.num_kv_heads}:
            if not model.is_mla and kv % self.tp and self.tp % kv:
                raise ValueError(f"tp={self.tp} and the {kv} KV heads of {model.name} must divide one another")
        if model.num_linear_layers and (model.linear_key_heads % self.tp or model.linear_value_heads % self.tp):
            raise ValueError(f"tp={self.tp} must divide the {model.linear_key_heads} key and "
                             f"{model.linear_value_heads} value heads of {model.name}'s gated delta-net layers")
        if self.pp > model.num_layers:
            raise ValueError(f"pp={self.pp} exceeds the {model.num_layers} layers of {model.name}")
        if self.ep > 1 and not model.is_moe:
            raise ValueError(f"ep={self.ep} needs a MoE model; {model.name} is dense")
        if self.attention_dp > 1 and not model.is_moe:
            raise ValueError(f"attention_dp={self.attention_dp} needs a MoE model; {model.name} is dense "
                             "(its data parallelism is dp: instances side by side)")
        if self.redundant_experts and not model.is_moe:
            raise ValueError(f"redundant_experts={self.redundant_experts} needs a MoE model; {model.name} is dense")
        if model.is_moe and self.expert_slots(model) % self.ep:
            extra = f" + {self.redundant_experts} redundant" if self.redundant_experts else ""
            raise ValueError(f"ep={self.ep} must divide the {model.num_experts}{extra} experts of {model.name} "
                             "(redundant experts can make it divide: --redundant-experts)")
