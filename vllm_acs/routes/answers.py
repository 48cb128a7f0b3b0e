"""What the job and harvest routes share: a service's answer, its HTTP response, and the caller
that Auth put on the request. API server process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..errors import InternalError
from ..principal import PRINCIPAL_STATE_KEY, Principal


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] | str  # a str is JSON already (a stored answer, sent byte for byte)
    headers: dict[str, str]


def principal_of(request: Request) -> Principal:
    principal = getattr(request.state, PRINCIPAL_STATE_KEY, None)
    if not isinstance(principal, Principal):
        raise InternalError()
    return principal


def response_of(answer: Answer) -> Response:
    if isinstance(answer.body, str):
        return Response(
            answer.body, answer.status, headers=answer.headers, media_type="application/json"
        )
    return JSONResponse(answer.body, answer.status, headers=answer.headers)
