"""The live-first scheduler (engine_core/live_first.py): vLLM's own scheduler, built for the tiny
model's real config, given batch (priority 1) and live (priority 0) requests; what one step
schedules for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_acs.engine_core.live_first import (
    CPU_CHUNK_BESIDE_LIVE,
    GPU_CHUNK_BESIDE_LIVE,
    LiveFirstAsyncScheduler,
    LiveFirstScheduler,
    chunk_beside_live,
    live_first_scheduler,
    live_needs,
    prefill_threshold,
)
from vllm_acs.jobs.batch_share import BATCH_PRIORITY, LIVE_PRIORITY, LIVE_QUIET_S
from vllm_acs.launcher import LIVE_FIRST_SCHEDULER
from vllm_acs.settings import Settings

BATCH_PROMPT = 128


def _config(tiny_model_dir: Path, **overrides: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(tiny_model_dir),
        max_model_len=2048,
        enforce_eager=True,
        scheduling_policy="priority",
        scheduler_cls=LIVE_FIRST_SCHEDULER,
        # The requests here carry no block hashes (EngineCore adds a hasher): no prefix cache.
        enable_prefix_caching=False,
        **overrides,
    )
    return args.create_engine_config()


def _scheduler(config: Any) -> Any:
    import torch
    from vllm.v1.core.sched.interface import SchedulerInterface
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = 16
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=64, dtype=torch.float32
    )
    kv = KVCacheConfig(
        num_blocks=256,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
    )
    # What EngineCore has set by then (after profiling the KV cache), and what it does with
    # --scheduler-cls (v1/engine/core.py).
    config.cache_config.num_gpu_blocks = kv.num_blocks
    build = config.scheduler_config.get_scheduler_cls()
    scheduler = build(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
    )
    assert isinstance(scheduler, SchedulerInterface)
    return scheduler


def _request(request_id: str, n_tokens: int, priority: int) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=4, temperature=0.0)
    return Request(
        request_id, list(range(3, 3 + n_tokens)), params, None, arrival_time=0.0, priority=priority
    )


def _step(scheduler: Any) -> dict[str, int]:
    return dict(scheduler.schedule().num_scheduled_tokens)


@pytest.fixture(scope="module")
def config(tiny_model_dir: Path) -> Any:
    return _config(tiny_model_dir)


def test_the_launcher_names_a_builder_vllm_resolves(config: Any) -> None:
    assert config.scheduler_config.get_scheduler_cls() is live_first_scheduler
    built = _scheduler(config)
    expected = (
        LiveFirstAsyncScheduler if config.scheduler_config.async_scheduling else LiveFirstScheduler
    )
    assert type(built) is expected


def test_batch_alone_prefills_whole_then_chunks_beside_a_live_request(config: Any) -> None:
    scheduler = _scheduler(config)
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    # Alone on the engine: the whole prompt in one step, as plain vLLM schedules it.
    assert _step(scheduler) == {"batch-a": BATCH_PROMPT}

    scheduler.add_request(_request("batch-b", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    scheduled = _step(scheduler)
    # The live request's whole prompt, the new batch prompt a chunk.
    assert scheduled["live"] == 5
    assert scheduled["batch-b"] == CPU_CHUNK_BESIDE_LIVE


def test_live_prompts_waiting_behind_others_are_never_cut(config: Any) -> None:
    scheduler = _scheduler(config)
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live-short", 4, LIVE_PRIORITY))
    scheduler.add_request(_request("live-long", 200, LIVE_PRIORITY))
    # The cap is the longest live prompt: the batch prompt (shorter) goes whole this time.
    assert _step(scheduler) == {"live-short": 4, "live-long": 200, "batch": BATCH_PROMPT}


def test_batch_prompts_stay_chunked_between_back_to_back_live_requests(config: Any) -> None:
    scheduler = _scheduler(config)
    now = [100.0]
    scheduler.clock = lambda: now[0]
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    assert _step(scheduler) == {"live": 5}
    from vllm.v1.request import RequestStatus

    scheduler.finish_requests("live", RequestStatus.FINISHED_ABORTED)
    # The live client's next request is on its way: batch prompts that come now are chunked
    # (two: vLLM never cuts a request alone in the engine).
    now[0] += LIVE_QUIET_S / 2
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("batch-b", BATCH_PROMPT, BATCH_PRIORITY))
    chunk = CPU_CHUNK_BESIDE_LIVE
    assert _step(scheduler) == {"batch-a": chunk, "batch-b": chunk}
    # Live traffic has gone quiet: the rest of the prompts in one step.
    now[0] += LIVE_QUIET_S
    assert _step(scheduler) == {"batch-a": BATCH_PROMPT - chunk, "batch-b": BATCH_PROMPT - chunk}


def test_a_long_live_prompt_is_never_cut(config: Any) -> None:
    scheduler = _scheduler(config)
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 300, LIVE_PRIORITY))
    scheduled = _step(scheduler)
    assert scheduled["live"] == 300
    assert scheduled["batch"] == BATCH_PROMPT  # the cap is the live prompt's own length


def test_the_operator_sets_the_chunk(tiny_model_dir: Path) -> None:
    config = _config(tiny_model_dir, additional_config={"acs": {"batch_chunk_beside_live": 20}})
    scheduler = _scheduler(config)
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 3, LIVE_PRIORITY))
    assert _step(scheduler) == {"live": 3, "batch": 20}
    assert scheduler.vllm_config.scheduler_config.long_prefill_token_threshold == 0


def test_the_operators_threshold_stands_and_is_never_loosened(tiny_model_dir: Path) -> None:
    scheduler = _scheduler(_config(tiny_model_dir, long_prefill_token_threshold=16))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 40, LIVE_PRIORITY))
    scheduled = _step(scheduler)
    assert scheduled == {"live": 16, "batch": 16}
    # The operator's config object is not changed by the steps.
    assert scheduler.vllm_config.scheduler_config.long_prefill_token_threshold == 16


class _Queued:
    def __init__(self, priority: int, tokens: int, computed: int = 0) -> None:
        self.priority = priority
        self.num_tokens_with_spec = tokens
        self.num_computed_tokens = computed


def test_live_needs_reads_the_queue_up_to_its_first_batch_request() -> None:
    live, batch = LIVE_PRIORITY, BATCH_PRIORITY
    assert live_needs([_Queued(batch, 128)], [], slots=8) == ([], True)
    assert live_needs([_Queued(live, 20, 19)], [_Queued(live, 9)], slots=8) == ([1, 9], False)
    waiting = [_Queued(batch, 128), _Queued(live, 900)]  # (not in a priority queue's order)
    assert live_needs([_Queued(live, 70, 10)], waiting, slots=8) == ([60], True)


def test_live_needs_reads_no_more_of_the_queue_than_the_step_can_admit() -> None:
    pulled: list[int] = []

    def backlog() -> Any:  # a long live backlog, then batch work
        for i in range(1000):
            pulled.append(i)
            yield _Queued(LIVE_PRIORITY if i < 999 else BATCH_PRIORITY, 5)

    assert live_needs([], backlog(), slots=3) == ([5, 5, 5], False)
    assert len(pulled) == 3
    pulled.clear()
    # No free place: only the head is read (a live request waiting is still live traffic).
    assert live_needs([_Queued(BATCH_PRIORITY, 128)], backlog(), slots=0) == ([5], True)
    assert len(pulled) == 1


def test_prefill_threshold() -> None:
    # Nothing to bound, or no live traffic: the operator's threshold (0: none).
    assert prefill_threshold([5], False, True, 0, 32) == 0
    assert prefill_threshold([], True, False, 0, 32) == 0
    assert prefill_threshold([], True, False, 64, 32) == 64
    # A live decode beside a batch prefill, or a live request lately.
    assert prefill_threshold([1], True, True, 0, 32) == 32
    assert prefill_threshold([], True, True, 0, 32) == 32
    # A long live prompt is not cut; an operator's cap is never loosened.
    assert prefill_threshold([5, 500], True, True, 0, 32) == 500
    assert prefill_threshold([60], True, True, 8, 32) == 8


def test_the_chunk_by_platform_unless_set() -> None:
    assert chunk_beside_live(Settings(), on_cpu=True) == CPU_CHUNK_BESIDE_LIVE
    assert chunk_beside_live(Settings(), on_cpu=False) == GPU_CHUNK_BESIDE_LIVE
    assert chunk_beside_live(Settings(batch_chunk_beside_live=3), on_cpu=False) == 3
