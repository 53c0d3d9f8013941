"""Measured runs a team hands to `servesweep calibrate`, in four forms, read as configurations with
their measured mean TTFT and TPOT:

- a CSV in AIConfigurator's silicon format (`orchestrator.measured_runs`: the run's release and launch
  read from its columns), its metrics `silicon_ttft_ms` and `silicon_tpot_ms`;
- a CSV of spec-key columns (as `estimate --from-csv` reads) plus `measured_ttft_ms` and `measured_tpot_ms`;
- `vllm bench serve --save-result` JSON files, the deployment given by the usual flags (model, device,
  layout); the file says the load (`max_concurrency` or `request_rate`), the prompts and the lengths;
- aiperf's `profile_export_aiperf.json` files (or folders holding them), the deployment given by the flags
  likewise; the file's `input_config.loadgen` says the load, its metrics the lengths, the requests measured
  and the means.

A bad file, row or cell is one InputError naming it, the value and what is allowed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from latency import known_models
from orchestrator import measured_runs
from orchestrator.estimate import read_configs
from orchestrator.fields import InputError
from orchestrator.layout_readings import READINGS
from simulator.benchmarks import AIPERF_DATASET_ENTRIES

#: a spec-key CSV's measured metrics
MEASURED_COLUMNS = tuple(measured_runs.MEASURED_SPEC)
#: the launch a run may state (a spec key it gives) or leave to the profile: what calibrate may choose
LAUNCH_CHOICES = ("max_batched_tokens", "max_num_seqs", "async_scheduling", "prefix_caching")
#: what a spec-key CSV's runs are unless its columns say otherwise: a closed loop measured as `vllm bench
#: serve --max-concurrency` measures it (the common client), not the RFC's burst window
MEASURED_DEFAULTS = {"arrival": "closed", "benchmark": "vllm-bench"}
#: the file aiperf writes its summary of a run to (in its --artifact-dir)
AIPERF_EXPORT = "profile_export_aiperf.json"
#: what one of aiperf's time units is in ms (its JSON export gives each metric's unit)
AIPERF_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}


@dataclass(frozen=True)
class Run:
    """One measured run: the field values that configure it, its measured means, where it came from."""

    values: dict
    ttft_ms: float
    tpot_ms: float
    where: str
    engine: str = ""  # the engine the file names (the silicon format's backend, a spec CSV's engine), "" if none
    states: frozenset = field(default_factory=frozenset)  # LAUNCH_CHOICES the run itself gives
    note: str = ""  # how a silicon row was read where its columns leave something out
    launch: str = ""  # the launch script a silicon row's id names (`launch_set`), "" if none

    def under(self, engine: str) -> dict:
        """The run's field values priced with `engine`: the launch it leaves open (not in `states`) is the
        engine profile's own, the launch it states stays."""
        kept = {k: v for k, v in self.values.items() if k not in LAUNCH_CHOICES or k in self.states}
        return kept | {"engine": engine}


def streamed(run: Run) -> float:
    """The response chunks a second a closed loop's clients received, as measured: each client's request takes its
    TTFT and a TPOT for each token after the first, and a chunk holds a step's tokens of a request (one, or up to
    1 + the MTP drafts). A front end that takes `stream_us` a chunk cannot have streamed more than 1e6 / stream_us:
    calibrate does not try a streaming time that would (orchestrator.fitting)."""
    try:
        clients, out = int(run.values.get("concurrency") or 0), float(run.values.get("output_length") or 0)
        per_chunk = 1 + int(run.values.get("mtp_tokens") or 0)
    except (TypeError, ValueError):  # lengths drawn from a distribution: the run bounds nothing
        return 0.0
    request_ms = run.ttft_ms + max(out - 1, 0) * run.tpot_ms
    return clients * out * 1e3 / request_ms / per_chunk if request_ms > 0 else 0.0


