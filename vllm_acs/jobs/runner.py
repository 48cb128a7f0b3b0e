"""JobRunner: claims queued jobs for this node's models, runs them under a lease, fences the end.

API server process, one runner per process (an asyncio task on the server's loop). A claimed job
keeps its lease while it runs (renewed every third of it); when a renewal fails the job was
cancelled or handed to another owner, and it is stopped. The end is written fenced on (job,
attempt, owner), so a slow or resurrected process never finishes a job twice. The reaper (leases
that expired: a dead process) and the retention sweep run here too, off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta, timezone

from ..errors import InternalError, error_body
from ..metrics import JOB_RUNS, REAPED_JOBS, RUNNING_JOBS
from ..states import JobStatus
from ..storage.jobs import Job, JobEnd, JobRepository
from .end_writer import EndWriter
from .kinds import HandBack, JobKind, JobOutcome, Stopped
from .watch import JobWatch

logger = logging.getLogger(__name__)
# How long a stopping server waits for its running jobs to hand themselves back.
CLOSE_TIMEOUT_S = 10.0
# The most jobs one claim takes: one write for many when a burst arrives.
CLAIM_BATCH = 16
# A submit here wakes the claim loop, which then waits this long for the rest of a burst of
# submits, so that one claim takes many jobs instead of one claim per submit.
GATHER_S = 0.01


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def new_owner() -> str:
    """This process's name in the jobs table: unique per start, so a restart is a new owner."""
    return f"{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class JobRunner:
    def __init__(
        self,
        repository: JobRepository,
        kinds: Mapping[str, JobKind],
        models: Callable[[], Collection[str]],
        *,
        concurrency: int = 32,
        lease_s: float = 30.0,
        poll_s: float = 0.5,
        reap_every_s: float = 5.0,
        sweep_every_s: float = 300.0,
        clock: Callable[[], datetime] = utc_now,
        owner: str | None = None,
        claim_kinds: Collection[str] | None = None,
        kind_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.repository = repository
        self.kinds = dict(kinds)
        # The kinds this process claims from the queue (a node kept out of batch work claims
        # fewer); it still runs any kind it adopts.
        self.claim_kinds = list(self.kinds if claim_kinds is None else claim_kinds)
        # The most jobs of a kind this process runs at once, where it is fewer than
        # `concurrency` (a harvest's parts: each node takes a share, not all of them).
        self.kind_limits = dict(kind_limits or {})
        self.models = models
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.reap_every_s = reap_every_s
        self.sweep_every_s = sweep_every_s
        self.clock = clock
        self.owner = owner or new_owner()
        # Long-poll reads wait here for a job's end (woken at once for the jobs run here).
        self.watch = JobWatch(repository.ended_among)
        # Ends arriving together are written in one transaction.
        self._ends = EndWriter(repository, clock)
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._running: dict[str, asyncio.Event] = {}
        self._running_kinds: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="acs-jobs-claim"),
            asyncio.create_task(self._maintenance_loop(), name="acs-jobs-maintenance"),
        ]

    def wake(self) -> None:
        """A job was submitted on this node: look for work now rather than at the next poll."""
        self._wake.set()

    def adopt(self, job: Job) -> None:
        """Runs a job this process submitted already claimed (`JobRepository.submit(claimed_by=
        (runner.owner, runner.lease_s))`): a Loom branch, whose submitter streams its progress.
        It runs under the lease like any claimed job, outside the claim loop's concurrency."""
        if self._closing:
            return  # its lease will expire and another process (or the restart) takes it
        self._running[job.id] = asyncio.Event()
        self._running_kinds[job.kind] += 1
        task = asyncio.create_task(self._run(job), name=f"acs-job-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop_job(self, job_id: str) -> None:
        """Stops a job this process runs (it was cancelled): its engine request is aborted."""
        stop = self._running.get(job_id)
        if stop is not None:
            stop.set()

    async def close(self) -> None:
        """At shutdown: stops claiming; running jobs are stopped and handed back to the queue."""
        self._closing = True
        for task in self._loops:
            task.cancel()
        for stop in self._running.values():
            stop.set()
        tasks = [*self._loops, *self._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        await self._ends.close()
        await self.watch.close()

    async def _claim_loop(self) -> None:
        while True:
            free = self.concurrency - len(self._running)
            if free <= 0:
                await self._slot_freed.wait()
                self._slot_freed.clear()
                continue
            self._wake.clear()  # before the claim: a submit during it is not missed
            try:
                claimed = await self._claim(free)
            except Exception:
                logger.exception("claiming jobs failed; retrying")
                claimed = []
            if not claimed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                    await asyncio.sleep(GATHER_S)
                continue
            for job in claimed:
                # Counted as running at once, so the next claim asks only for the free slots.
                self._running[job.id] = asyncio.Event()
                self._running_kinds[job.kind] += 1
                task = asyncio.create_task(self._run(job), name=f"acs-job-{job.id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _claim(self, free: int) -> list[Job]:
        """Up to `free` queued jobs: of the unlimited kinds in one statement, then of each kind
        with a limit as many as it has room for."""
        models = self.models()
        open_kinds = [kind for kind in self.claim_kinds if kind not in self.kind_limits]
        claimed: list[Job] = []
        if open_kinds:
            claimed = await self.repository.claim_many(
                self.owner,
                models,
                self.clock(),
                self.lease_s,
                kinds=open_kinds,
                limit=min(free, CLAIM_BATCH),
            )
        for kind, most in self.kind_limits.items():
            room = min(most - self._running_kinds[kind], free - len(claimed))
            if kind not in self.claim_kinds or room <= 0:
                continue
            claimed += await self.repository.claim_many(
                self.owner, models, self.clock(), self.lease_s, kinds=[kind], limit=room
            )
        return claimed

    async def _run(self, job: Job) -> None:
        stop = self._running[job.id]
        RUNNING_JOBS.inc()
        keeper = asyncio.create_task(self._keep_lease(job, stop))
        try:
            outcome = await self._outcome(job, stop)
            keeper.cancel()
            if isinstance(outcome, Stopped) and not self._closing:
                JOB_RUNS.labels(kind=job.kind, outcome="stopped").inc()
                return  # cancelled, or another owner has it now: nothing of ours to write
            await self._record(job, outcome)
        except Exception:
            logger.exception("job %s: writing its end failed; its lease will expire", job.id)
        finally:
            RUNNING_JOBS.dec()
            keeper.cancel()
            self._running.pop(job.id, None)
            self._running_kinds[job.kind] -= 1
            self._slot_freed.set()
            if job.kind in self.kind_limits:
                self._wake.set()  # room for the next one of its kind: claim it now

    async def _outcome(self, job: Job, stop: asyncio.Event) -> JobOutcome | HandBack | Stopped:
        try:
            return await self.kinds[job.kind].run(job, stop)
        except Exception:
            logger.exception("job %s (%s) failed inside its kind", job.id, job.kind)
            error = InternalError()
            return JobOutcome(
                JobStatus.FAILED, error.status, json.dumps(error_body(error, job.id)), error.code
            )

    async def _record(self, job: Job, outcome: JobOutcome | HandBack | Stopped) -> None:
        if isinstance(outcome, Stopped | HandBack):
            now = self.clock()
            # Stopped here: the server is stopping, another process (or its restart) takes it.
            delay = outcome.delay_s if isinstance(outcome, HandBack) else 0.0
            later = now + timedelta(seconds=delay)
            await self.repository.hand_back(job.id, job.attempt, self.owner, now, later)
            JOB_RUNS.labels(kind=job.kind, outcome="handed_back").inc()
            return
        end = JobEnd(
            job.id,
            job.attempt,
            self.owner,
            outcome.status,
            result_status=outcome.result_status,
            result_body=outcome.result_body,
            error_code=outcome.error_code,
        )
        written = await self._ends.write(end)
        JOB_RUNS.labels(
            kind=job.kind, outcome=outcome.status.value if written else "fenced_out"
        ).inc()
        if written:
            self.watch.ended(job.id)
        else:
            logger.warning(
                "job %s attempt %d: fenced out (cancelled, or handed to another owner); its "
                "result was not written",
                job.id,
                job.attempt,
            )

    async def _keep_lease(self, job: Job, stop: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                ours = await self.repository.renew(
                    job.id, job.attempt, self.owner, self.clock(), self.lease_s
                )
            except Exception:
                logger.exception("renewing the lease of job %s failed", job.id)
                continue
            if not ours:
                logger.info("job %s is no longer ours (cancelled or reaped): stopping it", job.id)
                stop.set()
                return

    async def sweep(self, now: datetime) -> None:
        """The retention sweep: the rows (each kind's results kept as long as it says), then
        what each kind keeps outside the database (a harvest's files)."""
        ttls = {k.name: t for k in self.kinds.values() if (t := getattr(k, "result_ttl", None))}
        report = await self.repository.sweep(now, result_ttls=ttls)
        logger.debug("job retention sweep: %s", report)
        for kind in self.kinds.values():
            sweep_kind = getattr(kind, "sweep", None)
            if sweep_kind is not None:
                await sweep_kind(now)

    async def _maintenance_loop(self) -> None:
        last_sweep = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                reaped = await self.repository.reap(self.clock())
                if reaped:
                    REAPED_JOBS.inc(len(reaped))
                    logger.warning("handed back %d job(s) whose lease expired", len(reaped))
                if loop.time() - last_sweep >= self.sweep_every_s:
                    last_sweep = loop.time()
                    await self.sweep(self.clock())
            except Exception:
                logger.exception("job maintenance failed; retrying")
            await asyncio.sleep(self.reap_every_s)
