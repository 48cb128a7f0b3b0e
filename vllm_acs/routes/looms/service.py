"""Looms and their Nodes, scoped to the caller's key: create, list, read, retitle, delete, the
Node operations, the path's text, export and import. API server process.

Every change of a tree is planned by a pure operation (`looms/operations.py`) and written in
one transaction (`LoomRepository.change`); another key's Loom is a 404, never a 403. A whole
Loom is read (and exported) in batches of Nodes encoded as they come, never as one tree of
objects; an import is parsed and converted in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from ...auth.principal import Principal
from ...contract.bounded_json import loads_bounded
from ...contract.completion_request import parse_body
from ...contract.loom_requests import (
    TITLE_MAX_CHARS,
    LoomCreateBody,
    LoomPatchBody,
    NodePatchBody,
    NodeSplitBody,
    NodeTextBody,
)
from ...errors import InvalidRequest, LoomNodeNotFound, LoomNotFound, echoed
from ...looms import operations
from ...looms.export_file import export_head, export_node
from ...looms.import_file import nodes_from_file
from ...looms.import_json import import_depth_limit, loads_import
from ...looms.limits import loom_limit_error
from ...looms.views import loom_summary, loom_view, node_view, nodes_view
from ...settings import Settings
from ...storage import Storage
from ...storage.errors import LoomLimitReached
from ...storage.loom_records import (
    Loom,
    LoomNode,
    LoomTree,
    NodePlace,
    TreeChange,
    new_loom_id,
)
from ..answers import Answer

LOOMS_PATH = "/v1/looms"
IMPORT_PATH = "/v1/looms/import"
LIST_LIMIT_MAX = 100
# Nodes read (and encoded) at once when a whole Loom is answered.
READ_BATCH_NODES = 256
# A whole read that saw the Loom change under it starts again, this many times at most.
_READ_TRIES = 3


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
                max_bytes=self.settings.loom_max_bytes,
                max_key_bytes=self.settings.loom_bytes_per_key,
            )
        except LoomLimitReached as error:
            raise loom_limit_error(error) from None

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
            raise LoomNotFound(f"No Loom {echoed(loom_id)!r} for this API key.", param="loom_id")
        return tree

    async def read(self, loom_id: str, principal: Principal) -> Answer:
        """The Loom with every Node (`loom_view`'s JSON), read and encoded in batches."""

        def head(loom: Loom) -> str:
            return json.dumps(loom_summary(loom), **_JSON)[:-1] + ',"nodes":['

        return await self._whole(loom_id, principal, head, node_view)

    async def _whole(
        self,
        loom_id: str,
        principal: Principal,
        head: Callable[[Loom], str],
        encode: Callable[[LoomNode, list[str]], dict[str, Any]],
    ) -> Answer:
        """A whole Loom's JSON: `head` (up to its Nodes' array), then each Node as `encode`
        makes it, read a batch at a time. The batches are separate reads; a read that saw the
        Loom change meanwhile starts again (the last try answers what it read)."""
        looms = self._storage.looms
        for attempt in range(_READ_TRIES):
            found = await looms.outline(loom_id, principal.key_id)
            if found is None:
                raise LoomNotFound(
                    f"No Loom {echoed(loom_id)!r} for this API key.", param="loom_id"
                )
            loom, places = found
            parts, children = [head(loom)], _children(places)
            written = False
            for batch in _batches([place.id for place in places], READ_BATCH_NODES):
                nodes = await looms.nodes(loom.id, batch)
                for node_id in batch:
                    if node_id in nodes:
                        view = encode(nodes[node_id], children.get(node_id, []))
                        parts.append(("," if written else "") + json.dumps(view, **_JSON))
                        written = True
            parts.append("]}")
            after = await looms.get(loom.id, principal.key_id)
            if after == loom or attempt == _READ_TRIES - 1:
                return Answer(200, "".join(parts), {})
        raise AssertionError("unreachable")

    async def retitle(self, loom_id: str, raw: bytes, principal: Principal) -> dict[str, Any]:
        body = parse_body(LoomPatchBody, json_of(raw))

        def plan(tree: LoomTree) -> tuple[TreeChange, None]:
            return TreeChange(title=body.title, retitle=True), None

        tree, _ = await self.change_tree(loom_id, principal, plan)
        return loom_view(tree)

    async def delete(self, loom_id: str, principal: Principal) -> dict[str, Any]:
        if not await self._storage.looms.delete(loom_id, principal.key_id):
            raise LoomNotFound(f"No Loom {echoed(loom_id)!r} for this API key.", param="loom_id")
        return {"id": loom_id, "object": "loom.deleted", "deleted": True}

    async def change_tree(
        self, loom_id: str, principal: Principal, plan: Any
    ) -> tuple[LoomTree, Any]:
        """Writes one planned change of the caller's Loom (404 if it has no such Loom)."""
        try:
            changed = await self._storage.looms.change(
                loom_id,
                principal.key_id,
                self.clock(),
                plan,
                max_nodes=self.settings.loom_max_nodes,
                max_bytes=self.settings.loom_max_bytes,
                max_key_bytes=self.settings.loom_bytes_per_key,
            )
        except LoomLimitReached as error:
            doing = "; delete some to add more" if error.limit == "nodes" else ""
            raise loom_limit_error(error, doing) from None
        if changed is None:
            raise LoomNotFound(f"No Loom {echoed(loom_id)!r} for this API key.", param="loom_id")
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

    async def _places(self, loom_id: str, principal: Principal) -> list[NodePlace]:
        found = await self._storage.looms.outline(loom_id, principal.key_id)
        if found is None:
            raise LoomNotFound(f"No Loom {echoed(loom_id)!r} for this API key.", param="loom_id")
        return found[1]

    async def _read_nodes(self, loom_id: str, node_ids: list[str]) -> list[LoomNode]:
        found = await self._storage.looms.nodes(loom_id, node_ids)
        missing = [node_id for node_id in node_ids if node_id not in found]
        if missing:
            message = f"No Node {echoed(missing[0])!r} in Loom {echoed(loom_id)!r}."
            raise LoomNodeNotFound(message, param="node_id")
        return [found[node_id] for node_id in node_ids]

    async def read_node(self, loom_id: str, node_id: str, principal: Principal):
        """One Node and its children's ids: the outline and that one row, not the tree."""
        places = await self._places(loom_id, principal)
        (node,) = await self._read_nodes(loom_id, [node_id])
        return node_view(node, _children(places).get(node_id, []))

    async def path_text(self, loom_id: str, node_id: str, principal: Principal) -> str:
        """The text of root..Node: the outline, then the rows of that path only."""
        parents = {place.id: place.parent_id for place in await self._places(loom_id, principal)}
        if node_id not in parents:
            message = f"No Node {echoed(node_id)!r} in Loom {echoed(loom_id)!r}."
            raise LoomNodeNotFound(message, param="node_id")
        path: list[str] = []
        current: str | None = node_id
        while current is not None and len(path) <= len(parents):
            path.append(current)
            current = parents.get(current)
        text = []
        for batch in _batches(path[::-1], READ_BATCH_NODES):
            text.extend(node.text for node in await self._read_nodes(loom_id, batch))
        return "".join(text)

    async def export(self, loom_id: str, principal: Principal) -> Answer:
        """The export document (`export_file`), read and encoded in batches like `read`."""
        now = self.clock()

        def head(loom: Loom) -> str:
            return json.dumps(export_head(loom, now), **_JSON)[:-1] + ',"nodes":['

        return await self._whole(loom_id, principal, head, export_node)

    async def import_file(self, raw: bytes, principal: Principal) -> Answer:
        """A new Loom from an export or a socketteer file. The parse and the conversion run in
        a worker thread: a large file never holds up the event loop (and /health)."""
        now = self.clock()
        loom, nodes = await asyncio.to_thread(self._imported, raw, principal, now)
        tree = await self._create(loom, nodes)
        return Answer(201, loom_view(tree), {"location": f"{LOOMS_PATH}/{loom.id}"})

    def _imported(
        self, raw: bytes, principal: Principal, now: datetime
    ) -> tuple[Loom, list[LoomNode]]:
        settings = self.settings
        data = loads_import(raw, max_depth=import_depth_limit(settings.loom_max_nodes))
        title = data.get("title") if isinstance(data, dict) else None
        if isinstance(title, str) and len(title) > TITLE_MAX_CHARS:
            raise InvalidRequest(
                f"'title' has {len(title)} characters; a Loom's title has at most "
                f"{TITLE_MAX_CHARS}.",
                param="title",
            )
        loom = _new_loom(principal, title if isinstance(title, str) else None, now)
        nodes, _ = nodes_from_file(
            data,
            loom.id,
            now,
            max_nodes=settings.loom_max_nodes,
            max_text_chars=settings.loom_max_text_chars,
            max_tokens=settings.loom_import_max_tokens,
        )
        return loom, nodes


# As JSONResponse encodes (the whole reads are encoded here, a batch at a time).
_JSON: dict[str, Any] = {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":")}


def _children(places: list[NodePlace]) -> dict[str, list[str]]:
    """Each Node's children's ids, in order (the places are in tree order)."""
    children: dict[str, list[str]] = {}
    for place in places:
        if place.parent_id is not None:
            children.setdefault(place.parent_id, []).append(place.id)
    return children


def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _new_loom(principal: Principal, title: str | None, now: datetime) -> Loom:
    return Loom(
        id=new_loom_id(),
        key_id=principal.key_id,
        account_id=principal.account_id,
        title=title or None,
        node_count=0,
        created_at=now,
        updated_at=now,
    )
