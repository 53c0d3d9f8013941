"""Sweep specs: a TOML file whose [grid] lists values per key; scenarios are their product.

```toml
[sweep]
name = "quickstart"
mode = "agg"                 # agg | disagg | pd
pd_devices = [2, 2]          # mode = "pd": devices per prefill and per decode instance

[grid]                       # every key takes a value or a list of values
model = ["Qwen/Qwen3-8B"]
device = "H200_SXM"
num_devices = [1, 2]
input_length = [2048, 8192]
output_length = 512
max_batched_tokens = [2048, 8192]
ttft_limit_ms = 4000         # or "none"
tpot_limit_ms = [30, 50]

[options]                    # one value for every scenario
quantization = "bf16"
```
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

from orchestrator.optimize import plan_jobs
from orchestrator.runner import SweepItem
from orchestrator.scenario import InputError, Scenario

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODES = ("agg", "disagg", "pd")
#: spec key -> (Scenario field, kind); grid keys may be lists, option keys are scalars
KEYS = {
    "model": ("model", str), "device": ("device", str), "num_devices": ("num_devices", int),
    "input_length": ("input_length", int), "output_length": ("output_length", int),
    "max_batched_tokens": ("max_batched_tokens", int), "ttft_limit_ms": ("ttft_limits", float),
    "tpot_limit_ms": ("tpot_limits", float), "prefix_cache_hit_rate": ("prefix_cache_hit_rate", float),
    "tp": ("tp_sizes", int), "pp": ("pp", int), "ep": ("ep", int), "quantization": ("quantization", str),
    "kv_cache_dtype": ("kv_cache_dtype", str), "reserved_memory_gb": ("reserved_memory_gb", float),
    "scheduler": ("scheduler", str), "decode_context": ("decode_context", str),
    "mtp_tokens": ("mtp_tokens", int), "mtp_acceptance_rate": ("mtp_acceptance_rates", float),
    "max_concurrency": ("max_concurrency", int),
}
REQUIRED = ("model", "device", "num_devices", "input_length", "output_length")
TUPLE_FIELDS = {"max_batched_tokens", "ttft_limits", "tpot_limits", "tp_sizes", "mtp_acceptance_rates"}
#: Scenario validation names CLI flags; a spec names its keys
FLAG_TO_KEY = {"MODEL": "model", "--device": "device", "--num-devices": "num_devices",
               "--input-length": "input_length", "--output-length": "output_length",
               "--max-batched-tokens": "max_batched_tokens", "--ttft-limits": "ttft_limit_ms",
               "--tpot-limits": "tpot_limit_ms", "--prefix-cache-hit-rate": "prefix_cache_hit_rate",
               "--tp-sizes": "tp", "--pp-size": "pp", "--ep-size": "ep", "--quantize-linear-action": "quantization",
               "--kv-cache-dtype": "kv_cache_dtype", "--reserved-memory-gb": "reserved_memory_gb",
               "--scheduler": "scheduler", "--num-mtp-tokens": "mtp_tokens",
               "--mtp-acceptance-rates": "mtp_acceptance_rate", "--max-concurrency": "max_concurrency"}


class SpecError(ValueError):
    """A bad spec: names the key and the value."""


def load_spec(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise SpecError(f"{path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    unknown = set(data) - {"sweep", "grid", "options"}
    if unknown:
        raise SpecError(f"{path}: unknown table(s) {sorted(unknown)}; allowed: sweep, grid, options")
    return data


def _values(table: str, key: str, value, many: bool) -> list:
    if key not in KEYS:
        raise SpecError(f"{table}.{key}: unknown key; allowed: {', '.join(KEYS)}")
    values = value if isinstance(value, list) and many else [value]
    kind = KEYS[key][1]
    out = []
    for v in values:
        if key in ("ttft_limit_ms", "tpot_limit_ms") and (v == "none" or v is None):
            out.append(None)
            continue
        ok = isinstance(v, kind) and not isinstance(v, bool) or (kind is float and isinstance(v, int)
                                                                 and not isinstance(v, bool))
        if not ok:
            raise SpecError(f"{table}.{key} = {v!r}: expected {'a list of ' if many else ''}{kind.__name__}")
        out.append(kind(v))
    if not out:
        raise SpecError(f"{table}.{key}: empty list")
    return out


def expand(spec: dict) -> list[SweepItem]:
    """Every scenario of the spec, validated; errors name the spec key and the bad value."""
    sweep = spec.get("sweep", {})
    mode = sweep.get("mode", "agg")
    if mode not in MODES:
        raise SpecError(f"sweep.mode = {mode!r}: expected one of {', '.join(MODES)}")
    pd_devices = sweep.get("pd_devices")
    if mode == "pd" and not (isinstance(pd_devices, list) and len(pd_devices) == 2
                             and all(isinstance(x, int) and x >= 1 for x in pd_devices)):
        raise SpecError(f"sweep.pd_devices = {pd_devices!r}: mode 'pd' needs [P, Q], two integers >= 1")
    unknown = set(sweep) - {"name", "mode", "pd_devices"}
    if unknown:
        raise SpecError(f"sweep.{sorted(unknown)[0]}: unknown key; allowed: name, mode, pd_devices")
    grid = {k: _values("grid", k, v, True) for k, v in spec.get("grid", {}).items()}
    options = {k: _values("options", k, v, False)[0] for k, v in spec.get("options", {}).items()}
    both = set(grid) & set(options)
    if both:
        raise SpecError(f"{sorted(both)[0]}: given in both [grid] and [options]")
    missing = [k for k in REQUIRED if k not in grid and k not in options]
    if missing:
        raise SpecError(f"grid.{missing[0]}: required key is missing")
    names = list(grid)
    items = []
    for combo in itertools.product(*(grid[k] for k in names)):
        fields = {}
        for key, value in [*zip(names, combo, strict=True), *options.items()]:
            name = KEYS[key][0]
            fields[name] = (() if value is None else (value,)) if name in TUPLE_FIELDS else value
        s = Scenario(**fields)
        try:
            s.validate()
            pd = tuple(pd_devices) if mode == "pd" else None
            if pd and sum(pd) > s.num_devices:
                raise InputError("--num-devices", s.num_devices, f">= P + Q = {sum(pd)} for mode 'pd'")
            jobs = tuple(plan_jobs(s, disagg=mode == "disagg", pd_devices=pd))
        except InputError as err:
            key = FLAG_TO_KEY.get(err.flag, err.flag)
            raise SpecError(f"{key} = {err.value!r}: expected {err.allowed}") from None
        except ValueError as err:
            raise SpecError(str(err)) from None
        items.append(SweepItem(scenario_id(s, mode, pd), s, jobs, pd))
    return items


def scenario_id(s: Scenario, mode: str, pd_devices) -> str:
    payload = json.dumps([asdict(s), mode, pd_devices], sort_keys=True, default=list)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
