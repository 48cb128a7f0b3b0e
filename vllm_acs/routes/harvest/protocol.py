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
    timings: dict[str, Any] = Field(
        description="forward_s (time with prompts in the engine) and write_s (time writing "
        "shards, mostly while the next shard's prompts run), both summed over parts; wall_s, "
        "tokens, prompts, parts, nodes"
    )


class HarvestProgress(BaseModel):
    """Across the harvest's parts, whichever nodes run them."""

    prompts_done: int = 0
    n_prompts: int = 0
    shards_done: int = 0
    n_shards: int = 0
    rows_done: int = Field(0, description="Activation rows (prompt tokens) written to shards")
    n_rows: int = 0
    parts: int = Field(0, description="The parts the harvest was cut into (0 until it starts)")
    parts_done: int = 0
    parts_running: int = 0
    nodes: int = Field(0, description="The nodes running its parts now")
    eta_s: float | None = Field(
        None, description="Seconds left at the speed so far (running, once rows are written)"
    )


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
    progress: HarvestProgress
    result: HarvestResult | None = None
    error: HarvestError | None = None
    urls_expire_at: str | None = None
    urls_expired: bool | None = None
