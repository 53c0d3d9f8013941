"""Regenerate the docs' tables that come from the field table: the flags of `servesweep optimize`
(docs/commands.md), the sweep-spec keys (docs/sweeps.md), the scenario and point columns (docs/results.md).

    python bench/readme_flags.py      (rewrites those pages in place; tests check they are current)
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


def page_with(marker: str) -> Path:
    """The docs page that holds `marker` (each generated table lives in one page)."""
    (page,) = [p for p in sorted((ROOT / "docs").glob("*.md")) if marker in p.read_text()]
    return page


def rewrite(marker: str, edit) -> None:
    page = page_with(marker)
    page.write_text(edit(page.read_text()))


def flag_table(text: str) -> str:
    start, end = text.index("| `MODEL` |"), text.index("| `--disagg` |")
    return text[:start] + "\n".join(rows()) + "\n" + text[end:]


def keys_line(text: str) -> str:
    start = text.index("Keys: `") + len("Keys: `")
    return text[:start] + spec_keys() + text[text.index("`", start):]


def columns_line(text: str) -> str:
    start = text.index("Every row carries the scenario (") + len("Every row carries the scenario (")
    return text[:start] + scenario_columns() + text[text.index(") and the point:", start):]


def point_table(text: str) -> str:
    head = "| column | meaning |\n| --- | --- |\n"
    start = text.index(head) + len(head)
    end = start
    while text.startswith("| `", end):  # the table's rows, up to the first line that is not one
        end = text.index("\n", end) + 1
    return text[:start] + "\n".join(point_rows()) + "\n" + text[end:]


def main() -> None:
    rewrite("| `MODEL` |", flag_table)
    rewrite("Keys: `", keys_line)
    rewrite("Every row carries the scenario (", columns_line)
    rewrite("| column | meaning |\n| --- | --- |\n", point_table)


if __name__ == "__main__":
    main()
