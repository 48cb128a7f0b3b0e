"""The only module that touches vLLM internals: version and structure checks, putting the
intervention op on the model's decoder layers and learning each step's batch from vLLM's V1 or V2
model runner, prefix-cache isolation of ACS requests.

`install()` runs from the general plugin in every vLLM process; it patches two vLLM classes when
(and only if) their modules are imported, so the API server does not import the worker stack:
- `vllm.v1.worker.gpu_worker.Worker.load_model` (CPUWorker inherits it): before the model loads,
  `allow_amx_tiles` (vLLM's CPU attention needs it on AMX machines); after, `install_on_runner`
  checks the runner and the model, allocates the op's buffers, switches every decoder layer to a
  forward that calls the op (before torch.compile and CUDA-graph capture first run the model),
  and wraps the runner's step to fill the buffers. Eager, compiled and CUDA-graph modes alike.
- `vllm.v1.request.Request.from_engine_core_request` (EngineCore process): a capture request
  never reads the prefix cache (cached tokens skip the forward pass: no rows for them), and a
  steered request's KV is salted with a fingerprint of its steering (`isolate_in_prefix_cache`).

docs/vllm-notes.md lists the runner internals read here, per vLLM version.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from types import ModuleType
from typing import Any

import torch

from ..activations.payload import EXTRA_ARGS_KEY, AcsPayload, PayloadError, SteeringEntry
from ..activations.store import capture_root
from .intervention_buffers import InterventionBuffers
from .intervention_op import OP_SET_VERSION
from .post_import import when_imported
from .runtime import ActivationRuntime, NewRequest
from .steering import SteeringSpecError, absolute_positions

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ((0, 32), (0, 33))
# The key under vLLM's additional_config that carries the op set into the compile-cache hash.
COMPILE_CACHE_KEY = "vllm_acs_ops"


class UnsupportedSetupError(RuntimeError):
    """vLLM, its configuration or the model is one the hooks cannot serve correctly."""


def vllm_version() -> tuple[int, int]:
    from vllm.version import __version__

    parts = __version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UnsupportedSetupError(
            f"vllm_acs cannot read vLLM's version {__version__!r}"
        ) from None


def install() -> None:
    """From the general plugin, in every vLLM process. Idempotent (patches mark themselves)."""
    version = vllm_version()
    if version not in SUPPORTED_VLLM:
        raise UnsupportedSetupError(
            f"vllm_acs supports vLLM {' and '.join(f'{a}.{b}' for a, b in SUPPORTED_VLLM)}, "
            f"found {version[0]}.{version[1]}: its capture and steering hooks read model-runner "
            "internals that change between releases"
        )
    choose_v1_runner(os.environ)
    when_imported("vllm.v1.request", _patch_request)
    when_imported("vllm.v1.worker.gpu_worker", _patch_worker)


V2_RUNNER_VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"


def choose_v1_runner(environ: MutableMapping[str, str]) -> None:
    """vLLM's V2 model runner (its default on NVIDIA GPUs) is hooked but not yet checked in an
    engine run: unless the operator chose a runner, choose V1 before vLLM does, in this process
    and the engine processes it starts. An operator's explicit 1 stands (the worker warns)."""
    if environ.get(V2_RUNNER_VARIABLE, "") != "":
        return
    environ[V2_RUNNER_VARIABLE] = "0"
    logger.info(
        "vllm_acs: %s=0 (vLLM's V1 model runner): capture and steering are not yet checked on "
        "the V2 runner",
        V2_RUNNER_VARIABLE,
    )


def _patch_request(module: ModuleType) -> None:
    request_cls = module.Request
    original = request_cls.__dict__["from_engine_core_request"].__func__
    if getattr(original, "_acs_patched", False):
        return

    @functools.wraps(original)
    def from_engine_core_request(cls: type, request: Any, block_hasher: Any) -> Any:
        params = request.sampling_params
        if params is not None and params.extra_args and EXTRA_ARGS_KEY in params.extra_args:
            prompt_len = len(request.prompt_token_ids or ())
            isolate_in_prefix_cache(request, params, params.extra_args, prompt_len)
        return original(cls, request, block_hasher)

    from_engine_core_request._acs_patched = True  # type: ignore[attr-defined]
    request_cls.from_engine_core_request = classmethod(from_engine_core_request)


