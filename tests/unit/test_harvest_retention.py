"""A harvest's files go when its retention ends: 7 days after it ended, or once its row is gone
(after an hour's grace, the time a submit takes between the prompts file and the row)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from vllm_acs.harvest.context import HarvestContext
from vllm_acs.harvest.job import HarvestJobKind
from vllm_acs.states import JobStatus
from vllm_acs.storage.files import LocalFileStore
from vllm_acs.storage.job_records import Job

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=timezone.utc)
BASE = Job(
    id="job_x",
    kind="harvest",
    key_id="k",
    account_id="a",
    model="m",
    status=JobStatus.RUNNING,
    attempt=0,
    max_attempts=3,
    owner=None,
    lease_expires_at=None,
    not_before=None,
    created_at=NOW,
    started_at=None,
    finished_at=None,
    updated_at=NOW,
    request=None,
    result_status=None,
    result_body=None,
    error_code=None,
)


class _Jobs:
    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs

    async def get(self, job_id: str, key_id: str | None = None) -> Job | None:
        return self.jobs.get(job_id)


def test_the_sweep_keeps_what_is_live_and_deletes_the_rest(tmp_path):
    files = LocalFileStore(tmp_path)
    ended = lambda days: replace(  # noqa: E731
        BASE, status=JobStatus.SUCCEEDED, finished_at=NOW - timedelta(days=days)
    )
    rows = {
        "job_running": replace(BASE, id="job_running"),
        "job_recent": ended(6.9),
        "job_old": ended(7.1),
    }
    for name in [*rows, "job_orphan", "job_fresh_orphan"]:
        asyncio.run(files.write(f"harvests/{name}/manifest.json", b"{}"))
    old = (NOW - timedelta(hours=2)).timestamp()
    os.utime(tmp_path / "harvests" / "job_orphan" / "manifest.json", (old, old))
    fresh = (NOW - timedelta(minutes=5)).timestamp()
    os.utime(tmp_path / "harvests" / "job_fresh_orphan" / "manifest.json", (fresh, fresh))
    context = HarvestContext(
        engine=None,
        files=files,
        counters=None,  # type: ignore[arg-type]
        usage=None,  # type: ignore[arg-type]
        settings=SimpleNamespace(),  # type: ignore[arg-type]
        model=lambda: None,  # type: ignore[arg-type,return-value]
        principal_now=lambda principal: principal,
        jobs=_Jobs(rows),  # type: ignore[arg-type]
    )
    kind = HarvestJobKind(context)
    assert asyncio.run(kind.sweep(NOW)) == 2
    assert asyncio.run(files.children("harvests")) == [
        "job_fresh_orphan",
        "job_recent",
        "job_running",
    ]
