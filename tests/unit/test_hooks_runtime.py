"""The worker's per-step activation runtime, driven as compat.py drives it, without vLLM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_acs.activations.codec import bf16_bits_to_float, encode_array
from vllm_acs.activations.payload import AcsPayload, SteeringEntry
from vllm_acs.activations.store import (
    CaptureIncompleteError,
    CaptureMissingError,
    check_applied,
    read_capture,
)
from vllm_acs.hooks.intervention_buffers import InterventionBuffers
from vllm_acs.hooks.intervention_op import intervene
from vllm_acs.hooks.runtime import ActivationRuntime, NewRequest

HIDDEN = 4


def _runtime(root: Path, capture_rows: int = 1024, steering_slots: int = 16) -> ActivationRuntime:
    buffers = InterventionBuffers(
        n_layers=2,
        hidden=HIDDEN,
        max_tokens=32,
        bank_slots=steering_slots,
        capture_mb=capture_rows * 2 * HIDDEN / (1024 * 1024),
        device=torch.device("cpu"),
    )
    return ActivationRuntime(buffers=buffers, root=root, writes_files=True)


def _new(req_id: str, payload: AcsPayload | None, prompt_len: int, max_tokens: int):
    extra = payload.to_extra_args() if payload is not None else None
    return NewRequest(req_id, extra, prompt_len, max_tokens)


def _step(runtime: ActivationRuntime, batch: list[tuple[str, int, int]], layers=(0, 1)):
    """batch: (request id, first position, number of tokens). Layer l's output for a token at
    position p of request r is hidden = p + 10 l + 50 r_index, residual = 1 (exact in bf16).
    The op runs on `layers` (a model runs it on all), as compiled code calls it."""
    index = {req_id: i for i, (req_id, _, _) in enumerate(batch)}
    starts = np.cumsum([0] + [n for _, _, n in batch])
    runtime.begin_step(index, starts, np.array([p for _, p, _ in batch]), int(starts[-1]))
    buffers = runtime.buffers
    seen: dict[int, torch.Tensor] = {}
    for layer in layers:
        values = [
            p + 10 * layer + 50 * i for i, (_, p0, n) in enumerate(batch) for p in range(p0, p0 + n)
        ]
        hidden = torch.tensor(values, dtype=torch.float32)[:, None].repeat(1, HIDDEN).bfloat16()
        residual = torch.ones_like(hidden)
        intervene()(hidden, residual, buffers.bank, buffers.indices, buffers.capture_buffer, layer)
        seen[layer] = hidden
    runtime.end_step(True)
    return seen


def test_capture_over_chunks_and_decode_and_steering_of_one_request(tmp_path: Path):
    runtime = _runtime(tmp_path)
    vector = encode_array(np.full((1, HIDDEN), 64.0, dtype=np.float32))
    runtime.add_requests(
        [
            _new("A", AcsPayload(capture_id="a", capture_layers=(0, 1)), 5, 3),
            _new("B", None, 4, 3),
            _new("C", AcsPayload("c", steering=(SteeringEntry(vector, (1,)),)), 4, 3),
        ]
    )
    assert runtime.active
    # Prefill: A positions 0-2 (first chunk), B and C whole prompts.
    seen = _step(runtime, [("A", 0, 3), ("B", 0, 4), ("C", 0, 4)])
    assert seen[1][3:7, 0].float().tolist() == [60.0, 61.0, 62.0, 63.0]  # B untouched
    assert seen[1][7:11, 0].float().tolist() == [174.0, 175.0, 176.0, 177.0]  # C steered
    assert seen[0][7, 0].item() == 100.0  # layer 0 not steered
    # A's second chunk (positions 3-4) next to decodes; then A decodes positions 5, 6, and 7
    # (the extra pass after the last token, which the file does not keep).
    _step(runtime, [("C", 4, 1), ("A", 3, 2)])
    for position in (5, 6, 7):
        _step(runtime, [("A", position, 1), ("C", position, 1)])
    rows = bf16_bits_to_float(read_capture("a", n_layers=2, hidden=HIDDEN, n_rows=7, root=tmp_path))
    # A's index in the batch changes between steps: rows must follow the request, not the row.
    index_of_a = [0, 0, 0, 1, 1, 0, 0]
    for layer in (0, 1):
        expected = [p + 10 * layer + 50 * i + 1 for p, i in enumerate(index_of_a)]
        assert rows[layer, :, 0].tolist() == expected
    assert check_applied("c", n_rows=8, root=tmp_path).rows_done == 8
    runtime.finish_requests(["A", "B", "C"])
    assert not runtime.active


def test_a_forward_pass_that_skips_the_op_fails_the_request(tmp_path: Path):
    runtime = _runtime(tmp_path)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 2)])
    _step(runtime, [("A", 0, 3)], layers=(0,))  # layer 1's op never ran
    with pytest.raises(CaptureIncompleteError, match="op ran on 1 of 2 layers"):
        check_applied("a", n_rows=1, root=tmp_path)


def test_captures_that_overflow_the_buffer_fail_with_a_message_and_others_keep_their_rows(
    tmp_path: Path,
):
    runtime = _runtime(tmp_path, capture_rows=8)
    runtime.add_requests(
        [
            _new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 2),
            _new("B", AcsPayload("b", capture_layers=(0, 1)), 5, 2),
        ]
    )
    _step(runtime, [("A", 0, 3), ("B", 0, 5)])  # A: 6 rows, B would need 10 more
    with pytest.raises(CaptureIncompleteError, match="capture buffer"):
        check_applied("b", n_rows=1, root=tmp_path)
    _step(runtime, [("A", 3, 1), ("B", 5, 1)])
    rows = bf16_bits_to_float(read_capture("a", n_layers=2, hidden=HIDDEN, n_rows=4, root=tmp_path))
    assert rows[1, :, 0].tolist() == [11.0, 12.0, 13.0, 14.0]


def test_a_steering_bank_too_small_fails_the_request_that_does_not_fit(tmp_path: Path):
    runtime = _runtime(tmp_path, steering_slots=2)  # the zero row and one slot
    one = encode_array(np.ones((1, HIDDEN), dtype=np.float32))
    two = encode_array(np.full((1, HIDDEN), 2.0, dtype=np.float32))
    runtime.add_requests(
        [
            _new("A", AcsPayload("a", steering=(SteeringEntry(one, (1,)),)), 3, 2),
            _new("B", AcsPayload("b", steering=(SteeringEntry(one, (0,)),)), 3, 2),  # shares
            _new("C", AcsPayload("c", steering=(SteeringEntry(two, (1,)),)), 3, 2),
        ]
    )
    seen = _step(runtime, [("A", 0, 3), ("B", 0, 3), ("C", 0, 3)])
    assert seen[1][:, 0].tolist() == [11.0, 12.0, 13.0, 60.0, 61.0, 62.0, 110.0, 111.0, 112.0]
    assert seen[0][3:6, 0].tolist() == [51.0, 52.0, 53.0]
    with pytest.raises(CaptureIncompleteError, match="steering bank"):
        check_applied("c", n_rows=3, root=tmp_path)
    assert check_applied("a", n_rows=3, root=tmp_path).rows_done == 3
    runtime.finish_requests(["A", "B", "C"])
    assert runtime.buffers.steering.free_slots == 1


def test_a_payload_the_model_cannot_serve_fails_loudly(tmp_path: Path):
    runtime = _runtime(tmp_path)
    wide = encode_array(np.ones((1, HIDDEN + 1), dtype=np.float32))
    runtime.add_requests(
        [
            _new("A", AcsPayload("a", capture_layers=(2,)), 3, 2),
            _new("B", AcsPayload("b", steering=(SteeringEntry(wide, (0,)),)), 3, 2),
            NewRequest("C", {"acs": '{"v": 1, "capture_id": "c", "steering": 5}'}, 3, 2),
            NewRequest("D", {"acs": "garbage"}, 3, 2),
        ]
    )
    _step(runtime, [("A", 0, 3), ("B", 0, 3), ("C", 0, 3), ("D", 0, 3)])
    with pytest.raises(CaptureIncompleteError, match="capture layer 2"):
        check_applied("a", n_rows=3, root=tmp_path)
    with pytest.raises(CaptureIncompleteError, match="hidden size"):
        check_applied("b", n_rows=3, root=tmp_path)
    with pytest.raises(CaptureIncompleteError, match="steering must be a list"):
        check_applied("c", n_rows=3, root=tmp_path)
    with pytest.raises(CaptureMissingError):
        check_applied("d", n_rows=3, root=tmp_path)


def test_idle_steps_plan_nothing(tmp_path: Path):
    runtime = _runtime(tmp_path)
    runtime.add_requests([_new("B", None, 3, 2)])
    assert not runtime.active
    assert not runtime.needs_step  # compat skips begin_step and end_step altogether
    runtime.add_requests([_new("W", AcsPayload("w", capture_layers=(0,)), 3, 2)])
    runtime.begin_step({"B": 0}, np.array([0, 3]), np.array([0]), 3)  # W still waits
    assert not runtime.stepping and not runtime.buffers.dirty
    runtime.end_step(True)


def test_a_step_whose_requests_moved_in_the_batch_is_planned_again(tmp_path: Path):
    """Decode steps of an unchanged batch reuse the index rows; a plain request's prefill chunk
    ahead of a steered one shifts its token (same batch row, same count): not reused."""
    runtime = _runtime(tmp_path)
    vector = encode_array(np.ones((1, HIDDEN), dtype=np.float32))
    runtime.add_requests(
        [_new("S", AcsPayload("s", steering=(SteeringEntry(vector, (0,)),)), 2, 4)]
    )
    seen = _step(runtime, [("P", 0, 3), ("S", 2, 1)])
    assert seen[0][:, 0].tolist() == [0.0, 1.0, 2.0, 53.0]
    seen = _step(runtime, [("P", 3, 2), ("S", 3, 1)])
    assert seen[0][:, 0].tolist() == [3.0, 4.0, 54.0]
    seen = _step(runtime, [("P", 5, 2), ("S", 4, 1)])  # the same layout: reused
    assert seen[0][:, 0].tolist() == [5.0, 6.0, 55.0]
