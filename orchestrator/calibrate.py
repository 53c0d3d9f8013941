"""`servesweep calibrate`: an engine profile fitted to a team's own measured runs.

What it fits is the profile's own quantities, each within physical bounds and pulled gently towards the
base profile's value (a prior), so a knob the runs do not identify stays where the base has it:

- `[efficiency] memory` and `gemm`: multipliers on the device's achievable memory and GEMM efficiency
  (decode steps stream weights and KV; prefill steps compute GEMMs);
- `step_ms`: the host's time per step;
- `[frontend] client_ms`: the time a closed-loop client takes to send the next request, which spreads
  the loop's phases (and adds to TTFT); `[frontend] request_ms`: the API server's serial time a request;

and, where the runs do not say it, the launch: the token budget (`[launch] max_batched_tokens`), async
scheduling, and the prefix cache where the client reuses prompts; and, for closed loops, a front end that
streams at a cost (`[frontend] stream_us`, STREAMS). Each such choice is tried in turn and kept when it
lowers the loss by more than LAUNCH_GAIN. The loss is soft-L1 on the runs' log ratios of
TTFT and TPOT (`robust`), so one run the model cannot follow does not drag the knobs. Runs are estimated
exactly as `estimate` does, each candidate profile written to a file and passed as `--engine` would be.
"""

from __future__ import annotations

import copy
import math
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import tomlkit

from latency.engine import DATA, EFFICIENCY_RANGE, is_profile_path, load_engine, shipped_engines
from orchestrator.estimate import configure, estimate
from orchestrator.fields import InputError
from orchestrator.profile_files import to_toml, write_atomically
from orchestrator.runs import Run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: the fewest runs a fit takes (its leave-one-out fits on one fewer)
MIN_RUNS = 3
#: how much moving a knob by one of its `scale`s costs in the loss (a mean squared log error): as much as a
#: 3 % error on every run, so runs that identify a knob move it and runs that do not leave it at the base's
PRIOR_WEIGHT = 0.001
#: where the loss turns from squared to linear in a run's log ratio: errors beyond ~15 % count by their size,
#: not its square (soft L1)
ROBUST_SCALE = math.log(1.15)
#: a launch choice is kept when it lowers the loss by more than this share (ties keep the base's launch)
LAUNCH_GAIN = 0.05
#: budgets tried where the runs do not give one (0: the engine's default on the device)
BUDGETS = (0, 2048, 4096, 8192, 16384)
#: caps on requests in flight tried where the runs do not give one and some run's clients exceed it (0: the
#: engine's default): an HTTP client's default pool of 100 connections (aiohttp's TCPConnector: gpt-oss-120b's
#: C=512 runs on H100 with vLLM 0.11.2 kept about 100 running, docs/fidelity.md), and vLLM's 256 on smaller GPUs
MAX_NUM_SEQS = (0, 100, 256)
#: where each launch choice a run may leave open (orchestrator.runs.LAUNCH_CHOICES) sits in a profile
LAUNCH_PLACES = {"max_batched_tokens": ("launch", "max_batched_tokens"), "max_num_seqs": ("launch", "max_num_seqs"),
                 "async_scheduling": ("async_scheduling",), "prefix_caching": ("prefix_caching",)}
#: the front end's time per response chunk tried for closed loops (us; 0 is the base's): 20,000 and 10,000
#: chunks a second, about where SGLang 0.5.6's and TensorRT-LLM 1.0's held-back campaigns streamed
#: (bench/littles_law.py; docs/fidelity.md)
STREAM_PLACE = ("frontend", "stream_us")
STREAMS = (50.0, 100.0)
#: least-squares evaluations (Jacobians apart) per fit of the knobs (the leave-one-out fits start from the
#: whole fit: fewer)
FIT_ITERATIONS, REFIT_ITERATIONS = 15, 3
#: the finite-difference step, in units of a knob's prior width: the simulation is piecewise (whole
#: steps and chunks), so a step much smaller than this sees its jumps, not its slope
DIFF_STEP = 0.1


@dataclass(frozen=True)
class Knob:
    """One fitted quantity: its place in the profile's TOML, bounds, and the prior's width."""

    key: tuple[str, ...]
    low: float
    high: float
    scale: float
    log: bool = False  # a multiplier: searched and pulled towards the base in log space
    default: float = 0.0  # its value where the base profile does not name it

    @property
    def label(self) -> str:
        return self.key[0] if len(self.key) == 1 else f"[{self.key[0]}] {self.key[1]}"

    def get(self, data: dict) -> float:
        return float(_get(data, self.key, self.default))

    def set(self, data: dict, value: float) -> None:
        _put(data, self.key, round(float(value), 4))

    def to_unit(self, value: float) -> float:
        """The value in units of the prior's width (log space for a multiplier)."""
        return (math.log(value) if self.log else value) / self.scale

    def from_unit(self, u: float) -> float:
        return math.exp(u * self.scale) if self.log else u * self.scale

    def unit_bounds(self) -> tuple[float, float]:
        return self.to_unit(self.low), self.to_unit(self.high)


