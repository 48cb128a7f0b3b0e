"""Capture and steering fields of /v1/completions: every mismatch is a 400 naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from vllm_acs.activations.codec import decode_array
from vllm_acs.activations.payload import AcsPayload
from vllm_acs.client import encode_vector
from vllm_acs.contract.completion_rules import validate_completion
from vllm_acs.errors import AcsError
from vllm_acs.served_model import NodeModels, ServedModel
from vllm_acs.settings import Settings

SETTINGS = Settings.load(environ={})
HIDDEN, LAYERS = 16, 4


def _models(n_layers: int = LAYERS) -> NodeModels:
    models = NodeModels()
    models.register(
        ServedModel(
            id="m",
            checkpoint="org/m",
            max_model_len=2048,
            max_logprobs=20,
            gpu_shape="cpu",
            full_vocab_max_prompt_tokens=256,
            vocab_size=1000,
            n_layers=n_layers,
            hidden_size=HIDDEN,
            max_activation_prompt_tokens=64,
        ),
        # One token per character, plus BOS (id 0) when asked.
        lambda text, special: ([0] if special else []) + [1 + ord(c) % 900 for c in text],
    )
    return models


def _vector(*shape: int) -> dict[str, Any]:
    return encode_vector(np.random.default_rng(0).standard_normal(shape))


def _steer(**fields: Any) -> dict[str, Any]:
    return {"activations": _vector(1, HIDDEN), "layer_indices": [1], **fields}


# "abc" is 4 tokens (BOS + 3); max_tokens 4: positions 0..6 go through the model.
BASE = {"prompt": "abc", "max_tokens": 4}


def _validate(body: dict, rid: str | None = "req-1", n_layers: int = LAYERS):
    return validate_completion({**BASE, **body}, _models(n_layers), SETTINGS, rid)


def _error(body: dict, **kwargs: Any) -> AcsError:
    with pytest.raises(AcsError) as caught:
        _validate(body, **kwargs)
    assert caught.value.status == 400
    return caught.value


def test_capture_every_layer_or_a_list_ascending():
    validated = _validate({"output_residual_stream": True})
    payload = validated.activations
    assert payload is not None and payload.capture_layers == (0, 1, 2, 3)
    assert validated.engine_args["acs"] == payload.to_json()
    assert AcsPayload.from_extra_args(validated.engine_args) == payload
    assert _validate({"output_residual_stream": [3, 0]}).activations.capture_layers == (0, 3)
    # The activation fields never reach vLLM as such.
    assert "output_residual_stream" not in validated.fields


def test_plain_and_false_need_no_payload():
    assert _validate({}).activations is None
    assert _validate({"output_residual_stream": False}).activations is None
    assert _validate({"apply_steering_vectors": []}).activations is None


def test_capture_ids_are_unique_and_carry_the_request_id():
    first = _validate({"output_residual_stream": True}).activations.capture_id
    second = _validate({"output_residual_stream": True}).activations.capture_id
    assert first != second and first.startswith("req-1-")
    assert _validate({"output_residual_stream": True}, rid=None).activations.capture_id


def test_steering_payload_keeps_the_vector_and_its_settings():
    vector = _vector(2, 3, HIDDEN)
    steer = {
        "activations": vector,
        "layer_indices": [2, 0],
        "scale": 3,
        "norm_match": True,
        "position_indices": [0, -1, 5],
    }
    payload = _validate({"apply_steering_vectors": [steer]}).activations
    assert payload.capture_layers == ()
    [entry] = payload.steering
    assert entry.layer_indices == (2, 0) and entry.scale == 3.0 and entry.norm_match
    assert entry.position_indices == (0, -1, 5)
    np.testing.assert_array_equal(decode_array(entry.activations), decode_array(vector))


def test_nested_lists_are_accepted_as_the_vector():
    raw = [[0.5] * HIDDEN]
    payload = _validate({"apply_steering_vectors": [_steer(activations=raw)]}).activations
    np.testing.assert_array_equal(decode_array(payload.steering[0].activations), [[0.5] * HIDDEN])


def _entry(**fields: Any) -> dict[str, Any]:
    return {"apply_steering_vectors": [_steer(**fields)]}


P = "apply_steering_vectors.0"
CASES = [
    # (body, code, param)
    ({"output_residual_stream": [4]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": [-1]}, "invalid_request", "output_residual_stream.0"),
    ({"output_residual_stream": [1, 1]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": [True]}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": []}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": "all"}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": 1}, "invalid_request", "output_residual_stream"),
    ({"output_residual_stream": True, "n": 2, "temperature": 1}, "invalid_request", "n"),
    ({"output_residual_stream": True, "prompt": ["a", "b"]}, "invalid_request", "prompt"),
    (_entry() | {"n": 2, "temperature": 1}, "invalid_request", "n"),
    (_entry() | {"prompt": [[1, 2], [3]]}, "invalid_request", "prompt"),
    (
        {"output_residual_stream": True, "prompt": "x" * 64},
        "activation_prompt_too_long",
        "prompt",
    ),
    (
        {"output_residual_stream": True, "prompt_logprobs": -1, "prompt": "x" * 16},
        "full_vocab_prompt_too_long",
        "prompt_logprobs",
    ),
    ({"apply_steering_vectors": [_steer()] * 9}, "invalid_request", "apply_steering_vectors"),
    (_entry(layer_indices=[4]), "invalid_request", f"{P}.layer_indices"),
    (_entry(layer_indices=[-1]), "invalid_request", f"{P}.layer_indices.0"),
    (_entry(layer_indices=[True]), "invalid_request", f"{P}.layer_indices.0"),
    (_entry(layer_indices=[1, 1]), "invalid_request", f"{P}.layer_indices"),
    (_entry(layer_indices=[]), "invalid_request", f"{P}.layer_indices"),
    (_entry(layer_indices=[1, 2]), "invalid_request", f"{P}.activations"),  # rows vs layers
    (_entry(activations=_vector(1, HIDDEN + 1)), "invalid_request", f"{P}.activations"),
    (_entry(position_indices=[0]), "position_steering_unavailable", f"{P}.position_indices"),
    (_entry(activations=_vector(1, 2, HIDDEN)), "invalid_request", f"{P}.position_indices"),
    (
        _entry(activations=_vector(1, 2, HIDDEN), position_indices=[0]),
        "invalid_request",
        f"{P}.position_indices",
    ),
    (
        _entry(activations=_vector(1, 1, HIDDEN), position_indices=[7]),
        "invalid_request",
        f"{P}.position_indices",
    ),
    (
        _entry(activations=_vector(1, 1, HIDDEN), position_indices=[-5]),
        "invalid_request",
        f"{P}.position_indices",
    ),
    (
        _entry(activations=_vector(1, 2, HIDDEN), position_indices=[3, -1]),
        "invalid_request",
        f"{P}.position_indices",
    ),
    (
        _entry(activations=_vector(1, 2, HIDDEN), position_indices=[1, 1]),
        "invalid_request",
        f"{P}.position_indices",
    ),
    (_entry(scale=True), "invalid_request", f"{P}.scale"),
    (_entry(scale="2"), "invalid_request", f"{P}.scale"),
    (_entry(norm_match=1), "invalid_request", f"{P}.norm_match"),
    (_entry(extra=1), "invalid_request", f"{P}.extra"),
    (_entry(activations={**_vector(1, HIDDEN), "dtype": "float16"}), "invalid_request", None),
    (_entry(activations={**_vector(1, HIDDEN), "more": 1}), "invalid_request", None),
    (_entry(activations={**_vector(1, HIDDEN), "data": "!!"}), "invalid_request", None),
    (_entry(activations={**_vector(1, HIDDEN), "shape": [1, 8]}), "invalid_request", None),
    (_entry(activations={**_vector(1, HIDDEN), "shape": [HIDDEN]}), "invalid_request", None),
    (_entry(activations=[[True] * HIDDEN]), "invalid_request", None),
    (_entry(activations=[[1.0] * HIDDEN, [1.0]]), "invalid_request", None),
    (_entry(activations=[[1e39] * HIDDEN]), "invalid_request", None),
    (_entry(activations=[[[[1.0]]]]), "invalid_request", None),
    (_entry(activations="zzz"), "invalid_request", None),
    (_entry(activations=encode_vector(np.full((1, HIDDEN), np.inf))), "invalid_request", None),
]


@pytest.mark.parametrize(("body", "code", "param"), CASES)
def test_mismatches_are_400s_naming_the_field(body: dict, code: str, param: str | None):
    error = _error(body)
    assert error.code == code, error.message
    assert error.param == (param or f"{P}.activations"), error.message


def test_last_position_that_goes_through_the_model_is_accepted():
    steer = _steer(activations=_vector(1, 2, HIDDEN), position_indices=[6, -4])
    assert _validate({"apply_steering_vectors": [steer]}).activations is not None


def test_full_vocab_with_capture_at_the_cap():
    body = {"output_residual_stream": True, "prompt_logprobs": -1, "prompt": "x" * 15}
    assert _validate(body).activations.captures


def test_model_without_activations_refuses():
    error = _error({"output_residual_stream": True}, n_layers=0)
    assert error.code == "invalid_request"


def _buffer_models(rows: int, chunked_prefill: bool) -> NodeModels:
    models = _models()
    model = models.get("m")
    assert model is not None
    models.register(
        dataclasses.replace(model, capture_buffer_rows=rows, chunked_prefill=chunked_prefill),
        models.tokenizer("m"),
    )
    return models


def test_a_capture_that_can_never_fit_in_one_step_is_refused_at_admission():
    capture_all = {**BASE, "output_residual_stream": True}  # 4 prompt tokens x 4 layers
    # Without chunked prefill the prompt is one step: 16 rows.
    with pytest.raises(AcsError) as caught:
        validate_completion(capture_all, _buffer_models(15, False), SETTINGS, "r")
    assert caught.value.code == "activation_prompt_too_long"
    assert "16 rows" in caught.value.message and "holds 15" in caught.value.message
    assert "VLLM_ACS_CAPTURE_BUFFER_MB" in caught.value.message
    assert validate_completion(capture_all, _buffer_models(16, False), SETTINGS, "r").activations
    # With chunked prefill a step may hold one token of it: only one token's layers must fit.
    assert validate_completion(capture_all, _buffer_models(4, True), SETTINGS, "r").activations
    with pytest.raises(AcsError) as caught:
        validate_completion(capture_all, _buffer_models(3, True), SETTINGS, "r")
    assert caught.value.code == "invalid_request" and caught.value.param == "output_residual_stream"
    assert "4 rows" in caught.value.message and "VLLM_ACS_CAPTURE_BUFFER_MB" in caught.value.message
    # Steering alone takes no rows; an unknown buffer (0) is not checked here.
    assert validate_completion(
        {**BASE, "apply_steering_vectors": [_steer()]}, _buffer_models(1, False), SETTINGS, "r"
    ).activations
    assert validate_completion(capture_all, _buffer_models(0, False), SETTINGS, "r").activations


def test_the_served_model_sizes_the_capture_buffer_as_the_workers_do():
    from types import SimpleNamespace

    from vllm_acs.routes.models.service import served_model_from_engine

    model_config = SimpleNamespace(
        served_model_name="org/m",
        get_vocab_size=lambda: 1000,
        max_logprobs=20,
        max_model_len=2048,
        get_num_layers=lambda parallel: 32,
        get_hidden_size=lambda: 4096,
    )
    for chunked in (True, False):
        vllm_config = SimpleNamespace(
            parallel_config=None,
            speculative_config=None,
            scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked),
        )
        settings = Settings.load(environ={"VLLM_ACS_GPU_SHAPE": "1xGPU"})
        model = served_model_from_engine(model_config, vllm_config, settings)
        # 256 MB (the default) / (2 x 4096): the rows hooks/intervention_buffers.py allocates.
        assert model.capture_buffer_rows == 32768 and model.chunked_prefill is chunked
