"""`vllm-acs accounts create|list|approve|suspend|spend-cap|lift-cap|set`. Operator's shell."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Register, limit, out


async def _accounts(args: argparse.Namespace, storage: Any) -> int:
    repo = storage.accounts
    if args.action == "create":
        account = await repo.create(
            args.name, approved=args.approved, monthly_tokens=args.monthly_tokens
        )
    elif args.action == "list":
        accounts = await repo.list()
        lines = [f"{a.id}  {a.name}  {a.status}{'  spend-capped' if a.spend_capped else ''}"
                 f"  monthly_tokens={a.monthly_tokens}" for a in accounts]  # fmt: skip
        out(args, [a.as_json() for a in accounts], "\n".join(lines) or "no accounts")
        return 0
    elif args.action == "approve":
        account = await repo.approve(args.account)
    elif args.action == "suspend":
        account = await repo.suspend(args.account)
    elif args.action in ("spend-cap", "lift-cap"):
        account = await repo.set_spend_cap(args.account, args.action == "spend-cap")
    else:  # set
        account = await repo.set_monthly_tokens(args.account, args.monthly_tokens)
    out(args, account.as_json(), f"{account.id}  {account.name}  {account.status}")
    return 0


def add_account_commands(sub: Any, command: Register) -> None:
    accounts = sub.add_parser("accounts", help="create, list, approve, suspend, spend-cap accounts")
    acts = accounts.add_subparsers(dest="action", required=True)
    create = acts.add_parser("create", help="a new account (not approved unless --approved)")
    create.add_argument("name")
    create.add_argument("--approved", action="store_true")
    create.add_argument("--monthly-tokens", type=limit, help="account total per month")
    command(create, _accounts)
    command(acts.add_parser("list"), _accounts)
    for action in ("approve", "suspend", "spend-cap", "lift-cap"):
        parser = acts.add_parser(action)
        parser.add_argument("account", help="id or name")
        command(parser, _accounts)
    setter = acts.add_parser("set", help="set the account's monthly token total (`none` clears)")
    setter.add_argument("account")
    setter.add_argument("--monthly-tokens", type=limit, required=True)
    command(setter, _accounts)
