"""UsageChunkMiddleware: vLLM's usage chunk reaches a client only when it asked for it."""

from __future__ import annotations

from tests.unit.asgi_apps import json_app, request, sse_app
from vllm_acs.contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from vllm_acs.middleware.usage_chunk import UsageChunkMiddleware
from vllm_acs.served_model import ServedModel

MODEL = ServedModel("m", "org/m", 2048, 100, "cpu", 256)
CONTENT = b'data: {"id":"c","choices":[{"index":0,"text":"a"}]}\n\n'
USAGE = b'data: {"id":"c","object":"text_completion","created":1,"model":"org/m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n'  # noqa: E501
ACTIVATIONS = b'data: {"id":"c","choices":[],"activations":{"residual_stream":{}}}\n\n'
DONE = b"data: [DONE]\n\n"


def _validated(stream_options: dict | None) -> ValidatedCompletion:
    fields = {"prompt": "x", "stream": True}
    if stream_options is not None:
        fields["stream_options"] = stream_options
    return ValidatedCompletion(MODEL, fields, 1, 4, 1, 1, "client", stream=True)


def _run(validated: ValidatedCompletion, events: list[bytes]) -> bytes:
    inner = UsageChunkMiddleware(sse_app(events))

    async def app(scope, receive, send):
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = validated
        await inner(scope, receive, send)

    return request(app).content


def test_usage_chunk_is_dropped_when_not_asked_for():
    assert _run(_validated(None), [CONTENT, USAGE, DONE]) == CONTENT + DONE
    assert _run(_validated({"include_usage": False}), [CONTENT, USAGE, DONE]) == CONTENT + DONE


def test_usage_chunk_is_kept_when_asked_for():
    events = [CONTENT, USAGE, DONE]
    assert _run(_validated({"include_usage": True}), events) == b"".join(events)


def test_other_choiceless_chunks_and_split_events_pass():
    half = len(USAGE) // 2
    events = [CONTENT, ACTIVATIONS, USAGE[:half], USAGE[half:] + DONE]
    assert _run(_validated(None), events) == CONTENT + ACTIVATIONS + DONE


def test_an_error_answer_of_a_stream_request_passes_untouched():
    inner = UsageChunkMiddleware(json_app(429, {"error": {"code": "queue_full"}}))

    async def app(scope, receive, send):
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = _validated(None)
        await inner(scope, receive, send)

    response = request(app)
    assert response.status_code == 429
    assert response.json() == {"error": {"code": "queue_full"}}
