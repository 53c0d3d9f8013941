"""`servesweep ui` in a real browser: Debian's headless Chromium driven by Playwright against the page
served on 127.0.0.1."""

import io
import shutil
import threading
from pathlib import Path

import pytest
import tomllib

from orchestrator.estimate import configure, estimate

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: flags for a closed network: no background connections, no sandbox (the tests run as root here)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                                "(.ci/run installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.spec import expand
    from orchestrator.sweep import run_sweep
    from orchestrator.ui import serve

    results = tmp_path_factory.mktemp("ui") / "results"
    spec = {"grid": {"model": "Qwen/Qwen3-8B", "device": ["H100_SXM", "H200_SXM"], "num_devices": 1,
                     "input_length": [1024, 2048], "output_length": 64, "max_batched_tokens": [4096],
                     "tpot_limit_ms": [30]}}
    run_sweep(expand(spec), results, backend="inline", progress=False)
    srv = serve("127.0.0.1", 0, results=str(results.parent))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.url, str(results)
    srv.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 and
            "-missing" not in r.url else None)
    page.goto(server[0])
    page.wait_for_selector("input[name=model]")
    yield page
    page.close()
    assert not [e for e in errors if "403" not in e], errors  # no console error, no failed load


def fill(page, **values):
    page.evaluate("document.getElementById('advanced').open = true")  # where the rarer fields are
    for name, value in values.items():
        page.fill(f"[name={name}]", str(value))


BASE = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 2048, "output_length": 128}


def test_the_form_writes_the_command_with_the_typed_budget(page):
    fill(page, **BASE, max_batched_tokens=4096)
    page.wait_for_function("document.getElementById('cmd-optimize').textContent.includes('--max-batched-tokens 4096')")
    command = page.text_content("#cmd-optimize")
    assert command.startswith("servesweep optimize Qwen/Qwen3-8B --device H200_SXM --num-devices 1")
    assert "max_batched_tokens = [4096]" in page.text_content("#cmd-toml")
    assert page.text_content("#cmd-estimate").startswith("servesweep estimate Qwen/Qwen3-8B")


def test_the_form_asks_the_steady_question_first_and_keeps_the_rest_under_advanced(page):
    """Model, device, devices, lengths, limits, engine, arrival and load come first, the rest under a
    closed "advanced"; left empty, the page asks the steady question (closed loop, vLLM's profile), says
    so, and the commands it writes name it; the CLI keeps the RFC's defaults."""
    from orchestrator.ui import ESSENTIALS

    first = page.locator("#essentials [name]").evaluate_all("els => els.map(e => e.name)")
    assert first == list(ESSENTIALS)
    assert page.evaluate("document.getElementById('advanced').open") is False
    assert page.locator("#advanced [name=latency_backend]").count() == 1
    assert "steady question" in page.text_content("#steady-note")
    assert "closed: this page's; the CLI's burst" in page.text_content("[name=arrival] option[value='']")
    page.fill("[name=model]", BASE["model"])
    for name in ("device", "num_devices", "input_length", "output_length"):
        page.fill(f"[name={name}]", str(BASE[name]))
    page.wait_for_function("document.getElementById('cmd-estimate').textContent.includes('--arrival closed')")
    command = page.text_content("#cmd-estimate")
    assert "--engine vllm" in command and "--arrival closed" in command


def test_a_bad_value_shows_the_cli_s_one_line_message(page):
    fill(page, **BASE, max_batched_tokens=0)
    page.wait_for_function("document.getElementById('err-max_batched_tokens').textContent.length > 0")
    import subprocess
    import sys

    cli = subprocess.run([sys.executable, "-m", "orchestrator", "optimize", *[w for k, v in BASE.items() for w in (
        [str(v)] if k == "model" else [f"--{k.replace('_', '-')}", str(v)])], "--max-batched-tokens", "0"],
        capture_output=True, text=True)
    assert page.text_content("#err-max_batched_tokens") == cli.stderr.strip().split("error: ", 1)[1] == \
        "--max-batched-tokens: 0 is not allowed; expected an integer >= 1 (tokens)"
    fill(page, max_batched_tokens=2048)
    page.wait_for_function("document.getElementById('err-max_batched_tokens').textContent === ''")


