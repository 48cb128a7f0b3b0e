"""The activation fields of /v1/completions: `output_residual_stream`, `apply_steering_vectors`.

API server process. Strict pydantic shapes whose JSON schema is the documented one; the checks
that need the model (layer range, hidden size, positions) are in `activation_rules.py`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from ..activations.codec import COMPRESSION, ORIGINAL_DTYPE, STORAGE_DTYPE, encode_array

MAX_STEERING_VECTORS = 8

CODEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The spec's codec: bf16 bits as int16, zstd-compressed, base64-encoded",
    "required": ["data", "dtype", "shape"],
    "additionalProperties": False,
    "properties": {
        "data": {"type": "string"},
        "dtype": {"type": "string", "enum": [STORAGE_DTYPE]},
        "original_dtype": {"type": "string", "enum": [ORIGINAL_DTYPE]},
        "shape": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "minItems": 2,
            "maxItems": 3,
        },
        "compression": {"enum": [COMPRESSION, None]},
    },
}
_ROW = {"type": "array", "items": {"type": "number"}, "minItems": 1}
_MATRIX = {"type": "array", "items": _ROW, "minItems": 1}
ACTIVATIONS_SCHEMA: dict[str, Any] = {
    "description": "(n_layers, hidden) or, with position_indices, (n_layers, n_positions, "
    "hidden): the codec object, or the numbers as nested lists (rounded to bfloat16)",
    "anyOf": [
        CODEC_SCHEMA,
        _MATRIX,
        {"type": "array", "items": _MATRIX, "minItems": 1},
    ],
}
OUTPUT_RESIDUAL_STREAM_SCHEMA: dict[str, Any] = {
    "description": "true: every decoder layer; a list: those layers (answered ascending)",
    "oneOf": [
        {"type": "boolean"},
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0},
            "minItems": 1,
            "uniqueItems": True,
        },
    ],
}
_CODEC_KEYS = frozenset(CODEC_SCHEMA["properties"])
_NUMBER_TYPES = (int, float)


def _distinct(values: list[int] | None, what: str) -> list[int] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"{what} must be distinct")
    return values


def _codec_object(value: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(value) - _CODEC_KEYS)
    if unknown:
        raise ValueError(f"unknown codec key '{unknown[0]}'")
    missing = [key for key in ("data", "dtype", "shape") if key not in value]
    if missing:
        raise ValueError(f"the codec object needs '{missing[0]}'")
    if not isinstance(value["data"], str):
        raise ValueError("'data' must be a base64 string")
    if value["dtype"] != STORAGE_DTYPE:
        raise ValueError(f"'dtype' must be {STORAGE_DTYPE!r}")
    if value.get("original_dtype", ORIGINAL_DTYPE) != ORIGINAL_DTYPE:
        raise ValueError(f"'original_dtype' must be {ORIGINAL_DTYPE!r}")
    if value.get("compression") not in (COMPRESSION, None):
        raise ValueError(f"'compression' must be {COMPRESSION!r} or null")
    shape = value["shape"]
    if (
        not isinstance(shape, list)
        or not 2 <= len(shape) <= 3
        or not all(type(n) is int and n >= 1 for n in shape)
    ):
        raise ValueError("'shape' must be 2 or 3 positive integers")
    return dict(value)


def _nested_numbers(value: list[Any]) -> dict[str, Any]:
    """A 2-D or 3-D list of numbers -> the codec object (values rounded to bfloat16)."""
    three_d = isinstance(value[0], list) and bool(value[0]) and isinstance(value[0][0], list)
    if three_d and not all(isinstance(plane, list) for plane in value):
        raise ValueError("must be a 2-D or 3-D list of numbers")
    rows = [row for plane in value for row in plane] if three_d else value
    for row in rows:
        if not isinstance(row, list) or not row:
            raise ValueError("must be a 2-D or 3-D list of numbers, without empty lists")
        # Booleans and numeric strings would pass numpy's conversion: refuse them here.
        if not all(type(x) in _NUMBER_TYPES for x in row):
            raise ValueError("must hold numbers only")
    try:
        array = np.array(value, dtype=np.float64)
    except (ValueError, OverflowError):
        raise ValueError("must be a rectangular list of numbers") from None
    with np.errstate(over="ignore"):  # too large for bfloat16: refused just below
        narrowed = array.astype(np.float32)
    if array.ndim != (3 if three_d else 2) or not np.isfinite(narrowed).all():
        raise ValueError("must be a rectangular list of finite numbers (within bfloat16 range)")
    return encode_array(narrowed)


class SteeringVector(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="SteeringVector")

    activations: Annotated[Any, WithJsonSchema(ACTIVATIONS_SCHEMA)]
    layer_indices: Annotated[
        list[Annotated[int, Field(ge=0)]],
        Field(min_length=1, json_schema_extra={"uniqueItems": True}),
    ]
    scale: Annotated[float, Field(allow_inf_nan=False)] = 1.0
    norm_match: bool = False
    position_indices: (
        Annotated[list[int], Field(min_length=1, json_schema_extra={"uniqueItems": True})] | None
    ) = None

    @field_validator("activations")
    @classmethod
    def _codec_or_numbers(cls, value: Any) -> dict[str, Any]:
        if isinstance(value, dict):
            return _codec_object(value)
        if isinstance(value, list) and value:
            return _nested_numbers(value)
        raise ValueError("must be the codec object or a 2-D / 3-D list of numbers")

    @field_validator("layer_indices")
    @classmethod
    def _distinct_layers(cls, value: list[int]) -> list[int]:
        return _distinct(value, "layer indices") or value

    @field_validator("position_indices")
    @classmethod
    def _distinct_positions(cls, value: list[int] | None) -> list[int] | None:
        return _distinct(value, "positions")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.activations["shape"])

    @property
    def decoded_bytes(self) -> int:
        return 2 * math.prod(self.shape)


OutputResidualStream = Annotated[
    bool | list[Annotated[int, Field(ge=0)]], WithJsonSchema(OUTPUT_RESIDUAL_STREAM_SCHEMA)
]
# The cap is checked by `check_steering_vectors` (a clearer message than pydantic's).
SteeringVectors = Annotated[
    list[SteeringVector], Field(json_schema_extra={"maxItems": MAX_STEERING_VECTORS})
]


def check_steering_vectors(value: list[SteeringVector] | None) -> list[SteeringVector] | None:
    if value is not None and len(value) > MAX_STEERING_VECTORS:
        raise ValueError(f"must hold at most {MAX_STEERING_VECTORS} vectors, got {len(value)}")
    return value


def check_output_residual_stream(value: bool | list[int] | None) -> bool | list[int] | None:
    if isinstance(value, list):
        if not value:
            raise ValueError("must name at least one layer, or be true for every layer")
        _distinct(value, "layers")
    return value
