"""Per-worker activation state: which requests capture or steer, and each forward step's plan.

Runs in each vLLM worker. compat.py feeds it vLLM's per-step facts as plain values (new and
finished requests, the batch's request rows and positions); it drives capture.py and steering.py
and owns the capture files (activations/store.py). Tested without vLLM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..activations.payload import AcsPayload, PayloadError
from ..activations.store import CaptureError, CaptureWriter
from .capture import CapturePlanner, CaptureStep, StagingBuffer
from .steering import (
    LayerSteer,
    SteeringPlanner,
    SteeringRow,
    SteeringSpecError,
    apply_layer_steer,
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
        self.steering: list[SteeringRow] = []
        self.failed = False

    def fail(self, message: str) -> None:
        logger.error("activation request %s failed: %s", self.payload.capture_id, message)
        self.failed = True
        if self.writer is not None:
            self.writer.fail(message)


class _Roster:
    """The in-flight requests that have not failed, in a fixed order, with the planners of their
    steering and capture. Made anew only when a request arrives, finishes or fails, so that a
    step costs a few numpy ops over these arrays rather than Python work per request."""

    def __init__(self, requests: Mapping[str, _Request], staging: StagingBuffer) -> None:
        live = [(req_id, state) for req_id, state in requests.items() if not state.failed]
        self.req_ids = [req_id for req_id, _ in live]
        self.states = [state for _, state in live]
        steered = [i for i, state in enumerate(self.states) if state.steering]
        self.steered = np.asarray(steered, dtype=np.int64)
        self.steering = (
            SteeringPlanner([self.states[i].steering for i in steered]) if steered else None
        )
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
        self.capture = CapturePlanner(files, staging) if files else None
        # A capture file counts the rows it holds; a steer-only request, every position it saw.
        self.rows_limit = np.full(len(self.states), np.iinfo(np.int64).max, dtype=np.int64)
        self.rows_limit[self.captured] = self.capacity


class ActivationRuntime:
    def __init__(
        self,
        *,
        n_layers: int,
        hidden: int,
        device: torch.device,
        root: Path,
        writes_files: bool,
    ) -> None:
        self.n_layers = n_layers
        self.hidden = hidden
        self.device = device
        self.root = root
        # With tensor parallelism every rank steers, but only one writes the capture files.
        self.writes_files = writes_files
        self._requests: dict[str, _Request] = {}
        # Rows are kept as bf16 whatever the model's dtype: the spec's codec carries bf16 bits.
        self._staging = StagingBuffer(hidden, torch.bfloat16, device)
        self._roster: _Roster | None = None
        self._hook_layers: tuple[int, ...] | None = None
        self._capture: CaptureStep | None = None
        self._steer: dict[int, LayerSteer] = {}
        self._advance: list[tuple[_Request, int]] = []
        self._layers_seen = 0

    @property
    def active(self) -> bool:
        return bool(self._requests)

    @property
    def hook_layers(self) -> tuple[int, ...]:
        """The decoder layers whose hooks the in-flight requests need, ascending; only these are
        hooked (a hooked module takes torch's slower call path)."""
        if self._hook_layers is None:
            layers = {
                layer
                for state in self._requests.values()
                for layer in (
                    *state.payload.capture_layers,
                    *(row.layer for row in state.steering),
                )
                if 0 <= layer < self.n_layers
            }
            self._hook_layers = tuple(sorted(layers))
        return self._hook_layers

    def add_requests(self, requests: Iterable[NewRequest]) -> None:
        for new in requests:
            if not new.extra_args or "acs" not in new.extra_args or new.req_id in self._requests:
                continue
            state = self._admit(new)
            if state is not None:
                self._requests[new.req_id] = state
                self._roster = self._hook_layers = None

    def finish_requests(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            state = self._requests.pop(req_id, None)
            if state is None:
                continue
            self._roster = self._hook_layers = None
            if state.writer is not None:
                state.target = None
                state.writer.close()

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
        try:
            state.steering = steering_rows(
                payload.steering,
                n_layers=self.n_layers,
                hidden=self.hidden,
                prompt_len=new.prompt_len,
                device=self.device,
            )
        except SteeringSpecError as exc:
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
    ) -> None:
        """Before the forward pass: the rows of this step's batch that capture or steer."""
        if self._roster is None:
            self._roster = _Roster(self._requests, self._staging)
        roster = self._roster
        rows = np.fromiter(
            (req_id_to_index.get(req_id, -1) for req_id in roster.req_ids),
            dtype=np.int64,
            count=len(roster.req_ids),
        )
        present = rows >= 0
        rows[~present] = 0
        starts = query_start_loc[rows].astype(np.int64)
        lengths = np.maximum(np.where(present, query_start_loc[rows + 1] - starts, 0), 0)
        positions = num_computed_tokens[rows].astype(np.int64)
        capture = None
        if roster.capture is not None:
            c = roster.captured
            # A file holds prompt + max_tokens - 1 rows: a last pass beyond is not kept.
            kept = np.maximum(np.minimum(lengths[c], roster.capacity - positions[c]), 0)
            ends = positions[c] + kept
            for j in np.flatnonzero(ends > roster.reserved).tolist():
                state = roster.states[c[j]]
                assert state.writer is not None
                try:
                    state.writer.reserve(int(ends[j]))
                except OSError as exc:
                    self._fail(state, f"the capture directory is full: {exc}")
                    # The roster changed: plan the step again without this request.
                    self.begin_step(req_id_to_index, query_start_loc, num_computed_tokens)
                    return
                roster.reserved[j] = state.writer.reserved
            capture = roster.capture.plan(starts[c], kept, positions[c])
        steer: dict[int, LayerSteer] = {}
        if roster.steering is not None:
            s = roster.steered
            steer = roster.steering.plan(starts[s], lengths[s], positions[s])
        done = np.minimum(positions + lengths, roster.rows_limit)
        moved = np.flatnonzero(lengths)
        self._advance = [
            (roster.states[i], rows_done)
            for i, rows_done in zip(moved.tolist(), done[moved].tolist(), strict=True)
        ]
        self._steer = steer
        self._capture = capture

    def _fail(self, state: _Request, message: str) -> None:
        state.fail(message)
        self._roster = None

    def on_layer(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        """The forward hook of decoder block `layer`: steer first, so the capture shows the
        stream that flows on."""
        self._layers_seen += 1
        steer = self._steer.get(layer)
        if steer is not None:
            apply_layer_steer(hidden, residual, steer)
        if self._capture is not None:
            self._capture.gather(layer, hidden, residual)

    def end_step(self, completed: bool) -> None:
        """After the forward pass: rows to the files, then mark them done (in that order)."""
        capture, advance, seen = self._capture, self._advance, self._layers_seen
        stepped = self.stepping
        self._capture, self._steer, self._advance, self._layers_seen = None, {}, [], 0
        if not completed:
            return
        expected = len(self.hook_layers)
        if stepped and seen != expected:
            # A compiled or otherwise rewired model would skip the hooks: never report success.
            for state, _ in advance:
                self._fail(state, f"hooks ran on {seen} of {expected} hooked layers in a step")
            return
        if capture is not None:
            capture.write_out()
        for state, rows_done in advance:
            if state.writer is not None and not state.failed:
                state.writer.advance(rows_done)

    @property
    def stepping(self) -> bool:
        return self._capture is not None or bool(self._steer)
