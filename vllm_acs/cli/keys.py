"""`vllm-acs keys create|list|pause|resume|revoke|set|log`: the operator's face of the key manager
(`account/key_manager.py`), which the /v1/keys routes share. Operator's shell.

The operator acts on any account with any scope and limit; each change lands in the audit trail
as actor `operator`, which `keys log` prints. A key's secret is printed once, at creation. Only
the operator resumes a key the operator paused. `keys create` is held to `max_keys_per_account`
live keys per account like `POST /v1/keys` (raise the setting to make more).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..auth.principal import KEY_LIMIT_FIELDS, SCOPES
from .common import UNSET, Register, limit, out, positive, table

# Every key limit (KEY_LIMIT_FIELDS) is a flag of `keys create` / `keys set`, named like the
# field. Flags whose name is not the field's: `--monthly-activations` is what operators type.
_FLAG_NAMES = {"monthly_activation_requests": "--monthly-activations"}


def _flag(field: str) -> str:
    return _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def key_manager(storage: Any) -> Any:
    from ..account.key_manager import KeyManager
    from ..settings import Settings

    return KeyManager(
        storage.accounts,
        storage.keys,
        storage.key_events,
        storage.usage,
        max_keys_per_account=Settings.load().max_keys_per_account,
    )


async def _keys(args: argparse.Namespace, storage: Any) -> int:
    from ..account.key_manager import Actor
    from ..storage.api_keys import parse_scopes

    keys, operator = key_manager(storage), Actor.operator()
    if args.action == "create":
        limits = {f: getattr(args, f) for f in KEY_LIMIT_FIELDS if getattr(args, f) is not None}
        scopes = parse_scopes(args.scopes) if args.scopes else None
        key, secret = await keys.create(
            operator, args.account, name=args.name, scopes=scopes, **limits
        )
        account = await storage.accounts.get(key.account_id)
        _print_secret(args, key, secret, account.name)
        return 0
    if args.action == "list":
        found = await keys.list(operator, args.account)
        lines = [
            f"{k.id}  {k.prefix}  {k.state}  {k.account_id}  {','.join(k.scopes)}" for k in found
        ]
        out(args, [k.as_json() for k in found], "\n".join(lines) or "no keys")
        return 0
    if args.action in ("pause", "resume", "revoke"):
        state = {"pause": "paused", "resume": "active", "revoke": "revoked"}[args.action]
        key = await keys.set_state(operator, args.key, state)
    else:  # set: only the flags given change; `none` clears a limit
        changes = {f: getattr(args, f) for f in KEY_LIMIT_FIELDS if getattr(args, f) is not UNSET}
        if args.scopes:
            changes["scopes"] = parse_scopes(args.scopes)
        if args.name is not None:
            changes["name"] = args.name
        key = await keys.change(operator, args.key, **changes)
    out(args, key.as_json(), f"{key.id}  {key.prefix}  {key.state}")
    return 0


def _print_secret(args: argparse.Namespace, key: Any, secret: str, account_name: str) -> None:
    out(
        args,
        {**key.as_json(), "key": secret},
        f"{secret}\n(shown once; id {key.id}, prefix {key.prefix}, account {account_name})",
    )


async def _log(args: argparse.Namespace, storage: Any) -> int:
    events = await key_manager(storage).log(args.account, args.key, args.limit)
    rows = [
        {
            "at": e.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "actor": e.actor,
            "action": e.action,
            "key": e.key_id,
            "account": e.account_id,
            "changes": ", ".join(f"{k}={v}" for k, v in sorted(e.changes.items())),
        }
        for e in events
    ]
    columns = ["at", "actor", "action", "key", "account", "changes"]
    human = "\n".join(table(rows, columns)) if rows else "no events"
    out(args, [e.as_json() for e in events], human)
    return 0


def add_key_commands(sub: Any, command: Register) -> None:
    keys = sub.add_parser("keys", help="create, list, pause, resume, revoke, set API keys; log")
    acts = keys.add_subparsers(dest="action", required=True)
    scopes_help = (
        f"comma-separated: {','.join(sorted(SCOPES))} (`keys` and `admin` are never defaults; "
        "only this command grants `admin`)"
    )
    create = acts.add_parser("create", help="a new key; prints the secret once")
    create.add_argument("--account", required=True, help="id or name")
    create.add_argument("--name")
    create.add_argument("--scopes", help=scopes_help)
    for flag in KEY_LIMIT_FIELDS:
        create.add_argument(_flag(flag), dest=flag, type=limit)
    command(create, _keys)
    listing = acts.add_parser("list")
    listing.add_argument("--account")
    command(listing, _keys)
    for action in ("pause", "resume", "revoke"):
        parser = acts.add_parser(action)
        parser.add_argument("key", help="id or visible prefix")
        command(parser, _keys)
    setter = acts.add_parser("set", help="change the name, limits or scopes (`none` clears)")
    setter.add_argument("key", help="id or visible prefix")
    setter.add_argument("--scopes", help=scopes_help)
    setter.add_argument("--name")
    for flag in KEY_LIMIT_FIELDS:
        setter.add_argument(_flag(flag), dest=flag, type=limit, default=UNSET)
    command(setter, _keys)
    log = acts.add_parser(
        "log", help="the audit trail: which key (or the operator) did what to which key, when"
    )
    log.add_argument("--account", help="only this account's keys (id or name)")
    log.add_argument("--key", help="only this key (id or visible prefix)")
    log.add_argument("--limit", type=positive, default=100, help="the newest N (default 100)")
    command(log, _log)
