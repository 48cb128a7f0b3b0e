"""The strict `POST /v1/harvest` body (shared/spec/DECISIONS.md "Harvests"): an unknown field,
a wrong type or a bound outside the limits is a 400 naming the field.

API server process (the harvest route; also the OpenAPI schema). Pure pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .completion_request import parse_body

MAX_HARVEST_PROMPTS = 4096
MAX_HARVEST_TOKENS = 2_000_000
HARVEST_BODY_LIMIT_BYTES = 50_000_000

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
PromptText = Annotated[str, Field(min_length=1)]


class HarvestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="The model's short id, as /v1/models lists it")
    prompts: list[PromptText | TokenIds] = Field(
        min_length=1,
        max_length=MAX_HARVEST_PROMPTS,
        description="Strings, or lists of token ids; a prompt longer than the context is cut",
    )
    layers: list[Annotated[int, Field(ge=0)]] | Literal["all"] | None = Field(
        None,
        description='Block indices to keep; "all" keeps every block; omitted: the quartile '
        "blocks (n_layers // 4 * k for k = 1, 2, 3)",
    )
    shard_size: int = Field(32, ge=1, le=MAX_HARVEST_PROMPTS, description="Prompts per shard")
    batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_HARVEST_PROMPTS,
        description="Accepted and recorded; the engine batches continuously on its own",
    )


def parse_harvest_body(data: Any) -> HarvestBody:
    return parse_body(HarvestBody, data)
