"""The Workbench's page and sign-in, in headless Chromium against the session's real node.

The page loads without a key under strict security headers; a key is asked for, checked against
the node, kept in sessionStorage (localStorage only when remembered) and never put in a URL; a
bad, paused or revoked key shows the spec's code and message.
"""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import axe_violations, screenshot, sign_in

pytestmark = pytest.mark.e2e


def test_the_page_and_its_files_load_without_a_key_under_strict_headers(acs_server):
    page = httpx.get(f"{acs_server.base_url}/workbench", timeout=30)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "<script>" not in page.text  # every script is a file of the page's own origin
    # No Feedback link unless the operator sets one.
    assert 'name="acs-feedback-url"' not in page.text

    script = httpx.get(f"{acs_server.base_url}/workbench/app.js", timeout=30)
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.headers["x-content-type-options"] == "nosniff"

    missing = httpx.get(f"{acs_server.base_url}/workbench/secrets.txt", timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert httpx.post(f"{acs_server.base_url}/workbench", timeout=30).status_code == 405


def test_a_wrong_key_shows_the_spec_code_and_nothing_is_kept(open_page, workbench_url):
    watched = open_page()
    page = watched.page
    page.goto(workbench_url + "/")  # the folder address a person may type: redirected
    assert page.url == workbench_url
    page.get_by_label("API key").fill("acs-not-a-real-key")
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "invalid_api_key" in alert.inner_text()
    assert page.get_by_role("navigation", name="Main").is_hidden()
    assert page.evaluate("() => sessionStorage.length + localStorage.length") == 0
    screenshot(watched, "sign-in-refused")
    assert axe_violations(watched) == []


@pytest.mark.parametrize("action", ["pause", "revoke"])
def test_a_paused_or_revoked_key_is_refused_with_its_code(
    open_page, workbench_url, acs_server, action
):
    record = acs_server.create_key_record()
    acs_server.cli("keys", action, record["id"])
    watched = open_page()
    page = watched.page
    page.goto(workbench_url)
    page.get_by_label("API key").fill(record["key"])
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    shown = alert.inner_text()
    answer = httpx.get(
        f"{acs_server.base_url}/v1/models",
        headers={"Authorization": f"Bearer {record['key']}"},
        timeout=30,
    ).json()["error"]
    assert answer["code"] == {"pause": "key_disabled", "revoke": "key_revoked"}[action]
    assert answer["code"] in shown and answer["message"] in shown


def test_sign_in_keeps_the_key_for_the_tab_and_sign_out_forgets_it(
    open_page, workbench_url, api_key
):
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, api_key)
    nav = page.get_by_role("navigation", name="Main")
    for name in ("Workbench", "Loom"):
        assert nav.get_by_role("link", name=name).is_visible()
    assert nav.get_by_role("link", name="Feedback").count() == 0
    assert page.evaluate("() => sessionStorage.getItem('vllm-acs.api-key')") == api_key
    assert page.evaluate("() => localStorage.getItem('vllm-acs.api-key')") is None
    assert api_key not in page.url
    assert api_key not in page.content()  # the page shows a prefix only
    # Every API call the page made carried the key and the interactive workload, but the
    # sign-in page's question whether applications are open, which answers without a key.
    calls = [r for r in watched.requests if "/v1/" in r.url]
    keyless = [r for r in calls if "/v1/applications/" in r.url]
    assert [r.url.split("/v1/")[1] for r in keyless] == ["applications/form"]
    assert "authorization" not in keyless[0].headers
    calls = [r for r in calls if r not in keyless]
    assert calls
    for call in calls:
        assert call.headers["authorization"] == f"Bearer {api_key}"
        assert call.headers["x-acs-workload"] == "interactive"
        assert api_key not in call.url

    # A reload in the same tab stays signed in; a new tab (a new context) does not.
    page.reload()
    nav.wait_for()
    other = open_page().page
    other.goto(workbench_url)
    other.get_by_label("API key").wait_for()

    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("API key").wait_for()
    assert page.evaluate("() => sessionStorage.length + localStorage.length") == 0


def test_a_view_chosen_while_the_workbench_still_mounts_is_the_one_shown(
    open_page, workbench_url, api_key
):
    """Loom clicked just after sign-in, while the Workbench view still loads, opens the Looms.
    The Workbench used to rewrite the hash to #/ as it mounted, and the click's hashchange then
    routed back to it (seen in CI: no "＋ New loom" within a minute)."""
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, api_key)
    expect(page.get_by_role("heading", level=1)).to_have_text("Workbench")
    # The race made certain. A route to the Workbench starts; the user's click changes the hash
    # (replaceState: no event yet); the Workbench module's import resolves, the route's await
    # first; only then does the click's hashchange arrive.
    page.evaluate(
        """async () => {
            window.dispatchEvent(new HashChangeEvent("hashchange"));
            history.replaceState(null, "", "#/loom");
            await import("/workbench/workbench.js");
            window.dispatchEvent(new HashChangeEvent("hashchange"));
        }"""
    )
    expect(page.get_by_role("button", name="＋ New loom")).to_be_visible()
    expect(page.get_by_role("heading", level=1)).to_have_text("Looms")
    assert re.search(r"#/loom$", page.url), page.url


def test_remember_on_this_device_survives_a_new_tab(browser, open_page, workbench_url, api_key):
    context = browser.new_context()
    try:
        first = open_page(context)
        sign_in(first, workbench_url, api_key, remember=True)
        assert first.page.evaluate("() => localStorage.getItem('vllm-acs.api-key')") == api_key
        second = open_page(context).page
        second.goto(workbench_url)
        second.get_by_role("navigation", name="Main").wait_for()
        second.get_by_role("button", name="Sign out").click()
        second.get_by_label("API key").wait_for()
        assert second.evaluate("() => localStorage.getItem('vllm-acs.api-key')") is None
    finally:
        context.close()
