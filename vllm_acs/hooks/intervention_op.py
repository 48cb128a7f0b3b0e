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

The math (`apply_interventions`, the reference) is branch-free: no host synchronisation, no
`.item()`, no Python branch on data; a token with slot 0 adds exact zeros (bit-identical to
plain). The CUDA kernel is one fused Triton launch per call (hooks/intervention_kernel.py,
imported on its first call: the CPU build needs no Triton) with no host-side branch either, so a
captured CUDA graph replays it every step; inside it a token at rest returns before it reads the
stream, and writes nothing (not even the scratch row). The CPU kernel
runs under no graph (inductor calls it each step), so it does only what the step's host plan
says a layer needs (`CpuGate.layer_plans`, gathered from the same buffers once per batch
layout), with the same results: an idle CPU node pays one call per layer and no tensor work.
A leaf module: torch only, no vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

logger = logging.getLogger(__name__)

NAMESPACE = "vllm_acs"
OP_NAME = "intervene"
SCHEMA = (
    "intervene(Tensor(a!) hidden, Tensor residual, Tensor bank, Tensor indices, "
    "Tensor(b!) capture_buffer, int layer) -> ()"
)
# Fields of the index buffer's middle dimension.
STEER_SLOT, NORM_SLOT, CAPTURE_ROW = 0, 1, 2
N_FIELDS = 3
# What a step does at a layer, for the CPU kernel (bits of CpuGate.layer_work).
STEERS, NORM_STEERS, CAPTURES = 1, 2, 4
# Part of the compile-cache key (hooks/compat.py): change it whenever the op set or its schema
# changes, so a compiled graph cached with another op set is never loaded.
OP_SET_VERSION = f"{NAMESPACE}::{SCHEMA}#1"


