"""GET /v1/applications/form, POST /v1/applications and POST /v1/applications/claim: no key
(Auth lets these three through). API server process.

The client address the per-address limit counts is the one the server sees: uvicorn takes it from
`X-Forwarded-For` when the proxy is one it trusts (`FORWARDED_ALLOW_IPS`, loopback by default).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..answers import answer_of
from .service import APPLICATIONS_PATH, CLAIM_PATH, FORM_PATH, ApplicationService


def build_router(applications: ApplicationService) -> APIRouter:
    router = APIRouter(tags=["applications"])

    @router.get(FORM_PATH)
    async def form(request: Request) -> Response:
        async def work():
            return applications.form()

        return await answer_of(request, work)

    @router.post(APPLICATIONS_PATH, status_code=201)
    async def submit(request: Request) -> Response:
        raw = await request.body()
        address = request.client.host if request.client is not None else "unknown"
        return await answer_of(request, lambda: applications.submit(raw, address))

    @router.post(CLAIM_PATH, status_code=201)
    async def claim(request: Request) -> Response:
        raw = await request.body()
        return await answer_of(request, lambda: applications.claim(raw))

    return router
