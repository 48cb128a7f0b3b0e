"""The parts of a job: `jobs.parent_id` (a harvest's parts name their harvest) and
`jobs.progress` (a running part's shards, prompts and rows done, as JSON), for one harvest spread
over every node of its model (issue 33).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("progress", sa.Text, nullable=True))
    op.create_index("ix_jobs_parent", "jobs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("progress")
        batch.drop_column("parent_id")
