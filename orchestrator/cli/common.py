"""What every command shares: the parser class, flags from the field table, labels and tables."""

from __future__ import annotations

import argparse
import os
import sys

from orchestrator.fields import FIELDS, InputError, fields_for
from orchestrator.scenario import Scenario
from simulator.mix import Lengths


class Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr and exit code 2, never a usage dump or traceback."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


TABLE = [  # (header, column, format)
    ("role", "role", "{}"), ("layout", None, "{}"), ("B", "max_batched_tokens", "{}"), ("conc", "concurrency", "{}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("tok/s", "output_throughput", "{:.1f}"), ("tok/s/dev", "output_throughput_per_device", "{:.1f}"),
    ("TTFT ms", "ttft_slo_ms", "{:.1f}"), ("TPOT ms", "tpot_slo_ms", "{:.2f}"), ("chunks", "prefill_num_chunks", "{}"),
    ("E", "effective_input_length", "{}"), ("wgt GiB", "weights_gib", "{:.2f}"), ("KV GiB", "kv_gib", "{:.2f}"),
    ("act GiB", "activation_gib", "{:.2f}"), ("free GiB", "available_gib", "{:.2f}"),
]


def check_writable(flag: str, path: str) -> None:
    """Before the work: file `path`'s folder made where missing and a file written and removed beside it, else one
    line naming the flag (a path that cannot be written would otherwise fail only after the search, fit or
    estimates)."""
    from pathlib import Path

    target = Path(path)
    _check_folder(flag, path, target.parent, "a file path", "a folder stands there" if target.is_dir() else "")


def check_writable_folder(flag: str, path: str) -> None:
    """`check_writable` of a folder the command writes files into (made where missing)."""
    from pathlib import Path

    target = Path(path)
    _check_folder(flag, path, target, "a folder", "a file stands there" if target.is_file() else "")


def _check_folder(flag: str, path: str, folder, what: str, wrong: str) -> None:
    import tempfile

    allowed = f"{what} that can be written"
    if wrong:
        raise InputError(flag, path, f"{allowed} ({wrong})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".servesweep-", suffix=".check"):
            pass
    except (FileExistsError, NotADirectoryError):  # a file where the folder (or one above it) would be
        raise InputError(flag, path, f"{allowed} (a file stands where a folder of it would be)") from None
    except OSError as err:
        raise InputError(flag, path, f"{allowed} ({err.strerror or err})") from None


def processes_of(a) -> int:
    """--processes as given, else the CPUs this process may use; one line naming the flag below 1."""
    processes = a.processes if a.processes is not None else len(os.sched_getaffinity(0))
    if processes < 1:
        raise InputError("--processes", processes, "an integer >= 1")
    return processes


def layout_label(row: dict) -> str:
    """tp2pp1dp4, tp1adp8pp1dp2ep8: attention ranks (adp) and expert groups (ep) shown when > 1."""
    adp = row.get("attention_dp", 1)
    return (f"tp{row['tp']}" + (f"adp{adp}" if adp > 1 else "") + f"pp{row['pp']}dp{row['dp']}"
            + (f"ep{row['ep']}" if row["ep"] > 1 else ""))


def lengths_label(s: Scenario) -> str:
    """input 4096, output 512; input uniform:100:200, output 64; trace:chat.csv@1a2b3c4d5e6f"""
    return str(s.request_mix) if s.request_mix else f"input {s.input_length}, output {s.output_length}"


def add_field_flags(p: argparse.ArgumentParser, command: str, require: bool = True, positional: bool = True) -> None:
    """Every scenario field of `command` as a flag (from the field table), grouped, with unit and default.
    `require=False` leaves required fields optional (a CSV may give them); `positional=False` takes the
    model as --model (where the positional arguments are files)."""
    groups = {}
    for f in fields_for(command):
        if f.flag == "MODEL" and positional:
            p.add_argument("model", metavar="MODEL", help=f.help, nargs=None if require else "?")
            continue
        if f.flag == "MODEL":
            p.add_argument("--model", dest="model", metavar="MODEL", help=f.help)
            continue
        group = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(f.group))
        unit = f" [{f.unit}]" if f.unit else ""
        default = "" if f.required else f" (default: {f.default_text()})"
        choices = f" {{{','.join(f.choices)}}}" if f.choices else ""
        metavar = f.name.upper().rstrip("S") if f.many else None
        kind = str if f.kind is Lengths else f.kind  # a length is parsed (and refused) with the scenario's fields
        group.add_argument(f.flag, *f.aliases, dest=f.name, type=kind, nargs="+" if f.many else None,
                           required=f.required and require, default=None, metavar=metavar,
                           help=f"{f.help}{choices}{unit}{default}")
        if f.deprecated:
            group.add_argument(f.deprecated, dest=f"deprecated_{f.name}", type=kind, nargs="+" if f.many else None,
                               help=argparse.SUPPRESS)


def scenario_from_args(a, command: str) -> Scenario:
    """The scenario of parsed flags: given flags, else the table's defaults."""
    return Scenario(**field_values(a, command))


def field_values(a, command: str) -> dict:
    """The field values the flags give (absent flags are left out)."""
    values = {}
    for f in fields_for(command):
        v = getattr(a, f.name, None)
        old = getattr(a, f"deprecated_{f.name}", None)
        if old is not None:
            print(f"servesweep: {f.deprecated} is deprecated; use {f.flag}", file=sys.stderr)
            v = v if v is not None else old
        if v is not None:
            if f.kind is Lengths:
                v = f.parse(v)
            values[f.name] = tuple(v) if f.many else v
    return values


#: what a burst result measures, printed with every one
BURST_NOTE = ("burst: every request arrives at t=0 (the RFC's candidate window), so TTFT includes waiting behind "
              "every prefill before it; for the steady load a deployment sees, use --arrival closed "
              "(spec: arrival = \"closed\")")


SCENARIO_TABLE = [("model", "model", "{}"), ("device", "device", "{}"), ("devs", "num_devices", "{}"),
                  ("in", "input_length", "{}"), ("out", "output_length", "{}"), ("arrival", "arrival", "{}"),
                  ("TTFT<=", "ttft_limit_ms", "{}"),
                  ("TPOT<=", "tpot_limit_ms", "{}")]


def varying_columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """Table entries for the scenario columns (FIELDS) whose value differs between `rows` and that
    SCENARIO_TABLE does not show: what tells two rows of a sweep apart (benchmark, prefix_caching, ...)."""
    shown = {c for _, c, _ in SCENARIO_TABLE + TABLE}
    return [(f.column, f.column, "{}") for f in FIELDS
            if f.column and f.column not in shown and all(f.column in r for r in rows)
            and len({str(r[f.column]) for r in rows}) > 1]


def result_table(rows: list[dict], scenario: bool = False, percentile: float = 0.0) -> str:
    """Rows as text; TTFT and TPOT are shown where the limits apply: the mean, or `percentile`. With
    `scenario`, the scenario columns too, and any other scenario field that differs between the rows."""
    spec = (SCENARIO_TABLE + varying_columns(rows) if scenario else []) + TABLE
    tag = f"p{percentile:g} " if percentile else ""
    cells = [[h.replace("TTFT ", f"TTFT {tag}").replace("TPOT ", f"TPOT {tag}") for h, _, _ in spec]]
    for r in rows:
        cells.append([layout_label(r) if c is None else f.format(r[c]) for _, c, f in spec])
    return aligned(cells)


def aligned(cells: list[list[str]], left: int = 0) -> str:
    """Rows of cells as text, each column as wide as its widest cell and two spaces apart (the first `left`
    columns left-aligned, the others right-aligned): columns stay apart at any magnitude."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                                for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                      for row in cells)
