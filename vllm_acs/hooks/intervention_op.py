"""The graph-safe intervention op: `torch.ops.vllm_acs.intervene`, called on every decoder layer's
output (the residual stream, DECISIONS.md) inside the model's forward pass.

Registered with `torch.library` as a custom op that mutates `hidden` and `capture_buffer`, so
torch.compile keeps it in the graph as one opaque call (inductor calls it in its generated code,
vLLM's piecewise split does not cut there, and a CUDA graph replays its kernels). Everything it
reads is a persistent buffer (hooks/intervention_buffers.py) filled before the step; per token
of the step's batch and per layer, `indices[token, field, layer]` says:
- `STEER_SLOT`: the bank row added to the stream as it is (0: the zero row);
- `NORM_SLOT`: the bank row added after scaling by the norm of the full residual stream at the
  token (`norm_match`; 0: the zero row);
- `CAPTURE_ROW`: the capture buffer row the stream (after steering) is copied to; the buffer's
  last row is scratch, where every token that captures nothing writes.

The math (`apply_interventions`) is branch-free: no host synchronisation, no `.item()`, no
Python branch on data; a token with slot 0 adds exact zeros (bit-identical to plain). The CUDA
kernel is that math as it is, so a captured CUDA graph replays it every step. The CPU kernel
runs under no graph (inductor calls it each step), so it may skip a layer that the step's host
plan says nothing touches: an idle CPU node pays one call per layer and no tensor work.
A leaf module: torch only, no vLLM.
"""

from __future__ import annotations

import torch

NAMESPACE = "vllm_acs"
OP_NAME = "intervene"
SCHEMA = (
    "intervene(Tensor(a!) hidden, Tensor residual, Tensor bank, Tensor indices, "
    "Tensor(b!) capture_buffer, int layer) -> ()"
)
# Fields of the index buffer's middle dimension.
STEER_SLOT, NORM_SLOT, CAPTURE_ROW = 0, 1, 2
N_FIELDS = 3
# Part of the compile-cache key (hooks/compat.py): change it whenever the op set or its schema
# changes, so a compiled graph cached with another op set is never loaded.
OP_SET_VERSION = f"{NAMESPACE}::{SCHEMA}#1"


class CpuGate:
    """The host side of one step, for the CPU kernel: which layers the step touches (a list of
    bools the runtime sets before the forward pass), and how many op calls the pass made (the
    runtime checks it: a compiled graph without the op would make none)."""

    def __init__(self) -> None:
        self.layer_active: list[bool] = []
        self.calls = 0
        # The calls of the last step that used the op (kept for checks and tests).
        self.calls_in_last_active_step = 0


CPU_GATE = CpuGate()


def apply_interventions(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    bank: torch.Tensor,
    indices: torch.Tensor,
    capture_buffer: torch.Tensor,
    layer: int,
) -> None:
    """Steer then capture every token of `hidden` (rows beyond the step's tokens are padding:
    their indices are at rest). Branch-free: safe to capture in a CUDA graph."""
    rows = indices[: hidden.shape[0], :, layer].long()
    stream = hidden.float() + residual.float()
    norms = torch.linalg.vector_norm(stream, dim=-1, keepdim=True)
    delta = bank.index_select(0, rows[:, STEER_SLOT])
    delta += bank.index_select(0, rows[:, NORM_SLOT]) * norms
    hidden.add_(delta.to(hidden.dtype))
    # The stream as the next block sees it (the model's dtype, as the fused add computes it).
    captured = (hidden + residual).to(capture_buffer.dtype)
    capture_buffer.index_copy_(0, rows[:, CAPTURE_ROW], captured)


def _cpu_kernel(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    bank: torch.Tensor,
    indices: torch.Tensor,
    capture_buffer: torch.Tensor,
    layer: int,
) -> None:
    gate = CPU_GATE
    gate.calls += 1
    if layer < len(gate.layer_active) and gate.layer_active[layer]:
        apply_interventions(hidden, residual, bank, indices, capture_buffer, layer)


def _fake(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    bank: torch.Tensor,
    indices: torch.Tensor,
    capture_buffer: torch.Tensor,
    layer: int,
) -> None:
    return None


def _register() -> torch.library.Library:
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define(SCHEMA)
    library.impl(OP_NAME, _cpu_kernel, "CPU")
    library.impl(OP_NAME, apply_interventions, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{OP_NAME}", _fake, lib=library)
    return library


def _registered() -> bool:
    return hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), OP_NAME)


# Registered once per process, when this module is first imported (a worker, or a test).
_LIBRARY = None if _registered() else _register()


def intervene() -> torch._ops.OpOverload:
    """The op as compiled code calls it."""
    return getattr(getattr(torch.ops, NAMESPACE), OP_NAME).default
