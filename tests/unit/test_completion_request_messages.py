"""The 400 messages of the strict completion schema name the client's field and what it takes."""

from __future__ import annotations

import pytest

from vllm_acs.contract.completion_request import parse_completion_request
from vllm_acs.errors import InvalidRequest


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        # An unknown key is named as the client wrote it, even when it looks like a type tag.
        ({"max-tokens": 5}, "max-tokens", "Unknown field 'max-tokens'."),
        ({"str": 1}, "str", "Unknown field 'str'."),
        (
            {"stream_options": {"include-usage": True}},
            "stream_options.include-usage",
            "Unknown field 'stream_options.include-usage'.",
        ),
        # A field of several shapes says which shapes.
        ({"stop": 5}, "stop", "expected a string or a list of at most 4 strings."),
        ({"stop": ["a", 1]}, "stop", "expected a string or a list of at most 4 strings."),
        (
            {"output_residual_stream": "all"},
            "output_residual_stream",
            "expected true, false or a list of layer indices.",
        ),
        ({"max_tokens": "5"}, "max_tokens", "Invalid type for 'max_tokens': expected an integer."),
    ],
)
def test_the_message_names_the_field_and_what_it_takes(body, param, message):
    with pytest.raises(InvalidRequest) as refused:
        parse_completion_request({"prompt": "a", **body})
    assert refused.value.param == param
    assert refused.value.message.endswith(message)
