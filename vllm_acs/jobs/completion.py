"""The completion job kind: a job's completion is a live one, replayed through the node's own app.

API server process. The stored body goes to `POST /v1/completions` of this process's ASGI app
in-process, as the job's principal (`principal.Replay`): the same validation, admission (a
running slot, the Hold, the activation quota; no second start, no clamp), engine call, capture
read, settle and usage row as a live request. The answer's status and body are the job's result.
A stopped job makes the replay's client disconnect, which aborts the engine request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..errors import ERROR_CODE_STATE_KEY, AcsError, Unauthorized, error_body
from ..key_auth import checked_principal
from ..principal import REPLAY_SCOPE_KEY, KeyLimits, Principal, Replay
from ..settings import Settings
from ..states import JobStatus
from ..storage.api_keys import KeyRepository
from ..storage.jobs import Job
from .kinds import HandBack, JobOutcome, Stopped

ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]
COMPLETIONS_PATH = "/v1/completions"
KIND = "completion"
# A job whose key has every running and waiting slot taken waits this long before its next try.
QUEUE_FULL_RETRY_S = 1.0


def principal_to_json(principal: Principal) -> dict[str, Any]:
    data = dataclasses.asdict(principal)
    data["scopes"] = sorted(principal.scopes)
    return data


def principal_from_json(data: dict[str, Any]) -> Principal:
    return Principal(
        **{
            **data,
            "scopes": frozenset(data["scopes"]),
            "limits": KeyLimits(**data["limits"]),
        }
    )


def job_request(body: dict[str, Any], principal: Principal, workload: str | None) -> dict:
    """What a completion job stores: the client's body and who submitted it."""
    return {"body": body, "principal": principal_to_json(principal), "workload": workload}


@dataclasses.dataclass
class _Answer:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = dataclasses.field(default_factory=list)
    chunks: list[bytes] = dataclasses.field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    # The spec code the pipeline answered with (it notes it on the scope's state), if any.
    code: str | None = None


class CompletionJobKind:
    name = KIND

    def __init__(self, app: ASGIApp, keys: KeyRepository, settings: Settings) -> None:
        self.app = app
        self.keys = keys
        self.settings = settings

    async def run(self, job: Job, stop: asyncio.Event) -> JobOutcome | HandBack | Stopped:
        request = job.request or {}
        try:
            principal = await self.current_principal(principal_from_json(request["principal"]))
        except AcsError as error:
            body = json.dumps(error_body(error, job.id))
            return JobOutcome(JobStatus.FAILED, error.status, body, error.code)
        answer = await self._replay(job, principal, request, stop)
        if stop.is_set():
            return Stopped()
        code = answer.code
        if answer.status == 429 and code == "queue_full":
            return HandBack(QUEUE_FULL_RETRY_S)
        status = JobStatus.SUCCEEDED if answer.status == 200 else JobStatus.FAILED
        return JobOutcome(status, answer.status, answer.body.decode("utf-8", "replace"), code)

    async def current_principal(self, stored: Principal) -> Principal:
        """The submitter now: a key paused or revoked since the submit stops its jobs."""
        if stored.source != "key":
            return stored  # an operator plugin's principal: as it was when the job was accepted
        found = await self.keys.lookup(stored.key_prefix)
        if found is None or found.key.id != stored.key_id:
            raise Unauthorized("The API key of this job no longer exists.", code="invalid_api_key")
        return checked_principal(found, self.settings)

    async def _replay(
        self, job: Job, principal: Principal, request: dict[str, Any], stop: asyncio.Event
    ) -> _Answer:
        payload = json.dumps(request["body"]).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"x-request-id", job.id.encode()),
        ]
        if request.get("workload"):
            headers.append((b"x-acs-workload", str(request["workload"]).encode("latin-1")))
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
            REPLAY_SCOPE_KEY: Replay(principal=principal, job_id=job.id),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await stop.wait()  # the replay's client "disconnects" when the job is stopped
            return {"type": "http.disconnect"}

        answer = _Answer()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer.status = int(message["status"])
                answer.headers = list(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                answer.chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        answer.code = scope["state"].get(ERROR_CODE_STATE_KEY) or None
        return answer
