"""Capture as capture-buffer rows: each step gives every captured (token, layer) of the batch a
row of the intervention op's capture buffer (hooks/intervention_buffers.py), then files the rows
in each request's capture file once the forward pass is done. Runs in each vLLM worker (tested
without vLLM).

A request's rows of one step sit together in the buffer, token-major then layer (`[tokens,
layers, hidden]`), which is the capture file's own layout: filing them is one copy per request.
A step that would need more rows than the buffer holds fits each request that still fits in
what the requests before it left (in table order, the order they arrived), and returns the
others, with the rows each needed, to fail loudly (never a silently missing row): one request
too big for the step does not fail the smaller ones after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .intervention_op import CAPTURE_ROW


class CaptureSegment(NamedTuple):
    """One request's share of a step: `length` tokens at buffer rows `first_row`.. (`length` x
    its number of layers)."""

    target: np.ndarray  # int16 bf16 bits [capacity, n_layers_of_request, hidden]: the mapped file
    first_row: int
    length: int


class CaptureStep(NamedTuple):
    segments: list[CaptureSegment]
    kept: np.ndarray  # the table's requests with rows in this step
    rows: int  # buffer rows used by this step
    touched: set[int]  # layers with a captured token
    # (request in table order, rows it needed) for each request that did not fit in the buffer
    overflow: list[tuple[int, int]]


class CaptureTable:
    """A fixed list of capture requests (the runtime makes a new table when it changes): their
    files and layers, stacked, and each step's rows for them."""

    def __init__(self, requests: Sequence[tuple[np.ndarray, Sequence[int]]]) -> None:
        """`requests`: (target file rows, layers ascending) per capture request."""
        self._targets = [target for target, _ in requests]
        self._width = np.asarray([len(layers) for _, layers in requests], dtype=np.int64)
        self._who = np.concatenate(
            [np.full(len(layers), i, dtype=np.int64) for i, (_, layers) in enumerate(requests)]
        )
        self._layer = np.concatenate([np.asarray(layers, dtype=np.int64) for _, layers in requests])
        # A layer's place among its request's layers: its row within one token's block.
        self._slot = np.concatenate([np.arange(len(layers)) for _, layers in requests])

    def plan(
        self,
        view: np.ndarray,
        capacity: int,
        starts: np.ndarray,
        lengths: np.ndarray,
        positions: np.ndarray,
    ) -> CaptureStep:
        """int64 arrays over the table's requests: first batch row, number of tokens to keep in
        this step (0 = none; already cut to what each file holds), first absolute position.
        Writes the capture rows into `view` ([tokens, fields, layers])."""
        need = lengths * self._width
        overflow: list[tuple[int, int]] = []
        if int(need.sum()) > capacity:
            fits = _fit_in_order(need, capacity)
            overflow = [(i, int(need[i])) for i in np.flatnonzero(~fits & (need > 0)).tolist()]
            lengths = np.where(fits, lengths, 0)
            need = lengths * self._width
        first_row = np.cumsum(need) - need
        counts = lengths[self._who]
        touched: set[int] = set()
        if counts.any():
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            tokens = np.repeat(starts[self._who], counts) + offsets
            rows = np.repeat(first_row[self._who] + self._slot, counts) + offsets * np.repeat(
                self._width[self._who], counts
            )
            view[tokens, CAPTURE_ROW, np.repeat(self._layer, counts)] = rows
            touched.update(self._layer[counts > 0].tolist())
        kept = np.flatnonzero(lengths)
        segments = [
            CaptureSegment(self._targets[i], first, length)
            for i, first, length in zip(
                kept.tolist(), first_row[kept].tolist(), lengths[kept].tolist(), strict=True
            )
        ]
        return CaptureStep(segments, kept, int(need.sum()), touched, overflow)


def _fit_in_order(need: np.ndarray, capacity: int) -> np.ndarray:
    """Which requests get rows when the step's captures do not all fit: each request, in
    order, that fits in what the ones before it left. A request that does not fit takes
    nothing, so a later, smaller one may still fit (only a crowded step comes here)."""
    fits = np.zeros(len(need), dtype=bool)
    left = capacity
    for i, rows in enumerate(need.tolist()):
        if 0 < rows <= left:
            fits[i] = True
            left -= rows
    return fits


def file_rows(bits: np.ndarray, segments: Sequence[CaptureSegment], positions: list[int]) -> None:
    """After the forward pass: the step's buffer rows (bf16 bits) into each request's file, the
    first of each segment at its absolute position."""
    for (target, first_row, length), position in zip(segments, positions, strict=True):
        width = target.shape[1]
        if length == 1:  # a decode step: one position, its layers in a row
            target[position] = bits[first_row : first_row + width]
        else:
            block = bits[first_row : first_row + length * width]
            target[position : position + length] = block.reshape(length, width, -1)
