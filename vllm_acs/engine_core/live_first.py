"""vLLM's scheduler with live requests first inside each step: on a CPU, batch requests sit out
the steps that carry a live request; elsewhere (and between a client's requests) a batch
request's prefill advances at most `batch_chunk_beside_live` tokens per step.

EngineCore process. `vllm-acs serve` names `live_first_scheduler` as vLLM's `--scheduler-cls`
(with `--scheduling-policy priority`) unless the operator chose a scheduler. vLLM's priority
policy orders the waiting queue and picks preemption victims, but the running requests share
each step whatever their priority: a harvest prompt's 128-token prefill sat in the same step as
a live request's one decode token, and on a CPU a step's time grows with its tokens.

- **Sitting out** (`batch_sits_out_live_steps`, on by default on a CPU): while a live request
  (vLLM's default priority, 0) runs or waits, batch requests (priority 1, see
  `jobs/batch_share.py`) are hidden from vLLM's `schedule()` for that step, and admission stops
  at the live requests; they run in the steps between a client's requests. They never sit out
  longer than `BATCH_SITS_OUT_AT_MOST_S` (the first step after it takes them in, in chunks), nor
  while the KV cache is nearly full (vLLM would then preempt the live requests it sees).
- **Chunks**: vLLM's own bound on a step's prefill, `long_prefill_token_threshold`, caps every
  request's prefill chunk; this scheduler sets it per step on its own copy of the scheduler
  config: while a live request runs or waits beside batch work, or did less than
  `LIVE_QUIET_S` ago, the cap is the larger of the chunk and what the live requests still need,
  so live prefills are never cut. With no live traffic (or no batch request) the operator's
  threshold stands, and batch work runs at full speed.

Captures are written by position, so a chunked or paused prompt's rows are the same.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from vllm.platforms import current_platform
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler

from ..jobs.batch_share import LIVE_PRIORITY, LIVE_QUIET_S
from ..settings import Settings

logger = logging.getLogger(__name__)

# The most prompt tokens one batch request adds to a step while live traffic is recent, unless
# the operator set `batch_chunk_beside_live`. On a CPU, where batch requests sit out the live
# requests' steps, it bounds the steps between a client's requests (a live request that comes
# waits for the one in flight) and the step that takes batch work in after
# `BATCH_SITS_OUT_AT_MOST_S`; 128 lets the benchmark's harvest prompts go whole
# (docs/decisions.md, "Batch work sits out the live requests' steps"). On a GPU, where batch
# requests share the live steps, a decode step costs about the same with a hundred more tokens
# (not yet measured there).
CPU_CHUNK_BESIDE_LIVE = 128
GPU_CHUNK_BESIDE_LIVE = 64
# The longest batch requests sit out steps with live requests in them: past it the next step
# takes them in (in chunks), so steady live traffic with no gaps never starves batch work.
BATCH_SITS_OUT_AT_MOST_S = 0.05
# Batch requests hidden from a step cannot be preempted in it: vLLM would preempt the live
# requests it sees. So they sit out only while the KV cache has room.
SITS_OUT_BELOW_KV_USAGE = 0.8


class _Queued(Protocol):
    priority: int
    num_computed_tokens: int

    @property
    def num_tokens_with_spec(self) -> int: ...


def _is_live(request: _Queued) -> bool:
    return request.priority <= LIVE_PRIORITY


def _tokens_to_go(request: _Queued) -> int:
    return max(0, request.num_tokens_with_spec - request.num_computed_tokens)


def chunk_beside_live(settings: Settings, on_cpu: bool) -> int:
    if settings.batch_chunk_beside_live is not None:
        return settings.batch_chunk_beside_live
    return CPU_CHUNK_BESIDE_LIVE if on_cpu else GPU_CHUNK_BESIDE_LIVE


def sits_out_live_steps(settings: Settings, on_cpu: bool) -> bool:
    if settings.batch_sits_out_live_steps is not None:
        return settings.batch_sits_out_live_steps
    return on_cpu


def live_needs(
    running: Iterable[_Queued], waiting: Iterable[_Queued], slots: int
) -> tuple[list[int], bool]:
    """The tokens to go of every live request that the next step can schedule, and whether a
    batch request is among those (or running). `waiting` is in the priority queue's order, live
    requests first; the step admits at most `slots` of them (its free places beside the running
    requests), so it is read up to its first batch request or `slots` requests (at least its
    head: a live request waiting for a place is live traffic), whichever comes first. A long
    live backlog then costs a step about what it can schedule: vLLM's queue iterates by popping
    a copy of its heap."""
    needs: list[int] = []
    batch = False
    for request in running:
        if _is_live(request):
            needs.append(_tokens_to_go(request))
        else:
            batch = True
    for request in itertools.islice(waiting, max(1, slots)):
        if not _is_live(request):
            batch = True
            break
        needs.append(_tokens_to_go(request))
    return needs, batch


def prefill_threshold(
    needs: list[int], batch: bool, live_lately: bool, operator_threshold: int, chunk: int
) -> int:
    """`long_prefill_token_threshold` for the next step (0: no cap). Batch work beside live
    requests (in the engine now, or lately: a client sending requests back to back leaves gaps
    in which a whole batch prompt would fill the step the next live request waits for): the
    larger of `chunk` and every live request's tokens to go, never above an operator's own cap.
    Otherwise the operator's threshold."""
    if not batch or not (needs or live_lately):
        return operator_threshold
    threshold = max([chunk, *needs])
    return min(threshold, operator_threshold) if operator_threshold > 0 else threshold


