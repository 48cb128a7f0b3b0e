"""The operator's console in headless Chromium, against the session's node (its application form
closed, the default): only an admin key sees it; pause a researcher's key (the key then gets
401 key_disabled), set the account's monthly total (the researcher's Usage page shows it), read
usage across accounts and its CSV, see the nodes, and find each action in the audit log.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

import vllm_acs
from tests.browser.conftest import axe_violations, screenshot, sign_in
from tests.e2e.admin_client import admin_key, bearer

pytestmark = pytest.mark.e2e

ACCOUNT = "console-lab"


def test_the_console_pauses_a_key_sets_a_budget_and_audits_it(
    open_page, workbench_url, acs_server, model_id
):
    record = acs_server.create_key_record(
        ACCOUNT, "--scopes", "completions,keys", "--name", "notebook"
    )
    researcher = bearer(record["key"])
    done = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        json={"model": model_id, "prompt": "The sky is", "max_tokens": 3},
        headers=researcher,
        timeout=120,
    )
    assert done.status_code == 200, done.text
    operator_key = admin_key(acs_server, "console-operators")
    operator_id = acs_server.cli("keys", "list", "--account", "console-operators")[0]["id"]

    # A researcher's key has no Console; the closed form offers no "Apply for access".
    lab = open_page()
    lab.page.goto(workbench_url)
    expect(lab.page.get_by_role("button", name="I have a claim code")).to_be_visible()
    expect(lab.page.get_by_role("button", name="Apply for access")).to_have_count(0)
    screenshot(lab, "sign-in-applications-closed")
    sign_in(lab, workbench_url, record["key"])
    lab_nav = lab.page.get_by_role("navigation", name="Main")
    expect(lab_nav.get_by_role("link", name="Dashboard")).to_be_visible()
    expect(lab_nav.get_by_role("link", name="Console")).to_be_hidden()

    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, operator_key)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Console").click()
    sections = page.get_by_role("navigation", name="Console")
    expect(sections.get_by_role("link", name="Applications")).to_have_attribute(
        "aria-current", "page"
    )

    # Keys: the researcher's key, paused by the operator, is refused with key_disabled.
    sections.get_by_role("link", name="Keys").click()
    page.get_by_label("Account", exact=True).select_option(label=ACCOUNT)
    keys = page.get_by_role("table", name=re.compile(f"Keys of {ACCOUNT}"))
    row = keys.get_by_role("row", name=re.compile("notebook"))
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("completions")
    row.get_by_role("button", name="Pause notebook").click()
    expect(row).to_contain_text("paused")
    expect(row).to_contain_text("by the operator")
    refused = httpx.get(f"{acs_server.base_url}/v1/models", headers=researcher, timeout=30)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "key_disabled")
    screenshot(watched, "console-keys", full_page=True)
    assert axe_violations(watched) == []
    row.get_by_role("button", name="Resume notebook").click()
    expect(row).to_contain_text("active")
    resumed = httpx.get(f"{acs_server.base_url}/v1/models", headers=researcher, timeout=30)
    assert resumed.status_code == 200

    # Accounts: set the monthly total; the researcher's Usage page shows it.
    sections.get_by_role("link", name="Accounts").click()
    account_row = page.get_by_role("table", name=re.compile("Accounts")).get_by_role(
        "row", name=re.compile(ACCOUNT)
    )
    account_row.get_by_role("button", name=f"Budget of {ACCOUNT}").click()
    dialog = page.get_by_role("dialog", name=f"Budget of {ACCOUNT}")
    dialog.get_by_label("Monthly tokens").fill("77777")
    screenshot(watched, "console-account-budget")
    dialog.get_by_role("button", name="Save").click()
    expect(account_row).to_contain_text("77,777")
    screenshot(watched, "console-accounts", full_page=True)
    assert axe_violations(watched) == []
    lab_nav.get_by_role("link", name="Usage", exact=True).click()
    expect(lab.page.get_by_role("meter", name="Monthly tokens (whole account)")).to_have_attribute(
        "aria-valuetext", re.compile(r"of 77,777$")
    )

    # Suspend (confirmed first): every key of the account is refused; Resume lifts it.
    account_row.get_by_role("button", name=f"Suspend {ACCOUNT}").click()
    page.get_by_role("dialog", name=f"Suspend {ACCOUNT}?").get_by_role(
        "button", name="Suspend account"
    ).click()
    expect(account_row).to_contain_text("suspended")
    refused = httpx.get(f"{acs_server.base_url}/v1/models", headers=researcher, timeout=30)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "account_suspended")
    account_row.get_by_role("button", name=f"Resume {ACCOUNT}").click()
    expect(account_row).to_contain_text("approved")
    resumed = httpx.get(f"{acs_server.base_url}/v1/models", headers=researcher, timeout=30)
    assert resumed.status_code == 200

    # Usage across accounts: the researcher's requests by account and key, and the CSV export.
    sections.get_by_role("link", name="Usage").click()
    page.get_by_label("Account", exact=True).select_option(label=ACCOUNT)
    usage = page.get_by_role("table", name=re.compile("Usage by account"))
    rows = httpx.get(
        f"{acs_server.base_url}/v1/admin/usage",
        params={"account_id": ACCOUNT},
        headers=bearer(operator_key),
        timeout=30,
    ).json()["rows"]
    requests = sum(r["requests"] for r in rows)
    assert requests >= 1
    expect(usage.get_by_role("row", name=re.compile(ACCOUNT))).to_contain_text(
        re.compile(rf"^{ACCOUNT}{requests}")
    )
    page.get_by_role("group", name="Group by").get_by_role("button", name="Key").click()
    expect(page.get_by_role("table", name=re.compile("Usage by key"))).to_contain_text(
        record["prefix"]
    )
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").click()
    exported = download.value
    assert re.fullmatch(r"usage-\d{4}-\d{2}\.csv", exported.suggested_filename)
    table = list(csv.DictReader(io.StringIO(Path(exported.path()).read_text(encoding="utf-8"))))
    assert {r["account_name"] for r in table} == {ACCOUNT}
    assert sum(int(r["requests"]) for r in table) == requests
    screenshot(watched, "console-usage", full_page=True)

    # Nodes: this node, warm, with its versions.
    sections.get_by_role("link", name="Nodes").click()
    node = page.get_by_role("table", name=re.compile("Nodes")).get_by_role(
        "row", name=re.compile(model_id)
    )
    expect(node).to_contain_text("warm")
    expect(node).to_contain_text(vllm_acs.__version__)
    expect(page.get_by_role("article", name=f"Model {model_id}")).to_contain_text("warm")
    screenshot(watched, "console-nodes", full_page=True)
    assert axe_violations(watched) == []

    # Audit log: each action above, by this admin key, on the researcher's account, newest first.
    sections.get_by_role("link", name="Audit log").click()
    page.get_by_label("Account", exact=True).select_option(label=ACCOUNT)
    page.get_by_label("Actor").fill(operator_id)
    page.get_by_role("button", name="Filter").click()
    log = page.get_by_role("table", name=re.compile("Audit log: 5 events"))
    for action in ("Key paused", "Key resumed"):
        expect(log.get_by_role("row", name=re.compile(action))).to_contain_text(operator_id)
    changed = log.get_by_role("row", name=re.compile("Account changed"))
    expect(changed).to_have_count(3)
    for row, text in zip(
        changed.all(),
        (
            "status: approved (was suspended)",
            "status: suspended (was approved)",
            "monthly_tokens: 77777 (was none)",
        ),
        strict=True,
    ):  # newest first
        expect(row).to_contain_text(operator_id)
        expect(row).to_contain_text(text)
    screenshot(watched, "console-audit", full_page=True)
    page.get_by_label("Action").select_option(label="Key paused")
    expect(page.get_by_role("table", name=re.compile("Audit log: 1 event,"))).to_contain_text(
        record["id"]
    )
    assert axe_violations(watched) == []
