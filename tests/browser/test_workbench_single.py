"""The Workbench's single pane in headless Chromium against the session's real node: a streamed
run and Stop, the heatmap and a token's popover, a run its budget cannot fit (refused, never
shortened), and past runs and saved prompts found again by another browser signed in with the
same key. Each scenario checks what the page shows and what the API then holds.
"""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import (
    axe_violations,
    screenshot,
    sign_in,
    slow_downloads,
)
from tests.e2e.account_client import client_for

pytestmark = pytest.mark.e2e

RUN_PREFIX = "workbench:run:"


def workbench_looms(acs_server, key: str, prefix: str) -> list[dict]:
    answer = httpx.get(
        f"{acs_server.base_url}/v1/looms?limit=100",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    answer.raise_for_status()
    return [loom for loom in answer.json()["data"] if (loom["title"] or "").startswith(prefix)]


def read_loom(acs_server, key: str, loom_id: str) -> dict:
    answer = httpx.get(
        f"{acs_server.base_url}/v1/looms/{loom_id}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def shown_text(output) -> str:
    """The text an output shows, exactly (innerText would fold its whitespace)."""
    return output.evaluate("e => e.textContent")


def lane_of(loom: dict) -> dict:
    root = loom["nodes"][0]
    (lane,) = [n for n in loom["nodes"] if n["parent_id"] == root["id"]]
    return lane


def test_a_streamed_run_its_stop_its_heatmap_and_another_browser_finds_it(
    open_page, workbench_url, acs_server, model_id
):
    key = acs_server.create_key("workbench-single")
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, key)
    pane = page.get_by_role("region", name="Single", exact=True)
    completion = pane.get_by_role("region", name="Completion")

    # A seeded, greedy-free run of 12 tokens with 5 alternatives each.
    expect(pane.get_by_label("Model", exact=True)).to_have_value(model_id)
    pane.get_by_label("Prompt", exact=True).fill("The quick brown fox")
    pane.get_by_label("Max tokens", exact=True).fill("12")
    pane.get_by_label("Seed", exact=True).fill("7")
    pane.get_by_role("button", name="Run", exact=True).click()
    done = pane.get_by_role("status").filter(has_text="Done")
    expect(done).to_have_text(re.compile(r"Done · 12 tokens"))
    text = shown_text(completion)
    assert text

    # The heatmap colours each token; a click on one shows its top alternatives.
    pane.get_by_role("button", name="Heatmap").click()
    expect(pane.get_by_role("button", name="Heatmap")).to_have_attribute("aria-pressed", "true")
    tokens = completion.get_by_role("button")
    assert tokens.count() == 12
    assert tokens.first.evaluate("b => getComputedStyle(b).backgroundColor") != "rgba(0, 0, 0, 0)"
    tokens.filter(has_text=re.compile(r"\w")).first.click()
    popover = page.get_by_role("dialog", name="Top alternatives")
    expect(popover).to_be_visible()
    assert popover.get_by_role("row").count() >= 2
    screenshot(watched, "single-heatmap-popover")
    page.keyboard.press("Escape")
    expect(popover).to_be_hidden()
    pane.get_by_role("button", name="Heatmap").click()  # off: the text as the model wrote it
    expect(completion.get_by_role("button")).to_have_count(0)

    # The run is kept on the server: its prompt, text, seed and parameters.
    expect(pane.get_by_role("list", name="Past runs").get_by_role("listitem")).to_have_count(1)
    (saved,) = workbench_looms(acs_server, key, RUN_PREFIX)
    assert saved["title"] == RUN_PREFIX + "The quick brown fox"
    loom = read_loom(acs_server, key, saved["id"])
    assert loom["nodes"][0]["text"] == "The quick brown fox"
    lane = lane_of(loom)
    assert lane["text"] == text
    assert lane["generation"]["seed"] == 7
    assert lane["generation"]["parameters"]["max_tokens"] == 12
    assert "workbench:state=done" in lane["tags"]
    assert len(lane["tokens"]) == 12

    # A long run streams; Stop cancels it, and what arrived is what is kept.
    pane.get_by_label("Max tokens", exact=True).fill("2000")
    pane.get_by_label("Seed", exact=True).fill("")
    with slow_downloads(watched):  # still streaming at Stop, however fast the engine
        pane.get_by_role("button", name="Run", exact=True).click()
        expect(pane.get_by_role("status").filter(has_text="Running…")).to_be_visible()
        expect(completion).not_to_have_text(re.compile(r"^$"))
        pane.get_by_role("button", name="Stop", exact=True).click()
        expect(pane.get_by_role("status").filter(has_text="Stopped")).to_be_visible()
    expect(pane.get_by_role("button", name="Run", exact=True)).to_be_enabled()
    stopped_text = shown_text(completion)
    expect(pane.get_by_role("list", name="Past runs").get_by_role("listitem")).to_have_count(2)
    newest = workbench_looms(acs_server, key, RUN_PREFIX)[0]
    stopped = lane_of(read_loom(acs_server, key, newest["id"]))
    assert "workbench:state=stopped" in stopped["tags"]
    assert "workbench:seed=auto" in stopped["tags"]
    assert isinstance(stopped["generation"]["seed"], int)  # drawn by the page, and recorded
    assert 0 < len(stopped["text"]) < 2000 * 8
    assert stopped["text"] == stopped_text
    screenshot(watched, "single")
    assert axe_violations(watched) == []

    # Every API call carried the interactive workload.
    calls = [r for r in watched.requests if "/v1/" in r.url]
    assert calls and all(r.headers.get("x-acs-workload") == "interactive" for r in calls)

    # A saved prompt and both runs appear in another browser signed in with the same key.
    pane.get_by_label("Prompt", exact=True).fill("Once upon a time")
    pane.get_by_role("button", name="Save prompt").click()
    expect(pane.get_by_role("list", name="Saved prompts").get_by_role("listitem")).to_have_count(1)
    other = open_page()
    sign_in(other, workbench_url, key)
    other_pane = other.page.get_by_role("region", name="Single", exact=True)
    runs = other_pane.get_by_role("list", name="Past runs").get_by_role("listitem")
    expect(runs).to_have_count(2)
    saved_prompts = other_pane.get_by_role("list", name="Saved prompts")
    saved_prompts.get_by_role("button", name="Load").click()
    expect(other_pane.get_by_label("Prompt", exact=True)).to_have_value("Once upon a time")
    runs.filter(has_text="The quick brown fox").last.get_by_role("button", name="Open").click()
    expect(other_pane.get_by_label("Prompt", exact=True)).to_have_value("The quick brown fox")
    expect(other_pane.get_by_role("status").filter(has_text="Done")).to_be_visible()
    assert shown_text(other_pane.get_by_role("region", name="Completion")) == text
    expect(other_pane.get_by_label("Seed", exact=True)).to_have_value("7")


def test_a_run_the_budget_cannot_fit_is_refused_not_shortened(open_page, workbench_url, acs_server):
    key = acs_server.create_key("workbench-budget", "--monthly-tokens", "40")
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, key)
    pane = page.get_by_role("region", name="Single", exact=True)
    pane.get_by_label("Prompt", exact=True).fill("The quick brown fox")
    pane.get_by_label("Max tokens", exact=True).fill("100")
    pane.get_by_role("button", name="Run", exact=True).click()
    alert = pane.get_by_role("alert").filter(has_text="budget_exceeded")
    expect(alert).to_be_visible()
    shown = alert.inner_text()
    assert "asks for up to 100 tokens per choice" in shown and "request " in shown
    # The node refused it (the page asks it to refuse, not clamp), saying what would fit.
    assert "monthly token budget holds only" in shown
    screenshot(watched, "single-budget-refused")
    expect(pane.get_by_role("status").filter(has_text="Failed")).to_be_visible()
    assert shown_text(pane.get_by_role("region", name="Completion")) == ""

    # What the server keeps: a failed run with no text, and its error.
    expect(pane.get_by_role("list", name="Past runs").get_by_role("listitem")).to_have_count(1)
    (saved,) = workbench_looms(acs_server, key, RUN_PREFIX)
    lane = lane_of(read_loom(acs_server, key, saved["id"]))
    assert lane["status"] == "failed" and lane["text"] == ""
    assert lane["error"]["error"]["code"] == "budget_exceeded"
    # The refused run cost nothing and holds nothing: the node refused it before the engine.
    with client_for(acs_server, key) as client:
        answer = client.get("/v1/usage")
    assert answer.status_code == 200, answer.text
    budgets = answer.json()["budgets"]
    assert budgets and all(b["spent"] == 0 and not b["held"] for b in budgets), budgets

    # A run that fits the budget runs in full, at a temperature past the slider's 5, with a
    # stop string: what the page sent is what the run records.
    pane.get_by_label("Max tokens", exact=True).fill("4")
    pane.get_by_label("Exact temperature").fill("7.5")
    expect(pane.get_by_label("Temperature", exact=True)).to_have_value("5")
    pane.get_by_label("Stop string 1").fill("zzzz")
    pane.get_by_role("button", name="Run", exact=True).click()
    done = pane.get_by_role("status").filter(has_text="Done")
    expect(done).to_have_text(re.compile(r"Done · 4 tokens"))
    expect(pane.get_by_role("list", name="Past runs").get_by_role("listitem")).to_have_count(2)
    newest = workbench_looms(acs_server, key, RUN_PREFIX)[0]
    parameters = lane_of(read_loom(acs_server, key, newest["id"]))["generation"]["parameters"]
    assert parameters["temperature"] == 7.5 and parameters["stop"] == ["zzzz"]
