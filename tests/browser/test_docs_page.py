"""/docs in headless Chromium: Swagger UI shows the API under the Workbench's security headers
(no inline script, never framed), with no policy violation and nothing from another origin."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.e2e


def test_docs_is_served_under_a_policy_that_allows_only_its_own_files(acs_server):
    page = httpx.get(f"{acs_server.base_url}/docs", timeout=30)
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert "<script>" not in page.text  # Swagger UI starts from /docs/swagger-init.js
    init = httpx.get(f"{acs_server.base_url}/docs/swagger-init.js", timeout=30)
    assert init.status_code == 200
    assert init.headers["content-type"].startswith("text/javascript")
    # No OAuth2 redirect page: the API's credential is a bearer key.
    assert httpx.get(f"{acs_server.base_url}/docs/oauth2-redirect").status_code == 404


def test_a_person_reads_the_api_on_docs_and_opens_an_operation(open_page, acs_server):
    watched = open_page()
    page = watched.page
    page.goto(f"{acs_server.base_url}/docs")
    # Swagger UI drew the document: the completions operation is there, and opens.
    operation = page.get_by_role("button", name="POST /v1/completions", exact=False).first
    expect(operation).to_be_visible()
    operation.click()
    expect(page.get_by_role("button", name="Try it out")).to_be_visible()
    screenshot(watched, "docs-page")
    # The open_page fixture fails the test on any console error (a CSP violation is one) or a
    # request to another origin.
