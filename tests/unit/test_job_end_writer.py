"""EndWriter: ends that arrive together are written in one transaction, each caller learns its
own fence, and a failed write reaches every caller of that batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timezone

from vllm_acs.jobs.end_writer import MAX_BATCH, EndWriter
from vllm_acs.states import JobStatus
from vllm_acs.storage.jobs import JobEnd

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class StandInRepository:
    """finish_many as the runner sees it: jobs named `stale-*` are fenced out."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail

    async def finish_many(self, ends: Sequence[JobEnd], now: datetime) -> list[bool]:
        self.batches.append([end.job_id for end in ends])
        await asyncio.sleep(0.01)  # a transaction takes a while; ends keep arriving meanwhile
        if self.fail:
            raise OSError("database down")
        return [not end.job_id.startswith("stale") for end in ends]


def _end(job_id: str) -> JobEnd:
    return JobEnd(job_id, 0, "node-1", JobStatus.SUCCEEDED, 200, "{}")


def test_ends_arriving_together_share_a_transaction() -> None:
    async def main() -> tuple[list[bool], StandInRepository]:
        repository = StandInRepository()
        writer = EndWriter(repository, lambda: NOW)  # type: ignore[arg-type]
        first = asyncio.create_task(writer.write(_end("job-0")))
        await asyncio.sleep(0)  # the first batch is being written
        rest = [writer.write(_end(f"job-{i}")) for i in range(1, 6)] + [
            writer.write(_end("stale-1"))
        ]
        answers = [await first, *await asyncio.gather(*rest)]
        await writer.close()
        return answers, repository

    answers, repository = asyncio.run(main())
    assert answers == [True] * 6 + [False]
    assert repository.batches == [["job-0"], [*(f"job-{i}" for i in range(1, 6)), "stale-1"]]


def test_a_batch_is_at_most_max_batch_ends() -> None:
    async def main() -> StandInRepository:
        repository = StandInRepository()
        writer = EndWriter(repository, lambda: NOW)  # type: ignore[arg-type]
        await asyncio.gather(*(writer.write(_end(f"job-{i}")) for i in range(MAX_BATCH + 5)))
        return repository

    repository = asyncio.run(main())
    assert [len(batch) for batch in repository.batches] == [MAX_BATCH, 5]


def test_a_failed_write_reaches_every_caller_of_the_batch() -> None:
    async def main() -> list[BaseException | bool]:
        writer = EndWriter(StandInRepository(fail=True), lambda: NOW)  # type: ignore[arg-type]
        return await asyncio.gather(
            *(writer.write(_end(f"job-{i}")) for i in range(3)), return_exceptions=True
        )

    answers = asyncio.run(main())
    assert len(answers) == 3
    assert all(isinstance(a, OSError) and str(a) == "database down" for a in answers)
