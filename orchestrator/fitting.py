"""How calibrate fits a profile to runs: the knobs (the profile's own quantities, each within physical bounds
and pulled towards the base's value by a prior), the soft-L1 loss on the runs' log ratios of TTFT and TPOT
(`robust`), bounded least squares over the knobs (`fit_knobs`), and the launch choices the runs leave open,
each tried at the fitted knobs and kept where it lowers the loss by more than LAUNCH_GAIN (ROUNDS_GAIN for the
requests a client; `fit`). Runs are estimated exactly as `estimate` does, each candidate profile written to a
file and passed as `--engine` would be (`Evaluator`).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from latency import load_model
from latency.engine import EFFICIENCY_RANGE
from orchestrator.choices import CHOICE_DEFAULTS, ROUNDS_PLACE, label_of, launch_of, launch_options, set_at, value_at
from orchestrator.collector import freeze_survivors
from orchestrator.estimate import configure, estimate
from orchestrator.fields import InputError
from orchestrator.forked import can_fork, fork_pool, stop
from orchestrator.profile_files import to_toml
from orchestrator.runs import Run

#: how much moving a knob by one of its `scale`s costs in the loss (a mean squared log error): as much as a
#: 3 % error on every run, so runs that identify a knob move it and runs that do not leave it at the base's
PRIOR_WEIGHT = 0.001
#: where the loss turns from squared to linear in a run's log ratio: errors beyond ~15 % count by their size,
#: not its square (soft L1)
ROBUST_SCALE = math.log(1.15)
#: a launch choice is kept when it lowers the loss by more than this share (ties keep the base's launch):
#: 2 %, not 5 %, by the runs calibrate did not see (bench/calibrate_campaigns.py: TPOT 7.2 % -> 6.8 %, TTFT
#: and the worst campaign the same; 10 %: TTFT 17.4 % -> 18.2 %; docs/calibration.md)
LAUNCH_GAIN = 0.02
#: the requests a client (choices.ROUNDS) are kept only where they lower the loss by more than this share:
#: fewer requests a client also stand in for a queue they are not (KV blocks our memory picture says are free),
#: and at LAUNCH_GAIN two campaigns of 9 runs kept 5 on their five runs and missed their others (22.7 % -> 44.4 %,
#: 8.7 % -> 16.7 % TTFT); at 10 % neither does and the median is the same (bench/calibrate_campaigns.py: 15.7 % /
#: 5.7 %, worst 44.4 % -> 37.0 %; at 5 %: 16.7 % / 5.7 %, worst 44.4 %)
ROUNDS_GAIN = 0.10
#: least-squares evaluations (Jacobians apart) per fit of the knobs (the leave-one-out fits start from the
#: whole fit: fewer)
FIT_ITERATIONS, REFIT_ITERATIONS = 15, 3
#: the finite-difference step, in units of a knob's prior width: the simulation is piecewise (whole
#: steps and chunks), so a step much smaller than this sees its jumps, not its slope
DIFF_STEP = 0.1
#: a fit of the knobs ends when an iteration lowers the loss by less than this share (scipy's `ftol`; its default,
#: 1e-8, ran every fit to FIT_ITERATIONS): the same knobs to 3-4 digits in fewer simulations (MiniMax-M2.5 NVFP4
#: on B200, five runs: 1,555 -> 1,155 estimates)
FIT_TOLERANCE = 1e-3
#: `bounded_losses` drops a candidate only when its partial sum passes its bar by more than this share: summed
#: in another order, the whole loss may differ from the parts' sum in its last bits
BOUND_SLACK = 1e-9


@dataclass(frozen=True)
class Knob:
    """One fitted quantity: its place in the profile's TOML, bounds, and the prior's width."""

    key: tuple[str, ...]
    low: float
    high: float
    scale: float
    log: bool = False  # a multiplier: searched and pulled towards the base in log space
    default: float = 0.0  # its value where the base profile does not name it
    hold: float = 1.0  # the prior's weight on this knob, in PRIOR_WEIGHTs

    @property
    def label(self) -> str:
        return label_of(self.key)

    def get(self, data: dict) -> float:
        return float(value_at(data, self.key, self.default))

    def set(self, data: dict, value: float) -> None:
        set_at(data, self.key, round(float(value), 4))

    def to_unit(self, value: float) -> float:
        """The value in units of the prior's width (log space for a multiplier)."""
        return (math.log(value) if self.log else value) / self.scale

    def from_unit(self, u: float) -> float:
        return math.exp(u * self.scale) if self.log else u * self.scale

    def unit_bounds(self) -> tuple[float, float]:
        return self.to_unit(self.low), self.to_unit(self.high)


