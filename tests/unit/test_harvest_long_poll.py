"""The harvest read on the service alone (a stand-in job store): past the node's
number of waiting reads it answers at once with `X-Acs-Longpoll: declined` and `Retry-After: 3`;
otherwise it holds until the status changes (at once when this node's runner ends the harvest);
the URLs it answers expire 7 days after the harvest
ended (an explicit clock)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from vllm_acs.auth.principal import KeyLimits, Principal
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

    async def parts_of(self, parent_id: str) -> list[Job]:
        return []  # not started: no parts yet


class _NoFiles:
    """No manifest yet; every other file reads as present; no URLs of its own."""

    async def read(self, name: str) -> bytes:
        raise FileNotFoundError(name)

    async def size(self, name: str) -> int:
        return 1

    async def download_urls(self, names: list[str], expires_at: datetime, now: datetime) -> None:
        return None


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


def test_a_harvest_this_node_ends_is_answered_at_once_not_at_the_next_read(monkeypatch):
    from vllm_acs.jobs.watch import JobWatch

    # Reads far apart: only the runner's watch can answer the wait within the test's second.
    monkeypatch.setattr(service_module, "LONG_POLL_STEP_S", 30)
    service, jobs = _service(long_polls=1)

    async def nothing_ended_elsewhere(awaited: object) -> list[str]:
        return []

    async def scenario() -> dict:
        watch = JobWatch(nothing_ended_elsewhere, check_every_s=30)
        service.runner = SimpleNamespace(watch=watch)
        read = asyncio.ensure_future(service.read("job_1", _principal(), 60, "http://node"))
        await asyncio.sleep(0.05)
        assert not read.done() and watch.waiting == 1
        jobs.job = replace(JOB, status=JobStatus.FAILED, finished_at=NOW)
        watch.ended("job_1")  # as the runner does when it writes the harvest's end
        answer = await asyncio.wait_for(read, 1)
        await watch.close()
        return answer.body

    assert asyncio.run(scenario())["status"] == "failed"


def test_urls_expire_seven_days_after_the_harvest_ended():
    from vllm_acs.errors import DownloadRefused
    from vllm_acs.harvest.download_urls import UrlSigner

    clock = {"now": NOW}
    service = HarvestService(NodeModels(), Settings(), lambda: clock["now"])
    jobs = _Jobs()
    result = '{"n_shards": 1, "layer_indices": [1], "files": ["shard_00000.safetensors"]}'
    jobs.job = replace(
        JOB, status=JobStatus.SUCCEEDED, finished_at=NOW, result_status=200, result_body=result
    )
    service.storage = SimpleNamespace(jobs=jobs, files=_NoFiles())  # type: ignore[assignment]
    service.signer = UrlSigner(b"secret")

    def shown() -> dict:
        return asyncio.run(service.read("job_1", _principal(), None, "http://node")).body

    fresh = shown()
    assert fresh["urls_expired"] is False and fresh["urls_expire_at"].startswith("2026-12-08T12:00")
    query = dict(p.split("=") for p in fresh["result"]["shard_urls"][0].split("?")[1].split("&"))

    def download() -> str:
        return asyncio.run(
            service.download_name(
                "job_1", "shard_00000.safetensors", query["expires"], query["signature"]
            )
        )

    clock["now"] = NOW + timedelta(days=7) - timedelta(seconds=1)
    assert download() == "harvests/job_1/shard_00000.safetensors"
    clock["now"] = NOW + timedelta(days=7)
    assert shown()["urls_expired"] is True
    with pytest.raises(DownloadRefused, match="expired"):
        download()