def isolate_in_prefix_cache(
    request: Any, params: Any, extra_args: Mapping[str, Any], prompt_len: int
) -> None:
    """A capture never reads cached blocks (cached prompt tokens skip the forward pass, so no
    row for them). A steered request's KV serves only requests steered the same way: its salt
    is a fingerprint of its steering (vLLM hashes the salt into the first block, and blocks
    chain). A capture-only request computes plain KV and feeds the cache as a plain one does."""
    try:
        payload = AcsPayload.from_extra_args(extra_args)
        fingerprint = steering_fingerprint(payload.steering, prompt_len) if payload else None
    except (PayloadError, SteeringSpecError):
        # The worker fails it: keep its blocks to itself meanwhile.
        params.skip_reading_prefix_cache = True
        request.cache_salt = f"{request.cache_salt or ''}|acs:{request.request_id}"
        return
    if payload is None:
        return
    if payload.capture_layers:
        params.skip_reading_prefix_cache = True
    if fingerprint is not None:
        request.cache_salt = f"{request.cache_salt or ''}|acs-steer:{fingerprint}"


def steering_fingerprint(entries: Sequence[SteeringEntry], prompt_len: int) -> str | None:
    """What a steered forward pass depends on (vectors, layers, resolved positions, scales,
    norm_match), as a hash; None for no steering. Negative positions count from the end of the
    prompt, so they are resolved against it: the same entry on prompts of other lengths steers
    other positions."""
    if not entries:
        return None
    canonical = [
        {
            "activations": dict(entry.activations),
            "layers": list(entry.layer_indices),
            "positions": None
            if entry.position_indices is None
            else list(absolute_positions(entry.position_indices, prompt_len) or ()),
            "scale": entry.scale,
            "norm_match": entry.norm_match,
        }
        for entry in entries
    ]
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _patch_worker(module: ModuleType) -> None:
    worker_cls = module.Worker
    original = worker_cls.load_model
    if getattr(original, "_acs_patched", False):
        return

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        allow_amx_tiles()
        original(self, *args, **kwargs)
        install_on_runner(self.model_runner)

    load_model._acs_patched = True  # type: ignore[attr-defined]
    worker_cls.load_model = load_model


def allow_amx_tiles() -> None:
    """Worker process: asks Linux for the AMX tile state where the CPU has AMX.

    vLLM's CPU attention runs AMX tile instructions for bf16 models wherever the CPU lists
    `amx_tile`, but never asks for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+),
    which a process must do before its first tile instruction: without it the worker dies of
    SIGILL at its first request ("Worker proc VllmWorker-0 died unexpectedly", every answer then
    `vllm_engine_dead`). torch asks for it only when oneDNN itself uses AMX; this asks once, in the
    worker, before the model loads. A no-op where the CPU has no AMX.
    """
    cpu = getattr(torch._C, "_cpu", None)
    if cpu is None or not torch.cpu._is_amx_tile_supported():
        return
    if not cpu._init_amx():
        logger.warning(
            "the CPU lists AMX but Linux refused its tile state (a kernel before 5.16, or a "
            "hypervisor that does not pass AMX through): vLLM's AMX attention will kill this "
            "worker at its first request"
        )


def install_on_runner(runner: Any) -> ActivationRuntime:
    """Checks that the op can see every token of every step, then puts it on every decoder
    layer, with its buffers, before torch.compile and CUDA-graph capture first run the model.
    Raises UnsupportedSetupError (the worker fails to start) rather than serving a silent no-op."""
    from vllm.distributed import get_tensor_model_parallel_rank

    from ..settings import Settings

    wrap = _runner_wrapper(runner)
    config = runner.vllm_config
    refuse_runner_shapes(config)
    layers = decoder_layers(runner.model)
    settings = Settings.load(additional_config=config.additional_config or {})
    compilation = config.compilation_config
    buffers = InterventionBuffers(
        n_layers=len(layers),
        hidden=runner.model_config.get_hidden_size(),
        max_tokens=max(runner.max_num_tokens, compilation.max_cudagraph_capture_size or 0),
        bank_slots=settings.steering_slots + 1,
        capture_mb=settings.capture_buffer_mb,
        device=runner.device,
    )
    mark_compile_cache(config, buffers)
    runtime = ActivationRuntime(
        buffers=buffers,
        root=capture_root(settings.capture_dir),
        writes_files=get_tensor_model_parallel_rank() == 0,
    )
    put_op_on_layers(layers, buffers)
    wrap(runner, runtime)
    logger.info(
        "vllm_acs intervention op on %d decoder layers of %s (%s, compilation mode %s, CUDA "
        "graphs %s); capture buffer %d rows (%.0f MB), steering bank %d slots; capture files in %s",
        len(layers),
        type(runner.model).__name__,
        "V2 model runner" if wrap is _wrap_runner_v2 else "V1 model runner",
        compilation.mode,
        compilation.cudagraph_mode,
        buffers.capture_rows,
        settings.capture_buffer_mb,
        settings.steering_slots,
        runtime.root,
    )
    return runtime


