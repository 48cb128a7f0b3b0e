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

import numpy as np
import torch


@dataclass(frozen=True)
class CaptureSegment:
    """One capture request's share of a step: `length` tokens from batch row `start`, at absolute
    positions `position`..; `slots` are the staging slots of its layers, ascending by layer."""

    target: np.ndarray  # int16 bf16 bits [capacity, n_layers_of_request, hidden]: the mapped file
    start: int
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
        for segment in self.segments:
            rows = bits[segment.slots, offset : offset + segment.length]
            # [slots, tokens, hidden] -> the file's position-major [tokens, slots, hidden].
            segment.target[segment.position : segment.position + segment.length] = rows.transpose(
                1, 0, 2
            )
            offset += segment.length


def _slot_selector(slots: list[int]) -> slice | np.ndarray:
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return np.array(slots)


def plan_capture(
    segments: Sequence[tuple[np.ndarray, Sequence[int], int, int, int]],
    staging: StagingBuffer,
) -> CaptureStep | None:
    """`segments`: (target, layers, first batch row, number of tokens, first position) per capture
    request in the step, already cut to the rows the file can hold."""
    if not segments:
        return None
    layers = sorted({layer for _, request_layers, _, _, _ in segments for layer in request_layers})
    slot_of_layer = {layer: slot for slot, layer in enumerate(layers)}
    index = np.concatenate(
        [np.arange(start, start + length, dtype=np.int64) for _, _, start, length, _ in segments]
    )
    # Requests usually share layer sets: one slot selector per distinct set, not per request.
    selectors: dict[tuple[int, ...], slice | np.ndarray] = {}
    planned = []
    for target, request_layers, start, length, position in segments:
        key = tuple(request_layers)
        selector = selectors.get(key)
        if selector is None:
            selector = selectors[key] = _slot_selector([slot_of_layer[layer] for layer in key])
        planned.append(CaptureSegment(target, start, length, position, selector))
    return CaptureStep(
        token_index=torch.from_numpy(index).to(staging.device),
        slot_of_layer=slot_of_layer,
        staging=staging.take(len(layers), len(index)),
        segments=planned,
    )
