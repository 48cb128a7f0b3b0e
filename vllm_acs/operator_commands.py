"""The operator's storage subcommands of `vllm-acs`: accounts, keys, usage, db.

Runs in the operator's shell, against the database a running node uses (from Settings:
VLLM_ACS_DATABASE_URL, or SQLite under VLLM_ACS_HOME), safely while the node runs. `--json`
prints machine-readable output; a key's secret is printed once, at creation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .principal import KEY_LIMIT_FIELDS
from .settings import Settings

# Every key limit (KEY_LIMIT_FIELDS) is a flag of `keys create` / `keys set`, named like the
# field. Flags whose name is not the field's: `--monthly-activations` is what operators type.
_FLAG_NAMES = {"monthly_activation_requests": "--monthly-activations"}


def _flag(field: str) -> str:
    return _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def _limit(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'none', got {text!r}")
    return value


def _out(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2, default=str) if args.json else human)


async def _with_storage(work: Callable[[Any], Awaitable[int]], *, upgrade: bool | None) -> int:
    from .storage import open_storage

    storage = await open_storage(Settings.load(), upgrade_schema=upgrade)
    try:
        return await work(storage)
    finally:
        await storage.close()


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
        _out(args, [a.as_json() for a in accounts], "\n".join(lines) or "no accounts")
        return 0
    elif args.action == "approve":
        account = await repo.approve(args.account)
    elif args.action == "suspend":
        account = await repo.suspend(args.account)
    elif args.action in ("spend-cap", "lift-cap"):
        account = await repo.set_spend_cap(args.account, args.action == "spend-cap")
    else:  # set
        account = await repo.set_monthly_tokens(args.account, args.monthly_tokens)
    _out(args, account.as_json(), f"{account.id}  {account.name}  {account.status}")
    return 0


async def _keys(args: argparse.Namespace, storage: Any) -> int:
    from .storage.api_keys import parse_scopes

    repo = storage.keys
    limits = {f: getattr(args, f) for f in KEY_LIMIT_FIELDS if getattr(args, f, None) is not None}
    if args.action == "create":
        account = await storage.accounts.get(args.account)
        scopes = parse_scopes(args.scopes) if args.scopes else None
        key, secret = await repo.create(
            account.id, name=args.name, **({"scopes": scopes} if scopes else {}), **limits
        )
        _out(
            args,
            {**key.as_json(), "key": secret},
            f"{secret}\n(shown once; id {key.id}, prefix {key.prefix}, account {account.name})",
        )
        return 0
    if args.action == "list":
        account_id = (await storage.accounts.get(args.account)).id if args.account else None
        keys = await repo.list(account_id)
        lines = [
            f"{k.id}  {k.prefix}  {k.state}  {k.account_id}  {','.join(k.scopes)}" for k in keys
        ]
        _out(args, [k.as_json() for k in keys], "\n".join(lines) or "no keys")
        return 0
    if args.action in ("pause", "resume", "revoke"):
        state = {"pause": "paused", "resume": "active", "revoke": "revoked"}[args.action]
        key = await repo.set_state(args.key, state)
    else:  # set: only the flags given change; `none` clears a limit
        changes = {f: getattr(args, f) for f in KEY_LIMIT_FIELDS if getattr(args, f) is not _UNSET}
        if args.scopes:
            changes["scopes"] = ",".join(parse_scopes(args.scopes))
        key = await repo.set_limits(args.key, **changes)
    _out(args, key.as_json(), f"{key.id}  {key.prefix}  {key.state}")
    return 0


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    cells = [columns] + [[str(row.get(c) if row.get(c) is not None else "-") for c in columns]
                         for row in rows]  # fmt: skip
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in cells
    ]


async def _usage(args: argparse.Namespace, storage: Any) -> int:
    per_key = await storage.usage.per_key_model_month(args.month)
    per_account = await storage.usage.per_account_month(args.month)
    tokens = ["requests", "prompt_tokens", "completion_tokens", "total_tokens"]
    lines = _table(per_key, ["period", "account_id", "key_prefix", "model", *tokens])
    lines += ["", *_table(per_account, ["period", "account_id", *tokens])]
    _out(args, {"per_key_model_month": per_key, "per_account_month": per_account}, "\n".join(lines))
    return 0


async def _db(args: argparse.Namespace, storage: Any) -> int:
    from .storage.migrate import current_revision

    revision = await current_revision(storage.engine)
    _out(args, {"revision": revision}, f"database schema at revision {revision}")
    return 0


_UNSET: Any = object()

# Public names for job_commands.py, whose `jobs` commands print the same way.
out, table = _out, _table


def add_operator_commands(sub: Any) -> None:
    """Adds `accounts`, `keys`, `usage`, `db` and `jobs` (job_commands.py) to the parser."""

    def command(parser: argparse.ArgumentParser, handler: Any, upgrade: bool | None = None) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(handler=lambda args: _run(args, handler, upgrade))

    accounts = sub.add_parser("accounts", help="create, list, approve, suspend, spend-cap accounts")
    acts = accounts.add_subparsers(dest="action", required=True)
    create = acts.add_parser("create", help="a new account (not approved unless --approved)")
    create.add_argument("name")
    create.add_argument("--approved", action="store_true")
    create.add_argument("--monthly-tokens", type=_limit, help="account total per month")
    command(create, _accounts)
    command(acts.add_parser("list"), _accounts)
    for action in ("approve", "suspend", "spend-cap", "lift-cap"):
        parser = acts.add_parser(action)
        parser.add_argument("account", help="id or name")
        command(parser, _accounts)
    setter = acts.add_parser("set", help="set the account's monthly token total (`none` clears)")
    setter.add_argument("account")
    setter.add_argument("--monthly-tokens", type=_limit, required=True)
    command(setter, _accounts)

    keys = sub.add_parser("keys", help="create, list, pause, resume, revoke, set API keys")
    acts = keys.add_subparsers(dest="action", required=True)
    create = acts.add_parser("create", help="a new key; prints the secret once")
    create.add_argument("--account", required=True, help="id or name")
    create.add_argument("--name")
    create.add_argument("--scopes", help="comma-separated: completions,jobs,harvest,looms")
    for flag in KEY_LIMIT_FIELDS:
        create.add_argument(_flag(flag), dest=flag, type=_limit)
    command(create, _keys)
    listing = acts.add_parser("list")
    listing.add_argument("--account")
    command(listing, _keys)
    for action in ("pause", "resume", "revoke"):
        parser = acts.add_parser(action)
        parser.add_argument("key", help="id or visible prefix")
        command(parser, _keys)
    setter = acts.add_parser("set", help="change limits or scopes (`none` clears a limit)")
    setter.add_argument("key", help="id or visible prefix")
    setter.add_argument("--scopes")
    for flag in KEY_LIMIT_FIELDS:
        setter.add_argument(_flag(flag), dest=flag, type=_limit, default=_UNSET)
    command(setter, _keys)

    usage = sub.add_parser("usage", help="tokens per key, model and month; account totals")
    usage.add_argument("--month", help="YYYY-MM (default: every month)")
    command(usage, _usage)

    db = sub.add_parser("db", help="database schema")
    acts = db.add_subparsers(dest="action", required=True)
    command(acts.add_parser("upgrade", help="upgrade the schema to this version's head"), _db, True)
    command(acts.add_parser("current", help="print the schema revision"), _db, False)

    from .job_commands import add_job_commands
    from .local_key import add_local_key_command

    add_job_commands(sub, command)
    add_local_key_command(sub)


def _run(args: argparse.Namespace, handler: Any, upgrade: bool | None) -> int:
    """Runs a parsed subcommand; a refusal prints one line on stderr and exits 1."""
    from .storage.errors import StorageError

    try:
        return asyncio.run(_with_storage(lambda storage: handler(args, storage), upgrade=upgrade))
    except (StorageError, ValueError) as error:
        print(f"vllm-acs {args.command}: {error}", file=sys.stderr)
        return 1
