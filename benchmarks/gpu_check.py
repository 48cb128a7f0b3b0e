"""The GPU check's stages that stand on torch, Triton and transformers alone (no vLLM): what a
bare CUDA machine can prove. Stage 1 is the fused kernel of `vllm_acs::intervene`
(hooks/intervention_kernel.py); stage 2 what the op costs on a Llama-3.1-8B-shaped model
(benchmarks/gpu_check_model.py). Stage 3 (vLLM's engines) is benchmarks/gpu_check.sh's.

Run: `python -m benchmarks.gpu_check [--stage 1,2] [--limit SECONDS] [--interpret | --tiny]
[OUT_DIR]` (benchmarks/gpu_check.sh runs each stage on its own). Each check prints a PASS or FAIL
line; stage N's lines go to OUT_DIR/stageN.log and its checks and figures to OUT_DIR/stageN.json
(OUT_DIR defaults to ./gpu-check); exit 1 on any FAIL. `--limit` is each stage's time limit: a
stage that runs past it stops with a FAIL line, and keeps its log and JSON. `--interpret` runs
stage 1 on the CPU through Triton's interpreter, `--tiny` stage 2 on a tiny model on the CPU.

Stage 1, on CUDA and with `--interpret` (on CPU through Triton's interpreter; the test suite runs
it, tests/unit/test_intervention_kernel.py):
- parity with the reference (`apply_interventions`) on one mixed batch per stream dtype (bf16,
  fp16) and row width: tokens at rest, plain-steered, norm-matched and capturing ones, padding
  rows past the step's tokens, and index rows past `hidden`'s rows that must not be read; rows
  walked in one slice and in several;
- a call at rest writes nothing: `hidden` bit-identical, a sentinel-filled capture buffer (its
  scratch row included) untouched;
- the op's CUDA implementation is the fused kernel; nothing of vLLM was imported.
Only on CUDA: one CUDA graph captured once follows new indices at each replay; the op inside
`torch.compile` equals it eager; kernel launches per layer call (torch.profiler: 1 at rest, 1 when
active); and, as figures, microseconds per layer call under a CUDA graph, fused and reference.

Tolerance. On a GPU, plain steering and capture are bit-identical to the reference (the same
float32 operations, in the same order, each rounded to nearest-even). A norm-matched token is
held to one step (ulp) of the stream's dtype: the kernel sums the norm's squares in another order
than torch, so the norm may differ in its last float32 bits, which can move the rounded result by
one step. Triton's interpreter rounds float32 to bf16 by truncation (not to nearest-even, as a
GPU does), so with `--interpret` every rounded value is held to one step; what the kernel must not
touch is held bit-identical in both modes. The capture is also compared with `hidden + residual`
from the kernel's own `hidden`, so an off-by-one step in `hidden` does not hide in the capture.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SENTINEL = -123.0
WIDTHS_INTERPRET = ((64, None), (96, 32))  # (row width, slice): 96 walked in three slices of 32
WIDTHS_CUDA = ((64, None), (96, 32), (4096, None))
LAYER, LAYERS = 1, 3
STEP_TOKENS, PADDED_TOKENS, INDEX_ROWS = 8, 10, 16
CAPTURE_ROWS = 6  # + the scratch row


class Stage:
    """One stage's PASS/FAIL lines, its log and its JSON of figures."""

    def __init__(self, out: Path, name: str, mode: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.name, self.out = name, out
        self.log = (out / f"{name}.log").open("w")
        self.result: dict[str, Any] = {"stage": name, "mode": mode, "checks": {}, "figures": {}}

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.say(f"{'PASS' if ok else 'FAIL'} {name} {detail}".rstrip())
        self.result["checks"][name] = bool(ok)
        return ok

    def figure(self, name: str, value: Any) -> None:
        self.result["figures"][name] = value

    def finish(self) -> bool:
        if not self.result["checks"]:
            self.check(f"{self.name} made a check", False)
        failed = [name for name, ok in self.result["checks"].items() if not ok]
        self.say(f"{self.name}: {len(failed)} failed" if failed else f"{self.name}: all passed")
        (self.out / f"{self.name}.json").write_text(json.dumps(self.result, indent=2))
        self.log.close()
        return not failed


def ulp_distance(a: Any, b: Any) -> Any:
    """Element-wise distance between two 16-bit float tensors, in steps of their dtype."""
    import torch

    def key(t: torch.Tensor) -> torch.Tensor:
        bits = t.detach().cpu().contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)  # sign-magnitude to ordered

    return (key(a) - key(b)).abs()


