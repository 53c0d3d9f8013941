"""`servesweep ui` accepts only its own callers (as Jupyter does): a foreign Host, a foreign Origin,
a text/plain POST, a missing token and a location outside the results root are each refused with
403 before anything is read or run."""

import json

import pytest

pytest.importorskip("flask")

from orchestrator.ui import TOKEN_HEADER, Guard, create_app  # noqa: E402

TOKEN = "t0k3n"
BODY = {"values": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": "1", "input_length": "1024",
                   "output_length": "16", "concurrency": "2"}}


@pytest.fixture
def client(tmp_path):
    root = tmp_path / "results"
    (root / "run").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    app = create_app(str(root), Guard("127.0.0.1", str(root), TOKEN))
    return app.test_client(), root, tmp_path


def call(client, path, body=BODY, headers=None, content_type="application/json", host="127.0.0.1:8765"):
    base = {"Host": host, TOKEN_HEADER: TOKEN}
    return client.post(path, data=json.dumps(body), content_type=content_type,
                       headers={**base, **(headers or {})})


def test_its_own_caller_is_served(client):
    c, root, _ = client
    r = call(c, "/api/estimate")
    assert r.status_code == 200 and r.get_json()["row"]["ttft_ms"] > 0
    assert c.get(f"/?token={TOKEN}", headers={"Host": "localhost:8765"}).status_code == 200
    r = call(c, "/api/explore", {"path": str(root / "run"), "filters": {}}, headers={"Origin": "http://127.0.0.1:8765"})
    assert r.status_code == 200 and "no finished scenario" in json.dumps(r.get_json())


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"host": "evil.example"}, "Host 'evil.example' is not an address this page serves on"),
    ({"host": "evil.example:8765"}, "is not an address this page serves on"),
    ({"headers": {"Origin": "http://evil.example"}}, "Origin 'http://evil.example' is not this page's"),
    ({"headers": {"Origin": "http://127.0.0.1:9999"}}, "is not this page's"),
    ({"content_type": "text/plain"}, "a JSON body"),
    ({"headers": {TOKEN_HEADER: ""}}, "a missing or wrong token"),
    ({"headers": {TOKEN_HEADER: "guess"}}, "a missing or wrong token"),
])
def test_a_foreign_caller_is_refused_before_anything_runs(client, kwargs, reason):
    c, _, _ = client
    r = call(c, "/api/estimate", **kwargs)
    assert r.status_code == 403
    assert reason in r.get_data(as_text=True)


def test_the_page_itself_needs_the_token_and_its_host(client):
    c, _, _ = client
    assert c.get("/", headers={"Host": "127.0.0.1:8765"}).status_code == 403
    assert c.get(f"/?token={TOKEN}", headers={"Host": "rebound.example:8765"}).status_code == 403


def test_explore_and_compare_open_only_the_results_root(client):
    c, root, tmp = client
    for path in (str(tmp / "elsewhere"), str(root) + "-sibling", str(root / ".." / "elsewhere"), "s3://bucket/x", "/"):
        r = call(c, "/api/explore", {"path": path, "filters": {}})
        assert r.status_code == 403 and "is not under the results location" in r.get_data(as_text=True), path
    r = call(c, "/api/compare", {"a": str(root / "run"), "b": str(tmp / "elsewhere")})
    assert r.status_code == 403
    csv = c.get(f"/api/explore.csv?path={tmp / 'elsewhere'}&token={TOKEN}", headers={"Host": "127.0.0.1:8765"})
    assert csv.status_code == 403
    assert c.get(f"/api/explore.csv?path={root / 'run'}", headers={"Host": "127.0.0.1:8765"}).status_code == 403


def test_without_a_results_location_explore_says_how_to_give_one(tmp_path):
    c = create_app(None, Guard("127.0.0.1", None, TOKEN)).test_client()
    r = call(c, "/api/explore", {"path": str(tmp_path), "filters": {}})
    assert r.status_code == 403 and "servesweep ui --results" in r.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/api/sweep", "/api/sweep/status"])
def test_a_foreign_caller_cannot_start_or_watch_a_sweep(client, path):
    c, root, _ = client
    for kwargs in ({"host": "evil.example"}, {"headers": {TOKEN_HEADER: ""}}, {"content_type": "text/plain"},
                   {"headers": {"Origin": "http://evil.example"}}):
        assert call(c, path, **kwargs).status_code == 403
    assert not [p for p in root.iterdir() if p.name.startswith("ui-sweep-")]  # nothing was started