def read_runs(paths, flags: dict) -> list[Run]:
    """Every run in `paths` (CSV or JSON files, folders of aiperf exports), `flags` the field values given on
    the command line."""
    runs = []
    for path in [p for given in map(Path, paths) for p in _aiperf_exports(given)]:
        if path.suffix == ".json":
            data = _json(path)
            runs.append((read_aiperf if "input_config" in data else read_vllm_bench)(path, data, flags))
        elif path.suffix == ".csv":
            runs.extend(read_csv(path, flags))
        else:
            raise InputError("RUNS", str(path), "a .csv (silicon format or spec keys + measured_ttft_ms, "
                             "measured_tpot_ms), a vllm bench serve --save-result .json, an aiperf "
                             "profile_export_aiperf.json or a folder of them")
    return runs


def _aiperf_exports(path: Path) -> list[Path]:
    """A file as it is; a folder (aiperf's artifact directory, or the one AIConfigurator's bench_run.sh
    fills with a `concurrency_N` folder a run): every AIPERF_EXPORT under it, in name order."""
    if not path.is_dir():
        return [path]
    found = sorted(path.rglob(AIPERF_EXPORT))
    if not found:
        raise InputError("RUNS", str(path), f"a folder holding aiperf's {AIPERF_EXPORT} files (none under it)")
    return found


def read_csv(path: Path, flags: dict) -> list[Run]:
    import pandas as pd

    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise InputError("RUNS", str(path), f"a readable CSV file ({err})") from None
    silicon = measured_runs.is_measured(table.columns)
    metrics = tuple(measured_runs.MEASURED) if silicon else MEASURED_COLUMNS
    missing = [c for c in metrics if c not in table.columns]
    if missing:
        raise InputError(f"{path}, columns", ", ".join(missing), "the measured metrics: silicon_ttft_ms and "
                         "silicon_tpot_ms (silicon format) or measured_ttft_ms and measured_tpot_ms (spec keys)")
    defaults = dict(flags) if silicon else MEASURED_DEFAULTS | flags
    configs, unknown, read = read_configs(path, defaults)
    stray = [c for c in unknown if c not in metrics]
    if stray:
        raise InputError(f"{path}, columns", ", ".join(stray), "spec keys (servesweep estimate --help) and "
                         f"{', '.join(metrics)}")
    runs, unrecorded = [], measured_runs.READ_LAUNCH if silicon else ()
    for i, (cells, values) in enumerate(zip(table.to_dict("records"), configs, strict=True)):
        where = f"{path} line {i + 2}"
        given = read[i] if read is not None else {k: v for k, v in cells.items() if v.strip()}
        ttft, tpot = (_measured(cells[c], f"{where}, column {c}") for c in metrics)
        named = values.get("engine", "") if silicon else cells.get("engine", "").strip()  # silicon: as to_spec read it
        runs.append(Run(values, ttft, tpot, where, named, stated(given, flags, unrecorded), reading(given),
                        launch_set(cells.get("id", "")) if silicon else ""))
    return runs


def stated(given: dict, flags: dict, read: tuple = ()) -> frozenset:
    """The launch choices a run states: in its own cells (or its silicon reading, but for the choices `read`, which
    it reads every row with and none records) or on the command line."""
    return frozenset(k for k in LAUNCH_CHOICES if (k in given and k not in read) or k in flags)


def launch_set(run_id: str) -> str:
    """Which launch script a silicon row's id says made it: the date its ids start with (`2026_03_25_...`), the
    `cfg` sets (`..._cfg811`), or "" (ids of neither form: one set). One campaign's sets can measure a layout 2x
    apart (Kimi-K2.5 NVFP4 on 8 B200, experts by TP, 4 requests: TTFT 74 ms in its cfg run, 164 ms in its dated one)."""
    if match := measured_runs.RUN_DATE.match(run_id):
        return match.group(1)
    return "cfg" if re.search(r"_cfg\d+$", run_id) else ""


