"""Finding 2 of the hostile-input review: one request with a 200-character `X-Acs-Workload`
stopped the usage ledger on PostgreSQL (`workload` is VARCHAR(64)) for every key, because the
writer retried the refused batch forever. Now the header is recorded only as `interactive` or
`batch`, a batch the database refuses is split so that the refused row alone is dropped (logged
and counted), an outage still loses nothing, and the bounded queue's overflow is visible."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy.exc

from tests.e2e.access_load import BODY
from tests.e2e.account_client import client_for
from tests.e2e.shared_nodes import Cluster
from tests.services import private_pg_database
from tests.storage.helpers import migrated_engine
from vllm_acs.metrics import USAGE_ROWS_DROPPED, USAGE_ROWS_PENDING
from vllm_acs.storage import ledger as ledger_module
from vllm_acs.storage.ledger import UsageLedger, refused_for_good
from vllm_acs.storage.usage import (
    UsageRepository,
    UsageRow,
    counter_increments,
    recorded_workload,
)

LONG_WORKLOAD = "x" * 200


# --- the header -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "recorded"),
    [
        (None, None),
        ("interactive", "interactive"),
        ("batch", "batch"),
        (" Batch ", "batch"),
        ("", None),
        ("eval", None),
        (LONG_WORKLOAD, None),
        ("batch" + " " * 200, None),
        ("batch\x00", None),
        ("bätch", None),
    ],
)
def test_only_the_specs_workloads_are_recorded(header: str | None, recorded: str | None):
    assert recorded_workload(header) == recorded


# --- from outside, on PostgreSQL ------------------------------------------------------------


def _rows_of(cluster: Cluster, key_id: str, expected: int, timeout_s: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = cluster.query(
            "SELECT request_id, workload, status FROM usage_rows WHERE key_id = $1", key_id
        )
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _usage_requests(client: Any, expected: int, timeout_s: float = 30) -> int:
    """The requests GET /v1/usage counts this month (its per-day figures are the usage rows),
    once they reach `expected` or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = client.get("/v1/usage")
        assert answer.status_code == 200, answer.text
        seen = sum(day["requests"] for day in answer.json()["days"])
        if seen >= expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


@pytest.mark.e2e
def test_a_long_workload_is_served_and_the_ledger_keeps_writing(pg_node: Cluster):
    node = pg_node.nodes[0]
    first = node.create_key_record("hostile-workload")
    second = node.create_key_record("hostile-workload-other")
    with client_for(node, first["key"]) as mine, client_for(node, second["key"]) as other:
        hostile = mine.post("/v1/completions", json=BODY, headers={"X-Acs-Workload": LONG_WORKLOAD})
        assert hostile.status_code == 200, hostile.text
        odd = mine.post("/v1/completions", json=BODY, headers={"X-Acs-Workload": "batch; x=\t1"})
        assert odd.status_code == 200, odd.text
        tagged = mine.post("/v1/completions", json=BODY, headers={"X-Acs-Workload": "batch"})
        assert tagged.status_code == 200, tagged.text
        assert mine.post("/v1/completions", json=BODY).status_code == 200
        assert other.post("/v1/completions", json=BODY).status_code == 200

        assert _usage_requests(mine, 4) == 4
        assert _usage_requests(other, 1) == 1
    workloads = {r["request_id"]: r["workload"] for r in _rows_of(pg_node, first["id"], 4)}
    assert workloads[hostile.headers["x-request-id"]] is None
    assert workloads[odd.headers["x-request-id"]] is None
    assert workloads[tagged.headers["x-request-id"]] == "batch"
    assert node.metric("acs_usage_rows_dropped_total") == 0
    assert node.metric("acs_usage_rows_pending") == 0


@pytest.mark.e2e
def test_a_completion_job_with_a_long_workload_is_charged(pg_node: Cluster):
    """A job stores the header with its request and replays it later: stored as none."""
    from tests.e2e.jobs_client import submit_job, wait_jobs_ended

    node = pg_node.nodes[0]
    record = node.create_key_record("hostile-workload-job")
    with client_for(node, record["key"]) as client:
        client.headers["X-Acs-Workload"] = LONG_WORKLOAD
        job = submit_job(client, node.base_url, BODY, "hostile-workload-job")
        wait_jobs_ended(client, [node.base_url], [job], 120, [node])
        assert _usage_requests(client, 1) == 1
    (stored,) = pg_node.query("SELECT request FROM jobs WHERE key_id = $1", record["id"])
    assert LONG_WORKLOAD not in str(stored["request"])
    (row,) = _rows_of(pg_node, record["id"], 1)
    assert row["workload"] is None


