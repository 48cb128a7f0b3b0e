"""socketteer/loom save files: nodes, parents, origins, tokens, notes, and what is refused."""

from __future__ import annotations

import pytest

from vllm_acs.looms.socketteer import (
    ImportedNode,
    ImportedToken,
    LoomFileInvalid,
    is_socketteer_file,
    parse_socketteer,
)

RESPONSE_ID = "cmpl-3mpwvOSNXHuPcwDgvMUzTbJduHFSQ"


def _app_token(text: str, logprob: float, alternatives: dict[str, float] | None) -> dict:
    """A token as the app stores it in a model_responses completion."""
    return {
        "generatedToken": {"token": text, "logprob": logprob},
        "position": {"start": 0, "end": len(text)},
        "counterfactuals": alternatives,
    }


def _response() -> dict:
    return {
        "id": RESPONSE_ID,
        "model": "davinci-002",
        "timestamp": "2023-02-13-21.00.30",
        "prompt": {"text": "Once upon a time there was", "tokens": None},
        "completions": [
            {
                "text": " a knight",
                "finishReason": "length",
                "tokens": [
                    _app_token(" a", -0.5, {" the": -1.25, " a": -0.5}),
                    _app_token(" knight", -2.0, {" knight": -2.0, " dragon": -1.5}),
                ],
            },
            {
                "text": " a dragon.",
                "finishReason": "stop",
                "tokens": [
                    _app_token(" a", -0.5, None),
                    _app_token(" dragon", -1.5, {" dragon": -1.5}),
                    _app_token(".", -0.25, {}),
                ],
            },
        ],
    }


def _loom_file() -> dict:
    """Root, three levels of children, tags, bookmarks, a response, a dangling reference."""
    return {
        "root": {
            "id": "root",
            "text": "Once upon a time",
            "mutable": False,
            "children": [
                {
                    "id": "a",
                    "text": " there was",
                    "meta": {"source": "prompt", "creation_timestamp": "2023-02-13-20.59.00"},
                    "tags": ["bookmark", "note", "bookmark"],
                    "children": [
                        {
                            "id": "a1",
                            "parent_id": "a",
                            "text": " a dragon.",
                            "meta": {"source": "AI", "modified": False},
                            "generation": {"id": RESPONSE_ID, "index": 1},
                            "children": [{"text": " The end.", "meta": {"source": "prompt"}}],
                        },
                        {
                            "id": "a0",
                            "text": " a knight",
                            "meta": {"source": "AI"},
                            "generation": {"id": RESPONSE_ID, "index": 0},
                        },
                    ],
                },
                {
                    "id": "b",
                    "text": " lost",
                    "meta": {"source": "AI"},
                    "generation": {"id": "cmpl-gone", "index": 0},
                },
                {"id": "c", "text": "?", "bookmark": True},
            ],
        },
        "model_responses": {RESPONSE_ID: _response()},
        "tags": {"bookmark": {"name": "bookmark", "scope": "node"}},
        "generation_settings": {"temperature": 0.9, "model": "davinci-002"},
        "selected_node_id": "a0",
    }


def _parse(data: object, max_nodes: int = 1000, max_text_chars: int = 10_000) -> list:
    return parse_socketteer(data, max_nodes=max_nodes, max_text_chars=max_text_chars)


def _by_key(data: object) -> dict[str, ImportedNode]:
    return {node.key: node for node in _parse(data)}


def _with_node(node: dict, responses: dict | None = None) -> dict:
    """A file whose root has one child, `node`."""
    data: dict = {"root": {"id": "r", "text": "", "children": [node]}}
    if responses is not None:
        data["model_responses"] = responses
    return data


def _only_child(node: dict, responses: dict | None = None) -> ImportedNode:
    nodes = _parse(_with_node(node, responses))
    assert len(nodes) == 2
    return nodes[1]


def _chain(depth: int) -> dict:
    node: dict = {"id": f"n{depth}", "text": "."}
    for level in range(depth - 1, -1, -1):
        node = {"id": f"n{level}", "text": ".", "children": [node]}
    return {"root": node}


# ---- the well-formed file -------------------------------------------------------------------


