"""Looms in storage on SQLite and PostgreSQL: migration 0004, create and its per-key limit,
changes in one transaction with the node limit, concurrent changes of one Loom, key scoping."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import inspect, text

from tests.storage.helpers import settings_for
from vllm_acs.errors import LoomNodeConflict
from vllm_acs.looms import operations
from vllm_acs.storage import open_storage
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.errors import LoomLimitReached
from vllm_acs.storage.loom_records import Loom, LoomNode, new_loom_id
from vllm_acs.storage.migrate import head_revision, upgrade

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _loom(key_id: str = "key_a", at: datetime = NOW) -> tuple[Loom, LoomNode]:
    loom = Loom(new_loom_id(), key_id, "acct", None, 0, at, at)
    root = LoomNode(loom.id, None, 0, "root", "ready", "root text", at, at)
    return loom, root


def test_0004_adds_the_loom_tables_and_downgrades(database_url: str):
    async def main() -> None:
        engine = create_engine(database_url)
        try:
            assert head_revision() >= "0004"
            assert await upgrade(engine, "0003") == "0003"
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO accounts (id, name, status, spend_capped, created_at) "
                        "VALUES ('acct_old', 'old', 'approved', false, CURRENT_TIMESTAMP)"
                    )
                )
            assert await upgrade(engine) == head_revision()
            async with engine.connect() as conn:
                tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert {"looms", "loom_nodes"} <= tables
        finally:
            await engine.dispose()
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            assert (await storage.accounts.get("acct_old")).name == "old"
            assert await storage.looms.list("key_a", limit=10) == []
        finally:
            await storage.close()

    asyncio.run(main())


def test_create_list_and_the_per_key_limit(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            made = []
            for i in range(3):
                loom, root = _loom(at=NOW + timedelta(seconds=i))
                await storage.looms.create(loom, [root], max_per_key=3, max_nodes=10)
                made.append(loom.id)
            extra, root = _loom()
            with pytest.raises(LoomLimitReached) as refused:
                await storage.looms.create(extra, [root], max_per_key=3, max_nodes=10)
            assert refused.value.limit == "looms"
            assert await storage.looms.get(extra.id, None) is None
            newest = await storage.looms.list("key_a", limit=2)
            assert [loom.id for loom in newest] == made[::-1][:2]
            rest = await storage.looms.list(
                "key_a", limit=2, before=(newest[-1].created_at, newest[-1].id)
            )
            assert [loom.id for loom in rest] == [made[0]]
            # Another key's Loom is absent to this key.
            assert await storage.looms.tree(made[0], "key_b") is None
            assert await storage.looms.delete(made[0], "key_b") is False
            assert await storage.looms.delete(made[0], "key_a") is True
            assert await storage.looms.tree(made[0], "key_a") is None
        finally:
            await storage.close()

    asyncio.run(main())


def test_changes_keep_the_node_limit_and_write_nothing_when_refused(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            loom, root = _loom()
            await storage.looms.create(loom, [root], max_per_key=10, max_nodes=3)
            for text_ in ("a", "b"):
                plan = operations.add_child(root.id, text_, NOW)
                await storage.looms.change(loom.id, "key_a", NOW, plan, max_nodes=3)
            with pytest.raises(LoomLimitReached):
                plan = operations.add_child(root.id, "c", NOW)
                await storage.looms.change(loom.id, "key_a", NOW, plan, max_nodes=3)
            tree = await storage.looms.tree(loom.id, "key_a")
            assert [n.text for n in tree.nodes] == ["root text", "a", "b"]
            assert tree.loom.node_count == 3
            # A refused operation (the root has no sibling) writes nothing either.
            with pytest.raises(LoomNodeConflict):
                plan = operations.add_sibling(root.id, "x", NOW)
                await storage.looms.change(loom.id, "key_a", NOW, plan, max_nodes=3)
            # Deleting a subtree gives its Nodes back to the count.
            _, deleted = await storage.looms.change(
                loom.id, "key_a", NOW, operations.delete_subtree(tree.nodes[1].id), max_nodes=3
            )
            assert [n.text for n in deleted] == ["a"]
            assert (await storage.looms.get(loom.id, "key_a")).node_count == 2
        finally:
            await storage.close()

    asyncio.run(main())


def test_concurrent_changes_of_one_loom_all_land_in_order(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            loom, root = _loom()
            await storage.looms.create(loom, [root], max_per_key=10, max_nodes=100)
            plans = [operations.add_child(root.id, f"child {i}", NOW) for i in range(20)]
            await asyncio.gather(
                *(storage.looms.change(loom.id, "key_a", NOW, p, max_nodes=100) for p in plans)
            )
            tree = await storage.looms.tree(loom.id, "key_a")
            children = tree.children(root.id)
            assert len(children) == 20 and tree.loom.node_count == 21
            assert sorted(c.position for c in children) == list(range(20))
        finally:
            await storage.close()

    asyncio.run(main())