def ulps(a: Any, b: Any) -> int:
    """The largest distance between two 16-bit float tensors, in steps of their dtype."""
    return int(ulp_distance(a, b).max()) if a.numel() else 0


def mixed_case(device: Any, dtype: Any, width: int, seed: int = 0, shift: int = 0) -> dict:
    """One layer call's arguments: PADDED_TOKENS rows of `hidden`, the first STEP_TOKENS of them
    the step's, each token in one role at LAYER (`shift` rotates the roles over the tokens); other
    layers, and index rows past `hidden`'s, hold work that this call must not do."""
    import torch

    from vllm_acs.hooks.intervention_op import CAPTURE_ROW, N_FIELDS, NORM_SLOT, STEER_SLOT

    g = torch.Generator().manual_seed(seed)
    scratch = CAPTURE_ROWS
    hidden = (torch.randn(PADDED_TOKENS, width, generator=g) * 2).to(dtype)
    residual = (torch.randn(PADDED_TOKENS, width, generator=g) * 4).to(dtype)
    bank = torch.randn(5, width, generator=g) * 0.05
    bank[0] = 0
    indices = torch.zeros(INDEX_ROWS, N_FIELDS, LAYERS, dtype=torch.int32)
    indices[:, CAPTURE_ROW] = scratch
    # (steer slot, norm slot, capture row) per token of the step at LAYER.
    roles = [
        (0, 0, scratch),  # at rest
        (1, 0, scratch),  # plain steer
        (0, 2, scratch),  # norm-matched
        (1, 3, scratch),  # both
        (0, 0, 0),  # capture only
        (2, 0, 1),  # plain steer and capture
        (0, 3, 2),  # norm-matched and capture
        (4, 4, 3),  # all three
    ]
    roles = roles[-shift:] + roles[:-shift] if shift else roles
    for token, role in enumerate(roles):
        indices[token, :, LAYER] = torch.tensor(role, dtype=torch.int32)
    # Work this call must not do: every token at the other layers, and index rows past hidden's.
    for layer in range(LAYERS):
        if layer != LAYER:
            indices[:, STEER_SLOT, layer] = 4
            indices[:, CAPTURE_ROW, layer] = 5
    indices[PADDED_TOKENS:, STEER_SLOT, LAYER] = 3
    indices[PADDED_TOKENS:, NORM_SLOT, LAYER] = 3
    indices[PADDED_TOKENS:, CAPTURE_ROW, LAYER] = 5
    capture = torch.full((CAPTURE_ROWS + 1, width), SENTINEL, dtype=torch.bfloat16)
    return {
        "hidden": hidden.to(device),
        "residual": residual.to(device),
        "bank": bank.to(device),
        "indices": indices.to(device),
        "capture_buffer": capture.to(device),
        "layer": LAYER,
        "roles": roles,
    }


def call_args(case: dict) -> tuple:
    """The op's arguments of a case, on fresh copies of what the op writes."""
    return (
        case["hidden"].clone(),
        case["residual"],
        case["bank"],
        case["indices"],
        case["capture_buffer"].clone(),
        case["layer"],
    )