def test_recognises_socketteer_files() -> None:
    assert is_socketteer_file(_loom_file())
    assert is_socketteer_file({"root": {"children": []}})
    assert is_socketteer_file({"root": {"text": ""}})
    for other in ([], "root", None, {}, {"root": []}, {"root": {}}, {"nodes": [{"text": ""}]}):
        assert not is_socketteer_file(other)


def test_nodes_come_parents_first_in_file_order() -> None:
    nodes = _parse(_loom_file())
    assert [(node.key, node.parent) for node in nodes] == [
        ("root", None),
        ("a", "root"),
        ("a1", "a"),
        ("#1", "a1"),
        ("a0", "a"),
        ("b", "root"),
        ("c", "root"),
    ]
    assert [node.text for node in nodes] == [
        "Once upon a time",
        " there was",
        " a dragon.",
        " The end.",
        " a knight",
        " lost",
        "?",
    ]


def test_origins_follow_the_recorded_source() -> None:
    origins = {key: node.origin for key, node in _by_key(_loom_file()).items()}
    assert origins == {
        "root": "root",
        "a": "human",
        "a1": "model",
        "#1": "human",
        "a0": "model",
        "b": "model",
        "c": "import",
    }
    assert "source not recorded" in _by_key(_loom_file())["c"].unknown


def test_model_node_gets_its_completion_tokens_with_alternatives_best_first() -> None:
    nodes = _by_key(_loom_file())
    assert nodes["a0"].tokens == [
        ImportedToken(" a", None, -0.5, [(" a", -0.5), (" the", -1.25)]),
        ImportedToken(" knight", None, -2.0, [(" dragon", -1.5), (" knight", -2.0)]),
    ]
    dragon = nodes["a1"]
    assert [token.text for token in dragon.tokens or []] == [" a", " dragon", "."]
    assert [token.logprob for token in dragon.tokens or []] == [-0.5, -1.5, -0.25]
    assert [token.top_logprobs for token in dragon.tokens or []] == [[], [(" dragon", -1.5)], []]
    assert dragon.generation == {
        "response_id": RESPONSE_ID,
        "index": 1,
        "model": "davinci-002",
        "finish_reason": "stop",
        "timestamp": "2023-02-13-21.00.30",
    }
    assert dragon.unknown == []


def test_nodes_without_generation_have_no_tokens() -> None:
    nodes = _by_key(_loom_file())
    for key in ("root", "a", "#1", "c"):
        assert nodes[key].tokens is None
        assert nodes[key].generation is None


def test_dangling_response_reference_is_imported_and_noted() -> None:
    lost = _by_key(_loom_file())["b"]
    assert lost.tokens is None
    assert lost.generation == {"response_id": "cmpl-gone", "index": 0}
    assert "model_responses entry 'cmpl-gone' not in file" in lost.unknown


def test_file_without_model_responses_notes_each_reference() -> None:
    data = _loom_file()
    del data["model_responses"]
    nodes = _by_key(data)
    assert nodes["a0"].tokens is None
    assert f"model_responses entry '{RESPONSE_ID}' not in file" in nodes["a0"].unknown


def test_node_without_id_gets_a_made_up_key_and_a_note() -> None:
    no_id = _by_key(_loom_file())["#1"]
    assert no_id.parent == "a1"
    assert no_id.unknown == ["node had no id"]


def test_made_up_keys_never_collide_with_file_ids() -> None:
    data = {"root": {"id": "#1", "text": "", "children": [{"text": "x"}, {"text": "y"}]}}
    assert [node.key for node in _parse(data)] == ["#1", "#2", "#3"]


def test_tags_and_bookmarks() -> None:
    nodes = _by_key(_loom_file())
    assert nodes["a"].tags == ["bookmark", "note"]
    assert nodes["a"].bookmarked
    assert nodes["c"].tags == ["bookmark"]
    assert nodes["c"].bookmarked
    assert not nodes["a1"].bookmarked
    assert nodes["a1"].tags == []


def test_non_string_tags_are_dropped_and_noted() -> None:
    node = _only_child({"id": "x", "text": "t", "tags": ["keep", 3, None], "archived": True})
    assert node.tags == ["keep", "archived"]
    assert "tags[1] is a number, not a string; dropped" in node.unknown


