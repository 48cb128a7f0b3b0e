"""Steering as bank slots, on plain tensors: which tokens get which vector, scale, norm_match,
positions; and the op's math that adds them (hooks/steering.py, hooks/intervention_op.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_acs.activations.codec import encode_array
from vllm_acs.activations.payload import SteeringEntry
from vllm_acs.hooks.intervention_buffers import BankFullError, InterventionBuffers
from vllm_acs.hooks.intervention_op import (
    CPU_GATE,
    NORM_STEERS,
    STEERS,
    apply_interventions,
    intervene,
    plan_layers,
)
from vllm_acs.hooks.steering import (
    SteeringSpecError,
    SteeringTable,
    request_slots,
    slot_vectors,
    steering_rows,
)

HIDDEN = 8
N_LAYERS = 4


def _rows(vectors: np.ndarray, layers: tuple[int, ...], prompt_len: int = 10, **more):
    entry = SteeringEntry(activations=encode_array(vectors), layer_indices=layers, **more)
    return steering_rows([entry], n_layers=N_LAYERS, hidden=HIDDEN, prompt_len=prompt_len)


def _buffers(slots: int = 16) -> InterventionBuffers:
    return InterventionBuffers(
        n_layers=N_LAYERS,
        hidden=HIDDEN,
        max_tokens=16,
        bank_slots=slots,
        capture_mb=0.01,
        device=torch.device("cpu"),
    )


class _Step:
    """One step: requests' rows, their first batch row, tokens in the step, first position."""

    def __init__(self, segments, buffers: InterventionBuffers | None = None) -> None:
        self.buffers = buffers or _buffers()
        requests = [
            request_slots(slot_vectors(rows), self.buffers.steering.acquire)
            for rows, *_ in segments
        ]
        table = SteeringTable(requests)
        columns = [np.array([s[k] for s in segments], dtype=np.int64) for k in (1, 2, 3)]
        self.plain, self.norm = table.write(self.buffers.host_view, *columns)
        self.touched = self.plain | self.norm

    def apply(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The branch-free math (the CUDA kernel's); checked equal, bit for bit, to the CPU
        kernel, which does only the parts the host plan names."""
        buffers = self.buffers
        dense = hidden.clone()
        apply_interventions(
            dense, residual, buffers.bank, buffers.indices, buffers.capture_buffer, layer
        )
        planned = hidden.clone()
        work = [
            (STEERS if n in self.plain else 0) | (NORM_STEERS if n in self.norm else 0)
            for n in range(N_LAYERS)
        ]
        CPU_GATE.layer_plans = plan_layers(
            buffers.bank, buffers.indices, buffers.capture_buffer, work, len(hidden)
        )
        intervene()(planned, residual, buffers.bank, buffers.indices, buffers.capture_buffer, layer)
        assert torch.equal(planned.view(-1), dense.view(-1))
        return dense


def test_a_vector_is_added_to_its_request_rows_only():
    rows = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,), scale=3.0)
    # Batch: request A rows 0-2 (steered), request B rows 3-4 (not steered).
    step = _Step([(rows, 0, 3, 0)])
    assert step.touched == {1}
    out = step.apply(1, torch.zeros(5, HIDDEN), torch.zeros(5, HIDDEN))
    assert torch.equal(out[:3], torch.full((3, HIDDEN), 3.0))
    assert torch.equal(out[3:], torch.zeros(2, HIDDEN))
    assert torch.equal(step.apply(0, torch.zeros(5, HIDDEN), torch.zeros(5, HIDDEN)), out * 0)


def test_one_row_per_layer_index():
    vectors = np.stack([np.full(HIDDEN, 1.0), np.full(HIDDEN, 2.0)]).astype(np.float32)
    step = _Step([(_rows(vectors, (0, 2)), 0, 2, 0)])
    assert step.touched == {0, 2}
    zeros = torch.zeros(2, HIDDEN)
    assert torch.equal(step.apply(0, zeros, zeros), torch.ones(2, HIDDEN))
    assert torch.equal(step.apply(2, zeros, zeros), torch.full((2, HIDDEN), 2.0))


def test_scale_zero_adds_exactly_nothing():
    rows = _rows(np.ones((1, HIDDEN), dtype=np.float32), (0,), scale=0.0, norm_match=True)
    hidden = torch.randn(4, HIDDEN).to(torch.bfloat16)
    out = _Step([(rows, 0, 4, 0)]).apply(0, hidden, hidden.clone())
    assert torch.equal(out.view(torch.int16), hidden.view(torch.int16))


def test_norm_match_uses_the_full_residual_stream():
    direction = np.zeros((1, HIDDEN), dtype=np.float32)
    direction[0, 0] = 5.0  # its own norm must not matter
    rows = _rows(direction, (0,), scale=0.5, norm_match=True)
    hidden = torch.zeros(1, HIDDEN)
    hidden[0, 1] = 3.0
    residual = torch.zeros(1, HIDDEN)
    residual[0, 2] = 4.0  # |hidden + residual| = 5, |hidden| alone = 3
    out = _Step([(rows, 0, 1, 0)]).apply(0, hidden, residual)
    assert out[0, 0].item() == pytest.approx(0.5 * 5.0)


def test_tokens_that_all_read_one_slot_share_its_bank_row_with_the_same_results():
    """The CPU plan reads one bank row, broadcast, where every token of the step reads the same
    slot (no gathered copy per token); bit-identical to the branch-free math in bf16, plain and
    norm-matched alike; a step where some tokens are at rest still gathers."""
    plain = _rows(np.linspace(-1, 1, HIDDEN, dtype=np.float32)[None], (2,), scale=0.3)
    norm = _rows(np.linspace(1, 2, HIDDEN, dtype=np.float32)[None], (2,), norm_match=True)
    hidden = torch.randn(6, HIDDEN).to(torch.bfloat16)
    residual = torch.randn(6, HIDDEN).to(torch.bfloat16)
    shared = _Step([(plain + norm, 0, 3, 0), (plain + norm, 3, 3, 7)])
    shared.apply(2, hidden, residual)  # checks planned == dense, bit for bit
    plan = CPU_GATE.layer_plans[2]
    assert plan.plain.shape == (1, HIDDEN) and plan.norm.shape == (1, HIDDEN)
    mixed = _Step([(plain + norm, 0, 3, 0)])
    mixed.apply(2, hidden, residual)
    assert CPU_GATE.layer_plans[2].plain.shape == (6, HIDDEN)


def test_position_indices_follow_absolute_positions_across_chunks_and_decode():
    vectors = np.ones((1, 2, HIDDEN), dtype=np.float32)
    vectors[0, 1] = 2.0
    # Prompt of 10: -1 is position 9; 11 is the second generated token's position.
    rows = _rows(vectors, (0,), prompt_len=10, position_indices=(-1, 11))
    assert rows[0].positions == (9, 11)
    zeros = torch.zeros(12, HIDDEN)
    # First chunk, positions 0..7 at batch rows 4..11: nothing to steer.
    assert _Step([(rows, 4, 8, 0)]).touched == set()
    # Second chunk, positions 8..9 at batch rows 2..3: position 9 -> batch row 3, vector 0.
    out = _Step([(rows, 2, 2, 8)]).apply(0, zeros, zeros)
    assert out[:, 0].nonzero().flatten().tolist() == [3] and out[3, 0].item() == 1.0
    # Decode of position 11 at batch row 6: vector 1.
    out = _Step([(rows, 6, 1, 11)]).apply(0, zeros, zeros)
    assert out[:, 0].nonzero().flatten().tolist() == [6] and out[6, 0].item() == 2.0


def test_several_requests_and_overlapping_vectors_add_up():
    a = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,))
    b = _rows(np.ones((1, HIDDEN), dtype=np.float32), (1,), scale=-2.0, norm_match=True)
    step = _Step([(a + a + b, 0, 1, 5), (b, 1, 2, 0)])
    residual = torch.zeros(3, HIDDEN)
    residual[:, 0] = 4.0
    out = step.apply(1, torch.zeros(3, HIDDEN), residual)
    unit = 1.0 / np.sqrt(HIDDEN)
    # Request 0: both plain vectors, plus its norm-matched one at the stream's norm (4).
    np.testing.assert_allclose(out[0].numpy(), np.full(HIDDEN, 2.0 - 2.0 * 4.0 * unit), rtol=1e-6)
    np.testing.assert_allclose(out[1:].numpy(), np.full((2, HIDDEN), -8.0 * unit), rtol=1e-6)


def test_every_position_and_position_indexed_rows_of_one_layer_add_up():
    everywhere = _rows(np.ones((1, HIDDEN), dtype=np.float32), (0,))
    indexed = _rows(np.full((1, 1, HIDDEN), 3.0, dtype=np.float32), (0,), position_indices=(5,))
    step = _Step([(everywhere, 0, 2, 4), (everywhere + indexed, 2, 3, 4)])
    out = step.apply(0, torch.zeros(5, HIDDEN), torch.zeros(5, HIDDEN))
    assert out[:, 0].tolist() == [1.0, 1.0, 1.0, 4.0, 1.0]


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


def test_slots_are_shared_by_content_counted_and_freed():
    buffers = _buffers(slots=4)  # the zero row and 3 free slots
    bank = buffers.steering
    ones, twos, threes, fours = (np.full(HIDDEN, v, dtype=np.float32) for v in (1, 2, 3, 4))
    first = bank.acquire([ones, twos])
    assert bank.acquire([ones]) == first[:1] and bank.free_slots == 1
    with pytest.raises(BankFullError, match="1 free slots and this request needs 2"):
        bank.acquire([threes, fours])
    assert bank.free_slots == 1  # all or none
    assert torch.equal(buffers.bank[first[1]], torch.from_numpy(twos))
    bank.release(first)
    assert bank.free_slots == 2  # `ones` is still held once
    bank.release(first[:1])
    assert bank.free_slots == 3 and not buffers.bank[0].any()
