"""Runs the offline vLLM engine with the acs plugin through the hook scenarios; pickles results.

Started by tests/e2e/test_hooks_engine.py in a subprocess (vLLM keeps global state and spawns an
EngineCore and a worker process; a subprocess keeps them out of the test process and bounded).
Usage: python hooks_engine_driver.py MODEL_DIR OUT_FILE CONFIG [MODE]
(CONFIG: wide | chunked | preempt | restart; MODE: eager (default) | compiled, vLLM's default
compilation
(inductor on the CPU build; piecewise and full CUDA graphs on a GPU) | piecewise | full, one CUDA
graph mode alone (GPU only; benchmarks/gpu_check.sh))
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = 128
N_LAYERS = 4
BOS = 1


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[BOS, *rng.integers(3, 1000, size=n - 1).tolist()] for n in lengths]


def vector(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Engine:
    def __init__(
        self, model: str, max_num_batched_tokens: int, root: Path, mode: str, **more: Any
    ) -> None:
        from vllm import LLM

        self.root = root
        graphs = {"piecewise": "PIECEWISE", "full": "FULL"}
        if mode in graphs:
            more["compilation_config"] = {"cudagraph_mode": graphs[mode]}
        self.llm = LLM(
            model=model,
            enforce_eager=mode == "eager",
            max_model_len=more.pop("max_model_len", 512),
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=32,
            seed=0,
            **more,
        )
        self._ids = 0

    def preemptions(self) -> int:
        """vLLM's own count of preempted requests so far (needs stats logging on)."""
        return sum(
            int(metric.value)
            for metric in self.llm.get_metrics()
            if metric.name == "vllm:num_preemptions"
        )

    def run(self, items: list[tuple[list[int], int, dict[str, Any] | None]]) -> list[dict]:
        """items: (prompt ids, max_tokens, payload fields or None); one generate call (one
        batch, scheduled together)."""
        from vllm import SamplingParams, TokensPrompt

        from vllm_acs.activations import store
        from vllm_acs.activations.payload import AcsPayload

        requests, params, payloads = [], [], []
        for ids, max_tokens, fields in items:
            payload = None
            extra = None
            if fields is not None:
                self._ids += 1
                payload = AcsPayload(capture_id=f"t{os.getpid()}-{self._ids}", **fields)
                extra = payload.to_extra_args()
            requests.append(TokensPrompt(prompt_token_ids=ids))
            params.append(
                SamplingParams(
                    max_tokens=max_tokens,
                    temperature=0,
                    ignore_eos=True,
                    logprobs=0,
                    extra_args=extra,
                )
            )
            payloads.append(payload)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        results = []
        for output, payload in zip(outputs, payloads, strict=True):
            generated = list(output.outputs[0].token_ids)
            sampled = output.outputs[0].logprobs or []
            result: dict[str, Any] = {
                "prompt": list(output.prompt_token_ids),
                "generated": generated,
                # The sampled tokens' logprobs: equal floats mean bit-identical logits there.
                "logprobs": [step[t].logprob for step, t in zip(sampled, generated, strict=True)],
                "num_cached_tokens": output.num_cached_tokens,
            }
            if payload is not None:
                n_rows = len(output.prompt_token_ids) + len(generated) - 1
                result["header"] = store.read_header(payload.capture_id, root=self.root)
                if payload.capture_layers:
                    bits = store.read_capture(
                        payload.capture_id,
                        n_layers=len(payload.capture_layers),
                        hidden=HIDDEN,
                        n_rows=n_rows,
                        root=self.root,
                    )
                    result["capture"] = bits
                else:
                    store.check_applied(payload.capture_id, n_rows=n_rows, root=self.root)
                store.release(payload.capture_id, root=self.root)
            results.append(result)
        return results


def steer(vec: np.ndarray, layers: list[int], scale: float, **more: Any) -> dict[str, Any]:
    from vllm_acs.client import encode_vector

    return {
        "activations": encode_vector(vec),
        "layer_indices": layers,
        "scale": scale,
        "norm_match": more.get("norm_match", False),
        "position_indices": more.get("position_indices"),
    }


def steering_entry(raw: dict[str, Any]):
    from vllm_acs.activations.payload import SteeringEntry

    return SteeringEntry.from_dict(raw)


ALL = (0, 1, 2, 3)


