"""`AccountManager`: accounts, one service with two faces: the operator's `vllm-acs accounts`
commands (actor `operator`) and the console's /v1/admin/accounts (actor: the admin key). Lists
each account with this month's spend and its keys by state; creates, approves, suspends,
resumes, spend-caps and sets the monthly total, each change written to the audit trail
(`account_create`, `account_set`).

CLI and API server process; storage and the leaves only (no web framework).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..storage.accounts import Account, AccountRepository
from ..storage.api_keys import KeyRepository
from ..storage.key_events import NO_KEY, KeyEvent, KeyEventLog
from ..storage.usage import UsageRepository
from .key_manager import Actor

# What an operator sets on an account; `status` approved (approve, resume) or suspended.
ACCOUNT_SETTINGS = ("status", "spend_capped", "monthly_tokens")
SETTABLE_STATUSES = ("approved", "suspended")


@dataclass(frozen=True)
class AccountListing:
    account: Account
    # Tokens (prompt + completion) settled in the period across the account's keys.
    month_spend: int
    # Keys by state: active, paused, revoked.
    keys: dict[str, int]


def account_monthly_counter(account_id: str, period: str) -> str:
    return f"account:{account_id}:month:{period}"


class AccountManager:
    def __init__(
        self,
        accounts: AccountRepository,
        keys: KeyRepository,
        events: KeyEventLog,
        usage: UsageRepository,
    ) -> None:
        self._accounts = accounts
        self._keys = keys
        self._events = events
        self._usage = usage

    async def get(self, ref: str) -> Account:
        return await self._accounts.get(ref)

    async def list(self) -> list[Account]:
        return await self._accounts.list()

    async def listings(self, accounts: list[Account], period: str) -> list[AccountListing]:
        """`accounts` with the tokens each settled in `period` (YYYY-MM) and its keys."""
        counters = {a.id: account_monthly_counter(a.id, period) for a in accounts}
        spent = await self._usage.read_settled(counters.values())
        states: dict[str, Counter[str]] = {a.id: Counter() for a in accounts}
        for key in await self._keys.list(None):
            if key.account_id in states:
                states[key.account_id][key.state] += 1
        return [
            AccountListing(
                a,
                spent.get(counters[a.id], 0),
                {s: states[a.id][s] for s in ("active", "paused", "revoked")},
            )
            for a in accounts
        ]

    async def create(
        self,
        actor: Actor,
        name: str,
        *,
        approved: bool = False,
        monthly_tokens: int | None = None,
    ) -> Account:
        account = await self._accounts.create(
            name, approved=approved, monthly_tokens=monthly_tokens
        )
        changes = {"name": name, "status": account.status, "monthly_tokens": monthly_tokens}
        await self._record(actor, account, "account_create", changes)
        return account

    async def change(self, actor: Actor, ref: str, **settings: Any) -> Account:
        """Changes what is given of `status`, `spend_capped` and `monthly_tokens` (None clears
        the total); audited as one `account_set` with the values before and after."""
        unknown = set(settings) - set(ACCOUNT_SETTINGS)
        if unknown:
            raise ValueError(f"unknown account settings: {sorted(unknown)}")
        status = settings.get("status")
        if status is not None and status not in SETTABLE_STATUSES:
            raise ValueError(f"status must be one of {list(SETTABLE_STATUSES)}")
        before = await self._accounts.get(ref)
        if not settings:
            return before
        after = await self._accounts.update(before.id, **settings)
        was = {k: getattr(before, k) for k in settings}
        await self._record(actor, after, "account_set", {**settings, "was": was})
        return after

    async def _record(
        self, actor: Actor, account: Account, action: str, changes: dict[str, Any]
    ) -> None:
        await self._events.record(
            KeyEvent(actor.id, action, changes), key_id=NO_KEY, account_id=account.id
        )
