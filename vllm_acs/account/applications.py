"""Applications for access, one service with two faces: the form's routes (submit, claim) and
the operator's (`vllm-acs applications ...` and the console's /v1/admin/applications: list,
approve, reject). The claim hands out the account's first key through the key manager.

CLI and API server process; storage and the leaves only (no web framework).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..auth.claim_code import hash_address, hash_claim_code, looks_like_claim_code, new_claim_code
from ..auth.principal import DEFAULT_SCOPES
from ..storage.api_keys import ApiKey
from ..storage.applications import Application, ApplicationNotFound, ApplicationRepository
from .key_manager import Actor, KeyManager

FIRST_KEY_SCOPES = tuple(sorted(DEFAULT_SCOPES))


class InvalidClaimCode(Exception):
    """No application has this code (or it is not a claim code at all)."""


@dataclass(frozen=True)
class ApplicationLimits:
    per_address: int
    pending_cap: int
    ttl: timedelta


@dataclass(frozen=True)
class Claimed:
    application: Application
    key: ApiKey
    secret: str


class Applications:
    def __init__(
        self,
        repository: ApplicationRepository,
        keys: KeyManager,
        limits: ApplicationLimits,
        clock: Callable[[], datetime],
    ) -> None:
        self._repo = repository
        self._keys = keys
        self.limits = limits
        self._clock = clock

    async def submit(self, answers: dict[str, str], address: str) -> tuple[Application, str]:
        """A pending application and its one-time claim code (never stored, never shown again).
        Refused with the repository's `AddressLimited` or `PendingCapReached`."""
        code = new_claim_code()
        application = await self._repo.submit(
            answers,
            code_hash=hash_claim_code(code),
            address_hash=hash_address(address),
            now=self._clock(),
            ttl=self.limits.ttl,
            per_address=self.limits.per_address,
            pending_cap=self.limits.pending_cap,
        )
        return application, code

    async def list(self, status: str | None, limit: int = 100) -> list[Application]:
        return await self._repo.list(status, self._clock(), limit)

    async def get(self, application_id: str) -> Application:
        return await self._repo.get(application_id)

    async def approve(
        self,
        actor: Actor,
        application_id: str,
        *,
        monthly_tokens: int | None = None,
        note: str | None = None,
    ) -> Application:
        return await self._repo.decide(
            application_id,
            "approved",
            actor=actor.id,
            now=self._clock(),
            note=note,
            monthly_tokens=monthly_tokens,
        )

    async def reject(
        self, actor: Actor, application_id: str, *, note: str | None = None
    ) -> Application:
        return await self._repo.decide(
            application_id, "rejected", actor=actor.id, now=self._clock(), note=note
        )

    async def claim(self, code: str) -> Claimed:
        """The approved application's first key (default scopes, no budget of its own), once.
        `InvalidClaimCode`, or the repository's `NotClaimable(status)`."""
        if not looks_like_claim_code(code):
            raise InvalidClaimCode()
        try:
            application = await self._repo.start_claim(hash_claim_code(code), self._clock())
        except ApplicationNotFound:
            raise InvalidClaimCode() from None
        # The key is made by the application itself (its id is the audit trail's actor).
        maker = Actor(application.id, None, DEFAULT_SCOPES)
        try:
            key, secret = await self._keys.create(
                maker, application.account_id, name="first key", scopes=FIRST_KEY_SCOPES
            )
        except BaseException:
            await self._repo.undo_claim(application)
            raise
        await self._repo.finish_claim(application, key.id, self._clock())
        return Claimed(await self._repo.get(application.id), key, secret)
