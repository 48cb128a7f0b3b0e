"""Capture on plain tensors: gather of hidden + residual, layer slots, rows to each target."""

from __future__ import annotations

import numpy as np
import torch

from vllm_acs.hooks.capture import CapturePlanner, StagingBuffer

HIDDEN = 4


def test_rows_of_each_request_land_at_their_positions_and_layers():
    staging = StagingBuffer(HIDDEN, torch.bfloat16, torch.device("cpu"))
    a = np.zeros((10, 2, HIDDEN), dtype=np.int16)  # bf16 bits, layers (0, 2)
    b = np.zeros((10, 1, HIDDEN), dtype=np.int16)  # layer (1,)
    # Batch of 7 rows: a plain request (rows 0-1), A's chunk at positions 4..6 (rows 2-4),
    # B decoding position 8 (row 6).
    planner = CapturePlanner([(a, (0, 2)), (b, (1,))], staging)
    step = planner.plan(np.array([2, 6]), np.array([3, 1]), np.array([4, 8]))
    assert step is not None and step.slot_of_layer == {0: 0, 1: 1, 2: 2}
    assert step.token_index.tolist() == [2, 3, 4, 6]
    outputs = {}
    for layer in range(3):
        hidden = torch.arange(7 * HIDDEN, dtype=torch.float32).reshape(7, HIDDEN) + 100 * layer
        residual = torch.ones(7, HIDDEN)
        step.gather(layer, hidden.bfloat16(), residual.bfloat16())
        outputs[layer] = (hidden + residual).bfloat16().view(torch.int16).numpy()
    step.write_out()
    assert np.array_equal(a[4:7, 0], outputs[0][2:5])
    assert np.array_equal(a[4:7, 1], outputs[2][2:5])
    assert np.array_equal(b[8, 0], outputs[1][6])
    assert not a[:4].any() and not a[7:].any() and not b[:8].any()


def test_a_step_without_rows_to_keep_plans_nothing():
    planner = CapturePlanner(
        [(np.zeros((4, 1, HIDDEN), dtype=np.int16), (0,))],
        StagingBuffer(HIDDEN, torch.bfloat16, torch.device("cpu")),
    )
    assert planner.plan(np.array([3]), np.array([0]), np.array([4])) is None


def test_the_staging_buffer_is_reused_and_grows_only_when_needed():
    staging = StagingBuffer(HIDDEN, torch.bfloat16, torch.device("cpu"))
    first = staging.take(2, 10)
    again = staging.take(1, 5)
    assert again.data_ptr() == first.data_ptr()
    bigger = staging.take(3, 100)
    assert bigger.shape == (3, 100, HIDDEN)
