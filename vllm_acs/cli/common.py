"""What every storage subcommand of `vllm-acs` shares: printing (`--json` or a table), whole-number
arguments, and running a handler against the deployment's storage.

Runs in the operator's shell, against the database a running node uses (from Settings:
VLLM_ACS_DATABASE_URL, or SQLite under VLLM_ACS_HOME), safely while the node runs. A refusal
prints one line on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from ..settings import Settings

Handler = Callable[[argparse.Namespace, Any], Awaitable[int]]
# `command(parser, handler, upgrade=None)`: gives a subcommand `--json` and its handler.
Register = Callable[..., None]
UNSET: Any = object()


def limit(text: str) -> int | None:
    """A whole number >= 0, or `none` (no limit)."""
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'none', got {text!r}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def out(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2, default=str) if args.json else human)


def table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    cells = [columns] + [[str(row.get(c) if row.get(c) is not None else "-") for c in columns]
                         for row in rows]  # fmt: skip
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in cells
    ]


async def _with_storage(work: Callable[[Any], Awaitable[int]], *, upgrade: bool | None) -> int:
    from ..storage import open_storage

    storage = await open_storage(Settings.load(), upgrade_schema=upgrade)
    try:
        return await work(storage)
    finally:
        await storage.close()


def run(args: argparse.Namespace, handler: Handler, upgrade: bool | None) -> int:
    """Runs a parsed subcommand; a refusal prints one line on stderr and exits 1."""
    from ..account.key_manager import KeyRefused
    from ..storage.errors import StorageError

    try:
        return asyncio.run(_with_storage(lambda storage: handler(args, storage), upgrade=upgrade))
    except (StorageError, KeyRefused, ValueError) as error:
        print(f"vllm-acs {args.command}: {error}", file=sys.stderr)
        return 1


def command(parser: argparse.ArgumentParser, handler: Handler, upgrade: bool | None = None) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=lambda args: run(args, handler, upgrade))
