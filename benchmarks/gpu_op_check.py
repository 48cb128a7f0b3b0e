"""The intervention op on a CUDA device, with torch alone (no vLLM): the first GPU check.

A stand-in decoder (fused-residual layers that return (hidden, residual), the op called on each
layer's output as hooks/compat.py calls it) runs eagerly, compiled by inductor, and captured in a
CUDA graph of the compiled model. Checks, each printed PASS/FAIL (exit 1 on any FAIL):
- at rest (no slot, no capture row) the output is bit-identical to the same model without the op;
- a steer and a capture set in the index buffer give, in the compiled model and in the replayed
  CUDA graph, exactly what the eager model gives;
- a CUDA graph captured once follows new index contents at every replay (the op reads the
  buffers; nothing of a step is baked into the graph);
- timing: graph replays of the model with the op at rest against the same model without it.
Run: `python -m benchmarks.gpu_op_check` (benchmarks/gpu_check.sh runs it in stage 1, after the
fused kernel's own checks, benchmarks/gpu_check.py); `--cpu` runs the eager and compiled checks on
the CPU (no CUDA graph), to try the script on a machine without a GPU.
"""

from __future__ import annotations

import sys
import time

import torch

from vllm_acs.hooks.intervention_buffers import InterventionBuffers
from vllm_acs.hooks.intervention_op import (
    CAPTURE_ROW,
    CAPTURES,
    CPU_GATE,
    NORM_SLOT,
    NORM_STEERS,
    STEER_SLOT,
    STEERS,
    plan_layers,
)