def reading(spec: dict) -> str:
    """What a silicon row leaves out and how `measured_runs.to_spec` read it: "" where nothing."""
    notes = []
    if spec.get("release_read_as"):
        notes.append(f"no release recorded: read as {spec['release_read_as']}, the release its campaign's other "
                     "runs ran most")
    copy = f" (the id of its copy {spec['layout_id']})" if spec.get("layout_id") else ""
    notes += [said.format(**spec, copy=copy) for column, (_, said) in READINGS.items() if spec.get(column)]
    if spec.get("prefix_cache_evidence"):
        notes.append(f"a cache likely served its campaign's prompts ({spec['prefix_cache_evidence']} for its linear "
                     "layers alone, more than computing every prompt allows); read as the format's rows are, off: "
                     "calibrate tries it on")
    if spec.get("kv_cache_read_as"):
        notes.append(f"no KV-cache dtype recorded: read as {spec['kv_cache_read_as']}, as the profile pricing it "
                     "keeps an FP8 run's (fp8_kv_cache)")
    return "; ".join(notes)


def _json(path: Path) -> dict:
    """A run's JSON file as a dict (vllm bench serve's --save-result or aiperf's export)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError("RUNS", str(path), f"a readable JSON file ({err})") from None
    if not isinstance(data, dict):
        raise InputError("RUNS", str(path), "a JSON object as vllm bench serve --save-result or aiperf writes")
    return data


def _deployment(path: Path, flags: dict, client: str, named) -> dict:
    """The flags, with the model the file names (`named`: vllm bench serve's model_id, aiperf's first model
    name) where --model is not given and we ship that name (a checkpoint of another format, -FP8, is not
    read: its format is the flags'); a client's JSON does not say the device or layout."""
    if "model" not in flags and isinstance(named, str) and named in known_models():
        flags = dict(flags, model=named)
    for key in ("model", "device"):
        if key not in flags:
            raise InputError("--model" if key == "model" else key, None,
                             f"the deployment {path.name} measured (a {client} JSON does not say its device or "
                             "layout, nor a model unless it names one we ship): give --model and --device, and "
                             "its layout (--tp-sizes ...)")
    return flags


def read_vllm_bench(path: Path, data: dict, flags: dict) -> Run:
    """One `vllm bench serve --save-result` file: a closed loop at `max_concurrency`, or a Poisson stream at
    `request_rate`; its mean lengths from the tokens it sent and received; every request measured."""
    flags = _deployment(path, flags, "vllm bench serve", data.get("model_id"))
    where = str(path)
    completed = _key(data, "completed", where, integer=True)
    values = dict(flags, benchmark="vllm-bench",
                  input_length=max(1, round(_key(data, "total_input_tokens", where) / completed)),
                  output_length=max(1, round(_key(data, "total_output_tokens", where) / completed)),
                  num_prompts=int(data.get("num_prompts") or completed))
    rate, cap = data.get("request_rate", "inf"), data.get("max_concurrency")
    finite_rate = rate not in (None, "inf", "Infinity") and math.isfinite(float(rate))
    if cap and not finite_rate:
        values |= {"arrival": "closed", "concurrency": _key(data, "max_concurrency", where, integer=True)}
    elif finite_rate and not cap:
        values |= {"arrival": "poisson", "request_rate": _key(data, "request_rate", where),
                   "burstiness": float(data.get("burstiness") or 1.0)}
    elif not cap:  # every prompt sent at once (vllm bench serve's default): a burst of all of them
        values |= {"arrival": "burst", "concurrency": values["num_prompts"]}
    else:
        raise InputError(f"{where}, keys max_concurrency/request_rate", f"{cap}/{rate}",
                         "max_concurrency with request_rate inf (a closed loop), a finite request_rate without "
                         "max_concurrency (a Poisson stream), or neither (every prompt at once: a burst); a stream "
                         "capped in flight is not modelled")
    return Run(values, _key(data, "mean_ttft_ms", where), _key(data, "mean_tpot_ms", where), where, "vllm",
               stated({}, flags))


def read_aiperf(path: Path, data: dict, flags: dict) -> Run:
    """One aiperf `profile_export_aiperf.json`: the load from its `input_config.loadgen`, the mean lengths
    and the requests measured from its metrics, measured as aiperf measures (its warm-up drains before it
    measures: not played)."""
    names = _within(data, ("input_config", "endpoint", "model_names"), str(path))
    flags = _deployment(path, flags, "aiperf", names[0] if isinstance(names, list) and names else None)
    where = str(path)
    loadgen = _within(data, ("input_config", "loadgen"), where)
    if not isinstance(loadgen, dict):
        raise InputError(f"{where}, key input_config.loadgen", loadgen, "aiperf's load generator settings")
    values = dict(flags, benchmark="aiperf", **_aiperf_load(loadgen, where),
                  input_length=max(1, round(_metric(data, "input_sequence_length", where, time=False))),
                  output_length=max(1, round(_metric(data, "output_sequence_length", where, time=False))),
                  num_prompts=round(_metric(data, "request_count", where, time=False)))
    pool = _within(data, ("input_config", "input", "conversation", "num"), where)
    if pool not in (None, AIPERF_DATASET_ENTRIES) and flags.get("prefix_caching") != "off":
        raise InputError(f"{where}, key input_config.input.conversation.num", pool,
                         f"aiperf's default pool of {AIPERF_DATASET_ENTRIES} prompts (what a prefix cache is "
                         "priced with); for another pool give --prefix-caching off, as the pool then does not matter")
    return Run(values, _metric(data, "time_to_first_token", where), _metric(data, "inter_token_latency", where),
               where, "", stated({}, flags))


def _aiperf_load(loadgen: dict, where: str) -> dict:
    """aiperf's load as our fields: a closed loop at `concurrency` (1 where neither it nor a rate is named,
    as aiperf then runs), or a Poisson stream at `request_rate` (its default mode)."""
    rate, cap, mode = loadgen.get("request_rate"), loadgen.get("concurrency"), loadgen.get("request_rate_mode")
    if rate is None:
        clients = _positive(cap or 1, f"{where}, key input_config.loadgen.concurrency", integer=True)
        return {"arrival": "closed", "concurrency": clients}
    if cap is None and mode in (None, "poisson"):
        return {"arrival": "poisson", "burstiness": 1.0,
                "request_rate": _positive(rate, f"{where}, key input_config.loadgen.request_rate")}
    raise InputError(f"{where}, keys input_config.loadgen concurrency/request_rate/request_rate_mode",
                     f"{cap}/{rate}/{mode}", "concurrency alone (a closed loop) or request_rate alone, poisson "
                     "(a Poisson stream); a constant rate or a stream capped in flight is not modelled")


def _within(data: dict, keys: tuple[str, ...], where: str):
    """The value at a path of nested keys (None where the file leaves it out)."""
    for i, key in enumerate(keys):
        if data is None:
            return None
        if not isinstance(data, dict):
            raise InputError(f"{where}, key {'.'.join(keys[:i])}", data, "a JSON object as aiperf writes it")
        data = data.get(key)
    return data


def _metric(data: dict, key: str, where: str, time: bool = True) -> float:
    """The mean (`avg`) of one of aiperf's metrics; a time in ms."""
    entry = data.get(key)
    if not isinstance(entry, dict):
        raise InputError(f"{where}, key {key}", entry, "aiperf's {unit, avg, ...} summary of the metric")
    value = _positive(entry.get("avg"), f"{where}, key {key}.avg")
    if not time:
        return value
    if entry.get("unit") not in AIPERF_MS:
        raise InputError(f"{where}, key {key}.unit", entry.get("unit"), f"a time unit: {', '.join(AIPERF_MS)}")
    return value * AIPERF_MS[entry["unit"]]


def _key(data: dict, key: str, where: str, integer: bool = False):
    """The number > 0 at `key` of a JSON object (an int where `integer`)."""
    return _positive(data.get(key), f"{where}, key {key}", integer)


def _positive(value, name: str, integer: bool = False):
    """`value` as a number > 0 (an int where `integer`), else one InputError naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (integer and value != int(value)):
        raise InputError(name, value, "an integer > 0" if integer else "a number > 0")
    return int(value) if integer else float(value)


def _measured(text: str, where: str) -> float:
    """A measured time a run must have (`measured_runs.measured_ms`, an empty cell refused too)."""
    value = measured_runs.measured_ms(text, where)
    if value is None:
        raise InputError(where, text, "a measured time in ms > 0")
    return value
