"""The records of Looms: a Loom, its Nodes, a tree read at once, a change to write at once, and
their mapping to rows of `looms` / `loom_nodes`. API server process (routes, the branch job).
"""

from __future__ import annotations

import json
import secrets
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from .transactions import utc_or_none

ORIGINS = ("root", "model", "human", "split", "import")
STATUSES = ("generating", "ready", "failed")
_JSON_COLUMNS = ("generation", "token_ids", "tokens", "score", "error", "extra")


def new_loom_id() -> str:
    return "loom_" + secrets.token_hex(12)


def new_node_id() -> str:
    return "node_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Loom:
    id: str
    key_id: str
    account_id: str
    title: str | None
    node_count: int
    created_at: datetime
    updated_at: datetime
    byte_count: int = 0  # what its Nodes take (`node_bytes` summed): the byte quotas


@dataclass(frozen=True)
class LoomNode:
    """One Node. `token_ids` are the ids of its own text when known (a model's output, unedited);
    `tokens` the per-token logprobs when a branch asked for them."""

    loom_id: str
    parent_id: str | None
    position: int
    origin: str
    status: str
    text: str
    created_at: datetime
    updated_at: datetime
    id: str = field(default_factory=new_node_id)
    bookmarked: bool = False
    generation: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    tokens: list[dict[str, Any]] | None = None
    score: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # What an import kept that has no field of its own (tags, notes of what was unknown).
    extra: dict[str, Any] | None = None
    job_id: str | None = None

    def changed(self, **fields: Any) -> LoomNode:
        return replace(self, **fields)


@dataclass(frozen=True)
class LoomTree:
    """A Loom and all its Nodes, in the order parents before children, siblings by position."""

    loom: Loom
    nodes: list[LoomNode]

    def node(self, node_id: str) -> LoomNode | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def children(self, node_id: str) -> list[LoomNode]:
        return [n for n in self.nodes if n.parent_id == node_id]

    @property
    def root(self) -> LoomNode:
        return next(n for n in self.nodes if n.parent_id is None)


@dataclass
class TreeChange:
    """What one operation writes, in one transaction: new Nodes, Nodes replaced whole, Nodes
    deleted, and the Loom's new title when it changes."""

    inserts: list[LoomNode] = field(default_factory=list)
    updates: list[LoomNode] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    title: str | None = None
    retitle: bool = False


def loom_from_row(row: Any) -> Loom:
    return Loom(
        id=row.id,
        key_id=row.key_id,
        account_id=row.account_id,
        title=row.title,
        node_count=int(row.node_count),
        created_at=utc_or_none(row.created_at),  # type: ignore[arg-type]
        updated_at=utc_or_none(row.updated_at),  # type: ignore[arg-type]
        byte_count=int(row.byte_count),
    )


def node_from_row(row: Any) -> LoomNode:
    loaded = {name: _loads(getattr(row, name)) for name in _JSON_COLUMNS}
    return LoomNode(
        id=row.id,
        loom_id=row.loom_id,
        parent_id=row.parent_id,
        position=int(row.position),
        origin=row.origin,
        status=row.status,
        text=row.text,
        bookmarked=bool(row.bookmarked),
        job_id=row.job_id,
        created_at=utc_or_none(row.created_at),  # type: ignore[arg-type]
        updated_at=utc_or_none(row.updated_at),  # type: ignore[arg-type]
        **loaded,
    )


def node_values(node: LoomNode) -> dict[str, Any]:
    values = {
        "id": node.id,
        "loom_id": node.loom_id,
        "parent_id": node.parent_id,
        "position": node.position,
        "origin": node.origin,
        "status": node.status,
        "text": node.text,
        "bookmarked": node.bookmarked,
        "job_id": node.job_id,
        "created_at": node.created_at,
        "updated_at": node.updated_at,
    }
    values.update({name: _dumps(getattr(node, name)) for name in _JSON_COLUMNS})
    return values


def node_bytes(node: LoomNode) -> int:
    """What a Node takes in the database: the UTF-8 bytes of its text and of its JSON columns
    (json.dumps writes ASCII, so their length is their size). Migration 0008 measures the same."""
    size = len(node.text.encode("utf-8", "surrogatepass"))
    for name in _JSON_COLUMNS:
        dumped = _dumps(getattr(node, name))
        size += 0 if dumped is None else len(dumped)
    return size


def row_bytes(values: dict[str, Any]) -> int:
    """`node_bytes` of a Node's row (`node_values`), without encoding its JSON again."""
    size = len(values["text"].encode("utf-8", "surrogatepass"))
    return size + sum(len(values[name]) for name in _JSON_COLUMNS if values[name] is not None)


@dataclass(frozen=True)
class NodePlace:
    """Where a Node sits, without what it holds: a tree's outline."""

    id: str
    parent_id: str | None
    position: int
    created_at: datetime


def places_in_tree_order(places: list[NodePlace]) -> list[NodePlace]:
    """`in_tree_order` for an outline."""
    return in_tree_order(places)  # type: ignore[arg-type, return-value]


def in_tree_order(nodes: list[LoomNode]) -> list[LoomNode]:
    """Parents before children, siblings by position: a breadth-first walk from the root.
    Nodes whose parent is missing (none should be) come last, so nothing is dropped."""
    by_parent: dict[str | None, list[LoomNode]] = {}
    for node in nodes:
        by_parent.setdefault(node.parent_id, []).append(node)
    for siblings in by_parent.values():
        siblings.sort(key=lambda n: (n.position, n.created_at, n.id))
    ordered: list[LoomNode] = []
    queue = deque(by_parent.get(None, []))
    while queue:
        node = queue.popleft()
        ordered.append(node)
        queue.extend(by_parent.get(node.id, []))
    seen = {n.id for n in ordered}
    ordered.extend(n for n in nodes if n.id not in seen)
    return ordered


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))