def scenarios_wide(engine: Engine) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Capture: one request, every layer, prompt and generated rows.
    [p] = prompts(1, [11])
    out["capture_single"] = engine.run([(p, 6, {"capture_layers": ALL})])[0]
    # 16 concurrent captures of different lengths and layer sets, beside 4 plain requests.
    batch = prompts(2, [3 + 4 * i for i in range(20)])
    items = [
        (ids, 5, {"capture_layers": ALL if i % 2 else (1, 3)} if i < 16 else None)
        for i, ids in enumerate(batch)
    ]
    out["capture_batch16"] = engine.run(items)
    # Prefix caching: a plain run fills the cache; a second plain run reads it; a capture doesn't.
    # 300 tokens: two full 128-token blocks (the CPU build's block size) can be cached.
    [shared] = prompts(3, [300])
    engine.run([(shared, 2, None)])
    out["prefix_plain_again"] = engine.run([(shared, 2, None)])[0]
    out["prefix_capture"] = engine.run([(shared, 3, {"capture_layers": ALL})])[0]

    # Steering identity and effect (solo runs, same batch shape each time).
    [q] = prompts(4, [9])
    v = vector(5, (1, HIDDEN))
    out["steer_baseline"] = engine.run([(q, 16, None)])[0]
    zero = {"steering": (steering_entry(steer(v, [1], 0.0)),)}
    out["steer_zero"] = engine.run([(q, 16, zero)])[0]
    big = {"steering": (steering_entry(steer(v, [1], 8.0, norm_match=True)),)}
    out["steer_big"] = engine.run([(q, 16, big)])[0]

    # A steered request among unsteered ones vs. the same batch with nobody steered.
    others = prompts(6, [5, 12, 20])
    batch_items = [(q, 12, None)] + [(ids, 12, None) for ids in others]
    out["batch_plain"] = engine.run(batch_items)
    out["batch_steered"] = engine.run([(q, 12, big), *batch_items[1:]])

    # One batch: a steered request, a capturing one and two plain ones, against the same batch
    # all plain: the plain rows are bit-identical, the capture lands in its own file.
    mixed = prompts(14, [7, 15, 10, 21])
    out["mixed_plain"] = engine.run([(ids, 10, None) for ids in mixed])
    out["mixed"] = engine.run(
        [
            (mixed[0], 10, big),
            (mixed[1], 10, {"capture_layers": (0, 2)}),
            (mixed[2], 10, None),
            (mixed[3], 10, None),
        ]
    )

    # norm_match against the full residual stream: steer layer 1 everywhere, capture all layers.
    [r] = prompts(7, [13])
    out["nm_plain"] = engine.run([(r, 4, {"capture_layers": ALL})])[0]
    nm = steering_entry(steer(v, [1], 0.5, norm_match=True))
    out["nm_steered"] = engine.run([(r, 4, {"capture_layers": ALL, "steering": (nm,)})])[0]

    # Position-indexed: one vector at a generated position (applied during decode).
    position = len(r) + 2
    pv = vector(8, (1, 1, HIDDEN))
    pe = steering_entry(steer(pv, [1], 2.0, norm_match=True, position_indices=[position]))
    out["pos_decode"] = {
        "position": position,
        "vector": pv[0, 0],
        "steered": engine.run([(r, 4, {"capture_layers": ALL, "steering": (pe,)})])[0],
    }
    return out


def scenarios_chunked(engine: Engine) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lengths = [3, 70, 9, 41, 17, 33, 5, 64, 26, 12, 48, 7, 30, 55, 21, 38]
    batch = prompts(9, lengths)
    out["capture_batch16"] = engine.run([(ids, 4, {"capture_layers": ALL}) for ids in batch])
    # Position -1 (last prompt token) of a 70-token prompt lands in the third prefill chunk.
    [p] = prompts(10, [70])
    pv = vector(11, (1, 2, HIDDEN))
    entry = steering_entry(steer(pv, [2], 2.0, norm_match=True, position_indices=[-1, 5]))
    out["pos_plain"] = engine.run([(p, 3, {"capture_layers": ALL})])[0]
    out["pos_steered"] = engine.run([(p, 3, {"capture_layers": ALL, "steering": (entry,)})])[0]
    out["pos_vectors"] = pv[0]
    return out