#: the front end's knobs (client_ms, request_ms) are held this many times as firmly as the others: five runs
#: with too little of a loop's phase spread in them moved the client tens of ms to bend TTFT (gpt-oss-120b's, to
#: 48 ms) and the campaign's other runs paid; held 4x, every run calibrate did not see 16.8 % -> 15.2 % TTFT,
#: TPOT 6.3 % -> 6.4 %, lower TTFT on three draws; with the launch choices also tried at the base's knobs, 2x
#: 16.3 %, 4x 14.6 %, 8x 15.4 % (bench/calibrate_campaigns.py, docs/calibration.md)
FRONTEND_HOLD = 4.0

#: a multiplier's bounds (within the profile format's EFFICIENCY_RANGE) and prior width (25 %: a kernel
#: family's spread between builds and GPUs)
MULTIPLIER = {"low": 0.5, "high": 1.25, "scale": math.log(1.25), "log": True, "default": 1.0}
KNOBS = (
    Knob(("efficiency", "memory"), **MULTIPLIER),
    Knob(("efficiency", "gemm"), **MULTIPLIER),
    Knob(("step_ms",), 0.0, 10.0, scale=2.0),
    Knob(("frontend", "client_ms"), 0.0, 100.0, scale=20.0, hold=FRONTEND_HOLD),
    Knob(("frontend", "request_ms"), 0.0, 20.0, scale=3.0, hold=FRONTEND_HOLD),
)
#: a MoE model's runs fit one more: what a step that computes prompt tokens adds through each MoE layer (the expert
#: path launched outside the decode CUDA graphs; vLLM's and SGLang's 200 us, TensorRT-LLM's 300), which their
#: TTFT identifies and a dense model's runs cannot move. On MiniMax-M2.5 FP8's H100 campaign its other runs go
#: 31.8 % -> 18.9 % TTFT, the MoE campaigns' median 14.4 % / 6.6 % -> 14.0 % / 6.0 % (docs/calibration.md)
MOE_KNOBS = (Knob(("moe_prefill_layer_us",), 0.0, 1000.0, scale=100.0),)
assert all(EFFICIENCY_RANGE[0] <= k.low and k.high <= EFFICIENCY_RANGE[1] for k in KNOBS if k.log)


def knobs_of(runs: list[Run]) -> tuple[Knob, ...]:
    """The knobs `runs` are fitted with: KNOBS, and MOE_KNOBS where a run serves a MoE model (asked at every
    evaluation of the loss: each model is looked up once)."""
    return KNOBS + MOE_KNOBS if any(_serves_moe(model) for model in {r.values.get("model", "") for r in runs}) \
        else KNOBS


@cache
def _serves_moe(model) -> bool:
    try:
        return load_model(model).is_moe
    except ValueError:  # an unknown model: estimating the run names it
        return False


