"""The response shapes of /v1/models and /v1/models/{id}/status, as the spec documents them
(also their OpenAPI schema).

API server process.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelCapabilities(BaseModel):
    max_model_len: int | None
    max_logprobs: int
    logprobs: bool
    prompt_logprobs: bool
    prompt_logprobs_full_vocab: bool
    full_vocab_max_prompt_tokens: int
    activations: bool
    max_activation_prompt_tokens: int
    chat_template: None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vllm-acs"
    served_model_name: str
    status: Literal["live"] = "live"
    default: bool
    gpu_shape: str
    capabilities: ModelCapabilities


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ModelStatus(BaseModel):
    id: str
    warm: bool = Field(description="A live node of the deployment serves the model")
    nodes: int = Field(ge=0, description="How many live nodes serve the model")
