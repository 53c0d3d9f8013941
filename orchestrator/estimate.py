"""`servesweep estimate`: one configuration, no search, or many from a CSV in one process.

A configuration is a scenario with one layout, one budget and one load (a concurrency, or a
request rate for Poisson arrivals). The answer is the point row (metrics and memory), plus a per-op
breakdown of a typical prefill step and decode step with what bounds each op.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from latency import ForwardKey, load_device
from orchestrator import measured_runs
from orchestrator.engine_defaults import launch_budget
from orchestrator.evaluate import costs, evaluate_point, with_prompt_cache, workload
from orchestrator.fields import FIELD_BY_KEY, FIELD_BY_NAME, FIELDS, InputError
from orchestrator.held_back import add_running
from orchestrator.jobs import Job
from orchestrator.point_tables import point_tables
from orchestrator.run_copies import with_copied_layouts
from orchestrator.scenario import Scenario
from orchestrator.served_prompts import with_cache_evidence
from simulator.standin import StandIn, seats

#: the devices `estimate` runs on when neither --num-devices nor a layout is given (`vllm serve`'s default)
ONE_DEVICE = 1


def configure(values: dict) -> Scenario:
    """A validated one-configuration scenario from field values; the layout defaults to one instance
    over all devices (one device when no count is given), the budget to the engine's default on the device."""
    values = dict(values)
    for f in FIELDS:
        if f.required and values.get(f.name) is None:
            raise InputError(f.name, None, "a value (it is required)")
    if not values.get("max_batched_tokens"):
        try:
            values["max_batched_tokens"] = (launch_budget(values.get("engine", "none"), load_device(values["device"])),)
        except ValueError as err:
            raise InputError("device", values["device"], str(err).split("; ", 1)[-1]) from None
    if not values.get("attention_dp_sizes"):
        values["attention_dp_sizes"] = (1,)
    if not values.get("tp_sizes"):
        if values.get("num_devices") is None:  # no layout: one device, as `vllm serve` runs without one
            values["num_devices"] = ONE_DEVICE
        adp = values["attention_dp_sizes"][0] if len(values["attention_dp_sizes"]) == 1 else 1
        values["tp_sizes"] = (values["num_devices"] // (values.get("pp", 1) * adp) or 1,)
    s = Scenario(**values)
    for name in ("tp_sizes", "attention_dp_sizes", "max_batched_tokens"):
        if len(getattr(s, name)) != 1:
            raise InputError(name, list(getattr(s, name)), "exactly one value for estimate")
    s = _resolve_ep(s)
    s.validate()
    return s


def _resolve_ep(s: Scenario) -> Scenario:
    """estimate takes one layout: ep 0 becomes tp x attention_dp / moe_tp when moe_tp is given, else 1;
    a moe_tp given with ep must agree with it."""
    experts_over = s.tp_sizes[0] * s.attention_dp_sizes[0]
    if s.moe_tp:
        if experts_over % s.moe_tp:
            raise InputError("moe_tp", s.moe_tp, f"a divisor of tp x attention_dp = {experts_over}")
        if s.ep and s.ep * s.moe_tp != experts_over:
            raise InputError("moe_tp", s.moe_tp, f"tp x attention_dp / ep = {experts_over} / {s.ep} "
                             f"(moe_tp x ep must equal tp x attention_dp)")
        return s.with_(ep=experts_over // s.moe_tp)
    return s if s.ep else s.with_(ep=1)


def job_of(s: Scenario) -> Job:
    """The one job of a configured scenario (its single tp size and budget)."""
    (layout,) = s.layouts()
    return Job(s.role, layout, s.max_batched_tokens[0])


def busiest_rank(concurrency: int, ranks: int) -> int:
    """Requests on the busiest attention-DP rank: the engines' balancers give each rank
    floor(C / ranks) or one more (C = 5 over 4 ranks: 2, 1, 1, 1)."""
    return -(-concurrency // ranks)


def estimate(s: Scenario) -> dict:
    """The point row of the configuration (throughputs over all dp instances). Attention-DP ranks
    step in lockstep (the MoE layers join them every layer), so every rank runs at the busiest one's
    pace: latencies and memory are the busiest rank's, and the instance's throughputs are the busiest
    rank's scaled by the requests in flight (a lighter rank makes fewer tokens a step)."""
    job = job_of(s)
    ranks = job.layout.attention_dp
    if s.arrival == "poisson":
        return evaluate_point(s, job, s.concurrency // ranks, rate=s.request_rate / ranks)
    n = busiest_rank(s.concurrency, ranks)
    row = evaluate_point(s, job, n)
    if n * ranks == s.concurrency:
        return row
    share = s.concurrency / (n * ranks)
    row = dict(row, concurrency=s.concurrency)
    for column in ("request_throughput", "output_throughput", "output_throughput_per_device", "goodput"):
        row[column] *= share
    for column in ("num_prompts", "measured_requests"):
        row[column] = round(row[column] * share)
    return {**row, **costs(s.usd_per_device_hour * s.num_devices, row["output_throughput"])}


def run_tables(s: Scenario):
    """The configuration's run request by request and step by step (two DataFrames): what
    `estimate --per-request` writes and `report` draws."""
    import pandas as pd

    requests, steps = point_tables(s, *busiest_point(s))
    return pd.DataFrame(requests), pd.DataFrame(steps)


def busiest_point(s: Scenario) -> tuple[Job, int, float | None]:
    """(job, requests on the busiest attention-DP rank, its share of a Poisson rate) of the configuration."""
    job = job_of(s)
    ranks = job.layout.attention_dp
    return job, busiest_rank(s.concurrency, ranks), s.request_rate / ranks if s.arrival == "poisson" else None


def stand_in_note(s: Scenario) -> str | None:
    """How a closed loop of more clients than the engine seats was planned (simulator.standin); None when
    it was planned as it is."""
    job, n, rate = busiest_point(s)
    stand_in = StandIn.make(workload(s, job.max_batched_tokens, n, rate), s.make_scheduler(n))
    if stand_in is None:
        return None
    return (f"{stand_in.clients} clients a rank, more than the engine runs at once: planned as a loop of "
            f"{stand_in.stand_in} that keeps it as busy, the others' wait in its queue added to TTFT and E2E "
            "(Little's law)")


def prompt_cache_hits(s: Scenario) -> tuple[float, int, int] | None:
    """(share of the requests that found their prompt cached, requests, prompt tokens the cache kept)
    where the client reuses prompts and the engine caches them (simulator.prompts); None elsewhere."""
    import numpy as np

    job, n, rate = busiest_point(s)
    w = with_prompt_cache(workload(s, job.max_batched_tokens, n, rate), s.latency_model(job.layout))
    if w.prompt_pool is None or not w.prompt_pool.cached:
        return None
    inputs, _, cached = w.request_lengths()
    return float(np.mean(cached > np.floor(inputs * w.prefix_cache_hit_rate))), w.prompts, w.prompt_pool.cache_tokens


def steps_path(path: str) -> str:
    """Where the step table goes beside a per-request table: run.parquet -> run.steps.parquet."""
    return path[: -len(".parquet")] + ".steps.parquet" if path.endswith(".parquet") else path + ".steps.parquet"


def typical_steps(s: Scenario, row: dict) -> list[ForwardKey]:
    """A prefill step of one full chunk and a decode step at mid-output context of the requests the engine
    runs at once: the run's concurrency, up to max_num_seqs, or what the KV cache let decode where it bound."""
    job = job_of(s)
    chunk = min(job.max_batched_tokens, row["effective_input_length"])
    keys = [] if s.role == "decode" else [ForwardKey(False, 1, chunk, chunk)]
    if s.role != "prefill" and s.typical("output_length") > 1:
        ranks = row.get("attention_dp", 1)
        per_rank = busiest_rank(row["concurrency"], ranks)
        per_rank = min(per_rank, seats(s.make_scheduler(per_rank)) or per_rank)
        if row["kv_bound"]:
            per_rank = min(per_rank, math.ceil(row["decoding_requests"] / ranks))
        keys.append(ForwardKey(True, max(1, per_rank), 1 + s.mtp_tokens,
                               s.typical("input_length") + s.typical("output_length") // 2))
    return keys


def backend_notes(s: Scenario) -> list[str]:
    """What the latency backend says about how it priced this deployment (a backend's optional `notes`)."""
    return list(getattr(s.latency_model(job_of(s).layout), "notes", ()))


def breakdown(s: Scenario, row: dict):
    """Per-op ms, share and bound (compute, memory, communication, overhead) of the typical steps."""
    lm = s.latency_model(job_of(s).layout)
    table = lm.breakdown(typical_steps(s, row))
    table.insert(0, "step", ["decode" if k.is_decode else "prefill" for k in table.pop("key")])
    return table


def read_configs(path: Path, defaults: dict):
    """The rows of a CSV as field values over `defaults`; a bad cell raises InputError naming the
    line and column. A file of measured runs in AIConfigurator's format (orchestrator.measured_runs)
    is read as the configurations it measured. Returns (list of values, unknown columns, the spec
    keys each measured run was read as, or None for a file of spec keys)."""
    import pandas as pd

    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise InputError("--from-csv", str(path), f"a readable CSV file ({err})") from None
    rows, read = table.to_dict("records"), None
    if measured_runs.is_measured(table.columns):
        # a flag given on the command line wins over what a row leaves to a reading (its backend's profile, its
        # launch, client and cache), never over what it measured
        given = {key: FIELD_BY_KEY[key].text(defaults[FIELD_BY_KEY[key].name])
                 for key in measured_runs.replaced_readings(defaults)}
        copies = with_copied_layouts(measured_runs.as_format_reads(rows))
        runs = with_cache_evidence(measured_runs.read_releases(copies))
        specs = [measured_runs.to_spec(cells, f"{path} line {i + 2}", defaults.get("engine", ""),
                                       defaults.get("kv_cache_dtype", ""))
                 for i, cells in enumerate(runs)]
        rows = [{key: value for key, value in spec.items() if key not in given} for spec in specs]
        read = [spec | {key: text for key, text in given.items() if key in spec} for spec in specs]  # as run
        unknown = []
    else:
        unknown = [c for c in table.columns if c not in FIELD_BY_KEY]
        for column in [c for c in unknown if c in measured_runs.MEASURED_SPEC]:  # calibrate's form: checked first
            for i, text in enumerate(table[column]):
                measured_runs.measured_ms(text, f"{path} line {i + 2}, column {column}")
    configs = []
    for i, cells in enumerate(rows):
        values = dict(defaults)
        for column, text in cells.items():
            f = FIELD_BY_KEY.get(column)
            if f is None or text.strip() == "":
                continue
            try:
                parsed = tuple(f.parse(t) for t in text.split()) if f.many else f.parse(text)
            except InputError as err:
                raise InputError(f"{path} line {i + 2}, column {column}", err.value, err.allowed) from None
            values[f.name] = parsed
        configs.append(values)
    return configs, unknown, read


def estimate_many(path: Path, defaults: dict, progress: bool = True) -> tuple:
    """Estimate every row of a CSV: (input table with the metric columns added, unknown columns)."""
    import pandas as pd
    from tqdm import tqdm

    configs, unknown, read = read_configs(path, defaults)
    rows, loads = [], []
    for i, values in enumerate(tqdm(configs, desc="estimate", unit="row", disable=not progress, file=sys.stderr)):
        try:
            s = configure(values)
        except InputError as err:
            f = FIELD_BY_NAME.get(err.name)
            column = f.key if f else err.name
            raise InputError(f"{path} line {i + 2}, column {column}", err.value, err.allowed) from None
        rows.append(estimate(s))
        loads.append({"arrival": s.arrival, "clients": s.concurrency, "output": s.typical("output_length")})
    kept = pd.read_csv(path)  # the input as the user wrote it, typed by pandas
    loads = pd.DataFrame(loads, index=kept.index, columns=["arrival", "clients", "output"])
    metrics = pd.DataFrame(rows, index=kept.index)
    if read is not None:  # the measured runs kept; how we read each, our figures, our errors
        read = pd.DataFrame(read, index=kept.index)
        metrics = metrics[[c for c in metrics.columns if c not in read.columns]]
        table = measured_runs.add_errors(pd.concat([kept, read, metrics], axis=1), metrics)
        return add_running(table, measured_runs.MEASURED, loads), unknown
    for column in [c for c in metrics.columns if c in kept.columns]:  # an empty cell shows the value used
        filled = kept[column].fillna(metrics[column])
        kept[column] = filled.astype(metrics[column].dtype) if filled.notna().all() else filled
    metrics = metrics[[c for c in metrics.columns if c not in kept.columns]]
    table = measured_runs.add_errors(pd.concat([kept, metrics], axis=1), metrics, measured_runs.MEASURED_SPEC)
    table = add_running(table, measured_runs.MEASURED_SPEC, loads)
    return table, [c for c in unknown if c not in measured_runs.MEASURED_SPEC]  # calibrate's form: errors beside
