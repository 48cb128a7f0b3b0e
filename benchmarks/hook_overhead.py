"""Output tokens/s of the offline vLLM engine with and without the plugin's intervention op.

Three engines run side by side in one driver process: plain vLLM in its default compiled mode
(the baseline; its EngineCore started without the acs plugin), plain vLLM with --enforce-eager
(what the plugin used to force: `eager_plain`), and vLLM with the plugin in the default compiled
mode, which serves the modes idle, capture of one layer, capture of every layer and steering of
one layer. Fresh random prompts of 24 tokens for every run (none repeats, so no mode reads the
prefix cache), batch sizes 1 and 32. Each round runs every mode once, back to back, in
a rotated order; only one engine works at a time.

Why paired rounds: this shared 2-core machine changes speed by 20-50% from one second to the next
(also in CPU time per token, so it is the host, not scheduling). Runs next to each other see the
same machine; so the ratio that decides is the median, over rounds, of each mode's tok/s divided
by plain vLLM's tok/s in the same round. The best tok/s of each mode is printed too.

Capture files go to a directory in /dev/shm, as in serving (the default capture root); reading
them (the API server's work) is not timed. Run: `python -m benchmarks.hook_overhead`.
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

# ACS_BENCH_ROUNDS: fewer rounds for a quick look (benchmarks/gpu_check.sh).
ROUNDS = int(os.environ.get("ACS_BENCH_ROUNDS", "24"))
BATCHES = {1: 256, 32: 160}  # batch size -> output tokens per request (runs of ~0.3 s)
PROMPT_TOKENS = 24
MODES = ("plain", "eager_plain", "idle", "capture_1_layer", "capture_all_layers", "steer_1_layer")
PLAIN_MODES = ("plain", "eager_plain")
# Each engine's share of one GPU's memory (three engines, one at work at a time).
GPU_SHARE = 0.25
# Targets against compiled plain vLLM (issue 20); eager_plain is shown for the gain.
TARGETS = {"idle": 0.99, "capture_1_layer": 0.95, "capture_all_layers": 0.85, "steer_1_layer": 0.98}


def _payloads(mode: str, n: int, tag: str) -> list[dict[str, str] | None]:
    import numpy as np

    from vllm_acs.activations.payload import AcsPayload, SteeringEntry
    from vllm_acs.client import encode_vector

    if mode in (*PLAIN_MODES, "idle"):
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


def _engine(model: str, plugin: bool, eager: bool = False) -> Any:
    """An offline engine whose EngineCore loads the acs plugin or not (it reads VLLM_PLUGINS
    when it is spawned; this driver process never loads it); compiled unless `eager`."""
    import torch
    from vllm import LLM

    os.environ["VLLM_PLUGINS"] = "acs" if plugin else ""
    more = {}
    if torch.cuda.is_available():
        # Three engines share one GPU: vLLM's default share (0.9) is one engine's, and the
        # second would refuse to start (benchmarks/gpu_check.sh runs this on a GPU).
        more["gpu_memory_utilization"] = GPU_SHARE
    return LLM(model=model, enforce_eager=eager, max_model_len=512, max_num_seqs=32, seed=0, **more)


def _measure(model: str, root: Path) -> dict[str, dict[int, list[float]]]:
    """In the driver subprocess: output tokens/s per mode and batch size, one per round."""
    import numpy as np
    from vllm import SamplingParams, TokensPrompt

    from vllm_acs.activations import store

    engines = {
        "plain": _engine(model, plugin=False),
        "eager_plain": _engine(model, plugin=False, eager=True),
        "plugin": _engine(model, plugin=True),
    }
    rng = np.random.default_rng(1)
    rates: dict[str, dict[int, list[float]]] = {m: {b: [] for b in BATCHES} for m in MODES}
    run = 0
    for round_ in range(ROUNDS + 1):  # round 0 warms up
        for batch, max_tokens in BATCHES.items():
            # Rotate the order each round: no mode always runs first after a switch.
            for mode in MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]:
                run += 1
                llm = engines[mode if mode in PLAIN_MODES else "plugin"]
                extras = _payloads(mode, batch, f"{os.getpid()}-{run}")
                params = [
                    SamplingParams(
                        max_tokens=max_tokens, temperature=0, ignore_eos=True, extra_args=extra
                    )
                    for extra in extras
                ]
                # Fresh prompts for every run, as traffic has: a prompt seen before would be a
                # prefix-cache hit for every mode but capture, which must compute its activations.
                prompts = [
                    TokensPrompt(
                        prompt_token_ids=[1, *rng.integers(3, 1000, PROMPT_TOKENS - 1).tolist()]
                    )
                    for _ in range(batch)
                ]
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                elapsed = time.perf_counter() - start
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                if round_:
                    rates[mode][batch].append(tokens / elapsed)
                for extra in extras:
                    if extra is not None:
                        store.release(json.loads(extra["acs"])["capture_id"], root=root)
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown(timeout=30)
    return rates


def _capture_parent() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def _run_driver(model: str) -> dict[str, dict[int, list[float]]]:
    with tempfile.TemporaryDirectory(prefix="acs-bench-", dir=_capture_parent()) as tmp:
        out = Path(tmp) / "rates.json"
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ACS_CAPTURE_DIR": str(Path(tmp) / "captures"),
        }
        subprocess.run(
            [sys.executable, "-m", "benchmarks.hook_overhead", "--driver", model, str(out)],
            env=env,
            check=True,
            timeout=1500,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
        )
        raw = json.loads(out.read_text())
    return {m: {int(b): r for b, r in per.items()} for m, per in raw.items()}


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    low, mid, high = statistics.quantiles(values, n=4)
    return low, mid, high


def main() -> None:
    from vllm_acs.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="acs-bench-model-") as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        rates = _run_driver(model)
    paired = {
        m: {
            b: _quartiles([r / p for r, p in zip(rates[m][b], rates["plain"][b], strict=True)])
            for b in BATCHES
        }
        for m in MODES
    }
    print(
        f"output tokens/s, {ROUNDS} rounds; every mode once per round, next to plain vLLM "
        "(compiled, vLLM's default)"
    )
    print("best tok/s | median of per-round ratios to compiled plain vLLM [quartiles]")
    print(f"{'mode':<20}" + "".join(f"{f'batch {b}':>36}" for b in BATCHES))
    for mode in MODES:
        cells = ""
        for b in BATCHES:
            low, mid, high = paired[mode][b]
            cells += f"{max(rates[mode][b]):>10.0f} tok/s | {mid:.3f} [{low:.2f}-{high:.2f}]"
        target = f"   target >= {TARGETS[mode]:.2f}" if mode in TARGETS else ""
        print(f"{mode:<20}{cells}{target}")


def _driver_main(argv: list[str]) -> None:
    model, out = argv[0], Path(argv[1])
    root = Path(os.environ["VLLM_ACS_CAPTURE_DIR"])
    rates = _measure(model, root)
    out.write_text(json.dumps(rates))
    sys.stdout.flush()
    os._exit(0)  # vLLM's interpreter teardown can hang for a minute; the engines are shut down


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        _driver_main(sys.argv[2:])
    else:
        main()
