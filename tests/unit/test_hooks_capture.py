"""Capture as capture-buffer rows, on plain tensors: the rows a step gives each request, the op
copying the stream there, the rows filed per request; a buffer too small for a step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_acs.hooks.capture import CaptureSegment, CaptureTable, file_rows
from vllm_acs.hooks.capture_copy import CaptureCopyOut, CudaCopies
from vllm_acs.hooks.intervention_buffers import InterventionBuffers
from vllm_acs.hooks.intervention_op import (
    CAPTURE_ROW,
    CAPTURES,
    CPU_GATE,
    apply_interventions,
    intervene,
    plan_layers,
)

HIDDEN = 4


def _buffers(capture_rows: int) -> InterventionBuffers:
    return InterventionBuffers(
        n_layers=3,
        hidden=HIDDEN,
        max_tokens=16,
        bank_slots=2,
        capture_mb=capture_rows * 2 * HIDDEN / (1024 * 1024),
        device=torch.device("cpu"),
    )


def test_rows_of_each_request_land_at_their_positions_and_layers():
    buffers = _buffers(64)
    a = np.zeros((10, 2, HIDDEN), dtype=np.int16)  # bf16 bits, layers (0, 2)
    b = np.zeros((10, 1, HIDDEN), dtype=np.int16)  # layer (1,)
    # Batch of 7 rows: a plain request (rows 0-1), A's chunk at positions 4..6 (rows 2-4),
    # B decoding position 8 (row 6).
    table = CaptureTable([(a, (0, 2)), (b, (1,))])
    positions = np.array([4, 8])
    step = table.plan(
        buffers.host_view, buffers.capture_rows, np.array([2, 6]), np.array([3, 1]), positions
    )
    assert step.rows == 3 * 2 + 1 and step.touched == {0, 1, 2} and step.overflow == []
    # Tokens that capture nothing at a layer write the scratch row.
    assert buffers.host_view[0, CAPTURE_ROW].tolist() == [buffers.scratch_row] * 3
    outputs = {}
    for layer in range(3):
        hidden = torch.arange(7 * HIDDEN, dtype=torch.float32).reshape(7, HIDDEN) + 100 * layer
        residual = torch.ones(7, HIDDEN)
        apply_interventions(
            hidden.bfloat16(),
            residual.bfloat16(),
            buffers.bank,
            buffers.indices,
            buffers.capture_buffer,
            layer,
        )
        outputs[layer] = (hidden + residual).bfloat16().view(torch.int16).numpy()
    file_rows(buffers.read_capture_rows(step.rows), step.segments, positions[step.kept].tolist())
    assert np.array_equal(a[4:7, 0], outputs[0][2:5])
    assert np.array_equal(a[4:7, 1], outputs[2][2:5])
    assert np.array_equal(b[8, 0], outputs[1][6])
    assert not a[:4].any() and not a[7:].any() and not b[:8].any()


def test_the_cpu_kernel_writes_the_rows_the_dense_math_writes():
    """The CPU kernel writes evenly spaced rows through a view of the buffer and others by a
    gather; both must equal the branch-free math (the CUDA kernel), bit for bit."""
    batches = {
        "one request, whole chunk": [(np.zeros((8, 1, HIDDEN), np.int16), (1,), 0, 5)],
        "one request, two layers (rows two apart)": [
            (np.zeros((8, 2, HIDDEN), np.int16), (0, 1), 0, 5)
        ],
        "a token in the middle captures nothing": [
            (np.zeros((8, 1, HIDDEN), np.int16), (1,), 0, 2),
            (np.zeros((8, 1, HIDDEN), np.int16), (1,), 3, 2),
        ],
        "requests of different widths": [
            (np.zeros((8, 2, HIDDEN), np.int16), (0, 1), 0, 2),
            (np.zeros((8, 1, HIDDEN), np.int16), (1,), 2, 3),
        ],
    }
    for name, requests in batches.items():
        results = []
        for planned in (False, True):
            buffers = _buffers(64)
            table = CaptureTable([(target, layers) for target, layers, _, _ in requests])
            starts = np.array([start for *_, start, _ in requests])
            lengths = np.array([length for *_, length in requests])
            step = table.plan(
                buffers.host_view, buffers.capture_rows, starts, lengths, np.zeros_like(starts)
            )
            work = [CAPTURES if n in step.touched else 0 for n in range(3)]
            CPU_GATE.layer_plans = plan_layers(
                buffers.bank, buffers.indices, buffers.capture_buffer, work, 5
            )
            for layer in range(3):
                hidden = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(layer))
                args = (hidden.bfloat16(), torch.ones(5, HIDDEN).bfloat16())
                buffer_args = (buffers.bank, buffers.indices, buffers.capture_buffer, layer)
                if planned:
                    intervene()(*args, *buffer_args)
                else:
                    apply_interventions(*args, *buffer_args)
            CPU_GATE.layer_plans = []
            results.append(buffers.read_capture_rows(step.rows).copy())
        assert np.array_equal(results[0], results[1]), name


def test_a_step_without_rows_to_keep_plans_nothing():
    buffers = _buffers(8)
    table = CaptureTable([(np.zeros((4, 1, HIDDEN), dtype=np.int16), (0,))])
    step = table.plan(buffers.host_view, 8, np.array([3]), np.array([0]), np.array([4]))
    assert step.rows == 0 and step.segments == [] and step.touched == set()


def test_only_the_requests_that_do_not_fit_are_named_and_get_no_rows():
    buffers = _buffers(8)
    files = [np.zeros((10, 2, HIDDEN), dtype=np.int16) for _ in range(3)]
    table = CaptureTable([(f, (0, 1)) for f in files])
    # 2 + 3 + 1 tokens at 2 layers: 4, 6 and 2 rows for a buffer of 8. The first fits; the
    # second does not fit in the 4 left; the third still does (a running total failed it too).
    step = table.plan(
        buffers.host_view, 8, np.array([0, 2, 5]), np.array([2, 3, 1]), np.array([0, 0, 0])
    )
    assert step.overflow == [(1, 6)]
    assert [(s.first_row, s.length) for s in step.segments] == [(0, 2), (4, 1)]
    assert step.rows == 6 and step.kept.tolist() == [0, 2]
    assert (buffers.host_view[2:5, CAPTURE_ROW, :2] == buffers.scratch_row).all()
    assert buffers.host_view[5, CAPTURE_ROW, :2].tolist() == [4, 5]


def test_a_request_too_big_for_any_step_fails_alone_whatever_its_place():
    buffers = _buffers(8)
    files = [np.zeros((10, 2, HIDDEN), dtype=np.int16) for _ in range(3)]
    table = CaptureTable([(f, (0, 1)) for f in files])
    # 5 tokens at 2 layers (10 rows) never fit in 8; the 1-token requests around it do.
    step = table.plan(
        buffers.host_view, 8, np.array([0, 1, 6]), np.array([1, 5, 1]), np.array([0, 0, 0])
    )
    assert step.overflow == [(1, 10)]
    assert [s.first_row for s in step.segments] == [0, 2] and step.rows == 4


def test_a_step_that_fits_takes_the_plain_path_and_names_nobody():
    buffers = _buffers(8)
    table = CaptureTable([(np.zeros((10, 2, HIDDEN), dtype=np.int16), (0, 1))] * 2)
    step = table.plan(buffers.host_view, 8, np.array([0, 2]), np.array([2, 2]), np.zeros(2, int))
    assert step.overflow == [] and step.rows == 8  # exactly full


def test_the_buffer_size_follows_the_setting_not_the_depth_or_batch():
    small = InterventionBuffers(
        n_layers=80,
        hidden=8192,
        max_tokens=8192,
        bank_slots=2,
        capture_mb=64,
        device=torch.device("cpu"),
    )
    assert small.capture_rows == 64 * 1024 * 1024 // (2 * 8192)
    assert small.capture_buffer.shape == (small.capture_rows + 1, 8192)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_file_the_rows_their_pass_wrote_not_the_next_passs():
    """The copy-out's CUDA device: the rows come back through pinned memory on a side stream,
    and a later pass that writes the buffer again (ordered by before_capture) does not change
    what is filed."""
    rows, width = 4096, 2
    buffer = torch.zeros((rows + 1, HIDDEN), dtype=torch.bfloat16, device="cuda")
    copies = CudaCopies(buffer, slots=2)
    out = CaptureCopyOut(copies)
    target = np.zeros((rows // width, width, HIDDEN), dtype=np.int16)
    values = torch.arange(rows * HIDDEN, device="cuda").reshape(rows, HIDDEN) % 251
    buffer[:rows] = values.bfloat16()  # the pass
    out.submit(rows, [CaptureSegment(target, 0, rows // width)], [0], [])
    assert out.mark == 1
    out.before_capture()
    buffer[:rows] = -1  # the next pass
    out.file_through(1)
    expected = values.bfloat16().view(torch.int16).cpu().numpy()
    assert np.array_equal(target.reshape(rows, HIDDEN), expected) and out.mark is None
