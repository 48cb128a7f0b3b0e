"""The harvest job kind: every prompt through this node's engine with the capture hooks on its
prompt positions (one generated token, no decode row), the rows read from the workers' capture
files and written as shards; a resumed run continues after the last complete shard.

API server process (run by the job runner). A bounded number of prompts is in the engine at once,
fewer while live traffic runs, each with batch work's engine priority (jobs/batch_share.py), so
the node's interactive requests go first. Each shard is charged to the key's budgets
(its prompt tokens) when it is written: a run killed mid-shard charges nothing for that shard, and
its resume, which runs the shard again, charges it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from ..activations.payload import AcsPayload
from ..activations.store import CaptureError, read_capture, release
from ..auth.principal import Principal
from ..auth.refusals import refusal
from ..errors import AcsError, InternalError, error_body
from ..jobs.batch_share import BatchScheduling
from ..settings import Settings
from ..states import JobStatus
from ..storage.counters import AdmitRequest, Counters, Ticket
from ..storage.errors import BudgetExhausted, LeaseLost, QueueFull
from ..storage.files import FileStore
from ..storage.jobs import Job, JobRepository
from ..storage.usage import UsageRepository, UsageRow
from .inputs import HarvestInput, HarvestRequest, input_name, load_input
from .manifest import Manifest, ShardEntry
from .retention import FILES_KEPT, KIND, job_prefix, sweep_files
from .shards import (
    HarvestedPrompt,
    shard_bytes,
    shard_name,
    state_bytes,
    state_from_bytes,
    stats_bytes,
)
from .stats import LayerStats

logger = logging.getLogger(__name__)

HARVEST_ROUTE = "/v1/harvest"

MANIFEST = "manifest.json"
STATS = "stats.safetensors"


def _state_name(job_id: str, shards_done: int) -> str:
    return f"{job_prefix(job_id)}/_state/stats_{shards_done:05d}.safetensors"


@dataclass(frozen=True)
class HarvestModel:
    """What a harvest needs to know of the model this node serves."""

    id: str
    checkpoint: str
    hidden_size: int
    n_layers: int
    bos_token_id: int | None
    vllm_version: str
    vllm_acs_version: str


class HarvestFailed(Exception):
    def __init__(self, error: AcsError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class _Timings:
    write_s: float = 0.0
    tokens: int = 0
    prompts: int = 0
    started: float = field(default_factory=time.perf_counter)

    def as_dict(self) -> dict[str, float | int]:
        wall = time.perf_counter() - self.started
        return {
            # The run's time with prompts in the engine (its wall time less the writing).
            "forward_s": round(max(0.0, wall - self.write_s), 3),
            "write_s": round(self.write_s, 3),
            "wall_s": round(wall, 3),
            "tokens": self.tokens,
            "prompts": self.prompts,
        }


class HarvestJobKind:
    name = KIND
    result_ttl = FILES_KEPT

    def __init__(
        self,
        engine_client: Any,
        files: FileStore,
        counters: Counters,
        usage: UsageRepository,
        settings: Settings,
        model: Callable[[], HarvestModel],
        principal_now: Callable[[Principal], Any],
        on_charged: Callable[[UsageRow], None] | None = None,
        jobs: JobRepository | None = None,
        batch: BatchScheduling | None = None,
    ) -> None:
        self.engine = engine_client
        self.batch = batch or BatchScheduling(priority_policy=False)
        self.files = files
        self.counters = counters
        self.usage = usage
        self.settings = settings
        self.model = model
        # The submitter now (a key revoked since the submit stops its harvest): an awaitable.
        self.principal_now = principal_now
        # Told of each shard's usage row once it is written (the plugins' acs_usage_recorded).
        self.on_charged = on_charged
        self.jobs = jobs

    async def sweep(self, now: datetime) -> int:
        """The files' retention (harvest/retention.py), from the runner's sweep."""
        if self.jobs is None:
            return 0
        return await sweep_files(self.files, self.jobs, now)

    async def run(self, job: Job, stop: asyncio.Event) -> Any:
        from ..jobs.kinds import JobOutcome, Stopped

        request = HarvestRequest.from_json(job.request or {})
        try:
            outcome = await _Run(self, job, request, stop).run()
        except AcsError as error:
            body = json.dumps(error_body(error, job.id))
            return JobOutcome(JobStatus.FAILED, error.status, body, error.code)
        except HarvestFailed as failed:
            body = json.dumps(error_body(failed.error, job.id))
            return JobOutcome(JobStatus.FAILED, failed.error.status, body, failed.error.code)
        if outcome is None:
            return Stopped()
        return JobOutcome(JobStatus.SUCCEEDED, 200, json.dumps(outcome), None)


class _Run:
    """One attempt of one harvest."""

    def __init__(
        self,
        kind: HarvestJobKind,
        job: Job,
        request: HarvestRequest,
        stop: asyncio.Event,
    ) -> None:
        self.kind = kind
        self.job = job
        self.request = request
        # The submitter as it stands now: read again before each shard is held.
        self.principal = request.principal
        self.stop = stop
        self.model = kind.model()
        self.files = kind.files
        self.prefix = job_prefix(job.id)
        self.timings = _Timings()
        self.in_flight = max(1, kind.settings.harvest_prompts_in_flight)
        # This run's prompts in the engine: all `in_flight` on a quiet node, fewer beside live
        # traffic.
        self.gate = kind.batch.gate(self.in_flight)

    async def run(self) -> dict[str, Any] | None:
        self.principal = await self.kind.principal_now(self.request.principal)
        inputs = await load_input(self.files, input_name(self.job.id))
        manifest, stats = await self._resume_point(inputs)
        size = self.request.shard_size
        buffer: list[HarvestedPrompt] = []
        # Closed however the loop ends, so the prompts still in the engine are aborted at once.
        async with contextlib.aclosing(self._captures(inputs, manifest.prompts_done)) as captures:
            async for prompt in captures:
                if prompt is None:
                    return None  # stopped
                buffer.append(prompt)
                if len(buffer) == size or prompt.index == inputs.n_prompts - 1:
                    if not await self._write_shard(manifest, stats, buffer):
                        return None  # stopped while waiting for the key's slot
                    buffer = []
        manifest.complete = True
        await self.files.write(f"{self.prefix}/{MANIFEST}", manifest.to_bytes())
        return {
            "n_shards": len(manifest.shards),
            "layer_indices": manifest.layer_indices,
            "files": [shard.file for shard in manifest.shards],
            "n_tokens": manifest.n_tokens,
            "timings": self.timings.as_dict(),
        }

    async def _resume_point(self, inputs: HarvestInput) -> tuple[Manifest, LayerStats]:
        layers = self.request.layers
        try:
            manifest = Manifest.from_bytes(await self.files.read(f"{self.prefix}/{MANIFEST}"))
        except FileNotFoundError:
            manifest = None
        if manifest is not None and manifest.shards:
            saved = await self.files.read(_state_name(self.job.id, len(manifest.shards)))
            state = await asyncio.to_thread(state_from_bytes, saved)
            logger.info(
                "harvest %s resumes after shard %d (%d prompts done)",
                self.job.id,
                len(manifest.shards) - 1,
                manifest.prompts_done,
            )
            return manifest, LayerStats.from_state(state)
        model = self.model
        manifest = Manifest(
            job_id=self.job.id,
            model=model.id,
            checkpoint=model.checkpoint,
            tokenizer=model.checkpoint,
            hidden_size=model.hidden_size,
            n_model_layers=model.n_layers,
            layer_indices=list(layers),
            n_prompts=inputs.n_prompts,
            shard_size=self.request.shard_size,
            max_prompt_tokens=self.request.max_prompt_tokens,
            truncated_prompts=list(self.request.truncated),
            bos_token_id=model.bos_token_id,
            vllm_version=model.vllm_version,
            vllm_acs_version=model.vllm_acs_version,
        )
        return manifest, LayerStats(len(layers), model.hidden_size)

    async def _captures(
        self, inputs: HarvestInput, start: int
    ) -> AsyncIterator[HarvestedPrompt | None]:
        """The prompts from `start` on, in order, at most `in_flight` in the engine at once.
        Yields None (and stops) when the job is stopped."""
        pending: dict[int, asyncio.Task[HarvestedPrompt]] = {}
        next_start = start
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            for index in range(start, inputs.n_prompts):
                while next_start < inputs.n_prompts and len(pending) < self.in_flight:
                    tokens = inputs.prompt(next_start)
                    pending[next_start] = asyncio.ensure_future(self._capture(next_start, tokens))
                    next_start += 1
                task = pending.pop(index)
                await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():
                    task.cancel()
                    yield None
                    return
                yield task.result()
        finally:
            stopped.cancel()
            for task in pending.values():
                task.cancel()
            if pending:
                await asyncio.gather(*pending.values(), return_exceptions=True)

    async def _capture(self, index: int, tokens: np.ndarray) -> HarvestedPrompt:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        capture_id = f"hv-{self.job.id}-{self.job.attempt}-{index}-{uuid.uuid4().hex[:6]}"
        payload = AcsPayload(capture_id=capture_id, capture_layers=tuple(self.request.layers))
        params = SamplingParams(
            max_tokens=1, temperature=0.0, detokenize=False, extra_args=payload.to_extra_args()
        )
        root = self.kind.settings.capture_dir
        priority = self.kind.batch.priority
        extra = {} if priority is None else {"priority": priority}
        try:
            final = None
            prompt = TokensPrompt(prompt_token_ids=tokens.tolist())
            async with self.gate.slot():
                async for output in self.kind.engine.generate(prompt, params, capture_id, **extra):
                    final = output
            if final is None or not final.finished:
                raise HarvestFailed(InternalError("The engine ended a harvest prompt early."))
            bits = await asyncio.to_thread(
                read_capture,
                capture_id,
                n_layers=len(self.request.layers),
                hidden=self.model.hidden_size,
                n_rows=int(tokens.shape[0]),
                root=root,
            )
        except CaptureError as error:
            logger.error("harvest %s prompt %d: %s", self.job.id, index, error)
            raise HarvestFailed(
                InternalError("A harvest prompt's capture came back incomplete; retry the job.")
            ) from None
        finally:
            release(capture_id, root=root)
        return HarvestedPrompt(index=index, tokens=tokens.astype(np.int32), bits=bits)

    async def _write_shard(
        self, manifest: Manifest, stats: LayerStats, prompts: list[HarvestedPrompt]
    ) -> bool:
        """Holds, writes and charges one shard; False when the job was stopped first."""
        number = len(manifest.shards)
        n_tokens = sum(p.n_tokens for p in prompts)
        ticket = await self._hold(n_tokens)
        if ticket is None:
            return False
        started = time.perf_counter()
        try:
            entry = await self._write_files(manifest, stats, prompts, number)
        except BaseException:
            await asyncio.shield(self.kind.counters.settle(ticket, 0, 0))
            raise
        row = UsageRow(
            route=HARVEST_ROUTE,
            status=200,
            latency_ms=int((time.perf_counter() - started) * 1000),
            prompt_tokens=n_tokens,
            request_id=f"{self.job.id}-shard-{number:05d}",
            key_id=self.principal.key_id,
            key_prefix=self.principal.key_prefix,
            account_id=self.principal.account_id,
            model=self.model.id,
        )
        try:
            # Before the manifest lists the shard, and once: a crash in between runs the shard
            # again, which finds its row and charges nothing more.
            charged = await self.kind.usage.insert_once(row)
        except BaseException:
            await asyncio.shield(self.kind.counters.settle(ticket, 0, 0))
            raise
        await asyncio.shield(self.kind.counters.settle(ticket, n_tokens if charged else 0, 0))
        if charged and self.kind.on_charged is not None:
            self.kind.on_charged(row)
        await self._list_shard(manifest, entry)
        self.timings.write_s += time.perf_counter() - started
        self.timings.tokens += n_tokens
        self.timings.prompts += len(prompts)
        logger.info("harvest %s wrote %s (%d bytes)", self.job.id, entry.file, entry.bytes)
        return True

    async def _hold(self, n_tokens: int) -> Ticket | None:
        """The shard's tokens held on every budget and the key's running slot while it is
        written, as the key stands now (revoked since the submit: the harvest fails with that
        401). A budget that cannot hold them fails it with `budget_exceeded`; slots taken mean
        waiting. None when the job was stopped meanwhile."""
        counters = self.kind.counters
        while True:
            self.principal = await self.kind.principal_now(self.request.principal)
            request = AdmitRequest(
                principal=self.principal,
                prompt_tokens=n_tokens,
                choices=1,
                max_tokens=1,  # a Hold has room for one token; the settle charges none
                count_start=False,
                allow_clamp=False,
            )
            try:
                ticket = await counters.admit(request)
            except BudgetExhausted as error:
                raise HarvestFailed(refusal(error)) from None
            except QueueFull as error:
                if await self._stopped_within(error.retry_after_ms / 1000):
                    return None
                continue
            if ticket.running:
                return ticket
            waiter = asyncio.ensure_future(counters.wait_for_slot(ticket))
            stopped = asyncio.ensure_future(self.stop.wait())
            try:
                await asyncio.wait({waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
            if not waiter.done():
                waiter.cancel()
                await asyncio.shield(counters.settle(ticket, 0, 0))
                return None
            try:
                waiter.result()
                return ticket
            except LeaseLost:  # the wait outlived its lease (a stalled loop): queue again
                await asyncio.shield(counters.settle(ticket, 0, 0))

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.stop.wait(), max(0.1, seconds))
            return True
        except TimeoutError:
            return False

    async def _write_files(
        self, manifest: Manifest, stats: LayerStats, prompts: list[HarvestedPrompt], number: int
    ) -> ShardEntry:
        """Shard, statistics state, stats.safetensors (then the charge, then the manifest that
        lists the shard): a crash between any two leaves the manifest naming complete shards."""
        shard, state, final = await asyncio.to_thread(self._encode_shard, manifest, stats, prompts)
        name = shard_name(number)
        stored = await self.files.write(f"{self.prefix}/{name}", shard)
        await self.files.write(_state_name(self.job.id, number + 1), state)
        await self.files.write(f"{self.prefix}/{STATS}", final)
        entry = ShardEntry(
            file=name,
            first_prompt=prompts[0].index,
            last_prompt=prompts[-1].index,
            n_tokens=sum(p.n_tokens for p in prompts),
            bytes=stored.size,
        )
        return entry

    def _encode_shard(
        self, manifest: Manifest, stats: LayerStats, prompts: list[HarvestedPrompt]
    ) -> tuple[bytes, bytes, bytes]:
        """The shard's bytes, the statistics state and stats.safetensors with its prompts added
        (CPU work: in a worker thread)."""
        bos = self.model.bos_token_id
        for prompt in prompts:
            rows = prompt.as_float32()
            if bos is not None and prompt.n_tokens and int(prompt.tokens[0]) == bos:
                stats.add(rows[:, 1:], rows[:, :1])
            else:
                stats.add(rows)
        return (
            shard_bytes(prompts),
            state_bytes(stats.to_state()),
            stats_bytes(stats.final(), manifest.layer_indices),
        )

    async def _list_shard(self, manifest: Manifest, entry: ShardEntry) -> None:
        manifest.shards.append(entry)
        await self.files.write(f"{self.prefix}/{MANIFEST}", manifest.to_bytes())
