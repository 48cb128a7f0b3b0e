"""Capture and steering through the real server: the openai SDK and httpx against `vllm-acs serve`
on the tiny model, captured rows checked against `transformers` on the same weights."""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reference import row_errors, transformers_blocks
from vllm_acs.activations.store import SUFFIX, capture_root
from vllm_acs.client import decode_residual_stream, encode_vector

pytestmark = pytest.mark.e2e

HIDDEN, N_LAYERS = 128, 4
PROMPT = "The sky is"
# Relative error per row between vLLM (bf16) and transformers (fp32), as in test_hooks_engine.
ROW_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path):
    return transformers_blocks(tiny_model_dir)


def _generated_ids(tokenizer, tokens: list[str]) -> list[int]:
    """vLLM's sampled tokens (logprobs' token strings) as ids: each string is one vocab entry."""
    by_text: dict[str, list[int]] = {}
    for token_id in range(tokenizer.vocab_size):
        by_text.setdefault(tokenizer.decode([token_id]), []).append(token_id)
    ids = []
    for token in tokens:
        assert len(by_text.get(token, [])) == 1, f"token {token!r} is not one vocab entry"
        ids.append(by_text[token][0])
    return ids


def _leftovers(prefix: str) -> list[Path]:
    return list(capture_root().glob(f"{prefix}*{SUFFIX}"))


def test_models_advertise_activations(api, model_id):
    capabilities = api.get(f"/v1/models/{model_id}").json()["capabilities"]
    assert capabilities["activations"] is True
    assert capabilities["max_activation_prompt_tokens"] == 2048  # min(4096, max_model_len)


def test_captured_rows_equal_transformers_for_prompt_and_generated_tokens(
    openai_client, model_id, tokenizer, reference
):
    rid = f"acte2e{secrets.token_hex(4)}"
    result = openai_client.completions.create(
        model=model_id,
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logprobs=0,
        extra_body={"output_residual_stream": [3, 0]},
        extra_headers={"X-Request-Id": rid},
    )
    ids = tokenizer(PROMPT)["input_ids"]
    # The last sampled token never goes through the model (and may be a partial UTF-8 byte).
    fed_back = _generated_ids(tokenizer, result.choices[0].logprobs.tokens[:-1])
    assert result.choices[0].text.startswith(tokenizer.decode(fed_back))
    assert result.usage.prompt_tokens == len(ids) and result.usage.completion_tokens == 5
    rows = decode_residual_stream(result)
    assert rows.shape == (2, len(ids) + 5 - 1, HIDDEN)
    want = reference(ids + fed_back)[[0, 3]]
    assert row_errors(rows, want).max() < ROW_TOLERANCE
    # Off by one position the rows are far apart: the comparison can fail.
    assert np.median(row_errors(rows[:, 1:], want[:, :-1])) > 10 * ROW_TOLERANCE
    assert _leftovers(rid) == []


def test_true_captures_every_layer_of_the_prompt(api, model_id, tokenizer, reference):
    ids = tokenizer(PROMPT)["input_ids"]
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 1, "output_residual_stream": True}
    answer = api.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    rows = decode_residual_stream(answer.json())
    assert rows.shape == (N_LAYERS, len(ids), HIDDEN)
    assert row_errors(rows, reference(ids)).max() < ROW_TOLERANCE


def test_concurrent_captures_each_get_their_own_rows(api, model_id, tokenizer, reference):
    text = "Once upon a time there was a small model that learned to continue text in a lab."
    prompts = [text[: 8 + 10 * i] for i in range(8)]  # 8 different lengths

    def capture(prompt: str) -> dict[str, Any]:
        body = {"model": model_id, "prompt": prompt, "max_tokens": 3, "temperature": 0}
        answer = api.post("/v1/completions", json={**body, "output_residual_stream": [0, 3]})
        assert answer.status_code == 200, answer.text
        return answer.json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(capture, prompts))
    for prompt, answer in zip(prompts, answers, strict=True):
        ids = tokenizer(prompt)["input_ids"]
        rows = decode_residual_stream(answer)
        assert rows.shape == (2, len(ids) + 3 - 1, HIDDEN)
        want = reference(ids)[[0, 3]]
        assert row_errors(rows[:, : len(ids)], want).max() < ROW_TOLERANCE


def _stream(api, body: dict[str, Any]) -> list[Any]:
    events = []
    with api.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_sends_the_activations_chunk_before_usage_and_done(
    api, model_id, include_usage: bool
):
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    plain = api.post("/v1/completions", json={**body, "output_residual_stream": [1]}).json()
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    events = _stream(api, {**body, "output_residual_stream": [1], **options})
    assert events[-1] == "[DONE]"
    tail = events[-3:-1] if include_usage else events[-2:-1]
    activations = tail[0]
    assert activations["choices"] == [] and activations["object"] == "text_completion"
    assert activations["id"] == events[0]["id"]
    if include_usage:
        assert tail[1]["usage"]["completion_tokens"] == 4
    assert not any("usage" in e and e["usage"] for e in events[:-1] if e is not tail[-1])
    text = "".join(c["text"] for e in events[:-1] for c in e.get("choices", []))
    assert text == plain["choices"][0]["text"]
    streamed = decode_residual_stream(activations)
    np.testing.assert_allclose(streamed, decode_residual_stream(plain), rtol=0.02, atol=0.02)


