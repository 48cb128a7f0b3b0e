"""/docs: the API's browsable page (Swagger UI) from the files vLLM ships, and nothing else.

API server process. vLLM's `--enable-offline-docs` (which `vllm-acs serve` passes) serves the
two Swagger UI files under /static, but its page names FastAPI's favicon on another origin and
starts Swagger UI from an inline script; this page replaces it (a plugin route replaces vLLM's
of the same path and method). Swagger UI starts from its own file (`/docs/swagger-init.js`), so
the page runs under the Workbench's policy (no inline script, nothing from another origin, never
framed): /docs shares the Workbench's origin, whose `localStorage` may hold a key. The page has
no OAuth2 redirect: the API's only credential is a bearer key.
"""

from __future__ import annotations

import html

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from .workbench.assets import SECURITY_HEADERS

DOCS_PATH = "/docs"
INIT_JS_PATH = "/docs/swagger-init.js"
SWAGGER_JS = "/static/swagger-ui-bundle.js"
SWAGGER_CSS = "/static/swagger-ui.css"
# FastAPI's own settings for Swagger UI (fastapi.openapi.docs.swagger_ui_default_parameters).
_INIT_JS = """\
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""


def docs_html(title: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link rel="stylesheet" href="{SWAGGER_CSS}">
<link rel="icon" href="data:,">
<title>{html.escape(title)} - API</title>
</head>
<body>
<div id="swagger-ui"></div>
<script src="{SWAGGER_JS}"></script>
<script src="{INIT_JS_PATH}"></script>
</body>
</html>
"""


def build_router(title: str) -> APIRouter:
    router = APIRouter()
    page = docs_html(title)

    @router.get(DOCS_PATH, include_in_schema=False)
    async def docs_page() -> HTMLResponse:
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @router.get(INIT_JS_PATH, include_in_schema=False)
    async def docs_init() -> Response:
        return Response(
            _INIT_JS, media_type="text/javascript; charset=utf-8", headers=SECURITY_HEADERS
        )

    return router
