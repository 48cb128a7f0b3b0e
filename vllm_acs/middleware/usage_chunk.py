"""UsageChunkMiddleware: every stream is metered from vLLM's own usage chunk, which a client that
did not ask for `include_usage` never sees.

API server process, just outside Admission. The Rewrite stage asks vLLM for the usage chunk on
every stream (so a hold settles at the engine's counts, not at a count of text chunks); this drops
that chunk again on the way out when the client's `stream_options` did not request it.
"""

from __future__ import annotations

import json

from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from .asgi import ASGIApp, Message, Receive, Scope, Send
from .sse import EVENT_END, SseEventBuffer


def client_wants_usage(validated: ValidatedCompletion) -> bool:
    options = validated.fields.get("stream_options") or {}
    return bool(options.get("include_usage"))


def is_usage_only_event(event: bytes) -> bool:
    """`data: {... "choices": [], "usage": {...}}`: the terminal usage chunk, nothing else in it."""
    if not event.startswith(b"data: {") or b'"usage"' not in event:
        return False
    try:
        chunk = json.loads(event[6:])
    except ValueError:
        return False
    return chunk.get("choices") == [] and chunk.get("usage") is not None and len(chunk) <= 7


class UsageChunkMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        validated = scope.get("state", {}).get(VALIDATED_COMPLETION_KEY)
        if (
            scope["type"] != "http"
            or not isinstance(validated, ValidatedCompletion)
            or not validated.stream
            or client_wants_usage(validated)
        ):
            await self.app(scope, receive, send)
            return
        events = SseEventBuffer()
        is_stream = False  # an error answer (JSON) passes untouched

        async def send_without_usage(message: Message) -> None:
            nonlocal is_stream
            if message["type"] == "http.response.start":
                is_stream = any(
                    k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", ())
                )
            if message["type"] != "http.response.body" or not is_stream:
                await send(message)
                return
            events_here = events.feed(message.get("body", b""), message.get("more_body", False))
            kept = [event + EVENT_END for event in events_here if not is_usage_only_event(event)]
            await send({**message, "body": b"".join(kept)})

        await self.app(scope, receive, send_without_usage)
