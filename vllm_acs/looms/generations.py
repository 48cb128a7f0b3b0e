"""The plans of a branch's children: made `generating`, started again after a lost run, ended
`ready` (empty continuations removed) or `failed` with the error. Pure (API server process).

Each child records its generation: model, checkpoint, the parameters asked, its own seed (the
branch's seed + its index, which is how vLLM seeds the `n` samples of one request, so a child
can be regenerated alone), the prompt token ids it continued, finish_reason and created_at.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..storage.loom_records import LoomNode, LoomTree, TreeChange
from .completion_stream import CompletionStream
from .tree import next_position, node_of, require_ready


@dataclass(frozen=True)
class BranchSpec:
    job_id: str
    parent_id: str
    model: str
    checkpoint: str
    n: int
    seed: int
    parameters: dict[str, Any]


def of_job(tree: LoomTree, job_id: str) -> list[LoomNode]:
    return [node for node in tree.nodes if node.job_id == job_id]


def start_children(spec: BranchSpec, now: datetime):
    """The `n` children, `generating`; or, when a lost run made them already, those again
    (text emptied), so a re-run writes the same Nodes."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        existing = of_job(tree, spec.job_id)
        if existing:
            again = [
                n.changed(text="", status="generating", token_ids=None, tokens=None, error=None)
                for n in existing
            ]
            return TreeChange(updates=again), again
        parent = node_of(tree, spec.parent_id)
        require_ready(parent, "branched from")
        first = next_position(tree, parent.id)
        children = [
            LoomNode(
                loom_id=tree.loom.id,
                parent_id=parent.id,
                position=first + index,
                origin="model",
                status="generating",
                text="",
                generation=_generation(spec, index, now),
                job_id=spec.job_id,
                created_at=now,
                updated_at=now,
            )
            for index in range(spec.n)
        ]
        return TreeChange(inserts=children), children

    return plan


def finish_children(job_id: str, stream: CompletionStream, now: datetime):
    """Each child `ready` with its text and tokens; an empty continuation is removed."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        change = TreeChange()
        kept: list[LoomNode] = []
        for node in of_job(tree, job_id):
            index = int((node.generation or {}).get("index", 0))
            got = stream.choices[index] if index < len(stream.choices) else None
            if got is None or got.text == "":
                change.deletes.append(node.id)
                continue
            generation = {
                **(node.generation or {}),
                "finish_reason": got.finish_reason,
                "prompt_token_ids": stream.prompt_token_ids,
            }
            done = node.changed(
                text=got.text,
                status="ready",
                token_ids=got.token_ids or None,
                tokens=got.tokens or None,
                generation=generation,
                job_id=None,
                updated_at=now,
            )
            change.updates.append(done)
            kept.append(done)
        return change, kept

    return plan


def fail_children(job_id: str, error: dict[str, Any], stream: CompletionStream | None, now):
    """Each child `failed` with the error envelope, keeping what text it had."""

    def plan(tree: LoomTree) -> tuple[TreeChange, list[LoomNode]]:
        failed = []
        for node in of_job(tree, job_id):
            index = int((node.generation or {}).get("index", 0))
            text = stream.choices[index].text if stream and index < len(stream.choices) else ""
            failed.append(
                node.changed(status="failed", text=text, error=error, job_id=None, updated_at=now)
            )
        return TreeChange(updates=failed), failed

    return plan


def _generation(spec: BranchSpec, index: int, now: datetime) -> dict[str, Any]:
    return {
        "model": spec.model,
        "checkpoint": spec.checkpoint,
        "parameters": spec.parameters,
        "seed": spec.seed + index,
        "branch_seed": spec.seed,
        "index": index,
        "n": spec.n,
        "branch_id": spec.job_id,
        "finish_reason": None,
        "prompt_token_ids": None,
        "created_at": int(now.timestamp()),
    }
