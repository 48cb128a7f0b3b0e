"""Looms and their Nodes, scoped to the caller's key: create, list, read, retitle, delete, the
Node operations, the path's text, export and import. API server process.

Every change of a tree is planned by a pure operation (`looms/operations.py`) and written in
one transaction (`LoomRepository.change`); another key's Loom is a 404, never a 403.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...contract.bounded_json import loads_bounded
from ...contract.completion_request import parse_body
from ...contract.loom_requests import (
    LoomCreateBody,
    LoomPatchBody,
    NodePatchBody,
    NodeSplitBody,
    NodeTextBody,
)
from ...errors import InvalidRequest, LoomCapacity, LoomNodeLimit, LoomNotFound
from ...looms import operations
from ...looms.export_file import export_document
from ...looms.import_file import nodes_from_file
from ...looms.tree import node_of, path_text
from ...looms.views import loom_summary, loom_view, nodes_view
from ...principal import Principal
from ...settings import Settings
from ...storage import Storage
from ...storage.errors import LoomLimitReached
from ...storage.loom_records import Loom, LoomNode, LoomTree, TreeChange, new_loom_id
from ..answers import Answer

LOOMS_PATH = "/v1/looms"
IMPORT_PATH = "/v1/looms/import"
LIST_LIMIT_MAX = 100


def json_of(raw: bytes) -> Any:
    return loads_bounded(raw)


class LoomService:
    """Bound to storage once the engine is up (`bind`, from init_state)."""

    def __init__(self, settings: Settings, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.clock = clock
        self.storage: Storage | None = None

    def bind(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def _storage(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("vllm_acs looms: storage is not open (init_state did not run)")
        return self.storage

    def _check_text(self, text: str, param: str) -> None:
        if len(text) > self.settings.loom_max_text_chars:
            raise InvalidRequest(
                f"'{param}' has {len(text)} characters; a Node holds at most "
                f"{self.settings.loom_max_text_chars}.",
                param=param,
            )

    async def create(self, raw: bytes, principal: Principal) -> Answer:
        body = parse_body(LoomCreateBody, json_of(raw))
        self._check_text(body.prompt, "prompt")
        now = self.clock()
        loom = _new_loom(principal, body.title, now)
        root = LoomNode(
            loom_id=loom.id,
            parent_id=None,
            position=0,
            origin="root",
            status="ready",
            text=body.prompt,
            created_at=now,
            updated_at=now,
        )
        tree = await self._create(loom, [root])
        return Answer(201, loom_view(tree), {"location": f"{LOOMS_PATH}/{loom.id}"})

    async def _create(self, loom: Loom, nodes: list[LoomNode]) -> LoomTree:
        try:
            return await self._storage.looms.create(
                loom,
                nodes,
                max_per_key=self.settings.looms_per_key,
                max_nodes=self.settings.loom_max_nodes,
            )
        except LoomLimitReached as error:
            if error.limit == "nodes":
                raise LoomNodeLimit(f"A Loom holds at most {error.value} Nodes.") from None
            raise LoomCapacity(
                f"This API key has {error.value} Looms, the most it may have; delete some."
            ) from None

    async def list(self, principal: Principal, limit: int, after: str | None) -> dict[str, Any]:
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidRequest(f"'limit' must be 1 to {LIST_LIMIT_MAX}.", param="limit")
        before = None
        if after is not None:
            cursor = await self._storage.looms.get(after, principal.key_id)
            if cursor is None:
                message = f"'after' names no Loom of this key: {after!r}."
                raise InvalidRequest(message, param="after")
            before = (cursor.created_at, cursor.id)
        found = await self._storage.looms.list(principal.key_id, limit=limit + 1, before=before)
        page = found[:limit]
        return {
            "object": "list",
            "data": [loom_summary(loom) for loom in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(found) > limit,
        }

    async def tree(self, loom_id: str, principal: Principal) -> LoomTree:
        tree = await self._storage.looms.tree(loom_id, principal.key_id)
        if tree is None:
            raise LoomNotFound(f"No Loom {loom_id!r} for this API key.", param="loom_id")
        return tree

    async def read(self, loom_id: str, principal: Principal) -> dict[str, Any]:
        return loom_view(await self.tree(loom_id, principal))

    async def retitle(self, loom_id: str, raw: bytes, principal: Principal) -> dict[str, Any]:
        body = parse_body(LoomPatchBody, json_of(raw))

        def plan(tree: LoomTree) -> tuple[TreeChange, None]:
            return TreeChange(title=body.title, retitle=True), None

        tree, _ = await self.change_tree(loom_id, principal, plan)
        return loom_view(tree)

    async def delete(self, loom_id: str, principal: Principal) -> dict[str, Any]:
        if not await self._storage.looms.delete(loom_id, principal.key_id):
            raise LoomNotFound(f"No Loom {loom_id!r} for this API key.", param="loom_id")
        return {"id": loom_id, "object": "loom.deleted", "deleted": True}

    async def change_tree(
        self, loom_id: str, principal: Principal, plan: Any
    ) -> tuple[LoomTree, Any]:
        """Writes one planned change of the caller's Loom (404 if it has no such Loom)."""
        max_nodes = self.settings.loom_max_nodes
        try:
            changed = await self._storage.looms.change(
                loom_id, principal.key_id, self.clock(), plan, max_nodes=max_nodes
            )
        except LoomLimitReached as error:
            raise LoomNodeLimit(
                f"A Loom holds at most {error.value} Nodes; delete some to add more."
            ) from None
        if changed is None:
            raise LoomNotFound(f"No Loom {loom_id!r} for this API key.", param="loom_id")
        return changed

    async def _node_operation(
        self, loom_id: str, principal: Principal, plan: operations.NodePlan
    ) -> dict[str, Any]:
        tree, nodes = await self.change_tree(loom_id, principal, plan)
        live = {n.id for n in tree.nodes}
        return {"object": "list", "data": nodes_view(tree, [n for n in nodes if n.id in live])}

    async def edit(self, loom_id: str, node_id: str, raw: bytes, principal: Principal):
        body = parse_body(NodePatchBody, json_of(raw))
        if body.text is not None:
            self._check_text(body.text, "text")
        wanted = operations.NodeEdit(text=body.text, bookmarked=body.bookmarked)
        return await self._node_operation(
            loom_id, principal, operations.edit(node_id, wanted, self.clock())
        )

    async def split(self, loom_id: str, node_id: str, raw: bytes, principal: Principal):
        body = parse_body(NodeSplitBody, json_of(raw))
        if body.text is not None:
            self._check_text(body.text, "text")
        plan = operations.split(node_id, body.offset, self.clock(), body.text)
        return await self._node_operation(loom_id, principal, plan)

    async def add_child(self, loom_id: str, node_id: str, raw: bytes, principal: Principal):
        body = parse_body(NodeTextBody, json_of(raw))
        self._check_text(body.text, "text")
        plan = operations.add_child(node_id, body.text, self.clock())
        return await self._node_operation(loom_id, principal, plan)

    async def add_sibling(self, loom_id: str, node_id: str, raw: bytes, principal: Principal):
        body = parse_body(NodeTextBody, json_of(raw))
        self._check_text(body.text, "text")
        plan = operations.add_sibling(node_id, body.text, self.clock())
        return await self._node_operation(loom_id, principal, plan)

    async def delete_node(self, loom_id: str, node_id: str, principal: Principal):
        _, doomed = await self.change_tree(loom_id, principal, operations.delete_subtree(node_id))
        return {
            "id": node_id,
            "object": "loom.node.deleted",
            "deleted": [n.id for n in doomed],
        }

    async def read_node(self, loom_id: str, node_id: str, principal: Principal):
        tree = await self.tree(loom_id, principal)
        return nodes_view(tree, [node_of(tree, node_id)])[0]

    async def path_text(self, loom_id: str, node_id: str, principal: Principal) -> str:
        return path_text(await self.tree(loom_id, principal), node_id)

    async def export(self, loom_id: str, principal: Principal) -> dict[str, Any]:
        return export_document(await self.tree(loom_id, principal), self.clock())

    async def import_file(self, raw: bytes, principal: Principal) -> Answer:
        data = json_of(raw)
        now = self.clock()
        title = data.get("title") if isinstance(data, dict) else None
        loom = _new_loom(principal, title if isinstance(title, str) else None, now)
        nodes, _ = nodes_from_file(
            data,
            loom.id,
            now,
            max_nodes=self.settings.loom_max_nodes,
            max_text_chars=self.settings.loom_max_text_chars,
        )
        tree = await self._create(loom, nodes)
        return Answer(201, loom_view(tree), {"location": f"{LOOMS_PATH}/{loom.id}"})


def _new_loom(principal: Principal, title: str | None, now: datetime) -> Loom:
    return Loom(
        id=new_loom_id(),
        key_id=principal.key_id,
        account_id=principal.account_id,
        title=title[:200] if title else None,
        node_count=0,
        created_at=now,
        updated_at=now,
    )
