"""GET /v1/usage: any key, about itself (no scope needed). API server process."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...account.usage_report import usage_report
from ...storage import Storage
from ..answers import answer_of, principal_of
from .protocol import UsageReport

USAGE_PATH = "/v1/usage"


def build_router(storage: Callable[[], Storage | None], clock: Callable[[], datetime]) -> APIRouter:
    router = APIRouter(tags=["usage"])

    @router.get(USAGE_PATH)
    async def usage(request: Request) -> Response:
        async def report() -> dict[str, Any]:
            opened = storage()
            if opened is None:
                raise RuntimeError("vllm_acs usage: storage is not open (init_state did not run)")
            found = await usage_report(
                principal_of(request), opened.counters, opened.usage, clock()
            )
            return UsageReport.model_validate(found).model_dump()

        return await answer_of(request, report)

    return router
