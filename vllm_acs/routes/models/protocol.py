"""The response shapes of /v1/models, as the spec documents them (also their OpenAPI schema).

API server process.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


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
