"""The bytes a Loom's Nodes take: `looms.byte_count`, for the per-Loom and per-key byte quotas.

Looms made before this migration are measured once here, as `loom_records.node_bytes` measures
a Node: the UTF-8 bytes of its text and of its JSON columns.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_MEASURED = ("text", "generation", "token_ids", "tokens", "score", "error", "extra")


def upgrade() -> None:
    with op.batch_alter_table("looms") as batch:
        batch.add_column(sa.Column("byte_count", sa.BigInteger, nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        sizes = [f"coalesce(octet_length({name}), 0)" for name in _MEASURED]
    else:
        sizes = [f"coalesce(length(CAST({name} AS BLOB)), 0)" for name in _MEASURED]
    op.execute(
        "UPDATE looms SET byte_count = (SELECT coalesce(sum("
        + " + ".join(sizes)
        + "), 0) FROM loom_nodes WHERE loom_nodes.loom_id = looms.id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("looms") as batch:
        batch.drop_column("byte_count")