def refuse_runner_shapes(config: Any) -> None:
    """Refuses the runner shapes whose rows the op cannot follow: the index buffer holds one row
    per token of the step's whole batch, in the runner's order (docs/vllm-notes.md). Read with
    defaults, so a vLLM without one of these settings passes that check."""
    if config.speculative_config is not None:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support speculative decoding: draft tokens "
            "are verified in a pass whose rows are not one request's positions"
        )
    parallel = config.parallel_config
    if getattr(parallel, "pipeline_parallel_size", 1) != 1:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support pipeline parallelism: each stage sees "
            "only its own layers"
        )
    if getattr(parallel, "enable_dbo", False) or (getattr(parallel, "ubatch_size", 0) or 0) > 1:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support dual-batch overlap (--enable-dbo, "
            "--ubatch-size): the model runs on micro-batches, slices of the step's tokens whose "
            "rows are not the step's rows; turn it off on a node that serves capture or steering"
        )
    if (getattr(parallel, "prefill_context_parallel_size", 1) or 1) > 1:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support prefill context parallelism "
            "(--prefill-context-parallel-size > 1): each rank runs its own share of a prompt's "
            "tokens, reordered, so no rank holds a request's rows in position order"
        )


def compile_cache_key(buffers: InterventionBuffers) -> dict[str, Any]:
    """What a compiled graph with the op depends on beyond vLLM's own config: the op set, and
    the shape and dtype of each buffer the graph takes as an input (the capture buffer follows
    VLLM_ACS_CAPTURE_BUFFER_MB, the bank VLLM_ACS_STEERING_SLOTS)."""
    tensors = {
        "bank": buffers.bank,
        "indices": buffers.indices,
        "capture_buffer": buffers.capture_buffer,
    }
    return {
        "ops": OP_SET_VERSION,
        "buffers": {name: [*t.shape, str(t.dtype)] for name, t in tensors.items()},
    }


def mark_compile_cache(config: Any, buffers: InterventionBuffers) -> None:
    """Puts the plugin's op set and its buffers' shapes into the config that vLLM hashes for its
    compile-cache key (`VllmConfig.compute_hash` hashes `additional_config`), before the first
    compile: a graph compiled without the op is never loaded with the plugin, nor one with it
    without the plugin, nor one traced with other buffer sizes (vLLM loads an AOT graph with
    its guards off, so nothing else would check the buffers' shapes)."""
    if config.additional_config is None:
        config.additional_config = {}
    if not isinstance(config.additional_config, dict):
        raise UnsupportedSetupError(
            "vllm_acs needs vLLM's additional_config to be a dict (it adds its op set to the "
            f"compile-cache key), found {type(config.additional_config).__name__}"
        )
    config.additional_config[COMPILE_CACHE_KEY] = compile_cache_key(buffers)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks, in order, of a model whose blocks return (hidden, residual) and whose
    residual stream after block k is their sum (vLLM's fused-residual Llama family)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise UnsupportedSetupError(
            f"vllm_acs cannot find decoder layers in {type(model).__name__} (expected model.layers)"
        )
    for layer in layers:
        parameters = inspect.signature(layer.forward).parameters
        if not {"positions", "hidden_states", "residual"} <= set(parameters):
            raise UnsupportedSetupError(
                f"vllm_acs supports decoder layers with the fused-residual interface "
                f"(positions, hidden_states, residual); {type(layer).__name__} is not one"
            )
    return list(layers)


_INTERVENING_CLASSES: dict[type, type] = {}


