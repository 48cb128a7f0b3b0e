"""`vllm-acs jobs list|show|cancel|sweep`: the operator's view of completion jobs, their cancel,
and the retention sweep by hand. Operator's shell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..states import JobStatus
from .common import Register, out, positive, table

if TYPE_CHECKING:  # storage imports SQLAlchemy: only when a command runs (fast `--help`)
    from ..storage.jobs import Job

# Bodies can be megabytes (a prompt, a whole completion): list and show give their sizes.
_BODIES = ("request", "result_body")


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_json(job: Job) -> dict[str, Any]:
    """Every column of the job but the request and result bodies, which become their byte sizes."""
    row: dict[str, Any] = {}
    for f in dataclasses.fields(job):
        if f.name not in _BODIES:
            value = getattr(job, f.name)
            row[f.name] = _iso(value) if isinstance(value, datetime) else value
    row["status"] = JobStatus(job.status).value
    # The stored request is the compact JSON that submit wrote; dumping it again gives its size.
    request = None if job.request is None else json.dumps(job.request, separators=(",", ":"))
    row["request_bytes"] = None if request is None else len(request.encode())
    row["result_bytes"] = None if job.result_body is None else len(job.result_body.encode())
    return row


def _short(value: datetime | None) -> str | None:
    return None if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc_time(text: str) -> datetime:
    """An ISO 8601 time; without an offset it is UTC. `Z` is accepted (Python 3.10 does not)."""
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-12-01T12:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


async def _get(storage: Any, job_id: str) -> Job:
    from ..storage.errors import NotFoundError

    job = await storage.jobs.get(job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id!r}")
    return job


async def _list(args: argparse.Namespace, storage: Any) -> int:
    key_id = (await storage.keys.get(args.key)).id if args.key else None
    found = await storage.jobs.list(key_id=key_id, status=args.status, limit=args.limit)
    rows = [
        {
            "id": j.id,
            "kind": j.kind,
            "status": JobStatus(j.status).value,
            "model": j.model,
            "key": j.key_id,
            "attempt": j.attempt,
            "created": _short(j.created_at),
            "finished": _short(j.finished_at),
        }
        for j in found
    ]
    columns = ["id", "kind", "status", "model", "key", "attempt", "created", "finished"]
    human = "\n".join(table(rows, columns)) if rows else "no jobs"
    out(args, [job_json(j) for j in found], human)
    return 0


async def _show(args: argparse.Namespace, storage: Any) -> int:
    row = job_json(await _get(storage, args.job))
    width = max(len(name) for name in row)
    human = "\n".join(f"{name.ljust(width)}  {'-' if v is None else v}" for name, v in row.items())
    out(args, row, human)
    return 0


async def _cancel(args: argparse.Namespace, storage: Any) -> int:
    from ..storage.errors import ConflictError, NotFoundError

    job = await _get(storage, args.job)
    was_running = job.status is JobStatus.RUNNING
    if not job.ended:
        # key None: the operator may cancel any key's job. One that ended between the read above
        # and this write comes back unchanged and is refused below, like any ended job.
        cancelled = await storage.jobs.cancel(job.id, None, datetime.now(timezone.utc))
        if cancelled is None:  # deleted in between (a retention sweep)
            raise NotFoundError(f"no job {job.id!r}")
        job = cancelled
        if job.status is JobStatus.CANCELLED:
            note = " (its node aborts the engine request within a third of its lease)"
            out(args, job_json(job), f"job {job.id} cancelled{note if was_running else ''}")
            return 0
    raise ConflictError(f"job {job.id} already ended: {JobStatus(job.status).value}")


async def _sweep(args: argparse.Namespace, storage: Any) -> int:
    now = args.now or datetime.now(timezone.utc)
    from ..harvest.retention import RESULT_TTLS, sweep_files

    report = await storage.jobs.sweep(now, result_ttls=RESULT_TTLS)
    harvest_files = await sweep_files(storage.files, storage.jobs, now)
    result = {"now": now.isoformat(), **dataclasses.asdict(report), "harvest_files": harvest_files}
    human = (
        f"retention sweep as of {now.isoformat()}: {report.expired} queued jobs expired, "
        f"{report.emptied} ended jobs emptied of request and result, {report.deleted} jobs "
        f"deleted, {report.idempotency_deleted} idempotency records deleted, the files of "
        f"{harvest_files} harvests deleted"
    )
    out(args, result, human)
    return 0


def add_job_commands(sub: Any, command: Register) -> None:
    """Adds `jobs` to the `vllm-acs` parser; `command` is common.command."""
    jobs = sub.add_parser("jobs", help="list, show and cancel jobs; run the retention sweep")
    acts = jobs.add_subparsers(dest="action", required=True)

    listing = acts.add_parser("list", help="jobs, newest first")
    listing.add_argument("--key", help="a key's id or visible prefix")
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--limit", type=positive, default=100, help="at most N (default 100)")
    command(listing, _list)

    show = acts.add_parser("show", help="one job: every column, the bodies as sizes in bytes")
    show.add_argument("job", help="job id")
    command(show, _show)

    cancel = acts.add_parser("cancel", help="cancel a queued or running job of any key")
    cancel.add_argument("job", help="job id")
    command(cancel, _cancel)

    sweep = acts.add_parser(
        "sweep",
        help="run the nodes' retention sweep once",
        description="Expire queued jobs past 24 h, empty ended jobs' request and result past "
        "24 h, delete ended jobs past 7 days, delete expired idempotency records. It writes: "
        "--now runs it as of that time, not as a dry run.",
    )
    sweep.add_argument("--now", type=_utc_time, help="ISO 8601 time, UTC unless an offset given")
    command(sweep, _sweep)
