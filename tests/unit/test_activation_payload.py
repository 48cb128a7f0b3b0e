"""The per-request ACS payload carried in SamplingParams.extra_args["acs"]."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_acs.activations.codec import encode_array
from vllm_acs.activations.payload import AcsPayload, PayloadError, SteeringEntry


def _entry(**more) -> SteeringEntry:
    return SteeringEntry(
        activations=encode_array(np.ones((1, 8), dtype=np.float32)), layer_indices=(2,), **more
    )


def test_round_trip_through_extra_args():
    payload = AcsPayload(
        capture_id="cmpl-abc_1",
        capture_layers=(0, 3),
        steering=(_entry(scale=2.5, norm_match=True, position_indices=(-1, 4)), _entry()),
    )
    extra = payload.to_extra_args()
    assert list(extra) == ["acs"] and isinstance(extra["acs"], str)
    assert AcsPayload.from_extra_args(extra) == payload
    assert json.loads(extra["acs"])["v"] == 1


def test_plain_requests_have_no_payload():
    assert AcsPayload.from_extra_args(None) is None
    assert AcsPayload.from_extra_args({"other": 1}) is None


@pytest.mark.parametrize("capture_id", ["", "../etc/passwd", "a.b", "x" * 129, "white space"])
def test_capture_ids_name_files_safely(capture_id: str):
    with pytest.raises(PayloadError, match="capture_id"):
        AcsPayload(capture_id=capture_id)


def test_capture_layers_must_be_ascending_and_distinct():
    with pytest.raises(PayloadError):
        AcsPayload(capture_id="a", capture_layers=(3, 1))
    with pytest.raises(PayloadError):
        AcsPayload(capture_id="a", capture_layers=(1, 1))
    with pytest.raises(PayloadError):
        AcsPayload(capture_id="a", capture_layers=(-1,))


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"v": 2, "capture_id": "a"}',
        '{"v": 1, "capture_id": 7}',
        '{"v": 1, "capture_id": "a", "capture_layers": [true]}',
        '{"v": 1, "capture_id": "a", "steering": [{"layer_indices": [1]}]}',
        '{"v": 1, "capture_id": "a", "steering": [{"activations": {}, "layer_indices": [1],'
        ' "scale": "2"}]}',
    ],
)
def test_malformed_payloads_are_refused(text: str):
    with pytest.raises(PayloadError):
        AcsPayload.from_json(text)


def test_the_payload_must_be_a_string_in_extra_args():
    with pytest.raises(PayloadError, match="JSON string"):
        AcsPayload.from_extra_args({"acs": {"capture_id": "a"}})