def test_an_estimate_draws_its_chart_and_its_numbers_are_the_cli_s(page):
    from PIL import Image

    fill(page, **BASE, concurrency=8)
    page.select_option("[name=arrival]", "closed")
    page.click("#run-estimate")
    page.wait_for_selector("#result td[data-col=ttft_ms]")
    page.wait_for_selector("#chart .main-svg")
    shown = float(page.text_content("#result td[data-col=ttft_ms]"))
    cli = estimate(configure({**BASE, "concurrency": 8, "arrival": "closed", "engine": "vllm"}))  # the page's engine
    assert shown == pytest.approx(cli["ttft_ms"], rel=1e-4)
    assert float(page.text_content("#result td[data-col=tpot_ms]")) == pytest.approx(cli["tpot_ms"], rel=1e-4)
    image = Image.open(io.BytesIO(page.locator("#chart").screenshot())).convert("L")
    low, high = image.getextrema()
    shades = sum(1 for n in image.histogram() if n)
    assert high - low > 100 and shades > 20  # bars, axes and text: not a blank box
    assert page.locator("#detail td[data-col=op]").count() >= 8  # the per-op breakdown


def test_optimize_draws_the_limits_and_the_frontier(page):
    fill(page, **BASE, tp_sizes=1, max_batched_tokens=4096, tpot_limits=30)
    page.click("#run-optimize")
    page.wait_for_selector("#result td[data-col=concurrency]")
    page.wait_for_selector("#chart .main-svg")
    page.wait_for_selector("#chart2 .main-svg")
    assert page.locator("#chart .shapelayer path").count() >= 1  # the TPOT limit line
    for chart in ("#chart", "#chart2"):  # every chart: both axis titles, with units, and a legend
        titles = page.locator(f"{chart} .g-xtitle, {chart} .g-ytitle").all_text_contents()
        assert len(titles) >= 2 and all(t.strip() for t in titles), titles
        assert any("(ms)" in t or "tokens/s" in t for t in titles)
        assert page.locator(f"{chart} .legend").count() == 1
    # wide tables scroll inside their box: the page is no wider than the window, by the DOM and on a
    # screenshot of the whole page
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    from PIL import Image

    shot = Image.open(io.BytesIO(page.screenshot(full_page=True)))
    assert shot.width <= 1400, shot.size


def test_model_and_device_are_picked_from_the_shipped_ones(page):
    from latency import shipped_devices, shipped_models

    models = page.locator("#list-model option").evaluate_all("os => os.map(o => o.value)")
    devices = page.locator("#list-device option").evaluate_all("os => os.map(o => o.value)")
    assert models == shipped_models() and "openai/gpt-oss-120b" in models
    assert devices == shipped_devices() and "H200_SXM" in devices
    assert page.get_attribute("[name=model]", "list") == "list-model"


def test_the_engine_box_offers_the_shipped_engines_and_takes_a_calibrated_profile(page, tmp_path):
    """The engine is picked from the shipped ones or typed as a profile path (calibrate's output); the
    estimate then runs with that profile, as the CLI's --engine PATH does."""
    from latency import shipped_engines
    from orchestrator.calibrate import base_profile
    from orchestrator.profile_files import to_toml

    engines = page.locator("#list-engine option").evaluate_all("os => os.map(o => o.value)")
    assert engines == shipped_engines()
    profile = tmp_path / "mine.toml"
    profile.write_text(to_toml(base_profile("vllm") | {"launch": {"max_batched_tokens": 1024}}))
    fill(page, **BASE, concurrency=8, engine=str(profile))
    page.select_option("[name=arrival]", "closed")
    page.wait_for_function(f"document.getElementById('cmd-estimate').textContent.includes('--engine {profile}')")
    page.click("#run-estimate")
    page.wait_for_selector("#result td[data-col=ttft_ms]")
    cli = estimate(configure({**BASE, "concurrency": 8, "arrival": "closed", "engine": str(profile)}))
    assert cli["max_batched_tokens"] == 1024
    assert float(page.text_content("#result td[data-col=ttft_ms]")) == pytest.approx(cli["ttft_ms"], rel=1e-4)


def test_explore_opens_a_results_directory_and_filters_it(page, server):
    page.click("nav button[data-tab=explore]")
    page.fill("#results-path", server[1])
    page.click("#open-results")
    page.wait_for_selector("#explore-table td[data-col=device]")
    assert page.locator("#explore-table tr").count() == 1 + 4
    page.select_option("#filters select[name=device]", "H100_SXM")
    page.wait_for_function("document.querySelectorAll('#explore-table tr').length === 3")
    devices = page.locator("#explore-table td[data-col=device]").all_text_contents()
    assert devices == ["H100_SXM", "H100_SXM"]
    href = page.get_attribute("#download", "href")
    assert "device=H100_SXM" in href
    page.fill("#results-path", server[1] + "-missing")
    page.click("#open-results")
    page.wait_for_function("document.getElementById('explore-error').textContent.length > 0")


