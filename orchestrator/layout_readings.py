"""How a silicon row's layout columns are read where they do not state a layout as given: three ways the runs of
AIConfigurator's collector (and launches written in an engine's own terms) say a layout, each read as the devices
that ran it, never refused (`measured_runs.to_spec` applies them, and READINGS says each)."""

from __future__ import annotations

import re

#: the layout a run id names: its concurrency, tp and expert-parallel size (`..._c64_tp4_ep4_...`, `_tp4_0_ep4_0_`)
ID_LAYOUT = re.compile(r"_c(\d+)_tp(\d+)(?:_0)?_ep(\d+)(?:_0)?_")


def implied_attention_dp(cells: dict, tp: int, group: int, batch: int) -> tuple[int, int]:
    """(attention-DP ranks, concurrency) of a run that leaves attention_dp_size empty while its MoE group
    (moe_tp x moe_ep) spans more devices than tp: vLLM's data-parallel attention under one MoE group
    (--data-parallel-size with --enable-expert-parallel), group / tp ranks; the concurrency the run id
    names (`_c<N>_`), else batch_size on each rank."""
    dp = group // tp
    return dp, int(named.group(1)) if (named := re.search(r"_c(\d+)_", cells.get("id", ""))) else batch * dp


def named_layout(cells: dict, tp: int, ep: int, dp: int, batch: int) -> tuple[int, int] | None:
    """(concurrency, experts' ranks) of a run whose columns restate its id's layout as attention-DP ranks:
    the id names C requests on tp T with the experts over E ranks (`_c<C>_tp<T>_ep<E>`), the columns say tp T,
    E attention-DP ranks, moe_ep T x E and C / E requests a rank. One export of AIConfigurator's collector
    writes its expert-parallel runs so; each measures what the same run id's layout measures in the other
    export (tp T, moe_ep E, C requests) within a few per cent (40 of 40 pairs of the measured MoE file), and only T
    devices explain its KV-bound loads: read as the id's (or its copy's id's, `run_copies`). None for any other run."""
    named = ID_LAYOUT.search(cells.get("layout_id") or cells.get("id", ""))
    if not named:
        return None
    c, t, e = (int(g) for g in named.groups())
    if e > 1 and (tp, dp, ep, batch * e) == (t, e, t * e, c):
        return c, e
    return None


def folded_tp(tp: int, dp: int, group: int) -> bool:
    """Whether a run's tp_size counts every device of its instance under attention DP, as SGLang's `--tp` with
    `--dp` and TensorRT-LLM's tensor_parallel_size with enable_attention_dp do (AIConfigurator's generator sets
    SGLang's tp to moe_tp x moe_ep): the MoE group is tp devices, tp x attention_dp are not, and the ranks divide
    tp. Read as tp / attention_dp a rank; the format's own rows have moe_tp x moe_ep = tp x attention_dp."""
    return dp > 1 and group == tp and tp % dp == 0


#: each reading by the spec key `measured_runs.to_spec` says it in (and the column `estimate --from-csv` writes):
#: the words `estimate --from-csv` says of the N runs read so (after "N runs"), and calibrate of one run (its spec's
#: values in the braces; `copy`: where its twin's id named the layout)
READINGS = {
    "attention_dp_read_as": (
        "leave attention_dp_size empty while their MoE group (moe_tp x moe_ep) spans more devices than tp: read "
        "as vLLM's data-parallel attention under one MoE group (attention DP = group / tp; the concurrency their id "
        "names)",
        "attention_dp_size empty under a MoE group wider than tp: read as {attention_dp_read_as} attention-DP ranks "
        "(vLLM's data-parallel attention)"),
    "moe_layout_read_as": (
        "of a MoE model give moe_tp_size and moe_ep_size 1 under more than one device: read as left empty, the "
        "engine's default (the experts split by moe TP over every device; column moe_layout_read_as)",
        "moe_tp_size and moe_ep_size 1 under several devices: read as left empty, the engine's default "
        "({moe_layout_read_as})"),
    "tp_read_as": (
        "give a tp_size that counts every device of their instance under attention DP (tp = moe_tp x moe_ep, as "
        "SGLang's --tp with --dp and TensorRT-LLM's tensor_parallel_size with attention DP): read as tp / attention_dp "
        "a rank (column tp_read_as)",
        "tp_size counts the instance's devices under attention DP: read as {tp_read_as}"),
    "layout_read_as": (
        "restate their id's layout (tp T, experts over E, C requests) as E attention-DP ranks of C / E requests: read "
        "as the id's, as the same runs in the other export of the collector measure alike (a run whose id names no "
        "layout, as its copy's id, column layout_id)",
        "columns restating its id's layout as attention-DP ranks: read as the id's, {layout_read_as}{copy}"),
}
