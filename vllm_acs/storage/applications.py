"""Applications for access: a submit held to the per-address limit and the pending cap (checked
and written in one transaction, with the pending account it makes and its `apply` audit row), the
operator's decision, and the claim that hands out the first key once.

Used by the CLI and the API server. Stores the claim code's SHA-256 and a hash of the client
address, never either one. Times are the caller's `now`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import ConflictError, NotFoundError, StorageError
from .key_events import NO_KEY, KeyEvent, record_event
from .tables import accounts, applications
from .transactions import serialize_per_key, utc, utc_or_none, write_transaction

ADDRESS_WINDOW = timedelta(hours=1)
# What an applicant wrote: each bounded by the route (and by the columns).
ANSWERS = ("name", "email", "affiliation", "intended_use")
STATUSES = ("pending", "approved", "rejected", "claimed", "expired")


class AddressLimited(StorageError):
    """This client address made `limit` applications in the last hour already."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{limit} applications from this address in the last hour")
        self.limit = limit
        self.retry_after_s = retry_after_s


class PendingCapReached(StorageError):
    """`limit` applications wait for review already."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} applications wait for review already")
        self.limit = limit


class ApplicationNotFound(NotFoundError):
    pass


class NotPending(ConflictError):
    """A decision on an application that is not pending (decided, claimed or expired)."""

    def __init__(self, application_id: str, status: str) -> None:
        super().__init__(f"application {application_id} is {status}, not pending")
        self.status = status


class NotClaimable(ConflictError):
    """A claim of an application in `status` (pending, rejected, expired, claimed)."""

    def __init__(self, status: str) -> None:
        super().__init__(f"the application is {status}")
        self.status = status


@dataclass(frozen=True)
class Application:
    id: str
    account_id: str
    stored_status: str
    name: str
    email: str
    affiliation: str
    intended_use: str
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    claimed_at: datetime | None
    key_id: str | None

    def status_at(self, now: datetime) -> str:
        """The stored status, or `expired` for one still pending or unclaimed past its time."""
        if self.stored_status in ("pending", "approved") and utc(now) >= self.expires_at:
            return "expired"
        return self.stored_status


def _application(row: Any) -> Application:
    return Application(
        id=row.id,
        account_id=row.account_id,
        stored_status=row.status,
        name=row.name,
        email=row.email,
        affiliation=row.affiliation,
        intended_use=row.intended_use,
        created_at=utc_or_none(row.created_at),  # type: ignore[arg-type]
        expires_at=utc_or_none(row.expires_at),  # type: ignore[arg-type]
        decided_at=utc_or_none(row.decided_at),
        decided_by=row.decided_by,
        note=row.note,
        claimed_at=utc_or_none(row.claimed_at),
        key_id=row.key_id,
    )


def _event(actor: str, action: str, application_id: str, **changes: Any) -> KeyEvent:
    return KeyEvent(actor, action, {"application_id": application_id, **changes})


class ApplicationRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def submit(
        self,
        answers: dict[str, str],
        *,
        code_hash: str,
        address_hash: str,
        now: datetime,
        ttl: timedelta,
        per_address: int,
        pending_cap: int,
    ) -> Application:
        """A new pending application and its pending account, unless the address made
        `per_address` applications in the last hour (`AddressLimited`) or `pending_cap` wait
        for review (`PendingCapReached`). Checked and written in one transaction, taken in turn
        by every submit of the deployment."""
        now = utc(now)
        app_id = "app_" + secrets.token_hex(8)
        account_id = "acct_" + secrets.token_hex(8)
        c = applications.c
        async with write_transaction(self._engine) as conn:
            await serialize_per_key(conn, "applications")
            recent = (
                await conn.execute(
                    select(func.count(), func.min(c.created_at)).where(
                        c.address_hash == address_hash, c.created_at > now - ADDRESS_WINDOW
                    )
                )
            ).one()
            if recent[0] >= per_address:
                oldest = utc_or_none(recent[1]) or now
                wait = (oldest + ADDRESS_WINDOW - now).total_seconds()
                raise AddressLimited(per_address, max(1, int(wait) + 1))
            pending = (
                await conn.execute(
                    select(func.count()).where(c.status == "pending", c.expires_at > now)
                )
            ).scalar_one()
            if pending >= pending_cap:
                raise PendingCapReached(pending_cap)
            name = answers["email"]
            taken = (
                await conn.execute(select(func.count()).where(accounts.c.name == name))
            ).scalar_one()
            if taken:
                name = f"{name} ({app_id})"
            await conn.execute(
                accounts.insert().values(
                    id=account_id,
                    name=name,
                    status="pending",
                    spend_capped=False,
                    monthly_tokens=None,
                    created_at=now,
                )
            )
            await conn.execute(
                applications.insert().values(
                    id=app_id,
                    account_id=account_id,
                    status="pending",
                    code_hash=code_hash,
                    address_hash=address_hash,
                    created_at=now,
                    expires_at=now + ttl,
                    **{k: answers[k] for k in ANSWERS},
                )
            )
            shown = {k: answers[k] for k in ("name", "email", "affiliation")}
            await record_event(
                conn,
                _event(app_id, "apply", app_id, **shown),
                key_id=NO_KEY,
                account_id=account_id,
                at=now,
            )
        return await self.get(app_id)

    async def get(self, application_id: str) -> Application:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(applications).where(applications.c.id == application_id))
            ).first()
        if row is None:
            raise ApplicationNotFound(f"no application {application_id!r}")
        return _application(row)

    async def by_code_hash(self, code_hash: str) -> Application | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(applications).where(applications.c.code_hash == code_hash)
                )
            ).first()
        return None if row is None else _application(row)

    async def list(self, status: str | None, now: datetime, limit: int = 100) -> list[Application]:
        """Newest first; `status` as `status_at` reads it (None: all)."""
        now = utc(now)
        c = applications.c
        query = select(applications).order_by(c.created_at.desc(), c.id).limit(limit)
        if status == "expired":
            query = query.where(c.status.in_(("pending", "approved")), c.expires_at <= now)
        elif status in ("pending", "approved"):
            query = query.where(c.status == status, c.expires_at > now)
        elif status is not None:
            query = query.where(c.status == status)
        async with self._engine.connect() as conn:
            return [_application(row) for row in await conn.execute(query)]

    async def decide(
        self,
        application_id: str,
        decision: str,
        *,
        actor: str,
        now: datetime,
        note: str | None = None,
        monthly_tokens: int | None = None,
    ) -> Application:
        """Approves (`approved`: the account too, with its monthly total) or rejects
        (`rejected`: the account too) a pending, unexpired application, and audits it, in one
        transaction; anything else is `NotPending`."""
        if decision not in ("approved", "rejected"):
            raise ValueError(f"decision must be approved or rejected, got {decision!r}")
        now = utc(now)
        found = await self.get(application_id)
        c = applications.c
        async with write_transaction(self._engine) as conn:
            changed = (
                await conn.execute(
                    update(applications)
                    .where(c.id == found.id, c.status == "pending", c.expires_at > now)
                    .values(status=decision, decided_at=now, decided_by=actor, note=note)
                )
            ).rowcount
            if changed:
                account = {"status": decision}
                if decision == "approved":
                    account["monthly_tokens"] = monthly_tokens  # type: ignore[assignment]
                await conn.execute(
                    update(accounts).where(accounts.c.id == found.account_id).values(**account)
                )
                details: dict[str, Any] = {"note": note}
                if decision == "approved":
                    details["monthly_tokens"] = monthly_tokens
                action = "approve" if decision == "approved" else "reject"
                await record_event(
                    conn,
                    _event(actor, action, found.id, **details),
                    key_id=NO_KEY,
                    account_id=found.account_id,
                    at=now,
                )
        if not changed:
            raise NotPending(found.id, (await self.get(found.id)).status_at(now))
        return await self.get(found.id)

    async def start_claim(self, code_hash: str, now: datetime) -> Application:
        """Marks the approved, unexpired application of `code_hash` claimed, atomically: of two
        claims at once, one wins and the other is `NotClaimable("claimed")`. The caller makes the
        key and calls `finish_claim` (or `undo_claim` when it could not)."""
        now = utc(now)
        found = await self.by_code_hash(code_hash)
        if found is None:
            raise ApplicationNotFound("no application with this claim code")
        c = applications.c
        async with write_transaction(self._engine) as conn:
            changed = (
                await conn.execute(
                    update(applications)
                    .where(c.id == found.id, c.status == "approved", c.expires_at > now)
                    .values(status="claimed", claimed_at=now)
                )
            ).rowcount
        if not changed:
            raise NotClaimable((await self.get(found.id)).status_at(now))
        return await self.get(found.id)

    async def finish_claim(self, application: Application, key_id: str, now: datetime) -> None:
        async with write_transaction(self._engine) as conn:
            await conn.execute(
                update(applications)
                .where(applications.c.id == application.id)
                .values(key_id=key_id)
            )
            await record_event(
                conn,
                _event(application.id, "claim", application.id, key_id=key_id),
                key_id=NO_KEY,
                account_id=application.account_id,
                at=utc(now),
            )

    async def undo_claim(self, application: Application) -> None:
        async with write_transaction(self._engine) as conn:
            await conn.execute(
                update(applications)
                .where(applications.c.id == application.id, applications.c.key_id.is_(None))
                .values(status="approved", claimed_at=None)
            )