#: a multiplier's bounds (within the profile format's EFFICIENCY_RANGE) and prior width (25 %: a kernel
#: family's spread between builds and GPUs)
MULTIPLIER = {"low": 0.5, "high": 1.25, "scale": math.log(1.25), "log": True, "default": 1.0}
KNOBS = (
    Knob(("efficiency", "memory"), **MULTIPLIER),
    Knob(("efficiency", "gemm"), **MULTIPLIER),
    Knob(("step_ms",), 0.0, 10.0, scale=2.0),
    Knob(("frontend", "client_ms"), 0.0, 100.0, scale=20.0),
    Knob(("frontend", "request_ms"), 0.0, 20.0, scale=3.0),
)
assert all(EFFICIENCY_RANGE[0] <= k.low and k.high <= EFFICIENCY_RANGE[1] for k in KNOBS if k.log)


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

    def changes(self) -> list[tuple[str, str, str]]:
        """(what, base value, fitted value) of every knob and launch choice."""
        out = [(k.label, f"{k.get(self.base_data):g}", f"{k.get(self.data):g}") for k in KNOBS]
        for place in LAUNCH_PLACES.values():
            label = place[0] if len(place) == 1 else f"[{place[0]}] {place[1]}"
            out.append((label, _launch_text(self.base_data, place), _launch_text(self.data, place)))
        out.append(("[frontend] stream_us", *(f"{_get(d, STREAM_PLACE, 0.0):g}" for d in (self.base_data, self.data))))
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


def pick_base(runs: list[Run], flags: dict) -> str:
    """--engine when given, else the engine the runs' files name (one), else vllm's profile."""
    if "engine" in flags:
        return flags["engine"]
    named = sorted({r.engine for r in runs if r.engine})
    if len(named) > 1:
        raise InputError("engine", None, f"one engine to calibrate (the runs are of {', '.join(named)}): give "
                         "--engine, or the runs of one engine")
    return named[0] if named else "vllm"


class Evaluator:
    """Predicts runs under candidate profiles: each candidate written to a file of its own (a profile is a
    file, as --engine takes it), every run estimated as `estimate` estimates it. A (profile, run) pair is
    estimated once: the leave-one-out fits start from the same profile and share their first steps."""

    def __init__(self, folder: str, progress=None):
        self.folder, self.progress = Path(folder), progress
        self.files: dict[str, Path] = {}
        self.known: dict[tuple[str, str], tuple[float, float]] = {}

    def predict(self, data: dict, runs: list[Run]) -> np.ndarray:
        """(n x 2) predicted TTFT and TPOT in ms."""
        text = to_toml(data)
        out = np.array([self.known.get((text, run.where)) or self._estimate(text, run) for run in runs])
        if self.progress is not None:
            self.progress.update(1)
        return out

    def _estimate(self, text: str, run: Run) -> tuple[float, float]:
        path = self.files.get(text)
        if path is None:
            path = self.files[text] = self.folder / f"candidate-{len(self.files) + 1}.toml"
            path.write_text(text)
        try:
            row = estimate(configure(run.under(str(path))))
        except InputError as err:
            raise InputError(f"{run.where}, {err.name}", err.value, err.allowed) from None
        self.known[(text, run.where)] = row["ttft_ms"], row["tpot_ms"]
        return self.known[(text, run.where)]


def errors(pred: np.ndarray, runs: list[Run]) -> np.ndarray:
    """Signed relative errors (ours / measured - 1), n x 2."""
    return pred / np.array([[r.ttft_ms, r.tpot_ms] for r in runs]) - 1


def robust(logs: np.ndarray) -> np.ndarray:
    """Log ratios as residuals whose squares are the soft-L1 loss: squared below ROBUST_SCALE, linear beyond,
    so a run the model cannot follow (a structural miss) does not drag the knobs every other run sets."""
    c = ROBUST_SCALE
    return np.sign(logs) * c * np.sqrt(2 * (np.sqrt(1 + (logs / c) ** 2) - 1))


