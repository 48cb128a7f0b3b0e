"""The built-in `acs_authenticate` plugin: a Bearer `acs-bm-` key checked against the database.

API server process. One indexed query per request and no cache of keys that exist, so a pause, a
revoke or an account suspension counts on the next request on every node; a prefix that matched
no key is answered from memory for a few seconds (`unknown_keys.py`), and concurrent checks of one
prefix share one query. The secret is compared as a hash in constant time and never logged;
refusals are logged by sampling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ..errors import Unauthorized
from ..hookspecs import hookimpl
from ..settings import Settings
from ..storage.api_key_secret import looks_like_secret, secret_matches, visible_prefix
from ..storage.api_keys import KeyRepository, KeyWithAccount
from ..unknown_keys import RefusalLog, UnknownPrefixes
from .principal import KeyLimits, Principal

logger = logging.getLogger(__name__)

_REFUSALS = {
    "revoked": ("key_revoked", "This API key has been revoked."),
    "paused": ("key_disabled", "This API key is paused."),
}
_ACCOUNT_REFUSALS = {
    "suspended": ("account_suspended", "The account of this API key is suspended."),
    "pending": ("account_not_approved", "The account of this API key is not approved yet."),
    "rejected": ("account_rejected", "The account of this API key was not approved."),
}


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def principal_for(found: KeyWithAccount, settings: Settings) -> Principal:
    key = found.key
    return Principal(
        key_id=key.id,
        key_prefix=key.prefix,
        account_id=key.account_id,
        scopes=frozenset(key.scopes),
        limits=KeyLimits(
            monthly_tokens=key.monthly_tokens,
            daily_tokens=key.daily_tokens,
            monthly_input_tokens=key.monthly_input_tokens,
            monthly_output_tokens=key.monthly_output_tokens,
            account_monthly_tokens=found.account_monthly_tokens,
            monthly_activation_requests=(
                key.monthly_activation_requests
                if key.monthly_activation_requests is not None
                else settings.default_monthly_activation_requests
            ),
            max_running=_or(key.max_running, settings.default_max_running),
            max_waiting=_or(key.max_waiting, settings.default_max_waiting),
            starts_per_minute=_or(key.starts_per_minute, settings.default_starts_per_minute),
        ),
        spend_capped=found.account_spend_capped,
        source="key",
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


class KeyAuthPlugin:
    """Registered last, so an operator's authenticator gets each request first."""

    def __init__(
        self,
        keys: KeyRepository,
        settings: Settings,
        *,
        unknown: UnknownPrefixes | None = None,
        refusals: RefusalLog | None = None,
    ) -> None:
        self._keys = keys
        self._settings = settings
        self.unknown = unknown if unknown is not None else UnknownPrefixes()
        self.refusals = refusals if refusals is not None else RefusalLog(logger)
        # prefix -> the lookup in flight: a burst of one key's requests makes one query.
        self._in_flight: dict[str, asyncio.Future[KeyWithAccount | None]] = {}

    @hookimpl(trylast=True)
    async def acs_authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        if "authorization" not in headers:
            raise Unauthorized(
                "Missing Authorization header: send `Authorization: Bearer <your API key>`.",
                code="missing_authorization",
            )
        token = bearer_token(headers)
        invalid = Unauthorized("Invalid API key.", code="invalid_api_key")
        if token is None or not looks_like_secret(token):
            raise invalid
        prefix = visible_prefix(token)
        found = None if prefix in self.unknown else await self._lookup(prefix)
        if found is None or not secret_matches(token, found.secret_hash):
            self.refusals.refused(prefix)
            raise invalid
        return checked_principal(found, self._settings)

    async def _lookup(self, prefix: str) -> KeyWithAccount | None:
        lookup = self._in_flight.get(prefix)
        if lookup is None:
            lookup = asyncio.ensure_future(self._keys.lookup(prefix))
            self._in_flight[prefix] = lookup
            lookup.add_done_callback(lambda done: self._looked_up(prefix, done))
        # Shielded: a caller that leaves (its client went away) does not cancel the others' query.
        return await asyncio.shield(lookup)

    def _looked_up(self, prefix: str, done: asyncio.Future[KeyWithAccount | None]) -> None:
        self._in_flight.pop(prefix, None)
        if done.cancelled() or done.exception() is not None:  # retrieved: never "unretrieved"
            return
        if done.result() is None:
            self.unknown.add(prefix)


def checked_principal(found: KeyWithAccount, settings: Settings) -> Principal:
    """The key's principal, or Unauthorized when the key or its account may not make requests
    now (also used when a job runs: a key revoked after the submit stops its queued jobs)."""
    if found.key.state in _REFUSALS:
        code, message = _REFUSALS[found.key.state]
        raise Unauthorized(message, code=code)
    if found.account_status in _ACCOUNT_REFUSALS:
        code, message = _ACCOUNT_REFUSALS[found.account_status]
        raise Unauthorized(message, code=code)
    return principal_for(found, settings)
