"""Who paused a key: `api_keys.paused_by` (`operator`, or the id of the key that paused it).

A key that the operator paused stays paused until the operator resumes it. Keys paused before
this migration take the actor of their last `pause` in the audit trail, or `operator` when the
trail has none (before migration 0006 only the operator's commands could pause a key).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("paused_by", sa.String(40), nullable=True))
    op.execute(
        "UPDATE api_keys SET paused_by = COALESCE("
        "(SELECT e.actor FROM key_events e WHERE e.key_id = api_keys.id AND e.action = 'pause' "
        "ORDER BY e.id DESC LIMIT 1), 'operator') WHERE state = 'paused'"
    )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("paused_by")
