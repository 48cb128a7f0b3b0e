"""The harvest part kind: one part's prompts (a range of the harvest's shards) through this node's
engine with the capture hooks on their prompt positions (one generated token, no decode row),
the rows read from the workers' capture files and written as the harvest's shards; a resumed
part continues after its last complete shard.

API server process (run by the job runner on any node serving the harvest's model). This node's
harvest prompts in the engine are bounded by one gate whatever part they belong to, fewer while
live traffic runs, each with batch work's engine priority (jobs/batch_share.py), so the node's
interactive requests go first. Each shard is charged to the key's budgets (its prompt tokens)
when it is written, under a request id made of the harvest's id and the shard's number: a part
killed mid-shard charges nothing for that shard, and its resume, on whichever node, charges it
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..activations.payload import AcsPayload
from ..activations.store import CaptureError, read_capture, release
from ..auth.refusals import refusal
from ..errors import AcsError, InternalError, error_body
from ..jobs.runner import utc_now
from ..states import JobStatus
from ..storage.counters import AdmitRequest, Ticket
from ..storage.errors import BudgetExhausted, LeaseLost, QueueFull
from ..storage.jobs import Job
from ..storage.usage import UsageRow
from .context import HarvestContext, HarvestFailed
from .inputs import HarvestInput, HarvestRequest
from .manifest import ShardEntry
from .parts import PART_KIND, PartManifest, PartPlan, part_manifest_name, part_state_name
from .retention import job_prefix
from .shards import HarvestedPrompt, shard_bytes, shard_name, state_bytes, state_from_bytes
from .stats import LayerStats

logger = logging.getLogger(__name__)

HARVEST_ROUTE = "/v1/harvest"


@dataclass
class PartTimings:
    write_s: float = 0.0
    write_wait_s: float = 0.0
    tokens: int = 0
    prompts: int = 0
    started: float = field(default_factory=time.perf_counter)

    def as_dict(self) -> dict[str, float | int]:
        wall = time.perf_counter() - self.started
        return {
            # The part's time with prompts in the engine: its wall time less the waits for a
            # shard's write (shards are written while the next one's prompts run).
            "forward_s": round(max(0.0, wall - self.write_wait_s), 3),
            "write_s": round(self.write_s, 3),
            "wall_s": round(wall, 3),
            "tokens": self.tokens,
            "prompts": self.prompts,
        }


def part_request(harvest_id: str, plan: PartPlan) -> dict[str, Any]:
    """A part's job request: its harvest and its range (the rest is the harvest's request)."""
    return {"harvest_id": harvest_id, "plan": plan.to_json()}


class HarvestPartKind:
    name = PART_KIND

    def __init__(self, context: HarvestContext) -> None:
        self.context = context

    async def run(self, job: Job, stop: asyncio.Event) -> Any:
        from ..jobs.kinds import JobOutcome, Stopped

        raw = job.request or {}
        harvest = await self.context.jobs.get(str(raw.get("harvest_id")))
        if harvest is None or harvest.ended or harvest.request is None:
            # Cancelled, failed or swept meanwhile: nothing is left to do for it.
            return JobOutcome(JobStatus.CANCELLED)
        plan = PartPlan.from_json(raw["plan"])
        request = HarvestRequest.from_json(harvest.request)
        try:
            timings = await PartRun(self.context, harvest.id, job, plan, request, stop).run()
        except AcsError as error:
            body = json.dumps(error_body(error, job.id))
            return JobOutcome(JobStatus.FAILED, error.status, body, error.code)
        except HarvestFailed as failed:
            body = json.dumps(error_body(failed.error, job.id))
            return JobOutcome(JobStatus.FAILED, failed.error.status, body, failed.error.code)
        if timings is None:
            return Stopped()
        body = json.dumps({"part": plan.index, "timings": timings})
        return JobOutcome(JobStatus.SUCCEEDED, 200, body, None)


class PartRun:
    """One attempt of one part of one harvest."""

    def __init__(
        self,
        context: HarvestContext,
        harvest_id: str,
        job: Job,
        plan: PartPlan,
        request: HarvestRequest,
        stop: asyncio.Event,
    ) -> None:
        self.context = context
        self.harvest_id = harvest_id
        self.job = job
        self.plan = plan
        self.request = request
        # The submitter as it stands now: read again before each shard is held.
        self.principal = request.principal
        self.stop = stop
        self.model = context.model()
        self.files = context.files
        self.prefix = job_prefix(harvest_id)
        self.timings = PartTimings()
        self.in_flight = max(1, context.settings.harvest_prompts_in_flight)

    async def run(self) -> dict[str, float | int] | None:
        """The part's timings once all its shards are written; None when it was stopped."""
        self.principal = await self.context.principal_now(self.request.principal)
        inputs = await self.context.inputs(self.harvest_id)
        manifest, stats = await self._resume_point()
        await self._report(manifest)
        size = self.request.shard_size
        last = self.plan.end_prompt - 1
        buffer: list[HarvestedPrompt] = []
        # The shard being written while the next one's prompts run in the engine: one at a
        # time, in order, so the part's manifest only ever names complete shards.
        writing: asyncio.Task[bool] | None = None
        # Closed however the loop ends, so the prompts still in the engine are aborted at once.
        async with contextlib.aclosing(self._captures(inputs, manifest.prompts_done)) as captures:
            try:
                async for prompt in captures:
                    if prompt is None:
                        await self._written(writing)
                        return None  # stopped
                    buffer.append(prompt)
                    if len(buffer) == size or prompt.index == last:
                        if not await self._written(writing):
                            return None  # stopped while waiting for the key's slot
                        writing = asyncio.ensure_future(self._write_shard(manifest, stats, buffer))
                        buffer = []
                if not await self._written(writing):
                    return None
            finally:
                # A failure or a cancellation cuts the write short, as a crash would: the
                # manifest still names only complete shards. (Once the write is done, `cancel`
                # does nothing and this only collects its outcome.)
                if writing is not None:
                    writing.cancel()
                    await asyncio.gather(writing, return_exceptions=True)
        manifest.complete = True
        await self.files.write(
            part_manifest_name(self.harvest_id, self.plan.index), manifest.to_bytes()
        )
        return self.timings.as_dict()

    async def _resume_point(self) -> tuple[PartManifest, LayerStats]:
        name = part_manifest_name(self.harvest_id, self.plan.index)
        try:
            manifest = PartManifest.from_bytes(await self.files.read(name))
        except FileNotFoundError:
            manifest = None
        fresh = (
            PartManifest.of(self.plan),
            LayerStats(len(self.request.layers), self.model.hidden_size),
        )
        if manifest is None or not manifest.shards:
            return fresh
        state_name = part_state_name(self.harvest_id, self.plan.index, len(manifest.shards))
        try:
            saved = await self.files.read(state_name)
        except FileNotFoundError:
            # Only where two attempts of the part overlapped (a stalled node's lease taken over)
            # and one deleted the state that the other's manifest names: the part starts over.
            # Its shards are written again, and their usage rows charge nothing twice.
            logger.warning(
                "harvest %s part %d: %s is gone; the part starts over",
                self.harvest_id,
                self.plan.index,
                state_name,
            )
            return fresh
        state = await asyncio.to_thread(state_from_bytes, saved)
        logger.info(
            "harvest %s part %d resumes after shard %d (%d prompts done)",
            self.harvest_id,
            self.plan.index,
            manifest.next_shard - 1,
            manifest.prompts_done,
        )
        return manifest, LayerStats.from_state(state)

    async def _forget_state(self, shards_done: int) -> None:
        """Deletes the statistics state the part's manifest named before its last shard (each is
        as large as the harvest's statistics: megabytes for a large model, one per shard). Best
        effort: one left behind goes with the harvest's files."""
        if shards_done < 1:
            return
        name = part_state_name(self.harvest_id, self.plan.index, shards_done)
        try:
            await self.files.delete(name)
        except Exception:
            logger.warning("harvest %s: %s not deleted", self.harvest_id, name, exc_info=True)

    async def _report(self, manifest: PartManifest) -> None:
        """The part's progress on its job row, for the harvest's GET (best effort: a lost write
        only delays what a reader sees)."""
        try:
            await self.context.jobs.report_progress(
                self.job.id,
                self.job.attempt,
                self.job.owner or "",
                utc_now(),
                manifest.progress(),
            )
        except Exception:
            logger.warning(
                "harvest %s part %d: progress not written",
                self.harvest_id,
                self.plan.index,
                exc_info=True,
            )

    async def _captures(
        self, inputs: HarvestInput, start: int
    ) -> AsyncIterator[HarvestedPrompt | None]:
        """The part's prompts from `start` on, in order, at most `in_flight` in the engine at
        once (fewer when other parts on this node hold the gate). Yields None (and stops) when
        the job is stopped."""
        pending: dict[int, asyncio.Task[HarvestedPrompt]] = {}
        end = self.plan.end_prompt
        next_start = start
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            for index in range(start, end):
                while next_start < end and len(pending) < self.in_flight:
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
        root = self.context.settings.capture_dir
        priority = self.context.batch.priority
        extra = {} if priority is None else {"priority": priority}
        try:
            final = None
            prompt = TokensPrompt(prompt_token_ids=tokens.tolist())
            async with self.context.gate.slot():
                async for output in self.context.engine.generate(
                    prompt, params, capture_id, **extra
                ):
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
            logger.error("harvest %s prompt %d: %s", self.harvest_id, index, error)
            raise HarvestFailed(
                InternalError("A harvest prompt's capture came back incomplete; retry the job.")
            ) from None
        finally:
            release(capture_id, root=root)
        return HarvestedPrompt(index=index, tokens=tokens.astype(np.int32), bits=bits)

    async def _written(self, writing: asyncio.Task[bool] | None) -> bool:
        """Waits for the shard being written (if any): False when the job was stopped before it
        could be held. The wait is the part's time with no new prompts going in."""
        if writing is None:
            return True
        started = time.perf_counter()
        try:
            return await writing
        finally:
            self.timings.write_wait_s += time.perf_counter() - started

    async def _write_shard(
        self, manifest: PartManifest, stats: LayerStats, prompts: list[HarvestedPrompt]
    ) -> bool:
        """Holds, writes and charges one shard; False when the job was stopped first."""
        number = manifest.next_shard
        n_tokens = sum(p.n_tokens for p in prompts)
        ticket = await self._hold(n_tokens)
        if ticket is None:
            return False
        counters = self.context.counters
        started = time.perf_counter()
        try:
            entry = await self._write_files(manifest, stats, prompts, number)
        except BaseException:
            await asyncio.shield(counters.settle(ticket, 0, 0))
            raise
        row = UsageRow(
            route=HARVEST_ROUTE,
            status=200,
            latency_ms=int((time.perf_counter() - started) * 1000),
            prompt_tokens=n_tokens,
            request_id=f"{self.harvest_id}-shard-{number:05d}",
            key_id=self.principal.key_id,
            key_prefix=self.principal.key_prefix,
            account_id=self.principal.account_id,
            model=self.model.id,
        )
        try:
            # Before the part's manifest lists the shard, and once: a crash in between runs the
            # shard again (here or on another node), which finds its row and charges nothing.
            charged = await self.context.usage.insert_once(row)
        except BaseException:
            await asyncio.shield(counters.settle(ticket, 0, 0))
            raise
        await asyncio.shield(counters.settle(ticket, n_tokens if charged else 0, 0))
        if charged and self.context.on_charged is not None:
            self.context.on_charged(row)
        manifest.shards.append(entry)
        await self.files.write(
            part_manifest_name(self.harvest_id, self.plan.index), manifest.to_bytes()
        )
        await self._forget_state(len(manifest.shards) - 1)
        await self._report(manifest)
        self.timings.write_s += time.perf_counter() - started
        self.timings.tokens += n_tokens
        self.timings.prompts += len(prompts)
        logger.info("harvest %s wrote %s (%d bytes)", self.harvest_id, entry.file, entry.bytes)
        return True

    async def _hold(self, n_tokens: int) -> Ticket | None:
        """The shard's tokens held on every budget and the key's running slot while it is
        written, as the key stands now (revoked since the submit: the harvest fails with that
        401). A budget that cannot hold them fails it with `budget_exceeded`; slots taken mean
        waiting. None when the job was stopped meanwhile."""
        counters = self.context.counters
        while True:
            self.principal = await self.context.principal_now(self.request.principal)
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
        self,
        manifest: PartManifest,
        stats: LayerStats,
        prompts: list[HarvestedPrompt],
        number: int,
    ) -> ShardEntry:
        """The shard, then the part's statistics state (then the charge, then the part's
        manifest that lists the shard): a crash between any two leaves the manifest naming
        complete shards."""
        shard, state = await asyncio.to_thread(self._encode_shard, stats, prompts)
        name = shard_name(number)
        stored = await self.files.write(f"{self.prefix}/{name}", shard)
        done = len(manifest.shards) + 1
        await self.files.write(part_state_name(self.harvest_id, self.plan.index, done), state)
        return ShardEntry(
            file=name,
            first_prompt=prompts[0].index,
            last_prompt=prompts[-1].index,
            n_tokens=sum(p.n_tokens for p in prompts),
            bytes=stored.size,
        )

    def _encode_shard(
        self, stats: LayerStats, prompts: list[HarvestedPrompt]
    ) -> tuple[bytes, bytes]:
        """The shard's bytes and the statistics state with its prompts added (CPU work: in a
        worker thread)."""
        bos = self.model.bos_token_id
        for prompt in prompts:
            rows = prompt.as_float32()
            if bos is not None and prompt.n_tokens and int(prompt.tokens[0]) == bos:
                stats.add(rows[:, 1:], rows[:, :1])
            else:
                stats.add(rows)
        return shard_bytes(prompts), state_bytes(stats.to_state())
