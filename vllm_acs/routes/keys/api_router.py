"""POST/GET /v1/keys and PATCH/DELETE /v1/keys/{key_id}. API server process.

Auth has checked the `keys` scope and put the principal on the request; the Idempotency
middleware replays a resent create (its secret sealed in the stored answer). Every error is an
`AcsError` in the envelope.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..answers import answer_of, principal_of
from .service import KEYS_PATH, KeyService

KEY_PATH = KEYS_PATH + "/{key_id}"


def build_router(keys: KeyService) -> APIRouter:
    router = APIRouter(tags=["keys"])

    @router.post(KEYS_PATH, status_code=201)
    async def create(request: Request) -> Response:
        raw = await request.body()
        return await answer_of(request, lambda: keys.create(raw, principal_of(request)))

    @router.get(KEYS_PATH)
    async def list_keys(request: Request) -> Response:
        return await answer_of(request, lambda: keys.list(principal_of(request)))

    @router.patch(KEY_PATH)
    async def patch(request: Request, key_id: str) -> Response:
        raw = await request.body()
        return await answer_of(request, lambda: keys.patch(key_id, raw, principal_of(request)))

    @router.delete(KEY_PATH)
    async def revoke(request: Request, key_id: str) -> Response:
        return await answer_of(request, lambda: keys.revoke(key_id, principal_of(request)))

    return router
