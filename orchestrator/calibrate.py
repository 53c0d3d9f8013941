"""`servesweep calibrate`: an engine profile fitted to a team's own measured runs.

What it fits is the profile's own quantities, each within physical bounds and pulled gently towards the
base profile's value (a prior), so a knob the runs do not identify stays where the base has it:

- `[efficiency] memory` and `gemm`: multipliers on the device's achievable memory and GEMM efficiency
  (decode steps stream weights and KV; prefill steps compute GEMMs);
- `step_ms`: the host's time per step;
- `[frontend] client_ms`: the time a closed-loop client takes to send the next request, which spreads
  the loop's phases (and adds to TTFT); `[frontend] request_ms`: the API server's serial time a request;

and, where the runs do not say it, the launch: the token budget (`[launch] max_batched_tokens`), a cap on
requests in flight (`[launch] max_num_seqs`), async scheduling, and the prefix cache where the client reuses
prompts; and, for closed loops, a front end that streams at a cost (`[frontend] stream_us`); and the share of its
KV pool the engine held (`[memory] kv_share`, which runs that queued for KV blocks tell), and an engine that runs
one request fewer than a closed loop's clients (`[launch] below_clients`). How they are
fitted is `orchestrator.fitting`'s; this module is the command's side: the base profile, the fit and its
leave-one-out errors, and the profile written.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from latency.engine import DATA, is_profile_path, load_engine, shipped_engines
from orchestrator.choices import (
    CHOICE_DEFAULTS,
    LAUNCH_PLACES,
    label_of,
    open_launch,
    set_at,
    unset,
    value_at,
    with_value,
)
from orchestrator.fields import InputError
from orchestrator.fitting import (
    FIT_ITERATIONS,
    LAUNCH_GAIN,
    REFIT_ITERATIONS,
    Evaluator,
    errors,
    fit,
    fit_knobs,
    knobs_of,
    loss,
)
from orchestrator.measured_runs import READ_LAUNCH
from orchestrator.profile_files import set_in_place
from orchestrator.runs import Run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["MIN_RUNS", "Calibration", "as_read", "base_profile", "calibrate", "loss", "pick_base",
           "profile_data", "profile_file", "update_profile"]

#: the fewest runs a fit takes (its leave-one-out fits on one fewer)
MIN_RUNS = 3


@dataclass
class Calibration:
    """A fit: the profile's TOML data, and each run's signed relative errors (n x 2: TTFT, TPOT) with the
    base profile, the fitted one, and the fitted-without-it one (None when not asked)."""

    data: dict
    base_data: dict
    runs: list[Run]
    base_errors: np.ndarray
    fit_errors: np.ndarray
    loo_errors: np.ndarray | None
    simulations: int = 0  # the runs simulated under a candidate profile, the leave-one-out fits' included

    def changes(self) -> list[tuple[str, str, str]]:
        """(what, base value, fitted value) of every knob and launch choice."""
        out = [(k.label, f"{k.get(self.base_data):g}", f"{k.get(self.data):g}") for k in knobs_of(self.runs)]
        for place in LAUNCH_PLACES.values():
            out.append((label_of(place), _launch_text(self.base_data, place), _launch_text(self.data, place)))
        for place, default in CHOICE_DEFAULTS.items():
            out.append((label_of(place), *(_choice_text(d, place, default) for d in (self.base_data, self.data))))
        return out


def profile_file(engine: str) -> Path:
    """The file a shipped engine or a profile path is read from."""
    return Path(engine) if is_profile_path(engine) else DATA / f"{engine}.toml"


def base_profile(engine: str) -> dict:
    """The TOML data of the profile a calibration starts from (a shipped engine or a profile file), naming
    the shipped engine it describes (none for a hand-written profile of no shipped engine)."""
    family = load_engine(engine).family  # ValueError naming what is wrong
    data = tomllib.loads(profile_file(engine).read_text())
    data["base"] = family if family in shipped_engines() else ""
    data.pop("calibration", None)
    return data


def as_read(base: dict, runs: list[Run]) -> dict:
    """`base` with the launch its runs were read with where none of them states it (a silicon row's prefix cache,
    `measured_runs.READ_LAUNCH`): the fit starts from the runs as `estimate --from-csv` reads them, and may choose
    otherwise."""
    data = copy.deepcopy(base)
    for key in READ_LAUNCH:
        read = {r.values.get(key) for r in runs}
        if len(read) == 1 and None not in read and not any(key in r.states for r in runs):
            set_at(data, LAUNCH_PLACES[key], read.pop() == "on")
    return data


def fit_reading(ev: Evaluator, runs: list[Run], base: dict) -> tuple[dict, float]:
    """`fit` from the runs as read, then, for each reading they leave open (a silicon row's prefix cache, which moves
    TPOT by tens of per cent: judged at knobs fitted for the other reading, a flip loses where it should win), a
    short fit of the knobs with it flipped; where that gains LAUNCH_GAIN, a whole fit from the flipped reading, kept
    where its loss is lower (nvidia/Llama-3.1-8B-Instruct-FP8's campaign: docs/calibration.md)."""
    data, best = fit(ev, runs, base)
    for key in set(READ_LAUNCH) & open_launch(runs):
        place = LAUNCH_PLACES[key]
        if value_at(data, place, None) != value_at(base, place, None):
            continue  # the fit flipped it already
        flipped = with_value(base, place, not value_at(base, place, False))
        if fit_knobs(ev, runs, flipped, base, REFIT_ITERATIONS)[1] < best * (1 - LAUNCH_GAIN):
            other, lower = fit(ev, runs, base, start=flipped)
            data, best = (other, lower) if lower < best else (data, best)
    return data, best


def pick_base(runs: list[Run], flags: dict) -> str:
    """--engine when given, else the engine the runs' files name (one), else vllm's profile."""
    if "engine" in flags:
        return flags["engine"]
    named = sorted({r.engine for r in runs if r.engine})
    if len(named) > 1:
        raise InputError("engine", None, f"one engine to calibrate (the runs are of {', '.join(named)}): give "
                         "--engine, or the runs of one engine")
    return named[0] if named else "vllm"


def calibrate(runs: list[Run], engine: str, leave_one_out: bool = True, progress: bool = True,
              processes: int = 1) -> Calibration:
    """Fit a profile to `runs` from the base `engine` (a shipped name or a profile path), the simulations a
    step of the fit needs at once spread over `processes` forked processes (the same fit)."""
    from tqdm import tqdm

    if len(runs) < MIN_RUNS:
        raise InputError("RUNS", f"{len(runs)} runs", f"at least {MIN_RUNS} measured runs of the deployment")
    try:
        base = as_read(base_profile(engine), runs)
    except ValueError as err:
        raise InputError("engine", engine, str(err).split("; ", 1)[-1]) from None
    knobs = len(knobs_of(runs))
    per_fit = (knobs + 1) * FIT_ITERATIONS
    total = 3 * per_fit + 8 + (len(runs) * (2 * (knobs + 1) * REFIT_ITERATIONS + 2) if leave_one_out else 0)
    with tempfile.TemporaryDirectory(prefix="servesweep-calibrate-") as folder, \
            tqdm(total=total, desc="calibrate", unit="fit", file=sys.stderr, disable=not progress) as bar:
        ev = Evaluator(folder, bar, processes)
        try:
            base_errors = errors(ev.predict(base, runs), runs)
            data, _ = fit_reading(ev, runs, base)
            fit_errors = errors(ev.predict(data, runs), runs)
            loo = _leave_one_out(ev, runs, base, data) if leave_one_out else None
        finally:
            ev.close()
        bar.update(total - bar.n)
    return Calibration(data, base, runs, base_errors, fit_errors, loo, len(ev.known))


def _leave_one_out(ev: Evaluator, runs: list[Run], base: dict, data: dict) -> np.ndarray:
    """Each run's signed errors under a profile refitted without it, from the whole fit (the launch chosen
    between the base's and the whole fit's: the others lost on every run)."""
    loo = np.empty((len(runs), 2))
    for i in range(len(runs)):
        rest = runs[:i] + runs[i + 1:]
        alone, _ = fit(ev, rest, base, start=data, options=[base, data], iterations=REFIT_ITERATIONS)
        loo[i] = errors(ev.predict(alone, [runs[i]]), [runs[i]])[0]
    return loo


def profile_data(c: Calibration, name: str, files: list[str]) -> dict:
    """The fitted profile as it is written: its name, base, source, and a [calibration] table naming the
    runs it was fitted on, when, and its errors."""
    data = copy.deepcopy(c.data)
    data["name"] = name
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = c.base_data["base"] or "a profile of its own"
    data["source"] = f"servesweep calibrate on {len(c.runs)} runs ({', '.join(files)}) from {base}"
    summary = {"base": c.base_data["base"], "fitted_at": when, "runs": [r.where for r in c.runs],
               "fit_ttft_error": round(_median_abs(c.fit_errors[:, 0]), 4),
               "fit_tpot_error": round(_median_abs(c.fit_errors[:, 1]), 4)}
    if c.loo_errors is not None:
        summary |= {"leave_one_out_ttft_error": round(_median_abs(c.loo_errors[:, 0]), 4),
                    "leave_one_out_tpot_error": round(_median_abs(c.loo_errors[:, 1]), 4)}
    data["calibration"] = summary
    return data


def update_profile(path: str, c: Calibration, files: list[str]) -> None:
    """Calibrate the base's own file in place (how the shipped profiles are made): the fitted knobs and
    launch choices that moved, `source` and the [calibration] table rewritten; its comments and every other
    key kept."""
    target = Path(path)
    fitted = profile_data(c, str(tomllib.loads(target.read_text()).get("name", target.stem)), files)
    places = [k.key for k in knobs_of(c.runs)] + list(LAUNCH_PLACES.values()) + list(CHOICE_DEFAULTS)
    moved = {}
    for place in places:
        new = value_at(c.data, place, None)
        if new is not None and new != value_at(c.base_data, place, None):
            moved[place] = new
    set_in_place(target, moved | {("source",): fitted["source"], ("calibration",): fitted["calibration"]})


def _launch_text(data: dict, place: tuple[str, ...]) -> str:
    """A launch choice as printed: on/off, or a budget (0: the engine's default)."""
    value = value_at(data, place, unset(place))
    if len(place) == 1:
        return "on" if value else "off"
    return str(value or "default")


def _choice_text(data: dict, place: tuple[str, ...], default) -> str:
    """A profile choice as printed: a time, a share or a count (a count of 0: the default)."""
    value = value_at(data, place, default)
    return "default" if isinstance(default, int) and not value else f"{value:g}"


def _median_abs(values: np.ndarray) -> float:
    return float(np.median(np.abs(values)))
