"""Output tokens/s of the offline vLLM engine with and without the capture/steering hooks.

Plain vLLM (the acs plugin not loaded) runs in one subprocess; the plugin idle, capturing one
layer, capturing every layer and steering one layer run in another, on the same prompts, batch
sizes 1 and 32, rounds interleaved; the two engine processes alternate twice. On a shared machine
noise only slows a run, so each tok/s cell is the best round; against plain vLLM (another process)
the ratio is best vs best, against the plugin idle it is the median of per-round ratios (same
process, adjacent runs). Reading the capture files (the API server's work) is not timed.
Run: `python -m benchmarks.hook_overhead`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUNDS = 4
BATCHES = {1: 128, 32: 48}  # batch size -> output tokens per request
PROMPT_TOKENS = 24
MODES = ("idle", "capture_1_layer", "capture_all_layers", "steer_1_layer")


def _payloads(mode: str, n: int, tag: str) -> list[dict[str, str] | None]:
    import numpy as np

    from vllm_acs.activations.payload import AcsPayload, SteeringEntry
    from vllm_acs.client import encode_vector

    if mode in ("plain", "idle"):
        return [None] * n
    vector = encode_vector(np.random.default_rng(0).standard_normal((1, 128)) * 0.1)
    payloads = []
    for i in range(n):
        capture_id = f"bench-{tag}-{i}"
        if mode == "capture_1_layer":
            payload = AcsPayload(capture_id, capture_layers=(1,))
        elif mode == "capture_all_layers":
            payload = AcsPayload(capture_id, capture_layers=(0, 1, 2, 3))
        else:
            payload = AcsPayload(capture_id, steering=(SteeringEntry(vector, (1,)),))
        payloads.append(payload.to_extra_args())
    return payloads


def _measure(model: str, modes: list[str], root: Path) -> dict[str, dict[int, list[float]]]:
    """In the engine subprocess: output tokens/s per mode and batch size, one per round."""
    import numpy as np
    from vllm import LLM, SamplingParams, TokensPrompt

    from vllm_acs.activations import store

    llm = LLM(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=32, seed=0)
    rng = np.random.default_rng(1)
    prompts = [
        TokensPrompt(prompt_token_ids=[1, *rng.integers(3, 1000, PROMPT_TOKENS - 1).tolist()])
        for _ in range(max(BATCHES))
    ]
    rates: dict[str, dict[int, list[float]]] = {m: {b: [] for b in BATCHES} for m in modes}
    run = 0
    for round_ in range(ROUNDS + 1):  # round 0 warms up
        for batch, max_tokens in BATCHES.items():
            # Rotate the order each round: the first run after a switch of batch size is slower.
            for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
                run += 1
                extras = _payloads(mode, batch, f"{os.getpid()}-{run}")
                params = [
                    SamplingParams(
                        max_tokens=max_tokens, temperature=0, ignore_eos=True, extra_args=extra
                    )
                    for extra in extras
                ]
                start = time.perf_counter()
                outputs = llm.generate(prompts[:batch], params, use_tqdm=False)
                elapsed = time.perf_counter() - start
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                if round_:
                    rates[mode][batch].append(tokens / elapsed)
                for extra in extras:
                    if extra is not None:
                        capture_id = json.loads(extra["acs"])["capture_id"]
                        store.release(capture_id, root=root)
    llm.llm_engine.engine_core.shutdown(timeout=30)
    return rates


def _engine_process(
    model: str, plugin: bool, modes: list[str]
) -> dict[str, dict[int, list[float]]]:
    with tempfile.TemporaryDirectory(prefix="acs-bench-") as tmp:
        out = Path(tmp) / "rates.json"
        env = {
            **os.environ,
            "VLLM_PLUGINS": "acs" if plugin else "",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ACS_CAPTURE_DIR": str(Path(tmp) / "captures"),
        }
        command = [sys.executable, "-m", "benchmarks.hook_overhead", "--engine", model, str(out)]
        command += modes
        subprocess.run(
            command,
            env=env,
            check=True,
            timeout=400,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
        )
        raw = json.loads(out.read_text())
    return {m: {int(b): r for b, r in per.items()} for m, per in raw.items()}


def main() -> None:
    from vllm_acs.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="acs-bench-model-") as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        # Alternate the two engines twice: a process's speed on a shared machine drifts.
        plains, hookeds = [], []
        for _ in range(2):
            plains.append(_engine_process(model, plugin=False, modes=["plain"])["plain"])
            hookeds.append(_engine_process(model, plugin=True, modes=list(MODES)))
    plain = {b: max(max(run[b]) for run in plains) for b in BATCHES}
    hooked = {m: {b: max(max(run[m][b]) for run in hookeds) for b in BATCHES} for m in MODES}
    # Runs next to each other in one round share the machine's state: the median of per-round
    # ratios to idle is the steadiest figure here.
    paired = {
        m: {
            b: statistics.median(
                rate / idle
                for run in hookeds
                for rate, idle in zip(run[m][b], run["idle"][b], strict=True)
            )
            for b in BATCHES
        }
        for m in MODES
    }
    print(f"output tokens/s, best of {ROUNDS} rounds x 2 processes")
    print("best tok/s, its ratio vs plain vLLM (other process) | median per-round ratio vs idle")
    print(f"{'mode':<20}" + "".join(f"{f'batch {b}':>30}" for b in BATCHES))
    print(f"{'plain vLLM':<20}" + "".join(f"{plain[b]:>12.0f} tok/s  1.00 |     " for b in BATCHES))
    for mode in MODES:
        cells = "".join(
            f"{hooked[mode][b]:>12.0f} tok/s  {hooked[mode][b] / plain[b]:.2f} | "
            f"{paired[mode][b]:.2f}"
            for b in BATCHES
        )
        print(f"{mode:<20}{cells}")


def _engine_main(argv: list[str]) -> None:
    model, out, modes = argv[0], Path(argv[1]), argv[2:]
    root = Path(os.environ["VLLM_ACS_CAPTURE_DIR"])
    rates: Any = _measure(model, modes, root)
    out.write_text(json.dumps(rates))
    sys.stdout.flush()
    os._exit(0)  # vLLM's interpreter teardown can hang for a minute; the engine is shut down


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        _engine_main(sys.argv[2:])
    else:
        main()
