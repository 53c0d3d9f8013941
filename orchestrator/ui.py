"""`servesweep ui`: a local web page to build commands, run estimates and searches, and explore
results. Flask serves one page and a small JSON API; the form is generated from the field table
(`orchestrator.fields`), so it cannot drift from the CLI, and its messages are the CLI's.

The page accepts only its own callers, as Jupyter does (a browser can reach loopback, and a page
the user visits could otherwise start searches here or, by DNS rebinding, read results through it):
the Host header must name the address served on; every API call needs the random token printed at
start (in the URL, sent back as a header), a same-origin Origin (or none) and a JSON body; Explore
and Compare open only the --results location and what lies under it.

Its handlers import what they run when first called (start-up time of the page's server); the import
graph test counts those imports too, so none hides a cycle.
"""

from __future__ import annotations

import hmac
import math
import secrets
import shlex
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.fields import FIELD_BY_NAME, InputError, fields_for
from orchestrator.ui_jobs import SweepJobs

PAGE = Path(__file__).with_name("ui_page.html")
#: the commands the builder writes; their fields are the form
COMMANDS = ("optimize", "estimate")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: the header the page sends its token in
TOKEN_HEADER = "X-Servesweep-Token"
#: the page asks the steady question unless told otherwise: a closed loop with vLLM's profile (the CLI keeps
#: the RFC's defaults, a burst with kernels only); the commands it writes name them
PAGE_DEFAULTS = {"arrival": "closed", "engine": "vllm"}
#: the fields a newcomer fills, first and in this order; the rest sit under "advanced"
ESSENTIALS = ("model", "device", "num_devices", "input_length", "output_length", "ttft_limits", "tpot_limits",
              "engine", "arrival", "concurrency")


class Guard:
    """Who may call the page: a Host it serves on, a same-origin Origin, the token, and for Explore a
    location under the results root. `refusal(...)` names what is wrong (None: allowed)."""

    def __init__(self, host: str, results: str | None, token: str | None = None):
        self.hosts = {h.strip("[]").lower() for h in (*LOOPBACK, host)}
        self.results = results
        self.token = token or secrets.token_urlsafe(32)

    def host_refusal(self, host_header: str | None) -> str | None:
        name = urlsplit(f"//{host_header or ''}").hostname or ""
        return None if name.lower() in self.hosts else f"Host {host_header!r} is not an address this page serves on"

    def api_refusal(self, headers, args, is_json: bool, method: str) -> str | None:
        """An API call: same-origin (or no Origin), the token (a header; a download link's query), JSON."""
        origin = headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc.lower() != (headers.get("Host") or "").lower():
            return f"Origin {origin!r} is not this page's"
        if not self.token_ok(headers.get(TOKEN_HEADER) or (args.get("token") if method == "GET" else "")):
            return "a missing or wrong token (open the URL servesweep ui printed)"
        if method == "POST" and not is_json:
            return "a JSON body (Content-Type: application/json)"
        return None

    def token_ok(self, given: str | None) -> bool:
        return hmac.compare_digest((given or "").encode(), self.token.encode())

    def location_refusal(self, path: str) -> str | None:
        """Explore and Compare read only the --results root and what lies under it."""
        if not self.results:
            return "no results location: start servesweep ui --results DIR (or URI) to explore it"
        if not _under(str(path), self.results):
            return f"{path!r} is not under the results location {self.results!r} given to servesweep ui"
        return None


def _under(path: str, root: str) -> bool:
    if "://" in root or "://" in path:
        root = root.rstrip("/")
        return path.rstrip("/") == root or path.startswith(root + "/")
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def shipped() -> dict:
    """The pickers' choices: shipped models, devices and engines (a path to one's own config.json, device
    TOML or calibrated engine profile is typed in the same box)."""
    from latency import shipped_devices, shipped_engines, shipped_models

    return {"model": shipped_models(), "device": shipped_devices(), "engine": shipped_engines()}


