"""`vllm-acs accounts create|list|approve|suspend|resume|spend-cap|lift-cap|set`: the operator's
face of the account manager (`account/account_manager.py`), which the console's
/v1/admin/accounts shares; every change is audited as actor `operator`. Operator's shell."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Register, limit, out

_CHANGES: dict[str, dict[str, Any]] = {
    "approve": {"status": "approved"},
    "resume": {"status": "approved"},
    "suspend": {"status": "suspended"},
    "spend-cap": {"spend_capped": True},
    "lift-cap": {"spend_capped": False},
}


def account_manager(storage: Any) -> Any:
    from ..account.account_manager import AccountManager

    return AccountManager(storage.accounts, storage.keys, storage.key_events, storage.usage)


async def _accounts(args: argparse.Namespace, storage: Any) -> int:
    from ..account.key_manager import Actor

    manager, operator = account_manager(storage), Actor.operator()
    if args.action == "create":
        account = await manager.create(
            operator, args.name, approved=args.approved, monthly_tokens=args.monthly_tokens
        )
    elif args.action == "list":
        accounts = await manager.list()
        lines = [f"{a.id}  {a.name}  {a.status}{'  spend-capped' if a.spend_capped else ''}"
                 f"  monthly_tokens={a.monthly_tokens}" for a in accounts]  # fmt: skip
        out(args, [a.as_json() for a in accounts], "\n".join(lines) or "no accounts")
        return 0
    elif args.action in _CHANGES:
        account = await manager.change(operator, args.account, **_CHANGES[args.action])
    else:  # set
        account = await manager.change(operator, args.account, monthly_tokens=args.monthly_tokens)
    out(args, account.as_json(), f"{account.id}  {account.name}  {account.status}")
    return 0


def add_account_commands(sub: Any, command: Register) -> None:
    accounts = sub.add_parser(
        "accounts", help="create, list, approve, suspend, resume, spend-cap accounts"
    )
    acts = accounts.add_subparsers(dest="action", required=True)
    create = acts.add_parser("create", help="a new account (not approved unless --approved)")
    create.add_argument("name")
    create.add_argument("--approved", action="store_true")
    create.add_argument("--monthly-tokens", type=limit, help="account total per month")
    command(create, _accounts)
    command(acts.add_parser("list"), _accounts)
    for action in _CHANGES:
        parser = acts.add_parser(action)
        parser.add_argument("account", help="id or name")
        command(parser, _accounts)
    setter = acts.add_parser("set", help="set the account's monthly token total (`none` clears)")
    setter.add_argument("account")
    setter.add_argument("--monthly-tokens", type=limit, required=True)
    command(setter, _accounts)
