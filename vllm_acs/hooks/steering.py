"""Steering on plain tensors: per-request vectors added to that request's rows of the residual
stream after a decoder block. Runs in each vLLM worker (tested without vLLM).

A request's steering is turned into `SteeringRow`s once (when it arrives); each forward step turns
the rows of the requests in the batch into one `LayerSteer` per layer (token indices + vectors), so
the layer hook does a fixed number of tensor ops whatever the number of requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..activations.codec import decode_array
from ..activations.payload import SteeringEntry


class SteeringSpecError(ValueError):
    """A steering entry does not fit the model or the prompt (the API should have said 400)."""


@dataclass(frozen=True)
class SteeringRow:
    """One vector to add at one layer: `vectors` [P, hidden] float32, `scale` already applied
    (and unit-normed when `norm_match`); `positions` None = every position, else P absolute
    positions, vector j at positions[j]."""

    layer: int
    vectors: torch.Tensor
    norm_match: bool
    positions: tuple[int, ...] | None


@dataclass(frozen=True)
class LayerSteer:
    """What one layer adds in one step: `delta` rows added at `token_index` rows of the batch."""

    token_index: torch.Tensor  # int64 [m]
    delta: torch.Tensor  # float32 [m, hidden]
    norm_match: torch.Tensor | None  # bool [m, 1]; None when no row is norm-matched


def steering_rows(
    entries: Sequence[SteeringEntry],
    *,
    n_layers: int,
    hidden: int,
    prompt_len: int,
    device: torch.device,
) -> list[SteeringRow]:
    """Decodes and checks a request's entries against the model. Raises SteeringSpecError."""
    rows: list[SteeringRow] = []
    for number, entry in enumerate(entries):
        where = f"apply_steering_vectors[{number}]"
        try:
            vectors = decode_array(entry.activations)
        except ValueError as exc:
            raise SteeringSpecError(f"{where}.activations: {exc}") from None
        if vectors.shape[0] != len(entry.layer_indices):
            raise SteeringSpecError(f"{where}: {vectors.shape[0]} rows for {entry.layer_indices}")
        if vectors.shape[-1] != hidden:
            raise SteeringSpecError(f"{where}: hidden size {vectors.shape[-1]}, model has {hidden}")
        positions = _absolute_positions(entry.position_indices, prompt_len, where)
        if (vectors.ndim == 3) != (positions is not None):
            raise SteeringSpecError(f"{where}: position_indices need a 3-D vector and vice versa")
        if positions is not None and vectors.shape[1] != len(positions):
            raise SteeringSpecError(
                f"{where}: {vectors.shape[1]} vectors for {len(positions)} positions"
            )
        for row, layer in enumerate(entry.layer_indices):
            if not 0 <= layer < n_layers:
                raise SteeringSpecError(f"{where}: layer {layer} is not in [0, {n_layers})")
            per_layer = vectors[row].reshape(-1, hidden).astype(np.float32)
            if entry.norm_match:
                norms = np.linalg.norm(per_layer, axis=-1, keepdims=True)
                per_layer = np.divide(
                    per_layer, norms, out=np.zeros_like(per_layer), where=norms > 0
                )
            tensor = torch.from_numpy(per_layer * np.float32(entry.scale)).to(device)
            rows.append(SteeringRow(layer, tensor, entry.norm_match, positions))
    return rows


def _absolute_positions(
    indices: Sequence[int] | None, prompt_len: int, where: str
) -> tuple[int, ...] | None:
    """DECISIONS.md: p >= 0 is absolute (prompt, then generated); p < 0 counts back from the end
    of the prompt, -1 being the last prompt token."""
    if indices is None:
        return None
    resolved = tuple(p if p >= 0 else prompt_len + p for p in indices)
    if any(p < 0 for p in resolved):
        raise SteeringSpecError(f"{where}.position_indices reach before the prompt's first token")
    return resolved


def plan_layer_steers(
    segments: Iterable[tuple[Sequence[SteeringRow], int, int, int]], hidden: int
) -> dict[int, LayerSteer]:
    """One step's steering, without reuse across steps (see SteeringPlanner)."""
    return SteeringPlanner(hidden).plan(segments)


