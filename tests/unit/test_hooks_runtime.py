"""The worker's per-step activation runtime, driven as compat.py drives it, without vLLM."""

from __future__ import annotations

import types
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
    read_header,
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


def test_only_the_capture_that_does_not_fit_fails_and_its_message_gives_the_size(
    tmp_path: Path,
):
    runtime = _runtime(tmp_path, capture_rows=8)
    runtime.add_requests(
        [
            _new("A", AcsPayload("a", capture_layers=(0, 1)), 2, 2),
            _new("B", AcsPayload("b", capture_layers=(0, 1)), 5, 2),
            _new("C", AcsPayload("c", capture_layers=(0, 1)), 2, 2),
        ]
    )
    _step(runtime, [("A", 0, 2), ("B", 0, 5), ("C", 0, 2)])  # 4 + 10 + 4 rows for 8
    with pytest.raises(CaptureIncompleteError) as failed:
        check_applied("b", n_rows=1, root=tmp_path)
    message = str(failed.value)
    assert (
        "needs 10 rows (5 tokens x 2 layers) in one step, more than the capture buffer's 8 "
        in message
    )
    assert "(VLLM_ACS_CAPTURE_BUFFER_MB=" in message
    for capture_id, index in (("a", 0), ("c", 2)):  # both fit beside each other: both kept
        rows = read_capture(capture_id, n_layers=2, hidden=HIDDEN, n_rows=2, root=tmp_path)
        assert bf16_bits_to_float(rows)[1, :, 0].tolist() == [11.0 + 50 * index, 12.0 + 50 * index]


def test_a_capture_crowded_out_of_one_step_is_told_so(tmp_path: Path):
    runtime = _runtime(tmp_path, capture_rows=8)
    runtime.add_requests(
        [
            _new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 2),
            _new("B", AcsPayload("b", capture_layers=(0, 1)), 3, 2),
        ]
    )
    _step(runtime, [("A", 0, 3), ("B", 0, 3)])  # 6 + 6 rows for 8: each fits alone
    with pytest.raises(
        CaptureIncompleteError,
        match=r"crowded step.*6 rows \(3 tokens x 2 layers\).*VLLM_ACS_CAPTURE_BUFFER_MB",
    ):
        check_applied("b", n_rows=1, root=tmp_path)
    assert check_applied("a", n_rows=3, root=tmp_path).rows_done == 3


class _LateCopy:
    """A copy that lands when the test says so, as a GPU's may, steps later."""

    def __init__(self, bits: np.ndarray) -> None:
        self._bits = bits
        self.landed = False
        self.waited = False

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:  # a host wait returns once the copy has landed
        self.waited = True
        self.landed = True

    def bits(self) -> np.ndarray:
        assert self.landed, "rows read before their copy landed"
        return self._bits


class _LateDevice:
    """The copy-out's device interface as CUDA gives it, without a GPU: a copy takes the rows
    the forward pass wrote (the device orders the next pass's writes after it) but lands only
    when `land` is called; `slots` host buffers."""

    synchronous = False

    def __init__(self, capture_buffer: torch.Tensor, slots: int = 2) -> None:
        self._bits = capture_buffer.view(torch.int16).numpy()
        self.slots = slots
        self.in_flight: list[_LateCopy] = []
        self.started = 0
        self.ordered_captures = 0

    def has_room(self) -> bool:
        return len(self.in_flight) < self.slots

    def start(self, rows: int) -> _LateCopy:
        copy = _LateCopy(self._bits[:rows].copy())
        self.in_flight.append(copy)
        self.started += 1
        return copy

    def release(self, copy: _LateCopy) -> None:
        self.in_flight.remove(copy)

    def before_capture(self) -> None:
        self.ordered_captures += 1

    def land(self) -> None:
        for copy in self.in_flight:
            copy.landed = True


def _late_runtime(root: Path, slots: int = 2) -> tuple[ActivationRuntime, _LateDevice]:
    buffers = InterventionBuffers(
        n_layers=2,
        hidden=HIDDEN,
        max_tokens=32,
        bank_slots=16,
        capture_mb=1024 * 2 * HIDDEN / (1024 * 1024),
        device=torch.device("cpu"),
    )
    device = _LateDevice(buffers.capture_buffer, slots)
    return ActivationRuntime(buffers=buffers, root=root, writes_files=True, copies=device), device


def _layer1(capture_id: str, n_rows: int, root: Path) -> list[float]:
    rows = read_capture(capture_id, n_layers=2, hidden=HIDDEN, n_rows=n_rows, root=root)
    return bf16_bits_to_float(rows)[1, :, 0].tolist()


def test_rows_are_filed_only_once_their_copy_has_landed(tmp_path: Path):
    runtime, device = _late_runtime(tmp_path)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 3)])
    _step(runtime, [("A", 0, 3)])
    assert device.started == 1 and runtime.output_mark == 1
    assert read_header("a", root=tmp_path).rows_done == 0  # nothing claimed before it landed
    # The next step begins before the copy has landed: nothing filed, nothing waited for, and
    # the pass that writes the buffer again is ordered after the copy (on the device).
    _step(runtime, [("A", 3, 1)])
    assert read_header("a", root=tmp_path).rows_done == 0
    assert not any(copy.waited for copy in device.in_flight)
    assert device.ordered_captures == 2 and runtime.output_mark == 2
    device.land()
    _step(runtime, [("P", 0, 1)])  # a later step (A not in it) files what has landed
    assert runtime.output_mark is None and device.in_flight == []
    assert _layer1("a", 4, tmp_path) == [11.0, 12.0, 13.0, 14.0]


