"""Score and sort the survivors of a mutmut run (run from the directory that holds `mutants/`).

    python bench/mutation_report.py [--out mutants/survivors.md]

Prints killed / survived / score per package and writes every survivor with its diff, grouped by
what the mutation changes: the groups that cannot change a result (a dtype the input already has,
zip's strict flag on equal lengths, a warning's stacklevel) apart from those that can (message texts,
bounds, arithmetic), so a reader explains or kills the second kind one by one.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import subprocess

KILLED, SURVIVED = 1, 0
#: (group, test on the removed and added lines); the first that matches names the group
GROUPS = [
    ("equivalent: zip(strict=...) on inputs of equal length",
     lambda minus, plus: "strict=" in minus and ("strict=None" in plus or "strict=False" in plus
                                                or "strict" not in plus)),
    ("equivalent: a dtype the input already has",
     lambda minus, plus: "dtype=None" in plus or ("dtype=" in minus and "dtype" not in plus)
     or ".astype(None)" in plus),
    ("equivalent: a warning's stacklevel", lambda minus, plus: "stacklevel" in minus),
    ("message: the text of a message or label", lambda minus, plus: bool(re.search(r"XX|[A-Z]{4,}", plus))
     and any(q in plus for q in "\"'")),
    ("message: an error raised without its message", lambda minus, plus: "Error(None)" in plus),
]


def outcomes() -> dict[str, int]:
    found = {}
    for meta in glob.glob("mutants/**/*.meta", recursive=True):
        found.update({k: v for k, v in json.load(open(meta)).get("exit_code_by_key", {}).items() if v is not None})
    return found


def diff(name: str) -> tuple[str, str]:
    text = subprocess.run(["mutmut", "show", name], capture_output=True, text=True).stdout
    lines = text.splitlines()
    minus = " | ".join(x[1:].strip() for x in lines if x.startswith("-") and not x.startswith("---"))
    plus = " | ".join(x[1:].strip() for x in lines if x.startswith("+") and not x.startswith("+++"))
    return minus, plus


def group_of(minus: str, plus: str) -> str:
    return next((g for g, test in GROUPS if test(minus, plus)), "other: may change a result")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="mutants/survivors.md")
    a = ap.parse_args()
    found = outcomes()
    count = collections.Counter((k.split(".")[0], v) for k, v in found.items())
    for package in ("simulator", "latency"):
        killed, survived = count[(package, KILLED)], count[(package, SURVIVED)]
        other = sum(n for (p, v), n in count.items() if p == package and v not in (KILLED, SURVIVED))
        if killed + survived:
            print(f"{package:10} killed {killed:5d}  survived {survived:5d}  other {other:4d}  "
                  f"score {killed / (killed + survived):.1%}")
    groups = collections.defaultdict(list)
    for name in sorted(k for k, v in found.items() if v == SURVIVED):
        minus, plus = diff(name)
        groups[group_of(minus, plus)].append((name, minus, plus))
    with open(a.out, "w") as out:
        for group, rows in sorted(groups.items()):
            out.write(f"## {group} ({len(rows)})\n\n")
            for name, minus, plus in rows:
                out.write(f"- `{name}`\n  - `{minus[:160]}`\n  + `{plus[:160]}`\n")
            out.write("\n")
    for group, rows in sorted(groups.items()):
        print(f"{len(rows):5d}  {group}")
    print(f"survivors: {a.out}")


if __name__ == "__main__":
    main()