def scenarios_preempt(engine: Engine) -> dict[str, Any]:
    """KV for 384 tokens (PREEMPT_KV_TOKENS) for three requests that outgrow it while they
    decode: vLLM preempts one, frees its blocks, and recomputes it from position 0 later."""
    out: dict[str, Any] = {}
    batch = prompts(12, [110, 118, 104])
    vec = vector(13, (1, HIDDEN))
    entry = steering_entry(steer(vec, [1], 0.0))
    items = [(ids, 40, {"capture_layers": ALL}) for ids in batch[:2]]
    items.append((batch[2], 40, {"capture_layers": ALL, "steering": (entry,)}))
    out["plain"] = engine.run([(ids, 40, None) for ids in batch])
    before = engine.preemptions()
    out["captured"] = engine.run(items)
    out["preemptions"] = engine.preemptions() - before
    return out


def scenario_restart(engine: Engine) -> dict[str, Any]:
    """One capture of every layer, and what the worker compiled or loaded for it: the engine is
    started twice on one compile cache (VLLM_CACHE_ROOT) with other buffer sizes
    (tests/e2e/test_compile_cache_restart.py)."""

    def worker_state(worker: Any) -> dict[str, Any]:
        from vllm.compilation.counter import compilation_counter

        from vllm_acs.hooks.compat import COMPILE_CACHE_KEY

        runner = worker.model_runner
        layer = runner.get_model().model.layers[0]
        return {
            "cache_key": runner.vllm_config.additional_config.get(COMPILE_CACHE_KEY),
            "aot_loaded": compilation_counter.num_aot_artifacts_loaded,
            "aot_compiled": compilation_counter.num_aot_compiles,
            "capture_shape": tuple(layer.acs_capture.shape),
            "bank_shape": tuple(layer.acs_bank.shape),
        }

    [p] = prompts(1, [11])
    out: dict[str, Any] = {"capture": engine.run([(p, 6, {"capture_layers": ALL})])[0]}
    out["worker"] = engine.llm.collective_rpc(worker_state)[0]
    return out


def op_calls_in_a_forward(engine: Engine) -> tuple[str, int]:
    """How many times the worker's intervention op ran in one forward pass of a capture request
    (the worker counts them; a compiled graph without the op would count 0)."""

    def count(worker: Any) -> tuple[str, int]:
        from vllm_acs.hooks.intervention_op import CPU_GATE

        return worker.device.type, CPU_GATE.calls_in_last_active_step

    [p] = prompts(99, [5])
    engine.run([(p, 1, {"capture_layers": (0,)})])
    return engine.llm.collective_rpc(count)[0]


# The preemption scenario's KV cache, in tokens: three requests of 104-118 prompt tokens that
# each decode 40 outgrow it (whatever the block size), so vLLM preempts one.
PREEMPT_KV_TOKENS = 384


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    model, out_file, config = sys.argv[1], sys.argv[2], sys.argv[3]
    mode = sys.argv[4] if len(sys.argv) > 4 else "eager"
    root = Path(out_file).parent / f"captures-{config}-{mode}"
    root.mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_ACS_CAPTURE_DIR"] = str(root)
    if config == "restart":
        engine = Engine(model, 2048, root, mode)
        results = scenario_restart(engine)
    elif config == "preempt":
        # KV for 384 tokens: 3 blocks of the CPU build's 128 tokens, or 24 of a GPU's 16.
        block = 16 if _on_cuda() else 128
        engine = Engine(
            model,
            512,
            root,
            mode,
            max_model_len=256,
            num_gpu_blocks_override=PREEMPT_KV_TOKENS // block,
            disable_log_stats=False,
            **({"block_size": block} if _on_cuda() else {}),
        )
        results = scenarios_preempt(engine)
    else:
        engine = Engine(model, 2048 if config == "wide" else 32, root, mode)
        results = scenarios_wide(engine) if config == "wide" else scenarios_chunked(engine)
    results["leftover_files"] = sorted(p.name for p in root.iterdir())
    results["op_calls"] = op_calls_in_a_forward(engine)
    with open(out_file, "wb") as handle:
        pickle.dump(results, handle)
    # Stop the EngineCore and worker now; interpreter teardown after vLLM can hang for a minute.
    engine.llm.llm_engine.engine_core.shutdown(timeout=30)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # Before vLLM is imported: load the acs general plugin (and nothing else), small KV cache.
    os.environ["VLLM_PLUGINS"] = "acs"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # collective_rpc with a function (op_calls_in_a_forward) pickles it to the worker.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    main()
