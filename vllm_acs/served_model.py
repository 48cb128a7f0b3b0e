"""What this node serves, as clients see it: the short id, the checkpoint and its limits.

A leaf module (no vLLM, no FastAPI): the API server builds one `ServedModel` from vLLM's model
config at start-up, and the middleware and routes read it through `NodeModels`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServedModel:
    id: str  # the short id clients send
    checkpoint: str  # vLLM's served model name; the `model` of every response
    max_model_len: int
    max_logprobs: int
    gpu_shape: str
    full_vocab_max_prompt_tokens: int
    vocab_size: int = 0
    # Temperatures above vLLM's cap of 2 need the plugin's logits processor, which vLLM does not
    # load under speculative decoding.
    high_temperature: bool = True
    # Decoder blocks and residual-stream width, for capture and steering; 0: activations are off.
    n_layers: int = 0
    hidden_size: int = 0
    max_activation_prompt_tokens: int = 0
    # Each worker's capture buffer in rows (one token at one layer), all of one step's captures
    # together (VLLM_ACS_CAPTURE_BUFFER_MB); 0: unknown, not checked at admission. With chunked
    # prefill off, a prompt goes through the model in one step.
    capture_buffer_rows: int = 0
    chunked_prefill: bool = True
    default: bool = True
    created: int = field(default_factory=lambda: int(time.time()))


def short_id_for(checkpoint: str) -> str:
    """A short id from a checkpoint name or path: its last part, lower-case, e.g. `llama-3.1-8b`."""
    last = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", last.lower()).strip("-")
    return cleaned or "model"


# (text, add_special_tokens) -> token ids, with the tokenizer vLLM itself uses for the model.
Tokenize = Callable[[str, bool], list[int]]


class NodeModels:
    """The models of this node, filled once the engine is up (before the first request)."""

    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._tokenizers: dict[str, Tokenize] = {}

    def register(self, model: ServedModel, tokenize: Tokenize | None = None) -> None:
        self._models[model.id] = model
        if tokenize is not None:
            self._tokenizers[model.id] = tokenize

    def tokenizer(self, model_id: str) -> Tokenize:
        return self._tokenizers[model_id]

    def all(self) -> list[ServedModel]:
        return list(self._models.values())

    def get(self, model_id: str) -> ServedModel | None:
        return self._models.get(model_id)

    def default(self) -> ServedModel | None:
        """The model a request without `model` means, when this node serves it."""
        return next((m for m in self._models.values() if m.default), None)

    def own(self) -> ServedModel | None:
        """The model this node serves (what it announces to the deployment)."""
        return next(iter(self._models.values()), None)
