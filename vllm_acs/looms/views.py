"""The JSON a client reads of a Loom and its Nodes (`shared/spec/DECISIONS.md`, "Looms").

Pure (API server process): the routes, the branch job (its answer) and the export share it.
A Node's `tokens` are shown when its branch asked for logprobs (the Node keeps the sampled
tokens either way, to split them at a token boundary), and for an imported Node when its file
had them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..storage.loom_records import Loom, LoomNode, LoomTree


def unix(moment: datetime) -> int:
    return int(moment.timestamp())


def tokens_shown(node: LoomNode) -> list[dict[str, Any]] | None:
    if node.tokens is None:
        return None
    generation = node.generation or {}
    if "branch_seed" not in generation:
        return node.tokens  # not from a branch here (an import): whatever the file had
    asked = (generation.get("parameters") or {}).get("logprobs") is not None
    return node.tokens if asked else None


def node_view(node: LoomNode, children: list[str]) -> dict[str, Any]:
    extra = node.extra or {}
    return {
        "id": node.id,
        "object": "loom.node",
        "parent_id": node.parent_id,
        "children": children,
        "text": node.text,
        "origin": node.origin,
        "status": node.status,
        "bookmarked": node.bookmarked,
        "generation": node.generation,
        "tokens": tokens_shown(node),
        "score": node.score,
        "error": node.error,
        "tags": extra.get("tags", []),
        "created_at": unix(node.created_at),
        "updated_at": unix(node.updated_at),
    }


def nodes_view(tree: LoomTree, nodes: list[LoomNode] | None = None) -> list[dict[str, Any]]:
    """The views of `nodes` (default: every Node of the tree), each with its children in order."""
    children: dict[str, list[str]] = {}
    for node in tree.nodes:  # in tree order: siblings by position
        if node.parent_id is not None:
            children.setdefault(node.parent_id, []).append(node.id)
    return [node_view(n, children.get(n.id, [])) for n in (tree.nodes if nodes is None else nodes)]


def loom_summary(loom: Loom) -> dict[str, Any]:
    return {
        "id": loom.id,
        "object": "loom",
        "title": loom.title,
        "node_count": loom.node_count,
        "created_at": unix(loom.created_at),
        "updated_at": unix(loom.updated_at),
    }


def loom_view(tree: LoomTree) -> dict[str, Any]:
    return {**loom_summary(tree.loom), "nodes": nodes_view(tree)}


def branch_view(tree: LoomTree, parent_id: str, nodes: list[LoomNode]) -> dict[str, Any]:
    """A branch's answer: the children it added (empty continuations are not added)."""
    return {
        "object": "loom.branch",
        "loom_id": tree.loom.id,
        "parent_id": parent_id,
        "nodes": nodes_view(tree, nodes),
    }
