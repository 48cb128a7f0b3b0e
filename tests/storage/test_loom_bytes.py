"""Looms bounded by bytes on SQLite and PostgreSQL (issue 31, finding 4): migration 0008 measures
the Looms made before it, the per-Loom and per-key quotas refuse a create or a growing change
and write nothing, and the Loom service answers them (409, 429) and bounds an import's title
before the database sees it (PostgreSQL's VARCHAR(200) would answer 500)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from tests.storage.helpers import principal, settings_for
from vllm_acs.errors import InvalidRequest, LoomCapacity, LoomNodeLimit
from vllm_acs.looms import operations
from vllm_acs.routes.looms.service import LoomService
from vllm_acs.storage import open_storage
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.errors import LoomLimitReached
from vllm_acs.storage.loom_records import Loom, LoomNode, new_loom_id, node_bytes
from vllm_acs.storage.migrate import head_revision, upgrade

NOW = datetime(2026, 12, 21, 12, 0, tzinfo=timezone.utc)


def _loom(key_id: str = "key_a", root_text: str = "root text") -> tuple[Loom, LoomNode]:
    loom = Loom(new_loom_id(), key_id, "acct", None, 0, NOW, NOW)
    return loom, LoomNode(loom.id, None, 0, "root", "ready", root_text, NOW, NOW)


def test_0008_measures_the_looms_made_before_it(database_url: str):
    async def main() -> None:
        engine = create_engine(database_url)
        try:
            assert await upgrade(engine, "0007") == "0007"
            tokens = json.dumps([{"text": "é", "logprob": -0.5}], separators=(",", ":"))
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO looms (id, key_id, account_id, title, node_count, "
                        "created_at, updated_at) VALUES ('loom_old', 'key_a', 'acct', NULL, 2, "
                        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    )
                )
                for node_id, body, tokens_ in (("n1", "héllo", None), ("n2", "abc", tokens)):
                    await conn.execute(
                        text(
                            "INSERT INTO loom_nodes (id, loom_id, position, origin, status, "
                            "text, bookmarked, tokens, created_at, updated_at) VALUES (:id, "
                            "'loom_old', 0, 'root', 'ready', :text, false, :tokens, "
                            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                        ),
                        {"id": node_id, "text": body, "tokens": tokens_},
                    )
            assert await upgrade(engine) == head_revision()
        finally:
            await engine.dispose()
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            tree = await storage.looms.tree("loom_old", "key_a")
            assert tree.loom.byte_count == sum(node_bytes(n) for n in tree.nodes)
            assert tree.loom.byte_count == len("héllo".encode()) + 3 + len(tokens)
        finally:
            await storage.close()

    asyncio.run(main())


def test_byte_quotas_refuse_and_write_nothing(database_url: str):
    async def main() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        looms = storage.looms
        try:
            loom, root = _loom(root_text="x" * 100)
            with pytest.raises(LoomLimitReached) as refused:
                await looms.create(loom, [root], max_per_key=10, max_nodes=10, max_bytes=99)
            assert (refused.value.limit, refused.value.value) == ("bytes", 99)
            assert await looms.get(loom.id, None) is None

            made = await looms.create(loom, [root], max_per_key=10, max_nodes=10, max_bytes=150)
            assert made.loom.byte_count == 100
            grow = operations.add_child(root.id, "y" * 60, NOW)
            with pytest.raises(LoomLimitReached) as refused:
                await looms.change(loom.id, "key_a", NOW, grow, max_nodes=10, max_bytes=150)
            assert refused.value.limit == "bytes"
            tree = await looms.tree(loom.id, "key_a")
            assert (len(tree.nodes), tree.loom.byte_count) == (1, 100)

            # The key's Looms together: a second Loom and a change of the first are refused.
            other, other_root = _loom(root_text="z" * 30)
            with pytest.raises(LoomLimitReached) as refused:
                await looms.create(
                    other, [other_root], max_per_key=10, max_nodes=10, max_key_bytes=120
                )
            assert refused.value.limit == "key_bytes"
            small = operations.add_child(root.id, "y" * 30, NOW)
            with pytest.raises(LoomLimitReached) as refused:
                await looms.change(loom.id, "key_a", NOW, small, max_nodes=10, max_key_bytes=120)
            assert refused.value.limit == "key_bytes"
            # Another key's quota is its own.
            theirs, theirs_root = _loom("key_b", root_text="z" * 30)
            await looms.create(
                theirs, [theirs_root], max_per_key=10, max_nodes=10, max_key_bytes=120
            )

            # Within the quotas a change is counted; a deletion gives its bytes back; a
            # change that does not grow is never refused.
            _, (child,) = await looms.change(
                loom.id, "key_a", NOW, small, max_nodes=10, max_bytes=150, max_key_bytes=200
            )
            assert (await looms.get(loom.id, "key_a")).byte_count == 130
            shrink = operations.edit(child.id, operations.NodeEdit(text="y"), NOW)
            await looms.change(loom.id, "key_a", NOW, shrink, max_nodes=10, max_bytes=1)
            assert (await looms.get(loom.id, "key_a")).byte_count == 101
            await looms.change(
                loom.id, "key_a", NOW, operations.delete_subtree(child.id), max_nodes=10
            )
            assert (await looms.get(loom.id, "key_a")).byte_count == 100
            assert await looms.key_bytes("key_a") == 100
        finally:
            await storage.close()

    asyncio.run(main())


def test_the_service_answers_quotas_and_bounds_an_imported_title(database_url: str):
    async def main() -> None:
        settings = settings_for(database_url, loom_max_bytes=200, loom_bytes_per_key=300)
        storage = await open_storage(settings, upgrade_schema=True)
        service = LoomService(settings, lambda: NOW)
        service.bind(storage)
        who = principal("key_q")
        try:
            made = await service.create(json.dumps({"prompt": "p" * 150}).encode(), who)
            loom_id, root_id = made.body["id"], made.body["nodes"][0]["id"]
            grow = json.dumps({"text": "c" * 60}).encode()
            with pytest.raises(LoomNodeLimit, match="200 bytes"):
                await service.add_child(loom_id, root_id, grow, who)
            with pytest.raises(LoomCapacity, match="300 bytes"):
                await service.create(json.dumps({"prompt": "q" * 160}).encode(), who)

            # The title of an import: 200 characters are kept whole, 201 are a 400 naming it.
            document = {"format": "vllm-acs.loom", "version": 1, "nodes": []}
            document["nodes"] = [{"id": "a", "parent_id": None, "text": "t", "origin": "root"}]
            title = "ü" * 200
            imported = await service.import_file(
                json.dumps({**document, "title": title}).encode(), who
            )
            assert imported.body["title"] == title
            with pytest.raises(InvalidRequest) as refused:
                long = json.dumps({**document, "title": title + "x"}).encode()
                await service.import_file(long, who)
            assert refused.value.param == "title"
            assert "200" in str(refused.value)
        finally:
            await storage.close()

    asyncio.run(main())
