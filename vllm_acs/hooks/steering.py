"""Steering as bank slots: per-request vectors become slot indices of the intervention op
(hooks/intervention_op.py), written per layer and per token of each step. Runs in each vLLM
worker (tested without vLLM).

A request's entries are decoded and checked once, when it arrives (`steering_rows`), then summed
per layer (`RequestSteering`): vectors that one request adds at the same layer and position sum,
plain and `norm_match` parts apart (a norm-matched part is scaled by the norm of the full residual
stream at its token, inside the op). Each sum takes a bank slot. `SteeringTable` stacks the slots
of a fixed list of requests, so a step writes them with a few numpy ops whatever their number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..activations.codec import decode_array
from ..activations.payload import SteeringEntry
from .intervention_op import NORM_SLOT, STEER_SLOT


class SteeringSpecError(ValueError):
    """A steering entry does not fit the model or the prompt (the API should have said 400)."""


@dataclass(frozen=True)
class SteeringRow:
    """One vector to add at one layer: `vectors` [P, hidden] float32, `scale` already applied
    (and unit-normed when `norm_match`); `positions` None = every position, else P absolute
    positions, vector j at positions[j]."""

    layer: int
    vectors: np.ndarray
    norm_match: bool
    positions: tuple[int, ...] | None


def steering_rows(
    entries: Sequence[SteeringEntry], *, n_layers: int, hidden: int, prompt_len: int
) -> list[SteeringRow]:
    """Decodes and checks a request's entries against the model. Raises SteeringSpecError."""
    rows: list[SteeringRow] = []
    for number, entry in enumerate(entries):
        where = f"apply_steering_vectors[{number}]"
        try:
            vectors = _decoded(_codec_key(entry.activations))
        except ValueError as exc:
            raise SteeringSpecError(f"{where}.activations: {exc}") from None
        if vectors.shape[0] != len(entry.layer_indices):
            raise SteeringSpecError(f"{where}: {vectors.shape[0]} rows for {entry.layer_indices}")
        if vectors.shape[-1] != hidden:
            raise SteeringSpecError(f"{where}: hidden size {vectors.shape[-1]}, model has {hidden}")
        positions = absolute_positions(entry.position_indices, prompt_len, where)
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
            rows.append(
                SteeringRow(layer, per_layer * np.float32(entry.scale), entry.norm_match, positions)
            )
    return rows


def _codec_key(encoded: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (name, tuple(value) if isinstance(value, list) else value)
        for name, value in sorted(encoded.items())
    )


@functools.lru_cache(maxsize=256)
def _decoded(key: tuple[tuple[str, Any], ...]) -> np.ndarray:
    """Decoded vectors by their encoding: a batch that steers with one vector decodes it once
    (base64 and zstd cost more than the rest of a request's admission). Read-only: callers copy."""
    vectors = decode_array(dict((name, list(v) if isinstance(v, tuple) else v) for name, v in key))
    vectors.setflags(write=False)
    return vectors


