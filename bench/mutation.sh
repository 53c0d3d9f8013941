#!/usr/bin/env bash
# Mutation testing of simulator/ and latency/ against their fast tests (slow: minutes; not part of CI).
#   pip install -e ".[test,mutation]" && bash bench/mutation.sh ["simulator*"]   (a mutant-name pattern limits the run)
# Prints the score (killed / (killed + survived)) per package and writes the survivors to mutants/survivors.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
SERVESWEEP_EXAMPLES_DIVISOR=${SERVESWEEP_EXAMPLES_DIVISOR:-8} mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@" > /dev/null 2>&1 || true
mutmut results --all true > mutants/results.txt 2>/dev/null || mutmut results > mutants/results.txt
python - <<'PY'
import collections, re
rows = [line.strip() for line in open("mutants/results.txt") if ":" in line]
count = collections.Counter()
survivors = []
for line in rows:
    name, status = line.rsplit(":", 1)
    package = name.split(".")[0]
    count[(package, status.strip())] += 1
    if status.strip() == "survived":
        survivors.append(name)
for package in ("simulator", "latency"):
    killed, survived = count[(package, "killed")], count[(package, "survived")]
    other = sum(v for (p, s), v in count.items() if p == package and s not in ("killed", "survived"))
    total = killed + survived
    if total:
        print(f"{package:10} killed {killed:5d}  survived {survived:5d}  other {other:4d}  score {killed / total:.1%}")
open("mutants/survivors.txt", "w").write("\n".join(survivors) + "\n")
PY
