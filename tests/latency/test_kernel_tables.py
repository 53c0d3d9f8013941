"""The measured-kernel backend (latency.kernel_tables): a small table laid out as AIConfigurator ships
them for the mechanics, and, when servesweep[kernels] is installed, the real tables."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pandas as pd
import pytest

from latency import kernel_tables
from latency.backends import make_backend
from latency.keys import ForwardKey
from orchestrator.cli import main

MODEL, DEVICE = "Qwen/Qwen3-30B-A3B", "H200_SXM"  # hidden 2048, experts 768 x 128, top-8, 48 MoE layers
LAYERS = 48
#: (tokens, ms per layer) of the fixture's (moe_tp 1, ep 1) bf16 curve
POINTS = ((1, 0.1), (16, 0.4), (256, 1.6), (4096, 12.8))


def _rows(version_points, dtype="bfloat16", tp=1, ep=1, experts=128):
    return [{"moe_dtype": dtype, "num_tokens": t, "hidden_size": 2048, "inter_size": 768, "topk": 8,
             "num_experts": experts, "moe_tp_size": tp, "moe_ep_size": ep, "distribution": d,
             "latency": ms * (1.0 if d == kernel_tables.DISTRIBUTION else 9.0)}  # other skews must not be read
            for t, ms in version_points for d in (kernel_tables.DISTRIBUTION, "balanced")]


def write_table(root, rows, gpu="h200_sxm", engine="vllm", version="0.24.0"):
    path = root / gpu / "moe" / engine / version / kernel_tables.MOE_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


@pytest.fixture
def tables(tmp_path, monkeypatch):
    write_table(tmp_path, _rows(POINTS))
    monkeypatch.setenv(kernel_tables.TABLES_ENV, str(tmp_path))
    return tmp_path


def _moe_ms(lm, tokens: int) -> float:
    b = lm.breakdown([ForwardKey(True, tokens, 1, 1024)])
    return float(b.loc[b.op == "moe", "ms"].iloc[0])


def test_curve_interpolates_in_log_log_and_scales_beyond():
    curve = kernel_tables.ExpertCurve(np.array([16.0, 256.0]), np.array([0.4, 1.6]), "x")
    got = curve(np.array([16, 64, 256, 512, 1]))
    # 64 is halfway between 16 and 256 in log: the geometric mean; 512 is twice the last point
    assert got == pytest.approx([0.4, math.sqrt(0.4 * 1.6), 1.6, 3.2, 0.4])


def test_moe_layer_priced_from_the_table_by_hand(tables):
    lm = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm")
    # router (2048 x 128 bf16 weights) over 16 tokens, memory-bound, + one 4 us kernel, per layer
    router_bytes = 2048 * 128 * 2 + 16 * 2 * 2048 * 2
    router_ms = router_bytes / (4.8e12 * 0.8) * 1e3 + 0.004
    assert _moe_ms(lm, 16) == pytest.approx(LAYERS * (0.4 + router_ms), rel=1e-9)
    assert lm.breakdown([ForwardKey(True, 16, 1, 1024)]).set_index("op").loc["moe", "bound"] == "measured"
    assert "routed experts from the measured table h200_sxm/moe/vllm/0.24.0 bfloat16" in lm.notes[0]


def test_only_the_moe_op_changes_and_the_profile_s_moe_layer_time_is_in_the_curve(tables):
    """Every op but the experts' priced alike; the step's overhead less vLLM's 28 us a MoE layer (48 layers: 1.344
    ms), which the measured curve holds already (the expert path's launches)."""
    table = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm")
    roof = make_backend("roofline", MODEL, DEVICE, engine="vllm")
    keys = [ForwardKey(True, 64, 1, 2048), ForwardKey(False, 1, 2048, 2048)]
    a, b = table.breakdown(keys), roof.breakdown(keys)
    other = ~a.op.isin(["moe", "overhead"])
    assert np.allclose(a.loc[other, "ms"].to_numpy(), b.loc[~b.op.isin(["moe", "overhead"]), "ms"].to_numpy())
    assert not np.allclose(a.loc[a.op == "moe", "ms"].to_numpy(), b.loc[b.op == "moe", "ms"].to_numpy())
    overhead = b.loc[b.op == "overhead", "ms"].to_numpy() - a.loc[a.op == "overhead", "ms"].to_numpy()
    assert overhead == pytest.approx([28e-3 * LAYERS] * 2, rel=1e-9)


def test_attention_dp_routes_every_rank_s_tokens(tables):
    """Each of 2 attention ranks steps 8 tokens: the layer routes 16, the fixture's measured point."""
    write_table(tables, _rows(POINTS, tp=2, ep=1))
    lm = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm", attention_dp=2)
    assert lm.curve is not None and lm.parallel.moe_tp == 2
    router_ms = (2048 * 128 * 2 + 8 * 2 * 2048 * 2) / (4.8e12 * 0.8) * 1e3 + 0.004
    assert _moe_ms(lm, 8) == pytest.approx(LAYERS * (0.4 + router_ms), rel=1e-9)


def test_uncovered_layout_falls_back_to_the_roofline_and_says_so(tables):
    lm = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm", tp=2, ep=2)
    roof = make_backend("roofline", MODEL, DEVICE, engine="vllm", tp=2, ep=2)
    assert lm.curve is None
    assert "priced by the roofline" in lm.notes[0] and "moe_tp 1 ep 2" in lm.notes[0]
    assert _moe_ms(lm, 16) == pytest.approx(_moe_ms(roof, 16))
    assert lm.fingerprint != roof.fingerprint  # a cache never mixes the two


def test_another_dtype_or_gpu_is_not_read(tables):
    fp8 = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm", quantization="fp8")
    assert fp8.curve is None and "no h200_sxm/moe/vllm table has fp8 rows" in fp8.notes[0]
    h100 = make_backend(kernel_tables.NAME, MODEL, "H100_SXM", engine="vllm")
    assert h100.curve is None and "no MoE table for vllm on h100_sxm" in h100.notes[0]
    ascend = make_backend(kernel_tables.NAME, MODEL, "ATLAS_800_A2_376T_64G", engine="vllm")
    assert ascend.curve is None and "no kernel tables for ATLAS_800_A2_376T_64G" in ascend.notes[0]


def test_newest_version_that_measured_the_layer(tables):
    """A newer version without the layer is passed over; a newer one with it is taken; a release is
    newer than its release candidate (PEP 440)."""
    write_table(tables, _rows(POINTS, experts=64), version="0.30.0")
    assert "vllm/0.24.0" in make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm").curve.source
    write_table(tables, _rows([(t, 2 * ms) for t, ms in POINTS]), version="0.25.0")
    write_table(tables, _rows([(t, 3 * ms) for t, ms in POINTS]), version="0.25.0rc1")
    lm = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm")
    assert "vllm/0.25.0 " in lm.curve.source
    assert lm.curve(np.array([16.0]))[0] == pytest.approx(0.8)


def test_fingerprint_names_the_table_and_changes_with_it(tables):
    before = make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm").fingerprint
    assert "aiconfigurator-tables:h200_sxm/moe/vllm/0.24.0" in before
    write_table(tables, _rows([(t, 1.5 * ms) for t, ms in POINTS]))
    assert make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm").fingerprint != before


def test_dense_model_is_all_roofline(tables):
    lm = make_backend(kernel_tables.NAME, "Qwen/Qwen3-8B", DEVICE, engine="vllm")
    roof = make_backend("roofline", "Qwen/Qwen3-8B", DEVICE, engine="vllm")
    keys = [ForwardKey(True, 32, 1, 4096)]
    assert lm.latency_ms(keys) == pytest.approx(roof.latency_ms(keys))
    assert "dense model" in lm.notes[0]


def test_refusals_name_what_is_missing(tables, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="give --engine sglang|trtllm|vllm"):
        make_backend(kernel_tables.NAME, MODEL, DEVICE)
    monkeypatch.setenv(kernel_tables.TABLES_ENV, str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="is not a directory"):
        make_backend(kernel_tables.NAME, MODEL, DEVICE, engine="vllm")


def test_estimate_prints_where_the_experts_came_from(tables, capsys):
    args = ["estimate", MODEL, "--device", DEVICE, "--num-devices", "1", "--engine", "vllm", "--latency-backend",
            kernel_tables.NAME, "--concurrency", "8", "--input-length", "512", "--output-length", "64",
            "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "note: aiconfigurator-tables: routed experts from the measured table h200_sxm/moe/vllm/0.24.0" in out
    assert "measured" in out.split("per-op breakdown")[1]


def test_estimate_without_an_engine_is_one_line(tables, capsys):
    code = main(["estimate", MODEL, "--device", DEVICE, "--num-devices", "1", "--latency-backend", kernel_tables.NAME,
                 "--input-length", "512", "--output-length", "64", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--engine" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None, reason="servesweep[kernels] not installed")
def test_real_tables_minimax_on_h200(monkeypatch):
    """The published H200 vLLM table: MiniMax-M2.5's block-FP8 experts (3072 x 1536, 256, top-8) at tp 4,
    one token: the table's value, no faster than reading its 8 experts' quarter of the weights at the
    H200's 4.8 TB/s, times 62 layers, plus the router."""
    monkeypatch.delenv(kernel_tables.TABLES_ENV, raising=False)
    lm = make_backend(kernel_tables.NAME, "MiniMaxAI/MiniMax-M2.5", DEVICE, engine="vllm", tp=4, quantization="fp8")
    assert lm.curve is not None and "fp8_block" in lm.curve.source and "moe_tp4 ep1" in lm.curve.source
    root = kernel_tables.tables_root()
    t = pd.read_parquet(root / lm.curve.source.split()[0] / kernel_tables.MOE_TABLE)
    one = t[(t.hidden_size == 3072) & (t.inter_size == 1536) & (t.num_experts == 256) & (t.moe_tp_size == 4)
            & (t.moe_ep_size == 1) & (t.moe_dtype == "fp8_block") & (t.distribution == kernel_tables.DISTRIBUTION)
            & (t.num_tokens == 1)]["latency"].min()
    assert one >= 8 * 3 * 3072 * 1536 / 4 / 4.8e12 * 1e3  # 8 experts' FP8 bytes on one of 4 GPUs
    assert lm.curve(np.array([1.0]))[0] == pytest.approx(one)
    assert lm.moe_layers == 62 and _moe_ms(lm, 1) > 62 * one
