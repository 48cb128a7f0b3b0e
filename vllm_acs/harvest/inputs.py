"""A harvest's inputs: the request the job row keeps (small) and the tokenized prompts, kept as a
file beside the outputs (a 50 MB body never goes into the database).

API server process: the submit writes them, the job reads them (each attempt, the same ones).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..auth.principal import Principal
from ..storage.files import FileStore

Tokenize = Callable[[str, bool], list[int]]


def input_name(job_id: str) -> str:
    return f"harvests/{job_id}/_input/prompts.npz"


@dataclass(frozen=True)
class HarvestRequest:
    """What the job row stores: who asked, the resolved layers, the shard layout."""

    principal: Principal
    layers: tuple[int, ...]
    shard_size: int
    batch_size: int | None
    n_prompts: int
    n_tokens: int
    max_prompt_tokens: int
    truncated: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        from ..jobs.completion import principal_to_json

        return {
            "principal": principal_to_json(self.principal),
            "layers": list(self.layers),
            "shard_size": self.shard_size,
            "batch_size": self.batch_size,
            "n_prompts": self.n_prompts,
            "n_tokens": self.n_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "truncated": list(self.truncated),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HarvestRequest:
        from ..jobs.completion import principal_from_json

        return cls(
            principal=principal_from_json(data["principal"]),
            layers=tuple(data["layers"]),
            shard_size=int(data["shard_size"]),
            batch_size=data.get("batch_size"),
            n_prompts=int(data["n_prompts"]),
            n_tokens=int(data["n_tokens"]),
            max_prompt_tokens=int(data["max_prompt_tokens"]),
            truncated=tuple(data.get("truncated", ())),
        )


@dataclass(frozen=True)
class HarvestInput:
    """Every prompt's token ids, concatenated, with offsets."""

    tokens: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n_prompts + 1]

    @property
    def n_prompts(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def prompt(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, tokens=self.tokens, offsets=self.offsets)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> HarvestInput:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            return cls(tokens=arrays["tokens"], offsets=arrays["offsets"])


@dataclass(frozen=True)
class PreparedPrompts:
    inputs: HarvestInput
    truncated: tuple[int, ...]


def prepare_prompts(
    prompts: Sequence[str | list[int]], tokenize: Tokenize, max_prompt_tokens: int
) -> PreparedPrompts:
    """Token ids of each prompt (strings as /v1/completions tokenizes them, with BOS), each cut to
    `max_prompt_tokens` (the context less the one generated token); which ones were cut."""
    arrays: list[np.ndarray] = []
    truncated: list[int] = []
    for index, prompt in enumerate(prompts):
        ids = tokenize(prompt, True) if isinstance(prompt, str) else list(prompt)
        if len(ids) > max_prompt_tokens:
            ids = ids[:max_prompt_tokens]
            truncated.append(index)
        arrays.append(np.asarray(ids, dtype=np.int32))
    lengths = np.asarray([0] + [a.shape[0] for a in arrays], dtype=np.int64)
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
    return PreparedPrompts(HarvestInput(tokens, np.cumsum(lengths)), tuple(truncated))


async def save_input(files: FileStore, job_id: str, inputs: HarvestInput) -> None:
    data = await asyncio.to_thread(inputs.to_bytes)
    await files.write(input_name(job_id), data)


async def load_input(files: FileStore, name: str) -> HarvestInput:
    return await asyncio.to_thread(HarvestInput.from_bytes, await files.read(name))
