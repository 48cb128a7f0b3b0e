"""The completion job kind: a job's completion is a live one, replayed through the node's own app.

API server process. The stored body goes to `POST /v1/completions` of this process's ASGI app
in-process, as the job's principal (`jobs/replay.py`): the same validation, admission (a
running slot, the Hold, the activation quota; no second start, no clamp), engine call, capture
read, settle and usage row as a live request. The answer's status and body are the job's result.
A stopped job makes the replay's client disconnect, which aborts the engine request. Jobs are
batch work: their replays carry batch work's engine priority and keep to its share beside live
traffic (jobs/batch_share.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from ..auth.key_auth import checked_principal
from ..auth.principal import KeyLimits, Principal
from ..errors import AcsError, Unauthorized, error_body
from ..settings import Settings
from ..states import JobStatus
from ..storage.api_keys import KeyRepository
from ..storage.jobs import Job
from .batch_share import BatchScheduling
from .kinds import HandBack, JobOutcome, Stopped
from .replay import ASGIApp, ReplayAnswer, replay_completion

KIND = "completion"
# A job whose key has every running and waiting slot taken waits this long before its next try.
QUEUE_FULL_RETRY_S = 1.0
# A job whose run met a shared service down (the database, Redis) tries again after this long.
OUTAGE_CODES = frozenset({"db_pool_exhausted", "circuit_open"})
OUTAGE_RETRY_S = 2.0


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


class CompletionJobKind:
    name = KIND

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyRepository,
        settings: Settings,
        batch: BatchScheduling | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.settings = settings
        self.batch = batch or BatchScheduling(priority_policy=False)
        self.gate = self.batch.gate(settings.job_concurrency)

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
        if answer.status == 503 and code in OUTAGE_CODES:
            return HandBack(OUTAGE_RETRY_S)  # a shared service was down: not the job's failure
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
    ) -> ReplayAnswer:
        async with self.gate.slot():
            return await replay_completion(
                self.app,
                request["body"],
                principal,
                job.id,
                stop,
                workload=request.get("workload"),
                vllm_fields=self.batch.vllm_fields(),
                batch=True,
            )