def test_explore_lists_the_runs_under_the_root_newest_first_and_opens_one_on_a_click(page, server):
    """The results root holds runs, not scenarios: Explore lists each run with its finished scenarios,
    newest first, with no red error, and a click opens it."""
    from pathlib import Path

    from orchestrator.spec import expand
    from orchestrator.sweep import run_sweep

    newer = str(Path(server[1]).parent / "newer")
    spec = {"grid": {"model": "Qwen/Qwen3-8B", "device": "H100_SXM", "num_devices": 1, "input_length": 512,
                     "output_length": 32, "max_batched_tokens": [2048], "tpot_limit_ms": [30]}}
    run_sweep(expand(spec), newer, backend="inline", progress=False)
    page.click("nav button[data-tab=explore]")
    page.wait_for_selector("#runs a.run")
    listed = page.locator("#runs a.run").evaluate_all("as => as.map(a => a.dataset.path)")
    assert listed.index(newer) < listed.index(server[1])
    text = page.text_content("#runs")
    assert f"{newer} — 1 scenarios" in text and f"{server[1]} — 4 scenarios" in text
    assert page.text_content("#explore-error") == ""
    page.click(f"#runs a.run[data-path='{server[1]}']")
    page.wait_for_selector("#explore-table td[data-col=device]")
    assert page.locator("#explore-table tr").count() == 1 + 4
    assert page.input_value("#results-path") == server[1]


def test_a_sweep_runs_in_the_background_and_opens_in_explore(page, server):
    """The form's scenario as a one-scenario sweep: a background job under the results root, its
    progress bar filled when it is done, its best row in Explore, equal to an inline sweep's."""
    from orchestrator.dataset import read_table
    from orchestrator.spec import expand
    from orchestrator.sweep import run_sweep
    from orchestrator.ui import sweep_toml, with_page_defaults

    form = {**BASE, "input_length": 1024, "output_length": 64, "tpot_limits": 30}
    fill(page, **form)
    page.click("#run-sweep")
    page.wait_for_function("document.querySelector('section[data-tab=explore]').classList.contains('on')",
                           timeout=120_000)
    page.wait_for_selector("#explore-table td[data-col=device]")
    assert page.evaluate("[$('sweep-progress').value, $('sweep-progress').max]") == [1, 1]
    assert "1 / 1 scenarios, done" in page.text_content("#sweep-state")
    output = page.input_value("#results-path")
    assert output.startswith(str(Path(server[1]).parent) + "/ui-sweep-")
    inline = Path(output + "-inline")
    texts = with_page_defaults({k: str(v) for k, v in form.items()})
    run_sweep(expand(tomllib.loads(sweep_toml(texts))), inline, backend="inline", progress=False)
    theirs = read_table(inline, "best")
    shown = float(page.text_content("#explore-table td[data-col=output_throughput_per_device]"))
    assert shown == pytest.approx(theirs["output_throughput_per_device"].max(), rel=1e-4)


def test_the_pd_ratio_search_shows_its_splits(page):
    """The PD-ratio search from the page: its splits are the CLI's; a side left empty is named."""
    from orchestrator.modes import make_mode
    from orchestrator.optimize import optimize
    from orchestrator.scenario import Scenario

    form = {**BASE, "num_devices": 2, "tp_sizes": 1, "max_batched_tokens": 4096, "ttft_limits": 2000,
            "tpot_limits": 30, "engine": "none"}
    fill(page, **form)
    page.select_option("[name=arrival]", "burst")  # the CLI's defaults, as the scenario below
    page.click("#run-pd")
    page.wait_for_function("document.getElementById('err-pd-prefill').textContent.includes("
                           "'--prefill-devices-per-instance')")
    page.fill("#pd-prefill", "1")
    page.fill("#pd-decode", "1")
    page.click("#run-pd")
    page.wait_for_selector("#result td[data-col=pd_ratio]")
    s = Scenario(model=BASE["model"], device=BASE["device"], num_devices=2, input_length=2048, output_length=128,
                 tp_sizes=(1,), max_batched_tokens=(4096,), ttft_limits=(2000.0,), tpot_limits=(30.0,))
    cli = optimize(s, make_mode("pd", prefill_devices=1, decode_devices=1)).splits
    shown = [float(t) for t in page.locator("#result td[data-col=pd_ratio]").all_text_contents()]
    assert shown == pytest.approx([sp["pd_ratio"] for sp in cli], rel=1e-4) and shown


def test_sweeps_need_a_results_root_to_go_under():
    from orchestrator.ui_jobs import SweepJobs

    got = SweepJobs(None).start('[grid]\nmodel = ["Qwen/Qwen3-8B"]\n')
    assert "--results" in got["errors"]["sweep"]
    bad = SweepJobs("/tmp").start('[grid]\nmodel = ["Qwen/Qwen3-8B"]\ninput_length = [-1]\n')
    assert bad["errors"]["sweep"].startswith("input_length = -1: expected an integer >= 1")
    assert "no sweep" in SweepJobs("/tmp").status("nope")["errors"]["sweep"]
