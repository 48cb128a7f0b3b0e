"""The intervention op's persistent buffers (hooks/intervention_op.py), allocated once after the
model loads and before torch.compile and CUDA-graph capture see them; their addresses never
change, so a compiled graph keeps reading the same storage.

- `bank` [slots, hidden] float32: steering vectors, slot 0 all zeros. `SteeringBank` hands out
  slots by content, counting references: identical vectors share a slot, and a slot is free
  again when the last request using it ends.
- `indices` [max tokens, fields, layers] int32: per token of a step and per layer, the slots and
  the capture row. At rest (every token the step does not touch): slot 0 and the scratch row.
- `capture_buffer` [rows + 1, hidden] bf16: a fixed number of rows sized by an operator setting
  in MB, whatever the model's depth or batch; a step's captured rows go to its first rows, the
  last row is scratch.

On a GPU, `host_indices` is a pinned mirror: a step writes its rows there and sends them with one
non-blocking copy; captured rows come back through hooks/capture_copy.py (a side stream into
pinned memory). On a CPU the two are one tensor. A leaf module beside the op: torch and numpy,
no vLLM.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..activations.store import capture_buffer_rows
from .intervention_op import CAPTURE_ROW, N_FIELDS


class BankFullError(RuntimeError):
    """A request's steering needs more bank slots than are free."""


class SteeringBank:
    """Slots of the bank by content, reference-counted. Slot 0 is the zero row, never handed out."""

    def __init__(self, bank: torch.Tensor) -> None:
        self.bank = bank
        self._free = list(range(bank.shape[0] - 1, 0, -1))  # pop() gives 1, 2, ...
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._refs: dict[int, int] = {}

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def acquire(self, vectors: list[np.ndarray]) -> list[int]:
        """A slot for each float32 vector (the same slot for equal vectors); all or none."""
        keys = [hashlib.blake2b(v.tobytes(), digest_size=16).digest() for v in vectors]
        new = {key for key in keys if key not in self._by_key}
        if len(new) > len(self._free):
            raise BankFullError(
                f"the steering bank has {len(self._free)} free slots and this request needs "
                f"{len(new)} (VLLM_ACS_STEERING_SLOTS sets its size)"
            )
        slots = []
        for key, vector in zip(keys, vectors, strict=True):
            slot = self._by_key.get(key)
            if slot is None:
                slot = self._free.pop()
                self.bank[slot].copy_(torch.from_numpy(vector), non_blocking=False)
                self._by_key[key], self._key_of[slot], self._refs[slot] = slot, key, 0
            self._refs[slot] += 1
            slots.append(slot)
        return slots

    def release(self, slots: list[int]) -> None:
        for slot in slots:
            self._refs[slot] -= 1
            if self._refs[slot] == 0:
                del self._refs[slot]
                del self._by_key[self._key_of.pop(slot)]
                self._free.append(slot)


class InterventionBuffers:
    def __init__(
        self,
        *,
        n_layers: int,
        hidden: int,
        max_tokens: int,
        bank_slots: int,
        capture_mb: float,
        device: torch.device,
    ) -> None:
        self.n_layers = n_layers
        self.hidden = hidden
        self.device = device
        self.capture_mb = capture_mb
        self.capture_rows = capture_buffer_rows(capture_mb, hidden)
        self.scratch_row = self.capture_rows
        self.bank = torch.zeros((max(2, bank_slots), hidden), dtype=torch.float32, device=device)
        self.indices = torch.zeros(
            (max_tokens, N_FIELDS, n_layers), dtype=torch.int32, device=device
        )
        self.indices[:, CAPTURE_ROW, :] = self.scratch_row
        # Rows are read only after a step wrote them: left unset (no page touched until used).
        self.capture_buffer = torch.empty(
            (self.capture_rows + 1, hidden), dtype=torch.bfloat16, device=device
        )
        self.on_host = on_host = device.type == "cpu"
        if on_host:
            self.host_indices = self.indices
            # The buffer's rows as bf16 bits, for filing after each step without a tensor call.
            self._capture_bits = self.capture_buffer.view(torch.int16).numpy()
        else:
            self.host_indices = self.indices.cpu().pin_memory()
            # read_capture_rows' pinned rows, made on its first call (the engine's steps copy
            # through hooks/capture_copy.py instead).
            self._host_capture: torch.Tensor | None = None
            self._copied = torch.cuda.Event()
            # The last index copy: the host rows are not rewritten before it has read them
            # (the CPU may run a step ahead of the device).
            self._sent: torch.cuda.Event | None = None
        self.host_view = self.host_indices.numpy()  # [tokens, fields, layers], numpy int32
        self.steering = SteeringBank(self.bank)
        self._dirty_tokens = 0  # host rows not at rest, from the last step

    @property
    def dirty(self) -> bool:
        return self._dirty_tokens > 0

    def reset_host(self) -> None:
        """Puts the last step's rows back at rest (on the host side)."""
        if self.host_indices is not self.indices and self._sent is not None:
            self._sent.synchronize()
            self._sent = None
        n = self._dirty_tokens
        if n:
            view = self.host_view[:n]
            view[:, :CAPTURE_ROW, :] = 0
            view[:, CAPTURE_ROW, :] = self.scratch_row

    def send(self, tokens: int) -> None:
        """The step's rows (the first `tokens` on the host) to the device, one non-blocking copy;
        also what is needed to put the last step's rows back at rest there."""
        span = max(tokens, self._dirty_tokens)
        self._dirty_tokens = tokens
        if self.host_indices is not self.indices and span:
            self.indices[:span].copy_(self.host_indices[:span], non_blocking=True)
            self._sent = torch.cuda.Event()
            self._sent.record()

    def read_capture_rows(self, rows: int) -> np.ndarray:
        """After the forward pass: the step's first `rows` captured rows as bf16 bits (int16),
        waiting for them (tests and benchmarks; an engine step uses the copy-out)."""
        if self.on_host:
            return self._capture_bits[:rows]
        if self._host_capture is None:
            self._host_capture = torch.empty(
                (self.capture_rows, self.hidden), dtype=torch.bfloat16, pin_memory=True
            )
        host = self._host_capture[:rows]
        host.copy_(self.capture_buffer[:rows], non_blocking=True)
        self._copied.record()
        self._copied.synchronize()
        return host.view(torch.int16).numpy()
