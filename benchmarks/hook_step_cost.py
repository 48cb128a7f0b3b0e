"""The plugin's host microseconds per step on the CPU build, at batch 1 and 32: idle, capture of one
layer and steering of one layer (issue 32's "host's share per step").

No engine: two stand-ins for vLLM's V1 model runner step through the same batches side by side.
One is plain; the other is wrapped by the plugin exactly as a worker's runner is
(`compat._wrap_runner`: learning requests, the index buffer's rows, the steering table, capture
planning, filing, holding the output) and its model calls `torch.ops.vllm_acs.intervene` on each
of its decoder layers, as the compiled graph does (the CPU op's per-layer plan and its tensor
work). The runners' own work (updating the batch, the forward pass) is a few array writes, the
same in both; the model is the tiny test model's shape (4 layers, hidden 128). A run is what
`hook_overhead.py` generates: fresh requests with 24-token prompts, one prefill step, then
decode steps (256 tokens at batch 1, 160 at batch 32), their end learned at the next run's
first step, capture files in /dev/shm as in serving.

Each step is timed on both runners, one right after the other (time.perf_counter_ns), and the
plugin's cost of that step is the difference. Reported: the median over the decode steps of a
stable batch (the steady state, which most steps are), and a run's mean step (arrival, prefill,
the capture files growing and the end included), the median over the runs. Medians of paired
steps are what a busy shared machine moves least; still, read them as +-20%.

Run: `python -m benchmarks.hook_step_cost` (`--quick`: a few short runs, for the tests).
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

N_LAYERS = 4
HIDDEN = 128
PROMPT_TOKENS = 24
BATCHES = {1: 256, 32: 160}  # batch size -> output tokens per request (as hook_overhead.py)
MODES = ("idle", "capture_1_layer", "steer_1_layer")
# Targets at batch 32 (issue 32), microseconds per step in the steady state.
TARGETS_US = {"idle": 10.0, "capture_1_layer": 100.0, "steer_1_layer": 100.0}
MAX_REQS = 64
MAX_TOKENS = 2048


@dataclass
class StepCost:
    decode_us: float  # median over the decode steps of a stable batch
    mean_us: float  # mean over every step of a run (median over the runs)
    steps: int


class _Runner:
    """The attributes and methods of vLLM's V1 runner that compat._wrap_runner reads or wraps.
    `execute_model` lays out the step's batch as vLLM's persistent batch holds it, runs the
    model (the op on each layer when `layers` is given) and `sample_tokens` returns the output."""

    def __init__(self, layers: list[tuple[Any, ...]] | None) -> None:
        self.layers = layers
        self.input_batch = types.SimpleNamespace(
            req_id_to_index={},
            req_ids=[],
            num_reqs=0,
            num_computed_tokens_cpu=np.zeros(MAX_REQS, dtype=np.int32),
        )
        self.query_start_loc = types.SimpleNamespace(np=np.zeros(MAX_REQS + 1, dtype=np.int32))
        self._hidden = torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16)
        self._residual = torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16)
        self._tokens = 0

    def execute_model(self, scheduler_output: Any) -> None:
        batch = self.input_batch
        req_ids, positions, lengths = scheduler_output.layout
        if batch.req_ids[: batch.num_reqs] != req_ids:  # vLLM updates its dict in place
            batch.req_id_to_index.clear()
            batch.req_id_to_index.update({r: i for i, r in enumerate(req_ids)})
            batch.req_ids[:] = req_ids
        batch.num_reqs = len(req_ids)
        batch.num_computed_tokens_cpu[: len(req_ids)] = positions
        loc = self.query_start_loc.np
        loc[0] = 0
        np.cumsum(lengths, out=loc[1 : len(lengths) + 1])
        self._tokens = int(loc[len(lengths)])
        self._model_forward()

    def _model_forward(self) -> None:
        if self.layers is None:
            return
        tokens = self._tokens
        hidden, residual = self._hidden[:tokens], self._residual[:tokens]
        op = torch.ops.vllm_acs.intervene.default
        for bank, indices, capture, index in self.layers:  # the graph's inputs: no lookups
            op(hidden, residual, bank, indices, capture, index)

    def sample_tokens(self, grammar_output: Any = None) -> Any:
        return types.SimpleNamespace(sampled=self._tokens)


def _new_request(req_id: str, extra_args: dict[str, str] | None, max_tokens: int) -> Any:
    return types.SimpleNamespace(
        req_id=req_id,
        sampling_params=types.SimpleNamespace(extra_args=extra_args, max_tokens=max_tokens),
        prompt_token_ids=list(range(1, PROMPT_TOKENS + 1)),
        prompt_embeds=None,
    )


def _schedule(mode: str, batch: int, output_tokens: int, runs: int):
    """Scheduler outputs, as the runner sees them: per run, a prefill step with the new
    requests (the last run's ends learned there), then its decode steps. Yields (output, whether
    the step is a decode step of a stable batch)."""
    from benchmarks.hook_overhead import _payloads

    finished: set[str] = set()
    for run in range(runs):
        extras = _payloads(mode, batch, f"cost-{time.monotonic_ns()}-{run}")
        req_ids = [f"r{run}-{i}" for i in range(batch)]
        new = [_new_request(r, e, output_tokens) for r, e in zip(req_ids, extras, strict=True)]
        yield (
            types.SimpleNamespace(
                scheduled_new_reqs=[n for n in new if n.sampling_params.extra_args],
                finished_req_ids=finished,
                layout=(req_ids, [0] * batch, [PROMPT_TOKENS] * batch),
            ),
            False,
        )
        for step in range(1, output_tokens):
            position = PROMPT_TOKENS + step - 1
            yield (
                types.SimpleNamespace(
                    scheduled_new_reqs=[],
                    finished_req_ids=set(),
                    layout=(req_ids, [position] * batch, [1] * batch),
                ),
                True,
            )
        finished = set(req_ids)
    yield (
        types.SimpleNamespace(
            scheduled_new_reqs=[], finished_req_ids=finished, layout=([], [], [])
        ),
        False,
    )


def _plugin_runner(root: Path) -> tuple[_Runner, Any]:
    from vllm_acs.hooks import compat
    from vllm_acs.hooks.intervention_buffers import InterventionBuffers
    from vllm_acs.hooks.runtime import ActivationRuntime
    from vllm_acs.settings import Settings

    settings = Settings()
    buffers = InterventionBuffers(
        n_layers=N_LAYERS,
        hidden=HIDDEN,
        max_tokens=MAX_TOKENS,
        bank_slots=settings.steering_slots + 1,
        capture_mb=settings.capture_buffer_mb,
        device=torch.device("cpu"),
    )
    runtime = ActivationRuntime(buffers=buffers, root=root, writes_files=True)
    layers = [
        (buffers.bank, buffers.indices, buffers.capture_buffer, index) for index in range(N_LAYERS)
    ]
    runner = _Runner(layers)
    compat._wrap_runner(runner, runtime)
    return runner, runtime


def _step(runner: _Runner, scheduler_output: Any) -> int:
    start = time.perf_counter_ns()
    runner.execute_model(scheduler_output)
    runner.sample_tokens()
    return time.perf_counter_ns() - start


def measure(mode: str, batch: int, output_tokens: int, runs: int) -> StepCost:
    """The plugin's microseconds per step in `mode` at `batch`, paired against a plain runner."""
    import vllm_acs.hooks.intervention_op  # noqa: F401  (registers the op)
    from vllm_acs.activations import store

    with tempfile.TemporaryDirectory(prefix="acs-step-cost-", dir=_shm()) as tmp:
        root = Path(tmp)
        plain = _Runner(None)
        plugin, runtime = _plugin_runner(root)
        decode: list[int] = []
        every: list[int] = []
        # A run's share: its decode steps, then the step that learns its end and admits the
        # next run (the first run's admission is left out, so each share holds one).
        run_means: list[float] = []
        run_start = 1
        gc_was = gc.isenabled()
        gc.collect()
        gc.disable()  # a collection would land on one runner's step only
        try:
            with torch.inference_mode():  # as vLLM's runner steps
                for scheduler_output, stable in _schedule(mode, batch, output_tokens, runs):
                    # Alternate which runner goes first: neither always finds the cache warm.
                    if len(every) % 2:
                        cost = _step(plugin, scheduler_output) - _step(plain, scheduler_output)
                    else:
                        base = _step(plain, scheduler_output)
                        cost = _step(plugin, scheduler_output) - base
                    every.append(cost)
                    if stable:
                        decode.append(cost)
                    if scheduler_output.finished_req_ids:
                        if len(every) > 1:
                            run_means.append(statistics.fmean(every[run_start:]))
                            run_start = len(every)
                        for capture in list(root.glob("*.acscap")):
                            store.release(capture.stem, root=root)
        finally:
            if gc_was:
                gc.enable()
        assert not runtime.active
    return StepCost(statistics.median(decode) / 1e3, statistics.median(run_means) / 1e3, len(every))


def _shm() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def run(quick: bool = False) -> dict[str, dict[int, StepCost]]:
    runs = 1 if quick else 6
    costs: dict[str, dict[int, StepCost]] = {m: {} for m in MODES}
    for batch, output_tokens in BATCHES.items():
        for mode in MODES:
            measure(mode, batch, 4, 1)  # warm-up: imports, the op's first calls
            costs[mode][batch] = measure(mode, batch, 8 if quick else output_tokens, runs)
    return costs


def report(costs: dict[str, dict[int, StepCost]]) -> str:
    lines = [
        "the plugin's host microseconds per step (CPU build, stand-in V1 runner, paired with a "
        "plain one)",
        "steady decode step (median) | a run's mean step (median over runs)",
        f"{'mode':<18}" + "".join(f"{f'batch {b}':>26}" for b in BATCHES) + "   target, batch 32",
    ]
    for mode in MODES:
        cells = "".join(
            f"{c.decode_us:>11.1f} us | {c.mean_us:>7.1f} us" for c in costs[mode].values()
        )
        lines.append(f"{mode:<18}{cells}   <= {TARGETS_US[mode]:.0f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    print(report(run(quick=quick)))


if __name__ == "__main__":
    main()
