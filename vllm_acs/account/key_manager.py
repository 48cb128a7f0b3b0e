"""`KeyManager`: one service for managing keys, with two faces: the operator's `vllm-acs keys`
commands (actor `operator`: any account, any scope, any limit) and the /v1/keys routes (a key with
the `keys` scope acting on its own account). A key never out-ranks its maker: it grants at most
the scopes it holds, sets only token budgets, none above its own nor the account's total (so on
itself it can lower a budget, never raise or clear it); a key it makes inherits every limit it
does not lower; it never resumes a key that the operator paused. Keys per account are capped
(`max_keys_per_account`, the operator's commands included). Every change is written to the audit
trail in the transaction that makes it, and every refusal (`KeyRefused`) as a `refuse` row.

CLI and API server process; storage and the leaves only (no web framework).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..auth.principal import ADMIN_SCOPE, DEFAULT_SCOPES, KEY_LIMIT_FIELDS, SCOPES, Principal
from ..storage.accounts import Account, AccountRepository
from ..storage.api_keys import ApiKey, KeyRepository
from ..storage.errors import ConflictError, KeyCapacityReached, NotFoundError, PausedByOperator
from ..storage.key_events import NO_KEY, OPERATOR, KeyEvent, KeyEventLog, KeyEventRow
from ..storage.periods import key_monthly_counter
from ..storage.usage import UsageRepository

# The budgets a key with the `keys` scope may set (traffic limits and the activation quota stay
# the operator's).
BUDGET_FIELDS = ("monthly_tokens", "daily_tokens", "monthly_input_tokens", "monthly_output_tokens")
_ACTIONS = {"paused": "pause", "active": "resume", "revoked": "revoke"}
_OPERATOR_PAUSED = (
    "API key {prefix} was paused by the operator; only the operator can resume it "
    "(`vllm-acs keys resume`)"
)


class KeyRefused(Exception):
    """A change the actor may not make; `field` names the setting when one is at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ScopeEscalation(KeyRefused):
    """A key tried to grant a scope it does not hold."""


class BudgetAboveAccount(KeyRefused):
    """A key budget above the account's monthly total."""


class LimitAboveOwn(KeyRefused):
    """A key set a budget above its own, or cleared one while it has one itself."""


class OperatorPaused(KeyRefused):
    """A key tried to resume a key that the operator paused."""


class TooManyKeys(KeyRefused):
    """The account has `max_keys_per_account` live keys already."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message, None)
        self.limit = limit


class KeyNotFound(NotFoundError):
    """No such key, or (for a key actor) another account's: the same answer, never a 403."""


class KeyRevoked(ConflictError):
    """A revoked key cannot change any more."""


@dataclass(frozen=True)
class Actor:
    """Who manages keys: the operator, or an API key on its own account."""

    id: str
    account_id: str | None
    scopes: frozenset[str]
    # The key's limits as its principal carries them (defaults resolved): used only when the
    # key has no row of its own (a plugin's principal); a stored key's own row is read instead.
    limits: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def operator(cls) -> Actor:
        return cls(OPERATOR, None, SCOPES)

    @classmethod
    def admin(cls, principal: Principal) -> Actor:
        """An `admin` key in the console: the operator's powers, audited under its own id; it
        never grants the `admin` scope (only the command line does)."""
        return cls(principal.key_id, None, SCOPES)

    @classmethod
    def of_key(cls, principal: Principal) -> Actor:
        limits = tuple((f, getattr(principal.limits, f)) for f in KEY_LIMIT_FIELDS)
        return cls(principal.key_id, principal.account_id, frozenset(principal.scopes), limits)

    @property
    def is_operator(self) -> bool:
        return self.account_id is None


@dataclass(frozen=True)
class KeyListing:
    key: ApiKey
    # Tokens (prompt + completion) settled this UTC month, from the ledger's counters.
    month_spend: int
    # The key's newest usage row (a request that reached admission); None: never used.
    last_used_at: datetime | None


