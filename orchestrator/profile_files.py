"""Engine profile files as calibrate writes them: TOML text from a profile's data, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import tomlkit


def write_profile(path: str, data: dict) -> None:
    """Write a profile's data as a new file."""
    write_atomically(Path(path), to_toml(data))


def set_in_place(target: Path, values: dict[tuple[str, ...], object]) -> None:
    """Write `values` (place -> value: a top-level key, or (table, key)) into the profile file at `target`, its
    comments and every other key kept."""
    doc = tomlkit.parse(target.read_text())
    for place, value in values.items():
        if len(place) == 1:
            doc[place[0]] = value
        else:
            _set_in_table(doc.setdefault(place[0], tomlkit.table()), place[1], value)
    write_atomically(target, tomlkit.dumps(doc))


def _set_in_table(table, key: str, value) -> None:
    """`table[key] = value`, a new key placed after the table's last one, not after the comments that close it
    (they introduce what follows: the next table's)."""
    if key in table:
        table[key] = value
        return
    body, closing = table.value.body, []
    while body and body[-1][0] is None:  # no key: whitespace and comments
        closing.insert(0, body.pop())
    table[key] = value
    body.extend(closing)


def write_atomically(target: Path, text: str) -> None:
    """A reader never sees half a profile: the text goes to a file beside it, then replaces it."""
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def to_toml(data: dict) -> str:
    """A profile's TOML: top-level values, then one table per nested dict (profiles are two levels deep)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items() if not isinstance(value, dict)]
    for key, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
