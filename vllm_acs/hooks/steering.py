"""Steering on plain tensors: per-request vectors added to that request's rows of the residual
stream after a decoder block. Runs in each vLLM worker (tested without vLLM).

A request's steering is turned into `SteeringRow`s once (when it arrives); each forward step turns
the rows of the requests in the batch into one `LayerSteer` per layer (token indices + vectors), so
the layer hook does a fixed number of tensor ops whatever the number of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True)
class _Bank:
    """The rows of one layer that apply at every position, stacked: row k belongs to request
    `who[k]` (an index into the planner's requests)."""

    who: np.ndarray  # int64 [k]
    vectors: torch.Tensor  # float32 [k, hidden]
    norm_match: torch.Tensor | None  # bool [k, 1]; None when no row is norm-matched


class SteeringPlanner:
    """A fixed list of steered requests (the runtime makes a new planner when it changes) and
    each step's LayerSteers for them.

    Rows for every position (no position_indices) are stacked once into one bank per layer, so a
    step costs a few numpy ops per layer whatever the number of requests, and a step whose rows
    sit where the last step's did (decode steps of a stable batch) reuses that step's plan.
    Position-indexed rows are looked at one by one: only their positions in the step count.
    """

    def __init__(self, requests: Sequence[Sequence[SteeringRow]]) -> None:
        stacked: dict[int, tuple[list[int], list[torch.Tensor], list[bool]]] = {}
        self._positioned: list[tuple[int, SteeringRow]] = []
        for number, rows in enumerate(requests):
            for row in rows:
                if row.positions is not None:
                    self._positioned.append((number, row))
                    continue
                who, vectors, flags = stacked.setdefault(row.layer, ([], [], []))
                who.append(number)
                vectors.append(row.vectors[0])
                flags.append(row.norm_match)
        self._banks = {
            layer: _Bank(
                who=np.asarray(who, dtype=np.int64),
                vectors=torch.stack(vectors),
                norm_match=torch.tensor([[f] for f in flags], device=vectors[0].device)
                if any(flags)
                else None,
            )
            for layer, (who, vectors, flags) in stacked.items()
        }
        # Per layer: the bank's first rows and lengths in the last step, and its steer then.
        self._last: dict[int, tuple[np.ndarray, np.ndarray, LayerSteer]] = {}

    def plan(
        self, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray
    ) -> dict[int, LayerSteer]:
        """int64 arrays over the planner's requests: first batch row, number of tokens in this
        step (0 = not in it), absolute position of the first token."""
        plan: dict[int, LayerSteer] = {}
        for layer, bank in self._banks.items():
            counts = lengths[bank.who]
            if not counts.any():
                continue
            first = starts[bank.who]
            last = self._last.get(layer)
            if last is not None and _same(last[0], first) and _same(last[1], counts):
                plan[layer] = last[2]
                continue
            plan[layer] = self._bank_steer(layer, bank, first, counts)
        extra = self._positioned_steers(starts, lengths, positions)
        for layer, parts in extra.items():
            if layer in plan:
                parts.insert(0, plan[layer])
            plan[layer] = _concatenate(parts)
        return plan

    def _bank_steer(
        self, layer: int, bank: _Bank, first: np.ndarray, counts: np.ndarray
    ) -> LayerSteer:
        which = np.repeat(np.arange(len(counts)), counts)
        offsets = np.arange(len(which)) - np.repeat(np.cumsum(counts) - counts, counts)
        device = bank.vectors.device
        which_t = torch.from_numpy(which).to(device)
        flags = bank.norm_match
        steer = LayerSteer(
            token_index=torch.from_numpy(np.repeat(first, counts) + offsets).to(device),
            delta=bank.vectors.index_select(0, which_t),
            norm_match=None if flags is None else flags.index_select(0, which_t),
        )
        self._last[layer] = (first, counts, steer)
        return steer

    def _positioned_steers(
        self, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray
    ) -> dict[int, list[LayerSteer]]:
        steers: dict[int, list[LayerSteer]] = {}
        for number, row in self._positioned:
            length = int(lengths[number])
            position = int(positions[number])
            assert row.positions is not None
            hits = [
                (j, p - position)
                for j, p in enumerate(row.positions)
                if position <= p < position + length
            ]
            if not hits:
                continue
            device = row.vectors.device
            start = int(starts[number])
            steers.setdefault(row.layer, []).append(
                LayerSteer(
                    token_index=torch.tensor([start + o for _, o in hits], device=device),
                    delta=row.vectors[[j for j, _ in hits]],
                    norm_match=torch.full((len(hits), 1), True, device=device)
                    if row.norm_match
                    else None,
                )
            )
        return steers


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def _concatenate(parts: list[LayerSteer]) -> LayerSteer:
    if len(parts) == 1:
        return parts[0]
    norm_match = None
    if any(part.norm_match is not None for part in parts):
        device = parts[0].delta.device
        norm_match = torch.cat(
            [
                torch.zeros((len(part.delta), 1), dtype=torch.bool, device=device)
                if part.norm_match is None
                else part.norm_match
                for part in parts
            ]
        )
    return LayerSteer(
        token_index=torch.cat([part.token_index for part in parts]),
        delta=torch.cat([part.delta for part in parts]),
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
