"""`servesweep`: optimize one scenario, run a sweep, report on results. One module per command
(`add_parser` and its `cmd_*`); what they share is in `orchestrator.cli.common`. Each `cmd_*` imports what
it runs inside itself, for start-up time (`servesweep --help` and a bad flag need neither Ray nor pandas);
none of those imports dodges a cycle, since tests/test_layers.py counts them in the import graph."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from orchestrator.cli import cache, calibrate, estimate, optimize, plan, report, sweep, ui
from orchestrator.cli.cache import cache_command
from orchestrator.cli.common import BURST_NOTE, Parser, layout_label, lengths_label
from orchestrator.fields import InputError

__all__ = ["BURST_NOTE", "build_parser", "cache_command", "layout_label", "lengths_label", "main", "run"]
DESCRIPTION = "`servesweep`: optimize one scenario, run a sweep, report on results."


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="servesweep", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log what happens to stderr (-v: info, -vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (optimize, estimate, sweep, report, cache, plan, ui, calibrate):
        command.add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from orchestrator.collector import collect_rarely

    collect_rarely()
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return args.func(args)
    except InputError as err:
        print(f"servesweep {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servesweep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`servesweep ... | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def run(argv=None) -> int:
    """The `servesweep` command: `main`, then the process ends. Its memos (plans, prices, shapes: hundreds of
    thousands of objects) are frozen out of the collector first, so the interpreter's last collection does
    not walk them (20-30 ms of a 0.25 s question); every exit handler still runs."""
    code = main(argv)
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
