"""The plugin's own share of the model worker's time, per mode and batch size: a figure that a busy
machine does not move, beside hook_overhead.py's tokens/s ratios, which it does.

One offline engine with the plugin in vLLM's default compiled mode generates, mode after mode
(idle, capture of one layer, of every layer, steering of one layer), fresh prompts at batch 1 and
32 for a fixed time, while py-spy samples its model worker's main thread (the forward pass, the
plugin's step hooks and op, and the waits for the next step) with native frames, so that every
stack is whole. A sample is the plugin's when, of vLLM's frames, torch's compiler's and the
plugin's, the innermost is the plugin's (the torch ops the plugin calls are its own). The share
is of the worker's wall time: without the plugin's work the worker would take about (1 - share)
of it, so a tokens/s ratio to plain vLLM near 1 - share, before what the compiled graph loses by
holding the op, which only hook_overhead.py's paired runs can see.

Run: `python -m benchmarks.hook_profile` (py-spy comes with the test extras; it needs ptrace,
which root has).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.hook_overhead import PROMPT_TOKENS, _payloads

SECONDS = float(os.environ.get("ACS_PROFILE_SECONDS", "20"))
RATE_HZ = 250
BATCHES = {1: 256, 32: 160}  # batch size -> output tokens per request
MODES = ("idle", "capture_1_layer", "capture_all_layers", "steer_1_layer")
_MAIN_LOOP = "worker_busy_loop"  # vLLM's worker process: the frame of its main thread's loop
_FILE = re.compile(r"\(([^:)]*)")
# Frames that end the plugin's ownership of a sample when they are innermost of the three.
_OTHER_FILES = ("vllm/", "/tmp/", "<")  # vLLM, inductor's generated code, <string> frames
_OTHER_PARTS = ("torch/_inductor", "torch/_dynamo", "torchinductor")


def plugin_share(raw_profile: str) -> tuple[float, int, Counter[str]]:
    """py-spy's raw (collapsed) output -> (the plugin's share of the samples of the worker's main
    thread, those samples, the plugin's samples by its innermost line). The main thread's
    samples include its waits for the next step: the share is of its wall time."""
    total = own = 0
    lines: Counter[str] = Counter()
    for line in raw_profile.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or _MAIN_LOOP not in stack:
            continue
        n = int(count)
        total += n
        for frame in reversed(stack.split(";")):
            match = _FILE.search(frame)
            file = match.group(1) if match else ""
            if file.startswith("vllm_acs/"):
                own += n
                lines[frame.split("/")[-1].rstrip(")") + " " + frame.split(" (")[0]] += n
                break
            if file.startswith(_OTHER_FILES) or any(part in file for part in _OTHER_PARTS):
                break
    return (own / total if total else 0.0), total, lines


def _worker_pid() -> int:
    """The process that runs the model: vLLM's worker under this driver's EngineCore."""
    import psutil

    children = psutil.Process().children(recursive=True)
    workers = [c for c in children if "Worker" in " ".join(c.cmdline()) or "Worker" in c.name()]
    return (workers or children)[-1].pid


def _driver(model: str) -> None:
    """In the driver subprocess: reads `mode batch seconds` lines, generates until the time is up,
    answers `done`; first says `ready <worker pid>`."""
    import numpy as np
    from vllm import LLM, SamplingParams, TokensPrompt

    from vllm_acs.activations import store

    os.environ["VLLM_PLUGINS"] = "acs"
    llm = LLM(model=model, max_model_len=512, max_num_seqs=32, seed=0)
    root = Path(os.environ["VLLM_ACS_CAPTURE_DIR"])
    rng = np.random.default_rng(1)
    print(f"ready {_worker_pid()}", flush=True)
    run = 0
    for line in sys.stdin:
        mode, batch, seconds = line.split()
        deadline = time.monotonic() + float(seconds)
        while time.monotonic() < deadline:
            run += 1
            extras = _payloads(mode, int(batch), f"profile-{run}")
            params = [
                SamplingParams(
                    max_tokens=BATCHES[int(batch)], temperature=0, ignore_eos=True, extra_args=e
                )
                for e in extras
            ]
            prompts = [
                TokensPrompt(
                    prompt_token_ids=[1, *rng.integers(3, 1000, PROMPT_TOKENS - 1).tolist()]
                )
                for _ in range(int(batch))
            ]
            llm.generate(prompts, params, use_tqdm=False)
            for extra in extras:
                if extra is not None:
                    store.release(json.loads(extra["acs"])["capture_id"], root=root)
        print("done", flush=True)
    llm.llm_engine.engine_core.shutdown(timeout=30)
    sys.stdout.flush()
    os._exit(0)


def _expect(stream, word: str) -> list[str]:
    """The driver's next line that starts with `word` (vLLM logs to stdout too); [] at its end."""
    for line in stream:
        if line.startswith(word):
            return line.split()
    return []


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit(
            "py-spy is missing: it comes with the test extras (pip install -e .[test])"
        )
    return found


def main() -> None:
    from vllm_acs.tiny_model import write_tiny_model

    py_spy = _py_spy()
    shares: dict[str, dict[int, tuple[float, int, Counter[str]]]] = {m: {} for m in MODES}
    with tempfile.TemporaryDirectory(prefix="acs-profile-") as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ACS_CAPTURE_DIR": str(Path(tmp) / "captures"),
        }
        driver = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.hook_profile", "--driver", model],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
        )
        try:
            ready = _expect(driver.stdout, "ready")
            if not ready:
                raise SystemExit("the profiling driver did not start")
            worker = ready[1]
            for batch in BATCHES:
                for mode in MODES:
                    # A second of warm-up before sampling, then sample while it generates.
                    driver.stdin.write(f"{mode} {batch} {SECONDS + 2}\n")
                    driver.stdin.flush()
                    time.sleep(1)
                    out = Path(tmp) / f"{mode}-{batch}.txt"
                    subprocess.run(
                        [
                            py_spy,
                            "record",
                            "--pid",
                            worker,
                            "--duration",
                            str(int(SECONDS)),
                            "--rate",
                            str(RATE_HZ),
                            # Native frames: the stacks unwound whole (without them a sample can
                            # stop at a Python line that called into C, and land on the wrong
                            # owner).
                            "--native",
                            "--format",
                            "raw",
                            "-o",
                            str(out),
                        ],
                        check=True,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    if not _expect(driver.stdout, "done"):
                        raise SystemExit("the profiling driver stopped")
                    shares[mode][batch] = plugin_share(out.read_text())
                    if os.environ.get("ACS_PROFILE_KEEP"):  # a folder for the raw profiles
                        shutil.copy(out, os.environ["ACS_PROFILE_KEEP"])
            driver.stdin.close()
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
    print(f"the plugin's share of its model worker's samples ({SECONDS:.0f} s per cell, py-spy)")
    print(f"{'mode':<20}" + "".join(f"{f'batch {b}':>24}" for b in BATCHES))
    for mode in MODES:
        cells = "".join(
            f"{100 * share:>8.2f}% ({samples:>5} samples)"
            for share, samples, _ in (shares[mode][b] for b in BATCHES)
        )
        print(f"{mode:<20}{cells}")
    print("where (the plugin's lines with the most samples, batch 32):")
    for mode in MODES:
        _, samples, lines = shares[mode][32]
        top = ", ".join(f"{where} {100 * n / samples:.1f}%" for where, n in lines.most_common(3))
        print(f"  {mode}: {top or '-'}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        _driver(sys.argv[2])
    else:
        main()
