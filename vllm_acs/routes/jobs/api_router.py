"""POST /v1/completion-jobs, GET /v1/completion-jobs/{id} and .../{id}/result (both `?wait=`),
DELETE /v1/completion-jobs/{id}.

API server process. Auth has put the principal on the request and the Idempotency middleware
its claim (the key is required on the submit); every error is an `AcsError` in the envelope.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...errors import AcsError, InternalError
from ...storage.idempotency import IDEMPOTENCY_STATE_KEY, IdempotencyClaim
from ...storage.usage import recorded_workload
from ..answers import principal_of, response_of
from ..error_response import error_response
from ..long_poll import wait_seconds
from .protocol import job_object
from .service import JOBS_PATH, JobService

REQUEST_ID_HEADER = "x-request-id"


def build_router(service: JobService) -> APIRouter:
    router = APIRouter(tags=["completion jobs"])

    @router.post(JOBS_PATH, status_code=202)
    async def submit(request: Request) -> Response:
        try:
            claim = getattr(request.state, IDEMPOTENCY_STATE_KEY, None)
            if not isinstance(claim, IdempotencyClaim):  # the middleware requires the key here
                raise InternalError()
            principal = principal_of(request)
            # Before the body is validated: a refused submit costs no parse or tokenizing.
            await service.refuse_early(principal)
            answer = await service.submit(
                await request.body(),
                principal,
                claim.target,
                request.headers.get(REQUEST_ID_HEADER),
                recorded_workload(request.headers.get("x-acs-workload")),
            )
            claim.completed = True  # stored with the job, in its transaction
            return response_of(answer)
        except AcsError as error:
            return error_response(request, error)

    @router.get(JOBS_PATH + "/{job_id}")
    async def read(request: Request, job_id: str) -> Response:
        try:
            wait = wait_seconds(request)
            return response_of(await service.read(job_id, principal_of(request), wait))
        except AcsError as error:
            return error_response(request, error)

    @router.get(JOBS_PATH + "/{job_id}/result")
    async def result(request: Request, job_id: str) -> Response:
        try:
            wait = wait_seconds(request)
            return response_of(await service.result(job_id, principal_of(request), wait))
        except AcsError as error:
            return error_response(request, error)

    @router.delete(JOBS_PATH + "/{job_id}")
    async def cancel(request: Request, job_id: str) -> Response:
        try:
            job = await service.cancel(job_id, principal_of(request))
            return JSONResponse(job_object(job).model_dump())
        except AcsError as error:
            return error_response(request, error)

    return router
