"""Looms on the real server: create, branch, read the tree back, reproduce, score, stream, the
Node operations, concurrency, budgets and privacy.

The session's node (embedded SQLite, default settings) and httpx (the openai SDK has no Loom
methods). A branch is a live completion of the path's text: its children reproduce with their
seeds, and a score equals a `prompt_logprobs` completion of the same ids.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.harness import ServerProcess

pytestmark = pytest.mark.e2e

LOOMS = "/v1/looms"


@pytest.fixture(scope="module")
def client(acs_server: ServerProcess) -> httpx.Client:
    key = acs_server.create_key("looms")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=acs_server.base_url, headers=headers, timeout=120) as http:
        yield http


def new_loom(client: httpx.Client, prompt: str = "The sky is", **extra: Any) -> dict:
    response = client.post(LOOMS, json={"prompt": prompt, **extra})
    assert response.status_code == 201, response.text
    return response.json()


def branch(client: httpx.Client, loom_id: str, node_id: str, **body: Any) -> httpx.Response:
    body = {"max_tokens": 6, "n": 2, **body}
    return client.post(f"{LOOMS}/{loom_id}/nodes/{node_id}/branch", json=body)


def tree(client: httpx.Client, loom_id: str) -> dict[str, dict]:
    response = client.get(f"{LOOMS}/{loom_id}")
    assert response.status_code == 200, response.text
    return {node["id"]: node for node in response.json()["nodes"]}


def test_create_answers_the_loom_with_its_root(client: httpx.Client):
    response = client.post(LOOMS, json={"prompt": "Once upon", "title": "story"})
    assert response.status_code == 201
    loom = response.json()
    assert response.headers["location"] == f"{LOOMS}/{loom['id']}"
    assert loom["title"] == "story" and loom["node_count"] == 1
    (root,) = loom["nodes"]
    assert (root["text"], root["origin"], root["status"]) == ("Once upon", "root", "ready")
    assert root["parent_id"] is None and root["children"] == []
    assert root["generation"] is None and root["tokens"] is None


def test_branches_from_the_root_and_a_child_make_the_tree(client: httpx.Client, model_id: str):
    loom = new_loom(client)
    root = loom["nodes"][0]["id"]
    first = branch(client, loom["id"], root, temperature=1.0)
    assert first.status_code == 201, first.text
    second = branch(client, loom["id"], root, logprobs=2)
    assert second.status_code == 201, second.text
    child = first.json()["nodes"][0]
    third = branch(client, loom["id"], child["id"], n=1)
    assert third.status_code == 201, third.text

    nodes = tree(client, loom["id"])
    made = [*first.json()["nodes"], *second.json()["nodes"]]
    assert nodes[root]["children"] == [n["id"] for n in made]
    assert nodes[child["id"]]["children"] == [n["id"] for n in third.json()["nodes"]]
    for node in made:
        stored = nodes[node["id"]]
        assert stored["parent_id"] == root
        assert (stored["origin"], stored["status"]) == ("model", "ready")
        assert stored["text"] != ""
        generation = stored["generation"]
        assert generation["model"] == model_id
        assert generation["seed"] == generation["branch_seed"] + generation["index"]
        assert generation["parameters"]["max_tokens"] == 6
        assert generation["finish_reason"] in ("length", "stop")
        assert generation["prompt_token_ids"]  # the path's tokens it continued
    # Logprobs asked: every token with its logprob and 2 alternatives; not asked: none shown.
    for node in second.json()["nodes"]:
        tokens = nodes[node["id"]]["tokens"]
        # Where each token starts (None inside a chunk whose tokens are part of a character).
        offsets = [t["offset"] for t in tokens if t["offset"] is not None]
        assert offsets[0] == 0 and offsets == sorted(offsets)
        assert offsets[-1] <= len(nodes[node["id"]]["text"])  # a last token may be empty
        assert all(isinstance(t["id"], int) and t["logprob"] <= 0 for t in tokens)
        assert all(len(t["top_logprobs"]) >= 1 for t in tokens)
    assert all(nodes[n["id"]]["tokens"] is None for n in first.json()["nodes"])
    # The grandchild continued the text of the path root..child.
    grandchild = nodes[third.json()["nodes"][0]["id"]]
    text = client.get(f"{LOOMS}/{loom['id']}/nodes/{grandchild['id']}/text")
    assert text.text == "The sky is" + nodes[child["id"]]["text"] + grandchild["text"]


def test_a_pinned_seed_reproduces_and_replay_says_identical(client: httpx.Client):
    loom = new_loom(client, "In the beginning")
    root = loom["nodes"][0]["id"]
    once = branch(client, loom["id"], root, seed=1234, temperature=1.0).json()["nodes"]
    again = branch(client, loom["id"], root, seed=1234, temperature=1.0).json()["nodes"]
    assert [n["text"] for n in once] == [n["text"] for n in again]
    assert [n["generation"]["seed"] for n in once] == [1234, 1235]
    for node in once:
        replay = client.post(f"{LOOMS}/{loom['id']}/nodes/{node['id']}/replay")
        assert replay.status_code == 200, replay.text
        assert replay.json()["identical"] is True
        assert replay.json()["text"] == node["text"]
    # A child regenerated alone from what it recorded, as a plain completion.
    second = once[1]["generation"]
    live = client.post(
        "/v1/completions",
        json={
            "prompt": second["prompt_token_ids"],
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": second["seed"],
        },
    )
    assert live.json()["choices"][0]["text"] == once[1]["text"]


def test_score_equals_prompt_logprobs_of_the_same_ids(client: httpx.Client):
    loom = new_loom(client, "A cat sat")
    root = loom["nodes"][0]["id"]
    (child,) = branch(client, loom["id"], root, n=1).json()["nodes"]
    human = client.post(
        f"{LOOMS}/{loom['id']}/nodes/{child['id']}/children", json={"text": " on the mat"}
    ).json()["data"][0]
    score = client.post(f"{LOOMS}/{loom['id']}/nodes/{human['id']}/score", json={})
    assert score.status_code == 200, score.text
    ids = score.json()["prompt_token_ids"]
    live = client.post(
        "/v1/completions", json={"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    )
    expected = [
        None if p is None else p[str(token)]["logprob"]
        for p, token in zip(live.json()["choices"][0]["prompt_logprobs"], ids, strict=True)
    ]
    got = [t["logprob"] for n in score.json()["nodes"] for t in n["tokens"]]
    assert got == pytest.approx(expected)
    # Stored on the Nodes: the model's own ids for its Node, the human text tokenized.
    nodes = tree(client, loom["id"])
    assert nodes[child["id"]]["score"]["from_recorded_ids"] is True
    assert nodes[human["id"]]["score"]["from_recorded_ids"] is False
    # The path's ids are the root's tokens, then the model's own ids, then the human text's.
    path_ids = [
        t["id"]
        for node_id in (root, child["id"], human["id"])
        for t in nodes[node_id]["score"]["tokens"]
    ]
    assert path_ids == ids


def read_events(response: httpx.Response) -> list[tuple[str, Any]]:
    events = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_streamed_branch_sends_text_as_it_grows(client: httpx.Client):
    loom = new_loom(client)
    root = loom["nodes"][0]["id"]
    response = branch(client, loom["id"], root, stream=True, max_tokens=12)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = read_events(response)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "done"
    started = events[0][1]["nodes"]
    assert [n["status"] for n in started] == ["generating", "generating"]
    grown: dict[str, str] = {}
    for kind, data in events:
        if kind == "delta":
            grown[data["node_id"]] = grown.get(data["node_id"], "") + data["text"]
    final = {n["id"]: n for n in events[-1][1]["nodes"]}
    assert grown == {node_id: node["text"] for node_id, node in final.items()}
    assert all(node["status"] == "ready" for node in final.values())


def test_node_operations(client: httpx.Client):
    loom = new_loom(client, "Hello")
    loom_id, root = loom["id"], loom["nodes"][0]["id"]
    (model_node,) = branch(client, loom_id, root, n=1, max_tokens=8, logprobs=1).json()["nodes"]
    grandchildren = branch(client, loom_id, model_node["id"], n=2).json()["nodes"]
    node_url = f"{LOOMS}/{loom_id}/nodes/{model_node['id']}"
    # Split at a token boundary: the Node keeps the first tokens, a new child the rest, and
    # the old children move under the new child.
    starts = [t["offset"] for t in model_node["tokens"]]
    offset = next(s for s in starts if s is not None and 0 < s < len(model_node["text"]))
    cut = starts.index(offset)
    split = client.post(f"{node_url}/split", json={"offset": offset})
    assert split.status_code == 201, split.text
    kept, tail = split.json()["data"]
    assert kept["text"] == model_node["text"][:offset] and tail["origin"] == "split"
    assert kept["text"] + tail["text"] == model_node["text"]
    assert kept["children"] == [tail["id"]]
    assert tail["children"] == [n["id"] for n in grandchildren]
    assert kept["tokens"] == model_node["tokens"][:cut]
    assert [t["offset"] for t in tail["tokens"]] == [
        None if s is None else s - offset for s in starts[cut:]
    ]
    assert [t["id"] for t in tail["tokens"]] == [t["id"] for t in model_node["tokens"][cut:]]
    # Edit in place: the tokens go, the children stay and continue from the new text.
    edited = client.patch(node_url, json={"text": " world"})
    assert edited.status_code == 200, edited.text
    (node,) = edited.json()["data"]
    assert (node["text"], node["tokens"], node["children"]) == (" world", None, [tail["id"]])
    path = client.get(f"{LOOMS}/{loom_id}/nodes/{tail['id']}/text").text
    assert path == "Hello world" + tail["text"]
    # A hand-written sibling lands right after the Node; bookmarks.
    sibling = client.post(f"{node_url}/siblings", json={"text": " there"}).json()["data"][0]
    assert sibling["origin"] == "human" and sibling["parent_id"] == root
    assert tree(client, loom_id)[root]["children"] == [model_node["id"], sibling["id"]]
    marked = client.patch(f"{LOOMS}/{loom_id}/nodes/{sibling['id']}", json={"bookmarked": True})
    assert marked.json()["data"][0]["bookmarked"] is True
    # The root has no sibling and cannot be deleted.
    root_url = f"{LOOMS}/{loom_id}/nodes/{root}"
    refused = client.post(f"{root_url}/siblings", json={"text": "x"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "loom_node_conflict"
    assert client.delete(root_url).status_code == 409
    # Deleting a Node deletes its subtree.
    deleted = client.delete(node_url)
    assert deleted.status_code == 200
    assert set(deleted.json()["deleted"]) == {model_node["id"], tail["id"]} | {
        n["id"] for n in grandchildren
    }
    assert set(tree(client, loom_id)) == {root, sibling["id"]}
    # Bad offsets name the field.
    bad = client.post(f"{root_url}/split", json={"offset": 99})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "offset")


def test_a_generating_node_refuses_edits_and_a_closed_stream_finishes(client: httpx.Client):
    loom = new_loom(client)
    loom_id, root = loom["id"], loom["nodes"][0]["id"]
    url = f"{LOOMS}/{loom_id}/nodes/{root}/branch"
    with client.stream("POST", url, json={"n": 1, "max_tokens": 2000, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "event: started"
        started = json.loads(next(lines).removeprefix("data: "))
        (child,) = started["nodes"]
        edit = client.patch(f"{LOOMS}/{loom_id}/nodes/{child['id']}", json={"text": "x"})
        assert edit.status_code == 409
        assert "generating" in edit.json()["error"]["message"]
        assert edit.headers["x-should-retry"] == "false"
        assert client.delete(f"{LOOMS}/{loom_id}/nodes/{child['id']}").status_code == 409
    # The client left; the branch runs on and its child ends ready.
    deadline = time.monotonic() + 300
    while tree(client, loom_id)[child["id"]]["status"] == "generating":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert tree(client, loom_id)[child["id"]]["status"] == "ready"


def test_concurrent_branches_from_one_node_all_land(client: httpx.Client):
    loom = new_loom(client)
    root = loom["nodes"][0]["id"]
    answers: list[httpx.Response] = []

    def one() -> None:
        answers.append(branch(client, loom["id"], root, n=2, max_tokens=4))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [201] * 4
    made = {n["id"] for a in answers for n in a.json()["nodes"]}
    children = tree(client, loom["id"])[root]["children"]
    assert set(children) == made and len(children) == len(made)


def test_a_branch_over_budget_refuses_and_makes_no_node(acs_server: ServerProcess):
    key = acs_server.create_key("looms-budget", "--monthly-tokens", "30")
    with httpx.Client(
        base_url=acs_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as poor:
        loom = new_loom(poor)
        root = loom["nodes"][0]["id"]
        refused = branch(poor, loom["id"], root, n=2, max_tokens=100)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "budget_exceeded"
        streamed = branch(poor, loom["id"], root, n=2, max_tokens=100, stream=True)
        assert streamed.status_code == 429
        assert set(tree(poor, loom["id"])) == {root}
        assert poor.get(f"{LOOMS}/{loom['id']}").json()["node_count"] == 1


def test_another_keys_loom_is_not_found(client: httpx.Client, acs_server: ServerProcess):
    loom = new_loom(client)
    root = loom["nodes"][0]["id"]
    other = {"Authorization": f"Bearer {acs_server.create_key('looms-other')}"}
    base = acs_server.base_url
    for method, path, body in [
        ("GET", f"{LOOMS}/{loom['id']}", None),
        ("PATCH", f"{LOOMS}/{loom['id']}", {"title": "x"}),
        ("GET", f"{LOOMS}/{loom['id']}/export", None),
        ("POST", f"{LOOMS}/{loom['id']}/nodes/{root}/branch", {"max_tokens": 2}),
        ("PATCH", f"{LOOMS}/{loom['id']}/nodes/{root}", {"text": "x"}),
        ("DELETE", f"{LOOMS}/{loom['id']}", None),
    ]:
        response = httpx.request(method, base + path, json=body, headers=other, timeout=60)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "loom_not_found"
    assert httpx.get(base + LOOMS, headers=other).json()["data"] == []
    assert tree(client, loom["id"])[root]["text"] == "The sky is"


def test_list_is_newest_first_and_paginated(client: httpx.Client):
    made = [new_loom(client, title=f"page-{i}")["id"] for i in range(3)]
    first = client.get(LOOMS, params={"limit": 2}).json()
    assert [loom["id"] for loom in first["data"]] == made[::-1][:2] and first["has_more"]
    second = client.get(LOOMS, params={"limit": 2, "after": first["last_id"]}).json()
    assert second["data"][0]["id"] == made[0]


def test_a_branch_with_an_idempotency_key_answers_once(client: httpx.Client):
    loom = new_loom(client)
    root = loom["nodes"][0]["id"]
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    url = f"{LOOMS}/{loom['id']}/nodes/{root}/branch"
    first = client.post(url, json={"max_tokens": 4, "n": 2}, headers=headers)
    again = client.post(url, json={"max_tokens": 4, "n": 2}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert len(tree(client, loom["id"])[root]["children"]) == len(first.json()["nodes"])


def shape(nodes: list[dict]) -> list[tuple]:
    """A tree without its ids and times: each Node's path of child positions and its content."""
    index = {n["id"]: n for n in nodes}
    place: dict[str, tuple[int, ...]] = {}
    for node in nodes:  # parents come first
        parent = node["parent_id"]
        place[node["id"]] = (
            () if parent is None else (*place[parent], index[parent]["children"].index(node["id"]))
        )
    return sorted(
        (
            place[n["id"]],
            n["text"],
            n["origin"],
            n["status"],
            n["bookmarked"],
            json.dumps(n["generation"], sort_keys=True),
            json.dumps(n["tokens"], sort_keys=True),
            tuple(n["tags"]),
        )
        for n in nodes
    )


