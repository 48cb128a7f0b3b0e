"""The bodies and answers of /v1/applications and the console's application views (also their
OpenAPI schemas). Strict: an unknown field, a wrong type or a bound outside the limits is a 400
naming the field. Whitespace around an answer is trimmed before its bounds are checked.

API server process. Pure pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ..keys.protocol import CreatedApiKey

_STRICT = ConfigDict(extra="forbid", strict=True)
NAME_MAX = 200
EMAIL_MAX = 254
AFFILIATION_MAX = 200
USE_MIN, USE_MAX = 20, 4000
NOTE_MAX = 500
CLAIM_CODE_MAX = 100
APPLICATION_BODY_LIMIT_BYTES = 16 * 1024

Answer = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class ApplicationBody(BaseModel):
    model_config = _STRICT

    name: Annotated[Answer, StringConstraints(max_length=NAME_MAX)] = Field(
        description="The applicant's name"
    )
    email: Annotated[
        str,
        StringConstraints(
            strip_whitespace=True, min_length=3, max_length=EMAIL_MAX, pattern=r"^[^@\s]+@[^@\s]+$"
        ),
    ] = Field(description="Where the operator reaches the applicant")
    affiliation: Annotated[Answer, StringConstraints(max_length=AFFILIATION_MAX)] = Field(
        description="Lab, university or company"
    )
    intended_use: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=USE_MIN, max_length=USE_MAX)
    ] = Field(description="What the applicant wants to do with the API")


class ClaimBody(BaseModel):
    model_config = _STRICT

    claim_code: str = Field(
        min_length=1,
        max_length=CLAIM_CODE_MAX,
        description="The code shown once when applying (acs-claim-...)",
    )


class FieldBounds(BaseModel):
    min_length: int | None = None
    max_length: int


class ApplicationForm(BaseModel):
    object: Literal["application_form"] = "application_form"
    open: bool
    fields: dict[str, FieldBounds]
    claim_code_ttl_days: int


class SubmittedApplication(BaseModel):
    object: Literal["application"] = "application"
    id: str
    status: Literal["pending"]
    claim_code: str = Field(
        description="Shown this once: only its hash is kept. The applicant's only credential"
    )
    created_at: int = Field(description="Unix seconds")
    expires_at: int = Field(description="Unix seconds: the code stops working then unclaimed")


class ClaimedApplication(BaseModel):
    object: Literal["application"] = "application"
    id: str
    status: Literal["claimed"]
    account_id: str
    key: CreatedApiKey = Field(description="The account's first API key, its secret shown once")


Status = Literal["pending", "approved", "rejected", "expired", "claimed"]


class ApplicationView(BaseModel):
    """An application as the console shows it; never its claim code or a hash."""

    object: Literal["application"] = "application"
    id: str
    status: Status
    name: str
    email: str
    affiliation: str
    intended_use: str
    account_id: str
    created_at: int
    expires_at: int
    decided_at: int | None
    decided_by: str | None = Field(description="`operator`, or the admin key's id")
    note: str | None
    claimed_at: int | None
    key_id: str | None = Field(description="The first key, once claimed")


class ApplicationList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApplicationView]
