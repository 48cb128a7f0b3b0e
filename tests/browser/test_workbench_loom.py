"""The Loom view in headless Chromium against the session's real node, as a person drives it:
each step checks what the page shows and then what the API holds (GET /v1/looms/...).

Two scenarios, to keep page loads few: a Loom grown, navigated, edited, split, given a sibling,
pruned, replayed, scored, exported and imported; then the list of Looms and a 764-node
socketteer/loom file in the List and Graph views.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import axe_violations, screenshot, sign_in
from tests.browser.socketteer_fixture import NODES, depth_of, socketteer_file
from tests.harness import CHECKPOINT, MODEL_ID

pytestmark = pytest.mark.e2e

SEED = 1234


@pytest.fixture(scope="module")
def loom_key(acs_server) -> str:
    """A key of its own, so the list shows only this module's Looms."""
    return acs_server.create_key("loom-browser")


@pytest.fixture(scope="module")
def api(acs_server, loom_key) -> httpx.Client:
    headers = {"Authorization": f"Bearer {loom_key}"}
    with httpx.Client(base_url=acs_server.base_url, headers=headers, timeout=120) as client:
        yield client


def nodes_of(api: httpx.Client, loom_id: str) -> dict[str, dict[str, Any]]:
    answer = api.get(f"/v1/looms/{loom_id}")
    assert answer.status_code == 200, answer.text
    return {node["id"]: node for node in answer.json()["nodes"]}


