"""The strict bodies of the Loom routes (shared/spec/DECISIONS.md "Looms"): an unknown field, a
wrong type or a bound outside the limits is a 400 naming the field.

API server process (the Loom routes; also the OpenAPI schemas). Pure pydantic. A branch takes
the sampling fields of `/v1/completions` with their bounds; the service then validates the
completion it makes of them like any other (context length, logprobs cap, output work).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, create_model

from .completion_request import CompletionRequest

TITLE_MAX_CHARS = 200

# What a branch may set: a completion's sampling, without prompt (the path's text) or capture.
BRANCH_FIELDS = (
    "model",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "seed",
    "stop",
    "stream",
)
_STRICT = ConfigDict(extra="forbid", strict=True)
_FIELDS = CompletionRequest.model_fields

LoomBranchBody: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "LoomBranchBody",
    __config__=_STRICT,
    **{name: (_FIELDS[name].annotation, _FIELDS[name]) for name in BRANCH_FIELDS},
)

Title = Annotated[str, Field(max_length=TITLE_MAX_CHARS)]


class LoomCreateBody(BaseModel):
    model_config = _STRICT

    prompt: str = Field(description="The root's text, verbatim (no generation happens)")
    title: Title | None = None


class LoomPatchBody(BaseModel):
    model_config = _STRICT

    title: Title | None = Field(description="The new title; null clears it")


class NodePatchBody(BaseModel):
    model_config = _STRICT

    text: str | None = Field(None, description="New text; the Node's tokens and logprobs go")
    bookmarked: bool | None = None


class NodeSplitBody(BaseModel):
    model_config = _STRICT

    offset: int = Field(ge=1, description="Characters kept by the Node; the rest, a new child")
    text: str | None = Field(None, description="The Node's edited text, split in the same step")


class NodeTextBody(BaseModel):
    model_config = _STRICT

    text: str = Field(description="The hand-written Node's text")


class NodeScoreBody(BaseModel):
    model_config = _STRICT

    model: str | None = Field(None, description="Short id from GET /v1/models; default if omitted")
    logprobs: int = Field(0, ge=0, le=100, description="Alternatives kept per token")
