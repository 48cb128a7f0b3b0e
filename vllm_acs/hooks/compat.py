"""The only module that touches vLLM internals: version and structure checks, installing the
capture/steering hooks on the V1 model runner, prefix-cache isolation of ACS requests.

`install()` runs from the general plugin in every vLLM process; it patches two vLLM classes when
(and only if) their modules are imported, so the API server does not import the worker stack:
- `vllm.v1.worker.gpu_worker.Worker.load_model` (CPUWorker inherits it): before the model loads,
  `allow_amx_tiles` (vLLM's CPU attention needs it on AMX machines); after, `install_on_runner`
  checks the runner and the model, then hooks the decoder layers.
- `vllm.v1.request.Request.from_engine_core_request` (EngineCore process): an ACS request neither
  reads nor feeds the prefix cache, or its captured rows would be missing (cached tokens skip the
  forward pass) and steered KV would leak into other requests.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ..activations.payload import EXTRA_ARGS_KEY
from ..activations.store import capture_root
from .post_import import when_imported
from .runtime import ActivationRuntime, NewRequest

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = ((0, 32), (0, 33))


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
    when_imported("vllm.v1.request", _patch_request)
    when_imported("vllm.v1.worker.gpu_worker", _patch_worker)


def _patch_request(module: ModuleType) -> None:
    request_cls = module.Request
    original = request_cls.__dict__["from_engine_core_request"].__func__
    if getattr(original, "_acs_patched", False):
        return

    @functools.wraps(original)
    def from_engine_core_request(cls: type, request: Any, block_hasher: Any) -> Any:
        params = request.sampling_params
        if params is not None and params.extra_args and EXTRA_ARGS_KEY in params.extra_args:
            # Reading: cached prompt tokens skip the forward pass, so no row for them. Feeding:
            # a steered request's KV must not serve others; a salt unique to the request keeps
            # its blocks apart (vLLM hashes the salt into the first block, and blocks chain).
            params.skip_reading_prefix_cache = True
            request.cache_salt = f"{request.cache_salt or ''}|acs:{request.request_id}"
        return original(cls, request, block_hasher)

    from_engine_core_request._acs_patched = True  # type: ignore[attr-defined]
    request_cls.from_engine_core_request = classmethod(from_engine_core_request)


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
    """Checks that hooks can see every token of every step, then installs them. Raises
    UnsupportedSetupError (the worker fails to start) rather than serving a silent no-op."""
    from vllm.config import CompilationMode, CUDAGraphMode
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from ..settings import Settings

    if not isinstance(runner, GPUModelRunner):
        raise UnsupportedSetupError(
            f"vllm_acs hooks need vLLM's V1 model runner, found {type(runner).__name__}; "
            "set VLLM_USE_V2_MODEL_RUNNER=0"
        )
    config = runner.vllm_config
    compilation = config.compilation_config
    if compilation.mode != CompilationMode.NONE or compilation.cudagraph_mode != CUDAGraphMode.NONE:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering run as forward hooks, which torch.compile and CUDA "
            "graphs skip silently: start vLLM with --enforce-eager"
        )
    if config.speculative_config is not None:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support speculative decoding"
        )
    if config.parallel_config.pipeline_parallel_size != 1:
        raise UnsupportedSetupError(
            "vllm_acs capture and steering do not support pipeline parallelism"
        )
    layers = decoder_layers(runner.model)
    settings = Settings.load(additional_config=config.additional_config or {})
    runtime = ActivationRuntime(
        n_layers=len(layers),
        hidden=runner.model_config.get_hidden_size(),
        device=runner.device,
        root=capture_root(settings.capture_dir),
        writes_files=get_tensor_model_parallel_rank() == 0,
    )
    _wrap_runner(runner, runtime, layers)
    logger.info(
        "vllm_acs hooks installed on %d decoder layers of %s (capture files in %s)",
        len(layers),
        type(runner.model).__name__,
        runtime.root,
    )
    return runtime


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


def _layer_hook(
    runtime: ActivationRuntime, index: int, module: torch.nn.Module, args: Any, output: Any
) -> None:
    if not runtime.stepping:
        return
    if not (isinstance(output, tuple) and len(output) == 2 and output[1] is not None):
        raise UnsupportedSetupError(
            f"decoder layer {index} returned {type(output).__name__}, not (hidden, residual)"
        )
    runtime.on_layer(index, output[0], output[1])


def _wrap_runner(runner: Any, runtime: ActivationRuntime, layers: list[torch.nn.Module]) -> None:
    """Wraps two methods on this runner instance. execute_model: learn new and finished requests
    from the scheduler output. _model_forward: runs after the runner updated its persistent batch
    (order, positions), so the rows read there are the rows the model sees.

    The layer hooks are registered only on the layers the in-flight ACS requests use, and only
    while there are some: a module with hooks takes torch's slower call path, which plain
    traffic (and the other layers) should not pay for."""
    execute_model: Callable[..., Any] = runner.execute_model
    model_forward: Callable[..., Any] = runner._model_forward
    in_step = [False]
    handles: dict[int, torch.utils.hooks.RemovableHandle] = {}

    def sync_hooks() -> None:
        wanted = runtime.hook_layers if runtime.active else ()
        if handles.keys() == set(wanted):
            return
        for index in [index for index in handles if index not in wanted]:
            handles.pop(index).remove()
        for index in wanted:
            if index not in handles:
                hook = functools.partial(_layer_hook, runtime, index)
                handles[index] = layers[index].register_forward_hook(hook)

    @functools.wraps(execute_model)
    def execute_model_hooked(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        runtime.finish_requests(scheduler_output.finished_req_ids)
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
        sync_hooks()
        in_step[0] = True
        try:
            return execute_model(scheduler_output, *args, **kwargs)
        finally:
            in_step[0] = False

    @functools.wraps(model_forward)
    def model_forward_hooked(*args: Any, **kwargs: Any) -> Any:
        if not (in_step[0] and runtime.active):
            return model_forward(*args, **kwargs)
        batch = runner.input_batch
        runtime.begin_step(
            batch.req_id_to_index, runner.query_start_loc.np, batch.num_computed_tokens_cpu
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


def _prompt_len(data: Any) -> int:
    if data.prompt_token_ids is not None:
        return len(data.prompt_token_ids)
    return int(data.prompt_embeds.shape[0]) if data.prompt_embeds is not None else 0
