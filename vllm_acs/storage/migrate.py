"""Schema upgrades with Alembic, configured in code from the migrations shipped in this package.

Runs in the CLI (`vllm-acs db upgrade`) and in the API server at start (embedded SQLite only).
"""

from __future__ import annotations

import logging
from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger(__name__)


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(resources.files(__package__) / "migrations"))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(_current)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> str | None:
    """Upgrades the database to `revision`; returns the revision it is at afterwards."""

    def run(connection: Connection) -> str | None:
        if connection.dialect.name == "postgresql":
            # Nodes upgrading at once take turns; the lock ends with the transaction.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7356123)")
        before = _current(connection)
        command.upgrade(_config(connection), revision)
        after = _current(connection)
        if before != after:
            logger.info("database schema upgraded from %s to %s", before, after)
        return after

    async with engine.begin() as connection:
        return await connection.run_sync(run)
