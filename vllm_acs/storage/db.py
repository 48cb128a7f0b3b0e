"""Opening storage: the engine (SQLite or PostgreSQL), the schema check, repositories (jobs,
harvests, Looms and idempotency records among them), the job files, counters.

API server process (`await open_storage(settings)` at start, `await storage.close()` at stop) and
the CLI. An embedded SQLite is upgraded here; PostgreSQL must be upgraded by the operator first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..private_paths import touch_private_file
from ..settings import Settings, SettingsError
from .accounts import AccountRepository
from .api_keys import KeyRepository
from .applications import ApplicationRepository
from .counters import Counters
from .counters_embedded import EmbeddedCounters
from .counters_redis import RedisCounters
from .errors import SchemaNotReady
from .files import FileStore, LocalFileStore
from .harvests import HarvestRepository
from .idempotency import IdempotencyRecords
from .jobs import JobRepository
from .key_events import KeyEventLog
from .ledger import UsageLedger
from .looms import LoomRepository
from .migrate import current_revision, head_revision, upgrade
from .registry import RegistryRepository
from .sqlite_inline import dispose_inline, sqlite_pragmas
from .usage import UsageRepository, UsageRow

logger = logging.getLogger(__name__)


def create_engine(url: str) -> AsyncEngine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            touch_private_file(Path(parsed.database))
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    # Bounded waits: a database that does not answer is an outage (503 db_pool_exhausted),
    # not a request that hangs (asyncpg's connect timeout, a pool checkout timeout).
    return create_async_engine(
        url,
        pool_size=10,
        max_overflow=10,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={"timeout": 3, "command_timeout": 30},
    )


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def check_counters_backend(settings: Settings, api_server_count: int) -> None:
    """Refuses more than one API process without Redis: in-memory counters cannot be shared."""
    if api_server_count > 1 and not settings.redis_url:
        raise SettingsError(
            f"{api_server_count} API server processes (--api-server-count) need shared counters "
            "for slots, starts and budget holds: set VLLM_ACS_REDIS_URL (e.g. "
            "redis://127.0.0.1:6379/0), or run one API server process"
        )


@dataclass
class Storage:
    """Everything the API server keeps: repositories, the usage ledger and the shared counters."""

    engine: AsyncEngine
    accounts: AccountRepository
    keys: KeyRepository
    key_events: KeyEventLog
    usage: UsageRepository
    ledger: UsageLedger
    counters: Counters
    settings: Settings
    jobs: JobRepository
    idempotency: IdempotencyRecords
    harvests: HarvestRepository
    # Job files (harvest shards): a local directory, or an S3-compatible bucket nodes share.
    files: FileStore
    looms: LoomRepository
    registry: RegistryRepository
    applications: ApplicationRepository

    async def close(self) -> None:
        await self.ledger.close()
        await self.counters.close()
        await self.keys.close()
        dispose_inline(self.engine)
        await self.engine.dispose()


@contextlib.contextmanager
def _sqlite_upgrade_lock(url: str) -> Iterator[None]:
    """Serializes upgrades of one SQLite file across processes (two nodes starting at once)."""
    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    lock = Path(f"{database}.upgrade-lock")
    touch_private_file(lock)
    with open(lock, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def ensure_schema(engine: AsyncEngine, url: str, *, auto_upgrade: bool) -> None:
    head = head_revision()
    if auto_upgrade:
        if is_sqlite(url):
            with _sqlite_upgrade_lock(url):
                await upgrade(engine)
        else:
            await upgrade(engine)
        return
    current = await current_revision(engine)
    if current != head:
        where = make_url(url).render_as_string(hide_password=True)
        raise SchemaNotReady(
            f"the database schema is at {current or 'nothing'}, this vllm_acs needs {head}: "
            f"run `vllm-acs db upgrade` against {where}"
        )


def open_file_store(settings: Settings) -> FileStore:
    """An S3-compatible bucket when `s3_bucket` is set, else the local `files_dir`."""
    if settings.s3_bucket:
        from .files_s3 import S3FileStore

        return S3FileStore.from_settings(settings)
    return LocalFileStore(settings.resolved_files_dir)


async def open_storage(
    settings: Settings,
    *,
    upgrade_schema: bool | None = None,
    on_usage_written: Callable[[UsageRow], None] | None = None,
    counters: Counters | None = None,
) -> Storage:
    """Opens the configured database and counters. `upgrade_schema` defaults to True for SQLite."""
    files = open_file_store(settings)  # first: bad s3_* settings fail before anything opens
    url = settings.resolved_database_url
    engine = create_engine(url)
    auto = is_sqlite(url) if upgrade_schema is None else upgrade_schema
    try:
        await ensure_schema(engine, url, auto_upgrade=auto)
    except BaseException:
        await engine.dispose()
        raise
    usage = UsageRepository(engine)
    if counters is None:
        if settings.redis_url:
            counters = RedisCounters.from_url(
                settings.redis_url,
                usage.read_settled,
                prefix=settings.redis_prefix,
                lease_ms=settings.lease_ms,
            )
        else:
            counters = EmbeddedCounters(usage.read_settled)
    logger.info(
        "storage open: %s, %s counters, files in %s",
        engine.dialect.name,
        counters.name,
        f"bucket {settings.s3_bucket}" if settings.s3_bucket else settings.resolved_files_dir,
    )
    return Storage(
        engine=engine,
        accounts=AccountRepository(engine),
        keys=KeyRepository(engine),
        key_events=KeyEventLog(engine),
        usage=usage,
        ledger=UsageLedger(
            usage, on_written=on_usage_written, max_pending=settings.usage_queue_max_rows
        ),
        counters=counters,
        settings=settings,
        jobs=JobRepository(engine),
        idempotency=IdempotencyRecords(engine),
        harvests=HarvestRepository(engine),
        files=files,
        looms=LoomRepository(engine),
        registry=RegistryRepository(engine),
        applications=ApplicationRepository(engine),
    )
