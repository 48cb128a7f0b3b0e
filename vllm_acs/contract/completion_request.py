"""The strict pydantic model of a POST /v1/completions body, and its errors in the spec's words.

API server process. `extra="forbid"` and strict types: unknown fields, booleans or strings in
numeric fields and out-of-range values are refused; a JSON integer is accepted for a float.
Checks that need the model or the tokenizer live in `completion_rules.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from ..errors import InvalidRequest, echoed
from .activation_fields import (
    OutputResidualStream,
    SteeringVectors,
    check_output_residual_stream,
    check_steering_vectors,
)

# The largest integer the engine takes in a sampling field: a signed 64-bit one (a top_k of 2^64
# failed inside vLLM with a 500; any top_k past the vocabulary keeps every token).
INT64_MAX = 2**63 - 1
SEED_MAX = INT64_MAX
TOP_K_MAX = INT64_MAX

_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMA = {
    "description": "Text, a batch of texts, token ids, or a batch of token-id lists. Empty lists "
    "and mixed lists are refused; the empty string is accepted (BOS only).",
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
    ],
}
TOP_K_SCHEMA = {
    "oneOf": [
        {"type": "integer", "enum": [-1]},
        {"type": "integer", "minimum": 1, "maximum": TOP_K_MAX},
    ]
}
STOP_SCHEMA = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    ]
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="CompletionRequest")

    model: str | None = Field(None, description="Short id from GET /v1/models; default if omitted")
    prompt: Annotated[Any, WithJsonSchema(PROMPT_SCHEMA)]
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    stop: Annotated[str | list[str] | None, WithJsonSchema(STOP_SCHEMA)] = None
    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int | None, WithJsonSchema(TOP_K_SCHEMA)] = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=100)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=-1, le=100)] | None = None
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    add_special_tokens: bool = True
    output_residual_stream: OutputResidualStream | None = None
    apply_steering_vectors: SteeringVectors | None = None

    @field_validator("output_residual_stream")
    @classmethod
    def _residual_stream_layers(cls, value: bool | list[int] | None) -> bool | list[int] | None:
        return check_output_residual_stream(value)

    @field_validator("apply_steering_vectors")
    @classmethod
    def _at_most_eight_vectors(cls, value: SteeringVectors | None) -> SteeringVectors | None:
        return check_steering_vectors(value)

    @field_validator("top_k")
    @classmethod
    def _top_k_is_minus_one_or_in_range(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and not 1 <= value <= TOP_K_MAX:
            raise ValueError(f"must be -1 (disabled) or from 1 to {TOP_K_MAX}")
        return value

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError(f"must hold at most 4 strings, got {len(value)}")
        return value


Body = TypeVar("Body", bound=BaseModel)


def parse_body(model: type[Body], data: Any) -> Body:
    """A strict body (completions, harvests, Looms) validated, or `InvalidRequest` naming the
    first offending field."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_request_from(exc) from None


def parse_completion_request(data: Any) -> CompletionRequest:
    return parse_body(CompletionRequest, data)


def _field_path(loc: tuple[Any, ...], *, client_key_last: bool = False) -> str:
    """Union members show up in `loc` as type tags ("str", "list[str]"): not part of the path.
    With `client_key_last` the last part is the client's own key (an unknown field), kept
    whatever it looks like ("max-tokens", "str")."""
    head = loc[:-1] if client_key_last and loc else loc
    parts = [str(p) for p in head if isinstance(p, int) or not _is_type_tag(str(p))]
    if client_key_last and loc:
        parts.append(str(loc[-1]))
    return ".".join(parts) or "body"


def _is_type_tag(part: str) -> bool:
    return part in {"str", "int", "float", "bool", "list", "dict", "none"} or any(
        c in part for c in "[-("
    )


# Fields whose value may take several shapes: what a wrong type is told it should be.
_UNION_WORDS = {
    "stop": "a string or a list of at most 4 strings",
    "output_residual_stream": "true, false or a list of layer indices",
}

_TYPE_WORDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
}


def invalid_request_from(exc: ValidationError) -> InvalidRequest:
    errors = exc.errors()
    # A union reports one error per member; a bound or rule error says more than a type error.
    error = next((e for e in errors if not e["type"].endswith("_type")), errors[0])
    kind = error["type"]
    field = _field_path(error["loc"], client_key_last=kind == "extra_forbidden")
    if kind == "extra_forbidden":  # the client's own key, of any length
        return InvalidRequest(f"Unknown field '{echoed(field)}'.", param=echoed(field))
    if kind == "missing":
        return InvalidRequest(f"Missing required field '{field}'.", param=field)
    if kind in _TYPE_WORDS:
        expected = _TYPE_WORDS[kind]
        if field in _UNION_WORDS or len({e["type"] for e in errors}) > 1:
            expected = _UNION_WORDS.get(field, "one of the documented types")
        return InvalidRequest(f"Invalid type for '{field}': expected {expected}.", param=field)
    rule = error.get("ctx", {}).get("error")
    if rule is not None:  # one of this module's validators: its message already says enough
        return InvalidRequest(f"Invalid value for '{field}': {rule}.", param=field)
    message = error["msg"]
    return InvalidRequest(
        f"Invalid value for '{field}': {message[0].lower() + message[1:]}, "
        f"got {_short(error.get('input'))}.",
        param=field,
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
