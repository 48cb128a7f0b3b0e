"""Shared services down: which exceptions are outages (503, not 500), and a request whose Redis
lease was lost sees a disconnect (its app aborts it)."""

from __future__ import annotations

import asyncio

import redis.exceptions
import sqlalchemy.exc

from vllm_acs.middleware.admission import receive_until
from vllm_acs.storage.outages import outage_of


def test_database_and_redis_errors_are_outages_and_bugs_are_not():
    operational = sqlalchemy.exc.OperationalError("SELECT 1", {}, OSError("refused"))
    assert outage_of(operational) == "database"
    assert outage_of(sqlalchemy.exc.TimeoutError("QueuePool limit reached")) == "database"
    assert outage_of(redis.exceptions.ConnectionError("refused")) == "counters"
    assert outage_of(redis.exceptions.TimeoutError()) == "counters"
    try:
        try:
            raise redis.exceptions.ConnectionError("down")
        except redis.exceptions.ConnectionError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as wrapped:
        assert outage_of(wrapped) == "counters"  # found through the cause
    assert outage_of(ValueError("a bug")) is None
    assert outage_of(KeyError("x")) is None
    assert outage_of(ConnectionRefusedError()) is None  # not raised by a database driver


def test_a_lost_lease_reads_as_a_disconnect_and_keeps_the_pending_receive():
    async def main() -> None:
        lost = asyncio.Event()
        messages: asyncio.Queue[dict] = asyncio.Queue()
        watched = receive_until(lost, messages.get)
        await messages.put({"type": "http.request", "body": b"x"})
        assert (await watched())["type"] == "http.request"
        waiting = asyncio.ensure_future(watched())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        lost.set()
        assert (await waiting) == {"type": "http.disconnect"}
        assert (await watched()) == {"type": "http.disconnect"}

    asyncio.run(main())
