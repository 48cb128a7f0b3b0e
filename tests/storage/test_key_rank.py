"""A key never out-ranks its maker (issue 31), in the key manager that the CLI and /v1/keys share,
on SQLite and PostgreSQL: a key lowers its own budgets and never raises or clears them; a key it
makes inherits every limit it leaves out and asks for no more; a key the operator paused stays
paused for keys; the live keys of an account are capped; every refusal is in the audit trail."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.storage.helpers import settings_for
from vllm_acs.account.key_manager import (
    NO_KEY,
    Actor,
    KeyManager,
    LimitAboveOwn,
    OperatorPaused,
    TooManyKeys,
)
from vllm_acs.auth.principal import KEY_LIMIT_FIELDS, Principal
from vllm_acs.storage import Storage, open_storage
from vllm_acs.storage.errors import PausedByOperator
from vllm_acs.storage.key_events import OPERATOR

OPERATOR_ACTOR = Actor.operator()


def _run(url: str, work: Callable[[Storage, KeyManager], Awaitable[None]], **manager: Any) -> None:
    async def main() -> None:
        storage = await open_storage(settings_for(url), upgrade_schema=True)
        keys = KeyManager(
            storage.accounts, storage.keys, storage.key_events, storage.usage, **manager
        )
        try:
            await work(storage, keys)
        finally:
            await storage.close()

    asyncio.run(main())


async def _admin(storage: Storage, keys: KeyManager, **limits: int) -> tuple[Any, Actor]:
    """A key with every scope (`keys` included) on a new approved account, and it as an actor."""
    account = await storage.accounts.create(f"rank-{secrets.token_hex(4)}", approved=True)
    scopes = ("completions", "jobs", "harvest", "looms", "keys")
    key, _ = await keys.create(OPERATOR_ACTOR, account.id, scopes=scopes, **limits)
    principal = Principal(key.id, key.prefix, account.id, scopes=frozenset(scopes))
    return key, Actor.of_key(principal)


def test_a_key_lowers_its_own_budget_but_never_raises_or_clears_it(database_url: str):
    async def work(storage: Storage, keys: KeyManager) -> None:
        key, actor = await _admin(storage, keys, monthly_tokens=30)
        for value in (None, 31, 10**9):
            with pytest.raises(LimitAboveOwn) as refused:
                await keys.edit(actor, key.id, {"monthly_tokens": value})
            assert refused.value.field == "monthly_tokens"
            assert "monthly_tokens" in str(refused.value) and "30" in str(refused.value)
        assert (await storage.keys.get(key.id)).monthly_tokens == 30
        lowered = await keys.edit(actor, key.id, {"monthly_tokens": 20})
        assert lowered.monthly_tokens == 20
        with pytest.raises(LimitAboveOwn):  # lowered is the new own: 30 is above it now
            await keys.edit(actor, key.id, {"monthly_tokens": 30})
        # A budget the key has none of, it may set (it only lowers "no cap").
        assert (await keys.edit(actor, key.id, {"daily_tokens": 5})).daily_tokens == 5
        # The operator is not held to it.
        assert (
            await keys.change(OPERATOR_ACTOR, key.id, monthly_tokens=None)
        ).monthly_tokens is None

        log = await keys.log(key_ref=key.id)
        refusals = [e for e in log if e.action == "refuse"]
        assert [(e.actor, e.changes["field"]) for e in refusals] == [(key.id, "monthly_tokens")] * 4
        assert refusals[0].changes["asked"] == {"monthly_tokens": None}
        assert refusals[0].changes["attempt"] == "set"
        assert [e.action for e in log if e.action != "refuse"] == ["create", "set", "set", "set"]

    _run(database_url, work)


def test_a_child_key_inherits_every_limit_and_asks_for_no_more(database_url: str):
    async def work(storage: Storage, keys: KeyManager) -> None:
        parent_limits = {
            "monthly_tokens": 30,
            "daily_tokens": 20,
            "monthly_input_tokens": 25,
            "monthly_output_tokens": 15,
            "max_running": 2,
            "max_waiting": 3,
            "starts_per_minute": 10,
            "monthly_activation_requests": 4,
        }
        parent, actor = await _admin(storage, keys, **parent_limits)
        child, _secret = await keys.create(actor)
        assert {f: getattr(child, f) for f in KEY_LIMIT_FIELDS} == parent_limits
        assert "keys" not in child.scopes
        [made] = [e for e in await keys.log(key_ref=child.id) if e.action == "create"]
        assert made.changes["monthly_tokens"] == 30 and made.changes["max_running"] == 2

        lower, _ = await keys.create(actor, monthly_tokens=10, daily_tokens=0)
        assert (lower.monthly_tokens, lower.daily_tokens, lower.max_running) == (10, 0, 2)
        for field, value in (("monthly_tokens", 31), ("monthly_output_tokens", None)):
            with pytest.raises(LimitAboveOwn) as refused:
                await keys.create(actor, name="greedy", **{field: value})
            assert refused.value.field == field
        # Nor can the parent raise its child past itself afterwards.
        with pytest.raises(LimitAboveOwn):
            await keys.edit(actor, child.id, {"monthly_tokens": None})

        # A key without budgets makes keys without budgets (an absent value is still its own).
        _free, free_actor = await _admin(storage, keys)
        free_child, _ = await keys.create(free_actor, monthly_tokens=None)
        assert free_child.monthly_tokens is None and free_child.max_running is None

        refusals = [e for e in await keys.log(key_ref=parent.id) if e.action == "refuse"]
        assert [(e.changes["attempt"], e.changes["field"]) for e in refusals] == [
            ("create", "monthly_tokens"),
            ("create", "monthly_output_tokens"),
        ]
        assert refusals[0].changes["asked"]["name"] == "greedy"

    _run(database_url, work)


def test_a_key_the_operator_paused_stays_paused_for_keys(database_url: str):
    async def work(storage: Storage, keys: KeyManager) -> None:
        admin, actor = await _admin(storage, keys)
        target, _ = await keys.create(actor, name="target")

        # Paused by a key: any key of the account with `keys` resumes it.
        assert (await keys.edit(actor, target.id, {}, "paused")).paused_by == admin.id
        assert (await keys.edit(actor, target.id, {}, "active")).state == "active"

        # Paused by the operator: a key cannot resume it, even with other changes in the PATCH.
        paused = await keys.set_state(OPERATOR_ACTOR, target.id, "paused")
        assert (paused.state, paused.paused_by) == ("paused", OPERATOR)
        with pytest.raises(OperatorPaused) as refused:
            await keys.edit(actor, target.id, {"name": "back"}, "active")
        assert refused.value.field == "state" and "operator" in str(refused.value)
        with pytest.raises(OperatorPaused):
            await keys.set_state(actor, target.id, "active")
        still = await storage.keys.get(target.id)
        assert (still.state, still.name, still.paused_by) == ("paused", "target", OPERATOR)
        # A key's pause of it changes nothing: the pause stays the operator's.
        assert (await keys.set_state(actor, target.id, "paused")).paused_by == OPERATOR
        # The storage guard holds on its own (a resume read before the operator's pause).
        with pytest.raises(PausedByOperator):
            await storage.keys.set_state(target.id, "active", by=admin.id)

        # The operator resumes it; a key may then pause and resume it again.
        assert (await keys.set_state(OPERATOR_ACTOR, target.id, "active")).paused_by is None
        await keys.set_state(actor, target.id, "paused")
        assert (await keys.set_state(actor, target.id, "active")).state == "active"
        # A key can still revoke a key that the operator paused (it only lowers).
        await keys.set_state(OPERATOR_ACTOR, target.id, "paused")
        assert (await keys.set_state(actor, target.id, "revoked")).state == "revoked"

        log = await keys.log(key_ref=target.id)
        refusals = [e for e in log if e.action == "refuse"]
        assert [(e.actor, e.changes["attempt"], e.changes["asked"]) for e in refusals] == [
            (admin.id, "set", {"state": "active"}),
            (admin.id, "resume", {"state": "active"}),
        ]
        pauses = [(e.actor, e.action) for e in log if e.action in ("pause", "resume")]
        assert pauses == [
            (admin.id, "pause"),
            (admin.id, "resume"),
            (OPERATOR, "pause"),
            (OPERATOR, "resume"),
            (admin.id, "pause"),
            (admin.id, "resume"),
            (OPERATOR, "pause"),
        ]

    _run(database_url, work)


def test_live_keys_per_account_are_capped_for_keys_and_the_operator(database_url: str):
    async def work(storage: Storage, keys: KeyManager) -> None:
        admin, actor = await _admin(storage, keys)
        first, _ = await keys.create(actor)
        second, _ = await keys.create(OPERATOR_ACTOR, admin.account_id)
        assert len(await keys.list(actor)) == 3
        with pytest.raises(TooManyKeys) as refused:
            await keys.create(actor, name="fourth")
        assert refused.value.limit == 3 and "max_keys_per_account" in str(refused.value)
        with pytest.raises(TooManyKeys):
            await keys.create(OPERATOR_ACTOR, admin.account_id)
        await keys.set_state(actor, first.id, "paused")  # a paused key still counts
        with pytest.raises(TooManyKeys):
            await keys.create(actor)
        await keys.set_state(actor, second.id, "revoked")  # a revoked one does not
        await keys.create(actor)
        # Other accounts have their own count.
        await _admin(storage, keys)

        refusals = [e for e in await keys.log(admin.account_id) if e.action == "refuse"]
        assert [(e.actor, e.key_id, e.changes["attempt"]) for e in refusals] == [
            (admin.id, admin.id, "create"),
            (OPERATOR, NO_KEY, "create"),
            (admin.id, admin.id, "create"),
        ]

    _run(database_url, work, max_keys_per_account=3)


def test_keys_made_at_once_never_pass_the_cap(database_url: str):
    async def work(storage: Storage, keys: KeyManager) -> None:
        _admin_key, actor = await _admin(storage, keys)
        made = await asyncio.gather(*(keys.create(actor) for _ in range(8)), return_exceptions=True)
        assert sum(not isinstance(m, BaseException) for m in made) == 4
        assert all(isinstance(m, (tuple, TooManyKeys)) for m in made)
        assert len(await keys.list(actor)) == 5

    _run(database_url, work, max_keys_per_account=5)
