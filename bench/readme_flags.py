"""Regenerate the flag table of README's `servesweep optimize` section and the sweep-spec keys from
the field table.

    python bench/readme_flags.py      (rewrites README.md in place; tests check it is current)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from orchestrator.fields import FIELDS  # noqa: E402


def rows() -> list[str]:
    out = []
    for f in FIELDS:
        if "optimize" not in f.commands:
            continue
        unit = f" [{f.unit}]" if f.unit else ""
        choices = f" ({', '.join(f'`{c}`' for c in sorted(f.choices))})" if f.choices else ""
        default = "" if f.required else f"; default {f.default_text()}"
        out.append(f"| `{f.flag}` | {f.help}{unit}{choices}{default} |")
    return out


def spec_keys() -> str:
    return " ".join(f.key for f in FIELDS if "sweep" in f.commands)


def scenario_columns() -> str:
    from orchestrator.results import MIX_SUFFIX
    from simulator.mix import Lengths

    cols = ["scenario_id", "mode"]
    for f in FIELDS:
        if f.column:
            cols += [f.column] + ([f.column + MIX_SUFFIX] if f.kind is Lengths else [])
    return ", ".join(f"`{c}`" for c in cols)


def point_rows() -> list[str]:
    from orchestrator.results import POINT_COLUMNS

    return [f"| `{c}` | {meaning or 'percentile of the above'} |" for c, meaning in POINT_COLUMNS.items()]


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index("| `MODEL` |"), text.index("| `--disagg` |")
    text = text[:start] + "\n".join(rows()) + "\n" + text[end:]
    start = text.index("Keys: `") + len("Keys: `")
    text = text[:start] + spec_keys() + text[text.index("`", start):]
    start = text.index("Every row carries the scenario (") + len("Every row carries the scenario (")
    text = text[:start] + scenario_columns() + text[text.index(") and the point:", start):]
    head = "| column | meaning |\n| --- | --- |\n"
    start = text.index(head) + len(head)
    end = start
    while text.startswith("| `", end):  # the table's rows, up to the first line that is not one
        end = text.index("\n", end) + 1
    readme.write_text(text[:start] + "\n".join(point_rows()) + "\n" + text[end:])


if __name__ == "__main__":
    main()