class Evaluator:
    """Predicts runs under candidate profiles: each candidate written to a file of its own (a profile is a
    file, as --engine takes it), every run estimated as `estimate` estimates it. A (profile, run) pair is
    estimated once: the leave-one-out fits start from the same profile and share their first steps. Given
    `processes` > 1, the pairs several candidates need at once (a Jacobian's, a round of launch choices) are
    estimated over that many forked processes: each pair is what it is alone, so the fit is the same."""

    def __init__(self, folder: str, progress=None, processes: int = 1):
        self.folder, self.progress = Path(folder), progress
        self.files: dict[str, Path] = {}
        #: (TTFT, TPOT, the share of its KV pool the run held at its fullest) of each (profile, run) pair
        self.known: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.seconds: dict[str, float] = {}  # what the latest estimate of each run took: the order to bound in
        self.processes, self.pool = processes, None

    def predict(self, data: dict, runs: list[Run]) -> np.ndarray:
        """(n x 2) predicted TTFT and TPOT in ms."""
        return self.predict_many([data], runs)[0]

    def predict_many(self, datas: list[dict], runs: list[Run], counted: bool = True) -> list[np.ndarray]:
        """`predict` of each candidate, the pairs not estimated yet estimated together (`counted`: on the bar)."""
        texts = [to_toml(data) for data in datas]
        todo = {(text, run.where): run for text in texts for run in runs if (text, run.where) not in self.known}
        got = self._estimates([str(self._file(text)) for text, _ in todo], list(todo.values()))
        for (pair, run), (value, seconds) in zip(todo.items(), got, strict=True):
            self.seconds[run.where] = seconds
            if isinstance(value, Refusal):
                raise InputError(f"{run.where}, {value.name}", value.value, value.allowed)
            self.known[pair] = value
        if self.progress is not None and counted:
            self.progress.update(len(datas))
        return [np.array([self.known[(text, run.where)][:2] for run in runs]) for text in texts]

    def fullest(self, data: dict, runs: list[Run]) -> float:
        """The largest share of its KV pool a run held under `data` (predicted already), 1 where one queued."""
        text = to_toml(data)
        return max((self.known[(text, run.where)][2] for run in runs), default=1.0)

    def _file(self, text: str) -> Path:
        path = self.files.get(text)
        if path is None:
            path = self.files[text] = self.folder / f"candidate-{len(self.files) + 1}.toml"
            path.write_text(text)
        return path

    def cheapest_first(self, runs: list[Run]) -> list[Run]:
        """`runs` by what their latest estimate took, the quickest first (one not estimated yet last)."""
        return sorted(runs, key=lambda run: self.seconds.get(run.where, math.inf))

    def _estimates(self, paths: list[str], runs: list[Run]) -> list:
        """((TTFT, TPOT, fill) or the Refusal of its InputError, seconds) of each run under the profile at its path."""
        if self.processes < 2 or len(runs) < 2 or not can_fork():
            return [timed_estimate(path, run) for path, run in zip(paths, runs, strict=True)]
        self.pool = self.pool or fork_pool(self.processes)
        return list(self.pool.map(timed_estimate, paths, runs))

    def close(self) -> None:
        if self.pool is not None:
            stop(self.pool)  # an interrupted fit leaves its jobs: shutting down would wait for them
            self.pool = None


class Refusal(NamedTuple):
    """An InputError as a value: a forked process hands it back so (the error itself does not unpickle)."""

    name: str
    value: object
    allowed: str


def estimate_under(path: str, run: Run) -> tuple[float, float, float] | Refusal:
    """A run's (TTFT, TPOT) under the profile at `path`, as `estimate` gives them, and the share of its KV pool it
    held at its fullest (1 where it queued for blocks); or why it was refused."""
    try:
        row = estimate(configure(run.under(path)))
    except InputError as err:
        return Refusal(err.name, err.value, err.allowed)
    capacity = row.get("kv_capacity_tokens") or 0
    fill = 1.0 if row.get("kv_bound") or capacity <= 0 else min(1.0, float(row.get("peak_kv_tokens") or 0) / capacity)
    return row["ttft_ms"], row["tpot_ms"], fill


def timed_estimate(path: str, run: Run) -> tuple[tuple[float, float, float] | Refusal, float]:
    """`estimate_under` and the seconds it took; what it left alive frozen (`freeze_survivors`: a fit's pricers
    and parts would otherwise be walked by each collection, 7.4 s of a 80 s fit)."""
    started = time.perf_counter()
    value = estimate_under(path, run)
    freeze_survivors()
    return value, time.perf_counter() - started


def errors(pred: np.ndarray, runs: list[Run]) -> np.ndarray:
    """Signed relative errors (ours / measured - 1), n x 2."""
    return pred / np.array([[r.ttft_ms, r.tpot_ms] for r in runs]) - 1


def robust(logs: np.ndarray) -> np.ndarray:
    """Log ratios as residuals whose squares are the soft-L1 loss: squared below ROBUST_SCALE, linear beyond,
    so a run the model cannot follow (a structural miss) does not drag the knobs every other run sets."""
    c = ROBUST_SCALE
    return np.sign(logs) * c * np.sqrt(2 * (np.sqrt(1 + (logs / c) ** 2) - 1))


def run_residuals(pred: np.ndarray, runs: list[Run], count: int) -> np.ndarray:
    """The runs' robust log ratios of TTFT and TPOT (n x 2), scaled so that their squares over `count` runs sum
    to the mean."""
    return robust(np.log(np.maximum(errors(pred, runs) + 1, 1e-9))) / math.sqrt(2 * count)


def pull(data: dict, base: dict, runs: list[Run]) -> np.ndarray:
    """The prior's pull of each knob towards the base's value (its square the knob's share of `loss`)."""
    return np.array([math.sqrt(PRIOR_WEIGHT * k.hold) * (k.to_unit(k.get(data)) - k.to_unit(k.get(base)))
                     for k in knobs_of(runs)])