def test_export_then_import_is_the_same_tree_with_new_ids(client: httpx.Client):
    loom = new_loom(client, "Export me", title="round trip")
    loom_id, root = loom["id"], loom["nodes"][0]["id"]
    children = branch(client, loom_id, root, n=2, logprobs=1).json()["nodes"]
    client.post(f"{LOOMS}/{loom_id}/nodes/{children[0]['id']}/children", json={"text": " hi"})
    client.patch(f"{LOOMS}/{loom_id}/nodes/{children[1]['id']}", json={"bookmarked": True})
    exported = client.get(f"{LOOMS}/{loom_id}/export")
    assert exported.status_code == 200
    document = exported.json()
    assert (document["format"], document["version"]) == ("vllm-acs.loom", 1)
    imported = client.post(f"{LOOMS}/import", json=document)
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert copy["id"] != loom_id and copy["title"] == "round trip"
    original = client.get(f"{LOOMS}/{loom_id}").json()["nodes"]
    assert {n["id"] for n in copy["nodes"]}.isdisjoint({n["id"] for n in original})
    assert shape(copy["nodes"]) == shape(original)
    # Exported again, the copy is the same document but for its ids.
    again = client.get(f"{LOOMS}/{copy['id']}/export").json()
    assert shape(again["nodes"]) == shape(document["nodes"])


