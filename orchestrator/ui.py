"""`servesweep ui`: a local web page to build commands, run estimates and searches, and explore
results. Flask serves one page and a small JSON API; the form is generated from the field table
(`orchestrator.fields`), so it cannot drift from the CLI, and its messages are the CLI's.
"""

from __future__ import annotations

import math
import shlex
from functools import lru_cache
from pathlib import Path

from orchestrator.fields import FIELD_BY_NAME, InputError, fields_for

PAGE = Path(__file__).with_name("ui_page.html")
#: the commands the builder writes; their fields are the form
COMMANDS = ("optimize", "estimate")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def form_fields() -> list[dict]:
    """Every field of optimize or estimate, in table order, as the page renders it."""
    names = {f.name for c in COMMANDS for f in fields_for(c)}
    out = []
    for f in (FIELD_BY_NAME[n] for n in FIELD_BY_NAME if n in names):
        out.append({"name": f.name, "flag": f.flag, "key": f.key, "help": f.help, "unit": f.unit,
                    "group": f.group, "choices": list(f.choices), "many": f.many, "required": f.required,
                    "default": "" if f.required else f.default_text(),
                    "commands": [c for c in COMMANDS if f in fields_for(c)]})
    return out


def parse_values(texts: dict, command: str) -> tuple[dict, dict]:
    """Field values from the form's texts (empty: the default), and one-line errors by field name,
    worded as the CLI words them."""
    values, errors = {}, {}
    for f in fields_for(command):
        text = str(texts.get(f.name, "") or "").strip()
        if not text:
            continue
        try:
            if f.many:
                values[f.name] = tuple(f.check((f.parse(t),))[0] for t in text.split())
            else:
                values[f.name] = f.check(f.parse(text))
        except InputError as err:
            errors[f.name] = err.render("flag")
    return values, errors


def command_line(texts: dict, command: str) -> str:
    """The `servesweep` command the form stands for (fields left empty are omitted)."""
    words = ["servesweep", command]
    for f in fields_for(command):
        text = str(texts.get(f.name, "") or "").strip()
        if not text:
            continue
        if f.flag == "MODEL":
            words.insert(2, text)
        else:
            words += [f.flag, *text.split()] if f.many else [f.flag, text]
    return shlex.join(words)


