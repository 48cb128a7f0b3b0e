"""Capture on plain tensors: gather the residual stream of capture requests' tokens after a
decoder block into a reused staging buffer, then copy each request's rows to its capture file once
per step. Runs in each vLLM worker (tested without vLLM).

Inside the forward pass a captured layer costs two index_selects and one add into the staging
buffer: no host copy, no `.item()`, nothing per request. After the pass, one device-to-host copy
of the staging buffer per step, then one strided copy per request into its file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch


class CaptureSegment(NamedTuple):
    """One capture request's share of a step: `length` rows of the staging buffer (after the
    segments before it), for absolute positions `position`..; `slots` are the staging slots of
    its layers, ascending by layer. A tuple: a step makes one per capture request."""

    target: np.ndarray  # int16 bf16 bits [capacity, n_layers_of_request, hidden]: the mapped file
    length: int
    position: int
    slots: slice | np.ndarray  # the request's staging slots: a slice when contiguous


class StagingBuffer:
    """[slots, tokens, hidden], reused across steps; grows only when a step needs more."""

    def __init__(self, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        self.hidden = hidden
        self.dtype = dtype
        self.device = device
        self._buffer = torch.empty((0, 0, hidden), dtype=dtype, device=device)

    def take(self, slots: int, tokens: int) -> torch.Tensor:
        have_slots, have_tokens, _ = self._buffer.shape
        if slots > have_slots or tokens > have_tokens:
            shape = (max(slots, have_slots), max(tokens, have_tokens, 64), self.hidden)
            self._buffer = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._buffer[:slots, :tokens]


@dataclass
class CaptureStep:
    """One step's capture: which batch rows, which layers to which slot, where rows go after."""

    token_index: torch.Tensor  # int64 [n], on the model's device
    slot_of_layer: dict[int, int]
    staging: torch.Tensor  # [len(slot_of_layer), n, hidden]
    segments: list[CaptureSegment]

    def gather(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        """In the forward hook: the full residual stream (hidden + residual) of the rows."""
        slot = self.slot_of_layer.get(layer)
        if slot is None:
            return
        torch.add(
            hidden.index_select(0, self.token_index),
            residual.index_select(0, self.token_index),
            out=self.staging[slot],
        )

    def write_out(self) -> None:
        """After the forward pass: staging -> each request's file rows."""
        host = self.staging if self.staging.device.type == "cpu" else self.staging.cpu()
        # numpy slicing costs a fraction of torch's per call, and there is one call per request.
        bits = host.view(torch.int16).numpy()
        offset = 0
        for target, length, position, slots in self.segments:
            if length == 1:  # a decode step: one row, no transpose
                target[position] = bits[slots, offset]
            else:
                # [slots, tokens, hidden] -> the file's position-major [tokens, slots, hidden].
                rows = bits[slots, offset : offset + length]
                target[position : position + length] = rows.transpose(1, 0, 2)
            offset += length


def _slot_selector(slots: list[int]) -> slice | np.ndarray:
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return np.array(slots)


class CapturePlanner:
    """A fixed list of capture requests (the runtime makes a new planner when it changes): their
    files, their layers' staging slots, and each step's CaptureStep from a few numpy ops."""

    def __init__(
        self,
        requests: Sequence[tuple[np.ndarray, Sequence[int]]],
        staging: StagingBuffer,
    ) -> None:
        """`requests`: (target file rows, layers ascending) per capture request."""
        layers = sorted({layer for _, request_layers in requests for layer in request_layers})
        self.slot_of_layer = {layer: slot for slot, layer in enumerate(layers)}
        # Requests usually share layer sets: one slot selector per distinct set.
        selectors: dict[tuple[int, ...], slice | np.ndarray] = {}
        self._requests: list[tuple[np.ndarray, slice | np.ndarray]] = []
        for target, request_layers in requests:
            key = tuple(request_layers)
            selector = selectors.get(key)
            if selector is None:
                selector = _slot_selector([self.slot_of_layer[layer] for layer in key])
                selectors[key] = selector
            self._requests.append((target, selector))
        self._staging = staging

    def plan(
        self, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray
    ) -> CaptureStep | None:
        """int64 arrays over the planner's requests: first batch row, number of rows to keep in
        this step (0 = none; already cut to what each file holds), first absolute position."""
        total = int(lengths.sum())
        if total == 0:
            return None
        offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        token_index = np.repeat(starts, lengths) + offsets
        kept = np.flatnonzero(lengths)
        segments = [
            CaptureSegment(self._requests[i][0], length, position, self._requests[i][1])
            for i, length, position in zip(
                kept.tolist(), lengths[kept].tolist(), positions[kept].tolist(), strict=True
            )
        ]
        return CaptureStep(
            token_index=torch.from_numpy(token_index).to(self._staging.device),
            slot_of_layer=self.slot_of_layer,
            staging=self._staging.take(len(self.slot_of_layer), total),
            segments=segments,
        )
