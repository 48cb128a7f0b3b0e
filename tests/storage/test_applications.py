"""Applications for access on SQLite and PostgreSQL, on an explicit clock: the per-address limit
and its window, the pending cap, approve and reject (audited, the account with them), the claim
that hands out one key once, expiry; and the admin scope that no key can grant."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from tests.storage.helpers import settings_for
from vllm_acs.account.account_manager import AccountManager
from vllm_acs.account.applications import ApplicationLimits, Applications, InvalidClaimCode
from vllm_acs.account.key_manager import Actor, KeyManager, ScopeEscalation
from vllm_acs.auth.claim_code import hash_claim_code
from vllm_acs.auth.principal import Principal
from vllm_acs.storage import open_storage
from vllm_acs.storage.applications import (
    AddressLimited,
    NotClaimable,
    NotPending,
    PendingCapReached,
)

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=timezone.utc)
ANSWERS = {
    "name": "Ada Researcher",
    "email": "ada@lab.example",
    "affiliation": "Example Lab",
    "intended_use": "Residual-stream probes of a small model.",
}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _run(database_url: str, test, **limits) -> None:
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        clock = Clock()
        keys = KeyManager(storage.accounts, storage.keys, storage.key_events, storage.usage)
        settings = {"per_address": 3, "pending_cap": 10, "ttl": timedelta(days=30), **limits}
        service = Applications(storage.applications, keys, ApplicationLimits(**settings), clock)
        try:
            await test(storage, service, clock)
        finally:
            await storage.close()

    asyncio.run(main())


def _answers(n: int) -> dict[str, str]:
    return {**ANSWERS, "email": f"user{n}@lab.example"}


def test_per_address_limit_holds_for_an_hour(database_url: str):
    async def test(storage, service, clock) -> None:
        for n in range(3):
            clock.now = T0 + timedelta(minutes=n)
            await service.submit(_answers(n), "10.0.0.1")
        clock.now = T0 + timedelta(minutes=30)
        with pytest.raises(AddressLimited) as refused:
            await service.submit(_answers(9), "10.0.0.1")
        # The oldest of the three leaves the window at T0 + 1 h: 30 minutes from now.
        assert 1800 <= refused.value.retry_after_s <= 1802
        await service.submit(_answers(10), "10.0.0.2")  # another address is not limited
        clock.now = T0 + timedelta(hours=1, seconds=1)
        await service.submit(_answers(11), "10.0.0.1")  # the first one aged out

    _run(database_url, test)


def test_pending_cap_counts_pending_unexpired_applications(database_url: str):
    async def test(storage, service, clock) -> None:
        made = [await service.submit(_answers(n), f"10.0.1.{n}") for n in range(2)]
        with pytest.raises(PendingCapReached):
            await service.submit(_answers(5), "10.0.1.5")
        await service.reject(Actor.operator(), made[0][0].id)
        await service.submit(_answers(6), "10.0.1.6")  # a decided one frees its place
        clock.now = T0 + timedelta(days=3)  # every pending one expired
        await service.submit(_answers(7), "10.0.1.7")

    _run(database_url, test, pending_cap=2, ttl=timedelta(days=2))


def test_approve_claim_once_and_the_audit_trail(database_url: str):
    async def test(storage, service, clock) -> None:
        application, code = await service.submit(ANSWERS, "10.0.2.1")
        assert application.status_at(clock()) == "pending"
        assert (await storage.accounts.get(application.account_id)).status == "pending"
        # Only the hash is stored.
        assert await storage.applications.by_code_hash(hash_claim_code(code)) is not None
        with pytest.raises(NotClaimable) as early:
            await service.claim(code)
        assert early.value.status == "pending"
        admin = Actor("key_admin", None, frozenset({"admin"}))
        approved = await service.approve(admin, application.id, monthly_tokens=5000)
        assert (approved.status_at(clock()), approved.decided_by) == ("approved", "key_admin")
        account = await storage.accounts.get(application.account_id)
        assert (account.status, account.monthly_tokens) == ("approved", 5000)
        with pytest.raises(NotPending):
            await service.reject(admin, application.id)
        claimed = await service.claim(code)
        assert claimed.secret.startswith("acs-bm-")
        assert claimed.key.account_id == application.account_id
        assert set(claimed.key.scopes) == {"completions", "jobs", "harvest", "looms"}
        assert claimed.application.key_id == claimed.key.id
        with pytest.raises(NotClaimable) as again:
            await service.claim(code)
        assert again.value.status == "claimed"
        with pytest.raises(InvalidClaimCode):
            await service.claim("acs-claim-" + "x" * 43)
        events = await storage.key_events.newest(account_id=application.account_id)
        actions = [(e.actor, e.action) for e in reversed(events)]
        assert actions == [
            (application.id, "apply"),
            ("key_admin", "approve"),
            (application.id, "create"),
            (application.id, "claim"),
        ]
        assert all("code" not in str(e.changes) for e in events)

    _run(database_url, test)


def test_rejected_and_expired_applications_say_so(database_url: str):
    async def test(storage, service, clock) -> None:
        rejected, code = await service.submit(_answers(1), "10.0.3.1")
        await service.reject(Actor.operator(), rejected.id, note="not a fit")
        assert (await storage.accounts.get(rejected.account_id)).status == "rejected"
        with pytest.raises(NotClaimable) as refused:
            await service.claim(code)
        assert refused.value.status == "rejected"
        late, late_code = await service.submit(_answers(2), "10.0.3.2")
        await service.approve(Actor.operator(), late.id)
        clock.now = T0 + timedelta(days=31)
        with pytest.raises(NotClaimable) as expired:
            await service.claim(late_code)
        assert expired.value.status == "expired"
        listed = await service.list("expired")
        assert [a.id for a in listed] == [late.id]

    _run(database_url, test)


def test_no_key_grants_the_admin_scope(database_url: str):
    async def test(storage, service, clock) -> None:
        account = await storage.accounts.create("ops", approved=True)
        keys = KeyManager(storage.accounts, storage.keys, storage.key_events, storage.usage)
        # The operator's command line makes the first admin key ...
        admin_key, _ = await keys.create(
            Actor.operator(), account.id, scopes=("admin", "keys", "completions")
        )
        principal = Principal(
            admin_key.id, admin_key.prefix, account.id, scopes=frozenset(admin_key.scopes)
        )
        # ... and neither that key (on its own account, or as the console's admin) nor any
        # other can make another or grant the scope.
        for actor in (Actor.of_key(principal), Actor.admin(principal)):
            with pytest.raises(ScopeEscalation):
                await keys.create(actor, account.id, scopes=("admin",))
        plain, _ = await keys.create(Actor.operator(), account.id)
        with pytest.raises(ScopeEscalation):
            await keys.change(Actor.admin(principal), plain.id, scopes=("admin",))
        # An admin's pause is the operator's: the account's own key cannot resume it.
        await keys.set_state(Actor.admin(principal), plain.id, "paused")
        assert (await storage.keys.get(plain.id)).paused_by == "operator"

    _run(database_url, test)


def test_account_changes_are_audited(database_url: str):
    async def test(storage, service, clock) -> None:
        manager = AccountManager(storage.accounts, storage.keys, storage.key_events, storage.usage)
        account = await manager.create(Actor.operator(), "lab", approved=True)
        admin = Actor("key_admin", None, frozenset({"admin"}))
        await manager.change(admin, "lab", status="suspended")
        await manager.change(admin, "lab", status="approved", monthly_tokens=700)
        [listing] = await manager.listings([await manager.get("lab")], "2026-12")
        assert (listing.account.status, listing.account.monthly_tokens) == ("approved", 700)
        assert listing.keys == {"active": 0, "paused": 0, "revoked": 0}
        events = list(reversed(await storage.key_events.newest(account_id=account.id)))
        assert [(e.actor, e.action) for e in events] == [
            ("operator", "account_create"),
            ("key_admin", "account_set"),
            ("key_admin", "account_set"),
        ]
        assert events[1].changes == {"status": "suspended", "was": {"status": "approved"}}
        only = await storage.key_events.newest(actor="key_admin", action="account_set", limit=1)
        assert [e.id for e in only] == [events[2].id]

    _run(database_url, test)
