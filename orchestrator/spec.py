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
from dataclasses import asdict, is_dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path

from orchestrator.engine_defaults import default_capacity_scheduler
from orchestrator.fields import FIELD_BY_KEY, FIELDS, InputError
from orchestrator.jobs import SweepItem
from orchestrator.modes import MODES, make_mode
from orchestrator.scenario import Scenario
from simulator.mix import Lengths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SWEEP_KEYS = ("name", "mode", "pd_devices")
REQUIRED = tuple(f.key for f in FIELDS if f.required)


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
    """The values of one spec key, typed as its field: a list in [grid], one value in [options].
    A list field takes "none" for no value (e.g. no TTFT limit)."""
    f = FIELD_BY_KEY.get(key)
    if f is None:
        raise SpecError(f"{table}.{key}: unknown key; allowed: {', '.join(FIELD_BY_KEY)}")
    values = value if isinstance(value, list) and many else [value]
    kind = f.kind
    out = []
    for v in values:
        if f.many and (v == "none" or v is None):
            out.append(None)
            continue
        if kind is Lengths and isinstance(v, (int, str)) and not isinstance(v, bool):
            try:
                out.append(f.check(v) if isinstance(v, int) else f.parse(v))
            except InputError as err:
                raise SpecError(err.render("key")) from None
            continue
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise SpecError(f"{table}.{key} = {v!r}: expected {'a list of ' if many else ''}{kind.__name__}")
        out.append(v)
    if not out:
        raise SpecError(f"{table}.{key}: empty list")
    return out


def _mode(sweep: dict):
    unknown = set(sweep) - set(SWEEP_KEYS)
    if unknown:
        raise SpecError(f"sweep.{sorted(unknown)[0]}: unknown key; allowed: {', '.join(SWEEP_KEYS)}")
    name = sweep.get("mode", "agg")
    if name not in MODES:
        raise SpecError(f"sweep.mode = {name!r}: expected one of {', '.join(MODES)}")
    if name != "pd":
        return make_mode(name)
    pd_devices = sweep.get("pd_devices")
    if not (isinstance(pd_devices, list) and len(pd_devices) == 2):
        raise SpecError(f"sweep.pd_devices = {pd_devices!r}: mode 'pd' needs [P, Q], two integers >= 1")
    try:
        return make_mode("pd", prefill_devices=pd_devices[0], decode_devices=pd_devices[1])
    except InputError as err:
        raise SpecError(f"sweep.pd_devices = {pd_devices!r}: mode 'pd' needs [P, Q], two integers >= 1; "
                        f"{err.render('key')}") from None


def expand(spec: dict) -> list[SweepItem]:
    """Every scenario of the spec, validated; errors name the spec key and the bad value."""
    mode = _mode(spec.get("sweep", {}))
    grid = {k: _values("grid", k, v, True) for k, v in spec.get("grid", {}).items()}
    options = {k: _values("options", k, v, False)[0] for k, v in spec.get("options", {}).items()}
    both = set(grid) & set(options)
    if both:
        raise SpecError(f"{sorted(both)[0]}: given in both [grid] and [options]")
    missing = [k for k in REQUIRED if k not in grid and k not in options]
    if missing:
        raise SpecError(f"grid.{missing[0]}: required key is missing")
    names = list(grid)
    items, ids = [], set()
    for combo in itertools.product(*(grid[k] for k in names)):
        fields = {}
        for key, value in [*zip(names, combo, strict=True), *options.items()]:
            f = FIELD_BY_KEY[key]
            fields[f.name] = (() if value is None else (value,)) if f.many else value
        try:
            s = Scenario(**fields)
            s.validate()
            mode.validate(s)
            jobs = tuple(mode.jobs(s))
        except InputError as err:
            raise SpecError(err.render("key")) from None
        except ValueError as err:
            raise SpecError(str(err)) from None
        sid = scenario_id(s, mode)
        if sid not in ids:  # combinations that differ only in an INERT field are one scenario
            ids.add(sid)
            items.append(SweepItem(sid, s, mode, jobs))
    return items


#: fields that change no result unless a condition holds, left out of the id where it does not, so a
#: scenario keeps the id it had before the field existed (a resumed sweep finds its finished scenarios)
INERT = {"prefix_caching": lambda s: s.reused_prompts > 0, "async_scheduling": lambda s: s.async_override is not None,
         "capacity_scheduler": lambda s: s.capacity_scheduler != default_capacity_scheduler(s.engine)}


def _plain(value):
    """A field's value as `dataclasses.asdict` gives it (a dataclass as a dict, containers element by element),
    without its deep copies: the JSON of an id is the same, at a tenth of the cost (8,064 ids: 2.3 -> 0.2 s)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if not hasattr(value, "_fields") else \
            type(value)(*(_plain(v) for v in value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def scenario_id(s: Scenario, mode) -> str:
    # a trace is named by its content's digest too: the same path with other requests is another scenario
    trace = str(s.request_mix) if s.trace else ""
    fields = {f.name: _plain(getattr(s, f.name)) for f in dataclass_fields(s)
              if f.name not in INERT or INERT[f.name](s)}
    payload = json.dumps([fields, mode.name, mode.options().get("pd_devices"), trace], sort_keys=True,
                         default=list)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
