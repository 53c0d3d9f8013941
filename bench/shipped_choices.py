"""A profile choice the measured runs leave open, shipped per engine by campaign left out.

    python bench/shipped_choices.py [--choice requests_per_client] [--min-runs 8] [--across-engines] [--ship]

Some of what an engine profile says is not recorded in the silicon format: how many requests each aiperf client
sent (AIConfigurator's `bench_run.sh` asks for 20; its AICONFIGURATOR_BENCH_MULTI_ROUND changes that; fewer weigh
the first wave, every client's prompt sent at once, more in the mean TTFT: docs/fidelity.md), the API server's
time per streamed chunk and per prompt token, the client's time to send the next request, async scheduling and its
step of lookahead; and, to check them by campaign, constants fitted on some campaigns (a MoE layer's floor, the
experts' bandwidth). For each engine, every run of its campaigns (both measured files) is estimated with the
shipped profile at each value of `--choice` (CHOICES); then each campaign is left out in turn and the value with
the least median |error| (TTFT plus TPOT, median over the other campaigns) predicts it, the shipped value kept
unless another is lower by more than 1 %. Printed per engine: the median over campaigns at each value, at the
shipped one, and of the left-out choice. `--ship` writes the value every campaign's left-out choice agrees on into
latency/data/engines/ENGINE.toml, only where the left-out figure (TTFT plus TPOT) is below the shipped value's.
`--across-engines` judges a choice of the client rather than the engine (the requests each aiperf client sent: one
harness measured every engine's campaigns) over all engines' campaigns at once: each is predicted at the value the
other campaigns, of any engine, choose.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tomlkit
import tomllib

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages
sys.path.insert(1, str(Path(__file__).resolve().parent))

from calibrate_campaigns import CAMPAIGN, FILES, REFERENCE  # noqa: E402

from orchestrator.choices import PROFILE_CHOICES, ROUNDS_PLACE, STREAM_PLACE, set_at, value_at  # noqa: E402
from orchestrator.estimate import estimate_many  # noqa: E402
from orchestrator.profile_files import set_in_place, to_toml  # noqa: E402

ENGINES_DIR = Path(__file__).resolve().parent.parent / "latency" / "data" / "engines"
#: the choices judged: where each sits in a profile and the values tried, the first where a profile names none
#: (calibrate's own values where it tries the choice; requests_per_client 0 is aiperf's 20)
CHOICES = {
    "requests_per_client": (ROUNDS_PLACE, PROFILE_CHOICES[ROUNDS_PLACE]),
    "stream_us": (STREAM_PLACE, PROFILE_CHOICES[STREAM_PLACE]),
    "client_ms": (("frontend", "client_ms"), (0.0, 5.0, 10.0, 20.0, 40.0)),
    "async_scheduling": (("async_scheduling",), (False, True)),
    "lookahead_steps": (("frontend", "lookahead_steps"), (0, 1)),
    "prompt_token_us": (("frontend", "prompt_token_us"), (0.0, 1.0, 2.0, 4.0)),
    "moe_layer_us": (("moe_layer_us",), (0.0, 15.0, 28.0, 40.0, 56.0)),
    "moe_bandwidth": (("moe", "bandwidth"), (0.55, 0.586, 0.62, 0.65, 0.726)),
}
#: a value other than the shipped one is chosen where it lowers the other campaigns' figure by more than this
#: share: a campaign whose runs do not depend on the value (SGLang 0.5.1's queue on the count) ties, and its
#: rounding must not choose
TIE = 0.01


def engine_runs(tables: dict[str, pd.DataFrame], engine: str, folder: Path) -> list[tuple[Path, pd.DataFrame]]:
    """The engine's runs of each measured file (`tables`: file name -> its rows), each file's written once to a
    CSV of their own for `estimate --from-csv`: (that CSV, its rows)."""
    out = []
    for name, table in tables.items():
        rows = table[table["backend"] == engine]
        if not rows.empty:
            path = folder / f"{engine}_{name}"
            rows.to_csv(path, index=False)
            out.append((path, rows))
    return out


def errors_at(runs: list[tuple[Path, pd.DataFrame]], profile: dict, place: tuple[str, ...], value,
              folder: Path) -> pd.DataFrame:
    """The runs estimated with `profile` (an engine's shipped data) with `value` at `place`: the campaign and
    the log error of TTFT and TPOT of each."""
    data = copy.deepcopy(profile)
    set_at(data, place, value)
    path = folder / f"{data.get('name', 'profile')}_{place[-1]}_{value}.toml"
    path.write_text(to_toml(data))
    parts = []
    for csv, rows in runs:
        out, _ = estimate_many(csv, {"engine": str(path)}, progress=False)
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


def left_out(per_value: dict, shipped: dict) -> tuple[pd.DataFrame, list]:
    """Each campaign predicted at the value the other campaigns (`per_value`: value -> errors by campaign) choose,
    its own engine's shipped value (`shipped`: campaign -> value) unless another is lower by TIE: (its errors, the
    choices)."""
    names = list(shipped)
    rows, picks = [], []
    for name in names:
        others = [n for n in names if n != name]
        score = {v: float(t.loc[others].median().sum()) if others else 0.0 for v, t in per_value.items()}
        own = shipped[name]
        pick = min(score, key=lambda v: (score[v], v != own))
        pick = pick if score[pick] < score[own] * (1 - TIE) else own
        picks.append(pick)
        rows.append(per_value[pick].loc[name])
    return pd.DataFrame(rows, index=names), picks


def cell(errors: pd.DataFrame) -> str:
    """The median over campaigns of TTFT / TPOT, as printed."""
    return f"{errors['ttft'].median():5.1f} / {errors['tpot'].median():4.1f}"


def ship(engine: str, choice: str, value, across: bool) -> None:
    """Write `value` at the choice's place in the engine's shipped profile, its comments and other keys kept."""
    item = tomlkit.item(value)
    whose = ", of every engine (one harness)" if across else ""
    item.comment(f"by campaign left out{whose}: python bench/shipped_choices.py --choice {choice}"
                 + (" --across-engines" if across else ""))
    set_in_place(ENGINES_DIR / f"{engine}.toml", {CHOICES[choice][0]: item})


def judge(pool: dict, args, place: tuple[str, ...], values: tuple) -> None:
    """Each campaign of the engines in `pool` (engine -> (errors by campaign at each value, its shipped value))
    predicted at the value the pool's other campaigns choose; printed per engine, shipped where asked and lower."""
    per_value = {v: pd.concat([p[v] for p, _ in pool.values()]) for v in values}
    engine_of = {name: e for e, (p, _) in pool.items() for name in p[values[0]].index}
    out, picks = left_out(per_value, {name: pool[e][1] for name, e in engine_of.items()})
    for engine, (own, shipped) in pool.items():
        mine = [i for i, name in enumerate(out.index) if engine_of[name] == engine]
        theirs, picked = out.iloc[mine], [picks[i] for i in mine]
        chosen = {v: picked.count(v) for v in sorted(set(picked), key=picked.count, reverse=True)}
        print(f"{'':<{len(args.choice) + 1}} {engine:<8} {len(theirs):>9}  "
              + "  ".join(f"{cell(own[v]):>13}" for v in values)
              + f"  {cell(own[shipped]):>13}  {cell(theirs):>13}  "
              + ", ".join(f"{v} x{n}" for v, n in chosen.items()))
        lower = theirs.median().sum() < own[shipped].median().sum()
        if args.ship and lower and len(chosen) == 1 and picked[0] != shipped:
            ship(engine, args.choice, picked[0], args.across_engines)
            print(f"  shipped: {engine}.toml {args.choice} = {picked[0]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--choice", choices=CHOICES, default="requests_per_client",
                    help="the profile choice judged (default requests_per_client)")
    ap.add_argument("--min-runs", type=int, default=8, help="campaigns with at least this many runs (default 8)")
    ap.add_argument("--ship", action="store_true", help="write the left-out choice where it lowers the figure")
    ap.add_argument("--across-engines", action="store_true", help="choose over every engine's campaigns, not each "
                    "engine's: a choice of the client (the requests a client sent), which one harness made for all")
    args = ap.parse_args(argv)
    place, values = CHOICES[args.choice]
    start = time.perf_counter()
    print(f"{args.choice}: {'engine':<8} {'campaigns':>9}  " + "  ".join(f"{str(v):>13}" for v in values)
          + f"  {'shipped':>13}  {'left out':>13}  choices")
    tables = {name: pd.read_csv(REFERENCE / name, dtype=str, keep_default_na=False) for name in FILES}
    with tempfile.TemporaryDirectory() as tmp:
        judged = {}
        for engine in sorted({p.stem for p in ENGINES_DIR.glob("*.toml")} - {"none"}):
            data = tomllib.loads((ENGINES_DIR / f"{engine}.toml").read_text())
            shipped = value_at(data, place, values[0])
            if shipped not in values:
                print(f"  {engine}: its shipped {args.choice} {shipped} is not among the values tried")
                continue
            runs = engine_runs(tables, engine, Path(tmp))
            per_value = {v: by_campaign(errors_at(runs, data, place, v, Path(tmp)), args.min_runs) for v in values}
            if not per_value[shipped].empty:
                judged[engine] = (per_value, shipped)
        pools = [judged] if args.across_engines else [{e: j} for e, j in judged.items()]
        for pool in pools:
            judge(pool, args, place, values)
    print(f"(median |error| % TTFT / TPOT over campaigns of at least {args.min_runs} runs; "
          f"{time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
