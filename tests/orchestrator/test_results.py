"""Result tables written without pandas: Arrow's JSON reader (results.JsonRows) against Table.from_pylist."""

import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.results import JsonRows, rows_schema, write_frame, write_parquet

#: a column of each type the result columns take (results.column_type)
VALUES = {
    "tp": st.integers(-2**63, 2**63 - 1),
    "ttft_ms": st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2**53, 2**53),
    "model": st.text(st.characters(blacklist_categories=("Cs",))),
    "fits_memory": st.booleans(),
}
ROWS = st.lists(st.fixed_dictionaries({}, optional={k: st.none() | v for k, v in VALUES.items()}), min_size=1,
                max_size=20)


def parquet_bytes(table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@settings(max_examples=150, deadline=None)
@given(ROWS)
def test_the_json_reader_builds_the_table_from_pylist_builds(rows):
    """The fast path's claim: rows of None, bool, int, float (NaN and +-inf too) and str values, any of them
    missing, read through Arrow's JSON reader under the columns' schema make the file from_pylist makes, byte
    for byte, but that every NaN is the one NaN (JSON has no payloads); the fast path is taken, not fallen back
    from."""
    schema = rows_schema(rows)
    fast = JsonRows.read(rows, schema)
    one_nan = [{k: math.nan if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
    assert parquet_bytes(fast) == parquet_bytes(pa.Table.from_pylist(one_nan, schema=schema))


def test_rows_the_json_reader_cannot_take_are_built_as_before():
    """A numpy integer (json refuses it) and a string in a number column (the reader refuses it) take
    from_pylist: the same table as with the fast path off, or the same error."""
    rows = [{"tp": np.int64(4), "ttft_ms": 1.5}, {"tp": 2, "ttft_ms": float("nan")}]
    schema = rows_schema(rows)
    with pytest.raises(TypeError):
        JsonRows.read(rows, schema)
    off = JsonRows()
    off.enabled = False
    assert parquet_bytes(JsonRows().table(rows, schema)) == parquet_bytes(off.table(rows, schema))
    assert JsonRows().table(rows, schema).column("tp").to_pylist() == [4, 2]
    bad = [{"ttft_ms": "fast"}]
    with pytest.raises(pa.ArrowException):
        JsonRows.read(bad, rows_schema(bad))
    with pytest.raises(pa.ArrowInvalid):
        JsonRows().table(bad, rows_schema(bad))


def test_a_result_file_keeps_every_column_typed_and_the_values(tmp_path):
    """write_parquet without a schema types every column by the field table, in the order the rows name them:
    an integral float stays a double, a missing value is null."""
    rows = [{"model": "Qwen/Qwen3-32B", "tp": 2, "ttft_ms": 3.0, "fits_memory": True},
            {"model": "Qwen/Qwen3-8B", "tp": 1, "tpot_ms": 0.1 + 0.2, "fits_memory": False}]
    table = pq.read_table(write_parquet(rows, tmp_path / "r.parquet"))
    assert pq.read_table(write_parquet(rows, tmp_path / "once.parquet", once=True)).equals(table)
    assert table.schema == pa.schema([("model", pa.string()), ("tp", pa.int64()), ("ttft_ms", pa.float64()),
                                      ("fits_memory", pa.bool_()), ("tpot_ms", pa.float64())])
    got = table.to_pylist()
    assert got[1]["tpot_ms"] == 0.30000000000000004 and got[1]["ttft_ms"] is None and got[0]["tpot_ms"] is None
    assert math.isclose(got[0]["ttft_ms"], 3.0)


def test_writing_a_result_file_does_not_import_pandas(tmp_path):
    """What the fast path is for: `optimize --output` writes its answer to Parquet without importing pandas (a
    sweep's many files take from_pylist: 4-6 ms less a file)."""
    out = tmp_path / "r.parquet"
    code = ("import sys; from orchestrator.cli import run; sys.argv = ['servesweep', 'optimize', 'Qwen/Qwen3-8B', "
            "'--device', 'H100_SXM', '--num-devices', '1', '--input-length', '1024', '--output-length', '64', "
            f"'--tpot-limits', '50', '--no-progress', '--output', {str(out)!r}]; code = run(); "
            "print('pandas imported:', 'pandas' in sys.modules); sys.exit(code)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith("pandas imported: False"), p.stdout
    table = pq.read_table(out)
    assert table.num_rows > 0 and table.schema.field("tp").type == pa.int64()


def test_a_frame_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """write_frame (estimate --output and --per-request, report's best.csv): CSV or Parquet by the name, the same
    as pandas writes them; a write interrupted halfway through its bytes leaves the file as it was and no
    temporary file beside it, in either format."""
    import pandas as pd

    frame = pd.DataFrame({"tp": [1, 2], "ttft_ms": [12.5, float("nan")], "model": ["a", "b,c"]})
    csv, parquet = tmp_path / "x.csv", tmp_path / "x.parquet"
    write_frame(frame, csv)
    write_frame(frame, parquet)
    assert csv.read_text() == frame.to_csv(index=False)
    assert pd.read_parquet(parquet).equals(frame)

    def half_then_interrupted(self, data):
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(type(parquet), "write_bytes", half_then_interrupted)
    for path in (csv, parquet):
        with pytest.raises(KeyboardInterrupt):
            write_frame(frame.iloc[:1], path)
    monkeypatch.undo()
    assert csv.read_text() == frame.to_csv(index=False)
    assert pd.read_parquet(parquet).equals(frame)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv", "x.parquet"]
