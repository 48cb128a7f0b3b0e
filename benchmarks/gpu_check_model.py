"""The GPU check's stage 2: what `vllm_acs::intervene` costs on a real-size model, with torch,
Triton and transformers alone (no vLLM). Run by benchmarks/gpu_check.py (`--stage 2`).

The model is transformers' `LlamaForCausalLM` built from a Llama-3.1-8B config (32 layers of
4,096, GQA 32/8 heads, MLP 14,336, vocabulary 128,256) with random bf16 weights: nothing is
downloaded. Its decoder layers get the op as the plugin gives vLLM's (hooks/compat.py): each
layer's class is switched to a subclass whose `forward` calls the op on the layer's output.

The residual stream. vLLM's Llama layers return `(hidden, residual)`, whose sum is the stream;
transformers' layers return the stream itself (the residual add is inside the layer). So the
op gets `hidden` = the layer's output and `residual` = a persistent zero tensor: `hidden +
residual` is the stream, exactly (x + 0 rounds to x), the steer is added to it in place, its
norm is the stream's, and a capture writes it. The kernel reads `residual` only for a token
that norm-matches or captures, so the zeros cost nothing at rest.

What is timed, each shape under CUDA graphs (one graph without the op, one with it, captured
once, on the same weights, replayed in paired rounds):
- decode batches of 1, 32 and 128 tokens: one token per sequence and no KV context (attention
  over one position), so the plain step is the weights' read and little else: shorter than a
  real decode step with a context, which makes the op's share look larger, not smaller;
- a prefill of 8,192 tokens (one sequence, causal attention);
- plain (no op), idle (the op at rest on every layer), steering of 1 layer (every token, a
  plain vector at the middle layer), capture of 1 layer (every token's row at the middle layer)
  and capture of all layers, both with the copy-out: after each step the captured rows go
  device-to-host into pinned memory on a side stream, ordered by an event, and the next step
  waits on the device (not the host) for that copy before it writes the buffer again. Filing the
  rows on the host is not timed.
The ratio that decides is the median, over rounds, of plain's time over the mode's time in the
same round. Capture of all layers of an 8,192-token prefill (262,144 rows, 2 GiB) is measured
but held to no target: it is more than one step may capture with the default capture buffer
(VLLM_ACS_CAPTURE_BUFFER_MB=256: 32,768 rows of 4,096), and the node refuses it.

Checks at every shape (PASS/FAIL): idle output bit-identical to plain (both graphs); captured rows
equal the layer's output that `output_hidden_states` reports in the same eager pass; a steer adds
its vector to that output, rounded once; the replayed graph captures the eager pass's rows.
`--tiny` runs the same code on a tiny config on the CPU (no CUDA graphs, the op's CPU kernel,
timings as INFO lines only): the test suite runs it (tests/unit/test_gpu_check_model.py).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 16384,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}
# (name, sequences, tokens per sequence)
SHAPES = (
    ("decode_1", 1, 1),
    ("decode_32", 32, 1),
    ("decode_128", 128, 1),
    ("prefill_8192", 1, 8192),
)
SHAPES_TINY = (("decode_1", 1, 1), ("decode_8", 8, 1), ("prefill_24", 1, 24))
MODES = ("idle", "steer_1_layer", "capture_1_layer", "capture_all_layers")
TARGETS = {"idle": 0.99, "steer_1_layer": 0.99, "capture_1_layer": 0.98, "capture_all_layers": 0.90}
# What one step may capture with VLLM_ACS_CAPTURE_BUFFER_MB's default (256 MiB of bf16 rows).
DEFAULT_CAPTURE_BYTES = 256 * 1024 * 1024
SEED = 0


class OpState:
    """The op's buffers, as hooks/intervention_buffers.py lays them out, and whether the layers
    call it (read in Python: a graph captured with it off has no op in it)."""

    def __init__(
        self, torch: Any, n_layers: int, hidden: int, max_tokens: int, rows: int, device: Any
    ) -> None:
        from vllm_acs.hooks.intervention_op import CAPTURE_ROW, N_FIELDS

        self.enabled = False
        self.n_layers, self.hidden, self.rows = n_layers, hidden, rows
        self.bank = torch.zeros((2, hidden), dtype=torch.float32, device=device)
        self.indices = torch.zeros((max_tokens, N_FIELDS, n_layers), dtype=torch.int32)
        self.indices[:, CAPTURE_ROW] = rows
        self.device_indices = self.indices.to(device)
        self.capture = torch.zeros((rows + 1, hidden), dtype=torch.bfloat16, device=device)
        self.zeros = torch.zeros((max_tokens, hidden), dtype=torch.bfloat16, device=device)


_INTERVENING: dict[type, type] = {}


def _intervening_class(cls: type) -> type:
    """A subclass of a transformers decoder layer whose forward calls the op on its output."""
    if cls in _INTERVENING:
        return _INTERVENING[cls]
    import torch

    original = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, *args, **kwargs)
        state: OpState = self.acs_state
        if state.enabled:
            stream = output[0] if isinstance(output, tuple) else output
            rows = stream.view(-1, stream.shape[-1])  # the layer's output, updated in place
            torch.ops.vllm_acs.intervene(
                rows,
                state.zeros[: rows.shape[0]],
                state.bank,
                state.device_indices,
                state.capture,
                self.acs_layer,
            )
        return output

    made = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    _INTERVENING[cls] = made
    return made


def build_model(torch: Any, config_fields: dict, device: Any) -> Any:
    """The decoder stack of a random-weight bf16 LlamaForCausalLM (its lm_head dropped: the
    step timed is the decoder's, as the op's share of it is what is asked)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**config_fields, attn_implementation="sdpa", tie_word_embeddings=False)
    torch.manual_seed(SEED)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.lm_head = torch.nn.Identity()
    return model.eval()