# ---- other token shapes and alignment -------------------------------------------------------


def test_legacy_inline_openai_choice_in_meta_generation() -> None:
    node = _only_child(
        {
            "id": "old",
            "text": " order",
            "meta": {
                "source": "AI",
                "generation": {
                    "text": " order",
                    "index": 0,
                    "finish_reason": "length",
                    "model": "curie:2020-05-03",
                    "prompt": "Test prompt",
                    "logprobs": {
                        "tokens": [" ord", "er"],
                        "token_logprobs": [-1.0, -0.125],
                        "top_logprobs": [{":": -1.7, " ord": -1.0}, None],
                        "text_offset": [11, 15],
                    },
                },
            },
        }
    )
    assert node.origin == "model"
    assert node.tokens == [
        ImportedToken(" ord", None, -1.0, [(" ord", -1.0), (":", -1.7)]),
        ImportedToken("er", None, -0.125, []),
    ]
    assert node.generation == {
        "index": 0,
        "model": "curie:2020-05-03",
        "finish_reason": "length",
    }


def test_raw_openai_response_with_echoed_prompt_is_sliced_to_the_node() -> None:
    raw = {
        "id": "cmpl-raw",
        "model": "gpt-3.5-turbo-instruct",
        "settings": {"temperature": 0.7, "response_length": 2, "stop": ["\n"]},
        "choices": [
            {
                "text": "Hi there friend",
                "index": 0,
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["Hi", " there", " friend"],
                    "token_logprobs": [None, -0.5, -3.0],
                    "top_logprobs": [None, {" there": -0.5}, {" pal": -1.0, " friend": -3.0}],
                    "text_offset": [0, 2, 8],
                },
            }
        ],
    }
    node = _only_child(
        {"id": "x", "text": " there friend", "generation": {"id": "cmpl-raw", "index": 0}},
        {"cmpl-raw": raw},
    )
    assert node.origin == "model"
    assert [(t.text, t.logprob) for t in node.tokens or []] == [(" there", -0.5), (" friend", -3.0)]
    assert node.generation == {
        "response_id": "cmpl-raw",
        "index": 0,
        "model": "gpt-3.5-turbo-instruct",
        "finish_reason": "length",
        "parameters": {"temperature": 0.7, "max_tokens": 2, "stop": ["\n"]},
    }


def test_raw_openai_chat_logprobs() -> None:
    chat = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "Yes."},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [
                        {"token": "Yes", "logprob": -0.1, "top_logprobs": []},
                        {
                            "token": ".",
                            "logprob": -0.2,
                            "top_logprobs": [
                                {"token": "!", "logprob": -2.0},
                                {"token": ".", "logprob": -0.2},
                            ],
                        },
                    ]
                },
            }
        ]
    }
    node = _only_child({"text": "Yes.", "generation": {"id": "chat"}}, {"chat": chat})
    assert node.tokens == [
        ImportedToken("Yes", None, -0.1, []),
        ImportedToken(".", None, -0.2, [(".", -0.2), ("!", -2.0)]),
    ]
    assert node.generation == {"response_id": "chat", "index": 0, "finish_reason": "stop"}


def test_start_and_restart_text_around_the_completion_keeps_all_tokens() -> None:
    node = _only_child(
        {"text": "\n a knight\n", "generation": {"id": RESPONSE_ID, "index": 0}},
        {RESPONSE_ID: _response()},
    )
    assert [token.text for token in node.tokens or []] == [" a", " knight"]


def test_split_node_keeps_the_tokens_of_its_part() -> None:
    split = {"id": "tail", "text": " dragon.", "generation": {"id": RESPONSE_ID, "index": 1}}
    node = _only_child(split, {RESPONSE_ID: _response()})
    assert [token.text for token in node.tokens or []] == [" dragon", "."]
    assert node.origin == "model"
    assert node.unknown == []


