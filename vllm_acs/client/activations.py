"""Steering vectors in, captured activations out: the codec as users call it.

Runs in the user's process; a thin wrapper over vllm_acs.activations.codec (numpy + zstandard).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..activations.codec import decode_array, decode_bits, encode_array

__all__ = ["decode_residual_stream", "encode_vector"]


def encode_vector(vector: Any) -> dict[str, Any]:
    """A steering vector -> the `activations` object of `apply_steering_vectors`.

    `vector` is (n_layers, hidden), one row per entry of `layer_indices`, or
    (n_layers, n_positions, hidden) together with `position_indices`. Any float array (numpy, or
    anything `np.asarray` accepts, e.g. a CPU torch tensor in float32) is rounded to bfloat16.
    """
    array = np.asarray(vector)
    if array.ndim not in (2, 3):
        raise ValueError(
            "a steering vector is (n_layers, hidden) or (n_layers, n_positions, hidden); "
            f"got shape {array.shape}"
        )
    return encode_array(array)


def decode_residual_stream(response: Any, *, as_bf16: bool = False) -> np.ndarray:
    """A completion response (dict, or an SDK object with `model_extra`/`model_dump`) or its
    `activations.residual_stream` dict -> an array shaped (n_layers, n_tokens, hidden).

    float32 by default (exact: every bf16 value is a float32); `as_bf16=True` returns
    ml_dtypes.bfloat16 (needs the ml_dtypes package).
    """
    encoded = _residual_stream_dict(response)
    if not as_bf16:
        return decode_array(encoded)
    import ml_dtypes

    return decode_bits(encoded).view(ml_dtypes.bfloat16)


def _residual_stream_dict(response: Any) -> Mapping[str, Any]:
    if not isinstance(response, Mapping) and hasattr(response, "model_dump"):
        response = response.model_dump()
    if not isinstance(response, Mapping):
        raise TypeError(f"expected a response dict, got {type(response).__name__}")
    if "data" in response and "shape" in response:
        return response
    activations = response.get("activations")
    if not isinstance(activations, Mapping) or "residual_stream" not in activations:
        raise KeyError("the response has no activations.residual_stream")
    return activations["residual_stream"]
