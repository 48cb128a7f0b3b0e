"""The audit trail of key management: who did what to which key, when.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("account_id", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("actor", sa.String(40), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("changes", sa.Text, nullable=False),
    )
    op.create_index("ix_key_events_account_at", "key_events", ["account_id", "at"])
    op.create_index("ix_key_events_key", "key_events", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_key_events_key", table_name="key_events")
    op.drop_index("ix_key_events_account_at", table_name="key_events")
    op.drop_table("key_events")
