#!/usr/bin/env bash
# Mutation testing of simulator/ and latency/ against their fast tests (slow: minutes; not part of CI).
#   pip install -e ".[test,mutation]" && bash bench/mutation.sh ["simulator*" | MUTANT_NAME ...]
# (patterns or mutant names limit the run; SERVESWEEP_EXAMPLES_DIVISOR=1 runs the properties in full)
# Prints the score (killed / (killed + survived)) per package and writes the survivors, grouped, to
# mutants/survivors.md (bench/mutation_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
SERVESWEEP_EXAMPLES_DIVISOR=${SERVESWEEP_EXAMPLES_DIVISOR:-8} mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@" > /dev/null 2>&1 || true
python bench/mutation_report.py
