"""ActivationResponseMiddleware with a stand-in engine that writes real capture files (the
workers' own writer) and answers like vLLM: rows come back whole, or the answer is a 502."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.asgi_apps import request
from vllm_acs.activations.codec import decode_bits
from vllm_acs.activations.payload import AcsPayload
from vllm_acs.activations.store import SUFFIX, CaptureWriter
from vllm_acs.contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from vllm_acs.middleware.activation_response import (
    ActivationResponseMiddleware,
    _usage_key,
    _with_activations,
)
from vllm_acs.served_model import ServedModel

HIDDEN = 8
MODEL = ServedModel("m", "org/m", 2048, 100, "cpu", 256, n_layers=4, hidden_size=HIDDEN)
PROMPT, COMPLETION = 5, 3
N_ROWS = PROMPT + COMPLETION - 1
USAGE = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": 8}
ANSWER = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 7,
    "model": "org/m",
    "choices": [{"index": 0, "text": "abc", "finish_reason": "length"}],
    "usage": USAGE,
}


def _rows(n_layers: int) -> np.ndarray:
    """Distinct bf16 bit patterns per (position, layer, unit)."""
    return np.arange(N_ROWS * n_layers * HIDDEN, dtype=np.uint16).reshape(N_ROWS, n_layers, HIDDEN)


def _write(root: Path, payload: AcsPayload, rows_done: int = N_ROWS, fail: str = "") -> None:
    """What the workers leave behind: `rows_done` positions written, maybe a failure flag."""
    n_layers = len(payload.capture_layers)
    capacity = N_ROWS if n_layers else 0
    writer = CaptureWriter.create(
        root, payload.capture_id, n_layers=n_layers, capacity=capacity, hidden=HIDDEN
    )
    if n_layers:
        writer.reserve(capacity)
        writer.rows[:rows_done] = _rows(n_layers)[:rows_done]
    writer.advance(rows_done)
    if fail:
        writer.fail(fail)
    writer.close()


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


TEXT_CHUNK = _sse({**ANSWER, "choices": [{"index": 0, "text": "abc"}], "usage": None})
USAGE_CHUNK = _sse({**ANSWER, "choices": [], "usage": USAGE})
DONE = b"data: [DONE]\n\n"


def _engine(root: Path, payload: AcsPayload, *, stream: bool, status: int = 200, **write: Any):
    async def app(scope, receive, send):
        if write.pop("skip", False) is False:
            _write(root, payload, **write)
        kind = b"text/event-stream" if stream else b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"x-acs-upstream-model", b"org/m")],
            }
        )
        if not stream:
            body = ANSWER if status == 200 else {"error": {"message": "bad", "code": status}}
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
            return
        for event in (TEXT_CHUNK, USAGE_CHUNK, DONE):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _call(root: Path, payload: AcsPayload, *, stream: bool = False, **engine: Any):
    validated = ValidatedCompletion(
        MODEL, {"prompt": "x"}, 1, PROMPT, 1, COMPLETION, "client", stream, activations=payload
    )
    inner = ActivationResponseMiddleware(_engine(root, payload, stream=stream, **engine), root)

    async def app(scope, receive, send):
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = validated
        await inner(scope, receive, send)

    return request(app, content=b"{}")


def _capture(layers: tuple[int, ...] = (0, 2)) -> AcsPayload:
    return AcsPayload(capture_id="req-1-abc", capture_layers=layers)


def _steer_only() -> AcsPayload:
    return AcsPayload(capture_id="req-2-abc")


def _no_files(root: Path) -> bool:
    return not list(root.glob(f"*{SUFFIX}"))


def test_capture_is_added_before_usage_with_the_right_length(tmp_path: Path):
    response = _call(tmp_path, _capture())
    assert response.status_code == 200
    assert int(response.headers["content-length"]) == len(response.content)
    body = response.json()
    assert list(body)[-2:] == ["activations", "usage"]
    encoded = body["activations"]["residual_stream"]
    assert encoded["shape"] == [2, N_ROWS, HIDDEN]
    np.testing.assert_array_equal(decode_bits(encoded), _rows(2).transpose(1, 0, 2))
    assert body["choices"] == ANSWER["choices"]
    assert _no_files(tmp_path)


@pytest.mark.parametrize(
    ("write", "code"),
    [
        ({"rows_done": N_ROWS - 1}, "capture_incomplete"),
        ({"fail": "hooks ran on 3 of 4 layers"}, "capture_incomplete"),
        ({"skip": True}, "capture_rows_missing"),
    ],
)
def test_a_short_or_missing_capture_is_a_502_never_a_200(tmp_path: Path, write: dict, code: str):
    response = _call(tmp_path, _capture(), **write)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == code
    assert response.headers["x-acs-upstream-model"] == "org/m"
    if code == "capture_incomplete":
        assert response.headers["retry-after"] == "1"
    else:
        assert response.headers["x-should-retry"] == "false"
    assert _no_files(tmp_path)


def test_steer_only_answer_is_unchanged_once_the_workers_applied_it(tmp_path: Path):
    response = _call(tmp_path, _steer_only())
    assert response.status_code == 200 and response.json() == ANSWER
    assert _no_files(tmp_path)
    missing = _call(tmp_path, _steer_only(), skip=True)
    assert missing.status_code == 502
    assert missing.json()["error"]["code"] == "capture_rows_missing"


def test_engine_errors_pass_through_and_release_the_file(tmp_path: Path):
    response = _call(tmp_path, _capture(), status=400)
    assert response.status_code == 400
    assert _no_files(tmp_path)


def _events(content: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in content.split(b"\n\n") if e.strip()]


def test_stream_sends_activations_before_usage_and_done(tmp_path: Path):
    response = _call(tmp_path, _capture((1,)), stream=True)
    events = _events(response.content)
    assert events[0] == TEXT_CHUNK and events[-2:] == [USAGE_CHUNK, DONE]
    chunk = json.loads(events[1][6:])
    assert chunk["choices"] == [] and chunk["id"] == "cmpl-1" and chunk["model"] == "org/m"
    assert chunk["object"] == "text_completion" and chunk["created"] == 7
    encoded = chunk["activations"]["residual_stream"]
    np.testing.assert_array_equal(decode_bits(encoded), _rows(1).transpose(1, 0, 2))
    assert _no_files(tmp_path)


def test_stream_capture_failure_is_an_error_frame_without_done(tmp_path: Path):
    response = _call(tmp_path, _capture(), stream=True, rows_done=2)
    events = _events(response.content)
    assert events[0] == TEXT_CHUNK and len(events) == 2
    frame = json.loads(events[1][6:])
    assert frame["error"]["code"] == "capture_incomplete"
    assert _no_files(tmp_path)


def test_steer_only_stream_is_unchanged(tmp_path: Path):
    response = _call(tmp_path, _steer_only(), stream=True)
    assert _events(response.content) == [TEXT_CHUNK, USAGE_CHUNK, DONE]


def test_the_file_is_released_when_the_request_dies(tmp_path: Path):
    payload = _capture()

    async def dying(scope, receive, send):
        _write(tmp_path, payload)
        raise RuntimeError("client went away")

    validated = ValidatedCompletion(
        MODEL, {"prompt": "x"}, 1, PROMPT, 1, COMPLETION, "client", False, activations=payload
    )
    inner = ActivationResponseMiddleware(dying, tmp_path)

    async def app(scope, receive, send):
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = validated
        await inner(scope, receive, send)

    assert request(app, content=b"{}").status_code == 500
    assert _no_files(tmp_path)


def test_usage_key_is_found_past_strings_that_look_like_it():
    answer = {
        **ANSWER,
        "choices": [{"index": 0, "text": '"usage": {"x": 1}', "decoded_token": "usage"}],
    }
    for separators in ((",", ":"), (", ", ": ")):
        body = json.dumps(answer, separators=separators).encode()
        at, usage = _usage_key(body)
        assert usage == USAGE
        spliced = json.loads(_with_activations(body, at, {"residual_stream": {"shape": [1]}}))
        assert list(spliced)[-2:] == ["activations", "usage"]
        assert spliced["choices"] == answer["choices"]
    assert _usage_key(json.dumps({"text": "usage"}).encode()) == (-1, None)
