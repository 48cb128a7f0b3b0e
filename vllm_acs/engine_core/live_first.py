"""vLLM's scheduler with live requests first inside each step: while live requests are in the
engine, a batch request's prefill advances at most `batch_chunk_beside_live` tokens per step.

EngineCore process. `vllm-acs serve` names `live_first_scheduler` as vLLM's `--scheduler-cls`
(with `--scheduling-policy priority`) unless the operator chose a scheduler. vLLM's priority
policy orders the waiting queue and picks preemption victims, but the running requests share
each step whatever their priority: a harvest prompt's 128-token prefill sat in the same step as
a live request's one decode token, and on a CPU (or a busy GPU) a step's time grows with its
tokens. vLLM's own bound on that, `long_prefill_token_threshold`, caps every request's prefill
chunk; this scheduler sets it per step on its own copy of the scheduler config: while a live
request (vLLM's default priority, 0) runs or waits beside batch work (priority 1, see
`jobs/batch_share.py`), or did less than `LIVE_QUIET_S` ago, the cap is the larger of the chunk
and what the live requests still need, so live prefills are never cut and batch prefills go in
small chunks. With no live traffic (or no batch request) the operator's threshold stands, and
batch work runs at full speed. Captures are written by position, so a chunked prompt's rows are
the same.
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

# The most prompt tokens one batch request adds to a step while live requests are in the engine,
# unless the operator set `batch_chunk_beside_live`. On a CPU a step's time follows its tokens,
# so the chunk trades a live request's latency against the batch's share along one line
# (docs/decisions.md, "The p50 against the share"): with 16 the share sat at its stated
# minimum (a quarter of its speed alone) on the faster host measured (0.23-0.26x) and above it
# on the slower one (0.33-0.37x, where 8 gave 0.21-0.22x); a smaller chunk would fall below
# it. On a GPU a decode step costs about the same with a hundred more tokens (not yet measured
# there).
CPU_CHUNK_BESIDE_LIVE = 16
GPU_CHUNK_BESIDE_LIVE = 64


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
    running: list[Any]
    waiting: Any
    max_num_running_reqs: int
    policy: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Its own copy: the threshold changes from step to step, the operator's stays as given.
        self.scheduler_config = copy.copy(self.scheduler_config)
        self._operator_threshold = int(self.scheduler_config.long_prefill_token_threshold or 0)
        additional_config = self.vllm_config.additional_config or {}
        settings = Settings.load(additional_config=additional_config)
        self._chunk = chunk_beside_live(settings, current_platform.is_cpu())
        self.clock: Callable[[], float] = time.monotonic
        self._live_seen = -math.inf
        logger.info(
            "live requests first: batch prefills advance %d tokens per step beside live requests",
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
        return super().schedule(*args, **kwargs)  # type: ignore[misc]


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
