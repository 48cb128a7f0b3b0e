"""completion_rules.validate_completion at its boundaries, with a stand-in tokenizer."""

from __future__ import annotations

import pytest

from vllm_acs.contract.completion_rules import validate_completion
from vllm_acs.errors import AcsError
from vllm_acs.served_model import NodeModels, ServedModel
from vllm_acs.settings import Settings

SETTINGS = Settings.load(environ={})


def _models(max_model_len: int = 40000) -> NodeModels:
    models = NodeModels()
    models.register(
        ServedModel(
            id="m",
            checkpoint="org/m",
            max_model_len=max_model_len,
            max_logprobs=20,
            gpu_shape="cpu",
            full_vocab_max_prompt_tokens=256,
            vocab_size=1000,
        ),
        # One token per character, plus BOS (id 0) when asked.
        lambda text, special: ([0] if special else []) + [1 + ord(c) % 900 for c in text],
    )
    return models


def _validate(body: dict, max_model_len: int = 40000, settings: Settings = SETTINGS):
    return validate_completion(body, _models(max_model_len), settings)


def _code(body: dict, **kwargs) -> str:
    with pytest.raises(AcsError) as caught:
        _validate(body, **kwargs)
    return caught.value.code


def test_default_is_injected_and_clamped_to_the_deadline():
    validated = _validate({"prompt": "abc"})
    assert validated.max_tokens == 15600
    assert validated.max_tokens_source == "default"
    assert validated.clamp_header() == (
        "requested=32000,applied=15600,reason=deadline,source=default"
    )


def test_default_fits_the_context():
    validated = _validate({"prompt": "abc"}, max_model_len=2048)
    assert validated.max_tokens == 2048 - 4
    assert validated.clamp_header() is None


def test_streaming_keeps_the_full_default():
    validated = _validate({"prompt": "abc", "stream": True})
    assert validated.max_tokens == 32000
    assert validated.clamp_header() is None


def test_deadline_boundary():
    assert _validate({"prompt": "a", "max_tokens": 15600}).max_tokens == 15600
    assert _code({"prompt": "a", "max_tokens": 15601}) == "deadline_infeasible"
    assert _validate({"prompt": "a", "max_tokens": 15601, "stream": True}).max_tokens == 15601


def test_output_work_cap_boundary():
    body = {"prompt": ["a", "b"], "n": 16, "max_tokens": 1000, "temperature": 1}
    assert _validate(body).worst_case_output_tokens == 32000
    assert _code({**body, "max_tokens": 1001}) == "invalid_request"


def test_logprobs_against_the_model_cap():
    assert _validate({"prompt": "a", "max_tokens": 1, "logprobs": 20}).fields["logprobs"] == 20
    assert _code({"prompt": "a", "max_tokens": 1, "logprobs": 21}) == "invalid_request"
    assert _code({"prompt": "a", "max_tokens": 1, "prompt_logprobs": 21}) == "invalid_request"


def test_context_length_uses_the_longest_prompt():
    assert _validate({"prompt": [[1] * 30, [1] * 10], "max_tokens": 10}, max_model_len=40)
    with pytest.raises(AcsError) as caught:
        _validate({"prompt": [[1] * 31, [1] * 10], "max_tokens": 10}, max_model_len=40)
    assert caught.value.code == "context_length_exceeded"
    assert "41" in caught.value.message


def test_empty_text_goes_to_the_engine_as_bos():
    assert _validate({"prompt": "", "max_tokens": 1}).fields["prompt"] == [0]
    assert _validate({"prompt": ["", "a"], "max_tokens": 1}).fields["prompt"] == [[0], [0, 98]]
    # Without special tokens there is nothing to send: the engine's own refusal follows.
    assert (
        _validate({"prompt": "", "max_tokens": 1, "add_special_tokens": False}).fields["prompt"]
        == ""
    )


def test_prompt_tokens_count_every_prompt():
    validated = _validate({"prompt": ["ab", "c"], "max_tokens": 1})
    assert validated.prompt_tokens == 3 + 2
    assert validated.prompt_count == 2


def test_fields_keep_the_request_without_model_and_max_tokens():
    validated = _validate({"model": "m", "prompt": "a", "max_tokens": 3, "temperature": 0.5})
    assert validated.fields == {"prompt": "a", "temperature": 0.5}
    assert validated.model.checkpoint == "org/m"


def test_operator_settings_change_the_numbers():
    settings = Settings.load(environ={"VLLM_ACS_DEADLINE_MAX_TOKENS": "10"})
    validated = _validate({"prompt": "a"}, settings=settings)
    assert validated.max_tokens == 10
    assert _code({"prompt": "a", "max_tokens": 11}, settings=settings) == "deadline_infeasible"
