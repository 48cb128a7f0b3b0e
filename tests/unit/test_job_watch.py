"""JobWatch: a long-poll wakes at once for a job ended in this process, by the shared check for
one ended elsewhere, and times out otherwise; one query a step however many wait."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from vllm_acs.jobs.watch import JobWatch


class EndedElsewhere:
    """The database as the check sees it: which jobs have ended, and how often it was asked."""

    def __init__(self) -> None:
        self.ended: set[str] = set()
        self.queries: list[list[str]] = []

    async def __call__(self, job_ids: Collection[str]) -> list[str]:
        self.queries.append(sorted(job_ids))
        return [job_id for job_id in job_ids if job_id in self.ended]


async def _a_job_ended_here_wakes_its_waiters_at_once() -> None:
    database = EndedElsewhere()
    watch = JobWatch(database, check_every_s=60)
    waiters = [asyncio.create_task(watch.wait_ended("job-1", 30)) for _ in range(3)]
    await asyncio.sleep(0)
    assert watch.waiting == 3
    watch.ended("job-1")
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True, True, True]
    assert watch.waiting == 0
    assert database.queries == []  # woken without asking the database
    await watch.close()


async def _a_job_ended_elsewhere_is_seen_by_one_query_for_all_waiters() -> None:
    database = EndedElsewhere()
    watch = JobWatch(database, check_every_s=0.01)
    waiters = {
        job_id: asyncio.create_task(watch.wait_ended(job_id, 30)) for job_id in ("a", "b", "c", "d")
    }
    await asyncio.sleep(0.05)
    assert all(not task.done() for task in waiters.values())
    database.ended |= {"b", "d"}
    assert await asyncio.wait_for(waiters["b"], 1) is True
    assert await asyncio.wait_for(waiters["d"], 1) is True
    assert not waiters["a"].done() and not waiters["c"].done()
    # Every check asked about all the jobs still awaited, in one query.
    assert all(query in (["a", "b", "c", "d"], ["a", "c"]) for query in database.queries)
    watch.ended("a")
    watch.ended("c")
    await asyncio.gather(*waiters.values())
    await watch.close()


async def _a_wait_that_outlasts_its_time_answers_false_and_leaves_nothing() -> None:
    database = EndedElsewhere()
    watch = JobWatch(database, check_every_s=0.01)
    assert await watch.wait_ended("never", 0.05) is False
    assert watch.waiting == 0
    await asyncio.sleep(0.05)  # the check stops once nobody waits
    asked = len(database.queries)
    await asyncio.sleep(0.05)
    assert len(database.queries) == asked
    await watch.close()


async def _a_failing_check_does_not_break_the_waiters() -> None:
    calls = 0

    async def failing(job_ids: Collection[str]) -> list[str]:
        nonlocal calls
        calls += 1
        raise OSError("database down")

    watch = JobWatch(failing, check_every_s=0.01)
    waiter = asyncio.create_task(watch.wait_ended("job", 5))
    await asyncio.sleep(0.05)
    assert calls >= 2 and not waiter.done()
    watch.ended("job")
    assert await waiter is True
    await watch.close()


def test_a_job_ended_here_wakes_its_waiters_at_once() -> None:
    asyncio.run(_a_job_ended_here_wakes_its_waiters_at_once())


def test_a_job_ended_elsewhere_is_seen_by_one_query_for_all_waiters() -> None:
    asyncio.run(_a_job_ended_elsewhere_is_seen_by_one_query_for_all_waiters())


def test_a_wait_that_outlasts_its_time_answers_false_and_leaves_nothing() -> None:
    asyncio.run(_a_wait_that_outlasts_its_time_answers_false_and_leaves_nothing())


def test_a_failing_check_does_not_break_the_waiters() -> None:
    asyncio.run(_a_failing_check_does_not_break_the_waiters())
