"""Renders an `AcsError` raised by a plugin route as a JSON answer in the spec's envelope.

API server process.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from ..errors import REQUEST_ID_STATE_KEY, AcsError, error_body


def error_response(request: Request, error: AcsError) -> JSONResponse:
    request_id = getattr(request.state, REQUEST_ID_STATE_KEY, None)
    return JSONResponse(
        error_body(error, request_id), status_code=error.status, headers=error.headers
    )
