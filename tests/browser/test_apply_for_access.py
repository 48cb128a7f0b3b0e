"""Apply for access on the Workbench's sign-in page, in headless Chromium, against a node of this
module's own with the form open (`VLLM_ACS_APPLICATIONS=open`): a person applies and keeps the
claim code in the browser; it answers "awaiting review"; the operator approves in the console;
the claim shows the first key once, signs the person in, and the key runs a completion in the
Workbench; the code then says it was used. A rejected application is told so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import axe_violations, screenshot, sign_in
from tests.browser.test_account_pages import run_in_workbench
from tests.e2e.admin_client import admin_key, apply
from tests.harness import ServerProcess, running_server

pytestmark = pytest.mark.e2e

CLAIM_STORAGE = "vllm-acs.claim-code"
USE = "Reading the tiny model's attention heads on arithmetic prompts, for a course project."


@pytest.fixture(scope="module")
def open_node(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    env = {
        "VLLM_ACS_APPLICATIONS": "open",
        "VLLM_ACS_APPLICATIONS_PER_ADDRESS": "20",
        "VLLM_ACS_GPU_SHAPE": "cpu-test",
    }
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("apply"), env=env) as server:
        yield server


@pytest.fixture
def page_origin(open_node: ServerProcess) -> str:
    return open_node.base_url


@pytest.fixture(scope="module")
def workbench(open_node: ServerProcess) -> str:
    return f"{open_node.base_url}/workbench"


@pytest.fixture(scope="module")
def operator(open_node: ServerProcess) -> str:
    return admin_key(open_node)


def open_claim_form(page, code: str | None = None) -> None:
    page.get_by_role("button", name="I have a claim code").click()
    if code is not None:
        page.get_by_label("Claim code", exact=True).fill(code)
    page.get_by_role("button", name="Claim my key").click()


def test_apply_keep_the_code_approve_claim_once_and_run(
    open_page, browser, workbench, operator, open_node
):
    context = browser.new_context(
        viewport={"width": 1360, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    applicant = open_page(context)
    page = applicant.page
    page.goto(workbench)
    page.get_by_role("button", name="Apply for access").click()
    expect(page.get_by_role("heading", name="Apply for access")).to_be_visible()
    page.get_by_label("Name").fill("Rosalind Franklin")
    page.get_by_label("Email").fill("rosalind@lab.example")
    page.get_by_label("Affiliation").fill("King's College")
    page.get_by_label("What do you want to do?").fill(USE)
    screenshot(applicant, "apply-form", full_page=True)
    assert axe_violations(applicant) == []
    page.get_by_role("button", name="Send application").click()

    # The claim code, shown once, with Copy and "keep it in this browser"; what happens next.
    expect(page.get_by_role("heading", name="Application sent")).to_be_visible()
    shown = page.get_by_label("Claim code", exact=True)
    expect(shown).to_have_value(re.compile(r"^acs-claim-[\w-]{43}$"))
    code = shown.input_value()
    expect(page.get_by_text("shown this once")).to_be_visible()
    expect(page.get_by_role("list").filter(has_text="The operator reviews")).to_be_visible()
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_text("Copied.")).to_be_visible()
    assert page.evaluate("() => navigator.clipboard.readText()") == code
    assert page.evaluate(f"() => localStorage.getItem('{CLAIM_STORAGE}')") is None
    page.get_by_label("Keep the claim code in this browser").check()
    assert page.evaluate(f"() => localStorage.getItem('{CLAIM_STORAGE}')") == code
    screenshot(applicant, "apply-claim-code", full_page=True)
    assert axe_violations(applicant) == []

    # A reload opens the claim form with the kept code; before review it is awaiting review.
    page.reload()
    expect(page.get_by_label("Claim code", exact=True)).to_have_value(code)
    page.get_by_role("button", name="Claim my key").click()
    expect(page.get_by_role("status").filter(has_text="awaiting review")).to_be_visible()
    screenshot(applicant, "apply-awaiting-review")

    # The operator finds the application, with the answers, in the console and approves it.
    console = open_page()
    sign_in(console, workbench, operator)
    console.page.get_by_role("navigation", name="Main").get_by_role("link", name="Console").click()
    application = console.page.get_by_role("article", name="Rosalind Franklin")
    expect(application).to_contain_text(USE)
    expect(application).to_contain_text("rosalind@lab.example")
    expect(application).to_contain_text("King's College")
    application.get_by_label("Monthly tokens for the account (optional)").fill("50000")
    screenshot(console, "console-applications", full_page=True)
    assert axe_violations(console) == []
    application.get_by_role("button", name="Approve Rosalind Franklin").click()
    expect(console.page.get_by_role("status")).to_contain_text("approved")
    expect(application).to_have_count(0)  # no longer pending

    # The same code now hands out the key: shown once, on the keys page, signed in with it.
    page.get_by_role("button", name="Claim my key").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    secret_field = page.get_by_label("New API key")
    expect(secret_field).to_have_value(re.compile(r"^acs-bm-"))
    secret = secret_field.input_value()
    expect(page.get_by_text("it will not be shown again")).to_be_visible()
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_text("Copied.")).to_be_visible()
    assert page.evaluate("() => navigator.clipboard.readText()") == secret
    assert page.evaluate("() => sessionStorage.getItem('vllm-acs.api-key')") == secret
    assert page.evaluate(f"() => localStorage.getItem('{CLAIM_STORAGE}')") is None
    assert secret not in page.url and code not in page.url
    screenshot(applicant, "apply-first-key", full_page=True)
    assert axe_violations(applicant) == []
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Console")).to_be_hidden()

    # It runs in the Workbench; the account's monthly total is the one set at approval.
    nav.get_by_role("link", name="Workbench").click()
    expect(run_in_workbench(applicant, "The sky is", 3)).to_have_text(
        re.compile(r"Done · 3 tokens")
    )
    nav.get_by_role("link", name="Usage", exact=True).click()
    expect(page.get_by_role("meter", name="Monthly tokens (whole account)")).to_have_attribute(
        "aria-valuetext", re.compile(r"of 50,000$")
    )
    # Shown once: back on the keys page, the secret is gone.
    nav.get_by_role("link", name="Dashboard").click()
    expect(page.get_by_text("sees only itself")).to_be_visible()
    expect(page.get_by_label("New API key")).to_have_count(0)

    # The code does not work twice: the page says so in plain words, with the node's answer.
    page.get_by_role("button", name="Sign out").click()
    open_claim_form(page, code)
    refused = page.get_by_role("alert").filter(has_text="used already")
    expect(refused).to_contain_text("claim_code_used")
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()
    screenshot(applicant, "apply-code-used")
    context.close()


def test_a_rejected_application_is_told_so(open_page, workbench, operator, open_node):
    sent = apply(open_node, "10.4.0.1", name="Rejected Applicant")
    assert sent.status_code == 201, sent.text
    code = sent.json()["claim_code"]
    console = open_page()
    sign_in(console, workbench, operator)
    console.page.goto(f"{workbench}#/console/applications")
    application = console.page.get_by_role("article", name="Rejected Applicant")
    application.get_by_label("Note (optional)").fill("Not this term.")
    application.get_by_role("button", name="Reject Rejected Applicant").click()
    expect(console.page.get_by_role("status")).to_contain_text("rejected")
    console.page.get_by_label("Show", exact=True).select_option("rejected")
    decided = console.page.get_by_role("article", name="Rejected Applicant")
    expect(decided).to_contain_text("Not this term.")

    applicant = open_page()
    applicant.page.goto(workbench)
    open_claim_form(applicant.page, code)
    told = applicant.page.get_by_role("alert").filter(has_text="was not approved")
    expect(told).to_contain_text("application_rejected")
    screenshot(applicant, "apply-rejected")
    answer = httpx.post(
        f"{open_node.base_url}/v1/applications/claim", json={"claim_code": code}, timeout=30
    )
    assert answer.json()["error"]["code"] == "application_rejected"
