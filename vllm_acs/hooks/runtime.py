"""Per-worker activation state: which requests capture or steer, and each forward step's plan.

Runs in each vLLM worker. compat.py feeds it vLLM's per-step facts as plain values (new and
finished requests, the batch's request rows and positions); it writes each step's slots and
capture rows into the intervention op's index buffer (steering.py, capture.py,
intervention_buffers.py), hands the captured rows to the copy-out after the pass
(capture_copy.py: filed off the step's critical path, before the step's output leaves the
worker) and owns the capture files (activations/store.py). Tested without vLLM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..activations.payload import AcsPayload, PayloadError
from ..activations.store import CaptureError, CaptureWriter
from .capture import CaptureStep, CaptureTable
from .capture_copy import CaptureCopyOut, CopyDevice, CudaCopies, HostCopies
from .intervention_buffers import BankFullError, InterventionBuffers
from .intervention_op import CAPTURES, CPU_GATE, NORM_STEERS, STEERS, LayerPlan, plan_layers
from .steering import (
    RequestSlots,
    SteeringSpecError,
    SteeringTable,
    request_slots,
    slot_vectors,
    steering_rows,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewRequest:
    req_id: str
    extra_args: Mapping[str, Any] | None
    prompt_len: int
    max_tokens: int


class _Request:
    """One ACS request's worker-side state, from arrival to finish."""

    def __init__(self, payload: AcsPayload, writer: CaptureWriter | None) -> None:
        self.payload = payload
        self.writer = writer
        self.target: np.ndarray | None = None  # the writer's rows, bf16 bits as int16
        self.slots: RequestSlots | None = None  # its steering in bank slots
        self.failed = False

    def fail(self, message: str) -> None:
        logger.error("activation request %s failed: %s", self.payload.capture_id, message)
        self.failed = True
        if self.writer is not None:
            self.writer.fail(message)


class _Roster:
    """The in-flight requests that have not failed, in a fixed order, with the tables of their
    steering slots and capture layers. Made anew only when a request arrives, finishes or fails,
    so that a step costs a few numpy ops over these arrays rather than Python work per request."""

    def __init__(self, requests: Mapping[str, _Request]) -> None:
        live = [(req_id, state) for req_id, state in requests.items() if not state.failed]
        self.req_ids = [req_id for req_id, _ in live]
        self.states = [state for _, state in live]
        steered = [i for i, state in enumerate(self.states) if state.slots is not None]
        self.steered = np.asarray(steered, dtype=np.int64)
        self.steering = (
            SteeringTable([self.states[i].slots for i in steered]) if steered else None  # type: ignore[misc]
        )
        # Position-indexed vectors land on other tokens as positions move: no step reuses rows.
        self.fixed_layout = self.steering is None or not self.steering.positioned
        captured: list[int] = []
        files: list[tuple[np.ndarray, tuple[int, ...]]] = []
        writers: list[CaptureWriter] = []
        for i, state in enumerate(self.states):
            if state.target is not None and state.writer is not None:
                captured.append(i)
                files.append((state.target, state.payload.capture_layers))
                writers.append(state.writer)
        self.captured = np.asarray(captured, dtype=np.int64)
        self.capacity = np.asarray([w.capacity for w in writers], dtype=np.int64)
        self.reserved = np.asarray([w.reserved for w in writers], dtype=np.int64)
        self.capture = CaptureTable(files) if files else None
        # A capture file counts the rows it holds; a steer-only request, every position it saw.
        self.rows_limit = np.full(len(self.states), np.iinfo(np.int64).max, dtype=np.int64)
        self.rows_limit[self.captured] = self.capacity


