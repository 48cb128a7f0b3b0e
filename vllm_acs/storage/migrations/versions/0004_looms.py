"""Looms and their Nodes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "looms",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("account_id", sa.String(40), nullable=False),
        sa.Column("title", sa.String(200), nullable=True),
        sa.Column("node_count", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_looms_key_created", "looms", ["key_id", "created_at"])
    op.create_table(
        "loom_nodes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("loom_id", sa.String(40), nullable=False),
        sa.Column("parent_id", sa.String(40), nullable=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("bookmarked", sa.Boolean, nullable=False),
        sa.Column("generation", sa.Text, nullable=True),
        sa.Column("token_ids", sa.Text, nullable=True),
        sa.Column("tokens", sa.Text, nullable=True),
        sa.Column("score", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("extra", sa.Text, nullable=True),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_loom_nodes_loom", "loom_nodes", ["loom_id"])
    op.create_index("ix_loom_nodes_job", "loom_nodes", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_loom_nodes_job", table_name="loom_nodes")
    op.drop_index("ix_loom_nodes_loom", table_name="loom_nodes")
    op.drop_table("loom_nodes")
    op.drop_index("ix_looms_key_created", table_name="looms")
    op.drop_table("looms")
