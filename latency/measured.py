"""A measured backend (profiled step latencies, interpolated) and calibration of the roofline."""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latency.keys import ForwardKey, keys_to_arrays

COLUMNS = ("is_decode", "concurrency", "query_len", "seq_len", "latency_ms")
AXES = ("concurrency", "query_len", "seq_len")
OUTSIDE = ("error", "clamp")


def read_table(table):
    """A table of measured steps (CSV or Parquet, or a DataFrame) with the ForwardKey columns and latency_ms."""
    import pandas as pd

    if isinstance(table, (str, Path)):
        path = Path(table)
        try:
            table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read measured table {path}: {err}") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"measured table lacks columns {missing}; needs {list(COLUMNS)}")
    out = table[list(COLUMNS)].copy()
    out["is_decode"] = out["is_decode"].astype(bool)
    if (out["latency_ms"] <= 0).any() or out[list(AXES)].lt(1).any().any():
        raise ValueError("measured table has latency_ms <= 0 or a key field < 1")
    return out


class _Grid:
    """Multilinear interpolation over the full grid of one phase."""

    def __init__(self, rows, phase: str):
        self.axes = [np.unique(rows[a].to_numpy(dtype=float)) for a in AXES]
        shape = tuple(len(a) for a in self.axes)
        if len(rows) != np.prod(shape) or rows.duplicated(list(AXES)).any():
            raise ValueError(f"measured {phase} rows are not a full grid over {AXES}: {len(rows)} rows for "
                             f"{' x '.join(map(str, shape))} axis values")
        idx = [np.searchsorted(ax, rows[a].to_numpy(dtype=float)) for ax, a in zip(self.axes, AXES, strict=True)]
        self.values = np.empty(shape)
        self.values[tuple(idx)] = rows["latency_ms"].to_numpy(dtype=float)

    def __call__(self, points: list[np.ndarray], outside: str) -> np.ndarray:
        lo_idx, weights = [], []
        for ax, x, name in zip(self.axes, points, AXES, strict=True):
            if outside == "error" and ((x < ax[0]) | (x > ax[-1])).any():
                bad = x[(x < ax[0]) | (x > ax[-1])][0]
                raise ValueError(f"{name}={bad:g} is outside the measured grid [{ax[0]:g}, {ax[-1]:g}]")
            if ((x < ax[0]) | (x > ax[-1])).any():
                warnings.warn(f"{name} outside the measured grid [{ax[0]:g}, {ax[-1]:g}]: clamped", stacklevel=3)
            x = np.clip(x, ax[0], ax[-1])
            i = np.clip(np.searchsorted(ax, x, side="right") - 1, 0, max(len(ax) - 2, 0))
            span = ax[np.minimum(i + 1, len(ax) - 1)] - ax[i]
            t = np.where(span > 0, (x - ax[i]) / np.where(span > 0, span, 1), 0.0)
            lo_idx.append(i)
            weights.append(t)
        out = np.zeros(len(points[0]))
        for corner in range(8):
            w = np.ones(len(points[0]))
            idx = []
            for dim in range(3):
                up = (corner >> dim) & 1
                n = len(self.axes[dim])
                idx.append(np.minimum(lo_idx[dim] + up, n - 1))
                w = w * (weights[dim] if up else 1 - weights[dim])
            out += w * self.values[tuple(idx)]
        return out


