"""The deployment's model registry: its API nodes and what each serves.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment_nodes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(300), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_deployment_nodes_heartbeat", "deployment_nodes", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index("ix_deployment_nodes_heartbeat", table_name="deployment_nodes")
    op.drop_table("deployment_nodes")
