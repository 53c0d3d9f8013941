"""The one number checker: every layer validates integers and ranges with these, so a bad value
reads the same wherever it is caught."""

from __future__ import annotations

import math


class RangeError(ValueError):
    """`name` got `value`; `allowed` says what it takes (e.g. "an integer >= 1")."""

    def __init__(self, name: str, value, allowed: str):
        super().__init__(f"{name} must be {allowed}, got {value!r}")
        self.name, self.value, self.allowed = name, value, allowed


def describe(integer: bool, low=None, high=None, low_open: bool = False, high_open: bool = False) -> str:
    """The allowed range in words: "an integer >= 1", "a number in [0, 1)", "a number > 0"."""
    noun = "an integer" if integer else "a number"
    if low is not None and high is not None:
        return f"{noun} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{noun} {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{noun} {'<' if high_open else '<='} {high:g}"
    return noun


def check_number(name: str, value, *, integer: bool = False, low=None, high=None, low_open: bool = False,
                 high_open: bool = False):
    """Return `value` if it is a number (an int when `integer`; never a bool) in the range, else
    raise RangeError."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and (integer or math.isfinite(value))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise RangeError(name, value, describe(integer, low, high, low_open, high_open))
    return value


def check_int(name: str, value, low: int = 1, high: int | None = None) -> int:
    return check_number(name, value, integer=True, low=low, high=high)