# --- the ledger, on the real databases ------------------------------------------------------


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    try:
        with private_pg_database() as url:
            yield url
    except RuntimeError as error:
        pytest.fail(str(error))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "_BACKOFF_S", (0.001, 0.01))


_SEQUENCE = iter(range(10**9))


def _row(prompt_tokens: int = 1, **changes: Any) -> UsageRow:
    n = next(_SEQUENCE)
    row = UsageRow(
        route="/v1/completions",
        status=200,
        latency_ms=1,
        prompt_tokens=prompt_tokens,
        completion_tokens=1,
        key_id=f"key_{n}",
        account_id="acct_hostile",
        request_id=f"hostile-{n}",
    )
    return dataclasses.replace(row, **changes)


def _dropped(reason: str) -> float:
    return USAGE_ROWS_DROPPED.labels(reason)._value.get()


def _pending_gauge() -> float:
    return USAGE_ROWS_PENDING._value.get()


async def _written(usage: UsageRepository, rows: Sequence[UsageRow]) -> dict[str, dict]:
    ids = {r.request_id for r in rows}
    return {r["request_id"]: r for r in await usage.rows(100_000) if r["request_id"] in ids}


def test_a_refused_row_is_dropped_and_the_rest_of_its_batch_written(
    database_url: str, caplog: pytest.LogCaptureFixture
):
    """NOT NULL fails on both databases; without the split the writer retried the whole batch
    forever and nothing after it was written."""

    async def body() -> None:
        async with migrated_engine(database_url) as engine:
            usage = UsageRepository(engine)
            ledger = UsageLedger(usage)
            dropped, pending = _dropped("refused"), _pending_gauge()
            good = [_row(i) for i in range(1, 40)]
            bad = _row(route=None)  # type: ignore[arg-type]
            for row in [*good[:17], bad, *good[17:]]:
                ledger.record(row)
            assert _pending_gauge() == pending + 40
            await ledger.flush(20)
            written = await _written(usage, [*good, bad])
            assert set(written) == {r.request_id for r in good}
            assert _dropped("refused") == dropped + 1
            assert _pending_gauge() == pending
            # the budget counters of the written rows, in the same transactions
            increments = counter_increments(good)
            assert await usage.read_settled(increments) == increments
            # and the ledger goes on
            later = _row()
            ledger.record(later)
            await ledger.flush(20)
            assert later.request_id in await _written(usage, [later])
            await ledger.close()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert bad.request_id in errors[0].getMessage()
        assert "refused" in errors[0].getMessage()

    asyncio.run(body())


def test_on_postgresql_an_over_long_workload_or_model_is_cut_not_lost(pg_url: str):
    """A row that reached the ledger with text longer than its column (the header no longer
    gets there; an operator's model name might) is written cut, so its tokens still count;
    a row refused even so (a latency out of int32) is dropped."""

    async def body() -> None:
        async with migrated_engine(pg_url) as engine:
            usage = UsageRepository(engine)
            ledger = UsageLedger(usage)
            dropped = _dropped("refused")
            long_workload = _row(workload=LONG_WORKLOAD)
            long_model = _row(model="m" * 300)
            overflow = _row(latency_ms=2**40)
            good = [_row() for _ in range(5)]
            for row in [*good[:2], long_workload, long_model, overflow, *good[2:]]:
                ledger.record(row)
            await ledger.flush(20)
            written = await _written(usage, [*good, long_workload, long_model, overflow])
            assert set(written) == {
                *(r.request_id for r in good),
                long_workload.request_id,
                long_model.request_id,
            }
            assert written[long_workload.request_id]["workload"] is None
            assert written[long_model.request_id]["model"] == "m" * 200
            assert _dropped("refused") == dropped + 1
            await ledger.close()

    asyncio.run(body())


class _Outage:
    """A usage repository whose inserts fail as a database outage for the calls listed in
    `down` (0-based), then pass through to the real one."""

    def __init__(self, real: UsageRepository, down: set[int]) -> None:
        self.real = real
        self.down = down
        self.calls = 0

    async def insert(self, rows: Sequence[UsageRow]) -> None:
        call = self.calls
        self.calls += 1
        if call in self.down:
            raise sqlalchemy.exc.OperationalError(
                "INSERT INTO usage_rows", {}, ConnectionRefusedError("database down")
            )
        await self.real.insert(rows)


