"""An import file (this API's export, or a socketteer/loom save file) as the Nodes of a new Loom.

Pure (API server process). Which format it is, is told by its shape; every Node gets a new id.
A file that cannot be imported raises `errors.LoomFileInvalid` naming the problem.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..errors import LoomFileInvalid
from ..storage.loom_records import LoomNode, new_node_id
from . import socketteer
from .export_file import is_export_document, nodes_from_export


def nodes_from_file(
    data: Any,
    loom_id: str,
    now: datetime,
    *,
    max_nodes: int,
    max_text_chars: int,
    max_tokens: int | None = None,
) -> tuple[list[LoomNode], str]:
    """The new Nodes, parents first, and the format read (`vllm-acs` or `socketteer`).
    `max_tokens` bounds the tokens of all the Nodes together (each Node's own list counts)."""
    if is_export_document(data):
        nodes = nodes_from_export(
            data,
            loom_id,
            now,
            max_nodes=max_nodes,
            max_text_chars=max_text_chars,
            max_tokens=max_tokens,
        )
        return nodes, "vllm-acs"
    if socketteer.is_socketteer_file(data):
        try:
            imported = socketteer.parse_socketteer(
                data, max_nodes=max_nodes, max_text_chars=max_text_chars, max_tokens=max_tokens
            )
        except socketteer.LoomFileInvalid as error:
            raise LoomFileInvalid(f"socketteer/loom file: {error}") from None
        return _from_socketteer(imported, loom_id, now), "socketteer"
    raise LoomFileInvalid(
        "The file is neither a vllm-acs Loom export (format 'vllm-acs.loom') nor a "
        "socketteer/loom save file (an object with a 'root' Node)."
    )


def _from_socketteer(
    imported: list[socketteer.ImportedNode], loom_id: str, now: datetime
) -> list[LoomNode]:
    new_ids: dict[str, str] = {}
    positions: dict[str | None, int] = {}
    # A completion's tokens that several Nodes share become one list of dicts, not one each.
    shared: dict[int, tuple[list[int] | None, list[dict[str, Any]]]] = {}
    nodes = []
    for item in imported:
        new_ids[item.key] = new_node_id()
        parent_id = new_ids.get(item.parent) if item.parent is not None else None
        position = positions.get(parent_id, 0)
        positions[parent_id] = position + 1
        extra: dict[str, Any] = {"source_id": item.key}
        if item.tags:
            extra["tags"] = list(item.tags)
        if item.unknown:
            extra["unknown"] = list(item.unknown)
        nodes.append(
            LoomNode(
                id=new_ids[item.key],
                loom_id=loom_id,
                parent_id=parent_id,
                position=position,
                origin="root" if parent_id is None else item.origin,
                status="ready",
                text=item.text,
                bookmarked=item.bookmarked,
                generation=dict(item.generation) if item.generation else None,
                **_token_fields(item.tokens, shared),
                extra=extra,
                created_at=now,
                updated_at=now,
            )
        )
    return nodes


def _token_fields(
    tokens: list[socketteer.ImportedToken] | None,
    shared: dict[int, tuple[list[int] | None, list[dict[str, Any]]]],
) -> dict[str, Any]:
    if tokens is None:
        return {"token_ids": None, "tokens": None}
    found = shared.get(id(tokens))
    if found is None:
        found = shared[id(tokens)] = (_ids(tokens), _tokens(tokens))
    return {"token_ids": found[0], "tokens": found[1]}


def _tokens(tokens: list[socketteer.ImportedToken]) -> list[dict[str, Any]]:
    return [
        {
            "text": t.text,
            "id": t.id,
            "logprob": t.logprob,
            "top_logprobs": [{"text": text, "logprob": lp} for text, lp in t.top_logprobs],
        }
        for t in tokens
    ]


def _ids(tokens: list[socketteer.ImportedToken] | None) -> list[int] | None:
    if not tokens or any(t.id is None for t in tokens):
        return None
    return [int(t.id) for t in tokens if t.id is not None]