class MeasuredLatency:
    """Latencies from a measured table, interpolated inside its grid; outside it, `outside="error"`
    refuses with a clear error and `"clamp"` warns and uses the nearest edge. `memory` and
    `num_devices` come from an optional roofline model of the same deployment."""

    cost_per_key_ms = 0.002  # vectorised interpolation: priced locally, never shared

    def __init__(self, table, outside: str = "error", memory_model=None, name: str = "measured"):
        if outside not in OUTSIDE:
            raise ValueError(f"outside must be one of {OUTSIDE}, got {outside!r}")
        self.table = read_table(table)
        self.outside = outside
        self._memory_model = memory_model
        self.grids = {dec: _Grid(rows, "decode" if dec else "prefill")
                      for dec, rows in self.table.groupby("is_decode")}
        import pandas as pd

        digest = hashlib.sha256(pd.util.hash_pandas_object(self.table, index=False).values.tobytes()).hexdigest()
        self.fingerprint = f"{name}|{digest[:12]}"

    @property
    def num_devices(self) -> int:
        return getattr(self._memory_model, "num_devices", 1)

    @property
    def memory(self):
        if self._memory_model is None:
            raise ValueError("this measured backend has no memory model; pass memory_model=")
        return self._memory_model.memory

    def latency_ms(self, keys: Sequence[ForwardKey]) -> np.ndarray:
        dec, conc, q, s = keys_to_arrays(keys)
        out = np.empty(len(keys))
        for phase in (False, True):
            sel = dec == phase
            if not sel.any():
                continue
            if phase not in self.grids:
                raise ValueError(f"measured table has no {'decode' if phase else 'prefill'} rows")
            out[sel] = self.grids[phase]([conc[sel], q[sel], s[sel]], self.outside)
        return out


#: device fields `calibrate` fits, with their bounds
CALIBRATED = {
    "eff_gemm": (0.05, 1.0), "eff_attention": (0.05, 1.0), "eff_memory": (0.05, 1.0),
    "eff_communication": (0.05, 1.0), "kernel_overhead_us": (0.0, 100.0),
    "prefill_attention_overhead_us": (0.0, 500.0),
}


def _identifiable(model, keys, fields, rebuild) -> list[str]:
    """The fields the table can tell anything about: a 10 % change moves some prediction. A field
    the rows never exercise (communication at tp=1) would otherwise drift to a bound."""
    base = model.latency_ms(keys)
    kept = []
    for f in fields:
        value = getattr(model.device, f)
        probe = value * 0.9 if value > 0 else 1.0
        if np.any(np.abs(rebuild({f: probe}).latency_ms(keys) - base) > 1e-9 * np.maximum(base, 1.0)):
            kept.append(f)
    if not kept:
        raise ValueError("the measured table exercises none of the calibrated fields")
    return kept


@dataclass(frozen=True)
class Calibration:
    params: dict
    median_error_before: float
    median_error_after: float
    model: object  # the calibrated RooflineModel


def calibrate(model, table, fields: Sequence[str] = tuple(CALIBRATED)) -> Calibration:
    """Fit the device's efficiency factors and overheads to measured step latencies by least
    squares on log(predicted / measured); report the median relative error before and after."""
    from scipy.optimize import least_squares

    from latency.estimator import RooflineModel

    rows = read_table(table)
    keys = [ForwardKey(bool(r.is_decode), int(r.concurrency), int(r.query_len), int(r.seq_len))
            for r in rows.itertuples()]
    measured = rows["latency_ms"].to_numpy(dtype=float)
    unknown = [f for f in fields if f not in CALIBRATED]
    if unknown:
        raise ValueError(f"cannot calibrate {unknown}; choose from {list(CALIBRATED)}")

    def rebuild(changes: dict):
        device = dataclasses.replace(model.device, **changes)
        return RooflineModel(model.model, device, model.parallel, model.quant, model.reserved_memory_gib,
                             engine=model.engine)

    fields = _identifiable(model, keys, fields, rebuild)

    def residual(x):
        return np.log(rebuild(dict(zip(fields, x, strict=True))).latency_ms(keys) / measured)

    x0 = np.array([getattr(model.device, f) for f in fields], dtype=float)
    lo = np.array([CALIBRATED[f][0] for f in fields])
    hi = np.array([CALIBRATED[f][1] for f in fields])
    fit = least_squares(residual, np.clip(x0, lo, hi), bounds=(lo, hi))
    before = float(np.median(np.abs(model.latency_ms(keys) / measured - 1)))
    calibrated = rebuild(dict(zip(fields, fit.x, strict=True)))
    after = float(np.median(np.abs(calibrated.latency_ms(keys) / measured - 1)))
    return Calibration(dict(zip(fields, map(float, fit.x), strict=True)), before, after, calibrated)
