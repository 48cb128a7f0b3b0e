"""The answer shapes of a harvest, as /openapi.json documents them.

API server process. Job states read as the spec's harvest states: queued is `pending`,
succeeded is `done`; a job that expired while queued reads `failed`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ...states import JobStatus

HarvestState = Literal["pending", "running", "done", "failed", "cancelled"]

STATE_OF_JOB: dict[JobStatus, HarvestState] = {
    JobStatus.QUEUED: "pending",
    JobStatus.RUNNING: "running",
    JobStatus.SUCCEEDED: "done",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.EXPIRED: "failed",
}


class HarvestSubmitted(BaseModel):
    job_id: str
    status: HarvestState
    model: str
    n_prompts: int
    created_at: str = Field(description="ISO 8601, UTC")


class HarvestResult(BaseModel):
    n_shards: int
    layer_indices: list[int]
    manifest_url: str
    shard_urls: list[str]
    stats_url: str
    timings: dict[str, Any] = Field(description="forward_s, write_s, wall_s, tokens, prompts")


class HarvestError(BaseModel):
    code: str | None
    message: str


class HarvestJob(BaseModel):
    job_id: str
    object: Literal["harvest"] = "harvest"
    status: HarvestState
    model: str
    n_prompts: int
    layer_indices: list[int]
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    progress: dict[str, int] = Field(description="prompts_done, n_prompts, shards_done")
    result: HarvestResult | None = None
    error: HarvestError | None = None
    urls_expire_at: str | None = None
    urls_expired: bool | None = None
