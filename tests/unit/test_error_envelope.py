"""ErrorEnvelopeMiddleware on stand-in apps: every failure shape becomes the spec's envelope."""

from __future__ import annotations

import json

from tests.unit.asgi_apps import json_app, request, sse_app
from vllm_acs.middleware.error_envelope import ErrorEnvelopeMiddleware
from vllm_acs.middleware.request_id import RequestIdMiddleware


def _stack(app):
    return RequestIdMiddleware(ErrorEnvelopeMiddleware(app))


def _envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error", "request_id"}
    assert body["request_id"] == response.headers["x-request-id"]
    return body["error"]


def _vllm_error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


def _retry_after_s(response) -> int:
    """The wait a retryable answer gives: Retry-After in whole seconds, retry-after-ms the same."""
    seconds, millis = response.headers["retry-after"], response.headers["retry-after-ms"]
    assert seconds.isdigit() and int(seconds) > 0
    assert millis.isdigit() and int(millis) == int(seconds) * 1000
    return int(seconds)


def test_vllm_400_becomes_vllm_invalid_request():
    response = request(_stack(json_app(400, _vllm_error(400, "n must be 1 when greedy"))))
    assert response.status_code == 400
    error = _envelope(response)
    assert error["code"] == "vllm_invalid_request"
    assert error["message"] == "n must be 1 when greedy"
    assert response.headers["x-acs-upstream-error-kind"] == "vllm_invalid_request"
    assert response.headers["x-should-retry"] == "false"


def test_vllm_context_length_message():
    message = "This model's maximum context length is 2048 tokens."
    response = request(_stack(json_app(400, _vllm_error(400, message))))
    assert _envelope(response)["code"] == "vllm_context_length"


def test_engine_dead_and_oom_are_retryable_502s():
    dead = request(_stack(json_app(500, _vllm_error(500, "EngineCore encountered an issue."))))
    assert dead.status_code == 502
    assert _envelope(dead)["code"] == "vllm_engine_dead"
    assert _retry_after_s(dead) == 10
    oom = request(_stack(json_app(500, _vllm_error(500, "CUDA out of memory. Tried..."))))
    assert oom.status_code == 502
    assert _envelope(oom)["code"] == "vllm_oom"
    _retry_after_s(oom)


def test_other_engine_500_is_upstream_server_error_with_its_status():
    response = request(_stack(json_app(500, _vllm_error(500, "boom at /root/x.py"))))
    assert response.status_code == 502
    error = _envelope(response)
    assert error["code"] == "upstream_server_error"
    assert error["upstream_status"] == 500
    assert "/root" not in response.text
    assert response.headers["x-should-retry"] == "false"
    assert "retry-after" not in response.headers


def test_engine_503_is_retryable():
    response = request(_stack(json_app(503, _vllm_error(503, "busy"))))
    assert response.status_code == 502
    error = _envelope(response)
    assert error["code"] == "upstream_server_error"
    assert error["upstream_status"] == 503
    _retry_after_s(response)
    assert response.headers.get("x-should-retry") != "false"  # retryable


def test_framework_404_and_405_on_other_routes():
    response = request(_stack(json_app(404, {"detail": "Not Found"})), "GET", "/v1/models/x/y")
    assert response.status_code == 404
    assert _envelope(response)["code"] == "not_found"
    response = request(
        _stack(json_app(405, {"detail": "Method Not Allowed"}, [(b"allow", b"GET")])),
        "PUT",
        "/v1/models",
    )
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert _envelope(response)["code"] == "method_not_allowed"


def test_plain_text_500_becomes_internal_error():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    response = request(_stack(app), "GET", "/v1/models")
    assert response.status_code == 500
    assert _envelope(response)["code"] == "internal_error"


def test_our_own_envelope_passes_unchanged():
    ours = {"error": {"message": "m", "type": "t", "param": None, "code": "x"}, "request_id": "r"}
    response = request(_stack(json_app(429, ours, [(b"retry-after", b"3")])))
    assert response.json() == ours
    assert response.headers["retry-after"] == "3"


def test_an_exception_is_a_500_that_leaks_nothing():
    async def app(scope, receive, send):
        raise ValueError("secret internal detail")

    response = request(_stack(app), headers={"X-Request-Id": "boom-1"})
    assert response.status_code == 500
    error = _envelope(response)
    assert error["code"] == "internal_error"
    assert response.headers["x-should-retry"] == "false"
    assert "secret" not in response.text
    assert response.json()["request_id"] == "boom-1"


def _frames(text: str) -> list[str]:
    return [f for f in text.split("\n\n") if f]


def test_stream_error_frame_is_rewritten_and_ends_the_stream():
    events = [
        b'data: {"choices": [{"text": "a"}]}\n\n',
        b'data: {"error": {"message": "EngineCore encountered an issue.", "code": 500}}\n\n',
        b"data: [DONE]\n\n",
    ]
    response = request(_stack(sse_app(events)))
    assert response.status_code == 200
    frames = _frames(response.text)
    assert frames[0] == 'data: {"choices": [{"text": "a"}]}'
    assert len(frames) == 2  # the error frame, and nothing after it
    error = json.loads(frames[1].removeprefix("data: "))
    assert error["error"]["code"] == "vllm_engine_dead"
    assert error["request_id"] == response.headers["x-request-id"]


def test_stream_split_across_chunks_is_reassembled():
    events = [b'data: {"choices": [{"te', b'xt": "a"}]}\n\ndata: [DO', b"NE]\n\n"]
    response = request(_stack(sse_app(events)))
    assert _frames(response.text) == ['data: {"choices": [{"text": "a"}]}', "data: [DONE]"]


def test_exception_inside_an_open_stream_sends_one_error_frame():
    events = [b'data: {"choices": [{"text": "a"}]}\n\n', b"never sent\n\n"]
    response = request(_stack(sse_app(events, fail_after=1)))
    frames = _frames(response.text)
    assert len(frames) == 2
    error = json.loads(frames[1].removeprefix("data: "))
    assert error["error"]["code"] == "internal_error"
    assert "secret" not in response.text


def test_paths_outside_v1_are_untouched():
    response = request(_stack(json_app(404, {"detail": "Not Found"})), "GET", "/other")
    assert response.json() == {"detail": "Not Found"}