def test_split_inside_a_token_leaves_that_token_out_and_notes_it() -> None:
    split = {
        "text": "ragon.",
        "meta": {"source": "AI"},
        "generation": {"id": RESPONSE_ID, "index": 1},
    }
    node = _only_child(split, {RESPONSE_ID: _response()})
    assert [token.text for token in node.tokens or []] == ["."]
    assert any("1 token(s)" in note and "left out" in note for note in node.unknown)


def test_edited_model_text_has_no_tokens() -> None:
    edited = {
        "text": " a unicorn",
        "meta": {"source": "mixed"},
        "generation": {"id": RESPONSE_ID, "index": 0},
    }
    node = _only_child(edited, {RESPONSE_ID: _response()})
    assert node.origin == "import"
    assert node.tokens is None
    assert node.generation is not None and node.generation["response_id"] == RESPONSE_ID
    assert any("edited after generation" in note for note in node.unknown)


def test_out_of_range_index_is_noted() -> None:
    node = _only_child(
        {"text": "x", "meta": {"source": "AI"}, "generation": {"id": RESPONSE_ID, "index": 5}},
        {RESPONSE_ID: _response()},
    )
    assert node.tokens is None
    assert (
        f"generation index 5 out of range for model_responses entry '{RESPONSE_ID}' "
        "(2 completions)" in node.unknown
    )


def test_completion_without_logprobs_is_noted() -> None:
    response = {"completions": [{"text": "x", "finishReason": "stop"}]}
    node = _only_child({"text": "x", "generation": {"id": "r1", "index": 0}}, {"r1": response})
    assert node.tokens is None
    assert node.generation == {"response_id": "r1", "index": 0, "finish_reason": "stop"}
    assert "completion 'r1'[0] has no per-token logprobs" in node.unknown


def test_parent_id_that_contradicts_nesting_is_noted_and_nesting_wins() -> None:
    nodes = _parse(_with_node({"id": "x", "parent_id": "elsewhere", "text": "t"}))
    assert nodes[1].parent == "r"
    assert "parent_id 'elsewhere' contradicts nesting under 'r'; nesting used" in nodes[1].unknown


def test_odd_optional_parts_are_noted_not_fatal() -> None:
    node = _only_child(
        {
            "id": 7,
            "text": "t",
            "meta": ["not", "an", "object"],
            "tags": {"bookmark": True},
            "generation": "cmpl-x",
        }
    )
    assert node.key == "7"
    assert node.origin == "import"
    assert node.tokens is None and node.generation is None
    assert "meta is an array, not an object; ignored" in node.unknown
    assert "tags is an object, not a list; ignored" in node.unknown
    assert "generation is a string, not an object; ignored" in node.unknown


@pytest.mark.parametrize(
    "node",
    [
        {"text": "x", "generation": {"id": ["list"], "index": 0}},
        {"text": "x", "generation": {"id": RESPONSE_ID, "index": True}},
        {"text": "x", "generation": {"id": RESPONSE_ID, "index": 10**400}},
        {"text": "x", "generation": {"id": RESPONSE_ID, "index": -1}},
        {"text": "x", "generation": {"id": "junk", "index": 0}},
        {"text": "x", "generation": {"id": "junk2"}},
        {"text": "x", "generation": {"id": "junk3", "index": 0}},
        {"text": "x", "id": 10**400, "parent_id": [1], "meta": {"source": 5, "generation": 3}},
        {"text": "x", "meta": {"generation": {"logprobs": {"tokens": [1, 2]}}}},
        {"text": "x", "meta": {"generation": {"logprobs": {"tokens": ["x"], "token_logprobs": 1}}}},
        {"text": "x", "meta": {"generation": {"text": "x", "logprobs": "nope"}}},
    ],
)
def test_malformed_optional_parts_never_crash(node: dict) -> None:
    responses = {
        RESPONSE_ID: _response(),
        "junk": {"completions": [{"tokens": [{"generatedToken": {"token": 5}}, None]}]},
        "junk2": {"completions": "none", "choices": [1, 2]},
        "junk3": {
            "completions": [
                {
                    "tokens": [{"generatedToken": {"token": "x", "logprob": 1e400}}],
                    "text": "x",
                    "finishReason": {"reason": "stop"},
                }
            ]
        },
    }
    imported = _only_child(node, responses)
    assert imported.text == "x"


