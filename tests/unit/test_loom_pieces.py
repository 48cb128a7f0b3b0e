"""The pure pieces of Looms: a streamed completion read into continuations, token data cut at a
token boundary, the Node operations' plans, the export document read back."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from vllm_acs.errors import InvalidRequest, LoomFileInvalid, LoomNodeConflict
from vllm_acs.looms import operations
from vllm_acs.looms.completion_stream import CompletionStream
from vllm_acs.looms.export_file import export_document, nodes_from_export
from vllm_acs.looms.tokens import split_token_data
from vllm_acs.looms.tree import path_text
from vllm_acs.storage.loom_records import Loom, LoomNode, LoomTree, in_tree_order

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _frame(index: int, text: str, ids: list[int], **extra) -> bytes:
    choice = {"index": index, "text": text, "token_ids": ids, **extra}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


def test_a_stream_read_in_pieces_gathers_each_choice():
    stream = CompletionStream(2)
    first = _frame(0, "Hel", [5], prompt_token_ids=[1, 2])
    body = first + _frame(1, "Yo", [7]) + _frame(0, "lo", [6], finish_reason="length")
    deltas = []
    for k in range(0, len(body), 7):  # chunks cut anywhere, mid-event included
        deltas += stream.feed(body[k : k + 7])
    deltas += stream.feed(b"data: [DONE]\n\n")
    assert [(d.index, d.text) for d in deltas] == [(0, "Hel"), (1, "Yo"), (0, "lo")]
    assert stream.choices[0].text == "Hello" and stream.choices[0].token_ids == [5, 6]
    assert stream.choices[0].finish_reason == "length"
    assert stream.prompt_token_ids == [1, 2]


def test_token_offsets_come_from_the_text_each_chunk_added():
    stream = CompletionStream(1)
    logprobs = {"tokens": ["", "é"], "token_logprobs": [-1.0, -2.0], "top_logprobs": [{}, {}]}
    halves = {"tokens": ["", ""], "token_logprobs": [-1.0, -2.0], "top_logprobs": [{}, {}]}
    one = {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{"a": -0.5, "b": -1.5}]}
    stream.feed(_frame(0, "a", [3], logprobs=one))
    stream.feed(_frame(0, "é", [8, 9], logprobs=logprobs))
    tokens = stream.choices[0].tokens
    assert [t["offset"] for t in tokens] == [0, 1, 1]  # "" and "é" make up "é"
    # Two halves of one character: where the second starts is not known.
    stream.feed(_frame(0, "ü", [10, 11], logprobs=halves))
    assert [t["offset"] for t in stream.choices[0].tokens][3:] == [2, None]
    # Two tokens in one chunk whose texts make up its text: both places are known.
    merged = CompletionStream(1)
    both = {"tokens": ["ab", "c"], "token_logprobs": [-1.0, -1.0], "top_logprobs": [{}, {}]}
    merged.feed(_frame(0, "abc", [1, 2], logprobs=both))
    assert [t["offset"] for t in merged.choices[0].tokens] == [0, 2]
    assert tokens[0]["top_logprobs"] == [
        {"text": "a", "logprob": -0.5},
        {"text": "b", "logprob": -1.5},
    ]


def test_an_error_frame_is_kept():
    stream = CompletionStream(1)
    stream.feed(b'data: {"error": {"message": "boom", "code": "x"}}\n\n')
    assert stream.error == {"error": {"message": "boom", "code": "x"}}


def _tokens(*pieces: tuple[str, int]) -> list[dict]:
    return [{"text": text, "id": i, "logprob": -1.0, "offset": None} for text, i in pieces]


def test_token_data_splits_only_at_a_boundary():
    tokens = [
        {"text": "He", "offset": 0},
        {"text": "llo", "offset": 2},
        {"text": " you", "offset": 5},
    ]
    before, after = split_token_data("Hello you", [1, 2, 3], tokens, 5)
    assert before.token_ids == [1, 2] and after.token_ids == [3]
    assert after.tokens == [{"text": " you", "offset": 0}]
    inside = split_token_data("Hello you", [1, 2, 3], tokens, 3)
    assert inside[0].tokens is None and inside[1].tokens is None
    # Without offsets (an import): where the joined texts are the Node's text.
    plain = [{"text": "ab"}, {"text": "cd"}]
    assert split_token_data("abcd", [1, 2], plain, 2)[1].token_ids == [2]
    assert split_token_data("abXd", [1, 2], plain, 2)[1].token_ids is None


def _tree() -> LoomTree:
    loom = Loom("loom_1", "key", "acct", None, 4, NOW, NOW)
    root = LoomNode("loom_1", None, 0, "root", "ready", "Root", NOW, NOW, id="r")
    a = LoomNode("loom_1", "r", 0, "model", "ready", " alpha", NOW, NOW, id="a")
    b = LoomNode("loom_1", "r", 1, "human", "ready", " beta", NOW, NOW, id="b")
    busy = LoomNode("loom_1", "a", 0, "model", "generating", "", NOW, NOW, id="g")
    return LoomTree(loom, in_tree_order([busy, b, a, root]))


def test_tree_order_and_path_text():
    tree = _tree()
    assert [n.id for n in tree.nodes] == ["r", "a", "b", "g"]
    assert path_text(tree, "g") == "Root alpha"


def test_split_moves_the_children_under_the_new_child():
    change, (kept, tail) = operations.split("a", 3, NOW)(_tree())
    assert (kept.text, tail.text, tail.parent_id) == (" al", "pha", "a")
    assert [n.parent_id for n in change.updates if n.id == "g"] == [tail.id]
    with pytest.raises(InvalidRequest):
        operations.split("a", 6, NOW)(_tree())


def test_status_and_place_forbid_operations():
    with pytest.raises(LoomNodeConflict, match="generating"):
        operations.edit("g", operations.NodeEdit(text="x"), NOW)(_tree())
    with pytest.raises(LoomNodeConflict, match="generating"):
        operations.delete_subtree("a")(_tree())
    with pytest.raises(LoomNodeConflict, match="root"):
        operations.add_sibling("r", "x", NOW)(_tree())
    change, (sibling,) = operations.add_sibling("a", " gamma", NOW)(_tree())
    assert sibling.position == 1 and [n.position for n in change.updates] == [2]


def test_an_export_reads_back_and_bad_ones_are_refused():
    tree = _tree()
    document = export_document(tree, NOW)
    nodes = nodes_from_export(document, "loom_2", NOW, max_nodes=10, max_text_chars=100)
    assert [n.text for n in nodes] == [n.text for n in tree.nodes]
    assert nodes[3].status == "failed"  # exported while generating
    assert len({n.id for n in nodes} & {n.id for n in tree.nodes}) == 0
    with pytest.raises(LoomFileInvalid, match="at most 3"):
        nodes_from_export(document, "x", NOW, max_nodes=3, max_text_chars=100)
    with pytest.raises(LoomFileInvalid, match="characters"):
        nodes_from_export(document, "x", NOW, max_nodes=10, max_text_chars=3)
    document["nodes"][1]["parent_id"] = document["nodes"][3]["id"]  # a cycle through g
    with pytest.raises(LoomFileInvalid, match="not an earlier Node"):
        nodes_from_export(document, "x", NOW, max_nodes=10, max_text_chars=100)