def parity(stage: Stage, tag: str, case: dict, block: int | None, exact: int) -> None:
    """The kernel against the reference on one mixed case."""
    import torch

    from vllm_acs.hooks.intervention_kernel import launch
    from vllm_acs.hooks.intervention_op import apply_interventions

    expected = call_args(case)
    apply_interventions(*expected)
    got = call_args(case)
    launch(*got, block=block)
    original, residual = case["hidden"], case["residual"]
    hidden, capture, ref_hidden, ref_capture = got[0], got[4], expected[0], expected[4]
    roles = case["roles"]
    untouched = [t for t, (s, n, _) in enumerate(roles) if s == n == 0]
    untouched += list(range(STEP_TOKENS, PADDED_TOKENS))  # the padding rows
    plain = [t for t, (s, n, _) in enumerate(roles) if s and not n]
    normed = [t for t, (_, n, _) in enumerate(roles) if n]
    capturing = sorted((row, t) for t, (_, _, row) in enumerate(roles) if row != CAPTURE_ROWS)
    rows, captured = [row for row, _ in capturing], [t for _, t in capturing]
    own = (hidden + residual).to(hidden.dtype).to(capture.dtype)[captured]
    # Where the steered stream is the reference's, bit for bit (on a GPU: every element but a
    # norm-matched token's off-by-one steps), the capture must be the reference's too.
    same_hidden = torch.eq(
        hidden[captured].view(torch.int16), ref_hidden[captured].view(torch.int16)
    )
    capture_gap = ulp_distance(capture[rows], ref_capture[rows])[same_hidden.cpu()]
    figures = {
        "plain_ulps": ulps(hidden[plain], ref_hidden[plain]),
        "norm_matched_ulps": ulps(hidden[normed], ref_hidden[normed]),
        "capture_vs_own_hidden_ulps": ulps(capture[rows], own),
        "capture_vs_reference_ulps": int(capture_gap.max()) if capture_gap.numel() else 0,
        "capture_elements_compared": f"{capture_gap.numel()} of {same_hidden.numel()}",
    }
    stage.figure(tag, figures)
    stage.check(
        f"{tag}: tokens at rest, capture-only tokens and padding rows untouched",
        torch.equal(hidden[untouched], original[untouched]),
    )
    stage.check(
        f"{tag}: plain steer equals the reference",
        figures["plain_ulps"] <= exact,
        f"(max {figures['plain_ulps']} ulp, allowed {exact})",
    )
    stage.check(
        f"{tag}: norm-matched steer within 1 ulp of the reference",
        figures["norm_matched_ulps"] <= 1,
        f"(max {figures['norm_matched_ulps']} ulp)",
    )
    stage.check(
        f"{tag}: captured rows equal hidden + residual",
        figures["capture_vs_own_hidden_ulps"] <= exact,
        f"(max {figures['capture_vs_own_hidden_ulps']} ulp, allowed {exact})",
    )
    stage.check(
        f"{tag}: capture equals the reference wherever the steered stream does",
        figures["capture_vs_reference_ulps"] <= exact,
        f"(max {figures['capture_vs_reference_ulps']} ulp, allowed {exact}, "
        f"{figures['capture_elements_compared']} elements)",
    )
    sentinel = torch.full_like(capture[len(rows) :], SENTINEL)
    stage.check(
        f"{tag}: other capture rows and the scratch row keep the sentinel",
        torch.equal(capture[len(rows) :], sentinel),
    )


def at_rest(stage: Stage, tag: str, case: dict) -> None:
    """A call whose tokens are all at rest (a fresh index buffer) writes nothing."""
    import torch

    from vllm_acs.hooks.intervention_kernel import launch
    from vllm_acs.hooks.intervention_op import CAPTURE_ROW

    indices = torch.zeros_like(case["indices"])
    indices[:, CAPTURE_ROW] = CAPTURE_ROWS
    hidden, capture = case["hidden"].clone(), case["capture_buffer"].clone()
    launch(hidden, case["residual"], case["bank"], indices, capture, LAYER)
    stage.check(
        f"{tag}: a call at rest writes nothing",
        torch.equal(hidden.view(torch.int16), case["hidden"].view(torch.int16))
        and torch.equal(capture.view(torch.int16), case["capture_buffer"].view(torch.int16)),
    )


def op_runs_kernel(stage: Stage, case: dict, on_cuda: bool) -> None:
    """The op's CUDA implementation launches the fused kernel (with --interpret: called directly,
    on CPU tensors, as the dispatcher would on CUDA ones)."""
    import torch

    from vllm_acs.hooks import intervention_kernel, intervention_op

    direct = call_args(case)
    intervention_kernel.launch(*direct)
    through_op = call_args(case)
    if on_cuda:
        torch.ops.vllm_acs.intervene(*through_op)
    else:
        intervention_op._cuda_kernel(*through_op)
    stage.check(
        "the op's CUDA implementation runs the fused kernel",
        intervention_op._fused() is intervention_kernel.launch
        and torch.equal(direct[0], through_op[0])
        and torch.equal(direct[4], through_op[4]),
    )


