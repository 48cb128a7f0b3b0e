"""Applications for access (issue 34): the form's answers, the pending account each made, the
hash of its one-time claim code and of the client address it came from, the operator's decision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "applications",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("email", sa.String(254), nullable=False),
        sa.Column("affiliation", sa.String(200), nullable=False),
        sa.Column("intended_use", sa.Text, nullable=False),
        sa.Column("code_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("address_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.String(40), nullable=True),
        sa.Column("note", sa.String(500), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("key_id", sa.String(40), nullable=True),
    )
    op.create_index(
        "ix_applications_address_created", "applications", ["address_hash", "created_at"]
    )
    op.create_index("ix_applications_status_created", "applications", ["status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_applications_status_created", table_name="applications")
    op.drop_index("ix_applications_address_created", table_name="applications")
    op.drop_table("applications")
