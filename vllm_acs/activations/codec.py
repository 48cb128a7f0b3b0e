"""The spec's activation codec: bf16 bits as int16, zstd-compressed, base64 in a JSON dict.

Used in the API server (encoding captures, decoding steering vectors), in the workers (decoding
steering vectors) and by clients (`vllm_acs.client`). numpy + zstandard only; bf16 rounding is done
by hand so that ml_dtypes is not needed.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zstandard

STORAGE_DTYPE = "int16"
ORIGINAL_DTYPE = "torch.bfloat16"
COMPRESSION = "zstd"
# Larger inputs are refused before decompression: a steering vector or a capture never needs it.
MAX_DECODED_BYTES = 1 << 31


class CodecError(ValueError):
    """The dict is not a valid encoded array; the message says which field is wrong."""


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float array -> uint16 bf16 bit patterns, rounding to nearest even (what torch does)."""
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = f32.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    # Rounding could turn a NaN payload into an infinity: keep NaNs NaN (quiet).
    nan = np.isnan(f32)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """uint16/int16 bf16 bit patterns -> float32 (exact: bf16 is a prefix of float32)."""
    wide = np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def encode_bits(bits: np.ndarray, *, level: int = 1) -> dict[str, Any]:
    """bf16 bit patterns (uint16 or int16, any shape) -> the codec dict."""
    if bits.dtype not in (np.uint16, np.int16):
        raise CodecError(f"encode_bits wants uint16/int16 bf16 bits, got {bits.dtype}")
    raw = np.ascontiguousarray(bits).view(np.int16).tobytes()
    packed = zstandard.ZstdCompressor(level=level).compress(raw)
    return {
        "data": base64.b64encode(packed).decode("ascii"),
        "dtype": STORAGE_DTYPE,
        "original_dtype": ORIGINAL_DTYPE,
        "shape": [int(n) for n in bits.shape],
        "compression": COMPRESSION,
    }


def encode_array(values: np.ndarray, *, level: int = 1) -> dict[str, Any]:
    """A float array (any float dtype, or ml_dtypes bfloat16) -> the codec dict."""
    if values.dtype.name == "bfloat16":
        return encode_bits(values.view(np.uint16), level=level)
    if not np.issubdtype(values.dtype, np.floating):
        raise CodecError(f"encode_array wants a float array, got {values.dtype}")
    return encode_bits(float_to_bf16_bits(values), level=level)


def decode_bits(encoded: Mapping[str, Any]) -> np.ndarray:
    """The codec dict -> uint16 bf16 bit patterns shaped as `shape`. Raises CodecError."""
    shape = _shape(encoded.get("shape"))
    if encoded.get("dtype") != STORAGE_DTYPE:
        raise CodecError(f"dtype must be {STORAGE_DTYPE!r}, got {encoded.get('dtype')!r}")
    original = encoded.get("original_dtype", ORIGINAL_DTYPE)
    if original != ORIGINAL_DTYPE:
        raise CodecError(f"original_dtype must be {ORIGINAL_DTYPE!r}, got {original!r}")
    data = encoded.get("data")
    if not isinstance(data, str):
        raise CodecError("data must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError("data is not valid base64") from None
    expected = 2 * math.prod(shape)
    compression = encoded.get("compression")
    if compression == COMPRESSION:
        try:
            # A frame that declares more than the shape needs is refused before it is inflated.
            declared = zstandard.frame_content_size(raw)
            if declared > expected:
                raise CodecError(f"data inflates to {declared} bytes; shape needs {expected}")
            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=expected)
        except zstandard.ZstdError as exc:
            raise CodecError(f"data is not valid zstd for the shape: {exc}") from None
    elif compression is not None:
        raise CodecError(f"compression must be {COMPRESSION!r} or absent, got {compression!r}")
    if len(raw) != expected:
        raise CodecError(f"data holds {len(raw)} bytes; shape {shape} needs {expected}")
    return np.frombuffer(raw, dtype=np.uint16).reshape(shape)


def decode_array(encoded: Mapping[str, Any]) -> np.ndarray:
    """The codec dict -> float32 array (exact values of the bf16 data)."""
    return bf16_bits_to_float(decode_bits(encoded))


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise CodecError("shape must be a non-empty list of integers")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise CodecError("shape must hold non-negative integers")
    if 2 * math.prod(value) > MAX_DECODED_BYTES:
        raise CodecError(f"shape {list(value)} is too large")
    return tuple(value)
