"""Submitting, reading, fetching and cancelling completion jobs, scoped to the caller's key.

API server process. A submit is refused at once when the key already has its most unfinished
jobs (`refuse_early`, before the body is validated and tokenized), is validated like a live
completion (its 400s come at once and store nothing), takes a start of the key, and writes the
job with its idempotency record in one transaction. The completion itself runs later, in the
job runner (jobs/completion.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...auth.principal import Principal
from ...auth.refusals import refusal
from ...contract.body_validation import validate_body
from ...errors import (
    AcsError,
    InvalidRequest,
    JobAttemptsExhausted,
    JobCapacity,
    JobNotCancellable,
    JobNotFound,
    echoed,
)
from ...jobs.completion import KIND, job_request
from ...jobs.runner import JobRunner
from ...served_model import NodeModels
from ...settings import Settings
from ...states import JobStatus
from ...storage import Storage
from ...storage.errors import JobCapacityReached, StartsExhausted
from ...storage.idempotency import IdempotencyTarget, StoredAnswer
from ...storage.jobs import ATTEMPTS_EXHAUSTED, Job, NewJob
from ..answers import Answer
from ..long_poll import DECLINED_HEADERS
from .protocol import job_object, queued_object

JOBS_PATH = "/v1/completion-jobs"


class JobService:
    """Bound to storage and the runner once the engine is up (`bind`, from init_state)."""

    def __init__(self, models: NodeModels, settings: Settings, clock: Callable[[], datetime]):
        self.models = models
        self.settings = settings
        self.clock = clock
        self.storage: Storage | None = None
        self.runner: JobRunner | None = None

    def bind(self, storage: Storage, runner: JobRunner) -> None:
        self.storage, self.runner = storage, runner

    @property
    def _storage(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("vllm_acs jobs: storage is not open (init_state did not run)")
        return self.storage

    async def refuse_early(self, principal: Principal) -> None:
        """JobCapacity when the key has its most unfinished jobs now: one indexed count, before
        the body is validated. Only a pre-check: the insert counts again under the key's lock."""
        most = self.settings.max_jobs_per_key
        if await self._storage.jobs.count_unfinished(principal.key_id) >= most:
            raise _capacity(most)

    async def submit(
        self,
        raw: bytes,
        principal: Principal,
        idempotency: IdempotencyTarget,
        request_id: str | None,
        workload: str | None,
    ) -> Answer:
        body, model_id = await self._validated(raw, request_id)
        try:
            await self._storage.counters.take_start(principal)
        except StartsExhausted as error:
            raise refusal(error) from None
        job = NewJob(
            kind=KIND,
            key_id=principal.key_id,
            account_id=principal.account_id,
            model=model_id,
            request=job_request(body, principal, workload),
            max_attempts=self.settings.job_max_attempts,
        )
        now = self.clock()
        location = f"{JOBS_PATH}/{job.id}"
        shown = queued_object(job.id, model_id, now).model_dump()
        answer = StoredAnswer(
            202, json.dumps(shown), {"content-type": "application/json", "location": location}
        )
        try:
            await self._storage.jobs.submit(
                job,
                now,
                max_unfinished=self.settings.max_jobs_per_key,
                idempotency=idempotency,
                answer=answer,
            )
        except JobCapacityReached as error:
            raise _capacity(error.limit) from None
        if self.runner is not None:
            self.runner.wake()
        return Answer(202, answer.body, {"location": location})  # the bytes a replay sends

    async def _validated(self, raw: bytes, request_id: str | None) -> tuple[dict[str, Any], str]:
        """The body as the client sent it, and the served model it names."""
        data, validated = await validate_body(raw, self.models, self.settings, request_id)
        if validated.stream:
            raise InvalidRequest(
                "A job's completion is not streamed: leave `stream` out and fetch the result "
                "from GET /v1/completion-jobs/{id}/result.",
                param="stream",
            )
        return data, validated.model.id

    async def get(self, job_id: str, principal: Principal) -> Job:
        job = await self._storage.jobs.get(job_id, principal.key_id)
        if job is None or job.kind != KIND:  # a harvest is read at /v1/harvest/{id}
            raise JobNotFound(
                f"No completion job {echoed(job_id)!r} for this API key.", param="job_id"
            )
        return job

    async def read(self, job_id: str, principal: Principal, wait_s: int | None) -> Answer:
        """The job; with `wait_s`, held until it ends (or `wait_s` passes)."""
        job, headers = await self._waited(job_id, principal, wait_s)
        return Answer(200, job_object(job).model_dump(), headers)

    async def result(self, job_id: str, principal: Principal, wait_s: int | None = None) -> Answer:
        job, headers = await self._waited(job_id, principal, wait_s)
        if job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return Answer(202, job_object(job).model_dump(), {"retry-after": "1", **headers})
        if job.result_status is None or job.result_body is None:
            raise _no_result(job)
        return Answer(job.result_status, job.result_body, {})

    async def _waited(
        self, job_id: str, principal: Principal, wait_s: int | None
    ) -> tuple[Job, dict[str, str]]:
        """The job once it ended or `wait_s` passed, and the headers of a declined wait."""
        job = await self.get(job_id, principal)
        if not wait_s or job.ended or self.runner is None:
            return job, {}
        watch = self.runner.watch
        if watch.waiting >= self.settings.job_long_polls:
            return job, dict(DECLINED_HEADERS)
        await watch.wait_ended(job.id, wait_s)
        # Read again either way: past `wait_s` the answer is the job as it is now.
        return await self.get(job_id, principal), {}

    async def cancel(self, job_id: str, principal: Principal) -> Job:
        before = await self.get(job_id, principal)
        job = before
        if before.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            job = await self._storage.jobs.cancel(job_id, principal.key_id, self.clock()) or job
        if job.status != JobStatus.CANCELLED or before.status == JobStatus.CANCELLED:
            raise JobNotCancellable(
                f"The job has already ended (status {job.status.value}); only a queued or "
                "running job can be cancelled."
            )
        if self.runner is not None:
            self.runner.stop_job(job.id)
            self.runner.watch.ended(job.id)
        return job


def _capacity(limit: int) -> AcsError:
    return JobCapacity(
        f"This API key has {limit} jobs that have not ended, the most it may have; wait for "
        "some to end, or cancel some."
    )


def _no_result(job: Job) -> AcsError:
    if job.error_code == ATTEMPTS_EXHAUSTED:
        return JobAttemptsExhausted(
            f"The job was started {job.attempt} times and its node stopped each time before it "
            "ended; submit it again with a new Idempotency-Key."
        )
    if job.status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
        return JobNotFound(f"The job ended {job.status.value} without a result.", param="job_id")
    return JobNotFound(
        "The job's result was deleted (results are kept 24 hours after the job ends).",
        param="job_id",
    )