def put_op_on_layers(model: Any, state: OpState) -> None:
    for index, layer in enumerate(model.model.layers):
        layer.acs_state = state
        layer.acs_layer = index
        layer.__class__ = _intervening_class(type(layer))


def write_mode(torch: Any, state: OpState, mode: str, tokens: int, layer: int, on_cpu: bool) -> int:
    """The index rows of a step of `tokens` tokens in `mode` (every token in it), sent to the
    device; on the CPU also the host plan the CPU kernel follows. Returns the captured rows."""
    from vllm_acs.hooks import intervention_op as op

    view = state.indices
    view[:, op.STEER_SLOT] = 0
    view[:, op.NORM_SLOT] = 0
    view[:, op.CAPTURE_ROW] = state.rows
    work = [0] * state.n_layers
    rows = 0
    if mode in ("steer_1_layer", "steer_and_capture"):
        view[:tokens, op.STEER_SLOT, layer] = 1
        work[layer] |= op.STEERS
    if mode in ("capture_1_layer", "steer_and_capture"):
        view[:tokens, op.CAPTURE_ROW, layer] = torch.arange(tokens, dtype=torch.int32)
        work[layer] |= op.CAPTURES
        rows = tokens
    if mode == "capture_all_layers":
        # Token-major, as a request's capture file is laid out (hooks/capture.py).
        base = torch.arange(tokens, dtype=torch.int32)[:, None] * state.n_layers
        view[:tokens, op.CAPTURE_ROW, :] = base + torch.arange(state.n_layers, dtype=torch.int32)
        work = [op.CAPTURES] * state.n_layers
        rows = tokens * state.n_layers
    state.device_indices.copy_(view)
    if on_cpu:
        op.CPU_GATE.layer_plans = op.plan_layers(
            state.bank, state.device_indices, state.capture, work, tokens
        )
    return rows


class Step:
    """One shape's forward pass, without and with the op: two CUDA graphs on a GPU (captured
    once, on one memory pool), the model called eagerly on the CPU."""

    def __init__(self, torch: Any, model: Any, state: OpState, ids: Any, pool: Any) -> None:
        self.torch, self.model, self.state, self.ids = torch, model, state, ids
        self.on_cpu = ids.device.type == "cpu"
        self.graphs: dict[bool, Any] = {}
        self.outputs: dict[bool, Any] = {}
        if not self.on_cpu:
            for enabled in (False, True):
                self._capture(enabled, pool)

    def _forward(self) -> Any:
        return self.model.model(input_ids=self.ids, use_cache=False).last_hidden_state

    def _capture(self, enabled: bool, pool: Any) -> None:
        torch = self.torch
        self.state.enabled = enabled
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.outputs[enabled] = self._forward()
        self.graphs[enabled] = graph
        self.state.enabled = False

    def run(self, enabled: bool) -> Any:
        """One step; its output (on a GPU the graph's static output: clone what you keep)."""
        if self.on_cpu:
            self.state.enabled = enabled
            try:
                return self._forward()
            finally:
                self.state.enabled = False
        self.graphs[enabled].replay()
        return self.outputs[enabled]


