"""The /v1/completions rules that need the model, the tokenizer or several fields at once.

API server process. `validate_completion` turns a parsed JSON body into a `ValidatedCompletion`
or raises the spec's error; the order of the checks decides which error a client sees first.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    ContextLengthExceeded,
    DeadlineInfeasible,
    FullVocabPromptTooLong,
    InvalidRequest,
    UnknownModel,
    echoed,
)
from ..served_model import NodeModels, ServedModel
from ..settings import Settings
from .activation_rules import activation_payload
from .completion_request import CompletionRequest, parse_completion_request
from .prompts import PromptBatch, parse_prompt
from .validated import ValidatedCompletion

# vLLM's own cap, and the `vllm_xargs` key that hooks/temperature.py reads for the rest.
ENGINE_MAX_TEMPERATURE = 2.0
TEMPERATURE_SCALE_ARG = "acs_temperature_scale"

# Fields that never go to vLLM as the client sent them: the Rewrite stage sets them, or (the
# activation fields) they travel to the workers in `vllm_xargs`.
_REWRITTEN = {"model", "max_tokens", "output_residual_stream", "apply_steering_vectors"}


def resolve_model(request: CompletionRequest, models: NodeModels) -> ServedModel:
    if request.model is None:
        served = models.default()
        if served is None:
            raise UnknownModel("No default model is being served.", param="model")
        return served
    served = models.get(request.model)
    if served is None:
        known = ", ".join(m.id for m in models.all())
        raise UnknownModel(
            f"The model '{echoed(request.model)}' does not exist. "
            f"Use a short id from GET /v1/models: {known}.",
            param="model",
        )
    return served


def _check_streaming_fields(request: CompletionRequest) -> None:
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "'stream_options' is accepted only together with 'stream': true.",
            param="stream_options",
        )
    if request.stream and request.prompt_logprobs not in (None, 0):
        raise InvalidRequest(
            "'prompt_logprobs' other than 0 is not available with 'stream': true; prompt "
            "logprobs come back only in the non-streaming body.",
            param="prompt_logprobs",
        )


def _check_logprobs(request: CompletionRequest, model: ServedModel) -> None:
    if request.logprobs is not None and request.logprobs > model.max_logprobs:
        raise InvalidRequest(
            f"'logprobs' may be at most {model.max_logprobs} for this model "
            f"(capabilities.max_logprobs), got {request.logprobs}.",
            param="logprobs",
        )
    if request.prompt_logprobs is not None and request.prompt_logprobs > model.max_logprobs:
        raise InvalidRequest(
            f"'prompt_logprobs' may be at most {model.max_logprobs} for this model "
            f"(capabilities.max_logprobs), got {request.prompt_logprobs}.",
            param="prompt_logprobs",
        )


def _check_full_vocab(
    request: CompletionRequest,
    model: ServedModel,
    prompts: PromptBatch,
    capture_cap: int | None,
) -> None:
    """`capture_cap`: the lower cap that applies when the request also captures activations."""
    if request.prompt_logprobs != -1:
        return
    cap = model.full_vocab_max_prompt_tokens
    if cap == 0:
        raise InvalidRequest(
            "'prompt_logprobs': -1 (the full vocabulary) is not available on this model "
            "(capabilities.prompt_logprobs_full_vocab is false).",
            param="prompt_logprobs",
        )
    counted = prompts.total_tokens * request.n
    if capture_cap is not None and cap > 0 and counted > capture_cap:
        raise FullVocabPromptTooLong(
            f"'prompt_logprobs': -1 together with 'output_residual_stream' allows at most "
            f"{capture_cap} prompt tokens; this request has {counted}. Use a fixed top-k "
            "instead, or capture in a separate request.",
            param="prompt_logprobs",
        )
    if counted > cap:
        raise FullVocabPromptTooLong(
            f"'prompt_logprobs': -1 allows at most {cap} prompt tokens x n per request "
            f"(capabilities.full_vocab_max_prompt_tokens); this request has {counted}. "
            "Use a fixed top-k instead.",
            param="prompt_logprobs",
        )


def _high_temperature(
    request: CompletionRequest, model: ServedModel, fields: dict[str, Any]
) -> dict[str, Any]:
    """vLLM refuses temperatures above 2: it gets 2, the worker divides the logits by the rest."""
    if request.temperature is None or request.temperature <= ENGINE_MAX_TEMPERATURE:
        return {}
    if not model.high_temperature:
        raise InvalidRequest(
            f"'temperature' above {ENGINE_MAX_TEMPERATURE:g} is not available on this deployment "
            "(speculative decoding is on).",
            param="temperature",
        )
    fields["temperature"] = ENGINE_MAX_TEMPERATURE
    return {TEMPERATURE_SCALE_ARG: request.temperature / ENGINE_MAX_TEMPERATURE}


def _max_tokens(
    request: CompletionRequest, model: ServedModel, prompts: PromptBatch, settings: Settings
) -> tuple[int, int, str]:
    """(requested, applied, source): the client's value or the injected default, and what the
    deadline rule leaves of it."""
    if request.max_tokens is not None:
        if not request.stream and request.max_tokens > settings.deadline_max_tokens:
            raise DeadlineInfeasible(
                f"'max_tokens' of {request.max_tokens} cannot finish inside the request window "
                f"without streaming: ask for at most {settings.deadline_max_tokens}, or send "
                "'stream': true.",
                param="max_tokens",
            )
        return request.max_tokens, request.max_tokens, "client"
    if prompts.count != 1 or request.n != 1:
        raise InvalidRequest(
            "'max_tokens' is required when the request has several prompts or n > 1.",
            param="max_tokens",
        )
    room = model.max_model_len - prompts.total_tokens
    if room < 1:
        raise _context_length(model, prompts.total_tokens, 1)
    injected = min(settings.default_max_tokens, room)
    applied = injected if request.stream else min(injected, settings.deadline_max_tokens)
    return injected, applied, "default"


def _context_length(
    model: ServedModel, prompt_tokens: int, max_tokens: int
) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        f"This model's maximum context length is {model.max_model_len} tokens; the request asks "
        f"for {prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to "
        "generate). Shorten the prompt or lower max_tokens.",
        param="prompt",
    )


def validate_completion(
    data: Any, models: NodeModels, settings: Settings, request_id: str | None = None
) -> ValidatedCompletion:
    """The request as the rest of the pipeline sees it, or the error the client gets.

    `request_id` (X-Request-Id) prefixes the capture id of an activation request."""
    request = parse_completion_request(data)
    model = resolve_model(request, models)
    _check_streaming_fields(request)
    prompts = parse_prompt(
        request.prompt, models.tokenizer(model.id), request.add_special_tokens, model.vocab_size
    )
    requested, max_tokens, source = _max_tokens(request, model, prompts, settings)
    work = prompts.count * request.n * max_tokens
    if work > settings.max_output_work:
        raise InvalidRequest(
            f"prompt_count x n x max_tokens = {prompts.count} x {request.n} x {max_tokens} = "
            f"{work} exceeds the per-request cap of {settings.max_output_work} output tokens.",
            param="max_tokens",
        )
    _check_logprobs(request, model)
    payload = activation_payload(request, model, prompts, max_tokens, request_id)
    capturing = payload is not None and payload.captures
    capture_cap = settings.full_vocab_max_prompt_tokens_with_capture if capturing else None
    _check_full_vocab(request, model, prompts, capture_cap)
    longest = max(len(ids) for ids in prompts.token_ids)
    if longest + max_tokens > model.max_model_len:
        raise _context_length(model, longest, max_tokens)

    fields = request.model_dump(exclude_unset=True, exclude=_REWRITTEN)
    engine_args = _high_temperature(request, model, fields)
    if payload is not None:
        engine_args.update(payload.to_extra_args())
    if prompts.has_empty_text and all(prompts.token_ids):
        # vLLM refuses "" although it means BOS alone: send what it tokenizes to instead.
        fields["prompt"] = prompts.as_token_ids()
    validated = ValidatedCompletion(
        model=model,
        fields=fields,
        prompt_count=prompts.count,
        prompt_tokens=prompts.total_tokens,
        n=request.n,
        max_tokens=requested,
        max_tokens_source=source,  # type: ignore[arg-type]
        stream=request.stream,
        engine_args=engine_args,
        activations=payload,
    )
    validated.clamp(max_tokens, "deadline")
    return validated
