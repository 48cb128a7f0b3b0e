"""The Dashboard and Usage pages in headless Chromium, as a researcher uses them: create a key (its
secret shown once, copied with the button), sign in with it in a second browser, pause it and
watch that browser's next call fail with its code, resume, revoke after a confirmation; the
Usage chart and meters change after a run.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import axe_violations, screenshot, sign_in

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
# The Usage page refreshes every 5 s: a change shows within two refreshes.
REFRESH_WAIT_MS = 12_000


def run_in_workbench(watched, prompt: str, max_tokens: int, *, done: bool = True):
    """Runs the Workbench's single pane; its Done status (or the pane, to read a refusal)."""
    pane = watched.page.get_by_role("region", name="Single", exact=True)
    pane.get_by_label("Prompt", exact=True).fill(prompt)
    pane.get_by_label("Max tokens", exact=True).fill(str(max_tokens))
    pane.get_by_role("button", name="Run", exact=True).click()
    return pane.get_by_role("status").filter(has_text="Done") if done else pane


def test_dashboard_create_copy_sign_in_pause_resume_revoke_and_usage(
    open_page, browser, workbench_url, acs_server
):
    acs_server.cli("accounts", "create", "browser-lab", "--approved", "--monthly-tokens", "90000")
    admin = acs_server.create_key(
        "browser-lab",
        "--scopes",
        "completions,looms,keys",
        "--name",
        "lab admin",
        "--monthly-tokens",
        "20000",
    )
    context = browser.new_context(
        viewport={"width": 1360, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    first = open_page(context)
    page = first.page
    sign_in(first, workbench_url, admin)
    nav = page.get_by_role("navigation", name="Main")
    nav.get_by_role("link", name="Dashboard").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    keys = page.get_by_role("table", name="Keys of this account")
    expect(keys.get_by_role("row", name=re.compile("lab admin"))).to_contain_text("this key")

    # Create key: the secret is shown once, with a warning, and the copy button copies it.
    page.get_by_label("Name").fill("notebook")
    page.get_by_label("Monthly tokens (optional)").fill("5000")
    page.get_by_role("button", name="Create key").click()
    secret_field = page.get_by_label("New API key")
    expect(secret_field).to_have_value(re.compile(r"^acs-bm-"))
    expect(page.get_by_text("it will not be shown again")).to_be_visible()
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_text("Copied.")).to_be_visible()
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied == secret_field.input_value()
    row = keys.get_by_role("row", name=re.compile("notebook"))
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("5,000")
    screenshot(first, "dashboard-created-key", full_page=True)
    assert axe_violations(first) == []

    # A second browser signs in with the copied key; without `keys` it sees only itself.
    second = open_page()
    sign_in(second, workbench_url, copied)
    other = second.page
    other.get_by_role("navigation", name="Main").get_by_role("link", name="Dashboard").click()
    expect(other.get_by_text("sees only itself")).to_be_visible()
    expect(other.get_by_role("region", name="This key")).to_contain_text(copied[:15])
    screenshot(second, "dashboard-own-key-only")
    assert axe_violations(second) == []
    other.get_by_role("link", name="Usage", exact=True).click()
    expect(other.get_by_role("heading", name="Usage")).to_be_visible()
    expect(other.get_by_role("meter", name="Monthly tokens (this key)")).to_be_visible()

    # It runs in the second browser's Workbench; paused on the Dashboard, that browser's next
    # run fails with the code; resumed, it runs again.
    other.get_by_role("navigation", name="Main").get_by_role("link", name="Workbench").click()
    expect(run_in_workbench(second, "The sky is", 4)).to_have_text(re.compile(r"Done · 4 tokens"))
    page.get_by_role("button", name="Pause notebook").click()
    expect(row).to_contain_text("paused")
    refused = run_in_workbench(second, "The sky is", 4, done=False)
    expect(refused.get_by_role("alert").filter(has_text="key_disabled")).to_be_visible()
    screenshot(second, "workbench-run-refused-paused")
    page.get_by_role("button", name="Resume notebook").click()
    expect(row).to_contain_text("active")
    expect(run_in_workbench(second, "The sky is", 4)).to_have_text(re.compile(r"Done · 4 tokens"))

    # Usage: the chart and meters change after a run in the Workbench.
    nav.get_by_role("link", name="Usage", exact=True).click()
    monthly = page.get_by_role("meter", name="Monthly tokens (this key)")
    expect(monthly).to_have_attribute("aria-valuetext", re.compile(r"^0 tokens spent"))
    expect(page.get_by_role("img", name=re.compile("No tokens used"))).to_be_visible()
    nav.get_by_role("link", name="Workbench").click()
    expect(run_in_workbench(first, "The sky is", 6)).to_have_text(re.compile(r"Done · 6 tokens"))
    nav.get_by_role("link", name="Usage", exact=True).click()
    # The figures the node holds now: the page shows them (it also refreshes every 5 s).
    usage = httpx.get(
        f"{acs_server.base_url}/v1/usage", headers={"Authorization": f"Bearer {admin}"}
    ).json()
    spent = next(b["spent"] for b in usage["budgets"] if b["name"] == "key_monthly")
    assert spent >= 6
    expect(monthly).to_have_attribute(
        "aria-valuetext", re.compile(f"^{spent} tokens spent"), timeout=REFRESH_WAIT_MS
    )
    chart = page.get_by_role("img", name=re.compile(f"{MODEL} {spent}"))
    expect(chart).to_be_visible()
    # Drawn at its card's width (not scaled, so its text keeps its size), filling the card.
    card = page.get_by_role("region", name="This month's tokens per day").bounding_box()
    drawn = chart.bounding_box()
    assert card is not None and drawn is not None
    assert drawn["width"] >= card["width"] - 48, (drawn, card)
    assert abs(chart.evaluate("e => e.viewBox.baseVal.width") - drawn["width"]) <= 1
    (day,) = usage["days"]
    table = page.get_by_role("table", name=re.compile("Tokens per day and model"))
    # Day, model, prompt tokens, completion tokens, requests.
    expect(table.get_by_role("row", name=re.compile(MODEL))).to_have_text(
        re.compile(f"{MODEL}{day['prompt_tokens']}{day['completion_tokens']}{day['requests']}$")
    )
    account = page.get_by_role("meter", name="Monthly tokens (whole account)")
    expect(account).to_have_attribute("aria-valuetext", re.compile(r"of 90,000$"))
    # Download CSV: the same per-day rows, in the console export's column names.
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").click()
    assert download.value.suggested_filename == f"usage-{usage['period']}.csv"
    exported = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
    assert exported == [
        "date,model,requests,prompt_tokens,completion_tokens,activation_requests",
        f"{day['date']},{MODEL},{day['requests']},{day['prompt_tokens']},"
        f"{day['completion_tokens']},{day['activation_requests']}",
    ]
    screenshot(first, "usage-after-a-run", full_page=True)
    assert axe_violations(first) == []

    # Revoke is confirmed first; Cancel changes nothing.
    nav.get_by_role("link", name="Dashboard").click()
    row = page.get_by_role("table", name="Keys of this account").get_by_role(
        "row", name=re.compile("notebook")
    )
    page.get_by_role("button", name="Revoke notebook").click()
    dialog = page.get_by_role("dialog", name="Revoke notebook?")
    expect(dialog).to_be_visible()
    screenshot(first, "dashboard-revoke-confirm")
    dialog.get_by_role("button", name="Cancel").click()
    expect(row).to_contain_text("active")
    page.get_by_role("button", name="Revoke notebook").click()
    dialog.get_by_role("button", name="Revoke key").click()
    expect(row).to_contain_text("revoked")
    refused = httpx.get(
        f"{acs_server.base_url}/v1/models", headers={"Authorization": f"Bearer {copied}"}
    )
    assert refused.json()["error"]["code"] == "key_revoked"
    context.close()