def residuals(pred: np.ndarray, runs: list[Run], data: dict, base: dict) -> np.ndarray:
    """The runs' robust log ratios of TTFT and TPOT, then the prior's pull towards the base's knobs: the sum of
    squares is `loss`."""
    return np.concatenate([run_residuals(pred, runs, len(runs)).ravel(), pull(data, base, runs)])


def loss(pred: np.ndarray, runs: list[Run], data: dict, base: dict) -> float:
    """Mean squared log ratio of TTFT and TPOT, plus the prior's pull towards the base's knobs."""
    return float(np.sum(residuals(pred, runs, data, base) ** 2))


def bounded_losses(ev: Evaluator, candidates: list[dict], runs: list[Run], base: dict,
                   bars: list[float]) -> list[float]:
    """Each candidate's `loss`, or inf where it cannot come under its bar: the runs are estimated quickest first
    (`Evaluator.cheapest_first`), and a candidate whose share of the loss from those estimated so far and the
    prior's pull passes its bar is not estimated on the rest. The loss is a sum of squares, so none under its bar
    is dropped: a round of launch choices keeps the one it would keep with every run estimated, and its hopeless
    candidates skip the heaviest run (a KV-bound loop of 512 clients, 0.28 s an estimate)."""
    share = [float(np.sum(pull(c, base, runs) ** 2)) for c in candidates]
    alive = [i for i in range(len(candidates)) if share[i] <= bars[i] * (1 + BOUND_SLACK)]
    for k, run in enumerate(ev.cheapest_first(runs)):
        preds = ev.predict_many([candidates[i] for i in alive], [run], counted=k == 0)
        for i, pred in zip(alive, preds, strict=True):
            share[i] += float(np.sum(run_residuals(pred, [run], len(runs)) ** 2))
        alive = [i for i in alive if share[i] <= bars[i] * (1 + BOUND_SLACK)]
    out = [math.inf] * len(candidates)
    for i, pred in zip(alive, ev.predict_many([candidates[i] for i in alive], runs, counted=False), strict=True):
        out[i] = loss(pred, runs, candidates[i], base)
    return out


def fit_knobs(ev: Evaluator, runs: list[Run], start: dict, base: dict, iterations: int) -> tuple[dict, float]:
    """The knobs fitted from `start` (its launch kept) by bounded least squares (trust region, forward
    differences: a run of the simulation a knob (`knobs_of`), and one, an iteration): (profile data, loss)."""
    from scipy.optimize import least_squares

    knobs = knobs_of(runs)

    def trial(u):
        data = copy.deepcopy(start)
        for knob, value in zip(knobs, u, strict=True):
            knob.set(data, min(max(knob.from_unit(value), knob.low), knob.high))
        return data

    seen = {}

    def key(u) -> tuple:
        return tuple(np.round(u, 9))

    def fun(u):
        if key(u) not in seen:
            data = trial(u)
            seen[key(u)] = residuals(ev.predict(data, runs), runs, data, base)
        return seen[key(u)]

    low, high = (np.array(side) for side in zip(*(k.unit_bounds() for k in knobs), strict=True))

    def jac(u):
        """Forward differences of DIFF_STEP (backward at an upper bound), the moved points predicted at once."""
        here, steps, moved = fun(u), [], []
        for i in range(len(u)):
            steps.append(DIFF_STEP if u[i] + DIFF_STEP <= high[i] else -DIFF_STEP)
            moved.append(np.array(u, dtype=float))
            moved[-1][i] += steps[-1]
        todo = [(m, trial(m)) for m in moved if key(m) not in seen]
        for (m, data), pred in zip(todo, ev.predict_many([data for _, data in todo], runs), strict=True):
            seen[key(m)] = residuals(pred, runs, data, base)
        return np.stack([(fun(m) - here) / step for m, step in zip(moved, steps, strict=True)], axis=1)

    u0 = np.clip([k.to_unit(min(max(k.get(start), k.low), k.high)) for k in knobs], low, high)
    least_squares(fun, u0, jac=jac, bounds=(low, high), max_nfev=iterations, x_scale=1.0,
                  ftol=FIT_TOLERANCE)
    best = min(seen, key=lambda key: float(np.sum(seen[key] ** 2)))
    return trial(np.array(best)), float(np.sum(seen[best] ** 2))


