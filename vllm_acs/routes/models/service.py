"""Builds what /v1/models says from the node's `ServedModel`s, and those from vLLM's config.

API server process.
"""

from __future__ import annotations

from typing import Any

from ...activations.store import capture_buffer_rows
from ...served_model import ServedModel, Tokenize, short_id_for
from ...settings import Settings
from .protocol import ModelCapabilities, ModelCard, ModelList


def model_card(model: ServedModel) -> ModelCard:
    return ModelCard(
        id=model.id,
        created=model.created,
        served_model_name=model.checkpoint,
        default=model.default,
        gpu_shape=model.gpu_shape,
        capabilities=ModelCapabilities(
            max_model_len=model.max_model_len,
            max_logprobs=model.max_logprobs,
            logprobs=True,
            prompt_logprobs=True,
            prompt_logprobs_full_vocab=model.full_vocab_max_prompt_tokens > 0,
            full_vocab_max_prompt_tokens=model.full_vocab_max_prompt_tokens,
            activations=model.n_layers > 0,
            max_activation_prompt_tokens=model.max_activation_prompt_tokens,
        ),
    )


def model_list(models: list[ServedModel]) -> ModelList:
    return ModelList(data=[model_card(m) for m in models])


def detect_gpu_shape(vllm_config: Any) -> str:
    """`cpu` on the CPU build; `<n>x<device name>` on accelerators (e.g. `1xNVIDIA H200`)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    world = vllm_config.parallel_config.world_size
    try:
        name = current_platform.get_device_name()
    except Exception:  # some platforms cannot name the device before a worker owns it
        name = current_platform.device_name
    return f"{world}x{name}"


def served_model_from_engine(
    model_config: Any, vllm_config: Any, settings: Settings
) -> ServedModel:
    """The model as clients see it, from vLLM's ModelConfig and the plugin's settings.

    vLLM's own `max_logprobs` bounds what the plugin can promise: -1 there means the whole
    vocabulary, which full-vocab prompt logprobs need.
    """
    checkpoint = model_config.served_model_name
    if isinstance(checkpoint, list):
        checkpoint = checkpoint[0]
    vocab = model_config.get_vocab_size()
    engine_cap = vocab if model_config.max_logprobs == -1 else model_config.max_logprobs
    short_id = settings.model_id or short_id_for(checkpoint)
    return ServedModel(
        id=short_id,
        checkpoint=checkpoint,
        max_model_len=model_config.max_model_len,
        max_logprobs=min(settings.max_logprobs, engine_cap),
        gpu_shape=settings.gpu_shape or detect_gpu_shape(vllm_config),
        full_vocab_max_prompt_tokens=settings.full_vocab_max_prompt_tokens
        if engine_cap >= vocab
        else 0,
        vocab_size=vocab,
        high_temperature=getattr(vllm_config, "speculative_config", None) is None,
        # The hooks refuse pipeline parallelism, so every decoder block runs in each worker.
        n_layers=model_config.get_num_layers(vllm_config.parallel_config),
        hidden_size=model_config.get_hidden_size(),
        max_activation_prompt_tokens=min(
            settings.max_activation_prompt_tokens, model_config.max_model_len
        ),
        # As the workers size it (hooks/intervention_buffers.py), so that admission refuses a
        # capture that can never fit in one step.
        capture_buffer_rows=capture_buffer_rows(
            settings.capture_buffer_mb, model_config.get_hidden_size()
        ),
        chunked_prefill=bool(
            getattr(getattr(vllm_config, "scheduler_config", None), "enable_chunked_prefill", True)
        ),
        default=settings.default_model in (None, short_id),
    )


def tokenizer_of(engine_client: Any) -> Tokenize:
    """Counts tokens with the very tokenizer vLLM uses for the model."""
    tokenizer = engine_client.get_tokenizer()

    def tokenize(text: str, add_special_tokens: bool) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

    return tokenize
