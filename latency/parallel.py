"""ParallelSpec: how one model instance is split over devices, and how many instances run."""

from __future__ import annotations

from dataclasses import dataclass

from latency.checks import check_int
from latency.model import ModelSpec


@dataclass(frozen=True)
class ParallelSpec:
    """tp x pp devices form one instance; dp instances serve side by side. Inside an instance the
    routed experts are split over `ep` groups of tp/ep devices (ep must divide tp)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            check_int(name, getattr(self, name))
        if self.tp % self.ep:
            raise ValueError(f"ep={self.ep} must divide tp={self.tp}")

    @property
    def devices_per_instance(self) -> int:
        return self.tp * self.pp

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp

    def validate(self, model: ModelSpec, num_devices: int | None = None) -> None:
        if num_devices is not None and num_devices != self.num_devices:
            raise ValueError(f"tp*pp*dp = {self.num_devices} does not match {num_devices} devices")
        if model.num_heads % self.tp:
            raise ValueError(f"tp={self.tp} must divide the {model.num_heads} attention heads of {model.name}")
        kv = model.num_kv_heads
        if not model.is_mla and kv % self.tp and self.tp % kv:
            raise ValueError(f"tp={self.tp} and the {kv} KV heads of {model.name} must divide one another")
        if self.pp > model.num_layers:
            raise ValueError(f"pp={self.pp} exceeds the {model.num_layers} layers of {model.name}")
        if self.ep > 1 and not model.is_moe:
            raise ValueError(f"ep={self.ep} needs a MoE model; {model.name} is dense")
        if model.is_moe and model.num_experts % self.ep:
            raise ValueError(f"ep={self.ep} must divide the {model.num_experts} experts of {model.name}")
