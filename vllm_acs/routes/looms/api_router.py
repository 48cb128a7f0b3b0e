"""The Loom routes: /v1/looms, its Nodes, branch, replay, score, export and import.

API server process. Auth has put the principal on the request and the Idempotency middleware its
claim where a key was sent (every writing POST takes one); every error is an `AcsError` in the
envelope, and an error of the completions pipeline (a branch's budget) is passed on as it was.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from ...errors import AcsError, UpstreamBusy
from ...looms.progress import ENDS, Event
from ...storage.idempotency import IDEMPOTENCY_STATE_KEY, IdempotencyClaim
from ...storage.usage import recorded_workload
from ..answers import answer_of, principal_of, response_of
from ..error_response import error_response
from .generation_service import (
    BranchListening,
    GenerationService,
    PipelineRefusal,
    refusal_answer,
)
from .service import IMPORT_PATH, LIST_LIMIT_MAX, LOOMS_PATH, LoomService

LOOM = LOOMS_PATH + "/{loom_id}"
NODE = LOOM + "/nodes/{node_id}"


async def _answer(request: Request, work: Callable[[], Awaitable[Any]]) -> Response:
    """`answer_of`, with what only the Loom routes have: the completions pipeline's refusal
    passed on as it was, and a str answer (an export as text) as plain text."""

    async def loom_work() -> Any:
        try:
            result = await work()
        except PipelineRefusal as refusal:
            return Response(
                refusal.body, refusal.status, headers=refusal.headers, media_type="application/json"
            )
        return PlainTextResponse(result) if isinstance(result, str) else result

    return await answer_of(request, loom_work)


def _claim(request: Request) -> IdempotencyClaim | None:
    claim = getattr(request.state, IDEMPOTENCY_STATE_KEY, None)
    return claim if isinstance(claim, IdempotencyClaim) else None


def build_router(looms: LoomService, generations: GenerationService) -> APIRouter:
    router = APIRouter(tags=["looms"])

    @router.post(LOOMS_PATH, status_code=201)
    async def create(request: Request) -> Response:
        raw = await request.body()
        return await _answer(request, lambda: looms.create(raw, principal_of(request)))

    @router.get(LOOMS_PATH)
    async def list_looms(request: Request, limit: int = 20, after: str | None = None) -> Response:
        return await _answer(
            request, lambda: looms.list(principal_of(request), min(limit, LIST_LIMIT_MAX), after)
        )

    @router.post(IMPORT_PATH, status_code=201)
    async def import_file(request: Request) -> Response:
        raw = await request.body()
        return await _answer(request, lambda: looms.import_file(raw, principal_of(request)))

    @router.get(LOOM)
    async def read(request: Request, loom_id: str) -> Response:
        return await _answer(request, lambda: looms.read(loom_id, principal_of(request)))

    @router.patch(LOOM)
    async def retitle(request: Request, loom_id: str) -> Response:
        raw = await request.body()
        return await _answer(request, lambda: looms.retitle(loom_id, raw, principal_of(request)))

    @router.delete(LOOM)
    async def delete(request: Request, loom_id: str) -> Response:
        return await _answer(request, lambda: looms.delete(loom_id, principal_of(request)))

    @router.get(LOOM + "/export")
    async def export(request: Request, loom_id: str) -> Response:
        return await _answer(request, lambda: looms.export(loom_id, principal_of(request)))

    @router.get(NODE)
    async def read_node(request: Request, loom_id: str, node_id: str) -> Response:
        who = principal_of(request)
        return await _answer(request, lambda: looms.read_node(loom_id, node_id, who))

    @router.patch(NODE)
    async def edit(request: Request, loom_id: str, node_id: str) -> Response:
        raw, who = await request.body(), principal_of(request)
        return await _answer(request, lambda: looms.edit(loom_id, node_id, raw, who))

    @router.delete(NODE)
    async def delete_node(request: Request, loom_id: str, node_id: str) -> Response:
        who = principal_of(request)
        return await _answer(request, lambda: looms.delete_node(loom_id, node_id, who))

    @router.get(NODE + "/text")
    async def text(request: Request, loom_id: str, node_id: str) -> Response:
        who = principal_of(request)
        return await _answer(request, lambda: looms.path_text(loom_id, node_id, who))

    @router.post(NODE + "/split", status_code=201)
    async def split(request: Request, loom_id: str, node_id: str) -> Response:
        raw, who = await request.body(), principal_of(request)
        return await _created(request, lambda: looms.split(loom_id, node_id, raw, who))

    @router.post(NODE + "/children", status_code=201)
    async def add_child(request: Request, loom_id: str, node_id: str) -> Response:
        raw, who = await request.body(), principal_of(request)
        return await _created(request, lambda: looms.add_child(loom_id, node_id, raw, who))

    @router.post(NODE + "/siblings", status_code=201)
    async def add_sibling(request: Request, loom_id: str, node_id: str) -> Response:
        raw, who = await request.body(), principal_of(request)
        return await _created(request, lambda: looms.add_sibling(loom_id, node_id, raw, who))

    @router.post(NODE + "/replay")
    async def replay(request: Request, loom_id: str, node_id: str) -> Response:
        who = principal_of(request)
        return await _answer(request, lambda: generations.replay(loom_id, node_id, who))

    @router.post(NODE + "/score")
    async def score(request: Request, loom_id: str, node_id: str) -> Response:
        raw, who = await request.body(), principal_of(request)
        return await _answer(request, lambda: generations.score(loom_id, node_id, raw, who))

    @router.post(NODE + "/branch", status_code=201)
    async def branch(request: Request, loom_id: str, node_id: str) -> Response:
        claim = _claim(request)
        try:
            listening = await generations.branch(
                loom_id,
                node_id,
                await request.body(),
                principal_of(request),
                None if claim is None else claim.target,
                request.headers.get("x-request-id"),
                recorded_workload(request.headers.get("x-acs-workload")),
            )
        except AcsError as error:
            return error_response(request, error)
        if claim is not None:
            claim.completed = True  # the branch stores its answer when it ends
        return await _branch_answer(request, listening)

    return router


async def _created(request: Request, work: Callable[[], Awaitable[Any]]) -> Response:
    response = await _answer(request, work)
    if response.status_code == 200:
        response.status_code = 201
    return response


_STOPPED = UpstreamBusy(
    "This node is stopping; the branch goes on on another node (or this one once it is back): "
    "read the Loom for its Nodes."
)


async def _branch_answer(request: Request, listening: BranchListening) -> Response:
    first = await listening.events.get()
    if first["type"] != "started":
        listening.close()
        return _end_answer(request, first)
    if not listening.stream:
        try:
            event = first
            while event["type"] not in ENDS:
                event = await listening.events.get()
        finally:
            listening.close()
        return _end_answer(request, event)
    return StreamingResponse(_events(first, listening), media_type="text/event-stream")


def _end_answer(request: Request, event: Event) -> Response:
    if event["type"] == "done":
        return Response(event["body"], 201, media_type="application/json")
    if event["type"] == "refused":
        return response_of(refusal_answer(event))
    return error_response(request, _STOPPED)


def _sse(name: str, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"event: {name}\ndata: {payload}\n\n".encode()


async def _events(first: Event, listening: BranchListening) -> AsyncIterator[bytes]:
    """`started` (the children, generating), `delta` per piece of text, then `done` (the
    branch's answer) or `error` (the error envelope)."""
    try:
        yield _sse("started", {"nodes": first["nodes"]})
        while True:
            event = await listening.events.get()
            kind = event["type"]
            if kind == "delta":
                yield _sse("delta", {k: event[k] for k in ("node_id", "index", "text")})
            elif kind == "done":
                yield _sse("done", event["body"])
                return
            elif kind in ENDS:
                body = event.get("body") or json.dumps({"error": {"message": _STOPPED.message}})
                yield _sse("error", body)
                return
    finally:
        listening.close()
