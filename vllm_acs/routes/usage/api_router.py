"""GET /v1/usage: any key, about itself (no scope needed). API server process."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...account.usage_report import usage_report
from ...errors import AcsError
from ...storage import Storage
from ..answers import principal_of
from ..error_response import error_response
from .protocol import UsageReport

USAGE_PATH = "/v1/usage"


def build_router(storage: Callable[[], Storage | None], clock: Callable[[], datetime]) -> APIRouter:
    router = APIRouter(tags=["usage"])

    @router.get(USAGE_PATH)
    async def usage(request: Request) -> Response:
        opened = storage()
        try:
            if opened is None:
                raise RuntimeError("vllm_acs usage: storage is not open (init_state did not run)")
            report = await usage_report(
                principal_of(request), opened.counters, opened.usage, clock()
            )
        except AcsError as error:
            return error_response(request, error)
        return JSONResponse(UsageReport.model_validate(report).model_dump())

    return router
