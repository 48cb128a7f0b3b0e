"""The first-run key of the embedded default, the way Jupyter prints its token: `vllm-acs
local-key` (which `make serve` runs before it starts the node) makes a local account and key once,
keeps the secret in `<home>/local-key` (mode 0600), and prints it with lines to paste.

Operator's shell. Only the embedded default (SQLite under the home directory) gets one: a node
with a configured database never creates keys by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from ..private_paths import make_private_folder
from ..settings import Settings
from ..storage.api_key_secret import looks_like_secret, secret_matches, visible_prefix

ACCOUNT_NAME = "local"
KEY_NAME = "local"
FILE_NAME = "local-key"


CONFIGURED_DATABASE = (
    "this node uses a configured database (VLLM_ACS_DATABASE_URL): it never makes keys by "
    "itself; create one with `vllm-acs accounts create` and `vllm-acs keys create`"
)


class LocalKeyRefused(RuntimeError):
    """The node is not the embedded default, or the kept key no longer works."""


def key_file(settings: Settings) -> Path:
    return settings.home / FILE_NAME


async def ensure_local_key(settings: Settings, storage: Any) -> tuple[str, bool]:
    """The local key's secret, and whether it was made now. The same key on every later run."""
    if settings.database_url is not None:
        raise LocalKeyRefused(CONFIGURED_DATABASE)
    path = key_file(settings)
    if path.exists():
        secret = path.read_text().strip()
        key = await _stored(storage, secret)
        if key is None or key.state != "active":
            state = "gone" if key is None else key.state
            raise LocalKeyRefused(
                f"the key kept in {path} is {state} in this node's database; delete the file "
                "to make a new one"
            )
        return secret, False
    from ..storage.errors import NotFoundError

    try:
        account = await storage.accounts.get(ACCOUNT_NAME)
    except NotFoundError:
        account = await storage.accounts.create(ACCOUNT_NAME, approved=True)
    from ..storage.key_events import OPERATOR, KeyEvent
    from .principal import DEFAULT_SCOPES

    # Made on the operator's own machine by the operator's command: audited as the operator's.
    scopes = sorted(DEFAULT_SCOPES)
    event = KeyEvent(OPERATOR, "create", {"name": KEY_NAME, "scopes": scopes, "via": "local-key"})
    _key, secret = await storage.keys.create(
        account.id, name=KEY_NAME, scopes=tuple(scopes), event=event
    )
    make_private_folder(path.parent)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret + "\n")
    return secret, True


async def _stored(storage: Any, secret: str) -> Any:
    """The kept secret's key, or None when the database knows no such key."""
    if not looks_like_secret(secret):
        return None
    found = await storage.keys.lookup(visible_prefix(secret))
    if found is None or not secret_matches(secret, found.secret_hash):
        return None
    return found.key


def banner(secret: str, path: Path, port: int, made: bool, model: str) -> str:
    base = f"http://127.0.0.1:{port}"
    return "\n".join(
        [
            f"vllm_acs: {'made' if made else 'your'} local API key, kept in {path} "
            "(readable by you only):",
            f"    {secret}",
            "Once the node says 'Application startup complete', try:",
            f'    curl {base}/v1/models -H "Authorization: Bearer {secret}"',
            f'    curl {base}/v1/completions -H "Authorization: Bearer {secret}" \\',
            "         -H 'Content-Type: application/json' \\",
            f'         -d \'{{"model": "{model}", "prompt": "The sky is", "max_tokens": 8}}\'',
            f'    python -c \'from openai import OpenAI; print(OpenAI(base_url="{base}/v1", '
            f'api_key="{secret}").completions.create(model="{model}", prompt="The sky is", '
            "max_tokens=8).choices[0].text)'",
            "More keys, accounts and budgets: `vllm-acs keys --help` (README: 'Accounts, keys, "
            "usage').",
            f"The API's pages: {base}/docs",
        ]
    )


def _command(args: argparse.Namespace) -> int:
    settings = Settings.load()
    try:
        if settings.database_url is not None:
            raise LocalKeyRefused(CONFIGURED_DATABASE)
        secret, made = asyncio.run(_with_storage(settings))
    except LocalKeyRefused as refusal:
        print(f"vllm-acs local-key: {refusal}", file=sys.stderr)
        return 1
    if args.quiet:
        print(secret)
    else:
        print(banner(secret, key_file(settings), args.port, made, args.model))
    return 0


async def _with_storage(settings: Settings) -> tuple[str, bool]:
    from ..storage import open_storage

    # The embedded SQLite of a first run has no schema yet: make it.
    storage = await open_storage(settings, upgrade_schema=True)
    try:
        return await ensure_local_key(settings, storage)
    finally:
        await storage.close()


def add_local_key_command(sub: Any) -> None:
    parser = sub.add_parser(
        "local-key",
        help="the embedded default's local key: made on the first run, printed with examples",
    )
    parser.add_argument("--port", type=int, default=8000, help="the node's port, for the examples")
    parser.add_argument("--model", default="tiny-llama", help="the model id, for the examples")
    parser.add_argument("--quiet", action="store_true", help="print the key alone")
    parser.set_defaults(handler=_command)
