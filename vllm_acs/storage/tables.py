"""The schema of accounts, keys (and their audit trail), budget counters, usage rows, jobs,
idempotency records, Looms, the deployment's nodes and applications for access, as SQLAlchemy
Core tables.

Imported by the repositories and by Alembic's migrations; one schema for SQLite and PostgreSQL.
Money is integer tokens (BigInteger), never floats.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

accounts = Table(
    "accounts",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    # pending (not approved yet) | approved | suspended
    Column("status", String(16), nullable=False, default="pending"),
    Column("spend_capped", Boolean, nullable=False, default=False),
    Column("monthly_tokens", BigInteger, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("account_id", String(40), ForeignKey("accounts.id"), nullable=False, index=True),
    # The visible part (`acs-bm-` + 8 characters); the lookup index for auth and the CLI.
    Column("prefix", String(32), nullable=False, unique=True),
    Column("secret_hash", String(64), nullable=False),
    Column("name", String(200), nullable=True),
    # active | paused | revoked
    Column("state", String(16), nullable=False, default="active"),
    Column("scopes", String(200), nullable=False),
    Column("monthly_tokens", BigInteger, nullable=True),
    Column("daily_tokens", BigInteger, nullable=True),
    Column("monthly_input_tokens", BigInteger, nullable=True),
    Column("monthly_output_tokens", BigInteger, nullable=True),
    Column("max_running", Integer, nullable=True),
    Column("max_waiting", Integer, nullable=True),
    Column("starts_per_minute", Integer, nullable=True),
    # Activation requests per UTC month (migration 0002); None: the operator's default.
    Column("monthly_activation_requests", Integer, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # Who paused a paused key (migration 0007): `operator`, or the id of the key that paused it.
    # Only the operator resumes a key the operator paused.
    Column("paused_by", String(40), nullable=True),
)

# The audit trail of key management (migration 0006): which actor (a key id, or `operator` for
# the CLI) did what (create, pause, resume, revoke, set) to which key, when, with what changes.
key_events = Table(
    "key_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("account_id", String(40), nullable=False),
    Column("key_id", String(40), nullable=False),
    Column("actor", String(40), nullable=False),
    Column("action", String(16), nullable=False),
    # JSON of what changed ({"state": "paused"}, {"monthly_tokens": 1000}, ...); never a secret.
    Column("changes", Text, nullable=False),
    Index("ix_key_events_account_at", "account_id", "at"),
    Index("ix_key_events_key", "key_id"),
)

# Settled tokens per budget and UTC period (`key:<id>:month:2026-11`), written with the usage
# rows in one transaction: the durable truth the live counters start from.
budget_counters = Table(
    "budget_counters",
    metadata,
    Column("counter", String(160), primary_key=True),
    Column("used", BigInteger, nullable=False, default=0),
)

usage_rows = Table(
    "usage_rows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(64), nullable=True),
    Column("key_id", String(40), nullable=True),
    Column("key_prefix", String(32), nullable=True),
    Column("account_id", String(40), nullable=True),
    Column("route", String(120), nullable=False),
    Column("model", String(200), nullable=True),
    Column("prompt_tokens", BigInteger, nullable=False, default=0),
    Column("completion_tokens", BigInteger, nullable=False, default=0),
    Column("status", Integer, nullable=False),
    Column("latency_ms", Integer, nullable=False),
    Column("workload", String(64), nullable=True),
    # 1 when the row is an activation request that used a unit of the monthly quota (0002).
    Column("activation_requests", Integer, nullable=False, default=0, server_default="0"),
    # The UTC month of the hold (`2026-11`): usage is reported per month without date maths.
    Column("period", String(7), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_usage_rows_key_period", "key_id", "period"),
    Index("ix_usage_rows_account_period", "account_id", "period"),
)

# Completion jobs, harvests and Loom branches (migration 0003); `status` follows `states.py`.
jobs = Table(
    "jobs",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("key_id", String(40), nullable=False),
    Column("account_id", String(40), nullable=False),
    # The served model id the job asks for: a node claims only the models it serves.
    Column("model", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    # 0 on submit; the reaper adds 1 each time it takes a job back from a lost lease.
    Column("attempt", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False),
    Column("owner", String(64), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("not_before", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # JSON of the request, and the raw JSON text of the answer: both emptied by retention.
    Column("request", Text, nullable=True),
    Column("result_status", Integer, nullable=True),
    Column("result_body", Text, nullable=True),
    Column("error_code", String(64), nullable=True),
    # A part's job names the job it is part of (a harvest's parts, migration 0009), and keeps its
    # progress while it runs (JSON: shards, prompts and rows done).
    Column("parent_id", String(40), nullable=True),
    Column("progress", Text, nullable=True),
    Index("ix_jobs_claim", "status", "model", "created_at"),
    Index("ix_jobs_key_status", "key_id", "status"),
    # The retention sweep finds ended jobs by when they ended.
    Index("ix_jobs_finished_at", "finished_at"),
    Index("ix_jobs_parent", "parent_id"),
)

# One record per (API key, Idempotency-Key): the first answer, replayed for a retry (0003).
idempotency_records = Table(
    "idempotency_records",
    metadata,
    Column("key_id", String(40), primary_key=True),
    Column("idempotency_key", String(255), primary_key=True),
    Column("route", String(120), nullable=False),
    # SHA-256 (hex) of what makes two requests the same request; another body is a conflict.
    Column("fingerprint", String(64), nullable=False),
    # running | done | no_answer; a running record whose lease passed reads as no_answer.
    Column("state", String(16), nullable=False),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("status", Integer, nullable=True),
    Column("body", Text, nullable=True),
    Column("headers", Text, nullable=True),
    Column("job_id", String(40), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_idempotency_records_expires_at", "expires_at"),
)

# Looms (migration 0004): a tree of Nodes per Loom, private to the key that made it.
looms = Table(
    "looms",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("key_id", String(40), nullable=False),
    Column("account_id", String(40), nullable=False),
    Column("title", String(200), nullable=True),
    # Kept with every node insert and delete, in the same transaction: the per-Loom node cap.
    Column("node_count", Integer, nullable=False, default=0),
    # The bytes its Nodes take (migration 0008), kept like node_count: the byte quotas.
    Column("byte_count", BigInteger, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_looms_key_created", "key_id", "created_at"),
)

# An adjacency list: `position` orders a parent's children. JSON columns hold what a Node
# records (its generation, token ids, per-token logprobs, a teacher-forced score, an error).
loom_nodes = Table(
    "loom_nodes",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("loom_id", String(40), nullable=False),
    Column("parent_id", String(40), nullable=True),
    Column("position", Integer, nullable=False),
    # root | model | human | split | import
    Column("origin", String(16), nullable=False),
    # generating | ready | failed
    Column("status", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("bookmarked", Boolean, nullable=False, default=False),
    Column("generation", Text, nullable=True),
    Column("token_ids", Text, nullable=True),
    Column("tokens", Text, nullable=True),
    Column("score", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("extra", Text, nullable=True),
    # The branch job that generates it, while it does (a re-run finds its children by it).
    Column("job_id", String(40), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_loom_nodes_loom", "loom_id"),
    Index("ix_loom_nodes_job", "job_id"),
)

# The deployment's model registry (migration 0005): each API node, what it serves, where it
# answers, and when it last said it is alive.
deployment_nodes = Table(
    "deployment_nodes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("address", String(300), nullable=False),
    Column("model_id", String(200), nullable=False),
    # The node's ServedModel as JSON: what /v1/models shows of it on every node.
    Column("model", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False),
    # What the node runs (migration 0011; null: a node that did not say), for the console.
    Column("plugin_version", String(40), nullable=True),
    Column("vllm_version", String(40), nullable=True),
    Index("ix_deployment_nodes_heartbeat", "heartbeat_at"),
)

# Applications for access (migration 0010, issue 34): what the applicant wrote, the pending
# account it made, the SHA-256 of its one-time claim code (never the code), a hash of the
# client address it came from (the per-address rate limit), and the operator's decision.
# `status`: pending, approved, rejected, claimed; "expired" is read from `expires_at`.
applications = Table(
    "applications",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("account_id", String(40), ForeignKey("accounts.id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("name", String(200), nullable=False),
    Column("email", String(254), nullable=False),
    Column("affiliation", String(200), nullable=False),
    Column("intended_use", Text, nullable=False),
    Column("code_hash", String(64), nullable=False, unique=True),
    Column("address_hash", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=True),
    Column("decided_by", String(40), nullable=True),
    Column("note", String(500), nullable=True),
    Column("claimed_at", DateTime(timezone=True), nullable=True),
    Column("key_id", String(40), nullable=True),
    Index("ix_applications_address_created", "address_hash", "created_at"),
    Index("ix_applications_status_created", "status", "created_at"),
)
