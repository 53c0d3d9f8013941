"""What one forward step costs: model, device, parallelism -> milliseconds, bytes."""

from __future__ import annotations

import dataclasses

from latency.deployment import Deployment
from latency.device import DeviceSpec, load_device, shipped_devices
from latency.engine import EngineProfile, load_engine, shipped_engines
from latency.estimator import DEFAULT_RESERVED_GIB, MemoryPicture, RooflineModel
from latency.keys import ForwardKey, StepShape
from latency.measured import MeasuredLatency, calibrate
from latency.model import ModelSpec, known_models, load_model, shipped_models
from latency.parallel import ParallelSpec
from latency.quant import Quantization, parse_quantization

__all__ = [
    "DEFAULT_RESERVED_GIB", "Deployment", "DeviceSpec", "EngineProfile", "ForwardKey", "MeasuredLatency",
    "MemoryPicture", "ModelSpec", "ParallelSpec", "Quantization", "RooflineModel", "StepShape",
    "build_latency_model", "calibrate", "load_device", "load_engine", "load_model", "parse_quantization",
    "shipped_devices", "shipped_engines", "known_models", "shipped_models",
]


def build_latency_model(model, device, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
                        attention_dp: int = 1, quantization: str = "bf16", kv_cache_dtype: str = "bf16",
                        reserved_memory_gb: float = DEFAULT_RESERVED_GIB, engine: str = "none",
                        redundant_experts: int = 0, async_scheduling: bool | None = None) -> RooflineModel:
    """The roofline model of one instance: `model` is a shipped name or a config.json path,
    `device` a device id or .toml path; `reserved_memory_gb` is GiB, as the reference tool counts;
    `engine` names the serving engine whose per-step overhead is added (latency/data/engines);
    `async_scheduling` overrides its profile's (None: the profile's)."""
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    dev = device if isinstance(device, DeviceSpec) else load_device(device)
    profile = engine if isinstance(engine, EngineProfile) else load_engine(engine)
    if async_scheduling is not None:
        profile = dataclasses.replace(profile, async_scheduling=async_scheduling)
    return RooflineModel(spec, dev, ParallelSpec(tp=tp, pp=pp, dp=dp, ep=ep, attention_dp=attention_dp,
                                                    redundant_experts=redundant_experts),
                         parse_quantization(quantization, kv_cache_dtype), reserved_memory_gb,
                         engine=profile)

