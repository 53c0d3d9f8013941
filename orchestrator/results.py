"""Result tables: the documented columns, and atomic Parquet writes."""

from __future__ import annotations

import os
import uuid
from functools import lru_cache
from pathlib import Path

from orchestrator.fields import FIELDS
from simulator.mix import Lengths

#: a length column holds the typical length; this column beside it the mix as written ("" if fixed)
MIX_SUFFIX = "_mix"

#: columns of a point row (one evaluated concurrency of one instance layout); see README "Results"
POINT_COLUMNS = {
    "role": "agg | prefill | decode: what the instance does",
    "tp": "tensor-parallel size", "pp": "pipeline stages", "dp": "instances side by side", "ep": "expert groups",
    "attention_dp": "attention ranks per instance (MoE; each runs its own batch)",
    "moe_tp": "devices each expert is split over (tp x attention_dp / ep)",
    "concurrency": "requests per instance: in the window (burst), in flight (closed), or the mean in flight "
                   "by Little's law (poisson)",
    "max_batched_tokens": "token budget per step (also the chunk size)",
    "arrival": "burst | closed | poisson", "request_rate": "poisson: offered requests/s per instance",
    "num_prompts": "requests simulated",
    "ttft_ms": "mean time to first token (from arrival)", "tpot_ms": "mean time per output token after the first",
    "ttft_p50_ms": "", "ttft_p90_ms": "", "ttft_p99_ms": "", "tpot_p50_ms": "", "tpot_p90_ms": "", "tpot_p99_ms": "",
    "itl_ms": "mean inter-token latency (decode step time per token)", "itl_p50_ms": "", "itl_p90_ms": "",
    "itl_p99_ms": "", "e2e_ms": "mean end-to-end latency (arrival to last token)", "e2e_p50_ms": "",
    "e2e_p90_ms": "", "e2e_p99_ms": "",
    "ttft_slo_ms": "TTFT at the SLO percentile (the mean without one): what the limit is checked on",
    "tpot_slo_ms": "TPOT at the SLO percentile (the mean without one)",
    "makespan_ms": "time until the last request finishes",
    "request_throughput": "requests/s over all dp instances (steady window, or N / makespan for a burst)",
    "output_throughput": "output tokens/s, all instances",
    "output_throughput_per_device": "output tokens/s per device",
    "goodput": "requests/s within both limits, all instances (NaN with several limit pairs)",
    "measured_requests": "requests the latencies are over (warm-up and drain left out)",
    "steady": "a steady window existed (else every request is measured)",
    "num_steps": "forward steps simulated", "prefill_num_chunks": "chunks per prompt",
    "decoding_requests": "mean requests decoding per step, time-weighted, all attention ranks (below the "
                         "concurrency when the KV cache bound admission)",
    "kv_bound": "the KV cache bound admission: requests waited for blocks, as the engine's capacity scheduler "
                "admits them",
    "preemptions": "running requests preempted for KV blocks (freed, recomputed later)",
    "effective_input_length": "prompt tokens left after the prefix cache",
    "peak_kv_tokens": "KV tokens held at the fullest step",
    "kv_capacity_tokens": "KV tokens that fit per instance (beside what each request it holds keeps whatever its "
                          "context: recurrent states, sliding windows)",
    "weights_gib": "weights per device", "kv_gib": "KV at the fullest step per device",
    "activation_gib": "activation peak per device", "reserved_gib": "HBM per device the engine leaves free in this "
    "layout (its memory utilisation's rest, or its own rule: SGLang's grows with the GPUs and attention-DP ranks)",
    "available_gib": "HBM left at the fullest step",
    "fits_memory": "peak KV within capacity",
    "usd_per_hour": "what the deployment's devices cost per hour (--device-price or the device file; NaN: unknown)",
    "usd_per_mtok": "USD per million output tokens at this throughput (NaN: no price known)",
}


#: integer and boolean result columns (scenario columns take their type from the field table)
INT_COLUMNS = {"tp", "pp", "dp", "ep", "attention_dp", "moe_tp", "concurrency", "max_batched_tokens", "num_steps",
               "prefill_num_chunks",
               "num_prompts", "measured_requests", "preemptions",
               "effective_input_length", "kv_capacity_tokens", "prefill_tp", "decode_tp", "prefill_concurrency",
               "decode_concurrency", "prefill_instances", "decode_instances", "devices_used", "cached_tokens"}
BOOL_COLUMNS = {"fits_memory", "feasible", "steady", "measured", "kv_bound"}
STR_COLUMNS = {"role", "scenario_id", "mode", "message", "model", "device"}


def _column_kinds() -> dict:
    kinds = {}
    for f in FIELDS:
        if f.column and f.kind is Lengths:  # the typical length, and the mix as written
            kinds[f.column], kinds[f.column + MIX_SUFFIX] = int, str
        elif f.column:
            kinds[f.column] = f.kind if (not f.many or f.scalar_column) else str
    return kinds


_SCENARIO_KINDS = _column_kinds()


def column_type(column: str):
    """The Arrow type of a result column."""
    import pyarrow as pa

    kind = _SCENARIO_KINDS.get(column)
    if column in INT_COLUMNS or kind is int:
        return pa.int64()
    if column in BOOL_COLUMNS:
        return pa.bool_()
    if column in STR_COLUMNS or kind is str:
        return pa.string()
    return pa.float64()


