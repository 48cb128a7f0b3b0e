"""A harvest's safetensors files: the shards (`shard_00000.safetensors`, ... each holding, for the
prompts it covers, `prompt_{i}` (bf16 `[n_layers_kept, n_tokens, hidden]`) and `tokens_{i}` (int32
`[n_tokens]`)), `stats.safetensors`, and the statistics' saved state a resumed run starts from.

API server process (the harvest job). The activations arrive as the bf16 bits the workers wrote
(uint16); they are reinterpreted, never converted, so a shard holds exactly what was captured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SHARD_PATTERN = "shard_{:05d}.safetensors"


@dataclass(frozen=True)
class HarvestedPrompt:
    """One prompt's capture: `index` in the request, its tokens, the kept layers' rows."""

    index: int
    tokens: np.ndarray  # int32 [n_tokens]
    bits: np.ndarray  # uint16 bf16 bits [n_layers_kept, n_tokens, hidden]

    def __post_init__(self) -> None:
        if self.bits.ndim != 3 or self.bits.shape[1] != self.tokens.shape[0]:
            raise ValueError(
                f"prompt {self.index}: rows {self.bits.shape} do not match "
                f"{self.tokens.shape[0]} tokens"
            )

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def as_float32(self) -> np.ndarray:
        """The rows as float32 (exact: bf16 is the top half of a float32)."""
        return (self.bits.astype(np.uint32) << 16).view(np.float32)


def shard_name(number: int) -> str:
    return SHARD_PATTERN.format(number)


def shard_bytes(prompts: Sequence[HarvestedPrompt]) -> bytes:
    """One shard file's bytes (safetensors, written by its own library)."""
    import torch
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    for prompt in prompts:
        bits = np.ascontiguousarray(prompt.bits).view(np.int16)
        tensors[f"prompt_{prompt.index}"] = torch.from_numpy(bits.copy()).view(torch.bfloat16)
        tensors[f"tokens_{prompt.index}"] = torch.from_numpy(prompt.tokens.astype(np.int32))
    return save(tensors, metadata={"format": "pt"})


def stats_bytes(final: dict[str, np.ndarray], layer_indices: Sequence[int]) -> bytes:
    """`stats.safetensors`: the final per-layer statistics, rows in `layer_indices` order."""
    import torch
    from safetensors.torch import save

    tensors = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in final.items()}
    tensors["layer_indices"] = torch.tensor(list(layer_indices), dtype=torch.int32)
    return save(tensors, metadata={"format": "pt", "rows": "one per kept layer"})


def state_bytes(state: dict[str, np.ndarray]) -> bytes:
    """The statistics' exact accumulator state after a shard, for a resumed run."""
    import torch
    from safetensors.torch import save

    return save({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in state.items()})


def state_from_bytes(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.torch import load

    return {name: tensor.numpy() for name, tensor in load(data).items()}