def cuda_graph(stage: Stage) -> None:
    """One CUDA graph, captured once, replayed with three index contents in turn."""
    import torch

    from vllm_acs.hooks.intervention_kernel import launch
    from vllm_acs.hooks.intervention_op import CAPTURE_ROW

    case = mixed_case("cuda", torch.bfloat16, 4096)
    op = torch.ops.vllm_acs.intervene
    source, static = case["hidden"], case["hidden"].clone()
    indices, capture = case["indices"], case["capture_buffer"]
    residual, bank = case["residual"], case["bank"]
    contents = {
        "mixed": case["indices"].clone(),
        "rotated": mixed_case("cuda", torch.bfloat16, 4096, shift=3)["indices"],
        "at rest": torch.zeros_like(indices),
    }
    contents["at rest"][:, CAPTURE_ROW] = CAPTURE_ROWS
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static.copy_(source)
        op(static, residual, bank, indices, capture, LAYER)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.copy_(source)
        op(static, residual, bank, indices, capture, LAYER)
    outputs, same = {}, True
    for name, content in contents.items():
        indices.copy_(content)
        capture.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        outputs[name] = (static.clone(), capture.clone())
        eager_hidden, eager_capture = source.clone(), torch.full_like(capture, SENTINEL)
        launch(eager_hidden, residual, bank, content, eager_capture, LAYER)
        same = same and torch.equal(static, eager_hidden) and torch.equal(capture, eager_capture)
    moved = not torch.equal(outputs["mixed"][0], outputs["rotated"][0])
    rested = torch.equal(outputs["at rest"][0], source) and bool(
        (outputs["at rest"][1] == SENTINEL).all()
    )
    stage.check(
        "CUDA graph: captured once, each replay follows the new indices",
        same and moved and rested,
        f"(equal to eager {same}, follows {moved}, at rest untouched {rested})",
    )


def compiled(stage: Stage) -> None:
    """The op inside torch.compile (inductor, one graph) gives what it gives eagerly."""
    import torch

    def step(x, residual, bank, indices, capture):
        hidden = x * 2
        torch.ops.vllm_acs.intervene(hidden, residual, bank, indices, capture, LAYER)
        return hidden + residual

    fn = torch.compile(step, fullgraph=True)
    ok = True
    for shift in (0, 3):
        case = mixed_case("cuda", torch.bfloat16, 4096, shift=shift)
        args = (case["hidden"], case["residual"], case["bank"], case["indices"])
        eager_capture, compiled_capture = case["capture_buffer"].clone(), case["capture_buffer"]
        eager = step(*args, eager_capture)
        out = fn(*args, compiled_capture)
        ok = ok and torch.equal(eager, out) and torch.equal(eager_capture, compiled_capture)
    stage.check("torch.compile: the op in a compiled graph equals eager", ok)


def launches(stage: Stage) -> None:
    """Kernels per layer call, from torch.profiler: at rest and with work."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vllm_acs.hooks.intervention_op import CAPTURE_ROW

    calls = 10
    case = mixed_case("cuda", torch.bfloat16, 4096)
    rest = torch.zeros_like(case["indices"])
    rest[:, CAPTURE_ROW] = CAPTURE_ROWS
    counts = {}
    for name, indices in (("at_rest", rest), ("active", case["indices"])):
        args = list(call_args(case))
        args[3] = indices
        torch.ops.vllm_acs.intervene(*args)  # compiled and loaded before profiling
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                torch.ops.vllm_acs.intervene(*args)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        counts[name] = len(kernels) / calls
        stage.figure(f"kernels_per_call_{name}", counts[name])
        stage.figure(f"kernel_names_{name}", sorted({e.name for e in kernels}))
    stage.check(
        "kernel launches per layer call: 1 at rest, 1 active",
        counts == {"at_rest": 1, "active": 1},
        f"({counts['at_rest']:g} at rest, {counts['active']:g} active)",
    )


def run_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


def graph_us(run: Callable[[], None], replays: int = 20) -> float:
    """Microseconds per replay of a CUDA graph of `run`, captured once after a warm-up."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def timings(stage: Stage) -> None:
    """Figures only: microseconds per layer call in a CUDA graph of 32 layer calls, the fused
    kernel against the reference, at rest and with every token steered (plain and norm-matched)."""
    import torch

    from vllm_acs.hooks.intervention_kernel import launch
    from vllm_acs.hooks.intervention_op import CAPTURE_ROW, N_FIELDS, NORM_SLOT, STEER_SLOT
    from vllm_acs.hooks.intervention_op import apply_interventions as reference

    layers, width = 32, 4096
    for tokens in (32, 8192):
        hidden = torch.randn(tokens, width, device="cuda").to(torch.bfloat16)
        residual = torch.randn_like(hidden)
        bank = torch.randn(4, width, device="cuda") * 1e-4
        bank[0] = 0
        bank[2] *= 1e-3  # norm-matched: the stream must not grow over replays
        indices = torch.zeros(tokens, N_FIELDS, layers, dtype=torch.int32, device="cuda")
        capture = torch.empty(CAPTURE_ROWS + 1, width, dtype=torch.bfloat16, device="cuda")
        args = (hidden, residual, bank, indices, capture)
        for kernel_name, kernel in (("fused", launch), ("reference", reference)):
            for mode in ("at_rest", "steer_all"):
                indices.zero_()
                indices[:, CAPTURE_ROW] = CAPTURE_ROWS
                if mode == "steer_all":
                    indices[:, STEER_SLOT] = 1
                    indices[:, NORM_SLOT] = 2
                calls = [functools.partial(kernel, *args, layer) for layer in range(layers)]
                us = graph_us(functools.partial(run_all, calls)) / layers
                stage.figure(f"us_per_call_{kernel_name}_{mode}_tokens{tokens}", round(us, 2))
                stage.say(f"TIME {kernel_name} {mode} {tokens} tokens x {width}: {us:.2f} us")


