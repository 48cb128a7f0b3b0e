"""The response shape of a completion job, as /openapi.json documents it.

API server process. Times are Unix seconds, like the `created` of a completion.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from ...states import JobStatus
from ...storage.jobs import Job


class CompletionJob(BaseModel):
    id: str
    object: Literal["completion_job"] = "completion_job"
    status: Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
    model: str
    created_at: int
    started_at: int | None = None
    finished_at: int | None = None
    result_status: int | None = Field(
        None, description="The HTTP status the completion answered with, once the job ended"
    )
    error_code: str | None = Field(None, description="The spec's error code of a failed job")


def _seconds(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def job_object(job: Job) -> CompletionJob:
    ended = job.status not in (JobStatus.QUEUED, JobStatus.RUNNING)
    return CompletionJob(
        id=job.id,
        status=job.status.value,
        model=job.model,
        created_at=int(job.created_at.timestamp()),
        started_at=_seconds(job.started_at),
        finished_at=_seconds(job.finished_at) if ended else None,
        result_status=job.result_status if ended else None,
        error_code=job.error_code if ended else None,
    )


def queued_object(job_id: str, model: str, now: datetime) -> CompletionJob:
    """The job as its submit answers it (written before the row, in the same transaction)."""
    return CompletionJob(id=job_id, status="queued", model=model, created_at=int(now.timestamp()))
