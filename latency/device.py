"""DeviceSpec: one TOML file per device (peaks, HBM, links, efficiencies, overheads)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from latency.quant import parse_quantization

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parent / "data" / "devices"
#: Extra folders of device files, separated by os.pathsep; a user adds a device by adding a file.
DEVICE_PATH_ENV = "SERVESWEEP_DEVICE_PATH"

_FIELDS = {  # attribute: (table, key)
    "bf16_tflops": ("compute_tflops", "bf16"),
    "fp16_tflops": ("compute_tflops", "fp16"),
    "int8_tflops": ("compute_tflops", "int8"),
    "fp8_tflops": ("compute_tflops", "fp8"),
    "hbm_gib": ("memory", "hbm_gib"),
    "hbm_bandwidth_tbps": ("memory", "hbm_bandwidth_tbps"),
    "devices_per_node": ("interconnect", "devices_per_node"),
    "intra_node_bandwidth_gbps": ("interconnect", "intra_node_bandwidth_gbps"),
    "intra_node_latency_us": ("interconnect", "intra_node_latency_us"),
    "inter_node_bandwidth_gbps": ("interconnect", "inter_node_bandwidth_gbps"),
    "inter_node_latency_us": ("interconnect", "inter_node_latency_us"),
    "eff_gemm": ("efficiency", "gemm"),
    "eff_attention": ("efficiency", "attention"),
    "eff_memory": ("efficiency", "memory"),
    "eff_communication": ("efficiency", "communication"),
    "kernel_overhead_us": ("overhead", "kernel_us"),
    "prefill_attention_overhead_us": ("overhead", "prefill_attention_us"),
    "step_overhead_ms": ("overhead", "step_ms"),
}
_EFFICIENCIES = ("eff_gemm", "eff_attention", "eff_memory", "eff_communication")
#: a device file's optional FP8 efficiencies and the one each stands in for when absent
FP8_EFFICIENCIES = {"fp8_gemm": "gemm", "fp8_memory": "memory", "fp8_kv_memory": "memory"}
#: weight_only_experts above 1 says the upcast bounds those kernels; twice the others' is beyond any
#: GPU pair measured (H100 1.38)
MAX_WEIGHT_ONLY_SHARE = 2.0


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    source: str
    bf16_tflops: float
    fp16_tflops: float
    int8_tflops: float
    fp8_tflops: float
    hbm_gib: float
    hbm_bandwidth_tbps: float
    devices_per_node: int
    intra_node_bandwidth_gbps: float
    intra_node_latency_us: float
    inter_node_bandwidth_gbps: float
    inter_node_latency_us: float
    eff_gemm: float
    eff_attention: float
    eff_memory: float
    eff_communication: float
    kernel_overhead_us: float
    prefill_attention_overhead_us: float
    step_overhead_ms: float
    default_quantization: str = "bf16"   # what `optimize` uses when --quantize-linear-action is not given
    #: devices joined by the intra-node-class fabric (an NVLink domain, an Ascend super-node's UB/HCCS
    #: links); 0 = one node. A group within it communicates at the intra-node bandwidth and latency.
    scale_up_devices: int = 0
    #: what one device costs per hour (USD), when the file names it ([cost] usd_per_hour); 0 = unknown
    usd_per_hour: float = 0.0

    @property
    def scale_up_domain(self) -> int:
        return self.scale_up_devices or self.devices_per_node

    fp4_tflops: float = 0.0  # dense FP4 peak ([compute_tflops] fp4); 0: no FP4 tensor cores
    #: the share of the expert kernels' memory efficiency that weight-only quantised experts (INT4 or
    #: MXFP4 weights upcast to bf16 in the kernel, Marlin's family) reach here ([efficiency]
    #: weight_only_experts; 1: as the others). Below 1 where those kernels trail the device's bandwidth;
    #: above 1 where the upcast on the SMs, not HBM, bounds them and the device has fewer bytes a second
    #: per SM than the GPU they were measured against (H100: H200's SMs, 0.7 of its bandwidth)
    eff_weight_only_experts: float = 1.0
    #: FP8 linear layers (per-tensor scaled GEMMs: qkv, o, dense MLP) reach these fractions of the FP8
    #: peak and of the HBM bandwidth ([efficiency] fp8_gemm, fp8_memory), and attention reads an FP8 KV
    #: cache at fp8_kv_memory of it; 0: gemm and memory, as bf16. The engines' measured FP8 kernels trail
    #: the bf16 roofline (python bench/fp8_kernels.py)
    eff_fp8_gemm: float = 0.0
    eff_fp8_memory: float = 0.0
    eff_fp8_kv_memory: float = 0.0

    def computes(self, dtype: str) -> bool:
        """Whether the device has tensor cores for `dtype` (FP4 only where it names an FP4 peak)."""
        return dtype != "fp4" or bool(self.fp4_tflops)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of `dtype`; FP4 on a device without FP4 tensor cores runs as bf16 (weight-only)."""
        if not self.computes(dtype):
            dtype = "bf16"
        return getattr(self, f"{dtype}_tflops") * 1e12

    def linear_efficiency(self, dtype: str) -> tuple[float, float]:
        """(compute, memory) efficiency of a linear layer computed in `dtype`."""
        if dtype == "fp8":
            return self.eff_fp8_gemm or self.eff_gemm, self.eff_fp8_memory or self.eff_memory
        return self.eff_gemm, self.eff_memory

    def kv_memory_efficiency(self, kv_bytes: float) -> float:
        """Memory efficiency of attention reading a KV cache of `kv_bytes` an element (1: FP8 on a GPU)."""
        return (self.eff_fp8_kv_memory or self.eff_memory) if kv_bytes == 1 else self.eff_memory

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tbps * 1e12

    @classmethod
    def from_file(cls, path: Path) -> DeviceSpec:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"device file {path}: {err}") from None
        values = {}
        for attr, (table, key) in _FIELDS.items():
            value = data.get(table, {}).get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"device file {path}: [{table}] {key} must be a number >= 0, got {value!r}")
            values[attr] = value
        for attr in _EFFICIENCIES:
            if not 0 < values[attr] <= 1:
                raise ValueError(f"device file {path}: [efficiency] {_FIELDS[attr][1]} must be in (0, 1], "
                                 f"got {values[attr]!r}")
        for attr in ("bf16_tflops", "hbm_gib", "hbm_bandwidth_tbps", "devices_per_node",
                     "intra_node_bandwidth_gbps", "inter_node_bandwidth_gbps"):
            if values[attr] <= 0:
                raise ValueError(f"device file {path}: [{_FIELDS[attr][0]}] {_FIELDS[attr][1]} must be > 0")
        name = data.get("name", path.stem)
        if name != path.stem:
            raise ValueError(f"device file {path}: name {name!r} must match the file name {path.stem!r}")
        scale_up = data.get("interconnect", {}).get("scale_up_devices", 0)
        if isinstance(scale_up, bool) or not isinstance(scale_up, int) or scale_up < 0:
            raise ValueError(f"device file {path}: [interconnect] scale_up_devices must be an integer >= 0 "
                             f"(0 = one node), got {scale_up!r}")
        price = data.get("cost", {}).get("usd_per_hour", 0.0)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise ValueError(f"device file {path}: [cost] usd_per_hour must be a number >= 0, got {price!r}")
        fp4 = data.get("compute_tflops", {}).get("fp4", 0.0)
        if isinstance(fp4, bool) or not isinstance(fp4, (int, float)) or fp4 < 0:
            raise ValueError(f"device file {path}: [compute_tflops] fp4 must be a number >= 0 (0 = none), got {fp4!r}")
        weight_only = data.get("efficiency", {}).get("weight_only_experts", 1.0)
        if (isinstance(weight_only, bool) or not isinstance(weight_only, (int, float))
                or not 0 < weight_only <= MAX_WEIGHT_ONLY_SHARE):
            raise ValueError(f"device file {path}: [efficiency] weight_only_experts must be in "
                             f"(0, {MAX_WEIGHT_ONLY_SHARE:g}], got {weight_only!r}")
        fp8 = {}
        for key in FP8_EFFICIENCIES:
            value = data.get("efficiency", {}).get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"device file {path}: [efficiency] {key} must be in (0, 1] (0 or absent: as "
                                 f"{FP8_EFFICIENCIES[key]}), got {value!r}")
            fp8[f"eff_{key}"] = float(value)
        quant = data.get("defaults", {}).get("quantization", "bf16")
        try:
            parse_quantization(quant)
        except ValueError as err:
            raise ValueError(f"device file {path}: [defaults] quantization: {err}") from None
        return cls(name=name, source=str(data.get("source", "")), default_quantization=quant,
                   scale_up_devices=scale_up, usd_per_hour=float(price), fp4_tflops=float(fp4),
                   eff_weight_only_experts=float(weight_only), **fp8, **values)


@lru_cache(maxsize=256)
def _parse(path: str, mtime_ns: int) -> DeviceSpec:
    """Each device file is parsed once per version (a sweep validates thousands of scenarios)."""
    return DeviceSpec.from_file(Path(path))


def _search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(DEVICE_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, DATA]


def shipped_devices() -> list[str]:
    return sorted({p.stem for folder in _search_path() for p in folder.glob("*.toml")})


def load_device(device: str | Path) -> DeviceSpec:
    """A device id (file stem under the data folder or SERVESWEEP_DEVICE_PATH) or a .toml path."""
    path = Path(device)
    if path.suffix == ".toml" and path.is_file():
        return _parse(str(path), path.stat().st_mtime_ns)
    for folder in _search_path():
        candidate = folder / f"{device}.toml"
        if candidate.is_file():
            return _parse(str(candidate), candidate.stat().st_mtime_ns)
    raise ValueError(f"unknown device {str(device)!r}; known: {', '.join(shipped_devices())}")
