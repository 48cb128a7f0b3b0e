"""API keys: create (secret shown once), list, find by id or visible prefix, state, limits, and the
per-request lookup that authentication uses. A change may carry a `KeyEvent`, written to the
audit trail in the same transaction.

Used by the CLI and the API server (through `account/key_manager.py`). Only the SHA-256 of a
secret is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..auth.principal import DEFAULT_SCOPES, KEY_LIMIT_FIELDS, SCOPES
from .api_key_secret import hash_secret, new_secret, visible_prefix
from .errors import ConflictError, KeyCapacityReached, NotFoundError, PausedByOperator
from .key_events import OPERATOR, KeyEvent, record_event
from .tables import accounts, api_keys, usage_rows
from .transactions import point_read, serialize_per_key, write_transaction

KEY_STATES = ("active", "paused", "revoked")


@dataclass(frozen=True)
class ApiKey:
    id: str
    account_id: str
    prefix: str
    name: str | None
    state: str
    scopes: tuple[str, ...]
    monthly_tokens: int | None
    daily_tokens: int | None
    monthly_input_tokens: int | None
    monthly_output_tokens: int | None
    max_running: int | None
    max_waiting: int | None
    starts_per_minute: int | None
    monthly_activation_requests: int | None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    # A paused key's pauser: `operator`, or the id of the key that paused it (None: not paused).
    paused_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "scopes": list(self.scopes),
            "created_at": _iso(self.created_at),
            "revoked_at": _iso(self.revoked_at),
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)  # SQLite hands back naive datetimes


@dataclass(frozen=True)
class KeyWithAccount:
    """What authentication needs in one query: the key, its hash, and its account's state."""

    key: ApiKey
    secret_hash: str
    account_status: str
    account_spend_capped: bool
    account_monthly_tokens: int | None


def _key(row: Any) -> ApiKey:
    return ApiKey(
        id=row.id,
        account_id=row.account_id,
        prefix=row.prefix,
        name=row.name,
        state=row.state,
        scopes=tuple(s for s in row.scopes.split(",") if s),
        **{f: getattr(row, f) for f in KEY_LIMIT_FIELDS},
        created_at=_utc(row.created_at),
        revoked_at=_utc(row.revoked_at),
        paused_by=row.paused_by,
    )


def _with_account(row: Any) -> KeyWithAccount:
    return KeyWithAccount(
        key=_key(row),
        secret_hash=row.secret_hash,
        account_status=row.account_status,
        account_spend_capped=bool(row.account_spend_capped),
        account_monthly_tokens=row.account_monthly_tokens,
    )


def parse_scopes(text: str) -> tuple[str, ...]:
    scopes = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = sorted(set(scopes) - SCOPES)
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}, got {text!r}")
    return scopes


class KeyRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        # Auth reads one row per request. SQLite: inline (`point_read`). PostgreSQL: a
        # dedicated autocommit connection skips the pool's checkout and reset, which cost more
        # than the query (no transaction stays open, so every read sees the latest commit).
        self._reader: AsyncConnection | None = None
        self._reader_lock = asyncio.Lock()

    async def create(
        self,
        account_id: str,
        *,
        scopes: tuple[str, ...] = tuple(sorted(DEFAULT_SCOPES)),
        name: str | None = None,
        event: KeyEvent | None = None,
        max_live: int | None = None,
        **limits: int | None,
    ) -> tuple[ApiKey, str]:
        """A new active key; returns it with its secret, which is never readable again.
        `event` (its changes completed with the key's settings) goes to the audit trail.
        `max_live`: refused (`KeyCapacityReached`) when the account has that many keys that are
        not revoked; counted and inserted in one transaction, exclusive per account."""
        unknown = set(limits) - set(KEY_LIMIT_FIELDS)
        if unknown:
            raise ValueError(f"unknown key limits: {sorted(unknown)}")
        for _attempt in range(5):  # a visible-prefix collision is a 1 in 2^48 event
            secret = new_secret()
            values: dict[str, Any] = {
                "id": "key_" + secrets.token_hex(8),
                "account_id": account_id,
                "prefix": visible_prefix(secret),
                "secret_hash": hash_secret(secret),
                "name": name,
                "state": "active",
                "scopes": ",".join(scopes),
                "created_at": datetime.now(timezone.utc),
                **{f: limits.get(f) for f in KEY_LIMIT_FIELDS},
            }
            try:
                async with write_transaction(self._engine) as conn:
                    if max_live is not None:
                        await _check_live(conn, account_id, max_live)
                    await conn.execute(api_keys.insert().values(**values))
                    if event is not None:
                        await record_event(
                            conn,
                            event,
                            key_id=values["id"],
                            account_id=account_id,
                            at=values["created_at"],
                        )
            except IntegrityError as error:
                if "prefix" not in str(error.orig).lower():
                    raise ConflictError(f"cannot create a key for account {account_id!r}") from None
                continue
            return await self.get(values["id"]), secret
        raise ConflictError("could not find a free key prefix")

    async def get(self, ref: str) -> ApiKey:
        """The key whose id or visible prefix is `ref`."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(api_keys).where(or_(api_keys.c.id == ref, api_keys.c.prefix == ref))
                )
            ).first()
        if row is None:
            raise NotFoundError(f"no key {ref!r}")
        return _key(row)

    async def list(self, account_id: str | None = None) -> list[ApiKey]:
        query = select(api_keys).order_by(api_keys.c.created_at)
        if account_id is not None:
            query = query.where(api_keys.c.account_id == account_id)
        async with self._engine.connect() as conn:
            return [_key(row) for row in await conn.execute(query)]

    async def last_used(self, key_ids: list[str]) -> dict[str, datetime]:
        """When each key's last request that reached admission was made (its newest usage row);
        a key without one is missing. Read from the usage rows: no write per request."""
        if not key_ids:
            return {}
        c = usage_rows.c
        query = (
            select(c.key_id, func.max(c.created_at).label("at"))
            .where(c.key_id.in_(key_ids))
            .group_by(c.key_id)
        )
        async with self._engine.connect() as conn:
            return {row.key_id: _utc(row.at) for row in await conn.execute(query) if row.at}

    async def update(
        self, ref: str, event: KeyEvent | None = None, *, by: str = OPERATOR, **values: Any
    ) -> ApiKey:
        """Changes a key; a state change of a revoked key is refused (revoking is permanent).
        The check is part of the UPDATE, so a revoke that lands first always wins. Another
        actor than the operator (`by`) neither resumes nor re-pauses a key the operator paused
        (a resume is `PausedByOperator`, a pause leaves it as it is), in the UPDATE too, so an
        operator's pause that lands first wins."""
        key = await self.get(ref)
        statement = update(api_keys).where(api_keys.c.id == key.id)
        if "state" in values:
            statement = statement.where(api_keys.c.state != "revoked")
        guarded = values.get("state") in ("active", "paused") and by != OPERATOR
        if guarded:
            c = api_keys.c
            statement = statement.where(or_(c.paused_by.is_(None), c.paused_by != OPERATOR))
        async with write_transaction(self._engine) as conn:
            changed = (await conn.execute(statement.values(**values))).rowcount
            if changed and event is not None:
                await record_event(
                    conn,
                    event,
                    key_id=key.id,
                    account_id=key.account_id,
                    at=datetime.now(timezone.utc),
                )
        if not changed:
            now = await self.get(key.id)
            if guarded and now.state == "paused" and values["state"] == "paused":
                return now  # the operator's pause stays the operator's
            if guarded and now.state == "paused":
                raise PausedByOperator(
                    f"key {key.prefix} was paused by the operator; only the operator resumes it"
                )
            raise ConflictError(f"key {key.prefix} is revoked; revoking is permanent")
        return await self.get(key.id)

    async def set_state(
        self, ref: str, state: str, event: KeyEvent | None = None, *, by: str = OPERATOR
    ) -> ApiKey:
        """`by` (the operator, or a key's id) is kept as the pauser of a paused key."""
        if state not in KEY_STATES:
            raise ValueError(f"state must be one of {KEY_STATES}")
        extra: dict[str, Any] = {"paused_by": by if state == "paused" else None}
        if state == "revoked":
            extra["revoked_at"] = datetime.now(timezone.utc)
        return await self.update(ref, event, by=by, state=state, **extra)

    async def set_limits(
        self, ref: str, event: KeyEvent | None = None, **limits: int | str | None
    ) -> ApiKey:
        unknown = set(limits) - set(KEY_LIMIT_FIELDS) - {"scopes", "name"}
        if unknown:
            raise ValueError(f"unknown key settings: {sorted(unknown)}")
        return await self.update(ref, event, **limits)

    async def lookup(self, prefix: str) -> KeyWithAccount | None:
        """One indexed query per request: no cache, so a pause or revoke counts at once."""
        if self._engine.dialect.name == "sqlite":
            async with point_read(self._engine) as conn:
                row = (await conn.execute(_LOOKUP, {"prefix": prefix})).first()
            return None if row is None else _with_account(row)
        async with self._reader_lock:
            try:
                row = await self._read(prefix)
            except DBAPIError:
                # A broken connection (the database restarted): reconnect once, then give up.
                await self.close()
                row = await self._read(prefix)
        return None if row is None else _with_account(row)

    async def _read(self, prefix: str) -> Any:
        if self._reader is None:
            self._reader = await self._engine.connect()
            await self._reader.execution_options(isolation_level="AUTOCOMMIT")
        return (await self._reader.execute(_LOOKUP, {"prefix": prefix})).first()

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.close()


async def _check_live(conn: Any, account_id: str, max_live: int) -> None:
    await serialize_per_key(conn, f"account-keys:{account_id}")
    live = (
        await conn.execute(
            select(func.count())
            .select_from(api_keys)
            .where(api_keys.c.account_id == account_id, api_keys.c.state != "revoked")
        )
    ).scalar_one()
    if live >= max_live:
        raise KeyCapacityReached(max_live)


# Built once: constructing the statement per request costs more than running it on SQLite.
_LOOKUP = (
    select(
        api_keys,
        accounts.c.status.label("account_status"),
        accounts.c.spend_capped.label("account_spend_capped"),
        accounts.c.monthly_tokens.label("account_monthly_tokens"),
    )
    .join(accounts, accounts.c.id == api_keys.c.account_id)
    .where(api_keys.c.prefix == bindparam("prefix"))
)
