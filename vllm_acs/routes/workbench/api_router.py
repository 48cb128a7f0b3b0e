"""GET /workbench (the page) and GET /workbench/{asset} (its files); /workbench/ redirects to the
page. No key is needed to load them: every API call the page makes carries the key its user
signed in with.

API server process. Closed by the route gate when the operator sets `workbench=false`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ...errors import NotFound, echoed
from ..error_response import error_response
from .assets import INDEX, SECURITY_HEADERS, load_assets

PAGE_PATH = "/workbench"


def build_router(feedback_url: str | None) -> APIRouter:
    router = APIRouter()
    assets = load_assets(feedback_url)

    def serve(request: Request, name: str) -> Response:
        asset = assets.get(name)
        if asset is None:
            missing = NotFound(f"Unknown route: GET {echoed(request.url.path)}. See /openapi.json.")
            return error_response(request, missing)
        return Response(asset.body, media_type=asset.content_type, headers=SECURITY_HEADERS)

    @router.get(PAGE_PATH, include_in_schema=False)
    async def workbench_page(request: Request) -> Response:
        return serve(request, INDEX)

    @router.get(PAGE_PATH + "/", include_in_schema=False)
    async def workbench_folder(request: Request) -> Response:
        # The page's own address has no slash: its files load relative to it.
        query = request.url.query
        target = PAGE_PATH + (f"?{query}" if query else "")
        return RedirectResponse(target, status_code=308, headers=SECURITY_HEADERS)

    @router.get(PAGE_PATH + "/{asset}", include_in_schema=False)
    async def workbench_asset(request: Request, asset: str) -> Response:
        return serve(request, asset)

    return router
