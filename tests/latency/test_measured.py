"""The measured backend, pinned: what a table must hold (exact messages), trilinear interpolation by
hand, the grid's edges, CSV and Parquet alike."""

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from latency import ForwardKey, MeasuredLatency
from latency.measured import read_table


def grid(decode: bool, f) -> pd.DataFrame:
    """A full grid over concurrency {1, 3}, query_len {1, 5}, seq_len {10, 30} with latency f(c, q, s)."""
    rows = [{"is_decode": int(decode), "concurrency": c, "query_len": q, "seq_len": s, "latency_ms": f(c, q, s)}
            for c, q, s in itertools.product((1, 3), (1, 5), (10, 30))]
    return pd.DataFrame(rows)


def table() -> pd.DataFrame:
    return pd.concat([grid(False, lambda c, q, s: 1 + c + 2 * q + 0.1 * s),
                      grid(True, lambda c, q, s: 0.5 + c * q * s / 100)], ignore_index=True)


def test_interpolates_by_hand_inside_and_hits_the_grid_points(tmp_path):
    lm = MeasuredLatency(table())
    # prefill is linear in each axis: interpolation is exact
    assert lm.latency_ms([ForwardKey(False, 2, 3, 20)])[0] == pytest.approx(1 + 2 + 6 + 2)
    # decode c * q * s / 100 is trilinear: at the cube's centre, the mean of the 8 corners
    corners = [0.5 + c * q * s / 100 for c, q, s in itertools.product((1, 3), (1, 5), (10, 30))]
    assert lm.latency_ms([ForwardKey(True, 2, 3, 20)])[0] == pytest.approx(sum(corners) / 8)
    # a corner and an edge of the grid are the table's own values (the edge is inside, not outside)
    assert lm.latency_ms([ForwardKey(True, 3, 5, 30), ForwardKey(False, 1, 1, 10)]).tolist() == \
        pytest.approx([0.5 + 4.5, 1 + 1 + 2 + 1])
    # one step along seq_len only: 10 -> 30 at a quarter
    assert lm.latency_ms([ForwardKey(True, 1, 1, 15)])[0] == pytest.approx(0.5 + 0.1 + 0.25 * 0.2)
    (tmp_path / "t.parquet").write_bytes(b"")
    table().to_parquet(tmp_path / "t.parquet")
    table().to_csv(tmp_path / "t.csv", index=False)
    keys = [ForwardKey(True, 2, 2, 12), ForwardKey(False, 3, 4, 29)]
    assert MeasuredLatency(tmp_path / "t.parquet").latency_ms(keys).tolist() == \
        MeasuredLatency(tmp_path / "t.csv").latency_ms(keys).tolist() == lm.latency_ms(keys).tolist()


def test_outside_the_grid_is_refused_or_clamped_as_asked():
    with pytest.raises(ValueError, match=r"^seq_len=31 is outside the measured grid \[10, 30\]$"):
        MeasuredLatency(table()).latency_ms([ForwardKey(True, 1, 1, 31)])
    with pytest.raises(ValueError, match=r"^concurrency=4 is outside the measured grid \[1, 3\]$"):
        MeasuredLatency(table()).latency_ms([ForwardKey(True, 2, 1, 20), ForwardKey(True, 4, 1, 20)])
    clamp = MeasuredLatency(table(), outside="clamp")
    with pytest.warns(UserWarning, match=r"seq_len outside the measured grid \[10, 30\]: clamped"):
        assert clamp.latency_ms([ForwardKey(True, 1, 1, 50)])[0] == pytest.approx(0.5 + 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inside the grid: no warning
        clamp.latency_ms([ForwardKey(True, 1, 1, 30)])
    with pytest.raises(ValueError, match=r"^outside must be one of \('error', 'clamp'\), got 'wrap'$"):
        MeasuredLatency(table(), outside="wrap")
    with pytest.raises(ValueError, match="^measured table has no decode rows$"):
        MeasuredLatency(grid(False, lambda c, q, s: 1.0)).latency_ms([ForwardKey(True, 1, 1, 10)])


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.drop(columns=["seq_len"]), r"^measured table lacks columns \['seq_len'\]; needs \['is_decode', "
                                            r"'concurrency', 'query_len', 'seq_len', 'latency_ms'\]$"),
    (lambda t: t.assign(latency_ms=0.0), r"^measured table has latency_ms <= 0 or a key field < 1$"),
    (lambda t: t.assign(query_len=t["query_len"] - 1), r"^measured table has latency_ms <= 0 or a key field < 1$"),
    (lambda t: t.iloc[1:], r"^measured prefill rows are not a full grid over \('concurrency', 'query_len', "
                           r"'seq_len'\): 7 rows for 2 x 2 x 2 axis values$"),
    (lambda t: pd.concat([t, t.iloc[[0]]]), r"^measured prefill rows are not a full grid .*: 9 rows for 2 x 2 x 2"),
])
def test_a_table_that_cannot_be_used_says_why(edit, message):
    with pytest.raises(ValueError, match=message):
        MeasuredLatency(edit(table()))


