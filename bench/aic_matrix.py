"""How much of AIConfigurator's support matrix `estimate --from-csv` reads: its checkpoints by name (as a
silicon row names them), those that parse only from their own config.json, those refused naming a part we
do not price; and its GPUs (`system`).

    python bench/aic_matrix.py            (needs servesweep[kernels]: the matrix and configs ship with it)
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency.model import ModelSpec, load_model  # noqa: E402
from orchestrator.measured_runs import DEVICES, our_model  # noqa: E402


def main() -> int:
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None:
        print("aic_matrix: install servesweep[kernels] (aiconfigurator-core) first", file=sys.stderr)
        return 2
    root = Path(spec.submodule_search_locations[0])
    rows = [r for f in sorted((root / "systems" / "support_matrix").glob("*.csv")) for r in csv.DictReader(open(f))]
    names, systems = sorted({r["HuggingFaceID"] for r in rows}), sorted({r["System"] for r in rows})
    read, config_only, refused = [], [], {}
    for name in names:
        try:
            load_model(our_model(name))
            read.append(name)
            continue
        except ValueError:
            pass
        config = json.loads((root / "model_configs" / f"{name.replace('/', '--')}_config.json").read_text())
        try:
            ModelSpec.from_config(config, name)
            config_only.append(name)
        except ValueError as err:
            refused[name] = str(err).split("servesweep does not model ")[-1].split("servesweep models ")[-1]
    print(f"{len(names)} checkpoints in the matrix: {len(read)} read by name, {len(config_only)} only from their "
          f"config.json, {len(refused)} refused naming a part we do not price")
    print("read by name:", ", ".join(read))
    print("config.json only:", ", ".join(config_only))
    for name, part in refused.items():
        print(f"refused: {name}: {part}")
    ours = [s for s in systems if s in DEVICES]
    print(f"{len(systems)} systems: {len(ours)} read ({', '.join(ours)}); not yet: "
          f"{', '.join(s for s in systems if s not in DEVICES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