class CopyOut:
    """The step's captured rows device-to-host on a side stream into pinned memory, ordered
    after the step by an event; the next step waits (on the device) for the copy before the
    op writes the buffer again. On the CPU the rows are already on the host."""

    def __init__(self, torch: Any, state: OpState) -> None:
        self.torch, self.state = torch, state
        self.on_cpu = state.capture.device.type == "cpu"
        if not self.on_cpu:
            self.host = torch.empty(
                (state.rows, state.hidden), dtype=torch.bfloat16, pin_memory=True
            )
            self.side = torch.cuda.Stream()
            self.done, self.copied = torch.cuda.Event(), torch.cuda.Event()
            self.copied.record()

    def step(self, run: Callable[[], Any], rows: int) -> None:
        if self.on_cpu or not rows:
            run()
            return
        torch = self.torch
        main = torch.cuda.current_stream()
        main.wait_event(self.copied)
        run()
        self.done.record(main)
        with torch.cuda.stream(self.side):
            self.side.wait_event(self.done)
            self.host[:rows].copy_(self.state.capture[:rows], non_blocking=True)
            self.copied.record(self.side)


def _sync(torch: Any, on_cpu: bool) -> None:
    if not on_cpu:
        torch.cuda.synchronize()


def layer_outputs(step: Step, enabled: bool) -> Any:
    """Every layer's output as transformers reports it, from one eager pass with the op on or
    off (`hidden_states[k + 1]` is layer k's, but the last layer's, which is normed)."""
    step.state.enabled = enabled
    try:
        return step.model.model(
            input_ids=step.ids, use_cache=False, output_hidden_states=True
        ).hidden_states
    finally:
        step.state.enabled = False


def check_shape(stage: Any, torch: Any, shape: str, step: Step, tokens: int, layer: int) -> None:
    """Idle equals plain (the graphs); captured rows equal the layer's output reported by the
    same eager pass; a steer adds its vector to it, rounded once; the graph captures what the
    eager pass does (compared exactly only as a figure: cuBLAS may pick other kernels for a
    captured graph than eagerly, which moves last bits of the layers themselves)."""
    state, on_cpu = step.state, step.on_cpu
    write_mode(torch, state, "idle", tokens, layer, on_cpu)
    plain = step.run(False).clone()
    idle = step.run(True).clone()
    stage.check(f"{shape}: idle output bit-identical to plain", torch.equal(plain, idle))
    at_rest = layer_outputs(step, False)[layer + 1].reshape(tokens, -1)
    write_mode(torch, state, "capture_1_layer", tokens, layer, on_cpu)
    state.capture.fill_(0)
    reported = layer_outputs(step, True)[layer + 1].reshape(tokens, -1)
    _sync(torch, on_cpu)
    stage.check(
        f"{shape}: captured rows equal the layer's output from output_hidden_states",
        torch.equal(state.capture[:tokens], reported) and torch.equal(reported, at_rest),
    )
    eager_rows = state.capture[:tokens].clone()
    state.capture.fill_(0)
    step.run(True)
    _sync(torch, on_cpu)
    graph_rows = state.capture[:tokens].float()
    gap = (graph_rows - eager_rows.float()).norm(dim=-1) / eager_rows.float().norm(dim=-1)
    stage.figure(
        f"{shape}_graph_capture",
        {
            "bit_identical_to_eager": bool(torch.equal(state.capture[:tokens], eager_rows)),
            "max_relative_row_gap": round(float(gap.max()), 6),
        },
    )
    stage.check(
        f"{shape}: the replayed step captures the eager pass's rows, within 1%",
        float(gap.max()) <= 0.01,
        f"(max relative row gap {float(gap.max()):.2e})",
    )
    write_mode(torch, state, "steer_and_capture", tokens, layer, on_cpu)
    steered = layer_outputs(step, True)[layer + 1].reshape(tokens, -1)
    _sync(torch, on_cpu)
    expected = (at_rest.float() + state.bank[1]).to(torch.bfloat16)
    stage.check(
        f"{shape}: a steer adds its vector to the layer's output, rounded once",
        torch.equal(steered, expected)
        and torch.equal(state.capture[:tokens], expected)
        and not torch.equal(expected, at_rest),
    )


