"""The console's API under /v1/admin. Auth has checked the `admin` scope (a key without it gets
403 scope_denied before any of this runs) and put the principal on the request. API server
process.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..answers import answer_of, principal_of
from .reports import AdminReports
from .service import ADMIN_PATH, AdminService

APPLICATIONS = ADMIN_PATH + "/applications"
APPLICATION = APPLICATIONS + "/{application_id}"
ACCOUNTS = ADMIN_PATH + "/accounts"
ACCOUNT = ACCOUNTS + "/{account_id}"
KEYS = ADMIN_PATH + "/keys"
KEY = KEYS + "/{key_id}"
USAGE = ADMIN_PATH + "/usage"
NODES = ADMIN_PATH + "/nodes"
AUDIT = ADMIN_PATH + "/audit"


def build_router(admin: AdminService, reports: AdminReports) -> APIRouter:
    router = APIRouter(tags=["admin"])

    @router.get(APPLICATIONS)
    async def applications(request: Request) -> Response:
        return await answer_of(request, lambda: admin.applications(request.query_params))

    @router.post(APPLICATION + "/approve")
    async def approve(request: Request, application_id: str) -> Response:
        raw = await request.body()
        principal = principal_of(request)
        return await answer_of(
            request, lambda: admin.decide(application_id, "approve", raw, principal)
        )

    @router.post(APPLICATION + "/reject")
    async def reject(request: Request, application_id: str) -> Response:
        raw = await request.body()
        principal = principal_of(request)
        return await answer_of(
            request, lambda: admin.decide(application_id, "reject", raw, principal)
        )

    @router.get(ACCOUNTS)
    async def accounts(request: Request) -> Response:
        return await answer_of(request, admin.accounts)

    @router.get(ACCOUNT)
    async def account(request: Request, account_id: str) -> Response:
        return await answer_of(request, lambda: admin.account(account_id))

    @router.patch(ACCOUNT)
    async def patch_account(request: Request, account_id: str) -> Response:
        raw = await request.body()
        principal = principal_of(request)
        return await answer_of(request, lambda: admin.patch_account(account_id, raw, principal))

    @router.get(KEYS)
    async def keys(request: Request) -> Response:
        return await answer_of(request, lambda: admin.keys(request.query_params))

    @router.patch(KEY)
    async def patch_key(request: Request, key_id: str) -> Response:
        raw = await request.body()
        principal = principal_of(request)
        return await answer_of(request, lambda: admin.patch_key(key_id, raw, principal))

    @router.delete(KEY)
    async def revoke_key(request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        return await answer_of(request, lambda: admin.revoke_key(key_id, principal))

    @router.get(USAGE)
    async def usage(request: Request) -> Response:
        return await answer_of(request, lambda: reports.usage(request.query_params))

    @router.get(NODES)
    async def nodes(request: Request) -> Response:
        return await answer_of(request, reports.nodes)

    @router.get(AUDIT)
    async def audit(request: Request) -> Response:
        return await answer_of(request, lambda: reports.audit(request.query_params))

    return router