def residuals(pred: np.ndarray, runs: list[Run], data: dict, base: dict) -> np.ndarray:
    """The runs' robust log ratios of TTFT and TPOT (scaled so their squares sum to the mean), then the
    prior's pull towards the base's knobs: the sum of squares is `loss`."""
    logs = robust(np.log(np.maximum(errors(pred, runs) + 1, 1e-9))).ravel() / math.sqrt(2 * len(runs))
    pull = [math.sqrt(PRIOR_WEIGHT) * (k.to_unit(k.get(data)) - k.to_unit(k.get(base))) for k in KNOBS]
    return np.concatenate([logs, pull])


def loss(pred: np.ndarray, runs: list[Run], data: dict, base: dict) -> float:
    """Mean squared log ratio of TTFT and TPOT, plus the prior's pull towards the base's knobs."""
    return float(np.sum(residuals(pred, runs, data, base) ** 2))


def fit_knobs(ev: Evaluator, runs: list[Run], start: dict, base: dict, iterations: int) -> tuple[dict, float]:
    """The knobs fitted from `start` (its launch kept) by bounded least squares (trust region, forward
    differences: len(KNOBS) + 1 runs of the simulation an iteration): (profile data, loss)."""
    from scipy.optimize import least_squares

    def trial(u):
        data = copy.deepcopy(start)
        for knob, value in zip(KNOBS, u, strict=True):
            knob.set(data, min(max(knob.from_unit(value), knob.low), knob.high))
        return data

    seen = {}

    def fun(u):
        key = tuple(np.round(u, 9))
        if key not in seen:
            data = trial(u)
            seen[key] = residuals(ev.predict(data, runs), runs, data, base)
        return seen[key]

    low, high = (np.array(side) for side in zip(*(k.unit_bounds() for k in KNOBS), strict=True))

    def jac(u):
        """Forward differences of DIFF_STEP (backward at an upper bound)."""
        here, columns = fun(u), []
        for i in range(len(u)):
            step = DIFF_STEP if u[i] + DIFF_STEP <= high[i] else -DIFF_STEP
            moved = np.array(u, dtype=float)
            moved[i] += step
            columns.append((fun(moved) - here) / step)
        return np.stack(columns, axis=1)

    u0 = np.clip([k.to_unit(min(max(k.get(start), k.low), k.high)) for k in KNOBS], low, high)
    least_squares(fun, u0, jac=jac, bounds=(low, high), max_nfev=iterations, x_scale=1.0)
    best = min(seen, key=lambda key: float(np.sum(seen[key] ** 2)))
    return trial(np.array(best)), float(np.sum(seen[best] ** 2))


def launch_options(runs: list[Run], data: dict, kept: set = frozenset()) -> list[dict]:
    """Profiles that differ from `data` in one launch choice the runs leave open: each other budget, each cap
    on requests in flight below the most clients a run had (MAX_NUM_SEQS), async scheduling flipped, the
    prefix cache flipped where the client reuses prompts (aiperf), and each other streaming time of the front
    end where the runs are closed loops; none of a place in `kept` (chosen already)."""
    open_ = {key for r in runs for key in LAUNCH_PLACES if key not in r.states and LAUNCH_PLACES[key] not in kept}
    if not any(r.values.get("benchmark") == "aiperf" for r in runs):
        open_.discard("prefix_caching")
    clients = max(int(r.values.get("concurrency") or 0) for r in runs)
    counts = {"max_batched_tokens": BUDGETS, "max_num_seqs": [n for n in MAX_NUM_SEQS if n < clients]}
    options = []
    for key, place in LAUNCH_PLACES.items():
        if key not in open_:
            continue
        own = _get(data, place, False if len(place) == 1 else 0)
        values = [n for n in counts[key] if n != own] if key in counts else [not own]
        options += [_with(data, place, value) for value in values]
    if any(r.values.get("arrival") == "closed" for r in runs) and STREAM_PLACE not in kept:
        own = _get(data, STREAM_PLACE, 0.0)
        options += [_with(data, STREAM_PLACE, value) for value in (0.0, *STREAMS) if value != own]
    return options


def fit(ev: Evaluator, runs: list[Run], base: dict, start: dict | None = None, options: list[dict] | None = None,
        iterations: int = FIT_ITERATIONS) -> tuple[dict, float]:
    """Knobs, then each launch choice (`options`: by default every one the runs leave open) at those knobs;
    the best choice kept (and its knobs refitted) where it gains more than LAUNCH_GAIN. Without `options`,
    the choices of the other launch keys are tried again at the refitted knobs, one key kept a round, until
    none gains: two things a launch left unsaid (a budget and a cap on requests in flight) are found together."""
    data, best = fit_knobs(ev, runs, copy.deepcopy(start or base), base, iterations)
    given, kept = options is not None, set()
    while True:
        tried = [(loss(ev.predict(option, runs), runs, option, base), i, option) for i, option in
                 enumerate([_launch_of(o, data) for o in options] if given else launch_options(runs, data, kept))]
        if not tried:
            return data, best
        value, _, option = min(tried, key=lambda t: t[:2])
        if value >= best * (1 - LAUNCH_GAIN):
            return data, best
        kept |= _launch_keys(option, data)
        data, best = fit_knobs(ev, runs, option, base, iterations)
        if given:
            return data, best