def time_shape(
    torch: Any, step: Step, copy_out: CopyOut, tokens: int, layer: int, rounds: int
) -> dict[str, Any]:
    """Paired rounds: every mode once per round in a rotated order, each over `repeats` steps;
    per round, plain's time over the mode's."""
    state, on_cpu = step.state, step.on_cpu
    write_mode(torch, state, "idle", tokens, layer, on_cpu)
    for _ in range(2):
        step.run(False)
    _sync(torch, on_cpu)
    start = time.perf_counter()
    step.run(False)
    _sync(torch, on_cpu)
    one = time.perf_counter() - start
    repeats = 1 if on_cpu else max(2, math.ceil(0.1 / max(one, 1e-6)))
    names = ("plain", *MODES)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds + 1):  # round 0 warms up
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            rows = write_mode(
                torch, state, "idle" if name == "plain" else name, tokens, layer, on_cpu
            )
            enabled = name != "plain"
            _sync(torch, on_cpu)
            start = time.perf_counter()
            for _ in range(repeats):
                copy_out.step(lambda e=enabled: step.run(e), rows)
            _sync(torch, on_cpu)
            if round_:
                seconds[name].append((time.perf_counter() - start) / repeats)
    ratios = {}
    for name in MODES:
        per_round = [p / m for p, m in zip(seconds["plain"], seconds[name], strict=True)]
        ratios[name] = {
            "median": round(statistics.median(per_round), 4),
            "min": round(min(per_round), 4),
            "max": round(max(per_round), 4),
        }
    return {
        "plain_step_ms": round(statistics.median(seconds["plain"]) * 1000, 3),
        "steps_per_measure": repeats,
        "rounds": rounds,
        "ratios": ratios,
    }


def report(
    stage: Any, shape: str, result: dict, tokens: int, n_layers: int, hidden: int, tiny: bool
) -> None:
    """A shape's ratios: PASS/FAIL against the targets on a GPU, INFO lines in --tiny."""
    default_rows = DEFAULT_CAPTURE_BYTES // (2 * hidden)
    stage.say(
        f"INFO {shape}: plain step {result['plain_step_ms']:.3f} ms "
        f"({result['steps_per_measure']} steps per measure, {result['rounds']} rounds)"
    )
    for mode in MODES:
        ratio = result["ratios"][mode]
        text = f"{ratio['median']:.3f} of plain [{ratio['min']:.3f}-{ratio['max']:.3f}]"
        rows = tokens * (n_layers if mode == "capture_all_layers" else 1)
        if tiny:
            stage.say(f"INFO {shape} {mode}: {text} (tiny model on the CPU: no target)")
        elif mode.startswith("capture") and rows > default_rows:
            stage.say(
                f"INFO {shape} {mode}: {text}; {rows} rows, more than one step may capture "
                f"with the default buffer ({default_rows}): refused in serving, no target"
            )
        else:
            stage.check(
                f"{shape} {mode} >= {TARGETS[mode]:.2f} of plain",
                ratio["median"] >= TARGETS[mode],
                f"({text})",
            )


def run_stage(stage: Any, tiny: bool) -> None:
    """Stage 2 on `stage` (benchmarks/gpu_check.Stage)."""
    import torch

    import vllm_acs.hooks.intervention_op  # noqa: F401  (registers torch.ops.vllm_acs)

    on_cpu = tiny
    device = torch.device("cpu" if on_cpu else "cuda")
    fields = TINY if tiny else LLAMA_8B
    shapes = SHAPES_TINY if tiny else SHAPES
    n_layers, hidden = fields["num_hidden_layers"], fields["hidden_size"]
    layer = n_layers // 2
    max_tokens = max(seqs * length for _, seqs, length in shapes)
    started = time.perf_counter()
    model = build_model(torch, fields, device)
    stage.say(
        f"INFO {'tiny Llama' if tiny else 'Llama-3.1-8B-shaped'} model: {n_layers} layers x "
        f"{hidden}, random bf16 weights, built in {time.perf_counter() - started:.1f} s"
    )
    state = OpState(torch, n_layers, hidden, max_tokens, max_tokens * n_layers, device)
    generator = torch.Generator().manual_seed(SEED)
    state.bank[1] = (torch.randn(hidden, generator=generator) * 0.05).to(device)
    put_op_on_layers(model, state)
    copy_out = CopyOut(torch, state)
    pool = None if on_cpu else torch.cuda.graph_pool_handle()
    with torch.inference_mode():
        for shape, seqs, length in shapes:
            tokens = seqs * length
            ids = torch.randint(3, fields["vocab_size"], (seqs, length), generator=generator)
            try:
                write_mode(torch, state, "idle", tokens, layer, on_cpu)
                step = Step(torch, model, state, ids.to(device), pool)
                check_shape(stage, torch, shape, step, tokens, layer)
                rounds = 1 if tiny else (5 if length > 1 else 7)
                result = time_shape(torch, step, copy_out, tokens, layer, rounds)
            except Exception as error:  # one shape's crash is its FAIL; the others still run
                stage.check(f"{shape} ran", False, f"({type(error).__name__}: {error})")
                continue
            finally:
                state.enabled = False
            stage.figure(shape, result)
            report(stage, shape, result, tokens, n_layers, hidden, tiny)
            del step
    stage.check(
        "stands on torch, Triton and transformers alone, no vLLM imported",
        "vllm" not in sys.modules,
    )
    stage.figure("seconds", round(time.perf_counter() - started, 2))
