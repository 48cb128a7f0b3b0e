"""The /v1/keys routes' work: the key manager (`account/key_manager.py`, shared with the operator's
`vllm-acs keys`) acting for the calling key on its own account, its refusals as the spec's errors.

API server process.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...account.key_manager import (
    BUDGET_FIELDS,
    Actor,
    KeyManager,
    KeyNotFound,
    KeyRefused,
    KeyRevoked,
    LimitAboveOwn,
    OperatorPaused,
    ScopeEscalation,
    TooManyKeys,
)
from ...auth.principal import Principal
from ...contract.completion_request import parse_body
from ...errors import InvalidRequest, KeyCapacity, KeyNotChangeable, ScopeDenied, echoed
from ...errors import KeyNotFound as KeyNotFoundError
from ...storage import Storage
from ...storage.api_keys import ApiKey
from ...storage.periods import month_of
from ..answers import Answer
from ..looms.service import json_of
from .protocol import ApiKeyList, ApiKeyView, CreatedApiKey, KeyBudgets, KeyCreateBody, KeyPatchBody

KEYS_PATH = "/v1/keys"


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def key_view(key: ApiKey, month_spend: int, last_used_at: datetime | None) -> ApiKeyView:
    return ApiKeyView(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        state=key.state,  # type: ignore[arg-type]
        scopes=list(key.scopes),
        budgets=KeyBudgets(**{f: getattr(key, f) for f in BUDGET_FIELDS}),
        month_spend=month_spend,
        created_at=_unix(key.created_at),
        last_used_at=_unix(last_used_at),
        revoked_at=_unix(key.revoked_at),
    )


def _as_acs_error(error: Exception, key_id: str | None = None) -> Exception:
    if isinstance(error, KeyNotFound):
        return KeyNotFoundError(f"No API key '{echoed(key_id)}' in this account.", param="key_id")
    if isinstance(error, (ScopeEscalation, LimitAboveOwn, OperatorPaused)):
        return ScopeDenied(str(error), param=error.field)
    if isinstance(error, TooManyKeys):
        return KeyCapacity(str(error))
    if isinstance(error, KeyRefused):  # BudgetAboveAccount among them
        return InvalidRequest(str(error), param=error.field)
    if isinstance(error, KeyRevoked):
        return KeyNotChangeable(f"API key '{key_id}' is revoked; revoking is for good.")
    return error


class KeyService:
    """Bound to storage once the engine is up (`bind`, from init_state)."""

    def __init__(
        self, clock: Callable[[], datetime], max_keys_per_account: int | None = None
    ) -> None:
        self.clock = clock
        self.max_keys_per_account = max_keys_per_account
        self.manager: KeyManager | None = None

    def bind(self, storage: Storage) -> None:
        self.manager = KeyManager(
            storage.accounts,
            storage.keys,
            storage.key_events,
            storage.usage,
            max_keys_per_account=self.max_keys_per_account,
        )

    @property
    def _manager(self) -> KeyManager:
        if self.manager is None:
            raise RuntimeError("vllm_acs keys: storage is not open (init_state did not run)")
        return self.manager

    async def _view(self, key: ApiKey) -> ApiKeyView:
        [listing] = await self._manager.listings([key], month_of(self.clock()))
        return key_view(key, listing.month_spend, listing.last_used_at)

    async def create(self, raw: bytes, principal: Principal) -> Answer:
        body = parse_body(KeyCreateBody, json_of(raw))
        # Only the budgets sent: one left out is the calling key's own (null: no cap).
        limits = {f: getattr(body, f) for f in BUDGET_FIELDS if f in body.model_fields_set}
        scopes = tuple(dict.fromkeys(body.scopes)) if body.scopes is not None else None
        try:
            key, secret = await self._manager.create(
                Actor.of_key(principal), name=body.name, scopes=scopes, **limits
            )
        except KeyRefused as error:
            raise _as_acs_error(error) from None
        view = CreatedApiKey(**key_view(key, 0, None).model_dump(), key=secret)
        return Answer(201, view.model_dump(), {"location": f"{KEYS_PATH}/{key.id}"})

    async def list(self, principal: Principal) -> dict[str, Any]:
        listings = await self._manager.listing(Actor.of_key(principal), month_of(self.clock()))
        views = [key_view(x.key, x.month_spend, x.last_used_at) for x in listings]
        return ApiKeyList(data=views).model_dump()

    async def patch(self, key_id: str, raw: bytes, principal: Principal) -> dict[str, Any]:
        body = parse_body(KeyPatchBody, json_of(raw))
        given = body.model_fields_set
        if "name" in given and body.name is None:
            raise InvalidRequest("'name' must be a string of 1-200 characters.", param="name")
        if "state" in given and body.state is None:
            raise InvalidRequest('\'state\' must be "active" or "paused".', param="state")
        settings = {f: getattr(body, f) for f in (*BUDGET_FIELDS, "name") if f in given}
        try:
            key = await self._manager.edit(Actor.of_key(principal), key_id, settings, body.state)
        except (KeyRefused, KeyNotFound, KeyRevoked) as error:
            raise _as_acs_error(error, key_id) from None
        return (await self._view(key)).model_dump()

    async def revoke(self, key_id: str, principal: Principal) -> dict[str, Any]:
        try:  # revoking a revoked key again changes nothing and answers as the first did
            key = await self._manager.edit(Actor.of_key(principal), key_id, {}, "revoked")
        except (KeyRefused, KeyNotFound, KeyRevoked) as error:
            raise _as_acs_error(error, key_id) from None
        return (await self._view(key)).model_dump()