def scenario_columns(scenario) -> dict:
    """The scenario's fields as flat columns, named and typed by the field table: a list field is
    its values joined by spaces, or its single value where the field says so."""
    out = {}
    for f in FIELDS:
        if not f.column:
            continue
        v = getattr(scenario, f.name)
        if f.kind is Lengths:
            out[f.column + MIX_SUFFIX] = str(v) if isinstance(v, Lengths) else (str(scenario.request_mix)
                                                                               if scenario.trace else "")
            v = scenario.typical(f.name)
        elif f.many and f.scalar_column and len(v) <= 1:
            v = v[0] if v else None
        elif f.many:
            v = " ".join(map(str, v))
        out[f.column] = v
    return out


@lru_cache(maxsize=64)
def columns_schema(columns: tuple[str, ...]):
    """The Arrow schema of a table of these result columns, each typed by `column_type` (a sweep's scenarios
    share a few column sets)."""
    import pyarrow as pa

    return pa.schema([(c, column_type(c)) for c in columns])


def rows_schema(rows: list[dict]):
    """The Arrow schema of result rows: their columns in the order they first appear."""
    return columns_schema(tuple(dict.fromkeys(k for row in rows for k in row)))


class JsonRows:
    """Rows to an Arrow table through Arrow's JSON reader, which builds the columns in C++: Table.from_pylist
    asks pyarrow's pandas shim about the values and so imports pandas, a third of a steady 8-GPU question's
    process, where a command writes its one answer (a sweep's many files take from_pylist: cheaper each).
    The claim that makes it exact: under an explicit schema, the JSON of rows whose values are None, bool,
    int, float (repr reads back as the same double; +-inf too, and a NaN as the one NaN, which is all JSON
    says of it) or str reads back as the table from_pylist builds; rows json or the reader refuses (numpy
    integers, a string in a number column) take from_pylist. `enabled = False` builds every table with
    from_pylist (tests/orchestrator/test_results.py proves the two equal)."""

    enabled = True

    def table(self, rows: list[dict], schema):
        import pyarrow as pa

        if self.enabled and rows:
            try:
                return self.read(rows, schema)
            except (TypeError, ValueError, pa.ArrowException):
                pass
        return pa.Table.from_pylist(rows, schema=schema)

    @staticmethod
    def read(rows: list[dict], schema):
        """The table Arrow's JSON reader reads from the rows (the columns `schema` names); TypeError,
        ValueError or ArrowException where json or the reader cannot take them."""
        import json

        import pyarrow as pa
        import pyarrow.json as pajson

        text = "\n".join(map(json.dumps, rows)).encode()
        return pajson.read_json(pa.py_buffer(text), read_options=pajson.ReadOptions(use_threads=False),
                                parse_options=pajson.ParseOptions(explicit_schema=schema,
                                                                  unexpected_field_behavior="ignore"))


def write_parquet(rows: list[dict], path: str | Path, schema=None, filesystem=None, once: bool = False) -> str:
    """Write rows to `path` so that it appears whole or not at all (see `write_bytes`): the columns
    `schema` names (keys a row lacks are null), by default every column of the rows typed by
    `column_type`. A sweep writes two small files per scenario: plain-encoded, without dictionaries and
    column statistics (which save little in a file of a few dozen rows), a write costs half as much (2.5 ->
    1.1 ms for 43 rows of 82 columns; the driver of a sweep writes two a scenario). `once`: the process
    writes this one file (a command's answer), so the rows go through Arrow's JSON reader (`JsonRows`: 4-6 ms
    more a file than from_pylist, which costs a process pandas' import, 150-300 ms, the first time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    schema = rows_schema(rows) if schema is None else schema
    table = JsonRows().table(rows, schema) if once else pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, sink, use_dictionary=False, write_statistics=False, column_encoding="PLAIN")
    return write_bytes(sink.getvalue().to_pybytes(), path, filesystem)


def write_frame(frame, path: str | Path) -> str:
    """A pandas DataFrame to `path` (.parquet, else CSV), whole or not at all (`write_bytes`): a run interrupted
    while writing leaves the file as it was, not half of the new one."""
    import io

    if str(path).endswith(".parquet"):
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        return write_bytes(buffer.getvalue(), path)
    return write_bytes(frame.to_csv(index=False).encode(), path)


#: the reports' figures: dots per inch (small files, legible in a browser)
FIGURE_DPI = 80


def write_png(figure, path: str | Path) -> str:
    """A matplotlib figure to `path` as PNG, whole or not at all (`write_bytes`)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=FIGURE_DPI, format="png")
    return write_bytes(buffer.getvalue(), path)


def temporary_name(path: Path) -> Path:
    """Where `write_bytes` writes before its rename: a hidden name beside the file."""
    return path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"


#: what `temporary_name` names, to find those a killed writer left
TEMPORARY_GLOB = ".*.parquet.*.tmp"


def write_bytes(data: bytes, path: str | Path, filesystem=None) -> str:
    """Write a file atomically. Local disk: a temporary name in the same folder, then rename (the
    temporary file is removed if the write fails or is interrupted). Object store: one upload; the
    object becomes visible only when it completes."""
    import pyarrow.fs as pafs

    fs = filesystem or pafs.LocalFileSystem()
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_output_stream(str(path)) as out:
            out.write(data)
        return str(path)
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:  # interrupted or failed: leave no half-written file behind
        tmp.unlink(missing_ok=True)
        raise
    return str(path)
