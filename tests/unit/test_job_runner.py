"""JobRunner over a real JobRepository (SQLite) with stand-in kinds and an injected clock.

How a job ends for each thing a kind can do: an outcome, an exception, a hand-back, a stop from
outside (cancel, a lost lease), and a server that shuts down while the job runs.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from vllm_acs.jobs.kinds import HandBack, JobOutcome, Stopped
from vllm_acs.jobs.runner import JobRunner
from vllm_acs.settings import Settings
from vllm_acs.states import JobStatus
from vllm_acs.storage import open_storage
from vllm_acs.storage.jobs import Job, NewJob

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class StandInKind:
    name = "completion"

    def __init__(self, behave) -> None:
        self.behave = behave
        self.runs: list[tuple[str, int]] = []

    async def run(self, job: Job, stop: asyncio.Event):
        self.runs.append((job.id, job.attempt))
        return await self.behave(job, stop)


async def _until(condition, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _scenario(tmp_path: Path, behave, *, lease_s: float = 30.0):
    async def run(check):
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))
        clock = [NOW]
        kind = StandInKind(behave)
        runner = JobRunner(
            storage.jobs,
            {kind.name: kind},
            lambda: ["tiny"],
            lease_s=lease_s,
            poll_s=0.05,
            reap_every_s=0.05,
            clock=lambda: clock[0],
            owner="runner-a",
        )
        job = await storage.jobs.submit(
            NewJob(kind="completion", key_id="k", account_id="a", model="tiny", request={}), NOW
        )
        runner.start()
        try:
            await check(storage, runner, kind, job, clock)
        finally:
            await runner.close()
            await storage.close()

    return run


def _status(storage, job_id: str, *wanted: JobStatus):
    async def check() -> bool:
        found = await storage.jobs.get(job_id)
        return found is not None and found.status in wanted

    return check


def test_an_outcome_is_written_once(tmp_path):
    async def succeed(job, stop):
        return JobOutcome(JobStatus.SUCCEEDED, 200, '{"ok": true}')

    async def check(storage, runner, kind, job, clock):
        await _until(_status(storage, job.id, JobStatus.SUCCEEDED))
        done = await storage.jobs.get(job.id)
        assert (done.result_status, done.result_body, done.attempt) == (200, '{"ok": true}', 0)
        assert kind.runs == [(job.id, 0)]

    asyncio.run(_scenario(tmp_path, succeed)(check))


def test_an_exception_in_the_kind_fails_the_job_with_an_internal_error(tmp_path):
    async def explode(job, stop):
        raise RuntimeError("secret detail")

    async def check(storage, runner, kind, job, clock):
        await _until(_status(storage, job.id, JobStatus.FAILED))
        done = await storage.jobs.get(job.id)
        body = json.loads(done.result_body)
        assert (done.result_status, body["error"]["code"]) == (500, "internal_error")
        assert "secret" not in done.result_body

    asyncio.run(_scenario(tmp_path, explode)(check))


def test_a_hand_back_waits_and_keeps_the_attempt(tmp_path):
    async def busy(job, stop):
        return HandBack(60.0)

    async def check(storage, runner, kind, job, clock):
        await _until(lambda: _ran(kind, 1))
        await _until(_status(storage, job.id, JobStatus.QUEUED))
        queued = await storage.jobs.get(job.id)
        assert queued.not_before == NOW + timedelta(seconds=60)
        assert (queued.attempt, queued.owner) == (0, None)
        await asyncio.sleep(0.3)
        assert len(kind.runs) == 1  # not before its time
        clock[0] = NOW + timedelta(seconds=61)
        await _until(lambda: _ran(kind, 2))

    asyncio.run(_scenario(tmp_path, busy)(check))


async def _ran(kind: StandInKind, times: int) -> bool:
    return len(kind.runs) >= times


async def _wait_for_stop(job, stop):
    await stop.wait()
    return Stopped()


def test_a_cancel_stops_the_running_job_and_nothing_overwrites_it(tmp_path):
    async def check(storage, runner, kind, job, clock):
        await _until(_status(storage, job.id, JobStatus.RUNNING))
        await storage.jobs.cancel(job.id, None, NOW)
        runner.stop_job(job.id)
        await _until(lambda: _no_job_running(runner))
        assert (await storage.jobs.get(job.id)).status == JobStatus.CANCELLED

    asyncio.run(_scenario(tmp_path, _wait_for_stop)(check))


async def _no_job_running(runner: JobRunner) -> bool:
    return not runner._running


def test_a_lost_lease_stops_the_job_and_its_result_is_fenced_out(tmp_path):
    async def late_result(job, stop):
        await stop.wait()
        return JobOutcome(JobStatus.SUCCEEDED, 200, "{}")  # too late: fenced

    async def check(storage, runner, kind, job, clock):
        await _until(_status(storage, job.id, JobStatus.RUNNING))
        clock[0] = NOW + timedelta(seconds=5)  # past the 1 s lease: the reaper hands it back
        await _until(lambda: _ran(kind, 2))  # ...and this runner claims the new attempt
        assert kind.runs[1] == (job.id, 1)
        final = await storage.jobs.get(job.id)
        assert final.attempt == 1 and final.result_body is None

    asyncio.run(_scenario(tmp_path, late_result, lease_s=1.0)(check))


def test_a_shutdown_hands_the_running_job_back(tmp_path):
    async def check(storage, runner, kind, job, clock):
        await _until(_status(storage, job.id, JobStatus.RUNNING))
        await runner.close()
        back = await storage.jobs.get(job.id)
        assert (back.status, back.attempt, back.owner) == (JobStatus.QUEUED, 0, None)

    asyncio.run(_scenario(tmp_path, _wait_for_stop)(check))


def test_a_job_for_a_model_this_node_does_not_serve_stays_queued(tmp_path):
    async def never(job, stop):
        raise AssertionError("claimed a job of another model")

    async def run():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))
        job = await storage.jobs.submit(
            NewJob(kind="completion", key_id="k", account_id="a", model="tiny", request={}), NOW
        )
        # The job's clock, not the wall clock: a day after NOW the sweep would expire it.
        runner = JobRunner(
            storage.jobs,
            {"completion": StandInKind(never)},
            lambda: ["other"],
            poll_s=0.05,
            clock=lambda: NOW,
        )
        runner.start()
        await asyncio.sleep(0.3)
        await runner.close()
        assert (await storage.jobs.get(job.id)).status == JobStatus.QUEUED
        await storage.close()

    asyncio.run(run())


def test_a_node_out_of_batch_work_leaves_those_kinds_queued(tmp_path):
    """`batch_work = false` (the runner's `claim_kinds` without harvest and completion): the
    node claims none of them; the kinds it still claims run."""
    ran: list[str] = []

    async def never(job, stop):
        raise AssertionError("claimed batch work")

    async def branch(job, stop):
        ran.append(job.id)
        return JobOutcome(JobStatus.SUCCEEDED, 200, "{}", None)

    async def run():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))

        def new(kind: str) -> NewJob:
            return NewJob(kind=kind, key_id="k", account_id="a", model="tiny", request={})

        batch = await storage.jobs.submit(new("completion"), NOW)
        other = await storage.jobs.submit(new("loom_branch"), NOW)
        runner = JobRunner(
            storage.jobs,
            {"completion": StandInKind(never), "loom_branch": StandInKind(branch)},
            lambda: ["tiny"],
            poll_s=0.05,
            clock=lambda: NOW,
            claim_kinds=["loom_branch"],
        )
        runner.start()

        async def branch_ran() -> bool:
            return ran == [other.id]

        await _until(branch_ran)
        await asyncio.sleep(0.2)
        await runner.close()
        assert (await storage.jobs.get(batch.id)).status == JobStatus.QUEUED
        await storage.close()

    asyncio.run(run())


def test_a_kind_with_a_limit_runs_no_more_than_its_share_here(tmp_path):
    """`kind_limits` (a harvest's parts: two per node): of five queued parts, this runner holds
    two at once and takes the next as one ends; the unlimited kinds still run beside them."""
    running: list[str] = []
    most = [0]
    release = asyncio.Event()

    async def part(job, stop):
        running.append(job.id)
        most[0] = max(most[0], len(running))
        await release.wait()
        running.remove(job.id)
        return JobOutcome(JobStatus.SUCCEEDED, 200, "{}", None)

    completed: list[str] = []

    async def completion(job, stop):
        completed.append(job.id)
        return JobOutcome(JobStatus.SUCCEEDED, 200, "{}", None)

    async def run():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))

        def new(kind: str) -> NewJob:
            return NewJob(kind=kind, key_id="k", account_id="a", model="tiny", request={})

        parts = [await storage.jobs.submit(new("harvest_part"), NOW) for _ in range(5)]
        other = await storage.jobs.submit(new("completion"), NOW)
        runner = JobRunner(
            storage.jobs,
            {"harvest_part": StandInKind(part), "completion": StandInKind(completion)},
            lambda: ["tiny"],
            poll_s=0.05,
            clock=lambda: NOW,
            kind_limits={"harvest_part": 2},
        )
        runner.start()

        async def two_running() -> bool:
            return len(running) == 2 and completed == [other.id]

        await _until(two_running)
        await asyncio.sleep(0.3)  # more polls: still two
        assert len(running) == 2
        queued = [p for p in parts if (await storage.jobs.get(p.id)).status == JobStatus.QUEUED]
        assert len(queued) == 3
        release.set()
        for job in parts:
            await _until(_status(storage, job.id, JobStatus.SUCCEEDED))
        await runner.close()
        await storage.close()
        assert most[0] == 2

    asyncio.run(run())
