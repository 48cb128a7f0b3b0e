"""The Node operations of a Loom, as plans: each reads the tree (inside the write transaction,
`LoomRepository.change`) and returns the change to write and the Node(s) to answer with.

Pure (API server process). Edit, split, a hand-written child or sibling, bookmark, delete a
subtree. An operation the Node's status or place forbids raises `LoomNodeConflict` (409).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..errors import InvalidRequest, LoomNodeConflict
from ..storage.loom_records import LoomNode, LoomTree, TreeChange
from .tokens import split_token_data
from .tree import next_position, node_of, require_ready, subtree

NodePlan = Callable[[LoomTree], tuple[TreeChange, list[LoomNode]]]


@dataclass(frozen=True)
class NodeEdit:
    """A PATCH of one Node: new text (its token data is dropped), a bookmark, or both."""

    text: str | None = None
    bookmarked: bool | None = None


def edit(node_id: str, wanted: NodeEdit, now: datetime) -> NodePlan:
    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        node = node_of(tree, node_id)
        fields: dict[str, object] = {"updated_at": now}
        if wanted.text is not None and wanted.text != node.text:
            require_ready(node, "edited")
            # Logprobs line up only with the text the model produced: they go with the edit.
            fields.update(text=wanted.text, token_ids=None, tokens=None, score=None)
        if wanted.bookmarked is not None:
            fields["bookmarked"] = wanted.bookmarked
        changed = node.changed(**fields)
        return TreeChange(updates=[changed]), [changed]

    return plan


def split(node_id: str, offset: int, now: datetime, text: str | None = None) -> NodePlan:
    """The Node keeps the text before `offset` (in characters of `text`, its new text when
    given), a new child the rest; the Node's children move under the new child."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        node = node_of(tree, node_id)
        require_ready(node, "split")
        current = node
        if text is not None and text != node.text:
            current = node.changed(text=text, token_ids=None, tokens=None, score=None)
        if not 0 < offset < len(current.text):
            raise InvalidRequest(
                f"'offset' must fall inside the Node's text: 1 to {len(current.text) - 1} "
                f"for its {len(current.text)} characters, got {offset}.",
                param="offset",
            )
        before, after = split_token_data(current.text, current.token_ids, current.tokens, offset)
        kept = current.changed(
            text=current.text[:offset],
            token_ids=before.token_ids,
            tokens=before.tokens,
            score=None,
            updated_at=now,
        )
        tail = LoomNode(
            loom_id=node.loom_id,
            parent_id=node.id,
            position=0,
            origin="split",
            status="ready",
            text=current.text[offset:],
            token_ids=after.token_ids,
            tokens=after.tokens,
            generation=node.generation,
            created_at=now,
            updated_at=now,
        )
        moved = [c.changed(parent_id=tail.id, updated_at=now) for c in tree.children(node.id)]
        return TreeChange(inserts=[tail], updates=[kept, *moved]), [kept, tail]

    return plan


def add_child(parent_id: str, text: str, now: datetime) -> NodePlan:
    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        parent = node_of(tree, parent_id)
        require_ready(parent, "given a child")
        child = _human(tree, parent.id, next_position(tree, parent.id), text, now)
        return TreeChange(inserts=[child]), [child]

    return plan


def add_sibling(node_id: str, text: str, now: datetime) -> NodePlan:
    """A hand-written alternative placed right after the Node, under the same parent."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        node = node_of(tree, node_id)
        if node.parent_id is None:
            raise LoomNodeConflict(
                "The root has no siblings: to start from another prompt, make a new Loom."
            )
        later = [s for s in tree.children(node.parent_id) if s.position > node.position]
        shifted = [s.changed(position=s.position + 1, updated_at=now) for s in later]
        sibling = _human(tree, node.parent_id, node.position + 1, text, now)
        return TreeChange(inserts=[sibling], updates=shifted), [sibling]

    return plan


def delete_subtree(node_id: str) -> NodePlan:
    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        node = node_of(tree, node_id)
        if node.parent_id is None:
            raise LoomNodeConflict(
                "The root cannot be deleted: delete the Loom (DELETE /v1/looms/{id}) instead."
            )
        doomed = subtree(tree, node.id)
        busy = next((n for n in doomed if n.status == "generating"), None)
        if busy is not None:
            raise LoomNodeConflict(
                f"Node {busy.id!r} in this subtree is generating: it cannot be deleted until "
                "its branch ends."
            )
        return TreeChange(deletes=[n.id for n in doomed]), doomed

    return plan


def _human(tree: LoomTree, parent_id: str, position: int, text: str, now: datetime) -> LoomNode:
    return LoomNode(
        loom_id=tree.loom.id,
        parent_id=parent_id,
        position=position,
        origin="human",
        status="ready",
        text=text,
        created_at=now,
        updated_at=now,
    )