@dataclass(frozen=True)
class _Layout:
    """A step's rows as written into the index buffer, and what they were written for."""

    roster: _Roster
    starts: np.ndarray
    lengths: np.ndarray
    kept: np.ndarray | None
    work: list[int]
    capture: CaptureStep | None
    plans: list[LayerPlan | None]  # the CPU kernel's (empty on other devices)
    moved: np.ndarray  # the roster's requests with tokens in the step
    moved_list: list[int]


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Equal arrays (compared as bytes: cheaper than numpy's element-wise compare on the few
    dozen numbers of a step, which runs every step)."""
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class ActivationRuntime:
    def __init__(
        self,
        *,
        buffers: InterventionBuffers,
        root: Path,
        writes_files: bool,
        copies: CopyDevice | None = None,
    ) -> None:
        """`copies`: how captured rows come back from the device (default: in place on CPU, a
        side stream into pinned memory on CUDA; tests pass a fake)."""
        self.buffers = buffers
        if copies is None:
            copies = (
                HostCopies(buffers.capture_buffer)
                if buffers.on_host
                else CudaCopies(buffers.capture_buffer)
            )
        self.copy_out = CaptureCopyOut(copies)
        self.n_layers = buffers.n_layers
        self.hidden = buffers.hidden
        self.root = root
        # With tensor parallelism every rank steers, but only one writes the capture files.
        self.writes_files = writes_files
        self._requests: dict[str, _Request] = {}
        self._roster: _Roster | None = None
        self._capture: CaptureStep | None = None
        self._capture_positions: list[int] = []
        self._last: _Layout | None = None  # the last step's rows in the index buffer
        # The last step's batch (roster, request order, query offsets) and where the roster's
        # requests were in it.
        self._located: tuple[Any, ...] | None = None
        self._advance: list[tuple[_Request, int]] = []
        self._stepping = False
        # The CPU kernel reads which layers a step touches from here (one worker, one model).
        self._gate = CPU_GATE
        self._gate.layer_plans = []

    @property
    def active(self) -> bool:
        return bool(self._requests)

    @property
    def stepping(self) -> bool:
        """Between begin_step and end_step of a step that writes or reads the buffers."""
        return self._stepping

    @property
    def needs_step(self) -> bool:
        """Whether the next step must go through begin_step: requests in flight, or the last
        step's rows still to put back at rest on the device."""
        return bool(self._requests) or self.buffers.dirty

    @property
    def output_mark(self) -> int | None:
        """Right after a step: the filing its output must wait for (`file_through`), or None
        when every captured row of it and of the steps before is filed."""
        return self.copy_out.mark

    def file_through(self, mark: int) -> None:
        """Files the captured rows of the steps up to `mark`, waiting for them to land: before
        the output of the step that gave `mark` leaves the worker (compat.hold_output). Safe
        from vLLM's output thread."""
        self.copy_out.file_through(mark)

    def add_requests(self, requests: Iterable[NewRequest]) -> None:
        for new in requests:
            if not new.extra_args or "acs" not in new.extra_args or new.req_id in self._requests:
                continue
            state = self._admit(new)
            if state is not None:
                self._requests[new.req_id] = state
                self._roster = None

    def finish_requests(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            state = self._requests.pop(req_id, None)
            if state is None:
                continue
            self._roster = None
            self._release_slots(state)
            if state.writer is not None:
                state.target = None
                # Closed once the rows queued for it are filed (an abort may come first).
                self.copy_out.retire(state)

    def _release_slots(self, state: _Request) -> None:
        if state.slots is not None:
            self.buffers.steering.release(state.slots.slots)
            state.slots = None

    def _admit(self, new: NewRequest) -> _Request | None:
        try:
            payload = AcsPayload.from_extra_args(new.extra_args)
        except PayloadError as exc:
            self._fail_unparsed(new, str(exc))
            return None
        assert payload is not None
        layers = payload.capture_layers
        writer: CaptureWriter | None = None
        if self.writes_files:
            capacity = max(0, new.prompt_len + new.max_tokens - 1) if layers else 0
            try:
                writer = CaptureWriter.create(
                    self.root,
                    payload.capture_id,
                    n_layers=len(layers),
                    capacity=capacity,
                    hidden=self.hidden,
                )
            except (CaptureError, OSError) as exc:
                # No file of its own: the API server finds none (or another's) and answers 502.
                logger.error("no capture file for %s: %s", payload.capture_id, exc)
                return None
        state = _Request(payload, writer)
        if layers and layers[-1] >= self.n_layers:
            state.fail(f"capture layer {layers[-1]} is not in [0, {self.n_layers})")
            return state
        if payload.steering:
            try:
                rows = steering_rows(
                    payload.steering,
                    n_layers=self.n_layers,
                    hidden=self.hidden,
                    prompt_len=new.prompt_len,
                )
                state.slots = request_slots(slot_vectors(rows), self.buffers.steering.acquire)
            except (SteeringSpecError, BankFullError) as exc:
                state.fail(str(exc))
                return state
        if writer is not None and layers:
            state.target = writer.rows.view(np.int16)
        return state

    def _fail_unparsed(self, new: NewRequest, message: str) -> None:
        logger.error("request %s carries an invalid acs payload: %s", new.req_id, message)
        try:
            capture_id = json.loads(str((new.extra_args or {}).get("acs")))["capture_id"]
            if self.writes_files:
                writer = CaptureWriter.create(
                    self.root, capture_id, n_layers=0, capacity=0, hidden=self.hidden
                )
                writer.fail(message)
                writer.close()  # no state keeps it: close now, or its descriptor leaks
        except (ValueError, TypeError, KeyError, CaptureError, OSError):
            pass

    def begin_step(
        self,
        req_id_to_index: Mapping[str, int],
        query_start_loc: np.ndarray,
        num_computed_tokens: np.ndarray,
        num_tokens: int,
        batch_order: list[str] | None = None,
    ) -> None:
        """Before the forward pass, once the batch is final: this step's slots and capture rows
        into the index buffer (one copy to the device), for the batch's first `num_tokens`.
        `batch_order`: the batch's request ids in row order, when the caller has them (a batch
        in the same order with the same query offsets as the last step is not looked up again).

        A step laid out as the last one (the same requests at the same first tokens with the same
        token counts: decode steps of a stable batch) finds its rows already there, unless a
        position-indexed vector or a file's end makes it differ: then only positions move."""
        copy_out = self.copy_out
        if copy_out.pending:
            copy_out.file_ready()  # earlier steps' rows that have landed; never waits
        if self._roster is None:
            self._roster = _Roster(self._requests)
        roster = self._roster
        rows, starts, lengths = self._locate(roster, req_id_to_index, query_start_loc, batch_order)
        positions = num_computed_tokens[rows].astype(np.int64)
        kept = None
        if roster.capture is not None:
            c = roster.captured
            # A file holds prompt + max_tokens - 1 rows: a last pass beyond is not kept.
            kept = np.maximum(np.minimum(lengths[c], roster.capacity - positions[c]), 0)
            if not self._reserve(roster, positions[c] + kept):
                # A request failed and the roster changed: plan the step again without it.
                self.begin_step(req_id_to_index, query_start_loc, num_computed_tokens, num_tokens)
                return

        last = self._last
        if (
            last is not None
            and last.roster is roster
            and roster.fixed_layout
            # The same arrays when _locate found the same batch; else compared by value.
            and (last.starts is starts or _same(last.starts, starts))
            and (last.lengths is lengths or _same(last.lengths, lengths))
            and (kept is None or _same(last.kept, kept))
        ):
            layout = last
        else:
            work, capture = self._write_rows(roster, starts, lengths, positions, kept)
            buffers = self.buffers
            plans = (
                plan_layers(buffers.bank, buffers.indices, buffers.capture_buffer, work, num_tokens)
                if buffers.on_host
                else []
            )
            moved = np.flatnonzero(lengths)
            layout = self._last = _Layout(
                roster, starts, lengths, kept, work, capture, plans, moved, moved.tolist()
            )
            buffers.send(num_tokens if any(work) else 0)
        capture = layout.capture
        self._capture_positions = (
            [] if capture is None else positions[roster.captured][capture.kept].tolist()
        )
        if capture is not None and capture.rows:
            # The buffer's rows may still be on their way out from the last step: this pass
            # writes them only after that copy (ordered on the device, the host goes on).
            copy_out.before_capture()
        moved = layout.moved
        done = np.minimum(positions[moved] + lengths[moved], roster.rows_limit[moved])
        states = roster.states
        self._advance = [
            (states[i], rows_done)
            for i, rows_done in zip(layout.moved_list, done.tolist(), strict=True)
        ]
        self._capture = capture
        self._gate.layer_plans = layout.plans
        self._gate.calls = 0
        self._stepping = any(layout.work)

    def _locate(
        self,
        roster: _Roster,
        req_id_to_index: Mapping[str, int],
        query_start_loc: np.ndarray,
        batch_order: list[str] | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per roster request: its first batch row, first token and number of tokens (0: not in
        this step)."""
        located = self._located
        offsets = None
        if batch_order is not None:
            offsets = query_start_loc[: len(batch_order) + 1].tobytes()
            if (
                located is not None
                and located[0] is roster
                and located[1] == batch_order
                and located[2] == offsets
            ):
                return located[3]
        rows = np.fromiter(
            (req_id_to_index.get(req_id, -1) for req_id in roster.req_ids),
            dtype=np.int64,
            count=len(roster.req_ids),
        )
        present = rows >= 0
        rows[~present] = 0
        starts = query_start_loc[rows].astype(np.int64)
        lengths = np.maximum(np.where(present, query_start_loc[rows + 1] - starts, 0), 0)
        if batch_order is not None and offsets is not None:
            self._located = (roster, batch_order, offsets, (rows, starts, lengths))
        return rows, starts, lengths

    def _reserve(self, roster: _Roster, ends: np.ndarray) -> bool:
        """Grows capture files to hold this step's rows; False when one failed (disk full)."""
        beyond = ends > roster.reserved
        if not beyond.any():  # most steps: the files reserve ahead
            return True
        for j in np.flatnonzero(beyond).tolist():
            state = roster.states[roster.captured[j]]
            assert state.writer is not None
            try:
                state.writer.reserve(int(ends[j]))
            except OSError as exc:
                self._fail(state, f"the capture directory is full: {exc}")
                return False
            roster.reserved[j] = state.writer.reserved
        return True

    def _write_rows(
        self,
        roster: _Roster,
        starts: np.ndarray,
        lengths: np.ndarray,
        positions: np.ndarray,
        kept: np.ndarray | None,
    ) -> tuple[list[int], CaptureStep | None]:
        """The step's slots and capture rows into the host index buffer (the last step's put
        back at rest first); what each layer does; the capture's rows."""
        buffers = self.buffers
        buffers.reset_host()
        view = buffers.host_view
        work = [0] * self.n_layers
        capture = None
        if roster.capture is not None:
            c = roster.captured
            capture = roster.capture.plan(view, buffers.capture_rows, starts[c], kept, positions[c])
            for j, need in capture.overflow:
                self._fail(roster.states[c[j]], self._overflow_message(need, int(kept[j])))
            for layer in capture.touched:
                work[layer] |= CAPTURES
        if roster.steering is not None:
            s = roster.steered
            plain, norm = roster.steering.write(view, starts[s], lengths[s], positions[s])
            for layer in plain:
                work[layer] |= STEERS
            for layer in norm:
                work[layer] |= NORM_STEERS
        return work, capture

    def _overflow_message(self, need: int, tokens: int) -> str:
        """Short: the capture file's header keeps 191 bytes of it (the log, all of it)."""
        rows, mb = self.buffers.capture_rows, self.buffers.capture_mb
        what = f"{need} rows ({tokens} tokens x {need // max(tokens, 1)} layers)"
        if need > rows:
            return (
                f"the capture needs {what} in one step, more than the capture buffer's {rows} "
                f"(VLLM_ACS_CAPTURE_BUFFER_MB={mb:g}): capture fewer layers or a shorter prompt"
            )
        return (
            f"a crowded step: the capture needed {what}, and fewer of the capture buffer's "
            f"{rows} (VLLM_ACS_CAPTURE_BUFFER_MB={mb:g}) were left; retry"
        )

    def _fail(self, state: _Request, message: str) -> None:
        state.fail(message)
        self._release_slots(state)
        self._roster = None
        self._last = None

    def end_step(self, completed: bool) -> None:
        """After the forward pass: the captured rows to the copy-out, which files them and
        then raises each request's `rows_done` (in that order) once they have landed: at once
        on CPU; on CUDA at a later step or before this step's output leaves the worker
        (`output_mark`, `file_through`). Nothing here waits for the device."""
        capture, advance, stepped = self._capture, self._advance, self._stepping
        calls = self._gate.calls
        if stepped:
            self._gate.calls_in_last_active_step = calls
        self._capture, self._advance, self._stepping = None, [], False
        self._gate.layer_plans = []
        if not completed:
            return
        if stepped and self.buffers.on_host and calls < self.n_layers:
            # A graph without the op (a stale compile cache, a rewired model) would skip it:
            # never report success. (Under a CUDA graph the kernel's Python does not run.)
            for state, _ in advance:
                self._fail(
                    state,
                    f"capture and steering did not run on every layer: the intervention op ran "
                    f"on {calls} of {self.n_layers} layers (a compiled graph without vllm_acs's "
                    "op, or a model it does not know); the operator's node log says more",
                )
            return
        if capture is not None and capture.rows:
            self.copy_out.submit(capture.rows, capture.segments, self._capture_positions, advance)
        else:
            self.copy_out.submit(0, (), [], advance)
