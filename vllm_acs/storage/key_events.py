"""The audit trail of every operator and key-management action: one row per change of a key,
an account or an application, written in the transaction that makes the change
(`KeyRepository.create` / `update`, `ApplicationRepository`, `AccountManager`), read by
`vllm-acs keys log` and `GET /v1/admin/audit`.

Used by the CLI and the API server. A row names the actor (a key id, `operator` for the command
line, or an application's id for what an applicant did), the action, the key (`-` for an action
on an account or an application) and what changed; never a secret, a claim code or a hash. A
change the key manager refused is a row too (action `refuse`, written on its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .tables import key_events
from .transactions import utc, write_transaction

OPERATOR = "operator"
# The key column of an action on an account or an application.
NO_KEY = "-"
KEY_ACTIONS = ("create", "set", "pause", "resume", "revoke", "refuse")
ACCOUNT_ACTIONS = ("account_create", "account_set")
APPLICATION_ACTIONS = ("apply", "approve", "reject", "claim")
ACTIONS = KEY_ACTIONS + ACCOUNT_ACTIONS + APPLICATION_ACTIONS


@dataclass(frozen=True)
class KeyEvent:
    """What an actor does to a key; `at` and the key's id and account are filled in on write."""

    actor: str
    action: str
    changes: dict[str, Any]


@dataclass(frozen=True)
class KeyEventRow:
    id: int
    at: datetime
    account_id: str
    key_id: str
    actor: str
    action: str
    changes: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "account_id": self.account_id,
            "key_id": self.key_id,
            "actor": self.actor,
            "action": self.action,
            "changes": self.changes,
        }


async def record_event(
    conn: AsyncConnection, event: KeyEvent, *, key_id: str, account_id: str, at: datetime
) -> None:
    if event.action not in ACTIONS:
        raise ValueError(f"unknown key action {event.action!r}")
    await conn.execute(
        key_events.insert().values(
            at=at,
            account_id=account_id,
            key_id=key_id,
            actor=event.actor,
            action=event.action,
            changes=json.dumps(event.changes, sort_keys=True, default=str),
        )
    )


def _row(row: Any) -> KeyEventRow:
    at = row.at if row.at.tzinfo is not None else row.at.replace(tzinfo=timezone.utc)
    return KeyEventRow(
        row.id, at, row.account_id, row.key_id, row.actor, row.action, json.loads(row.changes)
    )


class KeyEventLog:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def record(self, event: KeyEvent, *, key_id: str, account_id: str) -> None:
        """One row in a transaction of its own (a refusal, or an account's change made by a
        repository that does not write the trail itself)."""
        async with write_transaction(self._engine) as conn:
            await record_event(
                conn, event, key_id=key_id, account_id=account_id, at=datetime.now(timezone.utc)
            )

    async def list(
        self,
        *,
        account_id: str | None = None,
        key_id: str | None = None,
        limit: int = 100,
    ) -> list[KeyEventRow]:
        """The newest `limit` events (of an account, or of a key), oldest first."""
        return (await self.newest(account_id=account_id, key_id=key_id, limit=limit))[::-1]

    async def newest(
        self,
        *,
        account_id: str | None = None,
        key_id: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> list[KeyEventRow]:
        """The newest `limit` events that match every filter given, newest first; `before`
        (an event id) pages back."""
        c = key_events.c
        query = select(key_events).order_by(c.id.desc()).limit(limit)
        for column, value in ((c.account_id, account_id), (c.key_id, key_id), (c.actor, actor)):
            if value is not None:
                query = query.where(column == value)
        if action is not None:
            query = query.where(c.action == action)
        if since is not None:
            query = query.where(c.at >= utc(since))
        if before is not None:
            query = query.where(c.id < before)
        async with self._engine.connect() as conn:
            return [_row(row) for row in await conn.execute(query)]
