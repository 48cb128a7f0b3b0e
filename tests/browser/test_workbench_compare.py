"""Compare in headless Chromium against the session's real node: three lanes (one Duplicated,
each its own sampler), Run all, Stop all, the snapshot the server keeps, and Restore after a
reload bringing back the prompt, the lanes and every output.
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

pytestmark = pytest.mark.e2e

COMPARE_PREFIX = "workbench:compare:"


def compare_looms(acs_server, key: str) -> list[dict]:
    answer = httpx.get(
        f"{acs_server.base_url}/v1/looms?limit=100",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    answer.raise_for_status()
    data = answer.json()["data"]
    return [loom for loom in data if (loom["title"] or "").startswith(COMPARE_PREFIX)]


def shown_text(lane) -> str:
    """The text a lane's output shows, exactly (innerText would fold its whitespace)."""
    output = lane.get_by_role("region", name=re.compile("Output of lane"))
    return output.evaluate("e => e.textContent")


def test_three_lanes_run_all_stop_all_and_restore_after_a_reload(
    open_page, workbench_url, acs_server, model_id
):
    key = acs_server.create_key("workbench-compare")
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, key)
    page.get_by_role("button", name="Compare", exact=True).click()
    pane = page.get_by_role("region", name="Compare", exact=True)
    expect(pane).to_be_visible()
    assert page.url.endswith("#/compare")
    lanes = pane.get_by_role("region", name=re.compile(r"^Lane \d$"))
    expect(lanes).to_have_count(2)

    # Lane 1: short and seeded; Lane 2: long; its Duplicate (lane 3) is long at another seed.
    pane.get_by_label("Prompt", exact=True).fill("Compare this prompt")
    first, second = lanes.nth(0), lanes.nth(1)
    expect(first.get_by_label("Model", exact=True)).to_have_value(model_id)
    first.get_by_text("Sampling").click()
    first.get_by_label("Max tokens", exact=True).fill("8")
    first.get_by_label("Seed", exact=True).fill("11")
    first.get_by_role("button", name="Heatmap").click()
    second.get_by_text("Sampling").click()
    second.get_by_label("Max tokens", exact=True).fill("2000")
    second.get_by_role("button", name="Duplicate").click()
    expect(lanes).to_have_count(3)
    third = lanes.nth(2)
    expect(third.get_by_role("heading")).to_have_text("Lane 3")
    third.get_by_text("Sampling").click()
    expect(third.get_by_label("Max tokens", exact=True)).to_have_value("2000")
    third.get_by_label("Seed", exact=True).fill("12")
    for lane in (first, second, third):
        lane.get_by_text("Sampling").click()  # folded again: the summary names what was set
    expect(third.get_by_text("Sampling · T 1 · max 2000 · seed 12")).to_be_visible()

    # Run all: the short lane ends while the long ones still stream; Stop all stops them.
    with slow_downloads(watched):  # the long lanes still stream at Stop all, however fast
        pane.get_by_role("button", name="Run all").click()
        expect(first.get_by_role("status")).to_have_text(re.compile(r"Done · 8 tokens"))
        for lane in (second, third):
            expect(lane.get_by_role("status")).to_have_text("Running…")
            expect(lane.get_by_role("region", name=re.compile("Output of lane"))).not_to_have_text(
                re.compile(r"^$")
            )
        # The lanes' model is polled at GET /v1/models/{id}/status; warm, so no lane says otherwise.
        assert any(r.url.endswith(f"/v1/models/{model_id}/status") for r in watched.requests)
        assert all(w.is_hidden() for w in pane.get_by_text("warming up").all())
        pane.get_by_role("button", name="Stop all").click()
        for lane in (second, third):
            expect(lane.get_by_role("status")).to_have_text(re.compile(r"^Stopped after"))
    outputs = [shown_text(lane) for lane in (first, second, third)]
    assert all(outputs)

    # The Run all is kept on the server: the prompt and three lanes in order, as they ended.
    history = pane.get_by_role("list", name="Compare history").get_by_role("listitem")
    expect(history).to_have_count(1)
    (saved,) = compare_looms(acs_server, key)
    loom = httpx.get(
        f"{acs_server.base_url}/v1/looms/{saved['id']}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()
    root = loom["nodes"][0]
    assert root["text"] == "Compare this prompt"
    kept = [n for n in loom["nodes"] if n["parent_id"] == root["id"]]
    states = [next(t for t in n["tags"] if t.startswith("workbench:state=")) for n in kept]
    assert states == ["workbench:state=done", "workbench:state=stopped", "workbench:state=stopped"]
    assert [n["generation"]["seed"] for n in (kept[0], kept[2])] == [11, 12]
    assert kept[1]["generation"]["parameters"]["max_tokens"] == 2000
    screenshot(watched, "compare", full_page=True)
    assert axe_violations(watched) == []

    # After a reload, Restore brings back the prompt, the three lanes and every output.
    page.reload()
    pane = page.get_by_role("region", name="Compare", exact=True)
    expect(pane).to_be_visible()
    lanes = pane.get_by_role("region", name=re.compile(r"^Lane \d$"))
    expect(lanes).to_have_count(2)
    history = pane.get_by_role("list", name="Compare history").get_by_role("listitem")
    history.first.get_by_text("3 lanes").click()
    expect(history.first.get_by_role("listitem")).to_have_count(3)
    history.first.get_by_role("button", name="Restore").click()
    expect(lanes).to_have_count(3)
    expect(pane.get_by_label("Prompt", exact=True)).to_have_value("Compare this prompt")
    expect(lanes.nth(0).get_by_role("status")).to_have_text(re.compile(r"Done · 8 tokens"))
    assert [shown_text(lanes.nth(i)) for i in range(3)] == outputs
    expect(lanes.nth(0).get_by_role("button", name="Heatmap")).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(lanes.nth(1).get_by_role("status")).to_have_text(re.compile(r"^Stopped after"))
    expect(lanes.nth(2).get_by_label("Seed", exact=True)).to_have_value("12")


def test_a_lane_whose_model_is_not_warm_says_warming_up(
    open_page, workbench_url, acs_server, model_id
):
    """The lanes show what GET /v1/models/{id}/status answers. This node's one model is always
    warm, so the answer a deployment gives once every node of a model stopped heartbeating
    (`warm: false, nodes: 0`, see tests/deployment) is played to the page here; once the route
    answers again for real, the next poll (every 10 s) takes the words away."""
    key = acs_server.create_key("workbench-warming")
    watched = open_page()
    page = watched.page
    status_url = f"**/v1/models/{model_id}/status"
    cold = {"id": model_id, "warm": False, "nodes": 0}
    page.route(status_url, lambda route: route.fulfill(json=cold))
    sign_in(watched, workbench_url, key)
    page.get_by_role("button", name="Compare", exact=True).click()
    pane = page.get_by_role("region", name="Compare", exact=True)
    lanes = pane.get_by_role("region", name=re.compile(r"^Lane \d$"))
    expect(lanes).to_have_count(2)
    for index in range(2):
        expect(lanes.nth(index).get_by_text("warming up")).to_be_visible()
    lanes.nth(1).get_by_role("button", name="Duplicate").click()
    expect(lanes.nth(2).get_by_text("warming up")).to_be_visible()  # a new lane knows at once
    screenshot(watched, "compare-warming-up")

    page.unroute(status_url)
    for index in range(3):
        expect(lanes.nth(index).get_by_text("warming up")).to_be_hidden(timeout=25_000)


def _seed_compare_runs(acs_server, key: str, count: int) -> list[str]:
    """`count` Compare runs of one human lane each, as a script could import them; their ids,
    oldest first."""
    ids = []
    for number in range(count):
        document = {
            "format": "vllm-acs.loom",
            "version": 1,
            "title": f"{COMPARE_PREFIX}seeded {number}",
            "nodes": [
                {"id": "root", "parent_id": None, "text": f"seeded {number}", "origin": "root"},
                {"id": "lane", "parent_id": "root", "text": " lane", "origin": "human"},
            ],
        }
        answer = httpx.post(
            f"{acs_server.base_url}/v1/looms/import",
            json=document,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    return ids


def test_the_compare_history_keeps_the_newest_20(open_page, workbench_url, acs_server):
    key = acs_server.create_key("workbench-compare-keep")
    seeded = _seed_compare_runs(acs_server, key, 20)
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, key)
    page.get_by_role("button", name="Compare", exact=True).click()
    pane = page.get_by_role("region", name="Compare", exact=True)
    history = pane.get_by_role("list", name="Compare history").get_by_role("listitem")
    expect(history).to_have_count(20)
    pane.get_by_label("Prompt", exact=True).fill("The newest")
    for lane in pane.get_by_role("region", name=re.compile(r"^Lane \d$")).all():
        lane.get_by_text("Sampling").click()
        lane.get_by_label("Max tokens", exact=True).fill("2")
    pane.get_by_role("button", name="Run all").click()
    expect(pane.get_by_text(re.compile(r"^Saved in the Compare history"))).to_be_visible()

    # The 21st run pushed the oldest out, on the server and on the page.
    expect(history).to_have_count(20)
    expect(history.first).to_contain_text("The newest")
    kept = compare_looms(acs_server, key)
    assert len(kept) == 20
    assert {loom["id"] for loom in kept} == set(seeded[1:]) | {kept[0]["id"]}
    assert kept[0]["title"] == f"{COMPARE_PREFIX}The newest"
