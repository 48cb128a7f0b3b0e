"""Reading a Loom's tree: the path from the root to a Node, its text, a subtree, children in order.

Pure functions over a `LoomTree` (API server process): the routes, the operations and the branch
job read the tree the same way.
"""

from __future__ import annotations

from ..errors import LoomNodeConflict, LoomNodeNotFound, echoed
from ..storage.loom_records import LoomNode, LoomTree


def node_of(tree: LoomTree, node_id: str) -> LoomNode:
    node = tree.node(node_id)
    if node is None:
        raise LoomNodeNotFound(
            f"No Node {echoed(node_id)!r} in Loom {tree.loom.id!r}.", param="node_id"
        )
    return node


def path_to(tree: LoomTree, node_id: str) -> list[LoomNode]:
    """The Nodes from the root down to `node_id`, both included."""
    by_id = {n.id: n for n in tree.nodes}
    path: list[LoomNode] = []
    current: LoomNode | None = node_of(tree, node_id)
    while current is not None and len(path) <= len(by_id):
        path.append(current)
        current = by_id.get(current.parent_id) if current.parent_id else None
    return path[::-1]


def path_text(tree: LoomTree, node_id: str) -> str:
    """The text the model continues from `node_id`: every Node's text, root first."""
    return "".join(node.text for node in path_to(tree, node_id))


def children_ids(tree: LoomTree, node_id: str) -> list[str]:
    return [child.id for child in tree.children(node_id)]


def subtree(tree: LoomTree, node_id: str) -> list[LoomNode]:
    """`node_id` and every Node under it, parents first."""
    wanted = {node_id}
    found: list[LoomNode] = []
    for node in tree.nodes:  # parents before children: one pass collects the subtree
        if node.id in wanted or node.parent_id in wanted:
            wanted.add(node.id)
            found.append(node)
    return found


def next_position(tree: LoomTree, parent_id: str) -> int:
    return max((child.position for child in tree.children(parent_id)), default=-1) + 1


def require_ready(node: LoomNode, operation: str) -> None:
    """A Node still `generating` (or `failed`) cannot be edited, split or grown from."""
    if node.status != "ready":
        raise LoomNodeConflict(
            f"Node {node.id!r} is {node.status}: it cannot be {operation} until it is ready."
            + (" Its branch is still running." if node.status == "generating" else "")
        )