class _LiveFirst:
    vllm_config: Any
    scheduler_config: Any
    kv_cache_manager: Any
    running: list[Any]
    waiting: Any
    max_num_running_reqs: int
    max_num_active_reqs: int
    policy: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Its own copy: the threshold changes from step to step, the operator's stays as given.
        self.scheduler_config = copy.copy(self.scheduler_config)
        self._operator_threshold = int(self.scheduler_config.long_prefill_token_threshold or 0)
        additional_config = self.vllm_config.additional_config or {}
        settings = Settings.load(additional_config=additional_config)
        on_cpu = current_platform.is_cpu()
        self._chunk = chunk_beside_live(settings, on_cpu)
        self._sits_out = sits_out_live_steps(settings, on_cpu)
        self.clock: Callable[[], float] = time.monotonic
        self._live_seen = -math.inf
        self._batch_stepped = self.clock()
        logger.info(
            "live requests first: batch prefills %s, and advance %d tokens per step while live "
            "traffic is recent",
            "sit out steps with live requests" if self._sits_out else "share live requests' steps",
            self._chunk,
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.policy == SchedulingPolicy.PRIORITY:
            # Under first come, first served every request has priority 0: none is batch work.
            slots = self.max_num_running_reqs - len(self.running)
            needs, batch = live_needs(self.running, self.waiting, slots)
            now = self.clock()
            if needs:
                self._live_seen = now
            self.scheduler_config.long_prefill_token_threshold = prefill_threshold(
                needs,
                batch,
                now - self._live_seen < LIVE_QUIET_S,
                self._operator_threshold,
                self._chunk,
            )
            if needs and batch and self._may_sit_out(now, slots):
                return self._live_step(len(needs), *args, **kwargs)
            self._batch_stepped = now
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def _may_sit_out(self, now: float, slots: int) -> bool:
        """Whether the batch requests sit out this step, which has live requests to schedule.
        Not when no live request could run in it (none running, no free place for those
        waiting: only a batch request's end makes room), nor once they have sat out
        `BATCH_SITS_OUT_AT_MOST_S`, nor while the KV cache is nearly full."""
        return (
            self._sits_out
            and (slots > 0 or any(_is_live(request) for request in self.running))
            and now - self._batch_stepped < BATCH_SITS_OUT_AT_MOST_S
            and self.kv_cache_manager.usage < SITS_OUT_BELOW_KV_USAGE
        )

    def _live_step(self, live_requests: int, *args: Any, **kwargs: Any) -> Any:
        """One step of the live requests alone: vLLM's `schedule()` sees only the live running
        requests and admits no more than the live ones waiting (the priority queue holds them
        first), within the places the hidden batch requests leave; then the batch requests are
        running again, behind the live ones (vLLM leaves a running request out of a step when
        the budget runs out, and the model runner keeps its state)."""
        held = [request for request in self.running if not _is_live(request)]
        self.running = [request for request in self.running if _is_live(request)]
        admission = self.max_num_active_reqs
        self.max_num_active_reqs = min(live_requests, admission - len(held))
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.running.extend(held)
            self.max_num_active_reqs = admission


class LiveFirstScheduler(_LiveFirst, Scheduler):
    pass


class LiveFirstAsyncScheduler(_LiveFirst, AsyncScheduler):
    pass


def live_first_scheduler(*, vllm_config: Any, **kwargs: Any) -> Scheduler:
    """What `--scheduler-cls` names: vLLM calls it as a class. It builds the live-first form of
    the scheduler vLLM would have chosen (asynchronous scheduling or not: decided after the
    arguments are parsed, so a class name alone could not follow it)."""
    if vllm_config.scheduler_config.async_scheduling:
        return LiveFirstAsyncScheduler(vllm_config=vllm_config, **kwargs)
    return LiveFirstScheduler(vllm_config=vllm_config, **kwargs)