def _launch_keys(option: dict, data: dict) -> set[tuple[str, ...]]:
    """The launch places in which `option` differs from `data`."""
    return {place for place in (*LAUNCH_PLACES.values(), STREAM_PLACE)
            if _get(option, place, None) != _get(data, place, None)}


def _launch_of(source: dict, data: dict) -> dict:
    """`data` with the launch choices of `source`."""
    out = copy.deepcopy(data)
    for place in LAUNCH_PLACES.values():
        _put(out, place, _get(source, place, False if len(place) == 1 else 0))
    if _get(source, STREAM_PLACE, 0.0) != _get(out, STREAM_PLACE, 0.0):
        _put(out, STREAM_PLACE, _get(source, STREAM_PLACE, 0.0))
    return out


def calibrate(runs: list[Run], engine: str, leave_one_out: bool = True, progress: bool = True) -> Calibration:
    """Fit a profile to `runs` from the base `engine` (a shipped name or a profile path)."""
    from tqdm import tqdm

    if len(runs) < MIN_RUNS:
        raise InputError("RUNS", f"{len(runs)} runs", f"at least {MIN_RUNS} measured runs of the deployment")
    try:
        base = base_profile(engine)
    except ValueError as err:
        raise InputError("engine", engine, str(err).split("; ", 1)[-1]) from None
    per_fit = (len(KNOBS) + 1) * FIT_ITERATIONS
    total = 2 * per_fit + 8 + (len(runs) * (2 * (len(KNOBS) + 1) * REFIT_ITERATIONS + 2) if leave_one_out else 0)
    with tempfile.TemporaryDirectory(prefix="servesweep-calibrate-") as folder, \
            tqdm(total=total, desc="calibrate", unit="fit", file=sys.stderr, disable=not progress) as bar:
        ev = Evaluator(folder, bar)
        base_errors = errors(ev.predict(base, runs), runs)
        data, _ = fit(ev, runs, base)
        fit_errors = errors(ev.predict(data, runs), runs)
        loo = None
        if leave_one_out:
            loo = np.empty_like(fit_errors)
            choices = [base, data]  # the base's launch and the whole fit's: the others lost on every run
            for i in range(len(runs)):
                rest = runs[:i] + runs[i + 1:]
                alone, _ = fit(ev, rest, base, start=data, options=choices, iterations=REFIT_ITERATIONS)
                loo[i] = errors(ev.predict(alone, [runs[i]]), [runs[i]])[0]
        bar.update(total - bar.n)
    return Calibration(data, base, runs, base_errors, fit_errors, loo)


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
    doc = tomlkit.parse(target.read_text())
    fitted = profile_data(c, str(doc.get("name", target.stem)), files)
    places = [k.key for k in KNOBS] + list(LAUNCH_PLACES.values()) + [STREAM_PLACE]
    for place in places:
        old, new = _get(c.base_data, place, None), _get(c.data, place, None)
        if new is not None and new != old:
            table = doc if len(place) == 1 else doc.setdefault(place[0], tomlkit.table())
            table[place[-1]] = new
    doc["source"] = fitted["source"]
    doc["calibration"] = fitted["calibration"]
    write_atomically(target, tomlkit.dumps(doc))


def _get(data: dict, place: tuple[str, ...], default):
    """The value at `place` of a profile's TOML data: a top-level key, or (table, key)."""
    return (data.get(place[0], {}) if len(place) == 2 else data).get(place[-1], default)


def _put(data: dict, place: tuple[str, ...], value) -> None:
    (data.setdefault(place[0], {}) if len(place) == 2 else data)[place[-1]] = value


def _with(data: dict, place: tuple[str, ...], value) -> dict:
    out = copy.deepcopy(data)
    _put(out, place, value)
    return out


def _launch_text(data: dict, place: tuple[str, ...]) -> str:
    """A launch choice as printed: on/off, or a budget (0: the engine's default)."""
    if len(place) == 1:
        return "on" if _get(data, place, False) else "off"
    return str(_get(data, place, 0) or "default")


def _median_abs(values: np.ndarray) -> float:
    return float(np.median(np.abs(values)))
