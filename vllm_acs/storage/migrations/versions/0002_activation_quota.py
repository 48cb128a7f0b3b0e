"""The per-key monthly activation quota: its limit on api_keys, the units used on usage rows.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch_alter_table: SQLite cannot drop a column in place (downgrade), PostgreSQL ignores it.
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("monthly_activation_requests", sa.Integer, nullable=True))
    with op.batch_alter_table("usage_rows") as batch:
        batch.add_column(
            sa.Column("activation_requests", sa.Integer, nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_rows") as batch:
        batch.drop_column("activation_requests")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("monthly_activation_requests")
