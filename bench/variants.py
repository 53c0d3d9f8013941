"""What-if variants of the shipped model against the measured runs: mechanisms tried and not shipped.

    python bench/variants.py VARIANT [--engine E] [--family dense|MoE|MLA ...] [--every N] [--output CSV]

Each variant changes one thing in how `bench/fidelity_e2e.py` plays a measured run (shipped profiles
and front ends, aiperf protocol) and prints the median |error| and the signed median of TTFT and TPOT
per split, engine, model and GPU, so the README's "tried" figures can be reproduced:

- `shipped`: nothing changed (the baseline; equals fidelity_e2e's "calibrated + front end" rows).
- `moe-floor:K:S`: every MoE layer launches K expert kernels (the shipped 3; 4 us each on NVIDIA
  GPUs, a time floor per layer) and the engines' expert bandwidth efficiencies are scaled by S: a
  floor that does not grow with the experts a step touches, with a shallower growth above it.
- `overlap-lag`: a step's tokens reach the client when the next step ends, not when their own does
  (TensorRT-LLM's and SGLang's overlap schedulers hand a step's outputs back after launching the next;
  AIConfigurator models TensorRT-LLM's TTFT as three mixed steps, ai-dynamo/aiconfigurator#610).
  Applied to the times after planning: the closed loop's replacements are still sent at the end of
  the finishing step, so it is an upper bound on what the lag does to TTFT.
- `aiperf-pool`: aiperf's prompts as it sends them, 100 reused at random (`--num-dataset-entries`),
  on an engine whose prefix cache serves the ones it still holds (`simulator.prompts`; the KV pool
  beyond the requests in flight keeps them). The measured runs' engines had no prefix cache (their
  launches turn it off): the TPOTs say whether that reading holds.
- `serial-client:MS`: the client sends one request at a time, MS ms after the one before (not in the
  request's TTFT: its clock starts at the send), so a cohort that finishes together reaches the
  scheduler spread out (engines with a front end: vLLM, TensorRT-LLM).
- `async-since:VERSION`: vLLM runs of VERSION or later schedule a step ahead (async scheduling, on by
  default since vLLM 0.14): their front end gets `lookahead_steps` 1.
- `prefill-layer-us:US`: a step that computes a prompt costs US more per layer (it runs without CUDA
  graphs, which engines capture for decode batches only, so every kernel's host launch shows).
- `moe-prefill-layer-us:US`, `moe-layer-us:US`: the engine's time per MoE layer of a step with prompt
  tokens, or of every step, US instead of its profile's (vLLM 100 and 28, TensorRT-LLM 300 and 0).
- `async-scheduling:on|off`: every run of an engine that has a time per step played with async
  scheduling on (step_ms hidden behind the GPU's) or off, whatever its version.
- `per-step-requests`: the engine's time per request is per step (host work: scheduling, sampling,
  output), not per layer: `request_layer_us` x 64 / the model's layers (the FIT rows' depth, so they
  are played as shipped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from packaging.version import InvalidVersion, Version

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages
sys.path.insert(1, str(Path(__file__).resolve().parent))

import dataclasses  # noqa: E402

import fidelity_e2e as fe  # noqa: E402

import latency.estimator as estimator  # noqa: E402
import simulator.arrivals as arrivals  # noqa: E402
import simulator.metrics as metrics  # noqa: E402
from orchestrator.evaluate import with_prompt_cache  # noqa: E402
from simulator import plan  # noqa: E402
from simulator.benchmarks import protocol  # noqa: E402
from simulator.prompts import PromptPool  # noqa: E402


def lagged(record_times):
    """`metrics._record_times` with every token handed back one step later (the last step's at its end)."""
    def times(plan, durations):
        ends, arrival, first, finish = record_times(plan, durations)
        if plan.phase == "decode":
            return ends, arrival, first, finish
        last, delay = len(ends) - 1, plan.token_delay_ms
        return (ends, arrival, ends[np.minimum(plan.first_step + 2, last)] + delay,
                ends[np.minimum(plan.finish_step + 2, last)] + delay)
    return times


def with_prompt_pool(row: fe.Row) -> fe.Row:
    """The run's loop drawing aiperf's reused prompts on an engine that caches them, planned again."""
    w = row.workloads["bench"]
    size, drained = protocol("aiperf").pool("closed", w.concurrency)
    w = with_prompt_cache(dataclasses.replace(w, prompt_pool=PromptPool(size, drained, cached=True)), row.lm)
    row.workloads["bench"], row.plans["bench"] = w, fe._with_requests(plan(w, row.scheduler))
    row.base.clear()
    return row


#: the depth of the FIT rows the engines' per-request times were fitted on (Qwen3-32B, MiniMax-M2.5: 62-64)
FIT_DEPTH = 64


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit 2 (as argparse's own errors)."""
    print(f"variants.py: error: {message}", file=sys.stderr)
    sys.exit(2)


class Tweaked:
    """A measured run played with another front end or other engine times (what `fe.errors` asks of a row)."""

    def __init__(self, row, frontend=None, params=None):
        self.row, self.r, self.frontend, self.params = row, row.r, frontend, params

    def predict(self, label, comm, *params, frontend=None, engine_time=True):
        return self.row.predict(label, comm, *(self.params or params), frontend=self.frontend or frontend,
                                engine_time=engine_time)


def serial_client(ms: float):
    """`Arrivals.create` with the client sending one request at a time, `ms` apart."""
    create = arrivals.Arrivals.create

    def serial(self, ready_ms):
        if not self.frontend.active:  # an engine without a front end: untimed, as shipped
            return create(self, ready_ms)
        sent = np.sort(np.asarray(ready_ms, dtype=np.float64) + self.frontend.client_delay(self.rng, len(ready_ms)))
        free = getattr(self, "client_free", -np.inf)
        for i, t in enumerate(sent.tolist()):
            free = sent[i] = max(t, free + ms)
        self.client_free = free
        zero = dataclasses.replace(self.frontend, client_ms=0.0)  # the delay is drawn above, once
        self.frontend, keep = zero, self.frontend
        create(self, sent)
        self.frontend = keep
    return serial


def with_row(**values):
    """A row transform: the run played with these engine times of its own (Row attributes: the
    profile's `moe_prefill_layer_us`, `moe_layer_us`, `async_scheduling`) instead of the shipped ones."""
    def transform(row):
        for name, value in values.items():
            setattr(row, name, value)
        return row
    return transform


def with_frontend(settings: str):
    """A row transform: the engine's shipped front end with `settings` (key=value,...) replaced, e.g.
    lookahead_steps=1 (the engine schedules a step ahead: SGLang's overlap scheduler) or client_ms=50."""
    from simulator.frontend import Frontend

    defaults = dataclasses.asdict(Frontend())  # each time's type is its default's (lookahead_steps: int)
    values = {}
    for item in settings.split(","):
        key, _, text = item.partition("=")
        if key not in defaults:
            fail(f"VARIANT frontend:{settings}: {key!r} is not one of {', '.join(defaults)}")
        try:
            values[key] = type(defaults[key])(text)
        except ValueError:
            kind = "an integer" if isinstance(defaults[key], int) else "a number"
            fail(f"VARIANT frontend:{settings}: {key}={text!r}: expected {kind}")
    try:
        Frontend(**values)
    except ValueError as err:
        fail(f"VARIANT frontend:{settings}: {err}")

    def transform(row):
        front = fe.shipped_frontend(row.r.engine) or Frontend()
        return Tweaked(row, frontend=dataclasses.replace(front, **values))
    return transform


def async_since(version: str):
    """A row transform: vLLM runs of `version` or later get a front end that schedules a step ahead."""
    since = Version(version)

    def transform(row):
        try:
            newer = Version(str(row.r.backend_version).split("-")[0]) >= since
        except InvalidVersion:  # a nightly build: newer than any release
            newer = True
        front = fe.shipped_frontend(row.r.engine)
        if row.r.engine != "vllm" or not newer or front is None:
            return row
        return Tweaked(row, frontend=dataclasses.replace(front, lookahead_steps=1))
    return transform


def prefill_layer_us(us: float) -> None:
    """Every step with a prompt chunk costs `us` more per layer."""
    price = estimator.RooflineModel._price

    def priced(self, step, dec, conc, q, s, n_steps, detail=False):
        out = price(self, step, dec, conc, q, s, n_steps, detail)
        prefills = np.bincount(step, weights=(~dec).astype(np.float64), minlength=n_steps) > 0
        out["total"] = out["total"] + us * 1e-3 * self.model.num_layers * prefills
        return out
    estimator.RooflineModel._price = priced


def per_step_requests(row):
    """The engine's per-request time per step: request_layer_us scaled to the row's depth."""
    step_ms, request_layer_us, *rest = fe.shipped_params(row.r.engine)
    scaled = request_layer_us * FIT_DEPTH / row.lm.model.num_layers
    return Tweaked(row, params=(step_ms, scaled, *rest))


def apply(variant: str) -> tuple:
    """Installs `variant`; returns the scale of the expert bandwidth efficiencies and what it does to a row."""
    name, *args = variant.split(":")
    if name == "shipped" and not args:
        return 1.0, None
    if name == "moe-floor" and len(args) == 2:
        estimator.KERNELS["moe"] = float(args[0])
        return float(args[1]), None
    if name == "overlap-lag" and not args:
        metrics._record_times = lagged(metrics._record_times)
        return 1.0, None
    if name == "aiperf-pool" and not args:
        return 1.0, with_prompt_pool
    if name == "serial-client" and len(args) == 1:
        arrivals.Arrivals.create = serial_client(float(args[0]))
        return 1.0, None
    if name == "frontend" and len(args) == 1:
        return 1.0, with_frontend(args[0])
    if name == "async-since" and len(args) == 1:
        return 1.0, async_since(args[0])
    if name == "prefill-layer-us" and len(args) == 1:
        prefill_layer_us(float(args[0]))
        return 1.0, None
    if name in ("moe-prefill-layer-us", "moe-layer-us") and len(args) == 1:
        return 1.0, with_row(**{name.replace("-", "_"): float(args[0])})
    if name == "async-scheduling" and args in (["on"], ["off"]):
        return 1.0, with_row(async_scheduling=args[0] == "on")
    if name == "per-step-requests" and not args:
        return 1.0, per_step_requests
    fail(f"VARIANT {variant!r}: expected one of {VARIANTS}")


VARIANTS = ("shipped, moe-floor:K:S, overlap-lag, aiperf-pool, serial-client:MS, async-since:VERSION, "
            "frontend:KEY=VALUE[,KEY=VALUE], "
            "prefill-layer-us:US, moe-prefill-layer-us:US, moe-layer-us:US, async-scheduling:on|off, "
            "per-step-requests")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variant", metavar="VARIANT", help=VARIANTS)
    ap.add_argument("--engine", choices=fe.ENGINES, help="only this engine's runs")
    ap.add_argument("--family", choices=("dense", "MoE", "MLA"), nargs="+",
                    help="only these model families' runs")
    ap.add_argument("--every", type=int, default=1, help="every N-th run only (a quicker look); default 1")
    ap.add_argument("--output", type=Path, help="also write each run's errors to this CSV")
    a = ap.parse_args()
    if a.every < 1:
        fail(f"--every {a.every}: expected an integer >= 1")
    scale, transform = apply(a.variant)
    d = pd.concat([fe.configs(p) for p in (fe.REFERENCE, fe.MOE_REFERENCE)], ignore_index=True)
    if a.engine:
        d = d[d.engine == a.engine]
    if a.family:
        d = d[d.family.isin(a.family)]
    rows = [row for row in map(fe.Row, d.iloc[::a.every].itertuples())
            if not row.apart]  # queued for KV blocks or beyond peak: reported apart by fidelity_e2e
    if not rows:
        fail("no measured run matches --engine and --family")
    if transform is not None:
        rows = [transform(row) for row in rows]

    def params_of(engine: str) -> tuple:
        step_ms, request_layer_us, compute, bandwidth, fp4, layer_us = fe.shipped_params(engine)
        return step_ms, request_layer_us, compute, min(1.0, bandwidth * scale), min(1.0, fp4 * scale), layer_us

    err = fe.errors(rows, None, params_of, frontend_of=fe.shipped_frontend)
    x = pd.DataFrame({"split": [row.r.split for row in rows], "engine": [row.r.engine for row in rows],
                      "model": [row.r.model_path for row in rows], "gpu": [row.r.system for row in rows],
                      "ttft": err["ttft_err"], "tpot": err["tpot_err"]})
    if a.output:
        x.to_csv(a.output, index=False)
    print(f"{a.variant}: {len(x)} runs, median |error| and signed median (%)")
    for keys in (["split", "engine", "model", "gpu"], ["split", "engine"]):
        g = x.groupby(keys)
        t = pd.concat({"|ttft|": g["ttft"].apply(lambda s: s.abs().median()), "ttft": g["ttft"].median(),
                       "|tpot|": g["tpot"].apply(lambda s: s.abs().median()), "tpot": g["tpot"].median(),
                       "runs": g.size()}, axis=1)
        print((t * [100, 100, 100, 100, 1]).round(1).to_string(), end="\n\n")


if __name__ == "__main__":
    main()
