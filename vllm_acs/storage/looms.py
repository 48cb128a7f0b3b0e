"""Looms and their Nodes: create, list, read a whole tree, change a tree in one transaction,
delete. API server process (the Loom routes, the branch job, the forwarder). Every read and
write is scoped to the key that owns the Loom (another key's Loom reads as absent), but the one
the forwarder routes a replay by.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .errors import LoomLimitReached
from .loom_records import (
    Loom,
    LoomNode,
    LoomTree,
    TreeChange,
    in_tree_order,
    loom_from_row,
    node_from_row,
    node_values,
)
from .tables import loom_nodes, looms
from .transactions import serialize_per_key, utc, write_transaction

T = TypeVar("T")
# Plans a change from the tree as it is inside the transaction; raises to change nothing.
Plan = Callable[[LoomTree], tuple[TreeChange, T]]


async def _tree(conn: AsyncConnection, loom: Loom) -> LoomTree:
    rows = await conn.execute(select(loom_nodes).where(loom_nodes.c.loom_id == loom.id))
    return LoomTree(loom, in_tree_order([node_from_row(row) for row in rows]))


async def _loom(
    conn: AsyncConnection, loom_id: str, key_id: str | None, *, lock: bool = False
) -> Loom | None:
    query = select(looms).where(looms.c.id == loom_id)
    if key_id is not None:
        query = query.where(looms.c.key_id == key_id)
    if lock:
        query = query.with_for_update()  # PostgreSQL; SQLite's write lock is held already
    row = (await conn.execute(query)).first()
    return None if row is None else loom_from_row(row)


class LoomRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create(
        self, loom: Loom, nodes: list[LoomNode], *, max_per_key: int, max_nodes: int
    ) -> LoomTree:
        """Inserts the Loom with its first Nodes (the root; a whole tree for an import), or
        raises LoomLimitReached having written nothing."""
        if len(nodes) > max_nodes:
            raise LoomLimitReached("nodes", max_nodes)
        async with write_transaction(self._engine) as conn:
            await serialize_per_key(conn, loom.key_id)
            count = select(func.count()).where(looms.c.key_id == loom.key_id)
            if int((await conn.execute(count)).scalar_one()) >= max_per_key:
                raise LoomLimitReached("looms", max_per_key)
            await conn.execute(
                looms.insert().values(
                    id=loom.id,
                    key_id=loom.key_id,
                    account_id=loom.account_id,
                    title=loom.title,
                    node_count=len(nodes),
                    created_at=utc(loom.created_at),
                    updated_at=utc(loom.updated_at),
                )
            )
            if nodes:
                await conn.execute(loom_nodes.insert(), [node_values(n) for n in nodes])
        return LoomTree(replace(loom, node_count=len(nodes)), nodes)

    async def list(
        self, key_id: str, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[Loom]:
        """The key's Looms, newest first; `before` is the (created_at, id) of the last one seen."""
        query = select(looms).where(looms.c.key_id == key_id)
        if before is not None:
            created, loom_id = utc(before[0]), before[1]
            query = query.where(
                or_(
                    looms.c.created_at < created,
                    and_(looms.c.created_at == created, looms.c.id < loom_id),
                )
            )
        query = query.order_by(looms.c.created_at.desc(), looms.c.id.desc()).limit(limit)
        async with self._engine.connect() as conn:
            return [loom_from_row(row) for row in await conn.execute(query)]

    async def get(self, loom_id: str, key_id: str | None) -> Loom | None:
        async with self._engine.connect() as conn:
            return await _loom(conn, loom_id, key_id)

    async def tree(self, loom_id: str, key_id: str | None) -> LoomTree | None:
        async with self._engine.connect() as conn:
            loom = await _loom(conn, loom_id, key_id)
            return None if loom is None else await _tree(conn, loom)

    async def recorded_model(self, loom_id: str, node_id: str) -> str | None:
        """The model a Node's generation recorded (a model's Node), None for any other Node or
        none at all. Not scoped to a key: the forwarder only routes by it (the node that serves
        the model then checks the key), and it needs one row, not the tree."""
        query = select(loom_nodes.c.generation).where(
            loom_nodes.c.loom_id == loom_id, loom_nodes.c.id == node_id
        )
        async with self._engine.connect() as conn:
            generation = (await conn.execute(query)).scalar_one_or_none()
        recorded = json.loads(generation) if generation else None
        model = recorded.get("model") if isinstance(recorded, dict) else None
        return model if isinstance(model, str) else None

    async def change(
        self, loom_id: str, key_id: str | None, now: datetime, plan: Plan[T], *, max_nodes: int
    ) -> tuple[LoomTree, T] | None:
        """Reads the tree, lets `plan` decide, writes its change, all in one transaction (the
        Loom's row locked): concurrent changes of one Loom take turns. None: no such Loom."""
        now = utc(now)
        async with write_transaction(self._engine) as conn:
            loom = await _loom(conn, loom_id, key_id, lock=True)
            if loom is None:
                return None
            before = await _tree(conn, loom)
            change, result = plan(before)
            count = loom.node_count + len(change.inserts) - len(change.deletes)
            if change.inserts and count > max_nodes:
                raise LoomLimitReached("nodes", max_nodes)
            await _apply(conn, loom.id, change)
            fields = {"node_count": count, "updated_at": now}
            if change.retitle:
                fields["title"] = change.title
            await conn.execute(update(looms).where(looms.c.id == loom.id).values(**fields))
            after = await _tree(conn, replace(loom, **fields))
        return after, result

    async def delete(self, loom_id: str, key_id: str) -> bool:
        async with write_transaction(self._engine) as conn:
            loom = await _loom(conn, loom_id, key_id, lock=True)
            if loom is None:
                return False
            await conn.execute(delete(loom_nodes).where(loom_nodes.c.loom_id == loom_id))
            await conn.execute(delete(looms).where(looms.c.id == loom_id))
        return True

    async def count(self, key_id: str) -> int:
        async with self._engine.connect() as conn:
            query = select(func.count()).where(looms.c.key_id == key_id)
            return int((await conn.execute(query)).scalar_one())


async def _apply(conn: AsyncConnection, loom_id: str, change: TreeChange) -> None:
    if change.deletes:
        await conn.execute(
            delete(loom_nodes).where(
                loom_nodes.c.loom_id == loom_id, loom_nodes.c.id.in_(change.deletes)
            )
        )
    for node in change.updates:
        values = node_values(node)
        del values["id"], values["loom_id"], values["created_at"]
        await conn.execute(
            update(loom_nodes)
            .where(loom_nodes.c.loom_id == loom_id, loom_nodes.c.id == node.id)
            .values(**values)
        )
    if change.inserts:
        await conn.execute(loom_nodes.insert(), [node_values(n) for n in change.inserts])