def test_model_responses_that_is_not_an_object_is_noted_on_the_root() -> None:
    data = _loom_file()
    data["model_responses"] = []
    nodes = _parse(data)
    assert "model_responses is an array, not an object; ignored" in nodes[0].unknown


def test_deep_chain_is_walked_without_recursion() -> None:
    nodes = _parse(_chain(10_000), max_nodes=20_000)
    assert len(nodes) == 10_001
    assert nodes[-1].key == "n10000" and nodes[-1].parent == "n9999"


# ---- invalid files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a JSON object"),
        ("text", "not a JSON object"),
        (None, "not a JSON object"),
        ({"tree": {}}, "no 'root'"),
        ({"root": "text"}, "root is not an object"),
        ({"root": {"text": "", "children": {"a": 1}}}, "root: children is an object, not a list"),
        ({"root": {"text": "", "children": None}}, "root: children is null, not a list"),
        ({"root": {"text": 5}}, "root: text is a number, not a string"),
        (
            {"root": {"children": [{"text": "a"}, {"text": 3.5}]}},
            "root.children[1]: text is a number, not a string",
        ),
        (
            {"root": {"children": [{"text": "a", "children": ["b"]}]}},
            "root.children[0].children[0]",
        ),
    ],
)
def test_invalid_files_are_refused_with_a_useful_message(data: object, message: str) -> None:
    with pytest.raises(LoomFileInvalid) as error:
        _parse(data)
    assert message in str(error.value)


def test_node_that_is_not_an_object_is_named() -> None:
    with pytest.raises(LoomFileInvalid) as error:
        _parse({"root": {"children": [{"text": "a"}, 7]}})
    assert str(error.value) == "root.children[1] is not an object (it is a number)"


def test_too_many_nodes_says_the_limit() -> None:
    with pytest.raises(LoomFileInvalid) as error:
        _parse(_loom_file(), max_nodes=6)
    assert "more than 6 nodes" in str(error.value)
    assert len(_parse(_loom_file(), max_nodes=7)) == 7


def test_too_many_nodes_in_a_deep_chain_is_refused_early() -> None:
    with pytest.raises(LoomFileInvalid, match="more than 100 nodes"):
        _parse(_chain(10_000), max_nodes=100)


def test_too_long_text_names_the_node_and_the_limit() -> None:
    with pytest.raises(LoomFileInvalid) as error:
        _parse(_loom_file(), max_text_chars=9)
    assert str(error.value) == ("root (id 'root'): text has 16 characters, over the limit of 9")
    with pytest.raises(LoomFileInvalid) as error:
        _parse(_with_node({"id": "long", "text": "x" * 11}), max_text_chars=10)
    assert "root.children[0] (id 'long')" in str(error.value)
    assert "limit of 10" in str(error.value)


def test_deep_error_paths_are_shortened() -> None:
    data = _chain(500)
    node = data["root"]
    for _ in range(499):
        node = node["children"][0]
    node["children"][0]["text"] = None
    with pytest.raises(LoomFileInvalid) as error:
        _parse(data)
    message = str(error.value)
    assert message.startswith("root.children[0]")
    assert "(490 more levels)" in message
    assert message.endswith(".children[0]: text is null, not a string")
    assert len(message) < 300


def test_repeated_id_is_refused_naming_both_places() -> None:
    data = _with_node({"id": "dup", "text": "a", "children": [{"id": "dup", "text": "b"}]})
    with pytest.raises(LoomFileInvalid) as error:
        _parse(data)
    assert str(error.value) == (
        "node id 'dup' is used twice: at root.children[0] and at root.children[0].children[0]"
    )


def test_shared_or_cyclic_node_objects_are_refused() -> None:
    shared = {"text": "s"}
    with pytest.raises(LoomFileInvalid, match="appears twice"):
        _parse({"root": {"text": "", "children": [shared, shared]}})
    cyclic: dict = {"text": "c", "children": []}
    cyclic["children"].append(cyclic)
    with pytest.raises(LoomFileInvalid, match="appears twice"):
        _parse({"root": cyclic}, max_nodes=10)