def test_small_positive_latencies_and_integer_flags_are_read_as_they_are(tmp_path):
    t = table().assign(latency_ms=lambda d: d["latency_ms"] / 100)  # sub-millisecond steps are fine
    rows = read_table(t)
    assert rows["is_decode"].dtype == bool and rows["is_decode"].sum() == 8
    assert MeasuredLatency(t).latency_ms([ForwardKey(False, 1, 1, 10)])[0] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="^cannot read measured table .*nope.csv: "):
        read_table(tmp_path / "nope.csv")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="^cannot read measured table .*bad.parquet: "):
        read_table(tmp_path / "bad.parquet")
    a, b = MeasuredLatency(table()), MeasuredLatency(table(), name="h200")
    assert a.fingerprint.split("|")[1] == b.fingerprint.split("|")[1] and b.fingerprint.startswith("h200|")
    assert MeasuredLatency(t).fingerprint != a.fingerprint and np.isfinite(a.latency_ms([ForwardKey(True, 1, 1, 10)]))


def test_each_point_is_interpolated_in_its_own_cell_of_a_curved_grid():
    """Three values per axis and a curved, separable latency c^2 + q^2 + s^2/100: trilinear interpolation
    of a sum is the sum of the axes' piecewise-linear interpolations, so each value is by hand, and a
    point priced from a neighbouring cell (extrapolating its line) comes out different."""
    rows = [{"is_decode": 1, "concurrency": c, "query_len": q, "seq_len": s, "latency_ms": c * c + q * q + s * s / 100}
            for c, q, s in itertools.product((1, 2, 4), (1, 2, 4), (10, 20, 40))]
    lm = MeasuredLatency(pd.DataFrame(rows), outside="clamp")
    keys = [ForwardKey(True, 3, 3, 30),     # the upper cells: 10 + 10 + 10 (4 -> 16 at the middle, each axis)
            ForwardKey(True, 1, 1, 15),     # the lower cells along s: 1 + 1 + (1 + 4) / 2
            ForwardKey(True, 4, 4, 40),     # the last grid point: 16 + 16 + 16
            ForwardKey(True, 2, 2, 20)]     # an inner grid point: 4 + 4 + 4
    assert lm.latency_ms(keys).tolist() == pytest.approx([30.0, 4.5, 48.0, 12.0])
    with pytest.warns(UserWarning, match=r"seq_len outside the measured grid \[10, 40\]: clamped"):
        assert lm.latency_ms([ForwardKey(True, 1, 1, 5)])[0] == pytest.approx(1 + 1 + 1)  # clamped up to 10


def test_the_value_outside_the_grid_is_named_and_a_unit_cell_reaches_its_top():
    """Keys on the grid's edges are inside: the message names the one outside. The top cell of
    concurrency {1, 3, 4} is one wide: its top point is the table's value there, not the cell's base."""
    rows = [{"is_decode": 1, "concurrency": c, "query_len": q, "seq_len": s, "latency_ms": c * c + q + s}
            for c, q, s in itertools.product((1, 3, 4), (1, 2), (10, 20))]
    lm = MeasuredLatency(pd.DataFrame(rows))
    with pytest.raises(ValueError, match=r"^concurrency=5 is outside the measured grid \[1, 4\]$"):
        lm.latency_ms([ForwardKey(True, 4, 1, 10), ForwardKey(True, 1, 1, 10), ForwardKey(True, 5, 1, 10)])
    with pytest.raises(ValueError, match=r"^concurrency=5 is outside the measured grid \[1, 4\]$"):
        lm.latency_ms([ForwardKey(True, 3, 1, 10), ForwardKey(True, 5, 1, 10)])
    assert lm.latency_ms([ForwardKey(True, 4, 1, 10), ForwardKey(True, 2, 2, 20)]).tolist() == \
        pytest.approx([16 + 1 + 10, (1 + 9) / 2 + 2 + 20])