def fit(ev: Evaluator, runs: list[Run], base: dict, start: dict | None = None, options: list[dict] | None = None,
        iterations: int = FIT_ITERATIONS) -> tuple[dict, float]:
    """Knobs, then each launch choice (`options`: by default every one the runs leave open) at those knobs;
    of the choices that gain more than they must (`_gain_needed`), the one of least loss kept (and its knobs
    refitted): a choice that must gain more is not put behind one that gains less. Without `options`,
    every choice is tried again at the refitted knobs, one kept a round, until none gains: two things a launch
    left unsaid (a budget and a cap on requests in flight) are found together, and a choice first judged at
    knobs fitted for another launch is judged again at its own (each round lowers the loss: it ends); where one
    was kept, the knobs are fitted again from the base's (`refit`). Each choice is tried at the fitted knobs and
    at the base's: knobs bent to fit one launch can hide the launch the runs were made with (a budget of 2048
    behind a cap of 100, `test_a_budget_and_a_cap_left_unsaid_are_found_together`; TensorRT-LLM's Llama-3.1-8B's
    other runs 33.5 % -> 15.8 % TTFT)."""
    data, best = fit_knobs(ev, runs, copy.deepcopy(start or base), base, iterations)
    given, kept = options is not None, False
    while True:
        candidates = [launch_of(o, data) for o in options] if given else \
            launch_options(runs, data, ev.fullest(data, runs))
        if not given and knobs_moved(data, base, runs):
            candidates += [launch_of(c, base) for c in candidates]
        bars = [bar(best, option, data) for option in candidates]
        tried = [(value, i, option) for i, (option, value)
                 in enumerate(zip(candidates, bounded_losses(ev, candidates, runs, base, bars), strict=True))]
        option = kept_choice(tried, best, data)
        if option is None:
            break
        data, best = fit_knobs(ev, runs, option, base, iterations)
        kept = True
        if given:
            return data, best
    return refit(ev, runs, data, best, base, iterations) if kept else (data, best)


def knobs_moved(data: dict, base: dict, runs: list[Run]) -> bool:
    """Whether `data`'s knobs differ from the base's (then each launch choice is tried at both). By the knobs'
    values, not the tables: a fit writes a knob the base leaves unnamed at its default, and a profile's text
    that differs names another candidate file to simulate."""
    return any(k.get(data) != k.get(base) for k in knobs_of(runs))


def kept_choice(tried: list[tuple[float, int, dict]], best: float, data: dict) -> dict | None:
    """Of the choices tried (at `data`'s knobs or the base's), (loss, order, profile) each, the one of least loss
    among those that lower `best` by more than they must (`_gain_needed`); None where none does. (Ranking them by
    loss over what they must gain put SGLang 0.5.6's five runs on a 50 us stream, 0.1039 against 0.1348, before
    five requests a client, 0.1011, which then gained too little to be kept: its other runs 14.2 % -> 23.4 %
    TTFT.)"""
    gaining = [t for t in tried if t[0] < bar(best, t[2], data)]
    return min(gaining, key=lambda t: t[:2])[2] if gaining else None


def refit(ev: Evaluator, runs: list[Run], data: dict, best: float, base: dict, iterations: int) -> tuple[dict, float]:
    """The knobs fitted again from the base's at the launch `data` ended on, kept where the loss is lower: each
    choice was kept at knobs fitted for the launch before it, a path a fit from the base's knobs may improve on
    (bench/calibrate_campaigns.py: by campaign 15.4 % / 6.2 % -> 14.8 % / 6.1 %, docs/calibration.md)."""
    again, lower = fit_knobs(ev, runs, launch_of(data, base), base, iterations)
    return (again, lower) if lower < best else (data, best)


def bar(best: float, option: dict, data: dict) -> float:
    """The loss under which a choice is kept: `best` less the share it must gain (`_gain_needed`)."""
    return best * (1 - _gain_needed(option, data))


def _gain_needed(option: dict, data: dict) -> float:
    """The share of the loss a choice must save to be kept: ROUNDS_GAIN where it changes the requests a
    client, else LAUNCH_GAIN."""
    default = CHOICE_DEFAULTS[ROUNDS_PLACE]
    rounds = value_at(option, ROUNDS_PLACE, default) != value_at(data, ROUNDS_PLACE, default)
    return ROUNDS_GAIN if rounds else LAUNCH_GAIN