def _intervening_class(cls: type) -> type:
    """A subclass of a decoder layer class whose forward calls the op on the layer's output.
    The layer's instances are switched to it in place: names, weights and vLLM's references to
    the modules stay as they are, and torch.compile traces the op as part of the forward."""
    made = _INTERVENING_CLASSES.get(cls)
    if made is not None:
        return made
    original = cls.forward

    def forward(self: Any, positions: Any, hidden_states: Any, residual: Any, *a: Any, **k: Any):
        output = original(self, positions, hidden_states, residual, *a, **k)
        if not (isinstance(output, tuple) and len(output) == 2):
            raise UnsupportedSetupError(
                f"decoder layer {type(self).__name__} returned {type(output).__name__}, not "
                "(hidden, residual)"
            )
        hidden, residual = output
        torch.ops.vllm_acs.intervene(
            hidden, residual, self.acs_bank, self.acs_indices, self.acs_capture, self.acs_layer
        )
        return hidden, residual

    made = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    _INTERVENING_CLASSES[cls] = made
    return made


def put_op_on_layers(layers: list[torch.nn.Module], buffers: InterventionBuffers) -> None:
    """Every decoder layer calls the op, idle or not: a compiled graph cannot gain or lose it
    later. The buffers are registered on each layer (not saved with the weights)."""
    for index, layer in enumerate(layers):
        layer.register_buffer("acs_bank", buffers.bank, persistent=False)
        layer.register_buffer("acs_indices", buffers.indices, persistent=False)
        layer.register_buffer("acs_capture", buffers.capture_buffer, persistent=False)
        layer.acs_layer = index
        layer.__class__ = _intervening_class(type(layer))


