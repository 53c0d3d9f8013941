"""One deployment, as one frozen object: what a latency backend prices (model, device, parallelism,
quantisation, the engine around the kernels). Built once per layout of a scenario and used as the key
of the process's latency-model cache; `build_latency_model`'s keywords are its fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from latency.memory import DEFAULT_RESERVED_GIB


@dataclass(frozen=True)
class Deployment:
    """`model` a shipped name or a config.json path, `device` a device id or .toml path, `engine` a shipped
    engine or a profile .toml path; `reserved_memory_gb` GiB per device; `async_scheduling` None: the
    engine's own; `redundant_experts` 0 unless experts are split over ep > 1 groups."""

    model: str
    device: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    attention_dp: int = 1
    quantization: str = "bf16"
    kv_cache_dtype: str = "bf16"
    reserved_memory_gb: float = DEFAULT_RESERVED_GIB
    engine: str = "none"
    redundant_experts: int = 0
    async_scheduling: bool | None = None

    def options(self) -> dict:
        """The keywords a backend factory takes (`latency.backends`): the optional ones only when set,
        so a plugin that does not know them still prices the rest."""
        out = {k: v for k, v in asdict(self).items() if k not in ("model", "device")}
        for optional, unset in (("redundant_experts", 0), ("async_scheduling", None)):
            if out[optional] == unset:
                del out[optional]
        return out
