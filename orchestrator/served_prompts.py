"""Which measured campaigns' prompts a prefix cache likely served, by evidence: the silicon format does not record
the cache, and its rows are read with it off (`measured_runs.PREFIX_CACHING`). A run whose measured throughput needs
more of its GPUs' dense peak than any schedule of the work it states reaches (PEAK_SHARE, for its linear layers
alone) computed fewer prompt tokens than it sent. Its campaign's runs share its launch and client, so each says so
(`prefix_cache_evidence`); they are still read with the cache off: read with it on, the one such campaign here
(vLLM 0.12's Llama-3.1-8B FP8 on H200) comes out as far below the measured TTFT as it was above (54.6 % against
87.3 %), and the held-out rows' median |error| rises (21.4 % / 7.8 % -> 21.6 % / 8.0 %, `python
bench/fidelity_e2e.py`, session 39). `servesweep calibrate` tries the cache on for such runs."""

from __future__ import annotations

from latency import build_latency_model
from orchestrator.measured_runs import DEVICES, campaign_of, labelled_quantization, our_model, quantization

#: a run is beyond the compute bound when its measured token rate needs more than this share of the GPUs' dense
#: peak for its linear layers alone (2 FLOP a parameter a token; attention left out, so the true need is higher):
#: no schedule of the work it states does that. The reference files' dense runs need at most 0.50 but those of vLLM
#: 0.12's Llama-3.1-8B FP8 on H200: 0.74-0.79 for three, 0.94 at 2,000 x 100 and 64 clients
PEAK_SHARE = 0.8


def peak_share(cells: dict) -> float:
    """The share of its instance's dense peak a dense run's measured throughput needs for its linear layers alone
    (as the roofline holds them: `RooflineModel`'s projections, MLPs and LM head): batch / (TTFT + (osl - 1) x TPOT)
    requests a second, isl + osl tokens each; 0 for a MoE model (its tokens touch a share of its parameters), a row
    without measured means, or one we cannot read."""
    try:
        model = our_model(cells["model_path"])
        isl, osl, batch = (int(float(cells[c])) for c in ("isl", "osl", "batch_size"))
        ttft, tpot = float(cells["silicon_ttft_ms"]), float(cells["silicon_tpot_ms"])
        tp, pp = (int(float(cells.get(c) or 1)) for c in ("tp_size", "pp_size"))
        lm = build_latency_model(model, DEVICES[cells["system"]], tp=tp, pp=pp,
                                 quantization=quantization(labelled_quantization(cells), model))
    except (KeyError, ValueError, OSError):  # a bad cell: to_spec names it
        return 0.0
    seconds = (ttft + (osl - 1) * tpot) / 1e3
    if lm.moe_layers or ttft <= 0 or tpot <= 0 or seconds <= 0:
        return 0.0
    rank = (lm.qkv_params + lm.o_params) * lm.model.num_layers + lm.mlp_params * lm.dense_layers + lm.lm_head_params
    peak = lm.device.peak_flops(lm.quant.compute_dtype) * lm.devices_per_instance
    return 2 * rank * tp * (isl + osl) * batch / seconds / peak


def with_cache_evidence(rows: list[dict]) -> list[dict]:
    """`rows` with every run of a campaign (`campaign_of`) that holds a run beyond PEAK_SHARE saying so:
    `prefix_cache_evidence` names that run and how much of the peak it needs."""
    evidence = {}
    for cells in rows:
        share = peak_share(cells)
        if share > PEAK_SHARE and share > evidence.get(campaign_of(cells), ("", 0.0))[1]:
            evidence[campaign_of(cells)] = (cells.get("id", ""), share)
    out = []
    for cells in rows:
        found = evidence.get(campaign_of(cells))
        if found:
            cells = dict(cells, prefix_cache_evidence=f"{found[0]} needs {found[1]:.0%} of its GPUs' dense peak")
        out.append(cells)
    return out
