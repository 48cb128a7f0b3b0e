"""/docs: the API's browsable page (Swagger UI) from the files vLLM ships, and nothing else.

API server process. vLLM's `--enable-offline-docs` (which `vllm-acs serve` passes) serves the
two Swagger UI files under /static, but its page still names FastAPI's favicon on another origin;
this page replaces it (a plugin route replaces vLLM's of the same path and method), so that a
browser on a node without internet makes no request elsewhere.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

DOCS_PATH = "/docs"
SWAGGER_JS = "/static/swagger-ui-bundle.js"
SWAGGER_CSS = "/static/swagger-ui.css"


def build_router(title: str) -> APIRouter:
    router = APIRouter()

    @router.get(DOCS_PATH, include_in_schema=False)
    async def docs_page() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{title} - API",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=SWAGGER_JS,
            swagger_css_url=SWAGGER_CSS,
            swagger_favicon_url="data:,",  # no icon: the browser asks no other origin
        )

    return router
