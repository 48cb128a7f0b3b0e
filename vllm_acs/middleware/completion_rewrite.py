"""CompletionRewriteMiddleware: turns a ValidatedCompletion into the body vLLM's route receives.

API server process, the innermost stage in front of vLLM. The short model id becomes the
checkpoint and `max_tokens` is the admitted value. Every answer of the route carries
`X-Acs-Upstream-Model` / `-Gpu`, and `X-Acs-Max-Tokens-Clamped` when max_tokens was lowered.
A live completion (not batch work's replay) is counted in `live` while vLLM runs it, so batch work
keeps to its share beside it (jobs/batch_share.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from ..auth.principal import REPLAY_SCOPE_KEY, Replay
from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from .asgi import ASGIApp, Message, Receive, Scope, Send, replay_body, with_header


def vllm_body(validated: ValidatedCompletion, extra: Mapping[str, Any] | None = None) -> bytes:
    """`extra`: vLLM fields a replay of the node's own adds (`principal.Replay.vllm_fields`)."""
    body = {
        **(extra or {}),
        **validated.fields,
        "model": validated.model.checkpoint,
        "max_tokens": validated.max_tokens,
    }
    if validated.engine_args:
        body["vllm_xargs"] = validated.engine_args
    if validated.stream:
        # Every stream ends with vLLM's usage chunk, so a hold settles at the engine's counts;
        # UsageChunkMiddleware removes it again for a client that did not ask for it.
        body["stream_options"] = {
            **(validated.fields.get("stream_options") or {}),
            "include_usage": True,
        }
    return json.dumps(body, separators=(",", ":")).encode()


def completion_headers(validated: ValidatedCompletion) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"x-acs-upstream-model", validated.model.checkpoint.encode()),
        (b"x-acs-upstream-gpu", validated.model.gpu_shape.encode()),
    ]
    clamp = validated.clamp_header()
    if clamp is not None:
        headers.append((b"x-acs-max-tokens-clamped", clamp.encode()))
    return headers


class LiveCounter(Protocol):
    def started(self) -> None: ...

    def ended(self) -> None: ...


class CompletionRewriteMiddleware:
    def __init__(self, app: ASGIApp, live: LiveCounter | None = None) -> None:
        self.app = app
        self.live = live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        validated = scope.get("state", {}).get(VALIDATED_COMPLETION_KEY)
        if scope["type"] != "http" or validated is None:
            await self.app(scope, receive, send)
            return
        replay = scope.get(REPLAY_SCOPE_KEY)
        body = vllm_body(validated, replay.vllm_fields if isinstance(replay, Replay) else None)
        scope = with_header(scope, b"content-length", str(len(body)).encode())
        scope = with_header(scope, b"content-type", b"application/json")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = completion_headers(validated)
                names = {name for name, _ in extra}
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": kept + extra}
            await send(message)

        live = self.live if not (isinstance(replay, Replay) and replay.batch) else None
        if live is None:
            await self.app(scope, replay_body(body, receive), send_with_headers)
            return
        live.started()
        try:
            await self.app(scope, replay_body(body, receive), send_with_headers)
        finally:
            live.ended()
