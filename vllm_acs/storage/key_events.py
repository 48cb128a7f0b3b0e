"""The audit trail of key management: one row per change of a key, written in the transaction
that makes the change (`KeyRepository.create` / `update`), read by `vllm-acs keys log`.

Used by the CLI and the API server. A row names the actor (a key id, or `operator` for the
command line), the action, the key and what changed; never a secret or a hash. A change the key
manager refused is a row too (action `refuse`, written on its own): what was asked and why not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .tables import key_events
from .transactions import write_transaction

OPERATOR = "operator"
ACTIONS = ("create", "set", "pause", "resume", "revoke", "refuse")


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
        """One row in a transaction of its own (a refusal: no change to write it with)."""
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
        query = select(key_events).order_by(key_events.c.id.desc()).limit(limit)
        if account_id is not None:
            query = query.where(key_events.c.account_id == account_id)
        if key_id is not None:
            query = query.where(key_events.c.key_id == key_id)
        async with self._engine.connect() as conn:
            rows = [_row(row) for row in await conn.execute(query)]
        return rows[::-1]