def root_of(nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return next(node for node in nodes.values() if node["parent_id"] is None)


def loom_id_of(page) -> str:
    return page.url.split("#/loom/")[1]


def selected(page):
    return page.locator("[role=tree] [aria-selected=true]")


def expect_selected(page, node_id: str) -> None:
    expect(selected(page)).to_have_attribute("data-node-id", node_id)


def path_text(page) -> str:
    return page.locator("#path-text").text_content()


def branch_requests(watched) -> int:
    return sum(1 for r in watched.requests if r.url.endswith("/branch") and r.method == "POST")


def test_a_loom_grown_navigated_edited_split_pruned_replayed_scored_and_exported(
    open_page, workbench_url, loom_key, api, tmp_path: Path
):
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, loom_key)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Loom").click()
    page.get_by_role("button", name="＋ New loom").click()

    # Set root: the prompt box has the focus on a new Loom.
    prompt = page.get_by_label("Root prompt")
    expect(prompt).to_be_focused()
    prompt.fill("The sky is")
    page.get_by_role("button", name="Set root (replaces tree)").click()
    expect(page.get_by_text("Root set.")).to_be_visible()
    loom_id = loom_id_of(page)
    nodes = nodes_of(api, loom_id)
    root = root_of(nodes)
    assert (root["text"], len(nodes)) == ("The sky is", 1)
    assert api.get(f"/v1/looms/{loom_id}").json()["title"] == "The sky is"
    expect(page.get_by_role("heading", level=1)).to_have_text("The sky is")

    # Branch from here: n = 2, a pinned seed, streamed (the children grow with `delta` events).
    page.get_by_label("n", exact=True).fill("2")
    page.get_by_label("Max tokens").fill("8")
    page.get_by_label("Logprobs").fill("3")
    page.get_by_label("Seed").fill(str(SEED))
    with page.expect_response(lambda r: r.url.endswith("/branch")) as branched:
        page.get_by_role("button", name="Branch from here").click()
    expect(page.get_by_text("Branched: 2 children")).to_be_visible()
    assert branched.value.headers["content-type"].startswith("text/event-stream")
    assert "event: delta" in branched.value.text()
    nodes = nodes_of(api, loom_id)
    a_id, b_id = nodes[root["id"]]["children"]
    a, b = nodes[a_id], nodes[b_id]
    assert [a["generation"]["seed"], b["generation"]["seed"]] == [SEED, SEED + 1]
    assert a["origin"] == "model" and a["generation"]["parameters"]["max_tokens"] == 8
    expect(page.get_by_role("heading", name="Children (2)")).to_be_visible()

    # Hotkeys: → first child, ↓ ↑ siblings, ← parent; the focus follows in the tree.
    page.get_by_role("treeitem").first.click()
    expect_selected(page, root["id"])
    for key, node_id in [
        ("ArrowRight", a_id),
        ("ArrowDown", b_id),
        ("ArrowUp", a_id),
        ("ArrowLeft", root["id"]),
        ("ArrowRight", a_id),
    ]:
        page.keyboard.press(key)
        expect_selected(page, node_id)
    expect(page.locator(f'[role=treeitem][data-node-id="{a_id}"]')).to_be_focused()
    assert path_text(page) == "The sky is" + a["text"]

    # Its generation is shown; `g` branches again from the selected Node.
    facts = page.locator(".facts")
    for shown in (MODEL_ID, CHECKPOINT, str(SEED), "max_tokens 8"):
        expect(facts).to_contain_text(shown)
    with page.expect_response(lambda r: r.url.endswith("/branch")) as again:
        page.keyboard.press("g")
    assert "event: done" in again.value.text()  # read to its end: the branch has landed
    nodes = nodes_of(api, loom_id)
    grandchildren = nodes[a_id]["children"]
    assert len(grandchildren) == 2 and len(nodes) == 5
    assert branch_requests(watched) == 2

    # `g` typed inside a text field is a letter: the edit box gets it, nothing is generated.
    page.keyboard.press("e")
    editor = page.get_by_label("Node text")
    expect(editor).to_be_focused()
    page.keyboard.press("g")
    expect(editor).to_have_value(a["text"] + "g")
    page.keyboard.press("Escape")
    expect(editor).to_be_hidden()
    assert branch_requests(watched) == 2 and len(nodes_of(api, loom_id)) == 5
    assert nodes_of(api, loom_id)[a_id]["text"] == a["text"]

    # Edit / Save edit: the text changes in place and its tokens go.
    page.get_by_role("button", name="Edit", exact=True).click()
    page.get_by_label("Node text").fill(" a pale blue dome")
    page.get_by_role("button", name="Save edit").click()
    expect(page.get_by_text("Edit saved.")).to_be_visible()
    edited = nodes_of(api, loom_id)[a_id]
    assert (edited["text"], edited["tokens"]) == (" a pale blue dome", None)
    assert path_text(page) == "The sky is a pale blue dome"

    # Split at cursor (s) / Split here: the children move onto the new part.
    page.keyboard.press("s")
    split_box = page.get_by_label("Node text: place the cursor where the node splits")
    expect(split_box).to_be_focused()
    page.keyboard.press("Control+Home")
    for _ in range(6):
        page.keyboard.press("ArrowRight")
    page.get_by_role("button", name="Split here").click()
    expect(page.get_by_text("Split: the node keeps 6 characters")).to_be_visible()
    nodes = nodes_of(api, loom_id)
    (tail_id,) = nodes[a_id]["children"]
    assert (nodes[a_id]["text"], nodes[tail_id]["text"]) == (" a pal", "e blue dome")
    assert nodes[tail_id]["origin"] == "split"
    assert nodes[tail_id]["children"] == grandchildren
    expect(page.get_by_role("heading", name="Children (1)")).to_be_visible()

    # New sibling (i): a hand-written alternative right after the Node; then Score it.
    page.keyboard.press("i")
    page.get_by_label("New sibling text").fill(" full of small clouds")
    page.get_by_role("button", name="Add sibling").click()
    expect(page.get_by_text("Sibling added.")).to_be_visible()
    nodes = nodes_of(api, loom_id)
    sibling_id = nodes[root["id"]]["children"][1]
    assert nodes[root["id"]]["children"] == [a_id, sibling_id, b_id]
    sibling = nodes[sibling_id]
    assert (sibling["origin"], sibling["text"]) == ("human", " full of small clouds")
    expect_selected(page, sibling_id)
    assert page.locator("#path-text .segment.selected .tok").count() == 0
    page.get_by_role("button", name="Score", exact=True).click()
    expect(page.get_by_text("tokens of the path with")).to_be_visible()
    score = nodes_of(api, loom_id)[sibling_id]["score"]
    assert score["model"] == MODEL_ID and score["tokens"] and not score["from_recorded_ids"]
    expect(page.locator("#path-text .segment.selected .tok").first).to_be_visible()
    assert path_text(page) == "The sky is full of small clouds"

    # Delete (the key): the split's tail and the two Nodes under it, after one confirmation.
    page.get_by_role("treeitem").first.click()
    for key, node_id in [("ArrowRight", a_id), ("ArrowRight", tail_id)]:
        page.keyboard.press(key)
        expect_selected(page, node_id)
    page.keyboard.press("Delete")
    confirm = page.get_by_role("button", name="Delete 3 nodes")
    expect(confirm).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_text("Deleted 3 nodes.")).to_be_visible()
    nodes = nodes_of(api, loom_id)
    assert tail_id not in nodes and not set(grandchildren) & set(nodes)
    assert len(nodes) == 4
    expect_selected(page, a_id)

    # Replay of the pinned seed's second child says identical; Bookmark it.
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    expect_selected(page, b_id)
    page.get_by_role("button", name="Replay", exact=True).click()
    expect(page.get_by_text("Replay identical")).to_be_visible()
    assert api.post(f"/v1/looms/{loom_id}/nodes/{b_id}/replay").json()["identical"] is True
    bookmark = page.get_by_role("button", name="Bookmark")
    bookmark.click()
    expect(bookmark).to_have_attribute("aria-pressed", "true")
    assert nodes_of(api, loom_id)[b_id]["bookmarked"] is True

    # The heatmap on the model's tokens, and a token's top alternatives.
    tokens = page.locator("#path-text .segment.selected .tok")
    expect(tokens.first).to_be_visible()
    assert "".join(tokens.all_text_contents()) == b["text"]
    popover = page.get_by_role("dialog", name="Top alternatives")
    tokens.nth(1).click()  # a click keeps it open when the pointer moves on
    page.mouse.move(5, 5)
    expect(popover).to_be_visible()
    expect(tokens.nth(1)).to_have_attribute("aria-expanded", "true")
    tokens.first.focus()
    page.keyboard.press("Enter")
    expect(popover.get_by_role("table")).to_be_visible()
    screenshot(watched, "loom-heatmap-popover")
    page.keyboard.press("Escape")
    expect(popover).to_be_hidden()
    screenshot(watched, "loom-list-view")
    assert axe_violations(watched) == []

    # The legend.
    page.get_by_role("treeitem").first.focus()
    page.keyboard.press("?")
    legend = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(legend).to_be_visible()
    expect(legend).to_contain_text("Split the node at the cursor")
    screenshot(watched, "loom-legend")
    page.keyboard.press("?")
    expect(legend).to_be_hidden()

    # Export JSON (the API's document), Export text (the path), Import JSON (a new Loom).
    with page.expect_download() as exported:
        page.get_by_role("button", name="Export JSON").click()
    document_path = tmp_path / "export.json"
    exported.value.save_as(document_path)
    document = json.loads(document_path.read_text())
    assert document["format"] == "vllm-acs.loom"
    assert [n["text"] for n in document["nodes"]] == [
        n["text"] for n in api.get(f"/v1/looms/{loom_id}/export").json()["nodes"]
    ]
    with page.expect_download() as exported_text:
        page.get_by_role("button", name="Export text").click()
    text_path = tmp_path / "path.txt"
    exported_text.value.save_as(text_path)
    assert text_path.read_text() == api.get(f"/v1/looms/{loom_id}/nodes/{b_id}/text").text
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import JSON").click()
    chooser.value.set_files(str(document_path))
    page.wait_for_url(lambda url: "#/loom/" in url and loom_id not in url)
    copy_id = loom_id_of(page)
    expect(page.get_by_role("treeitem")).to_have_count(4)
    copy = nodes_of(api, copy_id)
    assert sorted(n["text"] for n in copy.values()) == sorted(n["text"] for n in nodes.values())
    assert not set(copy) & set(nodes)


