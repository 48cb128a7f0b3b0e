"""Accounts: create, list, approve, suspend, spend-cap, the monthly total across keys.

Used by the CLI and the API server. An account is `pending` until approved; `suspended` refuses
every key (401); `spend_capped` is an operator pause (429 spend_cap).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import ConflictError, NotFoundError
from .tables import accounts
from .transactions import write_transaction


@dataclass(frozen=True)
class Account:
    id: str
    name: str
    status: str
    spend_capped: bool
    monthly_tokens: int | None
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "spend_capped": self.spend_capped,
            "monthly_tokens": self.monthly_tokens,
            "created_at": self.created_at.isoformat(),
        }


def _account(row: Any) -> Account:
    created = row.created_at
    if created.tzinfo is None:  # SQLite hands back naive datetimes
        created = created.replace(tzinfo=timezone.utc)
    return Account(
        row.id, row.name, row.status, bool(row.spend_capped), row.monthly_tokens, created
    )


class AccountRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create(
        self, name: str, *, approved: bool = False, monthly_tokens: int | None = None
    ) -> Account:
        values = {
            "id": "acct_" + secrets.token_hex(8),
            "name": name,
            "status": "approved" if approved else "pending",
            "spend_capped": False,
            "monthly_tokens": monthly_tokens,
            "created_at": datetime.now(timezone.utc),
        }
        try:
            async with write_transaction(self._engine) as conn:
                await conn.execute(accounts.insert().values(**values))
        except IntegrityError:
            raise ConflictError(f"an account named {name!r} exists already") from None
        return Account(**values)

    async def get(self, ref: str) -> Account:
        """The account whose id or name is `ref`."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(accounts).where(or_(accounts.c.id == ref, accounts.c.name == ref))
                )
            ).first()
        if row is None:
            raise NotFoundError(f"no account {ref!r}")
        return _account(row)

    async def list(self) -> list[Account]:
        async with self._engine.connect() as conn:
            rows = await conn.execute(select(accounts).order_by(accounts.c.created_at))
            return [_account(row) for row in rows]

    async def update(self, ref: str, **values: Any) -> Account:
        account = await self.get(ref)
        async with write_transaction(self._engine) as conn:
            await conn.execute(update(accounts).where(accounts.c.id == account.id).values(**values))
        return await self.get(account.id)

    async def approve(self, ref: str) -> Account:
        return await self.update(ref, status="approved")

    async def suspend(self, ref: str) -> Account:
        return await self.update(ref, status="suspended")

    async def set_spend_cap(self, ref: str, capped: bool) -> Account:
        return await self.update(ref, spend_capped=capped)

    async def set_monthly_tokens(self, ref: str, tokens: int | None) -> Account:
        return await self.update(ref, monthly_tokens=tokens)
