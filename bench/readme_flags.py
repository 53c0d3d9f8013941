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


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index("| `MODEL` |"), text.index("| `--disagg` |")
    text = text[:start] + "\n".join(rows()) + "\n" + text[end:]
    start = text.index("Keys: `") + len("Keys: `")
    readme.write_text(text[:start] + spec_keys() + text[text.index("`", start):])


if __name__ == "__main__":
    main()