def test_an_outage_while_a_refused_batch_is_split_loses_and_repeats_nothing(pg_url: str):
    """The first insert is refused (one NOT NULL row); the outage hits the halves' writes: the
    half already written is not written again, nothing is dropped but the refused row."""

    async def body() -> None:
        async with migrated_engine(pg_url) as engine:
            real = UsageRepository(engine)
            outage = _Outage(real, down={2, 3, 4, 6})
            ledger = UsageLedger(outage)  # type: ignore[arg-type]
            dropped = _dropped("refused")
            good = [_row() for _ in range(10)]
            bad = _row(route=None)  # type: ignore[arg-type]
            for row in [*good[:3], bad, *good[3:]]:
                ledger.record(row)
            await ledger.flush(20)
            rows = [r for r in await real.rows(100_000) if r["request_id"].startswith("hostile-")]
            ids = [r["request_id"] for r in rows if r["request_id"] != bad.request_id]
            wanted = {r.request_id for r in good}
            assert wanted <= set(ids)
            assert len([i for i in ids if i in wanted]) == len(wanted)  # each once
            assert bad.request_id not in ids
            assert _dropped("refused") == dropped + 1
            assert outage.calls > 6
            await ledger.close()

    asyncio.run(body())


def test_an_outage_is_retried_until_the_database_is_back(pg_url: str):
    async def body() -> None:
        async with migrated_engine(pg_url) as engine:
            real = UsageRepository(engine)
            outage = _Outage(real, down=set(range(8)))
            ledger = UsageLedger(outage)  # type: ignore[arg-type]
            dropped = {r: _dropped(r) for r in ("refused", "queue_full", "shutdown")}
            rows = [_row() for _ in range(25)]
            for row in rows:
                ledger.record(row)
            await ledger.flush(20)
            assert set(await _written(real, rows)) == {r.request_id for r in rows}
            assert {r: _dropped(r) for r in dropped} == dropped
            await ledger.close()

    asyncio.run(body())


def test_rows_past_the_queue_bound_are_logged_and_counted(
    database_url: str, caplog: pytest.LogCaptureFixture
):
    """record() runs on the event loop and the writer only between awaits, so recording in one
    go fills the queue deterministically."""

    async def body() -> None:
        async with migrated_engine(database_url) as engine:
            usage = UsageRepository(engine)
            ledger = UsageLedger(usage, max_pending=3)
            full, pending = _dropped("queue_full"), _pending_gauge()
            rows = [_row(prompt_tokens=7) for _ in range(5)]
            for row in rows:
                ledger.record(row)
            assert ledger.pending == 3
            assert _pending_gauge() == pending + 3
            assert _dropped("queue_full") == full + 2
            await ledger.flush(20)
            assert set(await _written(usage, rows)) == {r.request_id for r in rows[:3]}
            assert _pending_gauge() == pending
            # room again once written
            again = _row()
            ledger.record(again)
            await ledger.flush(20)
            assert again.request_id in await _written(usage, [again])
            await ledger.close()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 2
        for row, message in zip(rows[3:], errors, strict=True):
            assert "queue_full" in message
            assert row.request_id in message and "prompt_tokens=7" in message

    asyncio.run(body())


def test_rows_still_waiting_at_shutdown_are_logged_and_counted(
    pg_url: str, caplog: pytest.LogCaptureFixture
):
    async def body() -> None:
        async with migrated_engine(pg_url) as engine:
            outage = _Outage(UsageRepository(engine), down=set(range(10**6)))
            ledger = UsageLedger(outage)  # type: ignore[arg-type]
            shutdown, pending = _dropped("shutdown"), _pending_gauge()
            rows = [_row() for _ in range(3)]
            for row in rows:
                ledger.record(row)
            await ledger.close(timeout=0.2)
            assert _dropped("shutdown") == shutdown + 3
            assert _pending_gauge() == pending
            assert ledger.pending == 0
        messages = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
        for row in rows:
            assert row.request_id in messages

    asyncio.run(body())


def test_an_outage_is_never_taken_for_a_refused_row():
    down = sqlalchemy.exc.OperationalError("x", {}, ConnectionRefusedError())
    assert not refused_for_good(down)
    assert not refused_for_good(OSError("database unavailable"))
    assert refused_for_good(sqlalchemy.exc.IntegrityError("x", {}, ValueError()))
    assert refused_for_good(sqlalchemy.exc.DataError("x", {}, ValueError()))