def stage_kernel(stage: Stage, interpret: bool) -> None:
    import torch

    on_cuda = not interpret
    device = "cuda" if on_cuda else "cpu"
    if on_cuda:
        stage.say(f"INFO {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    import triton

    stage.say(f"INFO triton {triton.__version__}, interpreter {interpret}")
    exact = 0 if on_cuda else 1  # see the module's docstring: the interpreter truncates to bf16
    widths = WIDTHS_CUDA if on_cuda else WIDTHS_INTERPRET
    started = time.perf_counter()
    for dtype, dname in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for width, block in widths:
            tag = f"{dname} h{width}" + (f" in slices of {block}" if block else "")
            case = mixed_case(device, dtype, width)
            parity(stage, tag, case, block, exact)
            at_rest(stage, tag, case)
    op_runs_kernel(stage, mixed_case(device, torch.bfloat16, 64), on_cuda)
    # A bare CUDA machine has no vLLM: this stage must not need it.
    stage.check("stands on torch and Triton alone, no vLLM imported", "vllm" not in sys.modules)
    if on_cuda:
        for part in (cuda_graph, compiled, launches, timings):
            try:
                part(stage)
            except Exception as error:  # one part's crash is its FAIL, the others still run
                stage.check(f"{part.__name__} ran", False, f"({type(error).__name__}: {error})")
    stage.figure("seconds", round(time.perf_counter() - started, 2))


class TimeLimit(Exception):
    """A stage ran past its --limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise TimeLimit


def run_stage(
    out: Path, number: int, mode: str, limit: float | None, body: Callable[[Stage], None]
) -> bool:
    """One stage, within its time limit: a crash or the limit is a FAIL line, and its log and
    JSON are written whatever happened."""
    stage = Stage(out, f"stage{number}", mode)
    if limit:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(max(1, int(limit)))
    try:
        body(stage)
    except TimeLimit:
        stage.check(f"stage {number} within its time limit", False, f"({limit:g} s)")
    except Exception as error:
        stage.check(f"stage {number} ran", False, f"({type(error).__name__}: {error})")
    finally:
        if limit:
            signal.alarm(0)
    return stage.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="gpu-check", help="folder for logs and JSON")
    parser.add_argument(
        "--stage", default=None, help="stages to run, e.g. 1 or 1,2 (default: 1,2 on CUDA)"
    )
    parser.add_argument("--limit", type=float, default=None, help="each stage's time limit (s)")
    parser.add_argument(
        "--interpret", action="store_true", help="stage 1 on CPU through Triton's interpreter"
    )
    parser.add_argument("--tiny", action="store_true", help="stage 2 on a tiny model on CPU")
    args = parser.parse_args(argv)
    if args.stage is None:
        stages = [1] if args.interpret else [2] if args.tiny else [1, 2]
    else:
        stages = [int(part) for part in args.stage.split(",")]
    if not set(stages) <= {1, 2}:
        parser.error("this module runs stages 1 and 2 (stage 3 is benchmarks/gpu_check.sh's)")
    if args.interpret:
        # Read when the kernel is defined (its module's import): set before triton is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    on_cpu = {1: args.interpret, 2: args.tiny}
    if not all(on_cpu[n] for n in stages) and not torch.cuda.is_available():
        print("FAIL no CUDA device (--interpret runs stage 1, --tiny stage 2, on the CPU)")
        return 1
    out, ok = Path(args.out), True
    for number in stages:
        if number == 1:
            mode = "interpret" if args.interpret else "cuda"
            ok &= run_stage(out, 1, mode, args.limit, lambda s: stage_kernel(s, args.interpret))
        else:
            from benchmarks.gpu_check_model import run_stage as model_stage

            mode = "tiny" if args.tiny else "cuda"
            ok &= run_stage(out, 2, mode, args.limit, lambda s: model_stage(s, args.tiny))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
