"""Request mixes: how long each request's prompt and output are.

One syntax wherever a length is accepted (flag, spec value, CSV cell):

    1024                              every request the same (today's behaviour, exactly)
    uniform:LOW:HIGH                  uniform integers in [LOW, HIGH] (`vllm bench serve --random-range-ratio`)
    normal:MEAN:STD:MIN:MAX           normal, rounded, clipped to [MIN, MAX]
    lognormal:MEDIAN:SIGMA:MIN:MAX    log-normal (median, sigma of the log), rounded, clipped
    bins:LOW-HIGH@WEIGHT,...          a bin by weight, then uniform within it (the Ascend tool's length bins)

A trace file (`Trace`) gives every request's lengths, and optionally its arrival time and cached
prompt tokens, and is replayed exactly. Sampling is seeded: same seed, same requests.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

KINDS = ("fixed", "uniform", "normal", "lognormal", "bins")
SYNTAX = ("an integer >= 1, uniform:LOW:HIGH, normal:MEAN:STD:MIN:MAX, lognormal:MEDIAN:SIGMA:MIN:MAX or "
          "bins:LOW-HIGH@WEIGHT,...")
#: trace columns: the two lengths are required, the others optional
TRACE_COLUMNS = ("input_length", "output_length", "arrival_time", "cached_tokens")


class MixError(ValueError):
    """A length or trace that cannot be read; the message says what is allowed."""


@dataclass(frozen=True)
class Lengths:
    """A length distribution over integers >= 1. `params` as written after the kind's name; bins are
    ((low, high, weight), ...)."""

    kind: str
    params: tuple

    @classmethod
    def parse(cls, text) -> Lengths:
        """From an int or the syntax above; MixError names what is wrong."""
        if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
            return cls._checked("fixed", (int(text),))
        if not isinstance(text, str):
            raise MixError(f"{text!r} is not a length; expected {SYNTAX}")
        text = text.strip()
        kind, _, rest = text.partition(":")
        try:
            if not rest:
                return cls._checked("fixed", (int(text),))
            if kind == "bins":
                bins = []
                for part in rest.split(","):
                    span, _, weight = part.partition("@")
                    low, _, high = span.partition("-")
                    bins.append((int(low), int(high), float(weight)))
                return cls._checked("bins", tuple(bins))
            numbers = tuple(float(x) for x in rest.split(":"))
        except ValueError:
            raise MixError(f"{text!r} is not a length; expected {SYNTAX}") from None
        arity = {"uniform": 2, "normal": 4, "lognormal": 4}
        if kind not in arity or len(numbers) != arity[kind]:
            raise MixError(f"{text!r} is not a length; expected {SYNTAX}")
        if kind == "uniform":
            numbers = tuple(int(x) if x == int(x) else x for x in numbers)
        else:
            numbers = (*numbers[:2], *(int(x) if x == int(x) else x for x in numbers[2:]))
        return cls._checked(kind, numbers)

    @classmethod
    def _checked(cls, kind: str, params: tuple) -> Lengths:
        lengths = cls(kind, params)
        low, high = lengths.bounds
        ints = {"fixed": params, "uniform": params, "normal": params[2:], "lognormal": params[2:], "bins": ()}[kind]
        if any(not isinstance(p, int) for p in ints) or low < 1 or high < low:
            raise MixError(f"{lengths}: lengths must be integers with 1 <= low <= high")
        if kind in ("normal", "lognormal") and not params[1] >= 0:
            raise MixError(f"{lengths}: the spread must be >= 0")
        if kind == "lognormal" and not params[0] > 0:
            raise MixError(f"{lengths}: the median must be > 0")
        if kind == "bins" and (any(lo < 1 or hi < lo or w < 0 for lo, hi, w in params)
                               or not sum(w for *_, w in params) > 0):
            raise MixError(f"{lengths}: each bin needs 1 <= LOW <= HIGH and a weight >= 0, some weight > 0")
        return lengths

    @property
    def bounds(self) -> tuple[int, int]:
        """The shortest and longest length it can draw."""
        p = self.params
        if self.kind == "fixed":
            return p[0], p[0]
        if self.kind == "uniform":
            return p[0], p[1]
        if self.kind == "bins":
            return min(lo for lo, _, _ in p), max(hi for _, hi, _ in p)
        return p[2], p[3]

    @property
    def is_fixed(self) -> bool:
        return self.kind == "fixed"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths (int64)."""
        p, low, high = self.params, *self.bounds
        if self.kind == "fixed":
            return np.full(n, p[0], dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(low, high + 1, n)
        if self.kind == "bins":
            weights = np.array([w for *_, w in p], dtype=float)
            pick = rng.choice(len(p), size=n, p=weights / weights.sum())
            los, his = np.array([b[0] for b in p]), np.array([b[1] for b in p])
            return rng.integers(los[pick], his[pick] + 1)
        draw = rng.normal(p[0], p[1], n) if self.kind == "normal" else p[0] * np.exp(rng.normal(0.0, p[1], n))
        return np.clip(np.rint(draw), low, high).astype(np.int64)

    @lru_cache(maxsize=256)  # noqa: B019 (a few small frozen values; sampling 100,000 draws is not free)
    def mean(self) -> float:
        """The expected length (of the clipped distribution, by sampling for normal and log-normal)."""
        if self.kind == "fixed":
            return float(self.params[0])
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        if self.kind == "bins":
            w = sum(weight for *_, weight in self.params)
            return sum(weight * (lo + hi) / 2 for lo, hi, weight in self.params) / w
        return float(self.sample(np.random.default_rng(0), 100_000).mean())

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(self.params[0])
        if self.kind == "bins":
            return "bins:" + ",".join(f"{lo}-{hi}@{_num(w)}" for lo, hi, w in self.params)
        return self.kind + ":" + ":".join(_num(x) for x in self.params)


def _num(x) -> str:
    return str(int(x)) if float(x) == int(x) else repr(float(x))


@dataclass(frozen=True)
class RequestMix:
    """Per-request lengths: prompt and output distributions, or a trace that fixes both (and maybe
    the arrival times and cached tokens)."""

    input: Lengths
    output: Lengths
    trace: Trace | None = None

    def __str__(self) -> str:
        return str(self.trace) if self.trace else f"input {self.input}, output {self.output}"


@dataclass(frozen=True)
class Trace:
    """Requests replayed exactly, in file order: lengths, and optionally arrival times (seconds from
    the first) and cached prompt tokens. Identified by the digest of its content."""

    path: str
    digest: str
    input_length: tuple[int, ...]
    output_length: tuple[int, ...]
    arrival_time: tuple[float, ...] | None = None
    cached_tokens: tuple[int, ...] | None = None

    @classmethod
    def load(cls, path) -> Trace:
        """A CSV, JSONL or Parquet file with the TRACE_COLUMNS; MixError names the row and column
        of a bad value (a CSV's rows counted with its header, a JSONL or Parquet file's from 1)."""
        import pandas as pd

        path = Path(path)
        try:
            data = path.read_bytes()
            suffix = path.suffix.lower()
            if suffix == ".parquet":
                table = pd.read_parquet(path)
            elif suffix in (".jsonl", ".json"):
                table = pd.read_json(path, lines=True)
            else:
                table = pd.read_csv(path)
            first = 2 if suffix not in (".parquet", ".jsonl", ".json") else 1  # the first request's row: a CSV's header
        except (OSError, ValueError) as err:
            raise MixError(f"trace {path}: not a readable CSV, JSONL or Parquet file ({err})") from None
        missing = [c for c in TRACE_COLUMNS[:2] if c not in table.columns]
        if missing:
            raise MixError(f"trace {path}: column {missing[0]} is missing (columns: {', '.join(TRACE_COLUMNS)})")
        if not len(table):
            raise MixError(f"trace {path}: no requests")
        cols = {}
        for column in TRACE_COLUMNS:
            if column in table.columns:
                cols[column] = _column(path, table, column, first)
        times = cols.get("arrival_time")
        if times is not None and (np.diff(times) < 0).any():
            row = int(np.argmax(np.diff(times) < 0)) + first + 1  # the later of the two rows
            raise MixError(f"trace {path} row {row}, column arrival_time: arrival times must not decrease")
        cached = cols.get("cached_tokens")
        if cached is not None and (cached >= cols["input_length"]).any():
            row = int(np.argmax(cached >= cols["input_length"])) + first
            raise MixError(f"trace {path} row {row}, column cached_tokens: must be < input_length "
                           "(at least one prompt token is computed)")
        return cls(str(path), hashlib.sha256(data).hexdigest()[:12],
                   tuple(int(x) for x in cols["input_length"]), tuple(int(x) for x in cols["output_length"]),
                   None if times is None else tuple(float(t - times[0]) for t in times),
                   None if cached is None else tuple(int(x) for x in cached))

    @property
    def timed(self) -> bool:
        return self.arrival_time is not None

    def __len__(self) -> int:
        return len(self.input_length)

    def __str__(self) -> str:
        return f"trace:{Path(self.path).name}@{self.digest}"


#: a cached_tokens cell left empty: the prefix-cache hit rate decides that request's cached tokens
NOT_GIVEN = -1


def _column(path, table, column, first: int) -> np.ndarray:
    """A trace column as numbers; MixError names the row (`first`: the file's row of the first request)."""
    values = table[column].to_numpy()
    integer = column != "arrival_time"
    low = 1 if column in TRACE_COLUMNS[:2] else 0
    if column == "cached_tokens":
        values = np.where(table[column].isna().to_numpy(), NOT_GIVEN, values)
        low = NOT_GIVEN
    parsed = []
    for i, v in enumerate(values):
        number = _number(v)
        if number is None or not (math.isfinite(number) and number >= low and (not integer or number == int(number))):
            kind = "an integer" if integer else "a number"
            shown = v.item() if isinstance(v, np.generic) else v
            raise MixError(f"trace {path} row {i + first}, column {column}: {shown!r} is not allowed; expected {kind} "
                           f">= {low}")
        parsed.append(number)
    return np.array(parsed, dtype=np.int64 if integer else np.float64)


def _number(cell) -> float | None:
    """A trace cell as a number: a numeric cell, or text that reads as one (a column with one bad cell is read as
    text, its good cells too); None for anything else."""
    if isinstance(cell, bool):
        return None
    if isinstance(cell, (int, float, np.integer, np.floating)):
        return float(cell)
    try:
        return float(str(cell).strip())
    except ValueError:
        return None

