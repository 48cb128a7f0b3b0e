"""Teacher-forced scores of a path: the token ids each Node contributes, and the plan that stores
each Node's share of a `prompt_logprobs` answer on it. Pure (API server process).

A Node contributes its recorded token ids when it has them (a model's text, unedited) and its
text tokenized otherwise (the root with the model's special tokens, the others without), so a
hand-written or imported branch reads as a heatmap too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..storage.loom_records import LoomNode, LoomTree, TreeChange
from .tree import path_to

Tokenize = Callable[[str, bool], list[int]]


@dataclass(frozen=True)
class Span:
    node_id: str
    text: str
    token_ids: list[int]
    recorded: bool  # the Node's own ids, not a tokenization of its text


def path_token_ids(tree: LoomTree, node_id: str, tokenize: Tokenize) -> list[Span]:
    spans = []
    for node in path_to(tree, node_id):
        if node.token_ids:
            spans.append(Span(node.id, node.text, list(node.token_ids), True))
        else:
            ids = tokenize(node.text, node.parent_id is None)
            spans.append(Span(node.id, node.text, ids, False))
    return spans


def _entry(token_id: int, position: Any) -> dict[str, Any]:
    """One token's score from one `prompt_logprobs` position (None for the first token)."""
    if not isinstance(position, dict):
        return {"id": token_id, "text": None, "logprob": None, "rank": None, "top_logprobs": []}
    own = position.get(str(token_id)) or position.get(token_id) or {}
    others = [
        {"id": int(key), "text": value.get("decoded_token"), "logprob": value.get("logprob")}
        for key, value in position.items()
        if str(key) != str(token_id) and isinstance(value, dict)
    ]
    others.sort(key=lambda item: -(item["logprob"] or float("-inf")))
    return {
        "id": token_id,
        "text": own.get("decoded_token"),
        "logprob": own.get("logprob"),
        "rank": own.get("rank"),
        "top_logprobs": others,
    }


def score_plan(
    spans: list[Span], prompt_logprobs: list[Any], model: str, checkpoint: str, now: datetime
):
    """Stores on each Node of the path the scores of its tokens (a Node edited meanwhile is
    left as it is: its tokens are not the ones scored)."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        change = TreeChange()
        start = 0
        for span in spans:
            end = start + len(span.token_ids)
            entries = [
                _entry(token, prompt_logprobs[k] if k < len(prompt_logprobs) else None)
                for k, token in zip(range(start, end), span.token_ids, strict=True)
            ]
            start = end
            node = tree.node(span.node_id)
            if node is None or node.text != span.text:
                continue
            score = {
                "model": model,
                "checkpoint": checkpoint,
                "tokens": entries,
                "from_recorded_ids": span.recorded,
                "created_at": int(now.timestamp()),
            }
            change.updates.append(node.changed(score=score, updated_at=now))
        return change, list(change.updates)

    return plan
