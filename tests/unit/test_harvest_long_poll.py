"""The harvest read's long-poll, on the service alone (a stand-in job store): past the node's
number of waiting reads it answers at once with `X-Acs-Longpoll: declined` and `Retry-After: 3`;
otherwise it holds until the status changes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace

from vllm_acs.principal import KeyLimits, Principal
from vllm_acs.routes.harvest import service as service_module
from vllm_acs.routes.harvest.service import HarvestService
from vllm_acs.served_model import NodeModels
from vllm_acs.settings import Settings
from vllm_acs.states import JobStatus
from vllm_acs.storage.job_records import Job

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
JOB = Job(
    id="job_1",
    kind="harvest",
    key_id="key_1",
    account_id="acct",
    model="m",
    status=JobStatus.RUNNING,
    attempt=0,
    max_attempts=3,
    owner="o",
    lease_expires_at=None,
    not_before=None,
    created_at=NOW,
    started_at=NOW,
    finished_at=None,
    updated_at=NOW,
    request={"n_prompts": 2, "layers": [1]},
    result_status=None,
    result_body=None,
    error_code=None,
)


class _Jobs:
    def __init__(self) -> None:
        self.job = JOB
        self.reads = 0

    async def get(self, job_id: str, key_id: str | None = None) -> Job | None:
        self.reads += 1
        return self.job if (job_id, key_id) == (JOB.id, JOB.key_id) else None


class _NoFiles:
    def read(self, name: str) -> bytes:
        raise FileNotFoundError(name)


def _service(long_polls: int) -> tuple[HarvestService, _Jobs]:
    settings = Settings(harvest_long_polls=long_polls)
    service = HarvestService(NodeModels(), settings, lambda: NOW)
    jobs = _Jobs()
    service.storage = SimpleNamespace(jobs=jobs, files=_NoFiles())  # type: ignore[assignment]
    return service, jobs


def _principal() -> Principal:
    return Principal(
        key_id="key_1",
        key_prefix="acs-x",
        account_id="acct",
        scopes=frozenset(),
        limits=KeyLimits(),
        source="key",
    )


def test_past_the_waiting_reads_it_declines_at_once():
    service, jobs = _service(long_polls=0)
    answer = asyncio.run(service.read("job_1", _principal(), 30, "http://node"))
    assert answer.headers == {"x-acs-longpoll": "declined", "retry-after": "3"}
    assert answer.body["status"] == "running" and jobs.reads == 1


def test_it_answers_when_the_status_changes(monkeypatch):
    monkeypatch.setattr(service_module, "LONG_POLL_STEP_S", 0.01)
    service, jobs = _service(long_polls=1)

    async def scenario() -> dict:
        read = asyncio.ensure_future(service.read("job_1", _principal(), 30, "http://node"))
        await asyncio.sleep(0.05)
        assert not read.done() and service.long_polls == 1
        jobs.job = replace(JOB, status=JobStatus.CANCELLED, finished_at=NOW)
        answer = await asyncio.wait_for(read, 1)
        assert service.long_polls == 0
        return answer.body

    assert asyncio.run(scenario())["status"] == "cancelled"
