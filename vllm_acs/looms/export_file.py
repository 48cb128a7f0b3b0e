"""A Loom as a versioned JSON document, and that document read back into new Nodes.

Pure (API server process). The export holds the topology (each Node's parent, siblings in
order), text, token ids and per-token logprobs, each generation's parameters and seed, scores,
bookmarks and tags. Importing it makes the same tree with new ids; a malformed, cyclic or
over-limit document raises `LoomFileInvalid` naming the problem, before anything is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..errors import LoomFileInvalid
from ..storage.loom_records import ORIGINS, Loom, LoomNode, LoomTree, new_node_id
from .views import unix

FORMAT = "vllm-acs.loom"
VERSION = 1
_OPTIONAL_OBJECTS = ("generation", "score", "error")


def export_document(tree: LoomTree, now: datetime) -> dict[str, Any]:
    """Nodes in tree order (parents first, siblings in order), each with its children's ids.
    (The route writes the same document a batch of Nodes at a time: `export_head`,
    `export_node`.)"""
    children: dict[str, list[str]] = {}
    for node in tree.nodes:
        if node.parent_id is not None:
            children.setdefault(node.parent_id, []).append(node.id)
    nodes = [export_node(node, children.get(node.id, [])) for node in tree.nodes]
    return {**export_head(tree.loom, now), "nodes": nodes}


def export_head(loom: Loom, now: datetime) -> dict[str, Any]:
    """The document without its `nodes` (which come last)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": loom.title,
        "exported_at": unix(now),
        "source_loom_id": loom.id,
    }


def export_node(node: LoomNode, children: list[str]) -> dict[str, Any]:
    return {
        "id": node.id,
        "parent_id": node.parent_id,
        "children": children,
        "text": node.text,
        "origin": node.origin,
        "status": node.status,
        "bookmarked": node.bookmarked,
        "generation": node.generation,
        "token_ids": node.token_ids,
        "tokens": node.tokens,
        "score": node.score,
        "error": node.error,
        "tags": (node.extra or {}).get("tags", []),
    }


def is_export_document(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def nodes_from_export(
    data: dict[str, Any],
    loom_id: str,
    now: datetime,
    *,
    max_nodes: int,
    max_text_chars: int,
    max_tokens: int | None = None,
) -> list[LoomNode]:
    """New Nodes (new ids) for the document's tree, parents before children. Siblings keep
    the order of the list (an export lists them in order; `children` is not needed to read it)."""
    if data.get("version") != VERSION:
        raise LoomFileInvalid(
            f"This is a {FORMAT} document of version {data.get('version')!r}; this server "
            f"reads version {VERSION}."
        )
    items = data.get("nodes")
    if not isinstance(items, list) or not items:
        raise LoomFileInvalid("'nodes' must be a non-empty list of Nodes.", param="nodes")
    if len(items) > max_nodes:
        raise LoomFileInvalid(
            f"The file has {len(items)} Nodes; a Loom holds at most {max_nodes}.", param="nodes"
        )
    new_ids: dict[str, str] = {}
    positions: dict[str, int] = {}
    nodes: list[LoomNode] = []
    total_tokens = 0
    for index, item in enumerate(items):
        where = f"nodes[{index}]"
        node = _node(item, where, max_text_chars)
        total_tokens += max(len(node.tokens or ()), len(node.token_ids or ()))
        if max_tokens is not None and total_tokens > max_tokens:
            raise LoomFileInvalid(
                f"The Nodes hold more than {max_tokens} tokens in all (the limit); {where} "
                "passes it.",
                param="nodes",
            )
        old_id, parent = item["id"], item.get("parent_id")
        if old_id in new_ids:
            raise LoomFileInvalid(f"{where}: the id {old_id!r} is used twice.", param="nodes")
        if index == 0 and parent is not None:
            raise LoomFileInvalid("nodes[0] must be the root (parent_id null).", param="nodes")
        if index > 0 and parent not in new_ids:
            raise LoomFileInvalid(
                f"{where}: its parent {parent!r} is not an earlier Node (a dangling or cyclic "
                "reference, or a second root).",
                param="nodes",
            )
        new_ids[old_id] = new_node_id()
        parent_id = new_ids[parent] if parent is not None else None
        position = positions.get(str(parent_id), 0)
        positions[str(parent_id)] = position + 1
        nodes.append(
            node.changed(
                id=new_ids[old_id],
                loom_id=loom_id,
                parent_id=parent_id,
                position=position,
                created_at=now,
                updated_at=now,
            )
        )
    return nodes


def _node(item: Any, where: str, max_text_chars: int) -> LoomNode:
    if not isinstance(item, dict):
        raise LoomFileInvalid(f"{where} must be an object.", param="nodes")
    if not isinstance(item.get("id"), str) or not item["id"]:
        raise LoomFileInvalid(f"{where}.id must be a non-empty string.", param="nodes")
    parent = item.get("parent_id")
    if parent is not None and not isinstance(parent, str):
        raise LoomFileInvalid(f"{where}.parent_id must be a string or null.", param="nodes")
    text = item.get("text")
    if not isinstance(text, str):
        raise LoomFileInvalid(f"{where}.text must be a string.", param="nodes")
    if len(text) > max_text_chars:
        raise LoomFileInvalid(
            f"{where}.text has {len(text)} characters; a Node holds at most {max_text_chars}.",
            param="nodes",
        )
    origin = item.get("origin", "import")
    if origin not in ORIGINS:
        raise LoomFileInvalid(f"{where}.origin must be one of {', '.join(ORIGINS)}.")
    if (origin == "root") != (parent is None):
        raise LoomFileInvalid(f"{where}: only the root has origin 'root' and no parent.")
    for name in _OPTIONAL_OBJECTS:
        if item.get(name) is not None and not isinstance(item[name], dict):
            raise LoomFileInvalid(f"{where}.{name} must be an object or null.", param="nodes")
    token_ids = item.get("token_ids")
    if token_ids is not None and not (
        isinstance(token_ids, list) and all(_is_id(t) for t in token_ids)
    ):
        raise LoomFileInvalid(f"{where}.token_ids must be a list of token ids.", param="nodes")
    tokens = item.get("tokens")
    if tokens is not None and not (
        isinstance(tokens, list) and all(isinstance(t, dict) for t in tokens)
    ):
        raise LoomFileInvalid(f"{where}.tokens must be a list of objects.", param="nodes")
    tags = item.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise LoomFileInvalid(f"{where}.tags must be a list of strings.", param="nodes")
    status = item.get("status", "ready")
    error = item.get("error")
    if status == "generating":  # exported mid-branch: that branch does not run here
        status = "failed"
        error = error or {"error": {"message": "Exported while generating.", "code": "import"}}
    if status not in ("ready", "failed"):
        raise LoomFileInvalid(f"{where}.status must be ready, failed or generating.")
    return LoomNode(
        loom_id="",
        parent_id=None,
        position=0,
        origin=origin,
        status=status,
        text=text,
        bookmarked=bool(item.get("bookmarked", False)),
        generation=item.get("generation"),
        token_ids=token_ids,
        tokens=tokens,
        score=item.get("score"),
        error=error,
        extra={"tags": tags} if tags else None,
        created_at=datetime.min,
        updated_at=datetime.min,
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
