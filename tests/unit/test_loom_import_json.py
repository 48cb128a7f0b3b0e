"""The import's JSON parser (`looms/import_json.py`) and the import's shared completions
(`looms/socketteer.py`): nesting as deep as the node limit allows without recursion, deeper is a
400 naming the limit; a completion that many nodes share is read once and its tokens capped."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from vllm_acs.errors import BadJson, LoomFileInvalid
from vllm_acs.looms import socketteer
from vllm_acs.looms.import_file import nodes_from_file
from vllm_acs.looms.import_json import import_depth_limit, loads_import


def _chain(length: int) -> bytes:
    """A socketteer file whose nodes form one chain: each node the only child of the last."""
    head = '{"text":"n","meta":{"source":"prompt"},"children":['
    return (
        '{"root":' + head * (length - 1) + '{"text":"end"}' + "]}" * (length - 1) + "}"
    ).encode()


def test_ordinary_files_parse_as_json_loads_parses_them() -> None:
    raw = b'{"root": {"text": "a\\u00e9", "children": [{"n": 1.5, "m": [true, null, -2]}]}}'
    assert loads_import(raw, max_depth=16) == json.loads(raw)


def test_a_chain_as_long_as_the_node_limit_parses_without_recursion() -> None:
    length = 10_000
    data = loads_import(_chain(length), max_depth=import_depth_limit(length))
    node, seen = data["root"], 1
    while node.get("children"):
        assert node["meta"] == {"source": "prompt"}
        (node,) = node["children"]
        seen += 1
    assert (seen, node["text"]) == (length, "end")
    nodes = socketteer.parse_socketteer(data, max_nodes=length, max_text_chars=10)
    assert len(nodes) == length


@pytest.mark.parametrize("raw", [_chain(3000), b"[" * 100_000 + b"]" * 100_000])
def test_nesting_past_the_limit_is_a_400_naming_it(raw: bytes) -> None:
    with pytest.raises(BadJson, match="deeper than 2016 levels"):
        loads_import(raw, max_depth=import_depth_limit(1000))


def test_shallow_nesting_past_the_limit_is_refused_too() -> None:
    with pytest.raises(BadJson, match="deeper than 3 levels"):
        loads_import(b'{"a": [[{"b": 1}]]}', max_depth=3)


@pytest.mark.parametrize("raw", [b"{", b"[" * 5000 + b"1,", b"[" * 5000 + b"]", b"\xff"])
def test_malformed_files_are_a_400(raw: bytes) -> None:
    with pytest.raises(BadJson, match="not valid JSON"):
        loads_import(raw, max_depth=10_000)


def _shared_file(nodes: int, tokens: int, node_text: str) -> dict:
    """`nodes` children of the root, each pointing at the one completion of one response."""
    completion = {
        "text": "x" * tokens,
        "tokens": [
            {"generatedToken": {"token": "x", "logprob": -0.1}, "counterfactuals": {"y": -2.0}}
            for _ in range(tokens)
        ],
    }
    children = [
        {"id": f"c{i}", "text": node_text, "generation": {"id": "r1", "index": 0}}
        for i in range(nodes)
    ]
    return {
        "root": {"id": "root", "text": "p", "children": children},
        "model_responses": {"r1": {"id": "r1", "completions": [completion]}},
    }


def test_a_shared_completion_is_read_once_and_shared_not_copied() -> None:
    data = _shared_file(nodes=50, tokens=200, node_text="x" * 200)
    nodes = socketteer.parse_socketteer(data, max_nodes=100, max_text_chars=1000)
    assert all(len(node.tokens) == 200 for node in nodes[1:])
    assert all(node.tokens is nodes[1].tokens for node in nodes[1:])
    made, _ = nodes_from_file(
        data, "loom_x", datetime.now(timezone.utc), max_nodes=100, max_text_chars=1000
    )
    assert all(node.tokens is made[1].tokens for node in made[1:])


def test_nodes_whose_text_is_not_the_completion_get_none_of_its_tokens() -> None:
    # The finding's file: empty nodes pointing at a long completion whose text is empty.
    data = _shared_file(nodes=20, tokens=500, node_text="")
    data["model_responses"]["r1"]["completions"][0]["text"] = ""
    nodes = socketteer.parse_socketteer(data, max_nodes=100, max_text_chars=1000)
    assert all(node.tokens is None for node in nodes)


def test_the_tokens_of_all_nodes_together_are_capped() -> None:
    data = _shared_file(nodes=10, tokens=100, node_text="x" * 100)
    kept = socketteer.parse_socketteer(data, max_nodes=20, max_text_chars=1000, max_tokens=1000)
    assert sum(len(node.tokens) for node in kept[1:]) == 1000
    with pytest.raises(LoomFileInvalid, match="more than 999 tokens"):
        nodes_from_file(
            data,
            "loom_x",
            datetime.now(timezone.utc),
            max_nodes=20,
            max_text_chars=1000,
            max_tokens=999,
        )


def test_an_export_s_tokens_are_capped_too() -> None:
    node = {"id": "a", "parent_id": None, "text": "t", "origin": "root", "token_ids": [1, 2, 3]}
    document = {"format": "vllm-acs.loom", "version": 1, "nodes": [node]}
    with pytest.raises(LoomFileInvalid, match="more than 2 tokens"):
        nodes_from_file(
            document,
            "loom_x",
            datetime.now(timezone.utc),
            max_nodes=5,
            max_text_chars=10,
            max_tokens=2,
        )
