"""End-to-end fidelity against measured serving runs (closed loop at fixed concurrency).

    python bench/fidelity_e2e.py [--reference CSV ...] [--fit]
                                 [--benchmark aiperf|vllm-bench|steady] [--launch as-read|aiconfigurator]

Every row of `measured_serving.csv` (vLLM, SGLang, TensorRT-LLM on H100/H200) and of
`measured_serving_moe.csv` (three MoE models on vLLM, H100/H200/B200) is simulated as a
burst (the RFC's window) and as the benchmark ran it (`--benchmark`, default aiperf: 2C warm-up
requests, then 20C measured, as AIConfigurator's bench_run.sh runs aiperf), with each engine's own
step policy (its profile's `scheduler`: token-budget for vLLM and TensorRT-LLM, prefill-first for
SGLang) at the engines' default budget, and compared with the measured mean TTFT and TPOT. The
last prediction adds the engine's front end (its profile's [frontend] times: the client's and API
server's time between steps, `simulator.frontend`), which makes the closed loop timed.

`--fit` also fits each engine's time per step of attention-DP ranks (`dp_step_ms`, a grid, on its
FIT rows with attention DP) and its front end on its FIT rows (a grid over return_ms and client_ms;
the step times as fitted first), and prints the [frontend] tables to ship.

`--fit` fits, on the FIT rows only, the NVLink all-reduce efficiency of H100/H200 (a grid) and per
engine its framework time (latency/data/engines/*.toml: step_ms per step + request_layer_us per request and
layer in the step; layer_us per layer of a step where the engine's dense FIT rows span depths), and reports
every row with them; without `--fit` the shipped files are used. HELD-OUT
rows are a different model and GPU than any fitted row of the same engine (Llama-3.1-8B on H200,
Qwen3-235B-A22B MoE). A closed loop's schedule depends only on counts, so each row is planned once
and re-priced for every candidate.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import (  # noqa: E402
    EngineProfile,
    RooflineModel,
    build_latency_model,
    kernel_tables,
    load_device,
    load_engine,
    load_model,
)
from orchestrator import measured_runs  # noqa: E402
from orchestrator.engine_defaults import default_capacity_scheduler, engine_default_budget  # noqa: E402
from orchestrator.evaluate import front_end  # noqa: E402
from orchestrator.fields import VLLM_MAX_NUM_SEQS  # noqa: E402
from orchestrator.run_copies import with_copied_layouts  # noqa: E402
from orchestrator.served_prompts import PEAK_SHARE, peak_share  # noqa: E402
from simulator import (  # noqa: E402
    Frontend,
    StepPricer,
    TokenBudget,
    Workload,
    make_scheduler,
    plan,
    price,
    replay,
    step_times,
)
from simulator.benchmarks import BENCHMARKS, protocol  # noqa: E402
from simulator.blocks import BLOCK_SIZE, held_kv_tokens  # noqa: E402

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "measured_serving.csv"
ENGINES = measured_runs.ENGINES
#: the NVLink all-reduce efficiency before calibration (what "kernels only" is priced with)
BEFORE_COMM = 0.65
#: how the measured runs were driven, as the data show it: (arrival, prompts per unit of concurrency)
BENCHMARK = "aiperf"
#: the front-end grid `--fit` searches per engine: (request_ms, return_ms, client_ms)
FRONTEND_GRID = ((0.0, 0.0, 0.0), (0.0, 0.0, 3.0), (0.0, 0.0, 10.0), (0.0, 0.0, 30.0), (0.0, 2.0, 3.0),
                 (0.0, 2.0, 10.0), (3.0, 0.0, 0.0), (6.0, 0.0, 0.0), (10.0, 0.0, 0.0), (6.0, 2.0, 10.0))
NVLINK4 = ("H100_SXM", "H200_SXM")
#: candidate NVLink all-reduce efficiencies (H100 and H200 share NVLink 4)
COMM_GRID = (0.65, 0.8, 0.9, 1.0)
#: an engine without MoE FIT rows (TensorRT-LLM) has its MoE prefill time fitted on this layout of
#: its MoE rows alone (Qwen3-235B-A22B at tp 4), split apart as MOE_PREFILL_SPLIT; its other layouts
#: (tp 8) stay held out
MOE_PREFILL_FIT_TP = 4
MOE_PREFILL_SPLIT = "fit MoE prefill"
#: the rows a profile is fitted on; every other row is held out
FIT_MODELS = {("Qwen/Qwen3-32B", "h100_sxm"), ("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm"),
              ("MiniMaxAI/MiniMax-M2.5", "h100_sxm"), ("MiniMaxAI/MiniMax-M2.5", "h200_sxm"),
              ("MiniMaxAI/MiniMax-M2.5", "b200_sxm")}
MOE_REFERENCE = REFERENCE.with_name("measured_serving_moe.csv")
#: how a measured run is read (model, device, engine, quantisation, KV cache, concurrency of all ranks):
#: `orchestrator.measured_runs`, as `servesweep estimate --from-csv` reads the same file. An engine
#: profile's `fp8_kv_cache`: its FP8 runs in the measured set keep an FP8 KV cache, as AIConfigurator
#: (whose silicon set this is) configures FP8 deployments (sdk/models/helpers.py: fp8, fp8_block and
#: nvfp4 checkpoints get an FP8 KV cache and FMHA) and as TensorRT-LLM does for ModelOpt FP8
#: checkpoints. The FIT rows show it: TensorRT-LLM's Qwen3-32B on one H100 queues from 275k tokens in
#: flight on, MiniMax-M2.5 on two B200 from ~600k, what an FP8 cache holds (a bf16 one holds half).
#: SGLang keeps its documented default (`--kv-cache-dtype auto`: the activations' bf16); none of its
#: FIT rows is FP8.


def family(model: str) -> str:
    spec = load_model(model)
    return "MLA" if spec.is_mla else "MoE" if spec.is_moe else "dense"


def configs(reference: Path) -> pd.DataFrame:
    """The measured runs of `reference`, each with how `servesweep estimate --from-csv` reads it
    (measured_runs.to_spec: model, device, engine, layout, quantisation, KV cache), its family and
    whether it is a FIT row; rows whose MoE layout is no layout (moe_tp x ep != tp x DP) left out."""
    d = pd.read_csv(reference)
    cells = with_copied_layouts(pd.read_csv(reference, dtype=str, keep_default_na=False).to_dict("records"))
    spec = pd.DataFrame([measured_runs.to_spec(c, f"{reference} line {i + 2}") for i, c in enumerate(cells)])
    for column in ("model", "device", "engine", "quantization", "kv_cache_dtype"):
        d[column] = spec[column]
    d["ep"], d["attention_dp"] = spec["ep"].astype(int), spec["attention_dp"].astype(int)
    # a rank's requests as `estimate --from-csv` reads the run (its id's, or its copy's id's, where its columns
    # restate the id's layout as attention-DP ranks, or name none: layout_readings.named_layout, run_copies,
    # implied_attention_dp)
    d["batch_size"] = spec["concurrency"].astype(int) // d["attention_dp"]
    d["family"] = d["model"].map(family)
    d = d[(d["family"] == "dense") | (d["tp_size"] * d["attention_dp"] == d["moe_tp_size"].fillna(1) * d["ep"])]
    pairs = zip(d["model_path"], d["system"], strict=True)
    d["split"] = ["fit" if pair in FIT_MODELS else "held-out" for pair in pairs]
    # an engine without MoE FIT rows has its MoE prefill time fitted on one layout of its MoE rows
    moe = d["family"] != "dense"
    no_moe_fit = ~d["engine"].isin(d.loc[moe & (d["split"] == "fit"), "engine"])
    d.loc[moe & no_moe_fit & (d["tp_size"] == MOE_PREFILL_FIT_TP), "split"] = MOE_PREFILL_SPLIT
    return d.reset_index(drop=True)


LAUNCHES = ("as-read", "aiconfigurator")


class Row:
    """One measured run, planned once as a burst and as the benchmark ran it, priced per candidate
    all-reduce efficiency (kernels only; the engine's overhead is added per step when replayed)."""

    def __init__(self, r, benchmark: str = BENCHMARK, backend: str = "roofline", launch: str = "as-read"):
        self.r = r
        engine = load_engine(r.engine)
        self.mla_decode = engine.mla_decode_attention  # measured from kernel tables, not fitted: a kernel price
        reserved = engine.reserved_gib(load_device(r.device).hbm_gib)  # what `servesweep --engine` keeps free
        self.lm = build_latency_model(r.model, r.device, tp=int(r.tp_size), pp=int(r.pp_size), ep=int(r.ep),
                                      attention_dp=int(r.attention_dp), quantization=r.quantization,
                                      reserved_memory_gb=reserved,
                                      kv_cache_dtype=r.kv_cache_dtype)
        self.curve = None
        if backend == kernel_tables.NAME and self.lm.moe_layers:
            self.curve, why_not = kernel_tables.expert_curve(self.lm.model, self.lm.device.name, r.engine,
                                                             self.lm.parallel, table_experts(self.lm))
            if self.curve is None:
                print(f"  {r.id}: {why_not}", file=sys.stderr)
        # the engines' default budget (vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TensorRT-LLM
        # max_num_tokens), as `servesweep` assumes it, and vLLM's max_num_seqs
        budget = engine_default_budget(self.lm.device)
        policy, max_seqs = engine.scheduler or "token-budget", VLLM_MAX_NUM_SEQS  # the engine's own step policy
        read = measured_runs.launch(r.engine, str(r.backend_version), int(r.isl), int(r.batch_size), r.device)
        if launch == "aiconfigurator":  # every run as AIConfigurator's generator launches its engine
            read |= measured_runs.generated_launch(r.engine, int(r.isl), int(r.batch_size), r.device)
        policy = read.get("scheduler", policy)  # as `estimate --from-csv` reads the run's launch
        budget, max_seqs = int(read.get("max_batched_tokens", budget)), int(read.get("max_num_seqs", max_seqs))
        self.devices = self.lm.devices_per_instance
        #: the engine's per-step time of attention-DP ranks (its profile's; `--fit` fits it)
        self.dp_step_ms = engine.dp_step_ms if int(r.attention_dp) > 1 else 0.0
        #: the engine's time per MoE layer of a step with prompt tokens (its profile's; `--fit` fits it)
        self.moe_prefill_layer_us = engine.moe_prefill_layer_us
        #: the engine's time per MoE layer of every step, and whether the run's version hid its time per
        #: step behind the GPU's (async scheduling), as `estimate --from-csv` reads the run
        self.moe_layer_us = kernel_tables.priced_with(engine, self.curve).moe_layer_us
        self.async_scheduling = engine.async_scheduling and read.get("async_scheduling") != "off"
        cells = measured_runs.as_format_reads([{k: str(v) for k, v in r._asdict().items()}])[0]
        self.beyond_peak = peak_share(cells) > PEAK_SHARE  # reported apart, never fitted
        scheduler = TokenBudget(max_num_seqs=max_seqs) if policy == "token-budget" else make_scheduler(policy)
        c = int(r.batch_size)
        # the requests a client measured, as `estimate --from-csv` reads them (the profile's count)
        per_client = front_end(r.engine)[1]
        prompts, warmup, measured = protocol(benchmark).load("closed", c, 0, "steady", per_client=per_client)
        self.plans, self.workloads, self.scheduler = {}, {}, scheduler
        for label, w in (("burst", Workload(int(r.isl), int(r.osl), budget, c)),
                         ("bench", Workload(int(r.isl), int(r.osl), budget, c, arrival="closed",
                                            num_prompts=prompts, measure=measured, warmup_requests=warmup))):
            self.workloads[label] = w
            self.plans[label] = _with_requests(plan(w, scheduler))
        self.base: dict = {}
        # the engine queues requests the KV cache cannot hold: such runs are planned with the engine's
        # admission (simulator.kvbound: vLLM's, or TensorRT-LLM's no-evict capacity scheduler), reported
        # apart and never fitted
        capacity = self.lm.memory_for(budget).kv_capacity_tokens
        admitted = dataclasses.replace(self.workloads["bench"], kv_admission=default_capacity_scheduler(r.engine))
        self.kv_bound = held_kv_tokens(admitted, self.plans["bench"][0].peak_kv_tokens, admitted.concurrency) > capacity
        if self.kv_bound and isinstance(scheduler, TokenBudget) and capacity // BLOCK_SIZE > 1:
            self.workloads["bench"] = w = dataclasses.replace(admitted, kv_blocks=int(capacity // BLOCK_SIZE))
            try:
                self.plans["bench"] = _with_requests(plan(w, scheduler))
            except RuntimeError:  # not one request fits: the plain plan stays
                pass

    @property
    def apart(self) -> bool:
        """Reported apart and never fitted: the engine queued it for KV blocks, or its measured rate is
        beyond the GPUs' compute bound."""
        return self.kv_bound or self.beyond_peak

    def _device(self, comm: float | None):
        """The device with the NVLink-4 all-reduce efficiency `comm` (H100, H200; None: the file's own)."""
        if comm is None or self.r.device not in NVLINK4:
            return self.lm.device
        return dataclasses.replace(self.lm.device, eff_communication=comm)

    def _model(self, comm: float | None, engine: EngineProfile) -> RooflineModel:
        """The row's latency model at all-reduce efficiency `comm`, with `engine`'s times, and the
        measured experts' curve when the kernel tables price them."""
        args = (self.lm.model, self._device(comm), self.lm.parallel, self.lm.quant, self.lm.reserved_memory_gib)
        if self.curve is not None:
            return kernel_tables.KernelTableModel(*args, engine=engine, curve=self.curve)
        return RooflineModel(*args, engine=engine)

    def kernel_prices(self, label: str, comm: float, moe: tuple = (1.0, 1.0, 0.0)) -> np.ndarray:
        key = (label, comm, moe)
        if key not in self.base:
            lm = self._model(comm, _moe_engine(moe, self.mla_decode))
            self.base[key] = price(lm, self.plans[label][0].price_keys, True)
        return self.base[key]

    def predict(self, label: str, comm: float, step_ms: float, request_layer_us: float, moe_compute: float = 1.0,
                moe_bandwidth: float = 1.0, moe_fp4_bandwidth: float = 0.0, layer_us: float = 0.0, *,
                frontend: Frontend | None = None,
                engine_time: bool = True) -> tuple[float, float]:
        """(TTFT, TPOT) with these engine times; `engine_time` False: kernels only (no DP step time)."""
        moe = (moe_compute, moe_bandwidth, moe_fp4_bandwidth)
        engine = dataclasses.replace(_moe_engine(moe, self.mla_decode), step_ms=step_ms,
                                     request_layer_us=request_layer_us, layer_us=layer_us,
                                     dp_step_ms=self.dp_step_ms if engine_time else 0.0,
                                     moe_prefill_layer_us=self.moe_prefill_layer_us if engine_time else 0.0,
                                     moe_layer_us=self.moe_layer_us if engine_time else 0.0,
                                     async_scheduling=self.async_scheduling and engine_time)
        if frontend is not None and frontend.active and label == "bench":
            return self.timed(comm, engine, frontend)
        p, requests, prompts = self.plans[label]
        # the engine's time as the latency model adds it (no token_us: the profiles fit none)
        overhead = engine.overhead_ms(requests, 0, self.lm.model.num_layers, self.lm.parallel.attention_dp,
                                      self.lm.moe_layers, prompts)
        shape_ms = engine.with_step(self.kernel_prices(label, comm, moe) + overhead)
        m = replay(p, shape_ms[p.step_shape], self.devices)
        return m.ttft_ms, m.tpot_ms


    def timed(self, comm: float, engine: EngineProfile, frontend: Frontend) -> tuple[float, float]:
        """The benchmark's closed loop behind `frontend`: planned with its prices (it depends on time)."""
        lm = self._model(comm, engine)
        pricer = StepPricer(lm, self.scheduler)
        p = plan(dataclasses.replace(self.workloads["bench"], frontend=frontend), self.scheduler, step_ms=pricer)
        m = replay(p, step_times(p, pricer.prices(p)), self.devices)
        return m.ttft_ms, m.tpot_ms


def table_experts(lm) -> str:
    """The routed experts' format to look up in the kernel tables: the checkpoint's own where it names
    one apart (gpt-oss's MXFP4, which the measured file calls nvfp4), else the row's."""
    own = lm.model.checkpoint_quantization.partition("+")[2]
    return own or kernel_tables.experts_quantization(lm.quant)


def _with_requests(p) -> tuple:
    """A plan, the requests in each of its shapes (the engine's per-request time prices them) and
    whether each computes prompt tokens (its MoE prefill time)."""
    return (p, np.array([sum(k.concurrency for k in s) for s in p.shapes], dtype=np.float64),
            np.array([any(not k.is_decode for k in s) for s in p.shapes], dtype=np.float64))


#: engine params (step_ms, request_layer_us, moe_compute, moe_bandwidth, moe_fp4_bandwidth, layer_us) of kernels alone
KERNELS_ONLY = (0.0, 0.0, 1.0, 1.0, 0.0, 0.0)
#: an engine's dense FIT rows determine a per-layer step time apart from the per-step one only when
#: their models' depths differ by this factor (TensorRT-LLM: Llama-3.1-8B's 32 layers, Qwen3-32B's 64)
DEPTH_SPAN = 1.5
#: starting points of the (step_ms, request_layer_us, layer_us) fit: its loss has local minima
LAYER_STARTS = ((1.0, 0.3, 0.0), (0.2, 0.8, 10.0), (0.0, 0.5, 20.0))


def _moe_engine(moe: tuple, mla_decode: float = 0.0) -> EngineProfile:
    """A profile of kernels only with these expert efficiencies (compute, bandwidth, FP4 bandwidth) and MLA
    decode attention factor (measured from kernel tables, not fitted: a kernel price, like the experts')."""
    return EngineProfile("fit", moe_compute=moe[0], moe_bandwidth=moe[1], moe_fp4_bandwidth=moe[2],
                         mla_decode_attention=mla_decode)


def shipped_params(engine: str) -> tuple:
    """The engine profile's times as `Row.predict` takes them (what `servesweep --engine` prices with)."""
    p = load_engine(engine)
    return p.step_ms, p.request_layer_us, p.moe_compute, p.moe_bandwidth, p.moe_fp4_bandwidth, p.layer_us


def shipped_frontend(engine: str) -> Frontend | None:
    """The engine profile's front end (None when it ships none), as `estimate` reads it."""
    return front_end(engine)[0]


def errors(rows, comm, params_of, label="bench", frontend_of=lambda e: None, engine_time=True) -> pd.DataFrame:
    out = []
    for row in rows:
        ttft, tpot = row.predict(label, comm, *params_of(row.r.engine), frontend=frontend_of(row.r.engine),
                                 engine_time=engine_time)
        out.append({"ttft_err": ttft / row.r.silicon_ttft_ms - 1, "tpot_err": tpot / row.r.silicon_tpot_ms - 1})
    return pd.DataFrame(out)


def fit_engine(rows, engine: str, comm: float):
    """(step_ms, request_layer_us[, layer_us]) minimising a robust loss of log(predicted / measured) TPOT
    over the dense FIT rows of one engine; returns (params, cost). layer_us only where those rows span
    depths (DEPTH_SPAN), else it is not told apart from step_ms and stays 0. TTFT is left out: its
    error is the closed loop's phase and the client's time (see the front end), which per-step times
    must not absorb."""
    from scipy.optimize import least_squares

    mine = [r for r in rows if r.r.engine == engine and r.r.split == "fit" and not r.apart]
    if not mine:
        return KERNELS_ONLY, 0.0

    def residuals(x):
        step, request, layer = (*x, 0.0)[:3]
        return [np.log(row.predict("bench", comm, step, request, 1.0, 1.0, 0.0, layer)[1] / row.r.silicon_tpot_ms)
                for row in mine]

    mine = [r for r in mine if r.r.family == "dense"] or mine  # MoE rows fit their own efficiencies (fit_moe)
    depths = [r.lm.model.num_layers for r in mine]
    if max(depths) >= DEPTH_SPAN * min(depths):
        sol = min((least_squares(residuals, x0=list(x0), bounds=([0, 0, 0], [50, 10, 200]), loss="soft_l1",
                                 f_scale=0.1) for x0 in LAYER_STARTS), key=lambda s: s.cost)
    else:
        sol = least_squares(residuals, x0=[1.0, 0.3], bounds=([0, 0], [50, 10]), loss="soft_l1", f_scale=0.1)
    step, request, layer = (*map(float, sol.x), 0.0)[:3]
    return (step, request, 1.0, 1.0, 0.0, layer), float(sol.cost)


def fit_moe(rows, engine: str, comm: float, params) -> tuple:
    """moe_bandwidth, and moe_fp4_bandwidth apart, minimising the robust loss of log TPOT ratios over
    the FIT rows of MoE models of one engine whose experts run weight-only or in FP8, and natively in
    FP4 (its step times as fitted on the dense rows; moe_compute stays 1: MoE TTFT is off by as much
    as dense TTFT, so the loop, not the expert GEMMs, explains it); the shipped ones where it has no
    such rows."""
    from scipy.optimize import least_squares

    mine = [r for r in rows if r.r.engine == engine and r.r.split == "fit" and not r.apart
            and r.r.family != "dense"]
    step, request, _, bandwidth, fp4, layer = params

    def solve(subset, moe_of):
        if not subset:
            return None

        def residuals(x):
            return [np.log(row.predict("bench", comm, step, request, *moe_of(x[0]), layer)[1] / row.r.silicon_tpot_ms)
                    for row in subset]

        return float(least_squares(residuals, x0=[1.0], bounds=([0.05], [1.5]), loss="soft_l1",
                                   f_scale=0.1).x[0])

    shipped = load_engine(engine)  # an engine without MoE FIT rows keeps what its profile ships (SGLang: vLLM's)
    bandwidth = (solve([r for r in mine if not r.lm.native_fp4_experts], lambda x: (1.0, x, 0.0))
                 or shipped.moe_bandwidth)
    fp4 = (solve([r for r in mine if r.lm.native_fp4_experts], lambda x: (1.0, bandwidth, x))
           or shipped.moe_fp4_bandwidth)
    return (step, request, 1.0, bandwidth, fp4, layer)


#: candidate per-step times of attention-DP ranks (ms) `--fit` tries per engine
DP_GRID = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)


def fit_dp(rows, engine: str, comm: float, params) -> float | None:
    """The per-step time of attention-DP ranks (DP_GRID) with the lowest median |log TPOT ratio| over
    one engine's FIT rows with attention DP (None when it has none); the rows keep it."""
    ranks = [r for r in rows if r.r.engine == engine and int(r.r.attention_dp) > 1]
    mine = [r for r in ranks if r.r.split == "fit" and not r.apart]
    if not mine:
        return None

    def error(dp: float) -> float:
        for row in ranks:
            row.dp_step_ms = dp
        err = float(np.median([abs(np.log(row.predict("bench", comm, *params)[1] / row.r.silicon_tpot_ms))
                               for row in mine]))
        print(f"  [{engine}] dp_step_ms {dp:g}: median |log TPOT ratio| {err:.3f}", file=sys.stderr)
        return err

    best = min(DP_GRID, key=error)
    for row in ranks:
        row.dp_step_ms = best
    return best


def fit(rows):
    """The all-reduce efficiency of the grid with the lowest total cost, and each engine's profile at it."""
    best = None
    for comm in COMM_GRID:
        fitted = {e: fit_engine(rows, e, comm) for e in ENGINES}
        cost = sum(c for _, c in fitted.values())
        print(f"  all-reduce efficiency {comm:.2f}: fit cost {cost:.2f}", file=sys.stderr)
        if best is None or cost < best[0]:
            best = (cost, comm, {e: p for e, (p, _) in fitted.items()})
    return best[1], best[2]


def fit_frontend(rows, engine: str, comm: float, params) -> tuple[Frontend | None, float]:
    """The front end of FRONTEND_GRID with the lowest median |log(predicted / measured)| TTFT over the
    FIT rows of one engine (TPOT hardly moves with it); returns (front end, that median)."""
    mine = [r for r in rows if r.r.engine == engine and r.r.split == "fit" and not r.apart]
    best = (None, math.inf)
    for request_ms, return_ms, client_ms in FRONTEND_GRID:
        fe = Frontend(request_ms=request_ms, return_ms=return_ms, client_ms=client_ms)
        err = float(np.median([abs(np.log(row.predict("bench", comm, *params, frontend=fe)[0] / row.r.silicon_ttft_ms))
                               for row in mine])) if mine else 0.0
        print(f"  [{engine}] request_ms {request_ms:g}, return_ms {return_ms:g}, client_ms {client_ms:g}: "
              f"median |log TTFT ratio| {err:.3f}", file=sys.stderr)
        if err < best[1]:
            best = (fe if fe.active else None, err)
    return best


#: candidate MoE prefill times per MoE layer (us) `--fit` tries per engine
MOE_PREFILL_GRID = (0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 800.0)


def moe_prefill_rows(rows, engine: str) -> list:
    """The rows one engine's MoE prefill time is fitted on: its MoE FIT rows, else its MoE rows at
    MOE_PREFILL_FIT_TP (KV-bound and beyond-peak ones aside)."""
    moe = [r for r in rows if r.r.engine == engine and r.r.family != "dense" and not r.apart]
    return [r for r in moe if r.r.split == "fit"] or [r for r in moe if r.r.split == MOE_PREFILL_SPLIT]


def fit_moe_prefill(rows, engine: str, comm: float, params, frontend: Frontend | None) -> float | None:
    """The MoE prefill time per MoE layer (MOE_PREFILL_GRID) with the lowest median |log TTFT ratio| over
    `moe_prefill_rows` (None when there are none); every row of the engine keeps it."""
    mine, every = moe_prefill_rows(rows, engine), [r for r in rows if r.r.engine == engine]
    if not mine:
        return None

    def error(us: float) -> float:
        for row in every:
            row.moe_prefill_layer_us = us
        err = float(np.median([abs(np.log(row.predict("bench", comm, *params, frontend=frontend)[0]
                                          / row.r.silicon_ttft_ms)) for row in mine]))
        print(f"  [{engine}] moe_prefill_layer_us {us:g}: median |log TTFT ratio| {err:.3f} over {len(mine)} rows",
              file=sys.stderr)
        return err

    best = min(MOE_PREFILL_GRID, key=error)
    for row in every:
        row.moe_prefill_layer_us = best
    return best


def held_out_ttft(rows, engine: str, comm: float, params, frontend: Frontend | None = None) -> float:
    """Median |TTFT error| of one engine's held-out rows (KV-bound and beyond-peak ones aside): a
    front end fitted on the FIT rows ships only if it does not raise it."""
    mine = [r for r in rows if r.r.engine == engine and r.r.split == "held-out" and not r.apart]
    errs = [abs(row.predict("bench", comm, *params, frontend=frontend)[0] / row.r.silicon_ttft_ms - 1)
            for row in mine]
    return float(np.median(errs)) if errs else 0.0


def table(rows, comm, params_of, frontend_of) -> pd.DataFrame:
    keys = pd.DataFrame([{"split": r.r.split + (" KV-bound" if r.kv_bound else "")
                          + (" beyond peak" if r.beyond_peak else ""), "model": r.r.model_path,
                          "GPU": r.r.system, "engine": r.r.engine, "family": r.r.family} for r in rows])
    parts = []
    before = None if comm is None else BEFORE_COMM  # None: each device file's own
    none = lambda e: None  # noqa: E731
    kernels = lambda e: KERNELS_ONLY  # noqa: E731
    for label, plan_label, c, params, fe, engine_time in (
            ("burst, kernels only", "burst", before, kernels, none, False),
            ("as run, kernels only", "bench", before, kernels, none, False),
            ("as run, calibrated", "bench", comm or before, params_of, none, True),
            ("as run, calibrated + front end", "bench", comm or before, params_of, frontend_of, True)):
        e = errors(rows, c, params, plan_label, fe, engine_time=engine_time).abs()
        parts.append(pd.concat([keys, e], axis=1).assign(model_=label))
    full = pd.concat(parts)
    g = full.groupby(["split", "model", "GPU", "engine", "model_"], sort=False)
    out = g.agg(rows=("ttft_err", "size"), ttft=("ttft_err", "median"), tpot=("tpot_err", "median")).reset_index()
    out = out.rename(columns={"model_": "prediction", "ttft": "TTFT |err|", "tpot": "TPOT |err|"})
    totals = []
    for by in (["split", "engine", "family", "model_"], ["split", "engine", "model_"], ["split", "model_"]):
        total = full.groupby(by, sort=False).agg(
            rows=("ttft_err", "size"), ttft=("ttft_err", "median"), tpot=("tpot_err", "median")).reset_index()
        total = total.rename(columns={"model_": "prediction", "ttft": "TTFT |err|", "tpot": "TPOT |err|"})
        label = ("ALL " + total.pop("family")) if "family" in total else "ALL"
        total.insert(1, "model", label)
        totals.append(total.assign(GPU="", **({} if "engine" in total else {"engine": ""})))
    return pd.concat([out, *totals], ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, nargs="+", default=[REFERENCE, MOE_REFERENCE],
                    help="measured runs (default: measured_serving.csv and measured_serving_moe.csv)")
    ap.add_argument("--fit", action="store_true", help="fit the engine profiles on the FIT rows and print them")
    ap.add_argument("--max-rows", type=int, default=0, help="use every k-th row only (quick look), 0 = all")
    ap.add_argument("--latency-backend", choices=("roofline", kernel_tables.NAME), default="roofline",
                    help="what prices the steps: the roofline, or MoE experts from AIConfigurator's measured "
                         "kernel tables (needs servesweep[kernels])")
    ap.add_argument("--launch", choices=LAUNCHES, default="as-read",
                    help="how the engines were launched: as `estimate --from-csv` reads each run (the engines' "
                         "defaults: vLLM's max_num_batched_tokens 8192, 16384 on >= 160 GiB, SGLang prefill-first; "
                         "SGLang from 0.5.6 as AIConfigurator's generator launches it, measured_runs.launch), or "
                         "every run as that generator launches it (budget = concurrency + prompt + 1500; SGLang "
                         "with --enable-mixed-chunk and --max-prefill-tokens prompt + 1500)")
    ap.add_argument("--benchmark", choices=BENCHMARKS, default=BENCHMARK,
                    help=f"the protocol the measured runs are simulated as (default {BENCHMARK})")
    a = ap.parse_args()
    d = pd.concat([configs(path) for path in a.reference], ignore_index=True)
    if a.max_rows:
        d = d.iloc[:: max(1, len(d) // a.max_rows)]
    started = time.perf_counter()
    rows = [Row(r, a.benchmark, a.latency_backend, a.launch) for r in d.itertuples()]
    print(f"{len(rows)} measured runs planned in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if a.fit:
        comm, fitted = fit(rows)
        print(f"H100_SXM / H200_SXM [efficiency] communication = {comm}")
        fitted = {e: fit_moe(rows, e, comm, p) for e, p in fitted.items()}
        for e, p in fitted.items():
            dp = fit_dp(rows, e, comm, p)
            if dp is not None:
                print(f"[{e}] dp_step_ms = {dp:g}  # FIT rows with attention DP, median |log TPOT ratio|")
        for e, (step, req, moe_c, moe_b, moe_fp4, layer) in fitted.items():
            print(f"[{e}] step_ms = {step:.3f}, layer_us = {layer:.2f}, request_layer_us = {req:.4f}; "
                  f"[{e}.moe] compute = {moe_c:.3f}, "
                  f"bandwidth = {moe_b:.3f}, fp4_bandwidth = {moe_fp4:.3f}")

        def params_of(e):
            return fitted[e]

        fronts = {e: fit_frontend(rows, e, comm, fitted[e]) for e in ENGINES}
        for e, (fe, err) in list(fronts.items()):
            times = "" if fe is None else (f"request_ms = {fe.request_ms:g}, return_ms = {fe.return_ms:g}, "
                                           f"client_ms = {fe.client_ms:g}")
            with_it, without = held_out_ttft(rows, e, comm, fitted[e], fe), held_out_ttft(rows, e, comm, fitted[e])
            ships = fe is not None and with_it <= without
            print(f"[{e}.frontend] {times or '(none)'}  # fit median |log TTFT ratio| {err:.3f}; held-out TTFT "
                  f"{with_it:.1%} with it, {without:.1%} without: {'ships' if ships else 'does not ship'}")
            if not ships:
                fronts[e] = (None, err)

        for e in ENGINES:
            us = fit_moe_prefill(rows, e, comm, fitted[e], fronts[e][0])
            if us is not None:
                print(f"[{e}] moe_prefill_layer_us = {us:g}  # median |log TTFT ratio| over its MoE FIT rows, or "
                      f"(none) its MoE rows at tp {MOE_PREFILL_FIT_TP}")

        def frontend_of(e):
            return fronts[e][0]
    else:
        comm = None

        params_of, frontend_of = shipped_params, shipped_frontend
    out = table(rows, comm, params_of, frontend_of)
    fmt = {"TTFT |err|": "{:.1%}".format, "TPOT |err|": "{:.1%}".format}
    print(out.to_string(index=False, formatters=fmt))


if __name__ == "__main__":
    main()