class KeyManager:
    def __init__(
        self,
        accounts: AccountRepository,
        keys: KeyRepository,
        events: KeyEventLog,
        usage: UsageRepository,
        max_keys_per_account: int | None = None,
    ) -> None:
        self._accounts = accounts
        self._keys = keys
        self._events = events
        self._usage = usage
        # Live (active or paused) keys per account; None or 0: no cap.
        self._max_keys = max_keys_per_account or None

    async def _account_of(self, actor: Actor, account_ref: str | None) -> Account:
        if actor.is_operator:
            if account_ref is None:
                raise ValueError("the operator names the account")
            return await self._accounts.get(account_ref)
        return await self._accounts.get(actor.account_id)  # type: ignore[arg-type]

    async def get(self, actor: Actor, ref: str) -> ApiKey:
        """The key `ref` (id or visible prefix); a key actor sees only its own account's."""
        try:
            key = await self._keys.get(ref)
        except NotFoundError:
            raise KeyNotFound(f"no key {ref!r}") from None
        if not actor.is_operator and key.account_id != actor.account_id:
            raise KeyNotFound(f"no key {ref!r}")
        return key

    async def _own_limits(self, actor: Actor) -> dict[str, int | None]:
        """The acting key's own stored limits (None: no cap, or the operator's default)."""
        try:
            key = await self._keys.get(actor.id)
        except NotFoundError:
            return dict(actor.limits)
        return {f: getattr(key, f) for f in KEY_LIMIT_FIELDS}

    async def _check(self, actor: Actor, account: Account, settings: dict[str, Any]) -> None:
        if ADMIN_SCOPE in (settings.get("scopes") or ()) and actor.id != OPERATOR:
            raise ScopeEscalation(
                "the admin scope is granted only by the operator's command line "
                "(`vllm-acs keys create --scopes admin`), never by an API key",
                "scopes",
            )
        if actor.is_operator:
            return
        for field in settings:
            if field not in (*BUDGET_FIELDS, "name", "scopes"):
                raise KeyRefused(f"only the operator sets '{field}'", field)
        scopes = settings.get("scopes")
        if scopes is not None:
            missing = sorted(set(scopes) - actor.scopes)
            if missing:
                raise ScopeEscalation(
                    f"this API key cannot grant scopes it does not hold: {', '.join(missing)}",
                    "scopes",
                )
        own = await self._own_limits(actor)
        for field in BUDGET_FIELDS:
            if field not in settings or own.get(field) is None:
                continue
            value, mine = settings[field], own[field]
            if value is None:
                raise LimitAboveOwn(
                    f"this API key cannot clear '{field}': it has a '{field}' of {mine} "
                    "itself, and a key sets no budget above its own",
                    field,
                )
            if value > mine:
                raise LimitAboveOwn(
                    f"'{field}' ({value}) is above this API key's own '{field}' ({mine}); a key "
                    "sets no budget above its own",
                    field,
                )
        total = account.monthly_tokens
        for field in BUDGET_FIELDS:
            value = settings.get(field)
            if total is not None and value is not None and value > total:
                raise BudgetAboveAccount(
                    f"'{field}' ({value}) is above the account's monthly total ({total}); a key "
                    "budget cannot exceed it",
                    field,
                )

    async def create(
        self,
        actor: Actor,
        account_ref: str | None = None,
        *,
        name: str | None = None,
        scopes: tuple[str, ...] | None = None,
        **limits: int | None,
    ) -> tuple[ApiKey, str]:
        """A new key and its secret (never readable again). A key actor's new key gets the
        default scopes it holds itself unless `scopes` names others it holds."""
        account = await self._account_of(actor, account_ref)
        asked = {"name": name, "scopes": None if scopes is None else sorted(scopes), **limits}
        if scopes is None:
            scopes = tuple(sorted(DEFAULT_SCOPES & actor.scopes)) or tuple(sorted(actor.scopes))
        refused_on = actor.id if not actor.is_operator else NO_KEY
        async with self._auditing(actor, account.id, refused_on, "create", asked):
            await self._check(actor, account, {"scopes": scopes, **limits})
            if not actor.is_operator:
                # What the key does not set is its own value, never "no limit".
                own = await self._own_limits(actor)
                limits = {**{f: own[f] for f in KEY_LIMIT_FIELDS if f not in limits}, **limits}
            set_limits = {f: v for f, v in limits.items() if v is not None}
            event = KeyEvent(
                actor.id, "create", {"name": name, "scopes": sorted(scopes), **set_limits}
            )
            try:
                return await self._keys.create(
                    account.id,
                    name=name,
                    scopes=tuple(scopes),
                    event=event,
                    max_live=self._max_keys,
                    **set_limits,
                )
            except KeyCapacityReached as full:
                raise TooManyKeys(
                    f"account {account.name!r} has {full.limit} live keys, the most it may have "
                    "(max_keys_per_account); revoke one first",
                    full.limit,
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def _auditing(
        self, actor: Actor, account_id: str, key_id: str, attempt: str, asked: dict[str, Any]
    ) -> AsyncIterator[None]:
        """Writes a `refuse` row to the audit trail when the block raises `KeyRefused`."""
        try:
            yield
        except KeyRefused as refusal:
            changes: dict[str, Any] = {"attempt": attempt, "asked": asked, "reason": str(refusal)}
            if refusal.field is not None:
                changes["field"] = refusal.field
            await self._events.record(
                KeyEvent(actor.id, "refuse", changes), key_id=key_id, account_id=account_id
            )
            raise

    async def list(self, actor: Actor, account_ref: str | None = None) -> list[ApiKey]:
        if actor.is_operator and account_ref is None:
            return await self._keys.list(None)
        account = await self._account_of(actor, account_ref)
        return await self._keys.list(account.id)

    async def listing(self, actor: Actor, period: str) -> list[KeyListing]:
        """The account's keys with this month's spend and when each was last used."""
        return await self.listings(await self.list(actor), period)

    async def listings(self, keys: list[ApiKey], period: str) -> list[KeyListing]:
        """`keys` with the tokens each settled in `period` (YYYY-MM) and its last use."""
        counters = {k.id: f"{key_monthly_counter(k.id)}:{period}" for k in keys}
        spent = await self._usage.read_settled(counters.values())
        used = await self._keys.last_used([k.id for k in keys])
        return [KeyListing(k, spent.get(counters[k.id], 0), used.get(k.id)) for k in keys]

    async def change(self, actor: Actor, ref: str, **settings: Any) -> ApiKey:
        """Changes the name, limits or scopes; only what is given (None clears a limit)."""
        return await self._change(actor, await self.get(actor, ref), settings)

    async def set_state(self, actor: Actor, ref: str, state: str) -> ApiKey:
        """Pauses (`paused`), resumes (`active`) or revokes (`revoked`, for good) a key."""
        return await self._set_state(actor, await self.get(actor, ref), state)

    async def edit(
        self, actor: Actor, ref: str, settings: dict[str, Any], state: str | None = None
    ) -> ApiKey:
        """`change` then, where `state` differs from the key's, `set_state`: the key looked up
        once (PATCH /v1/keys/{id})."""
        key = await self.get(actor, ref)
        if state is not None and state != key.state:
            # Refused before anything changes: a refused PATCH changes nothing.
            async with self._auditing(actor, key.account_id, key.id, "set", {"state": state}):
                self._check_state(actor, key, state)
        if settings:
            key = await self._change(actor, key, settings)
        if state is not None and state != key.state:
            key = await self._set_state(actor, key, state)
        return key

    async def _change(self, actor: Actor, key: ApiKey, settings: dict[str, Any]) -> ApiKey:
        if key.state == "revoked" and not actor.is_operator:
            raise KeyRevoked(f"key {key.prefix} is revoked; a revoked key does not change")
        unknown = set(settings) - set(KEY_LIMIT_FIELDS) - {"name", "scopes"}
        if unknown:
            raise ValueError(f"unknown key settings: {sorted(unknown)}")
        if not settings:
            return key
        changes = {k: (sorted(v) if k == "scopes" else v) for k, v in settings.items()}
        async with self._auditing(actor, key.account_id, key.id, "set", changes):
            await self._check(actor, await self._accounts.get(key.account_id), settings)
        stored = dict(settings)
        if "scopes" in stored:
            stored["scopes"] = ",".join(stored["scopes"])
        event = KeyEvent(actor.id, "set", changes)
        return await self._keys.set_limits(key.id, event, **stored)

    def _check_state(self, actor: Actor, key: ApiKey, state: str) -> None:
        if state not in _ACTIONS:
            raise ValueError(f"state must be one of {sorted(_ACTIONS)}")
        if (
            not actor.is_operator
            and state == "active"
            and key.state == "paused"
            and key.paused_by == OPERATOR
        ):
            raise OperatorPaused(_OPERATOR_PAUSED.format(prefix=key.prefix), "state")

    async def _set_state(self, actor: Actor, key: ApiKey, state: str) -> ApiKey:
        attempt = _ACTIONS.get(state, state)
        async with self._auditing(actor, key.account_id, key.id, attempt, {"state": state}):
            self._check_state(actor, key, state)
            event = KeyEvent(actor.id, _ACTIONS[state], {"state": state})
            try:
                # An admin key's pause is the operator's: only the operator side resumes it.
                by = OPERATOR if actor.is_operator else actor.id
                return await self._keys.set_state(key.id, state, event, by=by)
            except PausedByOperator:  # the operator paused it since it was read
                raise OperatorPaused(_OPERATOR_PAUSED.format(prefix=key.prefix), "state") from None
            except ConflictError as error:
                raise KeyRevoked(str(error)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def log(
        self, account_ref: str | None = None, key_ref: str | None = None, limit: int = 100
    ) -> list[KeyEventRow]:
        """The audit trail (the operator's view): of an account, of a key, or of everything."""
        account_id = (await self._accounts.get(account_ref)).id if account_ref else None
        key_id = (await self._keys.get(key_ref)).id if key_ref else None
        return await self._events.list(account_id=account_id, key_id=key_id, limit=limit)
