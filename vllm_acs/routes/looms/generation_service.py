"""What a Loom asks of the model: branches, replays and scores. API server process.

A branch is validated like a completion of the path's text, takes a start of the key, and runs
as a job this process runs at once (`LoomBranchKind`), which the route listens to: a closed
connection does not stop it. A replay regenerates a model Node from what it recorded; a score
reads the teacher-forced logprob of every token of the path (`prompt_logprobs`). Both go through
the node's own completions pipeline as the caller (budgets, usage, limits), refused, not clamped.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ...auth.principal import Principal
from ...auth.refusals import refusal
from ...contract.body_validation import validate_body
from ...contract.completion_request import SEED_MAX, parse_body
from ...contract.loom_requests import BRANCH_FIELDS, LoomBranchBody, NodeScoreBody
from ...errors import AcsError, LoomNodeConflict, LoomNodeLimit, UnknownModel
from ...jobs.completion import principal_to_json
from ...jobs.replay import ASGIApp, ReplayAnswer, replay_completion
from ...jobs.runner import JobRunner
from ...looms.branch import KIND
from ...looms.generations import BranchSpec
from ...looms.progress import BranchProgress, Event
from ...looms.scores import path_token_ids, score_plan
from ...looms.tree import node_of, path_text, require_ready
from ...served_model import NodeModels
from ...settings import Settings
from ...storage import Storage
from ...storage.errors import StartsExhausted
from ...storage.idempotency import IdempotencyTarget
from ...storage.jobs import NewJob, new_job_id
from ..answers import Answer
from .service import LoomService, json_of

# The parameters a Node records of its generation (with `max_tokens` as admitted); its model,
# n and seed are recorded beside them.
RECORDED = tuple(f for f in BRANCH_FIELDS if f not in ("model", "n", "seed", "stream"))
_RETRY_HEADERS = (b"retry-after", b"retry-after-ms", b"x-should-retry")


@dataclass
class BranchListening:
    """A branch that runs: the route reads its events until one ends it."""

    job_id: str
    events: asyncio.Queue[Event]
    stream: bool
    progress: BranchProgress

    def close(self) -> None:
        self.progress.unsubscribe(self.job_id, self.events)


class GenerationService:
    def __init__(
        self,
        looms: LoomService,
        models: NodeModels,
        settings: Settings,
        clock: Callable[[], datetime],
    ) -> None:
        self.looms = looms
        self.models = models
        self.settings = settings
        self.clock = clock
        self.progress = BranchProgress()
        self.storage: Storage | None = None
        self.runner: JobRunner | None = None
        self.app: ASGIApp | None = None

    def bind(self, storage: Storage, runner: JobRunner, app: ASGIApp) -> None:
        self.storage, self.runner, self.app = storage, runner, app

    def _bound(self) -> tuple[Storage, JobRunner, ASGIApp]:
        if self.storage is None or self.runner is None or self.app is None:
            raise RuntimeError("vllm_acs looms: storage is not open (init_state did not run)")
        return self.storage, self.runner, self.app

    async def _take_start(self, principal: Principal) -> None:
        storage, _, _ = self._bound()
        try:
            await storage.counters.take_start(principal)
        except StartsExhausted as error:
            raise refusal(error) from None

    async def branch(
        self,
        loom_id: str,
        node_id: str,
        raw: bytes,
        principal: Principal,
        idempotency: IdempotencyTarget | None,
        request_id: str | None,
        workload: str | None,
    ) -> BranchListening:
        storage, runner, _ = self._bound()
        asked = parse_body(LoomBranchBody, json_of(raw)).model_dump(exclude_unset=True)
        stream = bool(asked.pop("stream", False))
        tree = await self.looms.tree(loom_id, principal)
        require_ready(node_of(tree, node_id), "branched from")
        n = int(asked.get("n", 1))
        if tree.loom.node_count + n > self.settings.loom_max_nodes:
            raise LoomNodeLimit(
                f"A Loom holds at most {self.settings.loom_max_nodes} Nodes; this one has "
                f"{tree.loom.node_count} and the branch asks for {n}."
            )
        seed = asked.get("seed")
        if seed is None:
            seed = secrets.randbelow(SEED_MAX - 16)  # drawn, and recorded on every child
        body = {
            **asked,
            "prompt": path_text(tree, node_id),
            "seed": seed,
            "stream": True,
            # The sampled tokens are always kept (a split cuts them at a token boundary).
            "logprobs": asked.get("logprobs", 0),
        }
        _, validated = await validate_body(
            json.dumps(body).encode(), self.models, self.settings, request_id
        )
        await self._take_start(principal)
        parameters = {name: asked.get(name) for name in RECORDED}
        parameters["max_tokens"] = validated.max_tokens
        job_id = new_job_id()
        spec = BranchSpec(
            job_id=job_id,
            parent_id=node_id,
            model=validated.model.id,
            checkpoint=validated.model.checkpoint,
            n=n,
            seed=seed,
            parameters=parameters,
        )
        job = NewJob(
            kind=KIND,
            key_id=principal.key_id,
            account_id=principal.account_id,
            model=validated.model.id,
            request={
                "spec": asdict(spec),
                "loom_id": loom_id,
                "body": {**body, "max_tokens": validated.max_tokens},
                "principal": principal_to_json(principal),
                "workload": workload,
                "idempotency": None
                if idempotency is None
                else [idempotency.key_id, idempotency.idempotency_key],
            },
            max_attempts=self.settings.job_max_attempts,
            id=job_id,
        )
        events = self.progress.subscribe(job_id)
        try:
            submitted = await storage.jobs.submit(
                job, self.clock(), claimed_by=(runner.owner, runner.lease_s)
            )
        except BaseException:
            self.progress.unsubscribe(job_id, events)
            raise
        runner.adopt(submitted)
        return BranchListening(job_id, events, stream, self.progress)

    async def replay(self, loom_id: str, node_id: str, principal: Principal) -> dict[str, Any]:
        tree = await self.looms.tree(loom_id, principal)
        node = node_of(tree, node_id)
        generation = node.generation or {}
        if node.origin != "model" or not generation.get("prompt_token_ids"):
            raise LoomNodeConflict(
                f"Node {node_id!r} (origin {node.origin}, status {node.status}) records no "
                "generation to replay: only a model's Node that finished has one."
            )
        recorded = generation.get("parameters") or {}
        parameters = {k: v for k, v in recorded.items() if v is not None}
        parameters.pop("logprobs", None)
        body = {
            **parameters,
            "model": generation.get("model"),
            "prompt": generation["prompt_token_ids"],
            "n": 1,
            "seed": generation.get("seed"),
        }
        answer = await self._complete(body, principal, {"return_token_ids": True})
        choice = answer.json()["choices"][0]
        return {
            "object": "loom.replay",
            "node_id": node.id,
            "identical": choice["text"] == node.text,
            "text": choice["text"],
            "token_ids": choice.get("token_ids"),
            "finish_reason": choice.get("finish_reason"),
            "seed": generation.get("seed"),
        }

    async def score(
        self, loom_id: str, node_id: str, raw: bytes, principal: Principal
    ) -> dict[str, Any]:
        asked = parse_body(NodeScoreBody, json_of(raw))
        tree = await self.looms.tree(loom_id, principal)
        model = self.models.get(asked.model) if asked.model else self.models.default()
        if model is None:  # another node's model is forwarded there before it gets here
            raise UnknownModel(
                f"The model '{asked.model}' is not served: use a short id from GET /v1/models.",
                param="model",
            )
        spans = path_token_ids(tree, node_id, self.models.tokenizer(model.id))
        ids = [token for span in spans for token in span.token_ids]
        body = {
            "model": model.id,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": asked.logprobs,
        }
        answer = await self._complete(body, principal)
        prompt_logprobs = answer.json()["choices"][0].get("prompt_logprobs") or []
        plan = score_plan(spans, prompt_logprobs, model.id, model.checkpoint, self.clock())
        _, scored = await self.looms.change_tree(loom_id, principal, plan)
        return {
            "object": "loom.score",
            "node_id": node_id,
            "model": model.id,
            "prompt_token_ids": ids,
            "nodes": [{"node_id": n.id, **(n.score or {})} for n in scored],
        }

    async def _complete(
        self, body: dict[str, Any], principal: Principal, vllm_fields: dict[str, Any] | None = None
    ) -> ReplayAnswer:
        """A non-streamed completion through the node's own pipeline; its error is raised."""
        _, _, app = self._bound()
        await validate_body(json.dumps(body).encode(), self.models, self.settings, None)
        await self._take_start(principal)
        answer = await replay_completion(
            app, body, principal, new_job_id(), asyncio.Event(), vllm_fields=vllm_fields
        )
        if answer.status != 200:
            raise PipelineRefusal(answer)
        return answer


class PipelineRefusal(AcsError):
    """The completions pipeline's own error answer, passed on as it was (status and body)."""

    def __init__(self, answer: ReplayAnswer) -> None:
        super().__init__("the completions pipeline refused the request")
        self.status = answer.status  # type: ignore[misc]
        self.body = answer.body
        self.headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in answer.headers
            if k.lower() in _RETRY_HEADERS
        }
        self.code = answer.code or "upstream_error"  # type: ignore[misc]


def refusal_answer(event: Event) -> Answer:
    """A branch's `refused` event as the answer it was."""
    headers = {k: v for k, v in (event.get("headers") or {}).items()}
    return Answer(int(event["status"]), str(event["body"]), headers)