LAYERS, HIDDEN, TOKENS = 8, 1024, 32
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}".rstrip(), flush=True)
    if not ok:
        FAILED.append(name)


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor):
        residual = hidden + residual
        normed = residual * torch.rsqrt(residual.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(
            residual.dtype
        )
        return self.proj(normed), residual


class Model(torch.nn.Module):
    def __init__(self, buffers: InterventionBuffers | None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.buffers = buffers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, residual = x, torch.zeros_like(x)
        b = self.buffers
        for index, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual)
            if b is not None:
                torch.ops.vllm_acs.intervene(
                    hidden, residual, b.bank, b.indices, b.capture_buffer, index
                )
        return hidden + residual


def _bf16(bits) -> torch.Tensor:
    return torch.from_numpy(bits).view(torch.bfloat16).float()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().cpu(), b.float().cpu()
    return bool(((a - b).norm(dim=-1) <= 0.02 * b.norm(dim=-1) + 1e-3).all())


def _plan(buffers: InterventionBuffers, slot: int, layer: int, tokens: range, rows: int) -> None:
    """Steer `tokens` at `layer` with `slot` (plain and norm-matched), capture them at layer 0."""
    buffers.reset_host()
    view = buffers.host_view
    for t in tokens:
        view[t, STEER_SLOT, layer] = slot
        view[t, NORM_SLOT, layer] = slot
    for k, t in enumerate(tokens):
        view[t, CAPTURE_ROW, 0] = rows + k
    buffers.send(TOKENS)
    # The CPU kernel reads the step's layers from the host plan (the CUDA one reads only tensors).
    work = [
        (STEERS | NORM_STEERS if index == layer else 0) | (CAPTURES if index == 0 else 0)
        for index in range(LAYERS)
    ]
    CPU_GATE.layer_plans = plan_layers(
        buffers.bank, buffers.indices, buffers.capture_buffer, work, TOKENS
    )


def main() -> None:
    on_cpu = "--cpu" in sys.argv
    if not on_cpu and not torch.cuda.is_available():
        print("FAIL no CUDA device")
        sys.exit(1)
    device = torch.device("cpu" if on_cpu else "cuda")
    torch.manual_seed(0)
    buffers = InterventionBuffers(
        n_layers=LAYERS,
        hidden=HIDDEN,
        max_tokens=TOKENS,
        bank_slots=8,
        capture_mb=1,
        device=device,
    )
    with_op = Model(buffers).to(device, torch.bfloat16)
    without = Model(None).to(device, torch.bfloat16)
    without.load_state_dict(with_op.state_dict())
    x = torch.randn(TOKENS, HIDDEN, device=device, dtype=torch.bfloat16)
    (slot,) = buffers.steering.acquire([torch.randn(HIDDEN).numpy().astype("float32") * 0.01])

    with torch.inference_mode():
        buffers.send(TOKENS)
        check("eager at rest equals no op", torch.equal(with_op(x), without(x)))
        _plan(buffers, slot, 3, range(2, 6), 0)
        eager = with_op(x)
        eager_rows = buffers.read_capture_rows(4).copy()
        check("eager steer changes only its tokens", not torch.equal(eager[2:6], without(x)[2:6]))
        check("eager steer leaves the others", torch.equal(eager[6:], without(x)[6:]))

        # Inductor may round the model's own ops differently from eager: the compiled model is
        # held to the compiled model without the op, and to eager within bf16 rounding.
        compiled = torch.compile(with_op)
        compiled_plain = torch.compile(without)
        buffers.reset_host()
        buffers.send(TOKENS)
        CPU_GATE.layer_plans = []
        at_rest = compiled(x).clone()
        plain = compiled_plain(x)
        _plan(buffers, slot, 3, range(2, 6), 0)
        compiled_steer = compiled(x).clone()
        compiled_rows = buffers.read_capture_rows(4).copy()
        check(
            "compiled steer changes only its tokens",
            not torch.equal(compiled_steer[2:6], at_rest[2:6]),
        )
        check("compiled steer leaves the others", torch.equal(compiled_steer[6:], at_rest[6:]))
        check("compiled steer near eager", _close(compiled_steer, eager))
        check("compiled capture near eager", _close(_bf16(compiled_rows), _bf16(eager_rows)))
        # Not required: the op materialises the stream in the model's dtype between layers,
        # where inductor may keep float32 inside one fused kernel without it.
        check("compiled at rest near compiled without the op", _close(at_rest, plain))
        same = torch.equal(at_rest, plain)
        print(f"INFO compiled at rest bit-identical to compiled without the op: {same}")
        if on_cpu:
            finish()
            return

        static_x = x.clone()
        compiled(static_x)  # warm
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = compiled(static_x)
        _plan(buffers, slot, 3, range(2, 6), 0)
        graph.replay()
        check("graph replay equals compiled", torch.equal(static_out, compiled_steer))
        _plan(buffers, slot, 5, range(10, 12), 4)  # another layer, tokens and capture rows
        graph.replay()
        moved = static_out.clone()
        check("graph follows new indices", not torch.equal(moved, compiled_steer))
        check("graph with new indices equals compiled", torch.equal(moved, compiled(x)))
        buffers.reset_host()
        buffers.send(TOKENS)
        graph.replay()
        check("graph at rest equals compiled at rest", torch.equal(static_out, at_rest))
        plain_x = x.clone()
        compiled_plain(plain_x)
        plain_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(plain_graph):
            plain_out = compiled_plain(plain_x)
        plain_graph.replay()
        check("graph at rest near the graph without the op", _close(static_out, plain_out))
        timings = {}
        for name, g in (("without", plain_graph), ("with_op_at_rest", graph)) * 2:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(2000):
                g.replay()
            torch.cuda.synchronize()
            timings[name] = (time.perf_counter() - start) / 2000 * 1e6
        print(
            f"TIME graph replay of {LAYERS} layers x {TOKENS} tokens x {HIDDEN}: without the op "
            f"{timings['without']:.1f} us, with it at rest {timings['with_op_at_rest']:.1f} us "
            f"(ratio {timings['without'] / timings['with_op_at_rest']:.3f})"
        )
    finish()


def finish() -> None:
    if FAILED:
        print(f"{len(FAILED)} failed: {', '.join(FAILED)}")
        sys.exit(1)
    print("all op checks passed")


if __name__ == "__main__":
    main()
