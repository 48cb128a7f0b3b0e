"""A request replayed through the node's own ASGI app, in-process, as a job's principal.

API server process. Used by completion jobs (the stored body to `POST /v1/completions`) and by
Loom branches, replays and scores: the same validation, admission, engine call, capture read and
settle as a live request (`principal.Replay`). When `stop` is set the replay's client
disconnects, which aborts the engine request. `on_body` sees each body chunk as it is sent (a
streamed answer is read as it grows).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from ..auth.principal import REPLAY_SCOPE_KEY, Principal, Replay
from ..errors import ERROR_CODE_STATE_KEY

ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]
COMPLETIONS_PATH = "/v1/completions"


@dataclasses.dataclass
class ReplayAnswer:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = dataclasses.field(default_factory=list)
    chunks: list[bytes] = dataclasses.field(default_factory=list)
    # The spec code the pipeline answered with (it notes it on the scope's state), if any.
    code: str | None = None

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)


async def replay_completion(
    app: ASGIApp,
    body: Mapping[str, Any],
    principal: Principal,
    request_id: str,
    stop: asyncio.Event,
    *,
    workload: str | None = None,
    vllm_fields: Mapping[str, Any] | None = None,
    batch: bool = False,
    on_start: Callable[[int], Awaitable[None]] | None = None,
    on_body: Callable[[bytes], Awaitable[None]] | None = None,
) -> ReplayAnswer:
    """`POST /v1/completions` with `body`; `vllm_fields` go to vLLM beside the validated body
    (fields of vLLM's own that clients may not send, e.g. `return_token_ids`, batch work's
    `priority`); `batch`: batch work, not counted as live traffic."""
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if workload:
        headers.append((b"x-acs-workload", str(workload).encode("latin-1")))
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": COMPLETIONS_PATH,
        "raw_path": COMPLETIONS_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
        REPLAY_SCOPE_KEY: Replay(
            principal=principal,
            job_id=request_id,
            vllm_fields=dict(vllm_fields or {}),
            batch=batch,
        ),
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await stop.wait()  # the replay's client "disconnects" when the job is stopped
        return {"type": "http.disconnect"}

    answer = ReplayAnswer()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = int(message["status"])
            answer.headers = list(message.get("headers", ()))
            if on_start is not None:
                await on_start(answer.status)
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            answer.chunks.append(chunk)
            if on_body is not None and chunk:
                await on_body(chunk)

    await app(scope, receive, send)
    answer.code = scope["state"].get(ERROR_CODE_STATE_KEY) or None
    return answer
