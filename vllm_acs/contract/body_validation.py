"""A raw /v1/completions body parsed and validated, off the event loop when it is large.

API server process. Used by StrictValidationMiddleware (live requests) and by the completion-jobs
submit (a job's body is a completions body under the same validation).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..served_model import NodeModels
from ..settings import Settings
from .bounded_json import loads_bounded
from .completion_rules import validate_completion
from .validated import ValidatedCompletion

# Bodies above this are parsed and validated in a worker thread: parsing and tokenizing them
# would stall other requests.
INLINE_LIMIT_BYTES = 16 * 1024


def parse_and_validate(
    body: bytes, models: NodeModels, settings: Settings, request_id: str | None
) -> tuple[Any, ValidatedCompletion]:
    """(the JSON as the client sent it, the validated request), or the AcsError to answer."""
    data = loads_bounded(body)
    return data, validate_completion(data, models, settings, request_id)


async def validate_body(
    body: bytes, models: NodeModels, settings: Settings, request_id: str | None
) -> tuple[Any, ValidatedCompletion]:
    if len(body) <= INLINE_LIMIT_BYTES:
        return parse_and_validate(body, models, settings, request_id)
    return await asyncio.to_thread(parse_and_validate, body, models, settings, request_id)
