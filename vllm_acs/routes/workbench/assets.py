"""The Workbench's files: read once from `static/`, served with strict security headers.

API server process. The page is plain HTML, CSS and ES modules (no build step at install or run
time, nothing fetched from another origin). Only the files in `static/` exist; any other name is
a 404. `index.html` names the operator's Feedback link in a meta tag, so no script is inline.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

STATIC_DIR = Path(__file__).with_name("static")
INDEX = "index.html"
_FEEDBACK_MARK = "<!-- feedback -->"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# No inline script or style, nothing from another origin, never framed.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    # A node upgraded in place serves its new page at once; the browser still revalidates cheaply.
    "cache-control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str


def load_assets(feedback_url: str | None) -> dict[str, Asset]:
    """Every servable file by name; the page's Feedback link filled in (or left out)."""
    assets = {}
    for path in sorted(STATIC_DIR.iterdir()):
        content_type = _CONTENT_TYPES.get(path.suffix)
        if not path.is_file() or content_type is None:
            continue
        body = path.read_bytes()
        if path.name == INDEX:
            body = _with_feedback(body.decode("utf-8"), feedback_url).encode("utf-8")
        assets[path.name] = Asset(body, content_type)
    return assets


def _with_feedback(page: str, feedback_url: str | None) -> str:
    if feedback_url is None:
        return page.replace(_FEEDBACK_MARK, "")
    meta = f'<meta name="acs-feedback-url" content="{html.escape(feedback_url, quote=True)}">'
    return page.replace(_FEEDBACK_MARK, meta)