def test_a_steps_output_leaves_only_after_its_rows_are_filed(tmp_path: Path):
    """compat.hold_output: the engine gets a step's output (and so a request's final one)
    only once the step's rows are in the file. The stand-in output checks the capture as the
    API server would when it gets the final output; without the hold it would find 0 rows."""
    from vllm_acs.hooks import compat

    runtime, device = _late_runtime(tmp_path)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 2)])
    seen: list[int] = []

    class AsyncOutput:  # vLLM's AsyncModelRunnerOutput: its output thread calls get_output
        def get_output(self) -> str:
            seen.append(check_applied("a", n_rows=4, root=tmp_path).rows_done)
            return "sampled"

    _step(runtime, [("A", 0, 3)])
    first = compat.hold_output(runtime, object())  # synchronous scheduling: held right here
    assert device.in_flight == [] and read_header("a", root=tmp_path).rows_done == 3
    _step(runtime, [("A", 3, 1)])  # the step that samples A's last token
    output = compat.hold_output(runtime, AsyncOutput())
    assert read_header("a", root=tmp_path).rows_done == 3  # the step itself did not wait
    assert output.get_output() == "sampled" and seen == [4]
    assert first is not None and _layer1("a", 4, tmp_path) == [11.0, 12.0, 13.0, 14.0]


def test_sample_tokens_outputs_are_held_and_an_idle_steps_pass_untouched(tmp_path: Path):
    from vllm_acs.hooks import compat

    runtime, device = _late_runtime(tmp_path)
    runner = types.SimpleNamespace(sample_tokens=lambda grammar_output: grammar_output)
    compat._hold_sampled_outputs(runner, runtime)
    plain = types.SimpleNamespace(get_output=lambda: "plain")
    getter = plain.get_output
    assert runner.sample_tokens(plain) is plain and plain.get_output is getter  # no capture
    vector = encode_array(np.ones((1, HIDDEN), dtype=np.float32))
    runtime.add_requests(
        [_new("S", AcsPayload("s", steering=(SteeringEntry(vector, (0,)),)), 2, 2)]
    )
    _step(runtime, [("S", 0, 2)])  # steering only: no copy, rows_done raised at once
    assert device.started == 0 and runtime.output_mark is None
    assert check_applied("s", n_rows=2, root=tmp_path).rows_done == 2
    assert runner.sample_tokens(plain) is plain and plain.get_output is getter
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(1,)), 2, 2)])
    _step(runtime, [("A", 0, 2)])
    held = runner.sample_tokens(types.SimpleNamespace(get_output=lambda: "sampled"))
    assert read_header("a", root=tmp_path).rows_done == 0
    assert held.get_output() == "sampled" and read_header("a", root=tmp_path).rows_done == 2


def test_rows_done_never_overtakes_rows_still_on_their_way(tmp_path: Path):
    """A step with no rows to copy (A's extra pass past what its file keeps) queues its
    rows_done behind the earlier steps' rows instead of raising it first."""
    runtime, device = _late_runtime(tmp_path)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 2, 2)])  # 3 rows
    _step(runtime, [("A", 0, 2)])
    _step(runtime, [("A", 2, 1)])
    _step(runtime, [("A", 3, 1)])  # nothing kept: no copy
    assert device.started == 2 and read_header("a", root=tmp_path).rows_done == 0
    device.land()
    runtime.copy_out.file_ready()
    assert read_header("a", root=tmp_path).rows_done == 3
    assert _layer1("a", 3, tmp_path) == [11.0, 12.0, 13.0]


def test_a_request_finished_while_its_rows_are_on_their_way_gets_them_then_closes(
    tmp_path: Path,
):
    runtime, device = _late_runtime(tmp_path)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 2)])
    writer = runtime._requests["A"].writer
    assert writer is not None
    _step(runtime, [("A", 0, 3)])
    runtime.finish_requests(["A"])  # an abort can come before the copy lands
    assert hasattr(writer, "rows")  # still open
    device.land()
    runtime.copy_out.file_ready()
    assert not hasattr(writer, "rows")  # closed once filed
    assert read_header("a", root=tmp_path).rows_done == 3
    assert _layer1("a", 3, tmp_path) == [11.0, 12.0, 13.0]


def test_with_every_host_buffer_in_use_the_oldest_step_is_filed_first(tmp_path: Path):
    runtime, device = _late_runtime(tmp_path, slots=1)
    runtime.add_requests([_new("A", AcsPayload("a", capture_layers=(0, 1)), 3, 3)])
    _step(runtime, [("A", 0, 3)])
    first = device.in_flight[0]
    _step(runtime, [("A", 3, 1)])  # no room: waits for the first step's rows and files them
    assert first.waited and device.in_flight != [first]
    assert read_header("a", root=tmp_path).rows_done == 3 and runtime.output_mark == 2
    runtime.file_through(2)
    assert _layer1("a", 4, tmp_path) == [11.0, 12.0, 13.0, 14.0]
