"""The console's applications, accounts and keys (/v1/admin/applications, /accounts, /keys):
the same services as the operator's shell (`account/applications.py`, `account_manager.py`,
`key_manager.py`), acting for the admin key (`Actor.admin`: audited under its id), their
refusals as the spec's errors.

API server process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ...account.account_manager import AccountListing, AccountManager
from ...account.applications import Applications
from ...account.key_manager import Actor, KeyManager, KeyNotFound, KeyRefused, KeyRevoked
from ...auth.principal import KEY_LIMIT_FIELDS, Principal
from ...contract.completion_request import parse_body
from ...errors import (
    AccountNotFound,
    ApplicationNotFound,
    ApplicationNotPending,
    InvalidRequest,
    KeyNotChangeable,
    ScopeDenied,
    echoed,
)
from ...errors import KeyNotFound as KeyNotFoundError
from ...storage.accounts import Account
from ...storage.api_keys import ApiKey
from ...storage.applications import STATUSES, NotPending
from ...storage.applications import ApplicationNotFound as NoApplication
from ...storage.errors import NotFoundError
from ...storage.periods import month_of
from ..applications.protocol import ApplicationList
from ..applications.service import application_view, unix
from ..looms.service import json_of
from . import queries
from .protocol import (
    AccountDetail,
    AccountList,
    AccountPatchBody,
    AccountView,
    AdminKeyList,
    AdminKeyPatchBody,
    AdminKeyView,
    ApproveBody,
    KeyLimitsView,
    RejectBody,
)

ADMIN_PATH = "/v1/admin"
KEY_STATES = ("active", "paused", "revoked")


def account_view(listing: AccountListing, period: str) -> AccountView:
    a = listing.account
    return AccountView(
        id=a.id,
        name=a.name,
        status=a.status,  # type: ignore[arg-type]
        spend_capped=a.spend_capped,
        monthly_tokens=a.monthly_tokens,
        period=period,
        month_spend=listing.month_spend,
        keys=listing.keys,  # type: ignore[arg-type]
        created_at=unix(a.created_at),  # type: ignore[arg-type]
    )


def admin_key_view(
    key: ApiKey, account_name: str | None, month_spend: int, last_used_at: datetime | None
) -> AdminKeyView:
    return AdminKeyView(
        id=key.id,
        account_id=key.account_id,
        account_name=account_name,
        name=key.name,
        prefix=key.prefix,
        state=key.state,  # type: ignore[arg-type]
        paused_by=key.paused_by,
        scopes=list(key.scopes),
        limits=KeyLimitsView(**{f: getattr(key, f) for f in KEY_LIMIT_FIELDS}),
        month_spend=month_spend,
        created_at=unix(key.created_at),
        last_used_at=unix(last_used_at),
        revoked_at=unix(key.revoked_at),
    )


class AdminService:
    """Bound to storage once the engine is up (`bind`, from init_state)."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self._bound: tuple[Applications, AccountManager, KeyManager] | None = None

    def bind(self, applications: Applications, accounts: AccountManager, keys: KeyManager) -> None:
        self._bound = (applications, accounts, keys)

    @property
    def _services(self) -> tuple[Applications, AccountManager, KeyManager]:
        if self._bound is None:
            raise RuntimeError("vllm_acs admin: storage is not open (no init_state)")
        return self._bound

    # Applications
    async def applications(self, params: Mapping[str, str]) -> dict[str, Any]:
        queries.only(params, ("status", "limit"))
        status = queries.choice(params, "status", (*STATUSES, "all")) or "pending"
        limit = queries.integer(params, "limit", 1, 500) or 100
        found = await self._services[0].list(None if status == "all" else status, limit)
        now = self.clock()
        return ApplicationList(data=[application_view(a, now) for a in found]).model_dump()

    async def decide(
        self, application_id: str, decision: str, raw: bytes, principal: Principal
    ) -> dict[str, Any]:
        applications, actor = self._services[0], Actor.admin(principal)
        try:
            if decision == "approve":
                body = parse_body(ApproveBody, json_of(raw) if raw else {})
                done = await applications.approve(
                    actor, application_id, monthly_tokens=body.monthly_tokens, note=body.note
                )
            else:
                rejected = parse_body(RejectBody, json_of(raw) if raw else {})
                done = await applications.reject(actor, application_id, note=rejected.note)
        except NoApplication:
            raise ApplicationNotFound(
                f"No application '{echoed(application_id)}'.", param="application_id"
            ) from None
        except NotPending as error:
            raise ApplicationNotPending(
                f"Application '{application_id}' is {error.status}; only a pending application "
                "is approved or rejected."
            ) from None
        return application_view(done, self.clock()).model_dump()

    # Accounts
    async def _account(self, ref: str) -> Account:
        try:
            return await self._services[1].get(ref)
        except NotFoundError:
            raise AccountNotFound(f"No account '{echoed(ref)}'.", param="account_id") from None

    async def accounts(self) -> dict[str, Any]:
        manager, period = self._services[1], month_of(self.clock())
        listings = await manager.listings(await manager.list(), period)
        return AccountList(data=[account_view(x, period) for x in listings]).model_dump()

    async def account(self, ref: str) -> dict[str, Any]:
        account, period = await self._account(ref), month_of(self.clock())
        [listing] = await self._services[1].listings([account], period)
        keys = await self._key_views(await self._services[2].list(Actor.operator(), account.id))
        view = account_view(listing, period)
        return AccountDetail(**view.model_dump(), api_keys=keys).model_dump()

    async def patch_account(self, ref: str, raw: bytes, principal: Principal) -> dict[str, Any]:
        body = parse_body(AccountPatchBody, json_of(raw))
        given = body.model_fields_set
        for field in ("status", "spend_capped"):
            if field in given and getattr(body, field) is None:
                raise InvalidRequest(f"'{field}' cannot be null.", param=field)
        account = await self._account(ref)
        settings = {f: getattr(body, f) for f in given}
        changed = await self._services[1].change(Actor.admin(principal), account.id, **settings)
        period = month_of(self.clock())
        [listing] = await self._services[1].listings([changed], period)
        return account_view(listing, period).model_dump()

    # Keys
    async def _key_views(self, keys: list[ApiKey]) -> list[AdminKeyView]:
        listings = await self._services[2].listings(keys, month_of(self.clock()))
        names = {a.id: a.name for a in await self._services[1].list()}
        return [
            admin_key_view(x.key, names.get(x.key.account_id), x.month_spend, x.last_used_at)
            for x in listings
        ]

    async def keys(self, params: Mapping[str, str]) -> dict[str, Any]:
        queries.only(params, ("state", "account_id"))
        state = queries.choice(params, "state", KEY_STATES)
        ref = queries.text(params, "account_id")
        account = None if ref is None else (await self._account(ref)).id
        found = await self._services[2].list(Actor.operator(), account)
        if state is not None:
            found = [k for k in found if k.state == state]
        return AdminKeyList(data=await self._key_views(found)).model_dump()

    async def patch_key(self, key_id: str, raw: bytes, principal: Principal) -> dict[str, Any]:
        body = parse_body(AdminKeyPatchBody, json_of(raw))
        given = body.model_fields_set
        for field in ("state", "name"):
            if field in given and getattr(body, field) is None:
                raise InvalidRequest(f"'{field}' cannot be null.", param=field)
        settings = {f: getattr(body, f) for f in given if f != "state"}
        return await self._edit(key_id, principal, settings, body.state)

    async def revoke_key(self, key_id: str, principal: Principal) -> dict[str, Any]:
        return await self._edit(key_id, principal, {}, "revoked")

    async def _edit(
        self, key_id: str, principal: Principal, settings: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        try:
            key = await self._services[2].edit(Actor.admin(principal), key_id, settings, state)
        except KeyNotFound:
            raise KeyNotFoundError(f"No API key '{echoed(key_id)}'.", param="key_id") from None
        except KeyRevoked:
            raise KeyNotChangeable(
                f"API key '{key_id}' is revoked; revoking is for good."
            ) from None
        except KeyRefused as error:
            raise ScopeDenied(str(error), param=error.field) from None
        [view] = await self._key_views([key])
        return view.model_dump()