def sweep_toml(texts: dict) -> str:
    """The sweep spec the form stands for: every filled field as a one-value grid key."""
    lines = ["[grid]"]
    for f in fields_for("sweep"):
        text = str(texts.get(f.name, "") or "").strip()
        if not text:
            continue
        items = text.split() if f.many else [text]
        cells = [t if _number(t) else '"' + t.replace('"', '\\"') + '"' for t in items]
        lines.append(f"{f.key} = [{', '.join(cells)}]")
    return "\n".join(lines) + "\n"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _clean(rows: list[dict]) -> list[dict]:
    """JSON-safe rows: NaN and infinities become null."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


def run_estimate(texts: dict) -> dict:
    from orchestrator.estimate import breakdown, configure, estimate

    values, errors = parse_values(texts, "estimate")
    if errors:
        return {"errors": errors}
    try:
        s = configure(values)
    except InputError as err:
        return {"errors": {err.name: err.render("flag")}}
    row = estimate(s)
    table = breakdown(s, row)
    return {"row": _clean([row])[0], "breakdown": _clean(table.to_dict("records"))}


def run_optimize(texts: dict) -> dict:
    from orchestrator.modes import Aggregated
    from orchestrator.optimize import optimize
    from orchestrator.scenario import Scenario

    values, errors = parse_values(texts, "optimize")
    missing = [n for n in ("model", "device", "num_devices") if n not in values]
    for name in missing:
        errors[name] = f"{FIELD_BY_NAME[name].flag}: a value is required"
    if errors:
        return {"errors": errors}
    try:
        s = Scenario(**values)
        result = optimize(s, Aggregated())
    except InputError as err:
        return {"errors": {err.name: err.render("flag")}}
    return {"best": _clean(result.best), "points": _clean(result.points), "infeasible": _clean(result.infeasible),
            "limits": {"ttft": list(s.ttft_limits), "tpot": list(s.tpot_limits)}}


def explore(path: str, filters: dict) -> dict:
    """The best configuration per scenario of a results directory or URI, filtered by column values."""
    from orchestrator.dataset import Dataset

    try:
        files = tuple(sorted(Dataset(path).files("best")))
    except (OSError, ValueError) as err:
        return {"errors": {"results": f"{path}: {str(err).splitlines()[0]}"}}
    if not files:
        return {"errors": {"results": f"{path}: no finished scenario (a results directory of servesweep sweep)"}}
    table = _best_table(path, files)
    choices = {c: sorted(map(str, table[c].dropna().unique())) for c in ("model", "device", "input_length",
                                                                            "output_length", "tpot_limit_ms")
               if c in table.columns}
    for column, value in filters.items():
        if value and column in table.columns:
            table = table[table[column].astype(str) == str(value)]
    return {"rows": _clean(table.to_dict("records")), "choices": choices}


@lru_cache(maxsize=8)
def _best_table(path: str, files: tuple[str, ...]):
    """The best row per scenario, read once per set of finished scenarios (each filter change asks)."""
    from orchestrator.dataset import read_table
    from orchestrator.report import best_per_scenario

    return best_per_scenario(read_table(path, "best"))


def create_app(results: str | None = None):
    """The Flask app; `results` preselects a results directory or URI in the Explore tab."""
    import json

    from flask import Flask, Response, jsonify, request

    app = Flask(__name__)
    page = PAGE.read_text().replace("__FIELDS__", json.dumps(form_fields())).replace(
        "__RESULTS__", json.dumps(results or ""))

    @app.get("/")
    def index():
        return Response(page, mimetype="text/html")

    @app.get("/plotly.min.js")
    def plotly_js():
        import plotly

        path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        return Response(path.read_bytes(), mimetype="application/javascript",
                        headers={"Cache-Control": "max-age=86400"})

    @app.post("/api/command")
    def command():
        texts = request.get_json(force=True).get("values", {})
        errors = {}
        for c in COMMANDS:
            errors |= parse_values(texts, c)[1]
        return jsonify({"errors": errors, "optimize": command_line(texts, "optimize"),
                        "estimate": command_line(texts, "estimate"), "toml": sweep_toml(texts)})

    @app.post("/api/estimate")
    def estimate_api():
        return jsonify(run_estimate(request.get_json(force=True).get("values", {})))

    @app.post("/api/optimize")
    def optimize_api():
        return jsonify(run_optimize(request.get_json(force=True).get("values", {})))

    @app.post("/api/explore")
    def explore_api():
        body = request.get_json(force=True)
        return jsonify(explore(body.get("path", ""), body.get("filters", {})))

    @app.get("/api/explore.csv")
    def explore_csv():
        import pandas as pd

        args = request.args.to_dict()
        got = explore(args.pop("path", ""), args)
        csv = pd.DataFrame(got.get("rows", [])).to_csv(index=False)
        return Response(csv, mimetype="text/csv", headers={"Content-Disposition": "attachment; filename=best.csv"})

    @app.post("/api/compare")
    def compare_api():
        from orchestrator.report import compare

        body = request.get_json(force=True)
        try:
            return jsonify({"lines": compare(body.get("a", ""), body.get("b", ""))})
        except (OSError, ValueError) as err:
            return jsonify({"errors": {"compare": str(err).splitlines()[0]}})

    return app


def serve(host: str, port: int, results: str | None = None):
    """Run the page until interrupted (one process, threads for requests)."""
    from werkzeug.serving import make_server

    server = make_server(host, port, create_app(results), threaded=True)
    return server