def test_the_list_and_a_764_node_socketteer_file_in_the_list_and_graph_views(
    open_page, workbench_url, loom_key, api, tmp_path: Path
):
    history = api.post("/v1/looms", json={"prompt": "Hi", "title": "workbench: single pane"})
    kept = api.post("/v1/looms", json={"prompt": "Once", "title": "Rename me"})
    assert history.status_code == kept.status_code == 201
    watched = open_page()
    page = watched.page
    sign_in(watched, workbench_url, loom_key)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Loom").click()

    # The list: the single pane's history hidden until asked for; rename; delete.
    table = page.get_by_role("table")
    expect(table.get_by_role("link", name="Rename me")).to_be_visible()
    expect(table.get_by_role("link", name="workbench: single pane")).to_have_count(0)
    page.get_by_label("Show Workbench history").check()
    expect(table.get_by_role("link", name="workbench: single pane")).to_be_visible()
    page.get_by_role("button", name="Rename Rename me").click()
    page.get_by_label("New title for Rename me").fill("A renamed loom")
    page.keyboard.press("Enter")
    expect(table.get_by_role("link", name="A renamed loom")).to_be_focused()
    assert api.get(f"/v1/looms/{kept.json()['id']}").json()["title"] == "A renamed loom"
    page.get_by_role("button", name="Delete workbench: single pane").click()
    page.get_by_role("button", name="Delete loom").click()
    expect(table.get_by_role("link", name="workbench: single pane")).to_have_count(0)
    assert api.get(f"/v1/looms/{history.json()['id']}").status_code == 404
    screenshot(watched, "loom-list")
    assert axe_violations(watched) == []

    # Import JSON of a socketteer/loom file: a new Loom of 764 Nodes, in the List view.
    file = socketteer_file()
    file_path = tmp_path / "valley-story.json"
    file_path.write_text(json.dumps(file))
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import JSON").click()
    chooser.value.set_files(str(file_path))
    page.wait_for_url(lambda url: "#/loom/" in url)
    loom_id = loom_id_of(page)
    nodes = nodes_of(api, loom_id)
    assert len(nodes) == NODES
    # A socketteer file has no title: the Loom takes the file's name.
    expect(page.get_by_role("heading", level=1)).to_have_text("valley-story")
    assert api.get(f"/v1/looms/{loom_id}").json()["title"] == "valley-story"
    rows = page.get_by_role("tree", name="Loom tree").get_by_role("treeitem")
    expect(rows).to_have_count(NODES)
    expect(page.get_by_text(f"{NODES} nodes")).to_be_visible()
    bookmarked = [n for n in nodes.values() if n["bookmarked"]]
    assert bookmarked and page.locator(".tree-row .bookmark-mark").count() == len(bookmarked)

    # Navigate down the first chain by keyboard: the path grows with it.
    rows.first.click()
    root = root_of(nodes)
    chain = [root]
    for _ in range(5):
        page.keyboard.press("ArrowRight")
        chain.append(nodes[chain[-1]["children"][0]])
        expect_selected(page, chain[-1]["id"])
    assert path_text(page) == "".join(n["text"] for n in chain)
    model_node = next(n for n in chain if n["origin"] == "model")
    assert model_node["tokens"]  # the file's logprobs came with it
    screenshot(watched, "loom-764-list")
    assert axe_violations(watched) == []

    # The Graph view: one box per Node, the path highlighted, zoom and pan; remembered.
    page.get_by_role("button", name="Graph").click()
    boxes = page.get_by_role("tree", name="Loom graph").get_by_role("treeitem")
    expect(boxes).to_have_count(NODES)
    expect(page.locator(".gnode.on-path")).to_have_count(len(chain))
    expect(page.locator(".edge.on-path")).to_have_count(len(chain) - 1)
    expect(page.locator(".gnode.selected")).to_have_attribute("data-node-id", chain[-1]["id"])
    page.keyboard.press("ArrowLeft")
    expect_selected(page, chain[-2]["id"])
    expect(page.locator(".gnode.on-path")).to_have_count(len(chain) - 1)
    page.get_by_role("button", name="Zoom out").click()
    expect(page.locator(".zoom-level")).to_have_text("64%")
    viewport = page.locator(".graph-canvas .viewport")
    before = viewport.get_attribute("transform")
    frame = page.locator(".graph-canvas").bounding_box()
    x, y = frame["x"] + frame["width"] - 30, frame["y"] + frame["height"] - 30
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - 120, y - 80, steps=4)
    page.mouse.up()
    assert viewport.get_attribute("transform") != before
    page.mouse.move(frame["x"] + 100, frame["y"] + 100)
    page.mouse.wheel(0, -200)
    expect(page.locator(".zoom-level")).not_to_have_text("64%")
    page.get_by_role("button", name="Fit").click()
    screenshot(watched, "loom-764-graph")
    page.get_by_role("button", name="Centre").click()
    screenshot(watched, "loom-graph-view")
    assert axe_violations(watched) == []
    assert depth_of(file) >= 20  # deep enough that the layout's width is exercised

    # Reopened, the Loom shows the view and the Node it was left on.
    page.reload()
    expect(page.get_by_role("button", name="Graph")).to_have_attribute("aria-pressed", "true")
    expect(boxes).to_have_count(NODES)
    expect(page.locator(".gnode.selected")).to_have_attribute("data-node-id", chain[-2]["id"])
    assert path_text(page) == "".join(n["text"] for n in chain[:-1])
