"""The requests an aiperf client measured, shipped per engine by campaign left out.

    python bench/shipped_counts.py [--min-runs 8] [--ship]

The silicon format does not record how many requests each aiperf client sent (AIConfigurator's
`bench_run.sh` asks for 20; its AICONFIGURATOR_BENCH_MULTI_ROUND changes that), and fewer weigh the first
wave, every client's prompt sent at once, more in the mean TTFT (docs/fidelity.md). An engine profile's
`[frontend] requests_per_client` says it. For each engine, every run of its campaigns (both measured files)
is estimated with the shipped profile at each count `calibrate` tries (fitting.FRONTEND_CHOICES); then each
campaign is left out in turn and the count with the least median |error| (TTFT plus TPOT, median over the
other campaigns) predicts it, the shipped count kept unless another is lower by more than 1 %. Printed per engine: the
median over campaigns of each count, of the shipped count, and of the left-out choice. `--ship` writes the
count every campaign's left-out choice agrees on into latency/data/engines/ENGINE.toml, only where the
left-out figure (TTFT plus TPOT) is below the shipped count's.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tomllib

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages
sys.path.insert(1, str(Path(__file__).resolve().parent))

from calibrate_campaigns import CAMPAIGN, FILES, REFERENCE  # noqa: E402

from orchestrator.estimate import estimate_many  # noqa: E402
from orchestrator.fitting import FRONTEND_CHOICES, ROUNDS_PLACE, set_at, value_at  # noqa: E402
from orchestrator.profile_files import to_toml  # noqa: E402

ENGINES_DIR = Path(__file__).resolve().parent.parent / "latency" / "data" / "engines"
COUNTS = FRONTEND_CHOICES[ROUNDS_PLACE]
#: a count other than the shipped one is chosen where it lowers the other campaigns' figure by more than this
#: share: a campaign whose runs do not depend on the count (SGLang 0.5.1's queue) ties, and its rounding must not choose
TIE = 0.01


def errors_at(engine: str, count: int, folder: Path) -> pd.DataFrame:
    """Every run of `engine` in the measured files estimated with its shipped profile at `count` requests a
    client: the campaign and the log error of TTFT and TPOT of each."""
    data = tomllib.loads((ENGINES_DIR / f"{engine}.toml").read_text())
    set_at(data, ROUNDS_PLACE, count)
    profile = folder / f"{engine}_{count}.toml"
    profile.write_text(to_toml(data))
    parts = []
    for name in FILES:
        table = pd.read_csv(REFERENCE / name, dtype=str, keep_default_na=False)
        rows = table[table["backend"] == engine]
        if rows.empty:
            continue
        path = folder / f"{engine}_{name}"
        rows.to_csv(path, index=False)
        out, _ = estimate_many(path, {"engine": str(profile)}, progress=False)
        out = out[out["ttft_ms"].notna()]
        parts.append(pd.DataFrame({
            "campaign": rows.loc[rows.index[out.index], CAMPAIGN].agg(" ".join, axis=1).str.strip().to_numpy(),
            "ttft": np.log(out["ttft_ms"] / out["silicon_ttft_ms"]).to_numpy(),
            "tpot": np.log(out["tpot_ms"] / out["silicon_tpot_ms"]).to_numpy()}))
    return pd.concat(parts, ignore_index=True)


def by_campaign(errors: pd.DataFrame, min_runs: int) -> pd.DataFrame:
    """Median |error| (%) of TTFT and TPOT of each campaign with at least `min_runs` runs."""
    kept = errors.groupby("campaign").filter(lambda g: len(g) >= min_runs)
    return kept.groupby("campaign")[["ttft", "tpot"]].agg(lambda x: np.median(np.abs(np.expm1(x))) * 100)


def left_out(per_count: dict[int, pd.DataFrame], shipped: int) -> tuple[pd.DataFrame, list[int]]:
    """Each campaign predicted at the count its engine's other campaigns choose: (its errors, the choices)."""
    names = list(per_count[shipped].index)
    rows, picks = [], []
    for name in names:
        others = [n for n in names if n != name]
        score = {c: float(t.loc[others].median().sum()) if others else 0.0 for c, t in per_count.items()}
        pick = min(score, key=lambda c: (score[c], c != shipped))
        pick = pick if score[pick] < score[shipped] * (1 - TIE) else shipped
        picks.append(pick)
        rows.append(per_count[pick].loc[name])
    return pd.DataFrame(rows, index=names), picks


def cell(errors: pd.DataFrame) -> str:
    """The median over campaigns of TTFT / TPOT, as printed."""
    return f"{errors['ttft'].median():5.1f} / {errors['tpot'].median():4.1f}"


def ship(engine: str, count: int) -> None:
    """Write `[frontend] requests_per_client = count` into the engine's shipped profile, its comments kept."""
    path = ENGINES_DIR / f"{engine}.toml"
    text = path.read_text()
    line = f"requests_per_client = {count}  # by campaign left out: python bench/shipped_counts.py"
    if re.search(r"^requests_per_client\s*=.*$", text, flags=re.M):
        text = re.sub(r"^requests_per_client\s*=.*$", line, text, flags=re.M)
    elif re.search(r"^\[frontend\]\s*$", text, flags=re.M):
        text = re.sub(r"^\[frontend\]\s*$", f"[frontend]\n{line}", text, count=1, flags=re.M)
    else:
        text = text.rstrip("\n") + f"\n\n[frontend]\n{line}\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-runs", type=int, default=8, help="campaigns with at least this many runs (default 8)")
    ap.add_argument("--ship", action="store_true", help="write the left-out choice where it lowers the figure")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    print(f"{'engine':<8} {'campaigns':>9}  " + "  ".join(f"{'count ' + str(c or 20):>13}" for c in COUNTS)
          + f"  {'shipped':>13}  {'left out':>13}  choices")
    with tempfile.TemporaryDirectory() as tmp:
        for engine in sorted({p.stem for p in ENGINES_DIR.glob("*.toml")} - {"none"}):
            data = tomllib.loads((ENGINES_DIR / f"{engine}.toml").read_text())
            shipped = value_at(data, ROUNDS_PLACE, COUNTS[0])
            per_count = {c: by_campaign(errors_at(engine, c, Path(tmp)), args.min_runs) for c in COUNTS}
            if per_count[shipped].empty:
                continue
            out, picks = left_out(per_count, shipped)
            chosen = {c: picks.count(c) for c in sorted(set(picks), key=picks.count, reverse=True)}
            print(f"{engine:<8} {len(out):>9}  " + "  ".join(f"{cell(per_count[c]):>13}" for c in COUNTS)
                  + f"  {cell(per_count[shipped]):>13}  {cell(out):>13}  "
                  + ", ".join(f"{c or 20} x{n}" for c, n in chosen.items()))
            lower = out.median().sum() < per_count[shipped].median().sum()
            if args.ship and lower and len(chosen) == 1 and picks[0] != shipped:
                ship(engine, picks[0])
                print(f"  shipped: {engine}.toml [frontend] requests_per_client = {picks[0]}")
    print(f"(median |error| % TTFT / TPOT over campaigns of at least {args.min_runs} runs; "
          f"{time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
