"""`vllm-acs db upgrade|current`: the database schema. Operator's shell."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Register, out


async def _db(args: argparse.Namespace, storage: Any) -> int:
    from ..storage.migrate import current_revision

    revision = await current_revision(storage.engine)
    out(args, {"revision": revision}, f"database schema at revision {revision}")
    return 0


def add_db_commands(sub: Any, command: Register) -> None:
    db = sub.add_parser("db", help="database schema")
    acts = db.add_subparsers(dest="action", required=True)
    command(acts.add_parser("upgrade", help="upgrade the schema to this version's head"), _db, True)
    command(acts.add_parser("current", help="print the schema revision"), _db, False)
