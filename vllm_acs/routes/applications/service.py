"""The /v1/applications routes' work: the form (open or closed), a submit under the per-address
limit and the pending cap, a claim that hands out the first key once; the application service
(`account/applications.py`, shared with the console and the CLI), its refusals as the spec's
errors.

API server process.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ...account.applications import ApplicationLimits, Applications, InvalidClaimCode
from ...account.key_manager import KeyManager
from ...contract.completion_request import parse_body
from ...errors import (
    ApplicationGone,
    ApplicationPending,
    ApplicationRejected,
    ApplicationsClosed,
    ApplicationsFull,
    TrafficLimited,
)
from ...errors import InvalidClaimCode as InvalidClaimCodeError
from ...settings import Settings
from ...storage import Storage
from ...storage.applications import AddressLimited, Application, NotClaimable, PendingCapReached
from ..answers import Answer
from ..keys.service import key_view
from ..looms.service import json_of
from .protocol import (
    AFFILIATION_MAX,
    EMAIL_MAX,
    NAME_MAX,
    USE_MAX,
    USE_MIN,
    ApplicationBody,
    ApplicationForm,
    ApplicationView,
    ClaimBody,
    ClaimedApplication,
    CreatedApiKey,
    FieldBounds,
    SubmittedApplication,
)

APPLICATIONS_PATH = "/v1/applications"
FORM_PATH = APPLICATIONS_PATH + "/form"
CLAIM_PATH = APPLICATIONS_PATH + "/claim"
# The routes that answer without a key (Auth lets them through).
OPEN_PATHS = (APPLICATIONS_PATH, FORM_PATH, CLAIM_PATH)


def unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def application_view(application: Application, now: datetime) -> ApplicationView:
    return ApplicationView(
        id=application.id,
        status=application.status_at(now),  # type: ignore[arg-type]
        name=application.name,
        email=application.email,
        affiliation=application.affiliation,
        intended_use=application.intended_use,
        account_id=application.account_id,
        created_at=unix(application.created_at),  # type: ignore[arg-type]
        expires_at=unix(application.expires_at),  # type: ignore[arg-type]
        decided_at=unix(application.decided_at),
        decided_by=application.decided_by,
        note=application.note,
        claimed_at=unix(application.claimed_at),
        key_id=application.key_id,
    )


_CLAIM_REFUSALS: dict[str, Callable[[], Exception]] = {
    "pending": lambda: ApplicationPending(
        "This application has not been reviewed yet; the same claim code works once it is approved."
    ),
    "rejected": lambda: ApplicationRejected("This application was not approved."),
    "expired": lambda: ApplicationGone(
        "This application expired before it was claimed; apply again."
    ),
    "claimed": lambda: ApplicationGone(
        "This claim code was used already: the application's key was handed out once.",
        code="claim_code_used",
    ),
}


class ApplicationService:
    """Bound to storage once the engine is up (`bind`, from init_state)."""

    def __init__(self, settings: Settings, clock: Callable[[], datetime]) -> None:
        self.open = settings.applications == "open"
        self.clock = clock
        self.limits = ApplicationLimits(
            per_address=settings.applications_per_address,
            pending_cap=settings.applications_pending_cap,
            ttl=timedelta(days=settings.application_ttl_days),
        )
        self.applications: Applications | None = None

    def bind(self, storage: Storage, keys: KeyManager) -> None:
        self.applications = Applications(storage.applications, keys, self.limits, self.clock)

    @property
    def _applications(self) -> Applications:
        if self.applications is None:
            raise RuntimeError(
                "vllm_acs applications: storage is not open (init_state did not run)"
            )
        return self.applications

    def _check_open(self) -> None:
        if not self.open:
            raise ApplicationsClosed(
                "This node does not take applications for access (the operator has closed the "
                "form)."
            )

    def form(self) -> dict[str, Any]:
        self._check_open()
        fields = {
            "name": FieldBounds(max_length=NAME_MAX),
            "email": FieldBounds(max_length=EMAIL_MAX),
            "affiliation": FieldBounds(max_length=AFFILIATION_MAX),
            "intended_use": FieldBounds(min_length=USE_MIN, max_length=USE_MAX),
        }
        return ApplicationForm(
            open=True, fields=fields, claim_code_ttl_days=self.limits.ttl.days
        ).model_dump(exclude_none=True)

    async def submit(self, raw: bytes, address: str) -> Answer:
        self._check_open()
        body = parse_body(ApplicationBody, json_of(raw))
        try:
            application, code = await self._applications.submit(body.model_dump(), address)
        except AddressLimited as limited:
            raise TrafficLimited(
                f"Too many applications from this address: at most {limited.limit} an hour.",
                retry_after_ms=limited.retry_after_s * 1000,
            ) from None
        except PendingCapReached as full:
            raise ApplicationsFull(
                f"{full.limit} applications are waiting for review already; this node takes "
                "no more until the operator has reviewed them."
            ) from None
        view = SubmittedApplication(
            id=application.id,
            status="pending",
            claim_code=code,
            created_at=unix(application.created_at),  # type: ignore[arg-type]
            expires_at=unix(application.expires_at),  # type: ignore[arg-type]
        )
        return Answer(201, view.model_dump(), {})

    async def claim(self, raw: bytes) -> Answer:
        body = parse_body(ClaimBody, json_of(raw))
        try:
            claimed = await self._applications.claim(body.claim_code)
        except InvalidClaimCode:
            raise InvalidClaimCodeError("Invalid claim code.", param="claim_code") from None
        except NotClaimable as refused:
            raise _CLAIM_REFUSALS[refused.status]() from None
        key = CreatedApiKey(**key_view(claimed.key, 0, None).model_dump(), key=claimed.secret)
        view = ClaimedApplication(
            id=claimed.application.id,
            status="claimed",
            account_id=claimed.application.account_id,
            key=key,
        )
        return Answer(201, view.model_dump(), {})
