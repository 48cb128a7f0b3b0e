"""Alembic environment: runs migrations on the connection `storage.migrate` hands over.

Runs wherever `upgrade()` runs (the CLI, or the API server at start for an embedded SQLite).
There is no alembic.ini: the package configures Alembic in code, so `pip install` is enough.
"""

from __future__ import annotations

from alembic import context

from vllm_acs.storage.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things in place; batch mode rebuilds tables when a migration must.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
