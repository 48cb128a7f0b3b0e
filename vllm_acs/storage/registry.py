"""The deployment's model registry in the shared database: each API node announces the model it
serves and its internal address, beats its heartbeat, and leaves at shutdown; any node reads the
live ones. API server process. Times are the caller's `now`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from ..served_model import ServedModel
from .tables import deployment_nodes
from .transactions import utc, utc_or_none, write_transaction


@dataclass(frozen=True)
class NodeVersions:
    plugin: str | None
    vllm: str | None


@dataclass(frozen=True)
class RegisteredNode:
    id: str
    address: str  # e.g. http://10.0.0.5:8000, where other nodes forward its model's requests
    model: ServedModel
    started_at: datetime
    heartbeat_at: datetime
    versions: NodeVersions = NodeVersions(None, None)


def _model_json(model: ServedModel) -> str:
    return json.dumps(dataclasses.asdict(model), separators=(",", ":"))


def _model_from_json(text: str) -> ServedModel:
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(ServedModel)}
    return ServedModel(**{k: v for k, v in data.items() if k in known})


_ANNOUNCED = ("address", "model_id", "model", "heartbeat_at", "plugin_version", "vllm_version")


def _node(row: Any) -> RegisteredNode:
    return RegisteredNode(
        id=row.id,
        address=row.address,
        model=_model_from_json(row.model),
        started_at=utc_or_none(row.started_at),  # type: ignore[arg-type]
        heartbeat_at=utc_or_none(row.heartbeat_at),  # type: ignore[arg-type]
        versions=NodeVersions(row.plugin_version, row.vllm_version),
    )


class RegistryRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def announce(
        self,
        node_id: str,
        address: str,
        model: ServedModel,
        now: datetime,
        *,
        versions: NodeVersions | None = None,
    ):
        """Registers (or re-registers) this node as alive now."""
        now = utc(now)
        versions = versions or NodeVersions(None, None)
        values = {
            "id": node_id,
            "address": address,
            "model_id": model.id,
            "model": _model_json(model),
            "started_at": now,
            "heartbeat_at": now,
            "plugin_version": versions.plugin,
            "vllm_version": versions.vllm,
        }
        async with write_transaction(self._engine) as conn:
            dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
            statement = dialect.insert(deployment_nodes).values(**values)
            await conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[deployment_nodes.c.id],
                    set_={k: values[k] for k in _ANNOUNCED},
                )
            )

    async def beat(self, node_id: str, now: datetime) -> bool:
        """This node is alive now; False when its row is gone (it must announce itself again)."""
        async with write_transaction(self._engine) as conn:
            result = await conn.execute(
                update(deployment_nodes)
                .where(deployment_nodes.c.id == node_id)
                .values(heartbeat_at=utc(now))
            )
        return result.rowcount == 1

    async def leave(self, node_id: str) -> None:
        async with write_transaction(self._engine) as conn:
            await conn.execute(delete(deployment_nodes).where(deployment_nodes.c.id == node_id))

    async def live(self, now: datetime, ttl_s: float) -> list[RegisteredNode]:
        """The nodes whose heartbeat is younger than `ttl_s`, oldest first."""
        since = utc(now) - timedelta(seconds=ttl_s)
        query = (
            select(deployment_nodes)
            .where(deployment_nodes.c.heartbeat_at >= since)
            .order_by(deployment_nodes.c.started_at, deployment_nodes.c.id)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_node(row) for row in rows]

    async def every(self) -> list[RegisteredNode]:
        """Every row, live or silent (not yet forgotten), oldest first: the console's Nodes."""
        query = select(deployment_nodes).order_by(
            deployment_nodes.c.started_at, deployment_nodes.c.id
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_node(row) for row in rows]

    async def model_ids(self) -> set[str]:
        """The models of every row, live or silent: a silent node's row stays until it is
        forgotten, so its model is still known to the deployment meanwhile."""
        query = select(deployment_nodes.c.model_id).distinct()
        async with self._engine.connect() as conn:
            return set((await conn.execute(query)).scalars())

    async def forget_older_than(self, now: datetime, age_s: float) -> int:
        """Deletes the rows of nodes silent for `age_s` (long gone), so the table stays small."""
        since = utc(now) - timedelta(seconds=age_s)
        async with write_transaction(self._engine) as conn:
            result = await conn.execute(
                delete(deployment_nodes).where(deployment_nodes.c.heartbeat_at < since)
            )
        return result.rowcount