class CpuGate:
    """The host side of one step: what the step does at each layer (`layer_plans`, which the
    runtime sets before the forward pass and the CPU kernel reads; None: nothing), and how many
    op calls ran Python in the pass (the runtime checks it on CPU: a compiled graph without the
    op would make none)."""

    def __init__(self) -> None:
        self.layer_plans: list[LayerPlan | None] = []
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
    their indices are at rest). Branch-free: safe to capture in a CUDA graph.

    Per token: delta = bank[steer slot] + bank[norm slot] x |hidden + residual| (the full stream
    before this layer's vectors), in float32, added to `hidden` with one rounding; a token at
    rest adds exact zeros. Then the stream (hidden + residual, the model's dtype) goes to its
    capture row (the scratch row at rest)."""
    rows = indices[: hidden.shape[0], :, layer]
    stream = hidden.float() + residual.float()
    norms = torch.linalg.vector_norm(stream, dim=-1, keepdim=True)
    delta = bank.index_select(0, rows[:, STEER_SLOT])
    delta += bank.index_select(0, rows[:, NORM_SLOT]) * norms
    hidden.add_(delta)
    captured = (hidden + residual).to(capture_buffer.dtype)
    capture_buffer.index_copy_(0, rows[:, CAPTURE_ROW].long(), captured)


class LayerPlan(NamedTuple):
    """What the CPU kernel does at one layer during steps of one layout, gathered once from the
    bank and the index buffer when the layout is written (`plan_layers`): the same numbers the
    branch-free math would gather every step."""

    tokens: int
    plain: torch.Tensor | None  # float32 [tokens, hidden]: bank[steer slot] per token
    norm: torch.Tensor | None  # float32 [tokens, hidden]: bank[norm slot] per token
    capture_rows: torch.Tensor | None  # int64 [tokens]
    # The capture rows as one view of the buffer, when they are evenly spaced (one request, or
    # requests capturing as many layers each): the stream is written there with no gather.
    capture_view: torch.Tensor | None = None


def plan_layers(
    bank: torch.Tensor,
    indices: torch.Tensor,
    capture_buffer: torch.Tensor,
    work: list[int],
    tokens: int,
) -> list[LayerPlan | None]:
    """Per layer, the plan of a step whose first `tokens` rows of `indices` are written and whose
    layers do `work` (bits of STEERS, NORM_STEERS, CAPTURES); None where a layer does nothing."""
    plans: list[LayerPlan | None] = []
    for layer, bits in enumerate(work):
        if not bits:
            plans.append(None)
            continue
        rows = indices[:tokens, :, layer]
        capture_rows = rows[:, CAPTURE_ROW].long() if bits & CAPTURES else None
        plans.append(
            LayerPlan(
                tokens,
                _bank_rows(bank, rows[:, STEER_SLOT]) if bits & STEERS else None,
                _bank_rows(bank, rows[:, NORM_SLOT]) if bits & NORM_STEERS else None,
                capture_rows,
                None if capture_rows is None else _evenly_spaced(capture_buffer, capture_rows),
            )
        )
    return plans


def _bank_rows(bank: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`bank[slots]` per token; where every token reads one slot (one steered request, or all
    steered alike), that slot's row as a `[1, hidden]` view, which the adds broadcast to the same
    numbers without gathering a `[tokens, hidden]` float32 copy (a long prefill's would be
    large). The view is safe for the plan's life: a slot is freed only when a request ends or
    fails, and either makes a new layout and so new plans."""
    first = int(slots[0])
    if first and bool((slots == first).all()):
        return bank[first : first + 1]
    return bank.index_select(0, slots)


def _evenly_spaced(capture_buffer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """`capture_buffer[rows]` as a view, when the rows rise by one step (else None)."""
    first = int(rows[0])
    step = int(rows[1] - rows[0]) if len(rows) > 1 else 1
    if step <= 0 or not torch.equal(rows, first + step * torch.arange(len(rows))):
        return None
    return capture_buffer[first : first + step * (len(rows) - 1) + 1 : step]


def _apply_plan(
    hidden: torch.Tensor, residual: torch.Tensor, capture_buffer: torch.Tensor, plan: LayerPlan
) -> None:
    """`apply_interventions` with the gathers done beforehand and the parts that would add
    exact zeros or write the scratch row left out: the same results, fewer tensor ops."""
    if plan.norm is not None:
        stream = hidden.float() + residual.float()
        delta = plan.norm * torch.linalg.vector_norm(stream, dim=-1, keepdim=True)
        if plan.plain is not None:
            delta += plan.plain
        hidden.add_(delta)
    elif plan.plain is not None:
        hidden.add_(plan.plain)
    if plan.capture_view is not None:
        # The sum rounded once to the buffer's dtype, as `(hidden + residual).to(...)` does.
        torch.add(hidden, residual, out=plan.capture_view)
    elif plan.capture_rows is not None:
        capture_buffer.index_copy_(
            0, plan.capture_rows, (hidden + residual).to(capture_buffer.dtype)
        )


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
    plans = gate.layer_plans
    plan = plans[layer] if layer < len(plans) else None
    if plan is None:
        return
    if plan.tokens == hidden.shape[0]:
        _apply_plan(hidden, residual, capture_buffer, plan)
    else:  # a padded batch: the rows past the step's tokens are at rest
        apply_interventions(hidden, residual, bank, indices, capture_buffer, layer)


_FUSED: list[Callable[..., None]] = []


def _fused() -> Callable[..., None]:
    """The fused kernel's launcher, imported once; the reference where Triton cannot be imported
    (the same results, more kernels), said once in the log."""
    if not _FUSED:
        try:
            from .intervention_kernel import launch
        except ImportError as error:
            logger.warning(
                "the fused intervention kernel is unavailable (%s): the op runs its reference "
                "math, about 11 kernels per layer",
                error,
            )
            launch = apply_interventions
        _FUSED.append(launch)
    return _FUSED[0]


def _cuda_kernel(*args: Any) -> None:
    """The schema's arguments, to the fused kernel. Counted only when this Python runs: eagerly,
    or while a CUDA graph is captured (a replay runs the kernel alone)."""
    CPU_GATE.calls += 1
    _fused()(*args)


def _fake(*args: Any) -> None:
    """Tracing: the op returns nothing; its effects are the mutations the schema declares."""
    return None


def _register() -> torch.library.Library:
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define(SCHEMA)
    library.impl(OP_NAME, _cpu_kernel, "CPU")
    library.impl(OP_NAME, _cuda_kernel, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{OP_NAME}", _fake, lib=library)
    return library


def _registered() -> bool:
    return hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), OP_NAME)


# Registered once per process, when this module is first imported (a worker, or a test).
_LIBRARY = None if _registered() else _register()


def intervene() -> torch._ops.OpOverload:
    """The op as compiled code calls it."""
    return getattr(getattr(torch.ops, NAMESPACE), OP_NAME).default
