"""The capture and steering rules that need the model: layers, hidden size, positions, prompt cap.

API server process. `activation_payload` checks a request's activation fields against the served
model and builds the `AcsPayload` the workers receive; every mismatch is a 400 naming the field,
so the workers' own re-check (which marks the capture failed: a 502) never fires on client input.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..activations.codec import CodecError, decode_bits
from ..activations.payload import AcsPayload, SteeringEntry
from ..errors import (
    REQUEST_ID_PATTERN,
    ActivationPromptTooLong,
    InvalidRequest,
    PositionSteeringUnavailable,
)
from ..served_model import ServedModel
from .activation_fields import SteeringVector
from .completion_request import CompletionRequest
from .prompts import PromptBatch

# Decoded steering vectors of one request, together: a small body can inflate (zstd) to a lot.
MAX_STEERING_BYTES = 256 * 1024 * 1024
_BF16_EXPONENT = np.uint16(0x7F80)


def new_capture_id(request_id: str | None) -> str:
    """Unique per request (a client may reuse its X-Request-Id): the id plus random bits."""
    suffix = secrets.token_hex(6)
    if request_id and REQUEST_ID_PATTERN.fullmatch(request_id):
        return f"{request_id}-{suffix}"
    return f"acs-{suffix}"


def capture_layers(request: CompletionRequest, model: ServedModel) -> tuple[int, ...]:
    value = request.output_residual_stream
    if value is None or value is False:
        return ()
    if value is True:
        return tuple(range(model.n_layers))
    for layer in value:
        if layer >= model.n_layers:
            raise InvalidRequest(
                f"'output_residual_stream' names layer {layer}; this model has layers 0 to "
                f"{model.n_layers - 1}.",
                param="output_residual_stream",
            )
    return tuple(sorted(value))


def _check_single_sequence(request: CompletionRequest, prompts: PromptBatch) -> None:
    if prompts.count != 1:
        raise InvalidRequest(
            "Activation capture and steering take one prompt; send one request per prompt.",
            param="prompt",
        )
    if request.n != 1:
        raise InvalidRequest(
            "Activation capture and steering take n = 1; send several requests (vary 'seed').",
            param="n",
        )


def _check_positions(
    where: str, positions: list[int], prompt_len: int, max_tokens: int
) -> tuple[int, ...]:
    # Positions [0, prompt + max_tokens - 1) go through the model; the last sampled token never
    # does. p < 0 counts back from the end of the prompt (DECISIONS.md).
    end = prompt_len + max_tokens - 1
    resolved = []
    for p in positions:
        absolute = p if p >= 0 else prompt_len + p
        if p >= end:
            raise InvalidRequest(
                f"'{where}' holds {p}, but only positions 0 to {end - 1} go through the model "
                f"({prompt_len} prompt tokens, max_tokens {max_tokens}).",
                param=where,
            )
        if absolute < 0:
            raise InvalidRequest(
                f"'{where}' holds {p}, before the first of the prompt's {prompt_len} tokens.",
                param=where,
            )
        resolved.append(absolute)
    if len(set(resolved)) != len(resolved):
        raise InvalidRequest(f"'{where}' names one position twice.", param=where)
    return tuple(positions)


def _steering_entry(
    number: int, vector: SteeringVector, model: ServedModel, prompt_len: int, max_tokens: int
) -> SteeringEntry:
    where = f"apply_steering_vectors.{number}"
    shape, layers = vector.shape, vector.layer_indices
    for layer in layers:
        if layer >= model.n_layers:
            raise InvalidRequest(
                f"'{where}.layer_indices' names layer {layer}; this model has layers 0 to "
                f"{model.n_layers - 1}.",
                param=f"{where}.layer_indices",
            )
    if shape[0] != len(layers):
        raise InvalidRequest(
            f"'{where}.activations' has {shape[0]} rows (shape[0]) but 'layer_indices' names "
            f"{len(layers)} layers: one row per steered layer.",
            param=f"{where}.activations",
        )
    if shape[-1] != model.hidden_size:
        raise InvalidRequest(
            f"'{where}.activations' has hidden size {shape[-1]}; this model's is "
            f"{model.hidden_size}.",
            param=f"{where}.activations",
        )
    positions = vector.position_indices
    if positions is not None and len(shape) == 2:
        raise PositionSteeringUnavailable(
            f"'{where}.position_indices' needs a 3-D vector (n_layers, n_positions, hidden); "
            f"with the 2-D shape {list(shape)} the positions would be ignored.",
            param=f"{where}.position_indices",
        )
    if positions is None and len(shape) == 3:
        raise InvalidRequest(
            f"'{where}.activations' is 3-D {list(shape)}: give 'position_indices' with "
            f"{shape[1]} positions, or send a 2-D vector to steer every position.",
            param=f"{where}.position_indices",
        )
    if positions is not None:
        if shape[1] != len(positions):
            raise InvalidRequest(
                f"'{where}.activations' holds {shape[1]} positions (shape[1]) but "
                f"'position_indices' names {len(positions)}.",
                param=f"{where}.position_indices",
            )
        positions = list(
            _check_positions(f"{where}.position_indices", positions, prompt_len, max_tokens)
        )
    try:
        bits = decode_bits(vector.activations)
    except CodecError as exc:
        raise InvalidRequest(
            f"'{where}.activations' cannot be decoded: {exc}.", param=f"{where}.activations"
        ) from None
    if ((bits & _BF16_EXPONENT) == _BF16_EXPONENT).any():
        raise InvalidRequest(
            f"'{where}.activations' holds infinite or NaN values.", param=f"{where}.activations"
        )
    return SteeringEntry(
        activations=vector.activations,
        layer_indices=tuple(layers),
        scale=vector.scale,
        norm_match=vector.norm_match,
        position_indices=None if positions is None else tuple(positions),
    )


def _check_capture_fits(n_layers: int, prompt_len: int, model: ServedModel) -> None:
    """Refuses, before any engine work, a capture that can never fit in one step of the
    workers' capture buffer (rows = tokens in a step x layers captured; the buffer holds all of
    one step's captures). Only what can never fit: with chunked prefill (vLLM's default) the
    scheduler may give a request any number of tokens in a step, down to one, so only one
    token's layers can be certain not to fit; without it, the whole prompt goes in one step. A
    capture that fits only in a smaller chunk than vLLM gives it fails in the worker (a 502
    naming the setting and the rows that step needed)."""
    rows = model.capture_buffer_rows
    if rows <= 0:
        return
    if n_layers > rows:
        raise InvalidRequest(
            f"This capture needs {n_layers} rows of the node's capture buffer for each token "
            f"(one per layer captured) and the buffer holds {rows} "
            "(VLLM_ACS_CAPTURE_BUFFER_MB; rows = tokens in a step x layers): capture fewer "
            "layers, or ask the operator to raise it.",
            param="output_residual_stream",
        )
    if not model.chunked_prefill and prompt_len * n_layers > rows:
        raise ActivationPromptTooLong(
            f"This capture needs {prompt_len * n_layers} rows of the node's capture buffer in "
            f"one step ({prompt_len} prompt tokens x {n_layers} layers: this node runs a "
            f"prompt in one step) and the buffer holds {rows} (VLLM_ACS_CAPTURE_BUFFER_MB; "
            "rows = tokens in a step x layers): capture fewer layers or send a shorter "
            "prompt, or ask the operator to raise it.",
            param="prompt",
        )


def activation_payload(
    request: CompletionRequest,
    model: ServedModel,
    prompts: PromptBatch,
    max_tokens: int,
    request_id: str | None,
) -> AcsPayload | None:
    """The workers' payload for a capture/steer request, None for a plain one; or the 400."""
    vectors = request.apply_steering_vectors or []
    if not vectors and request.output_residual_stream in (None, False):
        return None
    if model.n_layers <= 0:
        raise InvalidRequest(
            "Activation capture and steering are not available on this model "
            "(capabilities.activations is false).",
            param="output_residual_stream" if not vectors else "apply_steering_vectors",
        )
    layers = capture_layers(request, model)
    _check_single_sequence(request, prompts)
    prompt_len = prompts.total_tokens
    if layers and prompt_len > model.max_activation_prompt_tokens:
        raise ActivationPromptTooLong(
            f"An activation capture takes prompts of at most {model.max_activation_prompt_tokens} "
            f"tokens (capabilities.max_activation_prompt_tokens); this one has {prompt_len}. "
            "Use a bulk harvest for longer prompts.",
            param="prompt",
        )
    if layers:
        _check_capture_fits(len(layers), prompt_len, model)
    if sum(v.decoded_bytes for v in vectors) > MAX_STEERING_BYTES:
        raise InvalidRequest(
            f"The steering vectors decode to more than {MAX_STEERING_BYTES} bytes together.",
            param="apply_steering_vectors",
        )
    entries = tuple(
        _steering_entry(number, vector, model, prompt_len, max_tokens)
        for number, vector in enumerate(vectors)
    )
    return AcsPayload(
        capture_id=new_capture_id(request_id), capture_layers=layers, steering=entries
    )