def absolute_positions(
    indices: Sequence[int] | None, prompt_len: int, where: str = "position_indices"
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
class SlotVectors:
    """What one request adds at one layer, at every position (`position` None) or at one: the
    plain part and the norm-matched part (None when there is none)."""

    layer: int
    position: int | None
    plain: np.ndarray | None
    norm: np.ndarray | None


def slot_vectors(rows: Sequence[SteeringRow]) -> list[SlotVectors]:
    """Sums a request's rows per layer and position. A position-indexed sum includes the
    layer's every-position vectors, since one token reads one slot per part."""
    base: dict[int, list[np.ndarray | None]] = {}
    at: dict[tuple[int, int], list[np.ndarray | None]] = {}

    def add(parts: list[np.ndarray | None], vector: np.ndarray, norm_match: bool) -> None:
        k = 1 if norm_match else 0
        parts[k] = vector.copy() if parts[k] is None else parts[k] + vector

    for row in rows:
        if row.positions is None:
            add(base.setdefault(row.layer, [None, None]), row.vectors[0], row.norm_match)
    for row in rows:
        if row.positions is None:
            continue
        for vector, position in zip(row.vectors, row.positions, strict=True):
            key = (row.layer, position)
            if key not in at:
                at[key] = [None if v is None else v.copy() for v in base.get(row.layer, [None] * 2)]
            add(at[key], vector, row.norm_match)
    out = [SlotVectors(layer, None, p, n) for layer, (p, n) in sorted(base.items())]
    out += [SlotVectors(layer, pos, p, n) for (layer, pos), (p, n) in sorted(at.items())]
    return out


@dataclass(frozen=True)
class RequestSlots:
    """A request's steering in bank slots: one entry per SlotVectors (0 = no such part)."""

    layer: np.ndarray  # int64 [k]
    position: np.ndarray  # int64 [k], -1 = every position
    plain_slot: np.ndarray  # int32 [k]
    norm_slot: np.ndarray  # int32 [k]

    @property
    def slots(self) -> list[int]:
        return [int(s) for s in (*self.plain_slot, *self.norm_slot) if s]


def request_slots(
    parts: Sequence[SlotVectors], acquire: Callable[[list[np.ndarray]], list[int]]
) -> RequestSlots:
    """`acquire(vectors) -> slots` (SteeringBank.acquire) takes all the request's slots at once,
    all or none."""
    vectors = [v for part in parts for v in (part.plain, part.norm) if v is not None]
    taken = iter(acquire(vectors) if vectors else [])
    plain, norm = [], []
    for part in parts:
        plain.append(0 if part.plain is None else next(taken))
        norm.append(0 if part.norm is None else next(taken))
    return RequestSlots(
        layer=np.asarray([part.layer for part in parts], dtype=np.int64),
        position=np.asarray(
            [-1 if part.position is None else part.position for part in parts], dtype=np.int64
        ),
        plain_slot=np.asarray(plain, dtype=np.int32),
        norm_slot=np.asarray(norm, dtype=np.int32),
    )


class SteeringTable:
    """The slots of a fixed list of steered requests (the runtime makes a new table when the
    list changes), stacked, and each step's writes of them into the index buffer."""

    def __init__(self, requests: Sequence[RequestSlots]) -> None:
        who = [np.full(len(r.layer), i, dtype=np.int64) for i, r in enumerate(requests)]
        who_all = np.concatenate(who) if who else np.zeros(0, dtype=np.int64)
        layer = np.concatenate([r.layer for r in requests]) if requests else who_all
        position = np.concatenate([r.position for r in requests]) if requests else who_all
        plain = np.concatenate([r.plain_slot for r in requests]) if requests else who_all
        norm = np.concatenate([r.norm_slot for r in requests]) if requests else who_all
        every = position < 0
        # Every-position parts first, then the positioned ones, which override them per token.
        self._every = (who_all[every], layer[every], plain[every], norm[every])
        self._at = (who_all[~every], layer[~every], position[~every], plain[~every], norm[~every])
        self.positioned = bool((~every).any())

    def write(
        self, view: np.ndarray, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray
    ) -> tuple[set[int], set[int]]:
        """int64 arrays over the table's requests: first batch row, number of tokens in this
        step (0 = not in it), absolute position of the first token. Writes slots into `view`
        ([tokens, fields, layers]) and returns the layers given a plain slot and those given a
        norm-matched slot."""
        plain_layers: set[int] = set()
        norm_layers: set[int] = set()
        who, layer, plain, norm = self._every
        counts = lengths[who]
        if counts.any():
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            tokens = np.repeat(starts[who], counts) + offsets
            layers = np.repeat(layer, counts)
            view[tokens, STEER_SLOT, layers] = np.repeat(plain, counts)
            view[tokens, NORM_SLOT, layers] = np.repeat(norm, counts)
            present = counts > 0
            plain_layers.update(layer[present & (plain > 0)].tolist())
            norm_layers.update(layer[present & (norm > 0)].tolist())
        who, layer, position, plain, norm = self._at
        if len(who):
            first = positions[who]
            hit = (position >= first) & (position < first + lengths[who])
            if hit.any():
                tokens = starts[who][hit] + position[hit] - first[hit]
                view[tokens, STEER_SLOT, layer[hit]] = plain[hit]
                view[tokens, NORM_SLOT, layer[hit]] = norm[hit]
                plain_layers.update(layer[hit & (plain > 0)].tolist())
                norm_layers.update(layer[hit & (norm > 0)].tolist())
        return plain_layers, norm_layers
