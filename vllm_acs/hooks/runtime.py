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
from .capture import CaptureStep, StagingBuffer, plan_capture
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


class ActivationRuntime:
    def __init__(
        self,
        *,
        n_layers: int,
        hidden: int,
        dtype: torch.dtype,
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
        self._staging = StagingBuffer(hidden, dtype, device)
        self._planner = SteeringPlanner(hidden)
        self._capture: CaptureStep | None = None
        self._steer: dict[int, LayerSteer] = {}
        self._advance: list[tuple[_Request, int]] = []
        self._layers_seen = 0

    @property
    def active(self) -> bool:
        return bool(self._requests)

    def add_requests(self, requests: Iterable[NewRequest]) -> None:
        for new in requests:
            if not new.extra_args or "acs" not in new.extra_args or new.req_id in self._requests:
                continue
            state = self._admit(new)
            if state is not None:
                self._requests[new.req_id] = state

    def finish_requests(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            state = self._requests.pop(req_id, None)
            if state is not None and state.writer is not None:
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
                CaptureWriter.create(
                    self.root, capture_id, n_layers=0, capacity=0, hidden=self.hidden
                ).fail(message)
        except (ValueError, TypeError, KeyError, CaptureError, OSError):
            pass

    def begin_step(
        self,
        req_id_to_index: Mapping[str, int],
        query_start_loc: np.ndarray,
        num_computed_tokens: np.ndarray,
    ) -> None:
        """Before the forward pass: the rows of this step's batch that capture or steer."""
        captures: list[tuple[np.ndarray, tuple[int, ...], int, int, int]] = []
        steers: list[tuple[list[SteeringRow], int, int, int]] = []
        self._advance = []
        for req_id, state in self._requests.items():
            index = req_id_to_index.get(req_id)
            if index is None or state.failed:
                continue
            start = int(query_start_loc[index])
            length = int(query_start_loc[index + 1]) - start
            position = int(num_computed_tokens[index])
            if length <= 0:
                continue
            if state.steering:
                steers.append((state.steering, start, length, position))
            if state.target is not None and state.writer is not None:
                # The file holds prompt + max_tokens - 1 rows: a last pass beyond is not kept.
                kept = min(length, state.writer.capacity - position)
                if kept > 0:
                    try:
                        state.writer.reserve(position + kept)
                    except OSError as exc:
                        state.fail(f"the capture directory is full: {exc}")
                        continue
                    captures.append(
                        (state.target, state.payload.capture_layers, start, kept, position)
                    )
                self._advance.append((state, min(position + length, state.writer.capacity)))
            else:
                self._advance.append((state, position + length))
        self._steer = self._planner.plan(steers) if steers else {}
        self._capture = plan_capture(captures, self._staging)

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
        if stepped and seen != self.n_layers:
            # A compiled or otherwise rewired model would skip the hooks: never report success.
            for state, _ in advance:
                state.fail(f"hooks ran on {seen} of {self.n_layers} layers in a forward pass")
            return
        if capture is not None:
            capture.write_out()
        for state, rows_done in advance:
            if state.writer is not None and not state.failed:
                state.writer.advance(rows_done)

    @property
    def stepping(self) -> bool:
        return self._capture is not None or bool(self._steer)