class SteeringPlanner:
    """Builds each step's LayerSteers. Rows for every position (no position_indices) are stacked
    into one bank per layer, reused while the same rows recur (decode steps of a stable batch), so
    a step costs a few numpy ops per layer rather than tensor ops per request."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden
        self._banks: dict[int, tuple[list[SteeringRow], torch.Tensor, torch.Tensor | None]] = {}
        # Per layer: the rows, starts and lengths of the last step and the plan made for them.
        self._last: dict[int, tuple[list[SteeringRow], list[int], list[int], LayerSteer]] = {}

    def plan(
        self, segments: Iterable[tuple[Sequence[SteeringRow], int, int, int]]
    ) -> dict[int, LayerSteer]:
        """`segments`: (rows of a request, first batch row, number of tokens, absolute position
        of the first token), one per steered request in the batch."""
        everywhere: dict[int, tuple[list[SteeringRow], list[int], list[int]]] = {}
        tokens: dict[int, list[np.ndarray]] = {}
        deltas: dict[int, list[torch.Tensor]] = {}
        flags: dict[int, list[torch.Tensor | None]] = {}
        for rows, start, length, position in segments:
            for row in rows:
                if row.positions is None:
                    group = everywhere.setdefault(row.layer, ([], [], []))
                    group[0].append(row)
                    group[1].append(start)
                    group[2].append(length)
                    continue
                hits = [
                    (j, p - position)
                    for j, p in enumerate(row.positions)
                    if position <= p < position + length
                ]
                if not hits:
                    continue
                tokens.setdefault(row.layer, []).append(
                    np.array([start + offset for _, offset in hits], dtype=np.int64)
                )
                deltas.setdefault(row.layer, []).append(row.vectors[[j for j, _ in hits]])
                flags.setdefault(row.layer, []).append(
                    torch.full((len(hits), 1), row.norm_match, device=row.vectors.device)
                    if row.norm_match
                    else None
                )
        reused: dict[int, LayerSteer] = {}
        for layer, (rows, starts, lengths) in everywhere.items():
            if layer not in tokens:
                # Decode steps of an unchanged batch repeat the last plan exactly: reuse it.
                last = self._last.get(layer)
                if (
                    last is not None
                    and last[1] == starts
                    and last[2] == lengths
                    and self._same_rows(last[0], rows)
                ):
                    reused[layer] = last[3]
                    continue
            bank, bank_flags = self._bank(layer, rows)
            counts = np.asarray(lengths, dtype=np.int64)
            which = np.repeat(np.arange(len(rows)), counts)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            tokens.setdefault(layer, []).append(np.repeat(starts, counts) + offsets)
            which_t = torch.from_numpy(which).to(bank.device)
            deltas.setdefault(layer, []).append(bank.index_select(0, which_t))
            flags.setdefault(layer, []).append(
                None if bank_flags is None else bank_flags.index_select(0, which_t)
            )
        plan = {layer: self._layer(tokens[layer], deltas[layer], flags[layer]) for layer in tokens}
        self._last = {
            layer: (rows, starts, lengths, plan[layer])
            for layer, (rows, starts, lengths) in everywhere.items()
            if layer in plan and len(tokens[layer]) == 1
        }
        self._last.update(
            (layer, (everywhere[layer][0], everywhere[layer][1], everywhere[layer][2], steer))
            for layer, steer in reused.items()
        )
        plan.update(reused)
        return plan

    @staticmethod
    def _same_rows(a: list[SteeringRow], b: list[SteeringRow]) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))

    def _bank(
        self, layer: int, rows: list[SteeringRow]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cached = self._banks.get(layer)
        if cached is not None and self._same_rows(cached[0], rows):
            return cached[1], cached[2]
        bank = torch.cat([row.vectors[0:1] for row in rows])
        bank_flags = None
        if any(row.norm_match for row in rows):
            bank_flags = torch.tensor([[row.norm_match] for row in rows], device=bank.device)
        self._banks[layer] = (rows, bank, bank_flags)
        return bank, bank_flags

    @staticmethod
    def _layer(
        tokens: list[np.ndarray], deltas: list[torch.Tensor], flags: list[torch.Tensor | None]
    ) -> LayerSteer:
        device = deltas[0].device
        norm_match = None
        if any(flag is not None for flag in flags):
            norm_match = torch.cat(
                [
                    torch.zeros((len(d), 1), dtype=torch.bool, device=device) if f is None else f
                    for d, f in zip(deltas, flags, strict=True)
                ]
            )
        return LayerSteer(
            token_index=torch.from_numpy(np.concatenate(tokens)).to(device),
            delta=deltas[0] if len(deltas) == 1 else torch.cat(deltas),
            norm_match=norm_match,
        )


def apply_layer_steer(hidden: torch.Tensor, residual: torch.Tensor, steer: LayerSteer) -> None:
    """Adds the step's vectors to the residual stream (hidden + residual) in place, via `hidden`.

    `norm_match` rows are scaled by the norm of the FULL residual stream at their token (hidden +
    residual, before this layer's vectors), not by the norm of the block's delta alone.
    """
    delta = steer.delta
    if steer.norm_match is not None:
        stream = hidden.index_select(0, steer.token_index).float()
        stream += residual.index_select(0, steer.token_index).float()
        norms = torch.linalg.vector_norm(stream, dim=-1, keepdim=True)
        delta = torch.where(steer.norm_match, delta * norms, delta)
    hidden.index_add_(0, steer.token_index, delta.to(hidden.dtype))
