"""The live-first scheduler (engine_core/live_first.py): vLLM's own scheduler, built for the tiny
model's real config, given batch (priority 1) and live (priority 0) requests; what one step
schedules for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_acs.engine_core.live_first import (
    BATCH_SITS_OUT_AT_MOST_S,
    CPU_CHUNK_BESIDE_LIVE,
    GPU_CHUNK_BESIDE_LIVE,
    SITS_OUT_BELOW_KV_USAGE,
    LiveFirstAsyncScheduler,
    LiveFirstScheduler,
    chunk_beside_live,
    live_first_scheduler,
    live_needs,
    prefill_threshold,
    sits_out_live_steps,
)
from vllm_acs.jobs.batch_share import BATCH_PRIORITY, LIVE_PRIORITY, LIVE_QUIET_S
from vllm_acs.launcher import LIVE_FIRST_SCHEDULER
from vllm_acs.settings import Settings

BATCH_PROMPT = 300  # longer than the CPU chunk
# Batch requests share the live requests' steps, as on a GPU.
SHARING = {"acs": {"batch_sits_out_live_steps": False}}


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


def _scheduler(config: Any, num_blocks: int = 256) -> Any:
    import torch
    from vllm.v1.core.sched.interface import SchedulerInterface
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = 16
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=64, dtype=torch.float32
    )
    kv = KVCacheConfig(
        num_blocks=num_blocks,
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


def _clocked(scheduler: Any) -> list[float]:
    now = [100.0]
    scheduler.clock = lambda: now[0]
    scheduler._batch_stepped = now[0]
    return now


def _running(scheduler: Any) -> list[str]:
    return [request.request_id for request in scheduler.running]


def test_batch_alone_prefills_whole_then_sits_out_beside_a_live_request(config: Any) -> None:
    scheduler = _scheduler(config)
    _clocked(scheduler)
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    # Alone on the engine: the whole prompt in one step, as plain vLLM schedules it.
    assert _step(scheduler) == {"batch-a": BATCH_PROMPT}

    scheduler.add_request(_request("batch-b", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    # The live request's step is its own: the waiting batch prompt is not admitted, the running
    # one is left out, and both are where they were after it.
    assert _step(scheduler) == {"live": 5}
    assert _running(scheduler) == ["live", "batch-a"]
    assert [request.request_id for request in scheduler.waiting] == ["batch-b"]


def test_between_live_requests_batch_prompts_go_in_chunks(config: Any) -> None:
    scheduler = _scheduler(config)
    now = _clocked(scheduler)
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("batch-b", BATCH_PROMPT, BATCH_PRIORITY))
    assert _step(scheduler) == {"live": 5}
    from vllm.v1.request import RequestStatus

    scheduler.finish_requests("live", RequestStatus.FINISHED_ABORTED)
    # The live client's next request is on its way: the batch prompts run, in chunks, so that
    # it waits for a bounded step.
    now[0] += LIVE_QUIET_S / 2
    chunk = CPU_CHUNK_BESIDE_LIVE
    assert _step(scheduler) == {"batch-a": chunk, "batch-b": chunk}
    # Live traffic has gone quiet: the rest of the prompts in one step.
    now[0] += LIVE_QUIET_S
    assert _step(scheduler) == {"batch-a": BATCH_PROMPT - chunk, "batch-b": BATCH_PROMPT - chunk}


def test_batch_work_sits_out_no_longer_than_its_bound(config: Any) -> None:
    scheduler = _scheduler(config)
    now = _clocked(scheduler)
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    assert _step(scheduler) == {"live": 5}
    # The live request stays in the engine (its decode waits for its output here): steady live
    # traffic with no gap.
    now[0] += BATCH_SITS_OUT_AT_MOST_S / 2
    assert _step(scheduler) == {}
    now[0] += BATCH_SITS_OUT_AT_MOST_S / 2 + 0.001
    assert _step(scheduler) == {"batch": CPU_CHUNK_BESIDE_LIVE}
    # Then it sits out again, for as long.
    now[0] += BATCH_SITS_OUT_AT_MOST_S - 0.002
    assert _step(scheduler) == {}
    now[0] += 0.003
    assert _step(scheduler) == {"batch": CPU_CHUNK_BESIDE_LIVE}


def test_sitting_out_never_admits_past_the_engines_places(tiny_model_dir: Path) -> None:
    scheduler = _scheduler(_config(tiny_model_dir, max_num_seqs=2))
    _clocked(scheduler)
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    assert _step(scheduler) == {"batch-a": BATCH_PROMPT}
    scheduler.add_request(_request("live-1", 5, LIVE_PRIORITY))
    scheduler.add_request(_request("live-2", 5, LIVE_PRIORITY))
    # One place left beside the batch request it hides: one live request goes in.
    assert _step(scheduler) == {"live-1": 5}
    assert _running(scheduler) == ["live-1", "batch-a"]


def test_batch_work_does_not_sit_out_a_step_no_live_request_can_join(tiny_model_dir: Path) -> None:
    config = _config(tiny_model_dir, max_num_seqs=2, long_prefill_token_threshold=100)
    scheduler = _scheduler(config)
    _clocked(scheduler)
    scheduler.add_request(_request("batch-a", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("batch-b", BATCH_PROMPT, BATCH_PRIORITY))
    assert _step(scheduler) == {"batch-a": 100, "batch-b": 100}
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    # No place for the live request until a batch request ends: the batch requests run on.
    assert _step(scheduler) == {"batch-a": 100, "batch-b": 100}
    assert _running(scheduler) == ["batch-a", "batch-b"]


def test_batch_work_does_not_sit_out_while_the_kv_cache_is_nearly_full(
    config: Any,
) -> None:
    # 24 blocks of 16 tokens: a 320-token prompt holds 20 of the 23 usable ones.
    scheduler = _scheduler(config, num_blocks=24)
    _clocked(scheduler)
    scheduler.add_request(_request("batch-a", 320, BATCH_PRIORITY))
    assert _step(scheduler) == {"batch-a": 320}
    assert scheduler.kv_cache_manager.usage >= SITS_OUT_BELOW_KV_USAGE
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    scheduler.add_request(_request("batch-b", 20, BATCH_PRIORITY))
    # Hidden batch requests could not be preempted: with the cache this full they stay in.
    assert _step(scheduler) == {"live": 5, "batch-b": 20}


def test_live_prompts_waiting_behind_others_are_never_cut(tiny_model_dir: Path) -> None:
    scheduler = _scheduler(_config(tiny_model_dir, additional_config=SHARING))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live-short", 4, LIVE_PRIORITY))
    scheduler.add_request(_request("live-long", 400, LIVE_PRIORITY))
    # The cap is the longest live prompt: the batch prompt (shorter) goes whole this time.
    assert _step(scheduler) == {"live-short": 4, "live-long": 400, "batch": BATCH_PROMPT}


def test_sharing_the_steps_a_batch_prompt_goes_in_chunks(tiny_model_dir: Path) -> None:
    scheduler = _scheduler(_config(tiny_model_dir, additional_config=SHARING))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 5, LIVE_PRIORITY))
    assert _step(scheduler) == {"live": 5, "batch": CPU_CHUNK_BESIDE_LIVE}


def test_a_long_live_prompt_is_never_cut(tiny_model_dir: Path) -> None:
    scheduler = _scheduler(_config(tiny_model_dir, additional_config=SHARING))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 500, LIVE_PRIORITY))
    scheduled = _step(scheduler)
    assert scheduled["live"] == 500
    assert scheduled["batch"] == BATCH_PROMPT  # the cap is the live prompt's own length


def test_the_operator_sets_the_chunk(tiny_model_dir: Path) -> None:
    acs = {"batch_sits_out_live_steps": False, "batch_chunk_beside_live": 20}
    scheduler = _scheduler(_config(tiny_model_dir, additional_config={"acs": acs}))
    scheduler.add_request(_request("batch", BATCH_PROMPT, BATCH_PRIORITY))
    scheduler.add_request(_request("live", 3, LIVE_PRIORITY))
    assert _step(scheduler) == {"live": 3, "batch": 20}
    assert scheduler.vllm_config.scheduler_config.long_prefill_token_threshold == 0


def test_the_operators_threshold_stands_and_is_never_loosened(tiny_model_dir: Path) -> None:
    config = _config(tiny_model_dir, long_prefill_token_threshold=16, additional_config=SHARING)
    scheduler = _scheduler(config)
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


def test_batch_sits_out_live_steps_on_a_cpu_unless_set() -> None:
    assert sits_out_live_steps(Settings(), on_cpu=True) is True
    assert sits_out_live_steps(Settings(), on_cpu=False) is False
    assert sits_out_live_steps(Settings(batch_sits_out_live_steps=False), on_cpu=True) is False
    assert sits_out_live_steps(Settings(batch_sits_out_live_steps=True), on_cpu=False) is True
    environ = {"VLLM_ACS_BATCH_SITS_OUT_LIVE_STEPS": "false"}
    assert Settings.load(environ=environ).batch_sits_out_live_steps is False
    assert Settings.load(environ={}).batch_sits_out_live_steps is None