def _steer(vector: np.ndarray, scale: float, **more: Any) -> dict[str, Any]:
    return {"activations": encode_vector(vector), "layer_indices": [1], "scale": scale, **more}


def test_scale_zero_is_the_identity_and_a_large_scale_changes_the_text(api, model_id):
    vector = np.random.default_rng(5).standard_normal((1, HIDDEN))
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}

    def text(**extra: Any) -> str:
        answer = api.post("/v1/completions", json={**body, **extra})
        assert answer.status_code == 200, answer.text
        assert "activations" not in answer.json()
        return answer.json()["choices"][0]["text"]

    baseline = text()
    assert text(apply_steering_vectors=[_steer(vector, 0.0)]) == baseline
    assert text(apply_steering_vectors=[_steer(vector, 8.0, norm_match=True)]) != baseline
    # The cheatsheet's form: the vector as nested lists.
    as_lists = {**_steer(vector, 8.0, norm_match=True), "activations": vector.tolist()}
    assert text(apply_steering_vectors=[as_lists]) != baseline


def test_a_position_indexed_vector_changes_only_its_position(api, model_id):
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    body["output_residual_stream"] = [0, 1]
    vector = np.random.default_rng(9).standard_normal((1, 1, HIDDEN))
    # -1: the last prompt token (position 3 of "The sky is"), steered at layer 1 by 2 x vector.
    steer = {**_steer(vector, 2.0), "position_indices": [-1]}
    plain = api.post("/v1/completions", json=body)
    steered = api.post("/v1/completions", json={**body, "apply_steering_vectors": [steer]})
    assert plain.status_code == steered.status_code == 200, steered.text
    before, after = decode_residual_stream(plain.json()), decode_residual_stream(steered.json())
    np.testing.assert_array_equal(after[:, :3], before[:, :3])  # earlier positions: untouched
    np.testing.assert_array_equal(after[0, 3], before[0, 3])  # the layer below: untouched
    delta = after[1, 3] - before[1, 3]
    want = 2.0 * vector[0, 0]
    assert np.linalg.norm(delta - want) / np.linalg.norm(want) < 0.05


def _vec(*shape: int) -> dict[str, Any]:
    return encode_vector(np.ones(shape))


S = "apply_steering_vectors.0"
# "The sky is" is 4 tokens; max_tokens 3: positions 0..5 go through the model.
REFUSALS = [
    ({"output_residual_stream": [4]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": [0, 0]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": [False]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": [-1]}, "invalid_request", "output_residual_stream.0"),
    ({"output_residual_stream": True, "n": 2, "temperature": 1}, "invalid_request", "n"),
    ({"output_residual_stream": True, "prompt": ["a", "b"]}, "invalid_request", "prompt"),
    ({"apply_steering_vectors": [_steer(np.ones((1, HIDDEN)), 1)], "n": 2}, "invalid_request", "n"),
    ({"apply_steering_vectors": [{"activations": _vec(1, HIDDEN), "layer_indices": [0]}] * 9},
     "invalid_request", "apply_steering_vectors"),
    ({"apply_steering_vectors": [{"activations": _vec(2, HIDDEN), "layer_indices": [0]}]},
     "invalid_request", f"{S}.activations"),
    ({"apply_steering_vectors": [{"activations": _vec(1, 64), "layer_indices": [0]}]},
     "invalid_request", f"{S}.activations"),
    ({"apply_steering_vectors": [{"activations": _vec(1, HIDDEN), "layer_indices": [4]}]},
     "invalid_request", f"{S}.layer_indices"),
    ({"apply_steering_vectors": [{"activations": _vec(1, HIDDEN), "layer_indices": [0],
                                  "position_indices": [0]}]},
     "position_steering_unavailable", f"{S}.position_indices"),
    ({"apply_steering_vectors": [{"activations": _vec(1, 2, HIDDEN), "layer_indices": [0],
                                  "position_indices": [0]}]},
     "invalid_request", f"{S}.position_indices"),
    ({"apply_steering_vectors": [{"activations": _vec(1, 1, HIDDEN), "layer_indices": [0],
                                  "position_indices": [6]}]},
     "invalid_request", f"{S}.position_indices"),
    ({"apply_steering_vectors": [{"activations": _vec(1, 1, HIDDEN), "layer_indices": [0],
                                  "position_indices": [-5]}]},
     "invalid_request", f"{S}.position_indices"),
    ({"apply_steering_vectors": [{"activations": _vec(1, HIDDEN), "layer_indices": [True]}]},
     "invalid_request", f"{S}.layer_indices.0"),
    ({"output_residual_stream": True, "prompt_logprobs": -1, "prompt": list(range(3, 20))},
     "full_vocab_prompt_too_long", "prompt_logprobs"),
    ({"output_residual_stream": [0], "prompt": [5] * 2049, "max_tokens": 1},
     "activation_prompt_too_long", "prompt"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "code", "param"), REFUSALS)
def test_mismatches_are_400s_naming_the_field(api, model_id, fields, code: str, param: str):
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 3, **fields}
    answer = api.post("/v1/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error["message"]


def test_position_steering_in_range_is_accepted(api, model_id):
    vector = {"activations": _vec(1, 2, HIDDEN), "layer_indices": [0], "position_indices": [5, -1]}
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    answer = api.post("/v1/completions", json={**body, "apply_steering_vectors": [vector]})
    assert answer.status_code == 200, answer.text