def socketteer_file() -> dict:
    """A socketteer/loom save file of our own making: nested children, tags, a bookmark, a
    model_responses entry with per-token logprobs that a model Node points to, a Node without
    an id and a human Node."""
    response = {
        "id": "resp-1",
        "model": "davinci-002",
        "prompt": {"text": "Once upon a time", "tokens": None},
        "completions": [
            {
                "text": " a knight",
                "finishReason": "length",
                "tokens": [
                    {
                        "generatedToken": {"token": " a", "logprob": -0.5},
                        "position": 0,
                        "counterfactuals": {" the": -1.25, " a": -0.5},
                    },
                    {
                        "generatedToken": {"token": " knight", "logprob": -2.0},
                        "position": 1,
                        "counterfactuals": {" dragon": -1.5},
                    },
                ],
            }
        ],
    }
    return {
        "root": {
            "id": "r",
            "text": "Once upon a time",
            "meta": {"source": "prompt"},
            "children": [
                {
                    "id": "m",
                    "text": " a knight",
                    "meta": {"source": "AI"},
                    "generation": {"id": "resp-1", "index": 0},
                    "tags": ["bookmark", "favourite"],
                    "children": [
                        {"text": " rode out.", "meta": {"source": "prompt"}, "children": []}
                    ],
                },
                {"id": "h", "text": " there was", "meta": {"source": "prompt"}},
            ],
        },
        "model_responses": {"resp-1": response},
        "tags": {"bookmark": {"name": "bookmark"}},
    }


