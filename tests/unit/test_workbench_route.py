"""The Workbench's route on its own: the files it serves, their headers, the Feedback link, the
gate that closes it, and the setting that names the link."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.unit.asgi_apps import json_app, request
from vllm_acs.contract.routes import Surface
from vllm_acs.middleware.route_gate import RouteGateMiddleware
from vllm_acs.routes.workbench.api_router import build_router
from vllm_acs.routes.workbench.assets import STATIC_DIR
from vllm_acs.settings import Settings, SettingsError


def _client(feedback_url: str | None = None) -> TestClient:
    app = FastAPI()
    app.include_router(build_router(feedback_url))
    return TestClient(app)


def test_every_file_of_the_page_is_served_with_its_type_and_the_strict_headers():
    client = _client()
    names = sorted(p.name for p in STATIC_DIR.iterdir() if p.suffix in (".js", ".css"))
    assert {"app.js", "api.js", "style.css"} <= set(names)
    for name in names:
        answer = client.get(f"/workbench/{name}")
        assert answer.status_code == 200, name
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        assert answer.headers["content-type"].startswith(kind)
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-content-type-options"] == "nosniff"
    page = client.get("/workbench")
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["x-frame-options"] == "DENY"


def test_the_folder_address_redirects_to_the_page():
    client = _client()
    answer = client.get("/workbench/", follow_redirects=False)
    assert answer.status_code == 308
    assert answer.headers["location"] == "/workbench"
    assert answer.headers["x-content-type-options"] == "nosniff"
    kept = client.get("/workbench/?lane=2", follow_redirects=False)
    assert kept.headers["location"] == "/workbench?lane=2"
    page = client.get("/workbench/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_a_name_that_is_not_a_file_of_the_page_is_a_404():
    client = _client()
    for name in ("nope.js", "__init__.py", "assets.py", "index.htm"):
        answer = client.get(f"/workbench/{name}")
        assert answer.status_code == 404, name
        assert answer.json()["error"]["code"] == "not_found"


def test_the_feedback_link_is_written_into_the_page_escaped():
    assert "acs-feedback-url" not in _client().get("/workbench").text
    page = _client('https://example.org/feedback?a=1&b="x"').get("/workbench").text
    assert (
        '<meta name="acs-feedback-url" '
        'content="https://example.org/feedback?a=1&amp;b=&quot;x&quot;">' in page
    )


def test_the_feedback_setting_takes_a_mailto_or_a_web_address_only():
    assert Settings.load({"VLLM_ACS_FEEDBACK_URL": "mailto:ops@example.org"}).feedback_url
    with pytest.raises(SettingsError, match="FEEDBACK_URL"):
        Settings.load({"VLLM_ACS_FEEDBACK_URL": "javascript:alert(1)"})
    assert Settings.load({"VLLM_ACS_WORKBENCH": "false"}).workbench is False


def test_the_gate_closes_the_workbench_when_the_operator_does():
    app = json_app(200, {"ok": True})
    opened = RouteGateMiddleware(app, Surface())
    closed = RouteGateMiddleware(app, Surface(workbench=False))
    for path in ("/workbench", "/workbench/", "/workbench/app.js"):
        assert request(opened, "GET", path).status_code == 200
        assert request(closed, "GET", path).status_code == 404
    assert request(opened, "POST", "/workbench").status_code == 405
    # One segment only: nothing below the page's folder is reachable.
    assert request(opened, "GET", "/workbench/static/app.js").status_code == 404
    assert request(opened, "GET", "/workbench/../assets.py").status_code == 404
