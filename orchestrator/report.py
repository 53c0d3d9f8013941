"""`servesweep report`: tables, curves and the Pareto frontier of a results directory; and
`servesweep compare`: what changed between two result sets."""

from __future__ import annotations

import html
import math
from pathlib import Path

from orchestrator.dataset import read_table
from orchestrator.results import write_bytes, write_frame, write_png

#: plots per kind at most; a sweep of thousands of scenarios would otherwise write thousands of PNGs
DEFAULT_MAX_PLOTS = 12
BEST_COLUMNS = ["model", "device", "num_devices", "input_length", "output_length", "prefix_cache_hit_rate",
                "ttft_limit_ms", "tpot_limit_ms", "role", "tp", "pp", "dp", "max_batched_tokens", "concurrency",
                "output_throughput", "output_throughput_per_device", "ttft_ms", "tpot_ms", "prefill_num_chunks",
                "weights_gib", "kv_gib", "available_gib"]


def pareto_front(xs, ys) -> list[int]:
    """Indices of the points no other point beats on both x and y (both maximised), by x descending."""
    order = sorted(range(len(xs)), key=lambda i: (-xs[i], -ys[i]))
    front, best_y = [], -math.inf
    for i in order:
        if ys[i] > best_y:
            front.append(i)
            best_y = ys[i]
    return front


def best_per_scenario(best):
    """The feasible row with the most throughput for each scenario."""
    ok = best[best["feasible"]]
    if ok.empty:
        return ok
    idx = ok.groupby("scenario_id")["output_throughput"].idxmax()
    return ok.loc[idx].sort_values("output_throughput_per_device", ascending=False)


def _group_label(key, names) -> str:
    return ", ".join(f"{n}={v}" for n, v in zip(names, key, strict=True))


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:80]


