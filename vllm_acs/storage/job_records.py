"""The records of the job machinery: a job to submit, a stored job, a sweep's report, and their
mapping to rows of `jobs`. Any process that reads or writes jobs (API server, CLI).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..states import TERMINAL, JobStatus
from .transactions import utc_or_none


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


@dataclass(frozen=True)
class NewJob:
    kind: str
    key_id: str
    account_id: str
    model: str
    request: dict[str, Any]
    max_attempts: int = 3
    id: str = field(default_factory=new_job_id)
    # The job this one is a part of (a harvest's part names its harvest).
    parent_id: str | None = None


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    key_id: str
    account_id: str
    model: str
    status: JobStatus
    attempt: int
    max_attempts: int
    owner: str | None
    lease_expires_at: datetime | None
    not_before: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    request: dict[str, Any] | None
    result_status: int | None
    result_body: str | None
    error_code: str | None
    parent_id: str | None = None
    # What a running part has done so far (its kind's JSON), written after each of its steps.
    progress: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class SweepReport:
    expired: int
    emptied: int
    deleted: int
    idempotency_deleted: int


def job_from_row(row: Any) -> Job:
    """A Job from a row of `jobs` (or anything with its columns as attributes)."""
    return Job(
        id=row.id,
        kind=row.kind,
        key_id=row.key_id,
        account_id=row.account_id,
        model=row.model,
        status=JobStatus(row.status),
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        owner=row.owner,
        lease_expires_at=utc_or_none(row.lease_expires_at),
        not_before=utc_or_none(row.not_before),
        created_at=utc_or_none(row.created_at),  # type: ignore[arg-type]  # never null
        started_at=utc_or_none(row.started_at),
        finished_at=utc_or_none(row.finished_at),
        updated_at=utc_or_none(row.updated_at),  # type: ignore[arg-type]  # never null
        request=None if row.request is None else json.loads(row.request),
        result_status=row.result_status,
        result_body=row.result_body,
        error_code=row.error_code,
        parent_id=getattr(row, "parent_id", None),
        progress=None if getattr(row, "progress", None) is None else json.loads(row.progress),
    )


def insert_values(job: NewJob, now: datetime) -> dict[str, Any]:
    """The row of a newly submitted job: queued, attempt 0, no owner."""
    return {
        "id": job.id,
        "kind": job.kind,
        "key_id": job.key_id,
        "account_id": job.account_id,
        "model": job.model,
        "status": JobStatus.QUEUED.value,
        "attempt": 0,
        "max_attempts": job.max_attempts,
        "owner": None,
        "lease_expires_at": None,
        "not_before": None,
        "created_at": now,
        "started_at": None,
        "finished_at": None,
        "updated_at": now,
        "request": json.dumps(job.request, separators=(",", ":")),
        "result_status": None,
        "result_body": None,
        "error_code": None,
        "parent_id": job.parent_id,
        "progress": None,
    }