def form_fields() -> list[dict]:
    """Every field of optimize or estimate as the page renders it: the ESSENTIALS first, then the rest in
    table order (`essential` false: under "advanced"); a PAGE_DEFAULTS field names both defaults."""
    names = {f.name for c in COMMANDS for f in fields_for(c)}
    order = [n for n in ESSENTIALS if n in names] + [n for n in FIELD_BY_NAME if n in names and n not in ESSENTIALS]
    out = []
    for f in (FIELD_BY_NAME[n] for n in order):
        default = "" if f.required else f.default_text()
        if f.name in PAGE_DEFAULTS:
            default = f"{PAGE_DEFAULTS[f.name]}: this page's; the CLI's {default}"
        out.append({"name": f.name, "flag": f.flag, "key": f.key, "help": f.help, "unit": f.unit,
                    "group": f.group, "choices": list(f.choices), "many": f.many, "required": f.required,
                    "open": bool(f.path_suffix), "path_suffix": f.path_suffix, "default": default,
                    "essential": f.name in ESSENTIALS, "commands": [c for c in COMMANDS if f in fields_for(c)]})
    return out


def with_page_defaults(texts: dict) -> dict:
    """The form's texts with the page's defaults where a field is left empty."""
    return PAGE_DEFAULTS | {k: v for k, v in texts.items() if str(v or "").strip()}


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


def run_optimize(texts: dict, pd: dict | None = None) -> dict:
    """The aggregated search of the form's scenario; with `pd` ({"prefill": P, "decode": D} devices per
    instance), the PD-ratio search instead (`optimize --enable-optimize-prefill-decode-ratio`)."""
    from orchestrator.modes import Aggregated, make_mode
    from orchestrator.optimize import optimize
    from orchestrator.scenario import Scenario

    values, errors = parse_values(texts, "optimize")
    missing = [n for n in ("model", "device", "num_devices") if n not in values]
    for name in missing:
        errors[name] = f"{FIELD_BY_NAME[name].flag}: a value is required"
    sides = {}
    for side, flag in (("prefill", "--prefill-devices-per-instance"), ("decode", "--decode-devices-per-instance")):
        if pd is not None:
            text = str(pd.get(side, "")).strip()
            if not text.isdigit() or int(text) < 1:
                errors[f"pd-{side}"] = f"{flag}: {text or None!r} is not allowed; expected an integer >= 1"
            else:
                sides[side] = int(text)
    if errors:
        return {"errors": errors}
    try:
        s = Scenario(**values)
        mode = Aggregated() if pd is None else make_mode("pd", prefill_devices=sides["prefill"],
                                                         decode_devices=sides["decode"])
        result = optimize(s, mode)
    except InputError as err:
        return {"errors": {err.name: err.render("flag")}}
    return {"best": _clean(result.best), "points": _clean(result.points), "infeasible": _clean(result.infeasible),
            "splits": _clean(result.splits), "limits": {"ttft": list(s.ttft_limits), "tpot": list(s.tpot_limits)}}


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


def list_runs(root: str) -> dict:
    """The sweep runs under a results root (the root itself when it is one, and each folder below it),
    newest first: their path, finished scenarios and when they last wrote, so Explore opens one by a click."""
    import pyarrow.fs as pafs

    from orchestrator.dataset import Dataset

    try:
        top = Dataset(root)
        below = top.fs.get_file_info(pafs.FileSelector(top.base, recursive=False, allow_not_found=True))
    except (OSError, ValueError) as err:
        return {"errors": {"results": f"{root}: {str(err).splitlines()[0]}"}}
    folders = [("", top.base)] + [(f"/{i.base_name}", i.path) for i in below
                                  if i.type == pafs.FileType.Directory and not i.base_name.startswith(".")]
    runs = []
    for suffix, base in folders:  # one listing a run, on the root's filesystem, with the files' times
        finished = [i for i in top.fs.get_file_info(pafs.FileSelector(f"{base}/best", recursive=True,
                                                                       allow_not_found=True))
                    if i.type == pafs.FileType.File and i.path.endswith(".parquet")]
        if finished:
            runs.append({"path": root.rstrip("/") + suffix if suffix else root, "scenarios": len(finished),
                         "modified": max(i.mtime_ns or 0 for i in finished) / 1e9})
    return {"runs": sorted(runs, key=lambda r: -r["modified"])}


@lru_cache(maxsize=8)
def _best_table(path: str, files: tuple[str, ...]):
    """The best row per scenario, read once per set of finished scenarios (each filter change asks)."""
    from orchestrator.dataset import read_table
    from orchestrator.report import best_per_scenario

    return best_per_scenario(read_table(path, "best"))


