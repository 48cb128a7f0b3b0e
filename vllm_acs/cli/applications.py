"""`vllm-acs applications list|approve|reject`: the operator's face of the application service
(`account/applications.py`), which the console's /v1/admin/applications shares; each decision is
audited as actor `operator`. Operator's shell."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone
from typing import Any

from .common import Register, limit, out, positive, table


def _service(storage: Any) -> Any:
    from ..account.applications import ApplicationLimits, Applications
    from .keys import key_manager

    settings = storage.settings
    limits = ApplicationLimits(
        per_address=settings.applications_per_address,
        pending_cap=settings.applications_pending_cap,
        ttl=timedelta(days=settings.application_ttl_days),
    )
    return Applications(
        storage.applications, key_manager(storage), limits, lambda: datetime.now(timezone.utc)
    )


def _json(application: Any, now: datetime) -> dict[str, Any]:
    return {
        "id": application.id,
        "status": application.status_at(now),
        "name": application.name,
        "email": application.email,
        "affiliation": application.affiliation,
        "intended_use": application.intended_use,
        "account_id": application.account_id,
        "created_at": application.created_at.isoformat(),
        "expires_at": application.expires_at.isoformat(),
        "decided_by": application.decided_by,
        "note": application.note,
        "key_id": application.key_id,
    }


async def _applications(args: argparse.Namespace, storage: Any) -> int:
    from ..account.key_manager import Actor

    service, now = _service(storage), datetime.now(timezone.utc)
    if args.action == "list":
        status = None if args.status == "all" else args.status
        found = [_json(a, now) for a in await service.list(status, args.limit)]
        columns = ["id", "status", "name", "email", "affiliation", "created_at"]
        out(args, found, "\n".join(table(found, columns)) if found else "no applications")
        return 0
    if args.action == "approve":
        done = await service.approve(
            Actor.operator(), args.application, monthly_tokens=args.monthly_tokens, note=args.note
        )
    else:
        done = await service.reject(Actor.operator(), args.application, note=args.note)
    out(args, _json(done, now), f"{done.id}  {done.status_at(now)}  {done.email}")
    return 0


def add_application_commands(sub: Any, command: Register) -> None:
    from ..storage.applications import STATUSES

    apps = sub.add_parser("applications", help="list, approve, reject applications for access")
    acts = apps.add_subparsers(dest="action", required=True)
    listing = acts.add_parser("list", help="newest first")
    listing.add_argument("--status", choices=[*STATUSES, "all"], default="pending")
    listing.add_argument("--limit", type=positive, default=100)
    command(listing, _applications)
    approve = acts.add_parser("approve", help="approve a pending application and its account")
    approve.add_argument("application", help="its id (app_...)")
    approve.add_argument("--monthly-tokens", type=limit, help="the account's monthly total")
    approve.add_argument("--note")
    command(approve, _applications)
    reject = acts.add_parser("reject", help="reject a pending application")
    reject.add_argument("application", help="its id (app_...)")
    reject.add_argument("--note")
    command(reject, _applications)
