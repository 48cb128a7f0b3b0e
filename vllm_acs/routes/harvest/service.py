"""Submitting, reading (with long-poll), cancelling harvests, scoped to the caller's key, and
checking the signed downloads of their files.

API server process. The limits that refuse a submit whatever its body (the key's running
harvest, an exhausted budget, the deployment's capacity, the monthly quota) are checked before the
body is read (`refuse_early`); then it is parsed and tokenized off the event loop (bodies up to
50 MB), checked against the key's budgets for its prompt tokens, its prompts stored as a file, and
the job written with its idempotency answer under the harvest limits in one transaction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ...auth.principal import Principal
from ...auth.refusals import refusal
from ...contract.bounded_json import loads_bounded
from ...contract.harvest_request import MAX_HARVEST_TOKENS, HarvestBody, parse_harvest_body
from ...errors import (
    AcsError,
    DownloadRefused,
    HarvestCapacity,
    HarvestConcurrency,
    HarvestNotCancellable,
    HarvestNotFound,
    HarvestQuota,
    HarvestUnsupported,
    InvalidRequest,
    UnknownModel,
    echoed,
)
from ...harvest.download_urls import UrlRefused, UrlSigner
from ...harvest.inputs import HarvestRequest, PreparedPrompts, prepare_prompts, save_input
from ...harvest.job import FILES_KEPT, KIND, MANIFEST, STATS, job_prefix
from ...harvest.layers import LayerChoiceError, resolve_layers
from ...harvest.manifest import Manifest
from ...served_model import NodeModels, ServedModel
from ...settings import Settings
from ...states import JobStatus
from ...storage import Storage
from ...storage.counters import AdmitRequest
from ...storage.errors import BudgetExhausted, HarvestLimitReached, QueueFull, StartsExhausted
from ...storage.files import FileNameError, FileStore, check_name
from ...storage.idempotency import IdempotencyTarget, StoredAnswer
from ...storage.jobs import Job, NewJob
from ...storage.periods import budget_lines, counter_with_period, hold
from ..answers import Answer
from ..long_poll import DECLINED_HEADERS, LONG_POLL_MAX_S
from .protocol import (
    STATE_OF_JOB,
    HarvestError,
    HarvestJob,
    HarvestProgress,
    HarvestResult,
    HarvestSubmitted,
)

HARVEST_PATH = "/v1/harvest"
DOWNLOADS_PATH = "/downloads"
URL_LIFETIME = FILES_KEPT
LONG_POLL_STEP_S = 0.5
PUBLIC_FILES = (MANIFEST, STATS)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat()


class HarvestService:
    """Bound to storage, the runner and the URL signer once the engine is up (`bind`)."""

    def __init__(self, models: NodeModels, settings: Settings, clock: Callable[[], datetime]):
        self.models = models
        self.settings = settings
        self.clock = clock
        self.storage: Storage | None = None
        self.runner: Any = None
        self.signer: UrlSigner | None = None
        self.long_polls = 0

    def bind(self, storage: Storage, runner: Any, signer: UrlSigner) -> None:
        self.storage, self.runner, self.signer = storage, runner, signer

    @property
    def files(self) -> FileStore:
        return self._storage.files

    @property
    def _storage(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("vllm_acs harvests: storage is not open (init_state did not run)")
        return self.storage

    # --- submit -------------------------------------------------------------------------------

    async def refuse_early(self, principal: Principal) -> None:
        """Raises the refusal that any body would meet now, in the order a full submit names
        them: a few indexed reads, before a body of up to 50 MB is read, parsed and tokenized
        (seconds of a CPU). Only a pre-check: `submit` checks each again, the harvest limits under
        their lock."""
        storage = self._storage
        # The key's running harvest first: that answer says more than its slots or budgets would.
        if await storage.harvests.unfinished(principal.key_id) >= 1:
            raise _limit_error(HarvestLimitReached("concurrency", 1))
        await self._refuse_spent_budget(principal)
        capacity = max(1, self.settings.harvest_capacity)
        if await storage.harvests.unfinished_in_deployment() >= capacity:
            raise _limit_error(HarvestLimitReached("capacity", capacity))
        quota = self.settings.harvest_monthly_quota
        if quota is not None:
            used = await storage.harvests.used_this_month(principal.key_id, self.clock())
            if used >= quota:
                raise _limit_error(HarvestLimitReached("quota", quota))

    async def _refuse_spent_budget(self, principal: Principal) -> None:
        """A budget that cannot hold even the smallest harvest (one prompt token and the one
        generated token) refuses it as the full check would."""
        lines = budget_lines(principal)
        if not lines:
            return
        now = self.clock()
        names = [counter_with_period(line.counter, line.granularity, now) for line in lines]
        state = await self._storage.counters.budget_state(names)
        for line, name in zip(lines, names, strict=True):
            counter = state.get(name)
            if counter is not None and counter.committed + hold(line.kind, 1, 1) > line.limit:
                raise refusal(BudgetExhausted(line.name))

    async def submit(
        self, raw: bytes, principal: Principal, idempotency: IdempotencyTarget | None
    ) -> Answer:
        """The harvest of `raw`, queued; `refuse_early` was asked before `raw` was read."""
        body, model, layers, prepared = await asyncio.to_thread(self._prepared, raw)
        storage = self._storage
        await self._check_budget(principal, prepared.inputs.n_tokens)
        now = self.clock()
        request = HarvestRequest(
            principal=principal,
            layers=layers,
            shard_size=body.shard_size,
            batch_size=body.batch_size,
            n_prompts=prepared.inputs.n_prompts,
            n_tokens=prepared.inputs.n_tokens,
            max_prompt_tokens=model.max_model_len - 1,
            truncated=prepared.truncated,
        )
        job = NewJob(
            kind=KIND,
            key_id=principal.key_id,
            account_id=principal.account_id,
            model=model.id,
            request=request.to_json(),
            max_attempts=self.settings.job_max_attempts,
        )
        shown = HarvestSubmitted(
            job_id=job.id,
            status="pending",
            model=model.id,
            n_prompts=request.n_prompts,
            created_at=_iso(now) or "",
        ).model_dump()
        location = f"{HARVEST_PATH}/{job.id}"
        answer = StoredAnswer(
            202, json.dumps(shown), {"content-type": "application/json", "location": location}
        )
        # The prompts first: a job row never exists without its input file.
        await save_input(storage.files, job.id, prepared.inputs)
        try:
            await storage.harvests.submit(
                job,
                now,
                per_key=1,
                capacity=max(1, self.settings.harvest_capacity),
                monthly_quota=self.settings.harvest_monthly_quota,
                idempotency=idempotency,
                answer=answer if idempotency is not None else None,
            )
        except BaseException as error:
            await storage.files.delete_tree(job_prefix(job.id))
            if isinstance(error, HarvestLimitReached):
                raise _limit_error(error) from None
            raise
        if self.runner is not None:
            self.runner.wake()
        return Answer(202, answer.body, {"location": location})

    def _prepared(
        self, raw: bytes
    ) -> tuple[HarvestBody, ServedModel, tuple[int, ...], PreparedPrompts]:
        body = parse_harvest_body(loads_bounded(raw))
        model = self.models.get(body.model)
        if model is None:
            raise UnknownModel(f"The model '{echoed(body.model)}' does not exist.", param="model")
        if model.n_layers <= 0 or model.hidden_size <= 0:
            raise HarvestUnsupported(
                f"The model '{model.id}' cannot be harvested on this node.", param="model"
            )
        try:
            layers = resolve_layers(body.layers, model.n_layers)
        except LayerChoiceError as error:
            raise InvalidRequest(str(error), param="layers") from None
        for index, prompt in enumerate(body.prompts):
            if isinstance(prompt, list) and model.vocab_size and max(prompt) >= model.vocab_size:
                raise InvalidRequest(
                    f"Prompt {index} has a token id past the vocabulary ({model.vocab_size}).",
                    param=f"prompts.{index}",
                )
        prepared = prepare_prompts(
            body.prompts, self.models.tokenizer(model.id), model.max_model_len - 1
        )
        if prepared.inputs.n_tokens > MAX_HARVEST_TOKENS:
            raise InvalidRequest(
                f"The prompts come to {prepared.inputs.n_tokens} tokens; a harvest takes at most "
                f"{MAX_HARVEST_TOKENS}. Split the corpus into several harvests.",
                param="prompts",
            )
        return body, model, layers, prepared

    async def _check_budget(self, principal: Principal, n_tokens: int) -> None:
        """The prompt tokens must fit every budget now (each shard is held again as it is
        written); a submit also takes one of the key's starts."""
        counters = self._storage.counters
        try:
            ticket = await counters.admit(
                AdmitRequest(
                    principal=principal,
                    prompt_tokens=n_tokens,
                    choices=1,
                    max_tokens=1,
                    allow_clamp=False,
                )
            )
        except (BudgetExhausted, StartsExhausted, QueueFull) as error:
            raise refusal(error) from None
        await asyncio.shield(counters.settle(ticket, 0, 0))

    # --- read, cancel -------------------------------------------------------------------------

    async def get(self, job_id: str, principal: Principal) -> Job:
        job = await self._storage.jobs.get(job_id, principal.key_id)
        if job is None or job.kind != KIND:
            raise HarvestNotFound(
                f"No harvest {echoed(job_id)!r} for this API key.", param="job_id"
            )
        return job

    async def read(
        self, job_id: str, principal: Principal, wait_s: int | None, base_url: str
    ) -> Answer:
        job = await self.get(job_id, principal)
        headers: dict[str, str] = {}
        if wait_s and not job.ended:
            if self.long_polls >= self.settings.harvest_long_polls:
                headers = dict(DECLINED_HEADERS)
            else:
                job = await self._wait_for_change(job, principal, wait_s)
        shown = await self.harvest_object(job, base_url)
        return Answer(200, shown, headers)

    async def _wait_for_change(self, job: Job, principal: Principal, wait_s: int) -> Job:
        self.long_polls += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + min(wait_s, LONG_POLL_MAX_S)
            while loop.time() < deadline:
                step = min(LONG_POLL_STEP_S, max(0.0, deadline - loop.time()))
                await self._ended_within(job.id, step)
                now = await self.get(job.id, principal)
                if now.status != job.status:
                    return now
            return job
        finally:
            self.long_polls -= 1

    async def _ended_within(self, job_id: str, seconds: float) -> None:
        """Returns after `seconds`, or at once when this node's runner ends the harvest (its
        watch; the harvest ended elsewhere is seen by the next read)."""
        if self.runner is None:
            await asyncio.sleep(seconds)
        else:
            await self.runner.watch.wait_ended(job_id, seconds)

    async def cancel(self, job_id: str, principal: Principal, base_url: str) -> Answer:
        before = await self.get(job_id, principal)
        job = before
        if before.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            job = await self._storage.jobs.cancel(job_id, principal.key_id, self.clock()) or job
        if job.status != JobStatus.CANCELLED or before.status == JobStatus.CANCELLED:
            raise HarvestNotCancellable(
                f"The harvest has already ended (status {STATE_OF_JOB[job.status]}); only a "
                "pending or running harvest can be cancelled."
            )
        # Its parts too: those running here stop now, elsewhere at their next lease renewal.
        await self._storage.jobs.cancel_parts(job.id, self.clock())
        if self.runner is not None:
            self.runner.stop_job(job.id)
            for part in await self._storage.jobs.parts_of(job.id):
                self.runner.stop_job(part.id)
        return Answer(200, await self.harvest_object(job, base_url), {})

    async def harvest_object(self, job: Job, base_url: str) -> dict[str, Any]:
        request = job.request or {}
        manifest = await self._manifest(job.id) if job.status == JobStatus.SUCCEEDED else None
        n_prompts = int(request.get("n_prompts", manifest.n_prompts if manifest else 0))
        shown = HarvestJob(
            job_id=job.id,
            status=STATE_OF_JOB[job.status],
            model=job.model,
            n_prompts=n_prompts,
            layer_indices=list(request.get("layers", manifest.layer_indices if manifest else [])),
            created_at=_iso(job.created_at) or "",
            started_at=_iso(job.started_at),
            finished_at=_iso(job.finished_at) if job.ended else None,
            progress=await self._progress(job, manifest),
        )
        if job.ended and job.result_body:
            result = json.loads(job.result_body)
            if job.status == JobStatus.SUCCEEDED:
                await self._add_result(shown, job, result, base_url)
            elif isinstance(result.get("error"), dict):
                error = result["error"]
                shown.error = HarvestError(code=error.get("code"), message=error.get("message", ""))
        return shown.model_dump(exclude_none=True)

    async def _add_result(
        self, shown: HarvestJob, job: Job, result: dict[str, Any], base_url: str
    ) -> None:
        assert self.signer is not None and job.finished_at is not None
        signer, now = self.signer, self.clock()
        expires_at = job.finished_at + URL_LIFETIME

        names = [MANIFEST, STATS, *result["files"]]
        # The store's own URLs when it has them (S3: presigned now, for min(ended + 7 days,
        # now + 7 days)); else, and once expired, the node's signed /downloads URLs.
        urls = None
        if now < expires_at:
            stored = [f"{job_prefix(job.id)}/{name}" for name in names]
            urls = await self.files.download_urls(stored, expires_at, now)
        if urls is None:
            urls = [
                base_url + signer.sign(f"{DOWNLOADS_PATH}/{job.id}/{name}", expires_at)
                for name in names
            ]
        shown.result = HarvestResult(
            n_shards=result["n_shards"],
            layer_indices=result["layer_indices"],
            manifest_url=urls[0],
            shard_urls=urls[2:],
            stats_url=urls[1],
            timings=result.get("timings", {}),
        )
        shown.urls_expire_at = _iso(expires_at)
        shown.urls_expired = now >= expires_at

    async def _progress(self, job: Job, manifest: Manifest | None) -> HarvestProgress:
        """Across the harvest's parts, whichever nodes run them (a done harvest: its manifest)."""
        request = job.request or {}
        n_prompts = int(request.get("n_prompts", 0))
        shard_size = max(1, int(request.get("shard_size", 1)))
        progress = HarvestProgress(
            n_prompts=n_prompts,
            n_shards=-(-n_prompts // shard_size),
            n_rows=int(request.get("n_tokens", 0)),
        )
        if manifest is not None and manifest.complete:
            progress.prompts_done = manifest.prompts_done
            progress.shards_done = len(manifest.shards)
            progress.rows_done = manifest.n_tokens
            progress.n_prompts = progress.n_prompts or manifest.n_prompts
            progress.n_shards = progress.shards_done
            progress.n_rows = progress.n_rows or manifest.n_tokens
        parts = await self._storage.jobs.parts_of(job.id)
        if parts:
            progress.parts = len(parts)
            progress.parts_done = sum(p.status == JobStatus.SUCCEEDED for p in parts)
            running = [p for p in parts if p.status == JobStatus.RUNNING]
            progress.parts_running = len(running)
            progress.nodes = len({p.owner for p in running if p.owner})
        if manifest is None or not manifest.complete:
            for part in parts:
                done = part.progress or {}
                progress.prompts_done += int(done.get("prompts_done", 0))
                progress.shards_done += int(done.get("shards_done", 0))
                progress.rows_done += int(done.get("rows_done", 0))
        if job.status == JobStatus.RUNNING and job.started_at and progress.rows_done > 0:
            elapsed = (self.clock() - job.started_at).total_seconds()
            left = max(0, progress.n_rows - progress.rows_done)
            progress.eta_s = round(max(0.0, elapsed) * left / progress.rows_done, 1)
        return progress

    async def _manifest(self, job_id: str) -> Manifest | None:
        try:
            data = await self._storage.files.read(f"{job_prefix(job_id)}/{MANIFEST}")
        except FileNotFoundError:
            return None
        return Manifest.from_bytes(data)

    # --- downloads ----------------------------------------------------------------------------

    async def download_name(
        self, job_id: str, file_name: str, expires: str | None, signature: str | None
    ) -> str:
        """The stored file a signed URL names; DownloadRefused otherwise."""
        assert self.signer is not None
        try:
            self.signer.check(
                f"{DOWNLOADS_PATH}/{job_id}/{file_name}", expires, signature, self.clock()
            )
        except UrlRefused as refused:
            raise DownloadRefused(refused.reason) from None
        public = file_name in PUBLIC_FILES or (
            file_name.startswith("shard_") and file_name.endswith(".safetensors")
        )
        name = f"{job_prefix(job_id)}/{file_name}"
        try:
            check_name(name)
        except FileNameError:
            public = False
        if not public or await self._storage.files.size(name) is None:
            raise HarvestNotFound("No such harvest file (it may have been deleted).")
        return name


def _limit_error(error: HarvestLimitReached) -> AcsError:
    if error.limit == "concurrency":
        return HarvestConcurrency(
            "This API key has a harvest that has not ended; one runs at a time per key. Poll "
            "it until it ends, or cancel it."
        )
    if error.limit == "capacity":
        return HarvestCapacity(
            f"This deployment has {error.value} harvests that have not ended, the most it takes "
            "at once; try again later."
        )
    return HarvestQuota(f"This API key has used its {error.value} harvests for this month (UTC).")
