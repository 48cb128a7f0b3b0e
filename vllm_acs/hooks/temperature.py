"""Temperatures above vLLM's cap of 2: the rest of the division happens in a logits processor.

EngineCore / worker process, loaded by vLLM from the `vllm.logits_processors` entry point. The
API side sends `temperature: 2` and `vllm_xargs.acs_temperature_scale = T / 2`; vLLM divides the
logits by 2, this processor by T / 2, so sampling sees logits / T. It runs after vLLM's own
temperature and min_p (it is argmax-invariant) and before top-k / top-p.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SCALE_ARG = "acs_temperature_scale"
ENGINE_MAX_TEMPERATURE = 2.0


class HighTemperatureLogitsProcessor(LogitsProcessor):
    """Divides the logits of the rows whose request carries `acs_temperature_scale`."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.scale_by_row: dict[int, float] = {}
        self._rows: torch.Tensor | None = None
        self._scales: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return True  # dividing by a positive number never changes the argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        changed = False
        for index in batch_update.removed:
            changed |= self.scale_by_row.pop(index, None) is not None
        for index, params, _, _ in batch_update.added:
            scale = (params.extra_args or {}).get(SCALE_ARG) if params is not None else None
            if isinstance(scale, (int, float)) and scale > 1:
                self.scale_by_row[index] = float(scale)
                changed = True
            else:
                changed |= self.scale_by_row.pop(index, None) is not None
        for first, second, direction in batch_update.moved:
            a, b = self.scale_by_row.pop(first, None), self.scale_by_row.pop(second, None)
            if a is not None:
                self.scale_by_row[second] = a
            if b is not None and direction == MoveDirectionality.SWAP:
                self.scale_by_row[first] = b
            changed |= a is not None or b is not None
        if changed:
            self._build_tensors()

    def _build_tensors(self) -> None:
        if not self.scale_by_row:
            self._rows = self._scales = None
            return
        rows = sorted(self.scale_by_row)
        self._rows = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._scales = torch.tensor(
            [self.scale_by_row[r] for r in rows], dtype=torch.float32, device=self.device
        ).unsqueeze(1)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._rows is None:
            return logits
        logits[self._rows] = logits[self._rows] / self._scales
        return logits
