"""The activation codec (spec: bf16 bits as int16, zstd, base64) and the client helpers."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
import zstandard

from vllm_acs.activations.codec import (
    CodecError,
    bf16_bits_to_float,
    decode_array,
    decode_bits,
    encode_array,
    encode_bits,
    float_to_bf16_bits,
)
from vllm_acs.client import decode_residual_stream, encode_vector


def test_rounding_to_bf16_matches_torch():
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    values[:4] = [np.inf, -np.inf, 0.0, -0.0]
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(float_to_bf16_bits(values).view(np.int16), expected)


def test_nan_stays_nan():
    assert np.isnan(bf16_bits_to_float(float_to_bf16_bits(np.array([np.nan]))))[0]


def test_round_trip_is_exact_for_bf16_values():
    bits = torch.randn(3, 5, 7).to(torch.bfloat16).view(torch.int16).numpy()
    encoded = encode_bits(bits)
    assert encoded["dtype"] == "int16" and encoded["original_dtype"] == "torch.bfloat16"
    assert encoded["shape"] == [3, 5, 7] and encoded["compression"] == "zstd"
    assert np.array_equal(decode_bits(encoded).view(np.int16), bits)


def test_the_spec_decoder_reads_what_we_encode():
    """The docs' client code: b64decode, zstd decompress, frombuffer uint16, reshape."""
    values = torch.randn(2, 4, 8).to(torch.bfloat16)
    encoded = encode_array(values.float().numpy())
    raw = zstandard.ZstdDecompressor().decompress(base64.b64decode(encoded["data"]))
    bits = np.frombuffer(raw, dtype=np.uint16).reshape(encoded["shape"])
    assert np.array_equal(bits.view(np.int16), values.view(torch.int16).numpy())


def test_uncompressed_data_is_accepted():
    bits = np.arange(6, dtype=np.uint16).reshape(2, 3)
    encoded = {"data": base64.b64encode(bits.tobytes()).decode(), "dtype": "int16", "shape": [2, 3]}
    assert np.array_equal(decode_bits(encoded), bits)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "float16"}, "dtype"),
        ({"original_dtype": "torch.float32"}, "original_dtype"),
        ({"data": "not base64!"}, "base64"),
        ({"shape": [2, 4]}, "bytes"),
        ({"shape": [2, True]}, "shape"),
        ({"shape": []}, "shape"),
        ({"compression": "gzip"}, "compression"),
    ],
)
def test_invalid_dicts_are_refused(change: dict, message: str):
    encoded = {**encode_array(np.ones((2, 3), dtype=np.float32)), **change}
    with pytest.raises(CodecError, match=message):
        decode_bits(encoded)


def test_a_frame_larger_than_the_shape_is_refused_before_inflating():
    big = zstandard.ZstdCompressor().compress(bytes(1 << 20))
    encoded = {"data": base64.b64encode(big).decode(), "dtype": "int16", "shape": [2, 3]}
    encoded["compression"] = "zstd"
    with pytest.raises(CodecError, match="inflates"):
        decode_bits(encoded)


def test_client_encode_vector_and_decode_residual_stream():
    vector = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    encoded = encode_vector(vector)
    assert encoded["shape"] == [2, 16]
    response = {"choices": [], "activations": {"residual_stream": encoded}}
    decoded = decode_residual_stream(response)
    assert decoded.dtype == np.float32
    np.testing.assert_allclose(decoded, vector, rtol=2**-8)
    assert np.array_equal(decode_residual_stream(encoded), decoded)
    assert np.array_equal(decode_array(encoded), decoded)


def test_client_refuses_vectors_of_the_wrong_rank():
    with pytest.raises(ValueError, match="n_layers"):
        encode_vector(np.ones(16))
    with pytest.raises(KeyError):
        decode_residual_stream({"choices": []})