def _save(fig, path: Path, title: str, plt) -> tuple[str, str]:
    """Title, lay out, write and close a figure; (file name, caption) for the index."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    write_png(fig, path)
    plt.close(fig)
    return path.name, title


def _plot_curves(points, best, out: Path, max_plots: int, plt) -> list[tuple[str, str]]:
    """TTFT and TPOT vs concurrency per layout, limits drawn, one figure per scenario."""
    files = []
    agg = points[points["role"] == "agg"]
    for sid, group in list(agg.groupby("scenario_id"))[:max_plots]:
        first = group.iloc[0]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for (tp, b), g in group.groupby(["tp", "max_batched_tokens"]):
            g = g.sort_values("concurrency")
            axes[0].plot(g["concurrency"], g["ttft_ms"], marker=".", label=f"tp{tp} B={b}")
            axes[1].plot(g["concurrency"], g["tpot_ms"], marker=".", label=f"tp{tp} B={b}")
        for ax, col, name in ((axes[0], "ttft_limit_ms", "TTFT"), (axes[1], "tpot_limit_ms", "TPOT")):
            if first[col] == first[col] and first[col] is not None:  # not NaN
                ax.axhline(first[col], color="red", linestyle="--", label=f"{name} limit")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency per instance")
            ax.set_ylabel(f"{name} ms")
            ax.legend(fontsize=7)
        title = (f"{first['model']} on {first['num_devices']} x {first['device']}, "
                 f"in {first['input_length']} / out {first['output_length']}")
        files.append(_save(fig, out / f"curves_{sid}.png", title, plt))
    return files


def _plot_pareto(points, splits, out: Path, max_plots: int, plt) -> list[tuple[str, str]]:
    """Output tokens/s per device vs tokens/s per user; agg points and PD splits, frontier marked."""
    files = []
    pts = points[(points["role"] == "agg") & points["fits_memory"] & (points["tpot_ms"] > 0)]
    groups = {k for k in pts.groupby(["model", "device"]).groups} | (
        set(splits.groupby(["model", "device"]).groups) if len(splits) else set())
    for model, device in sorted(groups)[:max_plots]:
        fig, ax = plt.subplots(figsize=(6, 4.2))
        g = pts[(pts["model"] == model) & (pts["device"] == device)]
        series = [("agg", 1000 / g["tpot_ms"], g["output_throughput_per_device"])]
        if len(splits):
            sp = splits[(splits["model"] == model) & (splits["device"] == device)]
            series.append(("disagg (PD split)", 1000 / sp["tpot_ms"], sp["output_throughput_per_device"]))
        for label, x, y in series:
            if len(x):
                ax.scatter(x, y, s=8, alpha=0.4, label=label)
        xs = [float(v) for _, x, _ in series for v in x]
        ys = [float(v) for _, _, y in series for v in y]
        if xs:
            front = sorted(pareto_front(xs, ys), key=lambda i: xs[i])
            ax.plot([xs[i] for i in front], [ys[i] for i in front], color="black", marker="o", ms=3,
                    label="Pareto frontier")
        ax.set_xlabel("tokens/s per user (1000 / TPOT)")
        ax.set_ylabel("output tokens/s per device")
        ax.legend(fontsize=7)
        files.append(_save(fig, out / f"pareto_{_slug(model)}_{_slug(device)}.png",
                           f"Pareto frontier: {model} on {device}", plt))
    return files


def _plot_budget(best_rows, out: Path, max_plots: int, plt) -> list[tuple[str, str]]:
    """The RFC's trade-off: TTFT, TPOT and throughput of the best point against max_batched_tokens."""
    files = []
    ok = best_rows[best_rows["feasible"] & (best_rows["role"] == "agg")]
    if ok.empty:
        return files
    keys = ["model", "device", "num_devices", "output_length"]
    for key, g in list(ok.groupby(keys))[:max_plots]:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for (inp, tpot_lim), h in g.groupby(["input_length", "tpot_limit_ms"], dropna=False):
            h = h.groupby("max_batched_tokens").agg({"ttft_ms": "first", "tpot_ms": "first",
                                                     "output_throughput_per_device": "max"}).reset_index()
            label = f"in {inp}, TPOT<={tpot_lim}"
            for ax, col in zip(axes, ("ttft_ms", "tpot_ms", "output_throughput_per_device"), strict=True):
                ax.plot(h["max_batched_tokens"], h[col], marker="o", label=label)
        for ax, name in zip(axes, ("TTFT ms", "TPOT ms", "tok/s per device"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("max_batched_tokens")
            ax.set_ylabel(name)
        axes[2].legend(fontsize=7)
        title = "effect of max_batched_tokens: " + _group_label(key, keys)
        files.append(_save(fig, out / f"budget_{_slug(_group_label(key, keys))}.png", title, plt))
    return files


def write_report(results: str | Path, out: str | Path, max_plots: int = DEFAULT_MAX_PLOTS) -> list[Path]:
    """Write best.md, best.csv, the PNG plots and index.html; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    best = read_table(results, "best")
    points = read_table(results, "points")
    splits = read_table(results, "splits")
    if best.empty:
        raise ValueError(f"{results} holds no finished scenario (no best/ files)")
    out.mkdir(parents=True, exist_ok=True)
    table = best_per_scenario(best)
    cols = [c for c in BEST_COLUMNS if c in table.columns]
    write_frame(table[cols], out / "best.csv")
    write_bytes(_markdown(table[cols]).encode(), out / "best.md")
    figures = {
        "TTFT and TPOT vs concurrency": _plot_curves(points, best, out, max_plots, plt),
        "Throughput per device vs tokens/s per user": _plot_pareto(points, splits, out, max_plots, plt),
        "Effect of max_batched_tokens": _plot_budget(best, out, max_plots, plt),
    }
    infeasible = best[~best["feasible"]]
    write_bytes(_html(results, table[cols], figures, infeasible).encode(), out / "index.html")
    return [out / n for n in ("best.csv", "best.md", "index.html")] + [out / f for fs in figures.values()
                                                                         for f, _ in fs]


def _markdown(df) -> str:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _html(results, table, figures, infeasible) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>servesweep report</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}</style></head><body>",
             f"<h1>servesweep report</h1><p>results: {html.escape(str(results))}</p>",
             "<h2>Best configuration per scenario</h2>", table.to_html(index=False, float_format=lambda v: f"{v:.4g}")]
    if len(infeasible):
        parts.append(f"<h2>Infeasible ({len(infeasible)})</h2><ul>")
        parts += [f"<li>{html.escape(str(m))}</li>" for m in infeasible["message"].head(50)]
        parts.append("</ul>")
    for heading, files in figures.items():
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts += [f"<figure><img src='{html.escape(f)}' alt='{html.escape(t)}'><figcaption>{html.escape(t)}"
                  "</figcaption></figure>" for f, t in files]
    parts.append("</body></html>")
    return "\n".join(parts)


def compare(a: str | Path, b: str | Path) -> list[str]:
    """Lines describing, per scenario and limit pair present in both, how the best configuration changed."""
    key = ["scenario_id", "ttft_limit_ms", "tpot_limit_ms"]
    fa, fb = (best_per_scenario(read_table(p, "best")) for p in (a, b))
    if fa.empty or fb.empty:
        raise ValueError("both result sets need finished scenarios with a feasible configuration")
    merged = fa.merge(fb, on=key, suffixes=("_a", "_b"))
    lines = [f"{len(merged)} scenarios in both ({len(fa)} in A, {len(fb)} in B)"]
    for r in merged.itertuples(index=False):
        r = r._asdict()
        config = {c: (r[f"{c}_a"], r[f"{c}_b"]) for c in ("role", "tp", "max_batched_tokens", "concurrency")}
        changed = {c: v for c, v in config.items() if v[0] != v[1]}
        ta, tb = r["output_throughput_a"], r["output_throughput_b"]
        delta = 100 * (tb / ta - 1) if ta else math.inf
        if changed or abs(delta) > 0.05:
            what = ", ".join(f"{c} {x} -> {y}" for c, (x, y) in changed.items()) or "same configuration"
            lines.append(f"{r['scenario_id']} ({r['model_a']}, {r['device_a']}, in {r['input_length_a']}): {what}; "
                         f"output tok/s {ta:.1f} -> {tb:.1f} ({delta:+.1f} %)")
    if len(lines) == 1:
        lines.append("no best configuration changed")
    return lines
