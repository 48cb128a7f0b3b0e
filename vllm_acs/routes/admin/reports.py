"""The console's reads across the deployment: usage by account, key, model, workload and day
(JSON or CSV, the rows of the researcher's `GET /v1/usage` days with who and which workload),
the nodes of the registry, and the audit log. API server process.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi.responses import Response

from ...errors import AccountNotFound, echoed
from ...storage import Storage
from ...storage.errors import NotFoundError
from ...storage.key_events import ACTIONS
from ...storage.periods import month_of
from ..applications.service import unix
from . import queries
from .protocol import (
    AdminUsage,
    AdminUsageRow,
    AuditEvent,
    AuditList,
    ModelNodes,
    NodeList,
    NodeView,
)

USAGE_COLUMNS = list(AdminUsageRow.model_fields)
EPOCH_MAX = 253_402_300_799  # 9999-12-31


class AdminReports:
    """Bound to storage once the engine is up (`bind`, from init_state)."""

    def __init__(self, clock: Callable[[], datetime], node_ttl_s: float) -> None:
        self.clock = clock
        self.node_ttl_s = node_ttl_s
        self.storage: Storage | None = None

    def bind(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def _storage(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("vllm_acs admin: storage is not open (no init_state)")
        return self.storage

    async def usage(self, params: Mapping[str, str]) -> dict[str, Any] | Response:
        queries.only(params, ("period", "format", "account_id", "key_id", "model", "workload"))
        now = self.clock()
        period = queries.period(params, month_of(now))
        form = queries.choice(params, "format", ("json", "csv")) or "json"
        account_ref = queries.text(params, "account_id")
        account_id = None
        if account_ref is not None:
            try:
                account_id = (await self._storage.accounts.get(account_ref)).id
            except NotFoundError:
                raise AccountNotFound(
                    f"No account '{echoed(account_ref)}'.", param="account_id"
                ) from None
        rows = await self._storage.usage.days_across_accounts(
            period,
            account_id=account_id,
            key_id=queries.text(params, "key_id"),
            model=queries.text(params, "model"),
            workload=queries.text(params, "workload"),
        )
        names = {a.id: a.name for a in await self._storage.accounts.list()}
        found = [AdminUsageRow(**row, account_name=names.get(row["account_id"])) for row in rows]
        if form == "csv":
            return _csv(found, period)
        return AdminUsage(period=period, generated_at=unix(now), rows=found).model_dump()  # type: ignore[arg-type]

    async def nodes(self) -> dict[str, Any]:
        now = self.clock()
        since = now - timedelta(seconds=self.node_ttl_s)
        rows = await self._storage.registry.every()
        views = [
            NodeView(
                id=n.id,
                address=n.address,
                model_id=n.model.id,
                checkpoint=n.model.checkpoint,
                warm=n.heartbeat_at >= since,
                started_at=unix(n.started_at),  # type: ignore[arg-type]
                last_heartbeat_at=unix(n.heartbeat_at),  # type: ignore[arg-type]
                plugin_version=n.versions.plugin,
                vllm_version=n.versions.vllm,
            )
            for n in rows
        ]
        models: dict[str, int] = {}
        for view in views:
            models[view.model_id] = models.get(view.model_id, 0) + int(view.warm)
        return NodeList(
            generated_at=unix(now),  # type: ignore[arg-type]
            data=views,
            models=[ModelNodes(id=m, nodes=n, warm=n > 0) for m, n in sorted(models.items())],
        ).model_dump()

    async def audit(self, params: Mapping[str, str]) -> dict[str, Any]:
        queries.only(
            params, ("limit", "since", "before", "account_id", "key_id", "actor", "action")
        )
        limit = queries.integer(params, "limit", 1, 500) or 100
        since = queries.integer(params, "since", 0, EPOCH_MAX)
        account_ref = queries.text(params, "account_id")
        account_id = account_ref
        if account_ref is not None:
            try:
                account_id = (await self._storage.accounts.get(account_ref)).id
            except NotFoundError:
                account_id = account_ref  # an account deleted since: its id still filters
        events = await self._storage.key_events.newest(
            account_id=account_id,
            key_id=queries.text(params, "key_id"),
            actor=queries.text(params, "actor"),
            action=queries.choice(params, "action", ACTIONS),
            since=None if since is None else datetime.fromtimestamp(since, tz=timezone.utc),
            before=queries.integer(params, "before", 1, 2**62),
            limit=limit,
        )
        data = [
            AuditEvent(
                id=e.id,
                at=unix(e.at),  # type: ignore[arg-type]
                actor=e.actor,
                action=e.action,
                account_id=e.account_id,
                key_id=e.key_id,
                changes=e.changes,
            )
            for e in events
        ]
        next_before = data[-1].id if len(data) == limit else None
        return AuditList(data=data, next_before=next_before).model_dump()


def _csv(rows: list[AdminUsageRow], period: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(USAGE_COLUMNS)
    for row in rows:
        data = row.model_dump()
        writer.writerow(["" if data[c] is None else data[c] for c in USAGE_COLUMNS])
    return Response(
        out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="usage-{period}.csv"'},
    )
