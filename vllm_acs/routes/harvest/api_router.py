"""POST /v1/harvest, GET /v1/harvest/{id} (`?wait=`), DELETE /v1/harvest/{id}, and
GET /downloads/{id}/{file} (signed URL, no key, HTTP Range).

API server process. Auth has put the principal on the /v1 requests and the Idempotency
middleware its claim when the client sent a key; every error is an `AcsError` in the envelope.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ...errors import AcsError, RequestedRangeInvalid
from ...storage.idempotency import IDEMPOTENCY_STATE_KEY, IdempotencyClaim
from ..answers import principal_of, response_of
from ..error_response import error_response
from ..long_poll import wait_seconds
from .service import DOWNLOADS_PATH, HARVEST_PATH, HarvestService

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _base_url(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range; None for the whole file."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        raise RequestedRangeInvalid(f"Range {header!r} is not one range of bytes.", size)
    first, last = match.group(1), match.group(2)
    if not first:  # the last N bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if size == 0 or start >= size or end < start:
        raise RequestedRangeInvalid(f"Range {header!r} is outside the file's {size} bytes.", size)
    return start, end


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # an empty async generator: the body of an empty file


def build_router(service: HarvestService) -> APIRouter:
    router = APIRouter(tags=["harvests"])

    @router.post(HARVEST_PATH, status_code=202)
    async def submit(request: Request) -> Response:
        try:
            claim = getattr(request.state, IDEMPOTENCY_STATE_KEY, None)
            target = claim.target if isinstance(claim, IdempotencyClaim) else None
            principal = principal_of(request)
            # Before the body is read: a refused submit costs no parse of up to 50 MB.
            await service.refuse_early(principal)
            answer = await service.submit(await request.body(), principal, target)
            if isinstance(claim, IdempotencyClaim):
                claim.completed = True  # stored with the job, in its transaction
            return response_of(answer)
        except AcsError as error:
            return error_response(request, error)

    @router.get(HARVEST_PATH + "/{job_id}")
    async def read(request: Request, job_id: str) -> Response:
        try:
            wait = wait_seconds(request)
            return response_of(
                await service.read(job_id, principal_of(request), wait, _base_url(request))
            )
        except AcsError as error:
            return error_response(request, error)

    @router.delete(HARVEST_PATH + "/{job_id}")
    async def cancel(request: Request, job_id: str) -> Response:
        try:
            return response_of(
                await service.cancel(job_id, principal_of(request), _base_url(request))
            )
        except AcsError as error:
            return error_response(request, error)

    @router.get(DOWNLOADS_PATH + "/{job_id}/{file_name}")
    async def download(request: Request, job_id: str, file_name: str) -> Response:
        try:
            params = request.query_params
            name = await service.download_name(
                job_id, file_name, params.get("expires"), params.get("signature")
            )
            files = service.files
            size = await files.size(name) or 0
            wanted = byte_range(request.headers.get("range"), size)
            start, end = wanted or (0, size - 1)
            headers = {
                "accept-ranges": "bytes",
                "content-length": str(end - start + 1 if size else 0),
                "content-disposition": f'attachment; filename="{file_name}"',
            }
            status = 200
            if wanted is not None:
                status = 206
                headers["content-range"] = f"bytes {start}-{end}/{size}"
            media = (
                "application/json" if file_name.endswith(".json") else "application/octet-stream"
            )
            chunks = files.read_range(name, start, end) if size else _nothing()
            return StreamingResponse(chunks, status, headers=headers, media_type=media)
        except AcsError as error:
            return error_response(request, error)

    return router
