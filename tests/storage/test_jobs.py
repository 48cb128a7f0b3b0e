"""The job repository on SQLite and PostgreSQL with an explicit clock: submit, key scoping, exact
capacity, claims (served models, oldest first, not_before, concurrent claimers), fenced leases,
the reaper, hand-back, cancel, the retention sweep, and the submit that completes an idempotency
record in the same transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.storage.helpers import migrated_engine, settings_for
from vllm_acs.states import IllegalTransition, JobStatus
from vllm_acs.storage import open_storage
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.errors import IdempotencyRecordLost, JobCapacityReached
from vllm_acs.storage.idempotency import Existing, IdempotencyRecords, IdempotencyTarget, Reserved
from vllm_acs.storage.jobs import (
    ATTEMPTS_EXHAUSTED,
    JobEnd,
    JobRepository,
    NewJob,
    StoredAnswer,
    SweepReport,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
Body = Callable[[JobRepository, AsyncEngine], Awaitable[None]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new(key: str = "key_a", model: str = "tiny", kind: str = "completion", **extra) -> NewJob:
    return NewJob(kind, key, "acct_" + key, model, {"prompt": "hi", "max_tokens": 4}, **extra)


def _run(database_url: str, body: Body) -> None:
    async def main() -> None:
        async with migrated_engine(database_url) as engine:
            await body(JobRepository(engine), engine)

    asyncio.run(main())


def test_submit_get_and_list_are_scoped_to_the_key(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        first = await repo.submit(new(), at(0))
        assert first.id.startswith("job_") and len(first.id) == 4 + 24
        assert first.status is JobStatus.QUEUED and first.attempt == 0 and first.max_attempts == 3
        assert first.owner is None and first.started_at is None and first.finished_at is None
        assert first.created_at == first.updated_at == at(0)
        stored = await repo.get(first.id, "key_a")
        assert stored == first
        assert stored.request == {"prompt": "hi", "max_tokens": 4}
        assert stored.created_at.tzinfo is not None and not stored.ended
        assert await repo.get(first.id, "key_b") is None
        assert await repo.get(first.id) == first  # an operator sees every key's jobs
        assert await repo.get("job_missing") is None

        second = await repo.submit(new(max_attempts=1), at(1))
        other = await repo.submit(new("key_b"), at(2))
        assert [j.id for j in await repo.list(key_id="key_a")] == [second.id, first.id]
        assert [j.id for j in await repo.list()] == [other.id, second.id, first.id]
        assert [j.id for j in await repo.list(key_id="key_a", limit=1)] == [second.id]
        assert await repo.list(status=JobStatus.RUNNING) == []
        assert await repo.count_unfinished("key_a") == 2
        with pytest.raises(ValueError, match="timezone-aware"):
            await repo.submit(new(), datetime(2026, 11, 30, 12, 0))

    _run(database_url, body)


def test_capacity_is_exact_under_concurrent_submits(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        async def submit(i: int) -> bool:
            try:
                await repo.submit(new(), at(i / 1000), max_unfinished=5)
            except JobCapacityReached as refused:
                assert refused.limit == 5
                return False
            return True

        accepted = await asyncio.gather(*(submit(i) for i in range(20)))
        assert sum(accepted) == 5
        assert await repo.count_unfinished("key_a") == 5
        # Another key has its own capacity; ended jobs do not count.
        await repo.submit(new("key_b"), at(1), max_unfinished=5)
        job = await repo.claim("node-1", ["tiny"], at(2), 30)
        assert job is not None and job.key_id == "key_a"
        assert await repo.finish(job.id, 0, "node-1", JobStatus.SUCCEEDED, at(3))
        await repo.submit(new(), at(4), max_unfinished=5)
        with pytest.raises(JobCapacityReached):
            await repo.submit(new(), at(5), max_unfinished=5)

    _run(database_url, body)


def test_claim_takes_the_oldest_due_job_of_a_served_model(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        other_model = await repo.submit(new(model="big"), at(0))
        harvest = await repo.submit(new(kind="harvest"), at(1))
        older = await repo.submit(new(), at(2))
        newer = await repo.submit(new("key_b"), at(3))
        assert await repo.claim("node-1", [], at(10), 30) is None
        assert await repo.claim("node-1", ["absent"], at(10), 30) is None

        job = await repo.claim("node-1", ["tiny"], at(10), 30, kinds=["completion"])
        assert job is not None and job.id == older.id
        assert job.status is JobStatus.RUNNING and job.owner == "node-1" and job.attempt == 0
        assert job.lease_expires_at == at(40) and job.started_at == at(10)
        assert job.updated_at == at(10) and job.request == older.request
        assert (await repo.claim("node-2", ["tiny"], at(11), 30, kinds=["completion"])).id == (
            newer.id
        )
        assert await repo.claim("node-2", ["tiny"], at(12), 30, kinds=["completion"]) is None
        assert (await repo.claim("node-2", ["tiny", "big"], at(13), 30)).id == other_model.id
        assert (await repo.claim("node-2", ["tiny"], at(14), 30)).id == harvest.id
        assert await repo.count_unfinished("key_a") == 3
        assert [j.id for j in await repo.list(status=JobStatus.RUNNING, key_id="key_b")] == [
            newer.id
        ]

    _run(database_url, body)


def test_concurrent_claimers_on_two_nodes_take_each_job_once(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        submitted = {(await repo.submit(new(), at(i))).id for i in range(30)}
        other_engine = create_engine(database_url)
        try:
            nodes = [repo, JobRepository(other_engine)]

            async def claimer(name: str, node: JobRepository) -> list[str]:
                taken = []
                while (job := await node.claim(name, ["tiny"], at(100), 30)) is not None:
                    assert job.owner == name
                    taken.append(job.id)
                return taken

            results = await asyncio.gather(
                *(claimer(f"node-{n}-{i}", nodes[n]) for n in range(2) for i in range(6))
            )
        finally:
            await other_engine.dispose()
        claimed = [job_id for taken in results for job_id in taken]
        assert len(claimed) == len(set(claimed)) == 30 and set(claimed) == submitted
        running = await repo.list(status=JobStatus.RUNNING)
        assert len(running) == 30 and all(j.lease_expires_at == at(130) for j in running)

    _run(database_url, body)


def test_claim_many_takes_the_oldest_in_one_statement_and_never_twice(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        ids = [(await repo.submit(new(), at(i))).id for i in range(40)]
        first = await repo.claim_many("node-1", ["tiny"], at(100), 30, limit=3)
        assert [job.id for job in first] == ids[:3]
        assert all(job.status == JobStatus.RUNNING and job.owner == "node-1" for job in first)
        assert await repo.claim_many("node-1", ["tiny"], at(100), 30, limit=0) == []
        other_engine = create_engine(database_url)
        try:
            nodes = [repo, JobRepository(other_engine)]

            async def claimer(name: str, node: JobRepository) -> list[str]:
                taken: list[str] = []
                while batch := await node.claim_many(name, ["tiny"], at(101), 30, limit=4):
                    taken += [job.id for job in batch]
                return taken

            results = await asyncio.gather(
                *(claimer(f"node-{n}-{i}", nodes[n]) for n in range(2) for i in range(4))
            )
        finally:
            await other_engine.dispose()
        claimed = [job_id for taken in results for job_id in taken]
        assert len(claimed) == len(set(claimed)) == 37 and set(claimed) == set(ids[3:])

    _run(database_url, body)


def test_not_before_is_respected_and_hand_back_keeps_the_attempt(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        submitted = await repo.submit(new(), at(0))
        job = await repo.claim("node-1", ["tiny"], at(1), 30)
        assert job is not None
        assert not await repo.hand_back(job.id, job.attempt, "node-2", at(2), at(60))
        assert not await repo.hand_back(job.id, job.attempt + 1, "node-1", at(2), at(60))
        assert await repo.hand_back(job.id, job.attempt, "node-1", at(2), at(60))
        back = await repo.get(job.id)
        assert back.status is JobStatus.QUEUED and back.attempt == 0
        assert back.owner is None and back.lease_expires_at is None
        assert back.not_before == at(60) and back.started_at == at(1)
        # Not due yet: a later job goes first, this one waits for its time.
        later = await repo.submit(new(), at(3))
        assert (await repo.claim("node-2", ["tiny"], at(59), 30)).id == later.id
        assert await repo.claim("node-2", ["tiny"], at(59.5), 30) is None
        again = await repo.claim("node-2", ["tiny"], at(60), 30)
        assert again.id == submitted.id and again.owner == "node-2" and again.attempt == 0
        assert again.started_at == at(1)  # when it first started, not when it was reclaimed
        assert not await repo.hand_back(job.id, 0, "node-1", at(61), at(90))

    _run(database_url, body)


def test_renew_and_finish_are_fenced_against_a_stale_owner(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        await repo.submit(new(), at(0))
        old = await repo.claim("node-1", ["tiny"], at(0), 30)
        assert await repo.renew(old.id, 0, "node-1", at(20), 30)
        assert (await repo.get(old.id)).lease_expires_at == at(50)
        assert not await repo.renew(old.id, 0, "node-2", at(21), 30)
        assert not await repo.renew(old.id, 1, "node-1", at(21), 30)
        # node-1 stalls past its lease; the reaper hands the job to node-2.
        assert await repo.reap(at(50)) == []  # at the lease's end it still holds
        assert await repo.reap(at(51)) == [old.id]
        fresh = await repo.claim("node-2", ["tiny"], at(52), 30)
        assert fresh.id == old.id and fresh.attempt == 1 and fresh.owner == "node-2"
        assert not await repo.renew(old.id, 0, "node-1", at(53), 30)
        assert await repo.finish(
            old.id, 1, "node-2", JobStatus.SUCCEEDED, at(60), result_status=200, result_body="{}"
        )
        # The resurrected node-1 finishes too late and changes nothing.
        assert not await repo.finish(
            old.id, 0, "node-1", JobStatus.FAILED, at(61), result_status=500, error_code="x"
        )
        done = await repo.get(old.id)
        assert done.status is JobStatus.SUCCEEDED and done.finished_at == at(60)
        assert done.result_status == 200 and done.result_body == "{}" and done.error_code is None
        assert done.lease_expires_at is None and done.ended
        assert not await repo.finish(old.id, 1, "node-2", JobStatus.FAILED, at(62))
        assert not await repo.renew(old.id, 1, "node-2", at(62), 30)
        for illegal in (JobStatus.EXPIRED, JobStatus.QUEUED, JobStatus.RUNNING):
            with pytest.raises(IllegalTransition):
                await repo.finish(old.id, 1, "node-2", illegal, at(63))

    _run(database_url, body)


def test_reap_fails_a_job_whose_attempts_are_used_up(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        job = await repo.submit(new(max_attempts=2), at(0))
        steady = await repo.submit(new(), at(1))
        await repo.claim("node-1", ["tiny"], at(10), 30)
        await repo.claim("node-1", ["tiny"], at(10), 300)
        assert await repo.reap(at(41)) == [job.id]  # `steady` still holds a lease
        requeued = await repo.get(job.id)
        assert requeued.status is JobStatus.QUEUED and requeued.attempt == 1
        assert requeued.owner is None and requeued.lease_expires_at is None
        assert requeued.finished_at is None and requeued.error_code is None
        assert (await repo.claim("node-2", ["tiny"], at(42), 30)).attempt == 1
        assert await repo.reap(at(73)) == [job.id]
        failed = await repo.get(job.id)
        assert failed.status is JobStatus.FAILED and failed.error_code == ATTEMPTS_EXHAUSTED
        assert failed.finished_at == at(73) and failed.owner is None and failed.attempt == 2
        assert await repo.reap(at(200)) == []
        assert (await repo.get(steady.id)).status is JobStatus.RUNNING
        assert await repo.count_unfinished("key_a") == 1

    _run(database_url, body)


def test_cancel_queued_running_and_ended_jobs(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        queued = await repo.submit(new(), at(0))
        running = await repo.submit(new(), at(1))
        ended = await repo.submit(new(), at(2))
        assert await repo.cancel(queued.id, "key_b", at(3)) is None
        assert await repo.cancel("job_missing", None, at(3)) is None
        cancelled = await repo.cancel(queued.id, "key_a", at(3))
        assert cancelled.status is JobStatus.CANCELLED and cancelled.finished_at == at(3)
        assert await repo.claim("node-1", ["tiny"], at(4), 30) is not None  # `running`
        cancelled = await repo.cancel(running.id, None, at(5))
        assert cancelled.status is JobStatus.CANCELLED and cancelled.lease_expires_at is None
        # Its owner learns it on its next renew or finish.
        assert not await repo.renew(running.id, 0, "node-1", at(6), 30)
        assert not await repo.finish(running.id, 0, "node-1", JobStatus.SUCCEEDED, at(6))
        job = await repo.claim("node-1", ["tiny"], at(7), 30)
        assert job.id == ended.id
        assert await repo.finish(job.id, 0, "node-1", JobStatus.FAILED, at(8), result_status=429)
        unchanged = await repo.cancel(ended.id, "key_a", at(9))
        assert unchanged.status is JobStatus.FAILED and unchanged.finished_at == at(8)
        assert unchanged == await repo.get(ended.id)
        assert await repo.count_unfinished("key_a") == 0
        assert await repo.reap(at(1000)) == []

    _run(database_url, body)


def test_finish_many_fences_each_end_on_its_own(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        first, second, third = [await repo.submit(new(), at(i)) for i in range(3)]
        claimed = await repo.claim_many("node-1", ["tiny"], at(3), 30, limit=3)
        assert [job.id for job in claimed] == [first.id, second.id, third.id]
        await repo.cancel(second.id, None, at(4))  # its owner's end is fenced out
        ends = [
            JobEnd(first.id, 0, "node-1", JobStatus.SUCCEEDED, 200, '{"ok": 1}'),
            JobEnd(second.id, 0, "node-1", JobStatus.SUCCEEDED, 200, '{"ok": 2}'),
            JobEnd(third.id, 0, "node-2", JobStatus.FAILED, 429, "{}", "budget_exceeded"),
        ]
        assert await repo.finish_many(ends, at(5)) == [True, False, False]
        done = await repo.get(first.id)
        assert (done.status, done.result_body, done.finished_at) == (
            JobStatus.SUCCEEDED,
            '{"ok": 1}',
            at(5),
        )
        assert (await repo.get(second.id)).status is JobStatus.CANCELLED
        assert (await repo.get(third.id)).status is JobStatus.RUNNING  # not node-2's
        with pytest.raises(IllegalTransition):
            await repo.finish_many([JobEnd(third.id, 0, "node-1", JobStatus.QUEUED)], at(6))
        assert await repo.finish_many([], at(6)) == []

    _run(database_url, body)


def test_ended_among_names_the_ended_and_the_missing_jobs(database_url: str):
    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        queued = await repo.submit(new(), at(0))
        running = await repo.submit(new(), at(1))
        done = await repo.submit(new(), at(2))
        cancelled = await repo.submit(new(), at(3))
        assert await repo.claim("node-1", ["tiny"], at(4), 30) is not None  # `queued` runs
        await repo.cancel(cancelled.id, None, at(4))
        claimed = await repo.claim_many("node-1", ["tiny"], at(5), 30, limit=2)
        assert [job.id for job in claimed] == [running.id, done.id]
        assert await repo.finish(done.id, 0, "node-1", JobStatus.SUCCEEDED, at(6))
        asked = [queued.id, running.id, done.id, cancelled.id, "job_gone"]
        assert await repo.ended_among(asked) == sorted([done.id, cancelled.id, "job_gone"])
        assert await repo.ended_among([]) == []

    _run(database_url, body)


def test_sweep_at_each_retention_boundary(database_url: str):
    day, tick = timedelta(days=1), timedelta(microseconds=1)
    nothing = SweepReport(0, 0, 0, 0)

    async def body(repo: JobRepository, engine: AsyncEngine) -> None:
        succeeded = await repo.submit(new(id="job_" + "a" * 24), T0)
        cancelled = await repo.submit(new(id="job_" + "b" * 24), T0)
        job = await repo.claim("node-1", ["tiny"], T0, 30)
        assert job.id == succeeded.id  # the same created_at: the id breaks the tie
        assert await repo.finish(job.id, 0, "node-1", JobStatus.SUCCEEDED, T0, result_body="{}")
        await repo.cancel(cancelled.id, None, T0)
        waiting = await repo.submit(new(), T0 + tick)
        records = IdempotencyRecords(engine)
        target = IdempotencyTarget("key_a", "k-1")
        await records.reserve(target, "/v1/completion-jobs", "f" * 64, T0, 30)
        await records.complete(target, StoredAnswer(202, "{}", {}), T0, retention=7 * day)

        # Exactly at a TTL a row is kept; one microsecond later the sweep acts.
        assert await repo.sweep(T0 + day) == nothing
        assert await repo.sweep(T0 + day + tick) == SweepReport(0, 2, 0, 0)
        emptied = await repo.get(succeeded.id)
        assert emptied.request is None and emptied.result_body is None
        assert emptied.status is JobStatus.SUCCEEDED and emptied.finished_at == T0
        assert (await repo.get(cancelled.id)).request is None
        assert (await repo.get(waiting.id)).status is JobStatus.QUEUED
        assert await repo.sweep(T0 + day + tick) == nothing
        assert await repo.sweep(T0 + day + 2 * tick) == SweepReport(1, 0, 0, 0)
        expired = await repo.get(waiting.id)
        assert expired.status is JobStatus.EXPIRED and expired.finished_at == T0 + day + 2 * tick
        assert expired.request is not None  # its own result retention starts now
        assert await repo.claim("node-1", ["tiny"], T0 + day + 3 * tick, 30) is None

        assert await repo.sweep(T0 + 2 * day + 2 * tick) == nothing
        assert await repo.sweep(T0 + 2 * day + 3 * tick) == SweepReport(0, 1, 0, 0)
        assert (await repo.get(waiting.id)).request is None

        assert await repo.sweep(T0 + 7 * day) == nothing
        assert await repo.sweep(T0 + 7 * day + tick) == SweepReport(0, 0, 2, 1)
        assert await repo.get(succeeded.id) is None and await repo.get(cancelled.id) is None
        assert await records.get(target, T0 + 7 * day + tick) is None
        assert [j.id for j in await repo.list()] == [waiting.id]
        assert await repo.sweep(T0 + 8 * day + 2 * tick) == nothing
        assert await repo.sweep(T0 + 8 * day + 3 * tick) == SweepReport(0, 0, 1, 0)
        assert await repo.list() == []
        with pytest.raises(ValueError):
            await repo.sweep(datetime(2026, 12, 30))

    _run(database_url, body)


def test_submit_completes_the_idempotency_record_in_the_same_transaction(database_url: str):
    async def body(repo: JobRepository, engine: AsyncEngine) -> None:
        records = IdempotencyRecords(engine)

        async def reserve(name: str) -> IdempotencyTarget:
            target = IdempotencyTarget("key_a", name)
            assert await records.reserve(target, "/v1/completion-jobs", "a" * 64, T0, 30) == (
                Reserved(target)
            )
            return target

        answer = StoredAnswer(202, '{"id":"job_x"}', {"location": "/v1/completion-jobs/job_x"})
        target = await reserve("accepted")
        job = await repo.submit(new(), T0, max_unfinished=1, idempotency=target, answer=answer)
        record = await records.get(target, at(1))
        assert record == Existing("a" * 64, "done", answer, job.id, "/v1/completion-jobs")

        # The job is refused (capacity): the record is not marked done, it stays running.
        refused = await reserve("refused")
        with pytest.raises(JobCapacityReached):
            await repo.submit(new(), T0, max_unfinished=1, idempotency=refused, answer=answer)
        assert (await records.get(refused, at(1))).state == "running"
        # The job insert itself fails (its id is taken): the record stays running too.
        with pytest.raises(IntegrityError):
            await repo.submit(new(id=job.id), T0, idempotency=refused, answer=answer)
        assert (await records.get(refused, at(1))).state == "running"
        # The record was released in the meantime: no job without its record.
        await records.release(refused)
        lost = new()
        with pytest.raises(IdempotencyRecordLost):
            await repo.submit(lost, T0, idempotency=refused, answer=answer)
        assert await repo.get(lost.id) is None
        assert [j.id for j in await repo.list()] == [job.id]
        with pytest.raises(ValueError):
            await repo.submit(new(), T0, idempotency=target)

    _run(database_url, body)


def test_open_storage_wires_the_job_and_idempotency_repositories(database_url: str):
    async def body() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            job = await storage.jobs.submit(new(), T0)
            assert await storage.jobs.get(job.id) == job
            target = IdempotencyTarget("key_a", "k")
            assert isinstance(await storage.idempotency.reserve(target, "/r", "f", T0, 5), Reserved)
        finally:
            await storage.close()

    asyncio.run(body())


def test_a_kinds_own_result_retention(database_url: str):
    day, tick = timedelta(days=1), timedelta(microseconds=1)

    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        plain = await repo.submit(new(), T0)
        harvest = await repo.submit(new(key="key_b", kind="harvest"), T0)
        for job in (plain, harvest):
            await repo.cancel(job.id, None, T0)
        ttls = {"harvest": 7 * day}
        # After a day the completion job's result goes, the harvest's stays (it names files).
        report = await repo.sweep(T0 + day + tick, result_ttls=ttls)
        assert report.emptied == 1
        assert (await repo.get(plain.id)).request is None
        assert (await repo.get(harvest.id)).request is not None
        # Until its own retention.
        assert (await repo.sweep(T0 + 7 * day, result_ttls=ttls)).emptied == 0
        report = await repo.sweep(T0 + 7 * day + tick, result_ttls=ttls)
        assert report.deleted == 2 and await repo.get(harvest.id) is None

    _run(database_url, body)


def test_a_jobs_parts_are_added_once_fenced_and_cancelled_with_it(database_url: str):
    """A harvest's parts (issue 33): added again by a resumed harvest, nothing changes; their
    progress is written only by their holder; they do not count as the key's jobs; cancelling
    the parts ends those not ended."""

    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        parent = await repo.submit(new(kind="harvest"), at(0))

        def part(index: int) -> NewJob:
            return new(kind="harvest_part", id=f"{parent.id}-p{index:04d}", parent_id=parent.id)

        assert await repo.add_parts([part(0), part(1), part(2)], at(1)) == 3
        assert await repo.add_parts([part(0), part(1), part(2)], at(2)) == 0
        parts = await repo.parts_of(parent.id)
        assert [p.id for p in parts] == [part(i).id for i in range(3)]
        assert {(p.parent_id, p.status, p.progress) for p in parts} == {
            (parent.id, JobStatus.QUEUED, None)
        }
        # The parent alone is the key's job (the completion jobs' cap counts jobs, not parts).
        assert await repo.count_unfinished("key_a") == 1

        (claimed,) = await repo.claim_many("node-a", ["tiny"], at(3), 30, ["harvest_part"], limit=1)
        assert claimed.id == part(0).id
        done = {"shards_done": 1, "prompts_done": 4, "rows_done": 40}
        assert await repo.report_progress(claimed.id, 0, "node-a", at(4), done)
        assert not await repo.report_progress(claimed.id, 0, "node-b", at(4), {"shards_done": 9})
        assert (await repo.get(claimed.id)).progress == done

        finished = await repo.finish(claimed.id, 0, "node-a", JobStatus.SUCCEEDED, at(5))
        assert finished
        assert await repo.cancel_parts(parent.id, at(6)) == 2
        statuses = [p.status for p in await repo.parts_of(parent.id)]
        assert statuses == [JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.CANCELLED]
        assert await repo.parts_of("job_none") == []

    _run(database_url, body)


def test_a_queued_part_does_not_expire_while_its_harvest_runs(database_url: str):
    """A part may wait more than a day behind its harvest's other parts: the queued-job expiry
    leaves parts alone (their harvest, running, ends them)."""

    async def body(repo: JobRepository, _engine: AsyncEngine) -> None:
        parent = await repo.submit(new(kind="harvest"), at(0))
        (claimed,) = await repo.claim_many("node-a", ["tiny"], at(1), 30, ["harvest"], limit=1)
        assert claimed.id == parent.id
        part = new(kind="harvest_part", id=f"{parent.id}-p0000", parent_id=parent.id)
        await repo.add_parts([part], at(2))
        lonely = await repo.submit(new(key="key_b"), at(2))
        report = await repo.sweep(at(2 + 25 * 3600))
        assert report.expired == 1
        assert (await repo.get(lonely.id)).status is JobStatus.EXPIRED
        assert (await repo.get(part.id)).status is JobStatus.QUEUED

    _run(database_url, body)
