"""The harvest job kind: cuts a harvest into parts (harvest/parts.py) that any node serving its
model claims and runs (harvest/part_run.py), waits for them, and merges their files into the
harvest's manifest and statistics (harvest/merge.py).

API server process (run by the job runner of any node serving the model). The harvest's own job
does no engine work: it queues the parts (again, harmlessly, when it is resumed on another node
after its node died), looks at them every `PARTS_POLL_S`, and ends as they end. A part that
fails fails the harvest with the part's error and cancels the rest; a part whose node died is
taken back by the reaper like any job and resumed after its last complete shard. A single-node
deployment runs the same way: its one runner claims every part.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime
from typing import Any

from ..errors import InternalError, error_body
from ..jobs.runner import utc_now
from ..states import JobStatus
from ..storage.jobs import ATTEMPTS_EXHAUSTED, Job, NewJob
from .context import HarvestContext, HarvestFailed, HarvestModel
from .inputs import HarvestRequest
from .manifest import Manifest
from .merge import MANIFEST, STATS, merge_parts
from .part_run import HarvestPartKind, part_request
from .parts import PART_KIND, PartPlan, part_id, plan_parts
from .retention import FILES_KEPT, KIND, job_prefix, sweep_files

__all__ = [
    "FILES_KEPT",
    "KIND",
    "MANIFEST",
    "PART_KIND",
    "STATS",
    "HarvestContext",
    "HarvestFailed",
    "HarvestJobKind",
    "HarvestModel",
    "HarvestPartKind",
    "job_prefix",
]

logger = logging.getLogger(__name__)

# How often a running harvest looks at its parts (one indexed read).
PARTS_POLL_S = 0.5
_FAILED = (JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED)


class HarvestJobKind:
    name = KIND
    result_ttl = FILES_KEPT

    def __init__(self, context: HarvestContext, poll_s: float = PARTS_POLL_S) -> None:
        self.context = context
        self.poll_s = poll_s

    async def sweep(self, now: datetime) -> int:
        """The files' retention (harvest/retention.py), from the runner's sweep."""
        return await sweep_files(self.context.files, self.context.jobs, now)

    def plan(self, request: HarvestRequest) -> list[PartPlan]:
        return plan_parts(
            request.n_prompts, request.shard_size, self.context.settings.harvest_part_shards
        )

    async def run(self, job: Job, stop: asyncio.Event) -> Any:
        from ..jobs.kinds import JobOutcome, Stopped

        started = time.perf_counter()
        request = HarvestRequest.from_json(job.request or {})
        plans = self.plan(request)
        await self._queue_parts(job, plans)
        while True:
            try:
                parts = await self.context.jobs.parts_of(job.id)
            except Exception:
                # A database outage: the parts run on; look again (the lease keeps the harvest).
                logger.warning("harvest %s: reading its parts failed", job.id, exc_info=True)
                if await self._stopped_or_part_ended([], stop):
                    return Stopped()
                continue
            failed = [part for part in parts if part.status in _FAILED]
            if failed:
                now = await self.context.jobs.get(job.id)
                if stop.is_set() or now is None or now.status != JobStatus.RUNNING:
                    return Stopped()  # the harvest was cancelled: its parts with it
                await self.context.jobs.cancel_parts(job.id, utc_now())
                return _failure(job, failed[0])
            if len(parts) == len(plans) and all(p.status == JobStatus.SUCCEEDED for p in parts):
                break
            if await self._stopped_or_part_ended(parts, stop):
                return Stopped()  # cancelled (its parts were too), or the server is stopping
        try:
            manifest = await merge_parts(
                self.context.files, job.id, plans, self._manifest(job, request)
            )
        except HarvestFailed as failed:
            body = json.dumps(error_body(failed.error, job.id))
            return JobOutcome(JobStatus.FAILED, failed.error.status, body, failed.error.code)
        return JobOutcome(
            JobStatus.SUCCEEDED,
            200,
            json.dumps(_result(manifest, parts, time.perf_counter() - started)),
            None,
        )

    async def _stopped_or_part_ended(self, parts: list[Job], stop: asyncio.Event) -> bool:
        """Waits up to `poll_s` for a running part to end (at once when it ends on this node,
        through the runner's watch) or for `stop`; True when stopped."""
        waits = [asyncio.ensure_future(stop.wait())]
        wait_ended = self.context.wait_ended
        if wait_ended is not None:
            running = [part.id for part in parts if part.status == JobStatus.RUNNING]
            waits += [asyncio.ensure_future(wait_ended(id_, self.poll_s)) for id_ in running]
        try:
            await asyncio.wait(waits, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return stop.is_set()

    async def _queue_parts(self, job: Job, plans: list[PartPlan]) -> None:
        parts = [
            NewJob(
                kind=PART_KIND,
                key_id=job.key_id,
                account_id=job.account_id,
                model=job.model,
                request=part_request(job.id, plan),
                max_attempts=job.max_attempts,
                id=part_id(job.id, plan.index),
                parent_id=job.id,
            )
            for plan in plans
        ]
        added = await self.context.jobs.add_parts(parts, utc_now())
        if added:
            logger.info("harvest %s: %d part(s) queued", job.id, added)
            self.context.wake_runner()

    def _manifest(self, job: Job, request: HarvestRequest) -> Manifest:
        model = self.context.model()
        return Manifest(
            job_id=job.id,
            model=model.id,
            checkpoint=model.checkpoint,
            tokenizer=model.checkpoint,
            hidden_size=model.hidden_size,
            n_model_layers=model.n_layers,
            layer_indices=list(request.layers),
            n_prompts=request.n_prompts,
            shard_size=request.shard_size,
            max_prompt_tokens=request.max_prompt_tokens,
            truncated_prompts=list(request.truncated),
            bos_token_id=model.bos_token_id,
            vllm_version=model.vllm_version,
            vllm_acs_version=model.vllm_acs_version,
        )


def _failure(job: Job, part: Job) -> Any:
    """The harvest fails as its first failed part did, its error now naming the harvest."""
    from ..jobs.kinds import JobOutcome

    body = None
    if part.result_body:
        try:
            body = json.loads(part.result_body)
        except ValueError:
            body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body["request_id"] = job.id
        return JobOutcome(JobStatus.FAILED, part.result_status, json.dumps(body), part.error_code)
    if part.error_code == ATTEMPTS_EXHAUSTED:
        message = (
            f"A part of the harvest was taken back from {part.attempt} node(s) that stopped "
            "answering, the most it may be; retry the harvest."
        )
    else:
        message = f"A part of the harvest ended {part.status.value}; retry the harvest."
    error = InternalError(message)
    body = error_body(error, job.id)
    return JobOutcome(
        JobStatus.FAILED, error.status, json.dumps(body), part.error_code or error.code
    )


def _result(manifest: Manifest, parts: list[Job], wall_s: float) -> dict[str, Any]:
    timings: dict[str, Any] = {"forward_s": 0.0, "write_s": 0.0, "tokens": 0, "prompts": 0}
    for part in parts:
        part_timings = json.loads(part.result_body or "{}").get("timings", {})
        for name in timings:
            timings[name] += part_timings.get(name, 0)
    timings["forward_s"] = round(timings["forward_s"], 3)
    timings["write_s"] = round(timings["write_s"], 3)
    timings["wall_s"] = round(wall_s, 3)
    timings["parts"] = len(parts)
    # The processes that ran its parts' last attempts (a restart is a new one).
    timings["nodes"] = len({part.owner for part in parts if part.owner})
    return {
        "n_shards": len(manifest.shards),
        "layer_indices": manifest.layer_indices,
        "files": [shard.file for shard in manifest.shards],
        "n_tokens": manifest.n_tokens,
        "timings": timings,
    }
