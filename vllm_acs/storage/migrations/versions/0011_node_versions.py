"""The versions each node runs (issue 34, the console's Nodes): `deployment_nodes.plugin_version`
and `vllm_version`, null for a node that did not report them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_nodes") as batch:
        batch.add_column(sa.Column("plugin_version", sa.String(40), nullable=True))
        batch.add_column(sa.Column("vllm_version", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployment_nodes") as batch:
        batch.drop_column("vllm_version")
        batch.drop_column("plugin_version")