def create_app(results: str | None = None, guard: Guard | None = None):
    """The Flask app; `results` is the results directory or URI the Explore tab may open (and what
    lies under it); `guard` says who may call (default: loopback, a new random token)."""
    import json

    from flask import Flask, Response, abort, jsonify, request

    app = Flask(__name__)
    guard = guard or Guard("127.0.0.1", results)
    page = PAGE.read_text().replace("__FIELDS__", json.dumps(form_fields())).replace(
        "__RESULTS__", json.dumps(results or "")).replace("__SHIPPED__", json.dumps(shipped()))

    @app.before_request
    def check_caller():
        refusal = guard.host_refusal(request.headers.get("Host"))
        if refusal is None and request.path.startswith("/api/"):
            refusal = guard.api_refusal(request.headers, request.args, request.is_json, request.method)
        if refusal is None and request.path == "/" and not guard.token_ok(request.args.get("token")):
            refusal = "a missing or wrong token (open the URL servesweep ui printed)"
        if refusal is not None:
            abort(Response(f"refused: {refusal}\n", status=403, mimetype="text/plain"))

    def location(path: str):
        refusal = guard.location_refusal(path)
        if refusal is not None:
            abort(Response(f"refused: {refusal}\n", status=403, mimetype="text/plain"))
        return path

    @app.get("/")
    def index():
        return Response(page, mimetype="text/html")

    @app.get("/favicon.ico")
    def favicon():
        return Response(status=204)

    @app.get("/plotly.min.js")
    def plotly_js():
        import plotly

        path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        return Response(path.read_bytes(), mimetype="application/javascript",
                        headers={"Cache-Control": "max-age=86400"})

    @app.post("/api/command")
    def command():
        texts = with_page_defaults(request.get_json().get("values", {}))
        errors = {}
        for c in COMMANDS:
            errors |= parse_values(texts, c)[1]
        return jsonify({"errors": errors, "optimize": command_line(texts, "optimize"),
                        "estimate": command_line(texts, "estimate"), "toml": sweep_toml(texts)})

    @app.post("/api/estimate")
    def estimate_api():
        return jsonify(run_estimate(with_page_defaults(request.get_json().get("values", {}))))

    @app.post("/api/optimize")
    def optimize_api():
        body = request.get_json()
        return jsonify(run_optimize(with_page_defaults(body.get("values", {})), body.get("pd")))

    sweeps = SweepJobs(results)

    @app.post("/api/sweep")
    def sweep_api():
        return jsonify(sweeps.start(sweep_toml(with_page_defaults(request.get_json().get("values", {})))))

    @app.post("/api/sweep/status")
    def sweep_status_api():
        return jsonify(sweeps.status(str(request.get_json().get("id", ""))))

    @app.post("/api/explore")
    def explore_api():
        body = request.get_json()
        return jsonify(explore(location(body.get("path", "")), body.get("filters", {})))

    @app.post("/api/runs")
    def runs_api():
        return jsonify(list_runs(location(request.get_json().get("path", ""))))

    @app.get("/api/explore.csv")
    def explore_csv():
        import pandas as pd

        args = request.args.to_dict()
        args.pop("token", None)
        got = explore(location(args.pop("path", "")), args)
        csv = pd.DataFrame(got.get("rows", [])).to_csv(index=False)
        return Response(csv, mimetype="text/csv", headers={"Content-Disposition": "attachment; filename=best.csv"})

    @app.post("/api/compare")
    def compare_api():
        from orchestrator.report import compare

        body = request.get_json()
        try:
            return jsonify({"lines": compare(location(body.get("a", "")), location(body.get("b", "")))})
        except (OSError, ValueError) as err:
            return jsonify({"errors": {"compare": str(err).splitlines()[0]}})

    return app


def serve(host: str, port: int, results: str | None = None, token: str | None = None):
    """The page's server (one process, threads for requests); `server.url` is the address to open,
    with its token."""
    from werkzeug.serving import make_server

    guard = Guard(host, results, token)
    server = make_server(host, port, create_app(results, guard), threaded=True)
    shown = f"[{host}]" if ":" in host else host
    server.url = f"http://{shown}:{server.server_port}/?token={guard.token}"
    return server
