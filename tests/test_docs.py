"""The README and docs/ stay true: the generated tables match the field table and `--help`, the README
stays a front door, every page says what it answers and is linked, and every documented command parses
with today's flags (and, for one configuration, validates as a scenario)."""

import re
import shlex
from pathlib import Path

import pytest

from orchestrator.cli import build_parser
from orchestrator.fields import FIELDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: the README is what servesweep is, how to install, one example per command, figures and links
README_LINES = 300
#: the words of a usage line that stand for a value (`servesweep sweep SPEC.toml --output DIR`)
PLACEHOLDER = re.compile(r"^(SPEC\.toml|PROFILE\.toml|DIR|DIR_OR_URI|ADDR|N|T|BASE|MODEL|DEVICE|RESULTS_DIR"
                         r"|RUNS(\.\.\.)?|PATH|FILE[.A-Za-z]*)$")


def docs_text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) of every `servesweep ...` line in a bash block of the README and docs, its
    continuation lines joined."""
    out = []
    for page in [README, *DOCS]:
        for block in re.findall(r"```(?:bash)?\n(.*?)```", page.read_text(), flags=re.S):
            for command in block.replace("\\\n", " ").splitlines():
                command = command.split("#")[0].strip()
                if command.startswith("servesweep "):
                    out.append((page.name, command))
    return out


def test_the_readme_is_a_front_door_and_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES
    for page in DOCS:
        assert f"(docs/{page.name}" in text, f"README does not link docs/{page.name}"
    for command in ("optimize", "estimate", "plan", "sweep", "calibrate", "ui", "report"):
        assert f"servesweep {command} " in text, command
    assert 'pip install -e ".[test]" && python -m pytest' in text  # CI runs exactly this


def test_every_docs_page_starts_with_what_it_answers():
    for page in DOCS:
        title, blank, first = page.read_text().splitlines()[:3]
        assert title.startswith("# ") and blank == "" and len(first) > 40, page.name


def test_the_docs_document_every_optimize_flag_and_column_as_the_field_table_says():
    text = docs_text()
    for f in FIELDS:
        if "optimize" in f.commands:
            assert f"| `{f.flag}` | {f.help}" in text, f"{f.flag}: run python bench/readme_flags.py"
            assert f.required or f"default {f.default_text()}" in text, f.flag
    keys = " ".join(f.key for f in FIELDS if "sweep" in f.commands)
    assert f"Keys: `{keys}`" in text, "run python bench/readme_flags.py"
    from orchestrator.results import POINT_COLUMNS

    for column in POINT_COLUMNS:
        assert f"| `{column}` |" in text, f"{column}: run python bench/readme_flags.py"


def test_every_flag_in_the_docs_table_is_one_help_shows():
    """The generated table and `--help` come from one source; a flag renamed in one shows here."""
    optimize = build_parser()._subparsers._group_actions[0].choices["optimize"]
    flags = {option for action in optimize._actions for option in action.option_strings}
    table = re.findall(r"^\| `(--[a-z0-9-]+)` \|", docs_text(), flags=re.M)
    assert table and set(table) <= flags, set(table) - flags


@pytest.mark.parametrize("page, command", documented_commands())
def test_every_documented_command_parses_with_today_s_flags(page, command, tmp_path, monkeypatch):
    """Each command's words parse with the real parser (a stale flag fails here); estimate and optimize
    commands also validate as scenarios (a stale value, model or device fails here)."""
    monkeypatch.chdir(ROOT)
    words = [w for w in shlex.split(command.replace("[", "").replace("]", ""))[1:] if w != "..."]
    if any(PLACEHOLDER.match(w) for w in words):
        pytest.skip("a usage line with placeholders")
    try:
        args = build_parser().parse_args(words)
    except SystemExit as exit_:
        pytest.fail(f"{page}: {command!r} does not parse (exit {exit_.code})")
    if args.command in ("optimize", "estimate") and not getattr(args, "from_csv", None):
        from orchestrator.cli.common import field_values
        from orchestrator.estimate import configure
        from orchestrator.scenario import Scenario

        values = field_values(args, args.command)
        if str(values.get("engine", "")).endswith(".toml"):
            values.pop("engine")  # a profile the example wrote with calibrate
        scenario = configure(values) if args.command == "estimate" else Scenario(**values)
        scenario.validate()
