"""Accounts, API keys, budget counters and usage rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spend_capped", sa.Boolean, nullable=False),
        sa.Column("monthly_tokens", sa.BigInteger, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False, unique=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("scopes", sa.String(200), nullable=False),
        sa.Column("monthly_tokens", sa.BigInteger, nullable=True),
        sa.Column("daily_tokens", sa.BigInteger, nullable=True),
        sa.Column("monthly_input_tokens", sa.BigInteger, nullable=True),
        sa.Column("monthly_output_tokens", sa.BigInteger, nullable=True),
        sa.Column("max_running", sa.Integer, nullable=True),
        sa.Column("max_waiting", sa.Integer, nullable=True),
        sa.Column("starts_per_minute", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_api_keys_account_id", "api_keys", ["account_id"])
    op.create_table(
        "budget_counters",
        sa.Column("counter", sa.String(160), primary_key=True),
        sa.Column("used", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "usage_rows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("key_id", sa.String(40), nullable=True),
        sa.Column("key_prefix", sa.String(32), nullable=True),
        sa.Column("account_id", sa.String(40), nullable=True),
        sa.Column("route", sa.String(120), nullable=False),
        sa.Column("model", sa.String(200), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Integer, nullable=False),
        sa.Column("workload", sa.String(64), nullable=True),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_usage_rows_key_period", "usage_rows", ["key_id", "period"])
    op.create_index("ix_usage_rows_account_period", "usage_rows", ["account_id", "period"])


def downgrade() -> None:
    op.drop_table("usage_rows")
    op.drop_table("budget_counters")
    op.drop_table("api_keys")
    op.drop_table("accounts")