def _runner_wrapper(runner: Any) -> Callable[[Any, ActivationRuntime], None]:
    """How the runtime learns each step's batch on this runner: V1 (`gpu_model_runner`) or V2
    (`gpu.model_runner`, whose CPU runner subclasses it); any other runner is refused."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if isinstance(runner, GPUModelRunner):
        return _wrap_runner
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2
    except ImportError:  # a vLLM without the V2 runner
        GPUModelRunnerV2 = None
    if GPUModelRunnerV2 is not None and isinstance(runner, GPUModelRunnerV2):
        logger.warning(
            "vllm_acs: %s=1 (vLLM's V2 model runner): capture and steering are hooked on it "
            "but not yet checked in an engine run (vLLM's CPU build cannot run it; "
            "benchmarks/gpu_check.sh checks it on a GPU); unset it for the checked V1 runner",
            V2_RUNNER_VARIABLE,
        )
        return _wrap_runner_v2
    raise UnsupportedSetupError(
        f"vllm_acs capture and steering run on vLLM's V1 or V2 model runner, found "
        f"{type(runner).__name__}"
    )


def _learn_requests(runtime: ActivationRuntime, scheduler_output: Any) -> None:
    """As a step starts, on either runner: the requests that finished, and the new ones that
    carry extra_args (the runtime keeps those with an ACS payload). Most steps have neither:
    they cost two attribute reads."""
    finished = scheduler_output.finished_req_ids
    if finished and runtime.active:
        runtime.finish_requests(finished)
    if not scheduler_output.scheduled_new_reqs:
        return
    new = [
        NewRequest(
            req_id=data.req_id,
            extra_args=data.sampling_params.extra_args,
            prompt_len=_prompt_len(data),
            max_tokens=data.sampling_params.max_tokens or 0,
        )
        for data in scheduler_output.scheduled_new_reqs
        if data.sampling_params is not None and data.sampling_params.extra_args
    ]
    if new:
        runtime.add_requests(new)


def _wrap_runner(runner: Any, runtime: ActivationRuntime) -> None:
    """Wraps two methods on this runner instance. execute_model: learn new and finished requests
    from the scheduler output. _model_forward: runs after the runner updated its persistent batch
    (order, positions), so the index rows written there are the rows the model sees. A step with
    no ACS request (and nothing to put back at rest) does neither."""
    execute_model: Callable[..., Any] = runner.execute_model
    model_forward: Callable[..., Any] = runner._model_forward
    in_step = [False]

    @functools.wraps(execute_model)
    def execute_model_hooked(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        _learn_requests(runtime, scheduler_output)
        in_step[0] = True
        try:
            return hold_output(runtime, execute_model(scheduler_output, *args, **kwargs))
        finally:
            in_step[0] = False

    @functools.wraps(model_forward)
    def model_forward_hooked(*args: Any, **kwargs: Any) -> Any:
        if not (in_step[0] and runtime.needs_step):
            return model_forward(*args, **kwargs)
        batch = runner.input_batch
        query_start_loc = runner.query_start_loc.np
        num_reqs = batch.num_reqs
        runtime.begin_step(
            batch.req_id_to_index,
            query_start_loc,
            batch.num_computed_tokens_cpu,
            int(query_start_loc[num_reqs]),
            batch.req_ids[:num_reqs],
        )
        completed = False
        try:
            output = model_forward(*args, **kwargs)
            completed = True
            return output
        finally:
            runtime.end_step(completed)

    runner.execute_model = execute_model_hooked
    runner._model_forward = model_forward_hooked
    _hold_sampled_outputs(runner, runtime)


def _wrap_runner_v2(runner: Any, runtime: ActivationRuntime) -> None:
    """The V2 runner's step: execute_model updates its request states, then `prepare_inputs`
    returns the step's final InputBatch (request order, query offsets, computed tokens, all in
    batch order), then the forward pass runs inside execute_model (eager, piecewise or a full
    CUDA graph alike). So: learn new and finished requests as execute_model starts, fill the
    index buffers when prepare_inputs returns, and take the rows out when execute_model does.
    Dummy runs (warm-up, graph capture) never call prepare_inputs and are left alone."""
    execute_model: Callable[..., Any] = runner.execute_model
    prepare_inputs: Callable[..., Any] = runner.prepare_inputs
    step = {"live": False, "begun": False}

    @functools.wraps(execute_model)
    def execute_model_hooked(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dummy_run"):
            return execute_model(scheduler_output, *args, **kwargs)
        _learn_requests(runtime, scheduler_output)
        step["live"], step["begun"] = True, False
        completed = False
        try:
            output = execute_model(scheduler_output, *args, **kwargs)
            completed = True
        finally:
            if step["begun"]:
                runtime.end_step(completed)
            step["live"], step["begun"] = False, False
        return hold_output(runtime, output)

    @functools.wraps(prepare_inputs)
    def prepare_inputs_hooked(*args: Any, **kwargs: Any) -> Any:
        batch = prepare_inputs(*args, **kwargs)
        if step["live"] and runtime.needs_step:
            req_ids = list(batch.req_ids[: batch.num_reqs])
            runtime.begin_step(
                {req_id: index for index, req_id in enumerate(req_ids)},
                batch.query_start_loc_np,
                batch.num_computed_tokens_np,
                int(batch.num_tokens),
                req_ids,
            )
            step["begun"] = True
        return batch

    runner.execute_model = execute_model_hooked
    runner.prepare_inputs = prepare_inputs_hooked
    _hold_sampled_outputs(runner, runtime)


def _hold_sampled_outputs(runner: Any, runtime: ActivationRuntime) -> None:
    """V1 and V2 alike: a step's output comes from `sample_tokens`, after execute_model ran the
    forward pass (execute_model itself returns one only for a step without sampling)."""
    sample_tokens: Callable[..., Any] | None = getattr(runner, "sample_tokens", None)
    if sample_tokens is None:
        return

    @functools.wraps(sample_tokens)
    def sample_tokens_hooked(*args: Any, **kwargs: Any) -> Any:
        return hold_output(runtime, sample_tokens(*args, **kwargs))

    runner.sample_tokens = sample_tokens_hooked


def hold_output(runtime: ActivationRuntime, output: Any) -> Any:
    """A step's model-runner output leaves the worker only once the captured rows of that step
    (and of the steps before) are filed, so the API server, which reads a capture once the
    request's final output is back, finds every row (hooks/capture_copy.py gives the ordering).
    A plain `ModelRunnerOutput` (synchronous scheduling; the runner has waited for the sampled
    tokens) is held here; an `AsyncModelRunnerOutput` in its `get_output`, which vLLM's output
    thread calls before it sends the output on, so the worker's next step is not held up. With
    nothing to file (every step without capture) the output passes untouched."""
    if output is None or not runtime.copy_out.pending:
        return output
    mark = runtime.output_mark
    if mark is None:
        return output
    get_output = getattr(output, "get_output", None)
    if not callable(get_output):
        runtime.file_through(mark)
        return output

    def get_output_after_rows() -> Any:
        runtime.file_through(mark)
        return get_output()

    output.get_output = get_output_after_rows
    return output


def _prompt_len(data: Any) -> int:
    if data.prompt_token_ids is not None:
        return len(data.prompt_token_ids)
    return int(data.prompt_embeds.shape[0]) if data.prompt_embeds is not None else 0
