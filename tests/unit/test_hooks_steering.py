"""Steering on plain tensors: which rows get which vector, scale, norm_match, positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_acs.activations.codec import encode_array
from vllm_acs.activations.payload import SteeringEntry
from vllm_acs.hooks.steering import (
    SteeringPlanner,
    SteeringSpecError,
    apply_layer_steer,
    steering_rows,
)

HIDDEN = 8
CPU = torch.device("cpu")


def _rows(vectors: np.ndarray, layers: tuple[int, ...], prompt_len: int = 10, **more):
    entry = SteeringEntry(activations=encode_array(vectors), layer_indices=layers, **more)
    return steering_rows([entry], n_layers=4, hidden=HIDDEN, prompt_len=prompt_len, device=CPU)


def _arrays(segments, column: int) -> np.ndarray:
    return np.array([segment[column] for segment in segments], dtype=np.int64)


def plan_layer_steers(segments):
    """One step of a new planner. segments: (rows, first batch row, tokens, first position)."""
    planner = SteeringPlanner([rows for rows, *_ in segments])
    return planner.plan(_arrays(segments, 1), _arrays(segments, 2), _arrays(segments, 3))


def _apply(plan, layer: int, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    hidden = hidden.clone()
    apply_layer_steer(hidden, residual, plan[layer])
    return hidden


def test_a_vector_is_added_to_its_request_rows_only():
    ones = np.ones((1, HIDDEN), dtype=np.float32)
    rows = _rows(ones, (1,), scale=3.0)
    # Batch: request A rows 0-2 (steered), request B rows 3-4 (not in the plan).
    plan = plan_layer_steers([(rows, 0, 3, 0)])
    assert set(plan) == {1}
    hidden, residual = torch.zeros(5, HIDDEN), torch.zeros(5, HIDDEN)
    out = _apply(plan, 1, hidden, residual)
    assert torch.equal(out[:3], torch.full((3, HIDDEN), 3.0))
    assert torch.equal(out[3:], torch.zeros(2, HIDDEN))


def test_one_row_per_layer_index():
    vectors = np.stack([np.full(HIDDEN, 1.0), np.full(HIDDEN, 2.0)]).astype(np.float32)
    plan = plan_layer_steers([(_rows(vectors, (0, 2)), 0, 2, 0)])
    assert torch.equal(plan[0].delta, torch.ones(2, HIDDEN))
    assert torch.equal(plan[2].delta, torch.full((2, HIDDEN), 2.0))


def test_scale_zero_adds_exactly_nothing():
    rows = _rows(np.ones((1, HIDDEN), dtype=np.float32), (0,), scale=0.0, norm_match=True)
    hidden = torch.randn(4, HIDDEN).to(torch.bfloat16)
    out = _apply(plan_layer_steers([(rows, 0, 4, 0)]), 0, hidden, hidden.clone())
    assert torch.equal(out, hidden)


def test_norm_match_uses_the_full_residual_stream():
    direction = np.zeros((1, HIDDEN), dtype=np.float32)
    direction[0, 0] = 5.0  # its own norm must not matter
    rows = _rows(direction, (0,), scale=0.5, norm_match=True)
    hidden = torch.zeros(1, HIDDEN)
    hidden[0, 1] = 3.0
    residual = torch.zeros(1, HIDDEN)
    residual[0, 2] = 4.0  # |hidden + residual| = 5, |hidden| alone = 3
    out = _apply(plan_layer_steers([(rows, 0, 1, 0)]), 0, hidden, residual)
    assert out[0, 0].item() == pytest.approx(0.5 * 5.0)


def test_position_indices_follow_absolute_positions_across_chunks_and_decode():
    vectors = np.stack([np.full((2, HIDDEN), 1.0), np.full((2, HIDDEN), 1.0)])[:1]
    vectors[0, 1] = 2.0
    # Prompt of 10: -1 is position 9; 11 is the second generated token's position.
    rows = _rows(vectors.astype(np.float32), (0,), prompt_len=10, position_indices=(-1, 11))
    assert rows[0].positions == (9, 11)
    # First chunk, positions 0..7 at batch rows 4..11: nothing to steer.
    assert plan_layer_steers([(rows, 4, 8, 0)]) == {}
    # Second chunk, positions 8..9 at batch rows 2..3: position 9 -> batch row 3, vector 0.
    plan = plan_layer_steers([(rows, 2, 2, 8)])
    assert plan[0].token_index.tolist() == [3]
    assert torch.equal(plan[0].delta, torch.ones(1, HIDDEN))
    # Decode of position 11 at batch row 6: vector 1.
    plan = plan_layer_steers([(rows, 6, 1, 11)])
    assert plan[0].token_index.tolist() == [6]
    assert torch.equal(plan[0].delta, torch.full((1, HIDDEN), 2.0))


def test_several_requests_and_overlapping_vectors_add_up():
    a = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,))
    b = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,), scale=-2.0, norm_match=True)
    plan = plan_layer_steers([(a + a, 0, 1, 5), (b, 1, 2, 0)])
    hidden = torch.zeros(3, HIDDEN)
    residual = torch.zeros(3, HIDDEN)
    residual[1:, 0] = 4.0
    out = _apply(plan, 1, hidden, residual)
    assert torch.equal(out[0], torch.full((HIDDEN,), 2.0))
    expected = -2.0 * 4.0 / np.sqrt(HIDDEN)
    np.testing.assert_allclose(out[1:].numpy(), np.full((2, HIDDEN), expected), rtol=1e-6)


@pytest.mark.parametrize(
    ("vectors", "layers", "more", "message"),
    [
        (np.ones((2, HIDDEN)), (1,), {}, "rows"),
        (np.ones((1, HIDDEN + 1)), (1,), {}, "hidden size"),
        (np.ones((1, HIDDEN)), (4,), {}, "layer 4"),
        (np.ones((1, HIDDEN)), (1,), {"position_indices": (0,)}, "3-D"),
        (np.ones((1, 2, HIDDEN)), (1,), {}, "3-D"),
        (np.ones((1, 2, HIDDEN)), (1,), {"position_indices": (0,)}, "positions"),
        (np.ones((1, 1, HIDDEN)), (1,), {"position_indices": (-11,)}, "before the prompt"),
    ],
)
def test_entries_that_do_not_fit_are_refused(vectors, layers, more, message):
    with pytest.raises(SteeringSpecError, match=message):
        _rows(vectors.astype(np.float32), layers, prompt_len=10, **more)


def test_a_repeated_decode_step_reuses_its_plan_and_a_changed_one_does_not():
    rows = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,))
    other = _rows(np.full((1, HIDDEN), 2.0, dtype=np.float32), (1,))
    planner = SteeringPlanner([rows, other])

    def step(starts, lengths, positions):
        return planner.plan(np.array(starts), np.array(lengths), np.array(positions))

    first = step([0, 1], [1, 1], [10, 4])
    assert step([0, 1], [1, 1], [11, 5])[1] is first[1]
    moved = step([3, 1], [1, 1], [12, 6])
    assert moved[1] is not first[1] and moved[1].token_index.tolist() == [3, 1]
    assert torch.equal(moved[1].delta, torch.tensor([[1.0] * HIDDEN, [2.0] * HIDDEN]))
    # A request not in the step (0 tokens) has no rows in the plan.
    alone = step([0, 5], [0, 2], [13, 7])
    assert alone[1].token_index.tolist() == [5, 6]
    assert torch.equal(alone[1].delta, torch.full((2, HIDDEN), 2.0))
    assert step([0, 0], [0, 0], [13, 9]) == {}


def test_every_position_and_position_indexed_rows_of_one_layer_add_up():
    everywhere = _rows(np.ones((1, HIDDEN), dtype=np.float32), (0,))
    indexed = _rows(np.full((1, 1, HIDDEN), 3.0, dtype=np.float32), (0,), position_indices=(5,))
    plan = plan_layer_steers([(everywhere, 0, 2, 4), (indexed, 2, 3, 4)])
    out = _apply(plan, 0, torch.zeros(5, HIDDEN), torch.zeros(5, HIDDEN))
    assert out[:, 0].tolist() == [1.0, 1.0, 0.0, 3.0, 0.0]