def test_a_socketteer_file_imports_with_parents_origins_text_and_logprobs(client: httpx.Client):
    imported = client.post(f"{LOOMS}/import", json=socketteer_file())
    assert imported.status_code == 201, imported.text
    nodes = imported.json()["nodes"]
    by_text = {n["text"]: n for n in nodes}
    root, knight = by_text["Once upon a time"], by_text[" a knight"]
    no_id, human = by_text[" rode out."], by_text[" there was"]
    assert root["origin"] == "root" and root["children"] == [knight["id"], human["id"]]
    assert (knight["origin"], knight["parent_id"]) == ("model", root["id"])
    assert (no_id["origin"], no_id["parent_id"]) == ("human", knight["id"])
    assert human["origin"] == "human"
    assert knight["bookmarked"] is True and "favourite" in knight["tags"]
    logprobs = [(t["text"], t["logprob"]) for t in knight["tokens"]]
    assert logprobs == [(" a", -0.5), (" knight", -2.0)]
    assert knight["tokens"][0]["top_logprobs"][0] == {"text": " a", "logprob": -0.5}
    assert knight["generation"]["model"] == "davinci-002"
    path = client.get(f"{LOOMS}/{imported.json()['id']}/nodes/{no_id['id']}/text").text
    assert path == "Once upon a time a knight rode out."


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"format": "vllm-acs.loom", "version": 1, "nodes": "x"}, "nodes"),
        (
            {
                "format": "vllm-acs.loom",
                "version": 1,
                "nodes": [
                    {"id": "a", "parent_id": None, "text": "x", "origin": "root"},
                    {"id": "b", "parent_id": "c", "text": "y"},
                    {"id": "c", "parent_id": "b", "text": "z"},
                ],
            },
            "cyclic",
        ),
        ({"root": {"text": 5}}, "text"),
        ({"root": {"text": "a", "children": "no"}}, "children"),
        ([1, 2], "neither"),
    ],
)
def test_malformed_or_cyclic_files_create_nothing(client: httpx.Client, document, named):
    before = client.get(LOOMS, params={"limit": 100}).json()["data"]
    refused = client.post(f"{LOOMS}/import", json=document)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "loom_file_invalid"
    assert named in refused.json()["error"]["message"]
    assert client.get(LOOMS, params={"limit": 100}).json()["data"] == before


def test_an_import_over_the_byte_limit_is_refused(client: httpx.Client):
    limit = 16 * 1024 * 1024  # loom_import_max_bytes' default
    big = {"root": {"text": "x" * limit}}
    refused = client.post(f"{LOOMS}/import", json=big)
    assert refused.status_code == 413, refused.text[:300]
    assert refused.json()["error"]["code"] == "request_too_large"
    # Under the limit but past the text a Node may hold: 400 naming the limit.
    long_text = {"root": {"text": "x" * 100_001}}
    assert client.post(f"{LOOMS}/import", json=long_text).json()["error"]["code"] == (
        "loom_file_invalid"
    )
