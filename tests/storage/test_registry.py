"""The model registry on SQLite and PostgreSQL, on an explicit clock: announce, heartbeat,
the live nodes by TTL, leave, re-announce after the row was forgotten; and NodeRegistry's
ejection (until the node beats again) and its listing of the deployment's models."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tests.storage.helpers import settings_for
from vllm_acs.deployment.registry import NodeRegistry
from vllm_acs.served_model import ServedModel
from vllm_acs.storage import open_storage

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
A = ServedModel("model-a", "org/a", 2048, 20, "cpu", 0)
B = ServedModel("model-b", "org/b", 4096, 20, "cpu", 0)


def test_live_nodes_by_heartbeat(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        registry = storage.registry
        try:
            await registry.announce("n1", "http://127.0.0.1:1", A, T0)
            await registry.announce("n2", "http://127.0.0.1:2", B, T0)
            live = await registry.live(T0 + timedelta(seconds=5), ttl_s=10)
            assert [(n.id, n.model) for n in live] == [("n1", A), ("n2", B)]
            assert await registry.beat("n1", T0 + timedelta(seconds=8))
            later = await registry.live(T0 + timedelta(seconds=12), ttl_s=10)
            assert [n.id for n in later] == ["n1"]  # n2 went silent
            await registry.leave("n1")
            assert await registry.live(T0 + timedelta(seconds=12), ttl_s=10) == []
            assert not await registry.beat("n1", T0 + timedelta(seconds=13))  # must re-announce
            assert await registry.forget_older_than(T0 + timedelta(hours=1), 60) == 1
        finally:
            await storage.close()

    asyncio.run(main())


def test_an_ejected_node_is_left_out_until_it_beats_again(sqlite_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(sqlite_url), upgrade_schema=True)
        now = [T0]
        ours = NodeRegistry(
            storage.registry,
            "self",
            "http://127.0.0.1:9",
            lambda: A,
            heartbeat_s=0.0,  # read the table on every call
            ttl_s=10,
            clock=lambda: now[0],
        )
        try:
            await ours.start()
            await storage.registry.announce("other", "http://127.0.0.1:2", B, T0)
            assert [n.id for n in await ours.nodes_for("model-b")] == ["other"]
            assert await ours.nodes_for("model-a") == []  # this node is not forwarded to
            models = await ours.models()
            assert [m.id for m in models] == ["model-a", "model-b"]
            assert models[1] == replace(B, default=False)
            now[0] = T0 + timedelta(seconds=1)
            ours.eject("other")
            assert await ours.nodes_for("model-b") == []
            await storage.registry.beat("other", T0 + timedelta(seconds=2))
            assert [n.id for n in await ours.nodes_for("model-b")] == ["other"]
        finally:
            await ours.close()
            await storage.close()

    asyncio.run(main())


def test_serving_counts_the_live_nodes_of_a_model_on_the_registry_clock(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        now = [T0]
        ours = NodeRegistry(
            storage.registry,
            "self",
            "http://127.0.0.1:9",
            lambda: A,
            heartbeat_s=0.0,  # read the table on every call
            ttl_s=10,
            clock=lambda: now[0],
        )
        try:
            await ours.start()
            await storage.registry.announce("a2", "http://127.0.0.1:2", A, T0)
            await storage.registry.announce("b1", "http://127.0.0.1:3", B, T0)
            assert await ours.serving("model-a") == 2
            assert await ours.serving("model-b") == 1
            assert await ours.serving("model-z") is None  # no node ever served it
            # a2 beats on; b1's heartbeat lapses past the TTL.
            await storage.registry.beat("a2", T0 + timedelta(seconds=10))
            now[0] = T0 + timedelta(seconds=11)
            assert await ours.serving("model-a") == 2
            assert await ours.serving("model-b") == 0  # lapsed, still known: not warm
            # a2 lapses too; this node counts itself while it serves (it is answering).
            now[0] = T0 + timedelta(seconds=21)
            assert await ours.serving("model-a") == 1
            await storage.registry.beat("b1", now[0])  # b1 beats again: live again
            assert await ours.serving("model-b") == 1
            ours.eject("b1")  # its connection failed: out until it beats again
            assert await ours.serving("model-b") == 0
            await storage.registry.leave("b1")  # its row gone: the model is unknown
            assert await ours.serving("model-b") is None
        finally:
            await ours.close()
            await storage.close()

    asyncio.run(main())
