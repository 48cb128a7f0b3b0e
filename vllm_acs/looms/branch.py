"""The Loom branch job kind: `n` continuations of a path, generated as one live completion.

API server process. A branch runs as a job (a closed connection does not stop it; a dead
process's branch is run again by another): the stored completions body (`stream: true`, the
path's text as the prompt, `n`, the branch's seed) is replayed through the node's own pipeline
(`jobs/replay.py`), so validation, admission, budgets (refused, never clamped), usage and
settle are a live request's. The children are made `generating` only once the pipeline has
admitted the request: a branch refused (`429 budget_exceeded`, a 400) makes no Node. Text is
published as it streams (`progress.py`); at the end the children are `ready` (empty ones
removed) or `failed` with the error, and the branch's answer is stored for its Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from ..auth.principal import Principal
from ..errors import AcsError, InternalError, LoomNodeLimit, error_body
from ..jobs.completion import QUEUE_FULL_RETRY_S, principal_from_json
from ..jobs.kinds import HandBack, JobOutcome, Stopped
from ..jobs.replay import ASGIApp, replay_completion
from ..settings import Settings
from ..states import JobStatus
from ..storage.errors import LoomLimitReached
from ..storage.idempotency import IdempotencyRecords, IdempotencyTarget, StoredAnswer
from ..storage.jobs import Job
from ..storage.looms import LoomRepository
from .completion_stream import CompletionStream
from .generations import BranchSpec, fail_children, finish_children, start_children
from .limits import loom_limit_error
from .progress import BranchProgress
from .views import branch_view, nodes_view

logger = logging.getLogger(__name__)
KIND = "loom_branch"
# A running branch renews its Idempotency-Key's `running` record this often.
IDEMPOTENCY_RENEW_S = 30.0
IDEMPOTENCY_LEASE_S = 120.0
# Headers of a refusal that a client needs to retry it right.
_RETRY_HEADERS = (b"retry-after", b"retry-after-ms", b"x-should-retry")


def idempotency_target(request: dict[str, Any]) -> IdempotencyTarget | None:
    stored = request.get("idempotency")
    return None if not stored else IdempotencyTarget(stored[0], stored[1])


class LoomBranchKind:
    name = KIND

    def __init__(
        self,
        app: ASGIApp,
        looms: LoomRepository,
        idempotency: IdempotencyRecords,
        progress: BranchProgress,
        settings: Settings,
        current_principal: Callable[[Principal], Awaitable[Principal]],
        clock: Callable[[], datetime],
    ) -> None:
        self.app = app
        self.looms = looms
        self.idempotency = idempotency
        self.progress = progress
        self.settings = settings
        self.current_principal = current_principal
        self.clock = clock

    async def run(self, job: Job, stop: asyncio.Event) -> JobOutcome | HandBack | Stopped:
        run = _BranchRun(self, job, stop)
        try:
            return await run.run()
        except Exception:
            await run.fail_unexpectedly()
            raise
        finally:
            self.progress.publish(job.id, {"type": "stopped"})  # after an end: ignored


class _BranchRun:
    """One run of one branch job: its stream, its children, its answer."""

    def __init__(self, kind: LoomBranchKind, job: Job, stop: asyncio.Event) -> None:
        self.kind = kind
        self.job = job
        self.stop = stop
        self.request: dict[str, Any] = job.request or {}
        self.spec = BranchSpec(**self.request["spec"])
        self.stream = CompletionStream(self.spec.n)
        self.children: list[Any] = []
        self.refusal: AcsError | None = None
        self._renewed = asyncio.get_running_loop().time()

    @property
    def loom_id(self) -> str:
        return str(self.request["loom_id"])

    async def run(self) -> JobOutcome | HandBack | Stopped:
        kind = self.kind
        try:
            principal = await kind.current_principal(principal_from_json(self.request["principal"]))
        except AcsError as error:
            return await self._refused(
                error.status, json.dumps(error_body(error, self.job.id)), error.headers
            )
        answer = await replay_completion(
            kind.app,
            self.request["body"],
            principal,
            self.job.id,
            self.stop,
            workload=self.request.get("workload"),
            vllm_fields={"return_token_ids": True},
            on_start=self._started,
            on_body=self._grew,
        )
        if self.refusal is not None:
            error = self.refusal
            return await self._refused(
                error.status, json.dumps(error_body(error, self.job.id)), error.headers
            )
        if self.stop.is_set():
            return Stopped()
        if answer.status != 200:
            if answer.code == "queue_full" and self.children:
                return HandBack(QUEUE_FULL_RETRY_S)
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in answer.headers
                if k.lower() in _RETRY_HEADERS
            }
            return await self._refused(
                answer.status, answer.body.decode("utf-8", "replace"), headers
            )
        if self.stream.error is not None:
            return await self._failed(self.stream.error)
        return await self._finished()

    async def _started(self, status: int) -> None:
        """The pipeline answered: on a 200 the request was admitted, and the children exist."""
        if status != 200:
            return
        try:
            changed = await self.kind.looms.change(
                self.loom_id,
                None,
                self.kind.clock(),
                start_children(self.spec, self.kind.clock()),
                max_nodes=self.kind.settings.loom_max_nodes,
                max_bytes=self.kind.settings.loom_max_bytes,
                max_key_bytes=self.kind.settings.loom_bytes_per_key,
            )
        except LoomLimitReached as error:
            self.refusal = loom_limit_error(error, "; this branch would pass it")
        except AcsError as error:  # the parent was edited into another state meanwhile
            self.refusal = error
        else:
            if changed is not None:
                tree, self.children = changed
                nodes = nodes_view(tree, self.children)
                self.kind.progress.publish(self.job.id, {"type": "started", "nodes": nodes})
                return
            self.refusal = LoomNodeLimit("The Loom was deleted while the branch started.")
        self.stop.set()  # ends the replay: its engine request is aborted, its hold settled

    async def _grew(self, chunk: bytes) -> None:
        for delta in self.stream.feed(chunk):
            if delta.index < len(self.children):
                node_id = self._child_id(delta.index)
                event = {"type": "delta", "node_id": node_id, "index": delta.index}
                self.kind.progress.publish(self.job.id, {**event, "text": delta.text})
        await self._renew_idempotency()

    def _child_id(self, index: int) -> str | None:
        for child in self.children:
            if int((child.generation or {}).get("index", -1)) == index:
                return str(child.id)
        return None

    async def _renew_idempotency(self) -> None:
        target = idempotency_target(self.request)
        now = asyncio.get_running_loop().time()
        if target is None or now - self._renewed < IDEMPOTENCY_RENEW_S:
            return
        self._renewed = now
        await self.kind.idempotency.renew(target, self.kind.clock(), IDEMPOTENCY_LEASE_S)

    async def _finished(self) -> JobOutcome:
        now = self.kind.clock()
        changed = await self.kind.looms.change(
            self.loom_id,
            None,
            now,
            finish_children(self.job.id, self.stream, now),
            max_nodes=self.kind.settings.loom_max_nodes,
        )
        if changed is None:  # the Loom was deleted meanwhile
            body = json.dumps({"object": "loom.branch", "loom_id": self.loom_id, "nodes": []})
        else:
            tree, kept = changed
            body = json.dumps(branch_view(tree, self.spec.parent_id, kept))
        await self._answer(201, body)
        self.kind.progress.publish(self.job.id, {"type": "done", "status": 201, "body": body})
        return JobOutcome(JobStatus.SUCCEEDED, 201, body)

    async def _fail_children(self, error: Any) -> None:
        now = self.kind.clock()
        plan = fail_children(self.job.id, error, self.stream, now)
        max_nodes = self.kind.settings.loom_max_nodes
        await self.kind.looms.change(self.loom_id, None, now, plan, max_nodes=max_nodes)

    async def _failed(self, error: dict[str, Any]) -> JobOutcome:
        """The stream itself failed (an error frame): the children fail with that error."""
        await self._fail_children(error)
        status = 500
        body = json.dumps(error)
        await self._answer(status, body)
        event = {"type": "refused", "status": status, "body": body, "headers": {}}
        self.kind.progress.publish(self.job.id, event)
        code = (error.get("error") or {}).get("code") if isinstance(error, dict) else None
        return JobOutcome(JobStatus.FAILED, status, body, code)

    async def _refused(self, status: int, body: str, headers: dict[str, str]) -> JobOutcome:
        """The pipeline refused the branch: no Node was made (a re-run's children fail)."""
        error = _loads(body)
        if self.children:
            await self._fail_children(error)
        target = idempotency_target(self.request)
        if target is not None:
            if 400 <= status < 500 and not self.children:
                await self.kind.idempotency.release(target)  # refused before it started
            else:
                await self._answer(status, body)
        event = {"type": "refused", "status": status, "body": body, "headers": headers}
        self.kind.progress.publish(self.job.id, event)
        code = (error.get("error") or {}).get("code") if isinstance(error, dict) else None
        return JobOutcome(JobStatus.FAILED, status, body, code)

    async def fail_unexpectedly(self) -> None:
        """A bug ended the run: its children fail rather than stay `generating`."""
        error = error_body(InternalError(), self.job.id)
        try:
            await self._fail_children(error)
        except Exception:
            logger.exception("branch %s: marking its children failed", self.job.id)
        self.kind.progress.publish(
            self.job.id,
            {"type": "refused", "status": 500, "body": json.dumps(error), "headers": {}},
        )

    async def _answer(self, status: int, body: str) -> None:
        target = idempotency_target(self.request)
        if target is None:
            return
        answer = StoredAnswer(status, body, {"content-type": "application/json"})
        try:
            await self.kind.idempotency.complete(target, answer, self.kind.clock())
        except Exception:
            logger.exception("branch %s: storing its answer for its Idempotency-Key", self.job.id)


def _loads(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return {"error": {"message": body, "type": "server_error", "code": "internal_error"}}
