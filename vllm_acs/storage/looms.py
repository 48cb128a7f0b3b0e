"""Looms and their Nodes: create, list, read a whole tree, change a tree in one transaction,
delete. API server process (the Loom routes, the branch job, the forwarder). Every read and
write is scoped to the key that owns the Loom (another key's Loom reads as absent), but the one
the forwarder routes a replay by.

Byte quotas: a Loom keeps the bytes its Nodes take (`byte_count`, like `node_count`); a write
that grows a Loom past its quota, or the key's Looms together past theirs, writes nothing. The
key's total is read without a lock: changes of several Looms of one key at the same moment may
pass it by what they add together.
"""

from __future__ import annotations

import asyncio
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
    NodePlace,
    TreeChange,
    in_tree_order,
    loom_from_row,
    node_bytes,
    node_from_row,
    node_values,
    places_in_tree_order,
    row_bytes,
)
from .tables import loom_nodes, looms
from .transactions import serialize_per_key, utc, utc_or_none, write_transaction

T = TypeVar("T")
# Rows inserted past this many are made (JSON-encoded) in a worker thread: an import.
_ROWS_IN_THREAD = 64
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
        self,
        loom: Loom,
        nodes: list[LoomNode],
        *,
        max_per_key: int,
        max_nodes: int,
        max_bytes: int | None = None,
        max_key_bytes: int | None = None,
    ) -> LoomTree:
        """Inserts the Loom with its first Nodes (the root; a whole tree for an import), or
        raises LoomLimitReached having written nothing."""
        if len(nodes) > max_nodes:
            raise LoomLimitReached("nodes", max_nodes)
        if len(nodes) > _ROWS_IN_THREAD:
            rows = await asyncio.to_thread(_rows, nodes)
        else:
            rows = _rows(nodes)
        size = sum(row_bytes(row) for row in rows)
        if max_bytes is not None and size > max_bytes:
            raise LoomLimitReached("bytes", max_bytes)
        async with write_transaction(self._engine) as conn:
            await serialize_per_key(conn, loom.key_id)
            count = select(func.count()).where(looms.c.key_id == loom.key_id)
            if int((await conn.execute(count)).scalar_one()) >= max_per_key:
                raise LoomLimitReached("looms", max_per_key)
            if max_key_bytes is not None:
                held = await _key_bytes(conn, loom.key_id)
                if held + size > max_key_bytes:
                    raise LoomLimitReached("key_bytes", max_key_bytes)
            await conn.execute(
                looms.insert().values(
                    id=loom.id,
                    key_id=loom.key_id,
                    account_id=loom.account_id,
                    title=loom.title,
                    node_count=len(nodes),
                    byte_count=size,
                    created_at=utc(loom.created_at),
                    updated_at=utc(loom.updated_at),
                )
            )
            if rows:
                await conn.execute(loom_nodes.insert(), rows)
        return LoomTree(replace(loom, node_count=len(nodes), byte_count=size), nodes)

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
        self,
        loom_id: str,
        key_id: str | None,
        now: datetime,
        plan: Plan[T],
        *,
        max_nodes: int,
        max_bytes: int | None = None,
        max_key_bytes: int | None = None,
    ) -> tuple[LoomTree, T] | None:
        """Reads the tree, lets `plan` decide, writes its change, all in one transaction (the
        Loom's row locked): concurrent changes of one Loom take turns. None: no such Loom.
        A change that grows the Loom's bytes past `max_bytes`, or the key's past
        `max_key_bytes`, raises LoomLimitReached (None: not checked, only counted: a branch
        finishing what it started)."""
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
            grown = _bytes_grown(before, change)
            size = max(0, loom.byte_count + grown)
            if grown > 0 and max_bytes is not None and size > max_bytes:
                raise LoomLimitReached("bytes", max_bytes)
            if (
                grown > 0
                and max_key_bytes is not None
                and await _key_bytes(conn, loom.key_id) + grown > max_key_bytes
            ):
                raise LoomLimitReached("key_bytes", max_key_bytes)
            await _apply(conn, loom.id, change)
            fields = {"node_count": count, "byte_count": size, "updated_at": now}
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

    async def outline(
        self, loom_id: str, key_id: str | None
    ) -> tuple[Loom, list[NodePlace]] | None:
        """The Loom and where each Node sits (id, parent, position), in tree order: the shape
        of a tree without its text, tokens or records. None: no such Loom."""
        query = select(
            loom_nodes.c.id, loom_nodes.c.parent_id, loom_nodes.c.position, loom_nodes.c.created_at
        ).where(loom_nodes.c.loom_id == loom_id)
        async with self._engine.connect() as conn:
            loom = await _loom(conn, loom_id, key_id)
            if loom is None:
                return None
            rows = (await conn.execute(query)).all()
        places = [
            NodePlace(r.id, r.parent_id, int(r.position), utc_or_none(r.created_at)) for r in rows
        ]
        return loom, places_in_tree_order(places)

    async def nodes(self, loom_id: str, node_ids: list[str]) -> dict[str, LoomNode]:
        """The named Nodes of a Loom, whole, by id (a Node deleted meanwhile is absent)."""
        query = select(loom_nodes).where(
            loom_nodes.c.loom_id == loom_id, loom_nodes.c.id.in_(node_ids)
        )
        async with self._engine.connect() as conn:
            return {row.id: node_from_row(row) for row in await conn.execute(query)}

    async def key_bytes(self, key_id: str) -> int:
        async with self._engine.connect() as conn:
            return await _key_bytes(conn, key_id)

    async def count(self, key_id: str) -> int:
        async with self._engine.connect() as conn:
            query = select(func.count()).where(looms.c.key_id == key_id)
            return int((await conn.execute(query)).scalar_one())


def _rows(nodes: list[LoomNode]) -> list[dict]:
    return [node_values(node) for node in nodes]


async def _key_bytes(conn: AsyncConnection, key_id: str) -> int:
    query = select(func.coalesce(func.sum(looms.c.byte_count), 0)).where(looms.c.key_id == key_id)
    return int((await conn.execute(query)).scalar_one())


def _bytes_grown(before: LoomTree, change: TreeChange) -> int:
    """How many bytes the change adds (negative: frees); only the Nodes it touches are
    measured."""
    old = {node.id: node for node in before.nodes}
    grown = sum(node_bytes(node) for node in change.inserts)
    for node in change.updates:
        grown += node_bytes(node) - (node_bytes(old[node.id]) if node.id in old else 0)
    for node_id in change.deletes:
        grown -= node_bytes(old[node_id]) if node_id in old else 0
    return grown


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
