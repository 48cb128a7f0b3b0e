"""compat.py without an engine: layer discovery, the request patch, the runner choice, the
compile-cache key, post-import patching, the op on the layers and the runner wrapper (on a
stand-in runner)."""

from __future__ import annotations

import platform
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from vllm_acs.activations.codec import encode_array
from vllm_acs.activations.payload import AcsPayload, SteeringEntry
from vllm_acs.activations.store import check_applied, read_header
from vllm_acs.hooks import compat
from vllm_acs.hooks.compat import UnsupportedSetupError, decoder_layers
from vllm_acs.hooks.intervention_buffers import InterventionBuffers
from vllm_acs.hooks.post_import import when_imported
from vllm_acs.hooks.runtime import ActivationRuntime

CPU = torch.device("cpu")


class _FusedResidualLayer(torch.nn.Module):
    def forward(self, positions, hidden_states, residual):
        return hidden_states, residual


class _PlainLayer(torch.nn.Module):
    def forward(self, hidden_states):
        return hidden_states


def _model(layer_cls: type[torch.nn.Module], n: int = 3) -> torch.nn.Module:
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList(layer_cls() for _ in range(n))
    return model


def test_decoder_layers_of_a_fused_residual_model():
    model = _model(_FusedResidualLayer)
    assert decoder_layers(model) == list(model.model.layers)


def test_other_structures_are_refused_with_a_clear_message():
    with pytest.raises(UnsupportedSetupError, match="fused-residual"):
        decoder_layers(_model(_PlainLayer))
    with pytest.raises(UnsupportedSetupError, match="cannot find decoder layers"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_the_installed_vllm_is_supported():
    assert compat.vllm_version() in compat.SUPPORTED_VLLM


def test_unsupported_vllm_versions_are_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compat, "vllm_version", lambda: (0, 40))
    with pytest.raises(UnsupportedSetupError, match=r"found 0\.40"):
        compat.install()


@dataclass
class _Params:
    extra_args: dict[str, Any] | None
    skip_reading_prefix_cache: bool = False


@dataclass
class _EngineRequest:
    request_id: str
    sampling_params: _Params | None
    cache_salt: str | None = None
    prompt_token_ids: list[int] | None = None


class _Request:
    @classmethod
    def from_engine_core_request(cls, request: _EngineRequest, block_hasher: Any) -> tuple:
        return request.sampling_params.skip_reading_prefix_cache, request.cache_salt


def _through_patch(payload: AcsPayload | dict[str, Any], prompt_len: int = 6, salt=None):
    extra = payload.to_extra_args() if isinstance(payload, AcsPayload) else payload
    request = _EngineRequest("r1", _Params(extra), salt, list(range(prompt_len)))
    return _Request.from_engine_core_request(request, None)


def _steer(scale: float = 1.0, positions=None, vector: float = 1.0) -> SteeringEntry:
    shape = (1, 4) if positions is None else (1, len(positions), 4)
    return SteeringEntry(
        encode_array(np.full(shape, vector, dtype=np.float32)), (1,), scale, False, positions
    )


def test_prefix_cache_isolation_of_captures_and_steered_requests():
    module = types.SimpleNamespace(Request=_Request)
    compat._patch_request(module)
    compat._patch_request(module)  # idempotent
    # A capture never reads cached blocks; its KV is plain KV, so it is not salted.
    assert _through_patch(AcsPayload("c", capture_layers=(0,)), salt="user") == (True, "user")
    # Steered requests read and feed only the blocks of requests steered the same way.
    read, salt = _through_patch(AcsPayload("s1", steering=(_steer(),)))
    assert not read and salt.startswith("|acs-steer:")
    assert _through_patch(AcsPayload("s2", steering=(_steer(),))) == (False, salt)
    others = [
        AcsPayload("s3", steering=(_steer(scale=2.0),)),
        AcsPayload("s4", steering=(_steer(vector=0.5),)),
        AcsPayload("s5", steering=(_steer(positions=(2,)),)),
        AcsPayload("s6", steering=(_steer(), _steer())),
    ]
    salts = {_through_patch(payload)[1] for payload in others}
    assert salt not in salts and len(salts) == len(others)
    # A negative position means another token on a prompt of another length.
    minus_one = AcsPayload("s7", steering=(_steer(positions=(-1,)),))
    assert _through_patch(minus_one, prompt_len=6)[1] != _through_patch(minus_one, prompt_len=7)[1]
    assert (
        _through_patch(minus_one, prompt_len=6)[1]
        == _through_patch(AcsPayload("s8", steering=(_steer(positions=(5,)),)), prompt_len=6)[1]
    )
    # A payload the worker will fail keeps its blocks to itself.
    assert _through_patch({"acs": "{}"}, salt="user") == (True, "user|acs:r1")
    plain = _EngineRequest("r2", _Params({"acs_temperature_scale": 2.0}))
    assert _Request.from_engine_core_request(plain, None) == (False, None)


def test_the_v1_runner_is_chosen_unless_the_operator_chose():
    environ: dict[str, str] = {}
    compat.choose_v1_runner(environ)
    assert environ == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    environ = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    compat.choose_v1_runner(environ)
    assert environ == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def _buffers(capture_mb: float = 0.01, bank_slots: int = 8) -> InterventionBuffers:
    return InterventionBuffers(
        n_layers=4,
        hidden=4,
        max_tokens=16,
        bank_slots=bank_slots,
        capture_mb=capture_mb,
        device=CPU,
    )


def test_the_compile_cache_key_changes_with_the_op_set(monkeypatch: pytest.MonkeyPatch):
    """vLLM's AOT and inductor cache directories are named by hashes of the config: a graph
    compiled without the op (plain vLLM) or with another op set is never loaded with this one."""
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import VllmConfig

    config = VllmConfig()
    plain = aot_compile_hash_factors(config)
    compat.mark_compile_cache(config, _buffers())
    with_op = aot_compile_hash_factors(config)
    assert with_op != plain
    monkeypatch.setattr(compat, "OP_SET_VERSION", compat.OP_SET_VERSION + "-next")
    compat.mark_compile_cache(config, _buffers())
    assert aot_compile_hash_factors(config) not in (plain, with_op)


def test_the_compile_cache_key_covers_the_buffer_sizes():
    """The graph takes the buffers as inputs of fixed shapes, and vLLM loads a cached graph with
    its guards off: VLLM_ACS_CAPTURE_BUFFER_MB and VLLM_ACS_STEERING_SLOTS are in the key, so a
    restart with other sizes compiles its own entry (tests/e2e/test_compile_cache_restart.py)."""
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import VllmConfig

    def key(**sizes: float) -> list[str]:
        config = VllmConfig()
        compat.mark_compile_cache(config, _buffers(**sizes))
        return aot_compile_hash_factors(config)

    assert key() == key()  # the same sizes: the same entry (a warm cache is used)
    assert key(capture_mb=0.02) != key()
    assert key(bank_slots=9) != key()
    value = compat.compile_cache_key(_buffers())
    assert value["ops"] == compat.OP_SET_VERSION
    assert value["buffers"] == {
        "bank": [8, 4, "torch.float32"],
        "indices": [16, 3, 4, "torch.int32"],
        "capture_buffer": [1311, 4, "torch.bfloat16"],
    }


def _config(**parallel: Any) -> types.SimpleNamespace:
    """A stand-in VllmConfig: only what refuse_runner_shapes reads (a vLLM without one of the
    settings is a stand-in without the attribute)."""
    return types.SimpleNamespace(
        speculative_config=parallel.pop("speculative_config", None),
        parallel_config=types.SimpleNamespace(**parallel),
    )


def test_runner_shapes_the_op_cannot_follow_are_refused_with_a_reason():
    compat.refuse_runner_shapes(_config())  # none of the settings: passes
    compat.refuse_runner_shapes(
        _config(
            pipeline_parallel_size=1,
            enable_dbo=False,
            ubatch_size=0,
            prefill_context_parallel_size=1,
            decode_context_parallel_size=2,  # shards the KV cache; every rank has every row
            tensor_parallel_size=2,
        )
    )
    refused = {
        "speculative decoding": _config(speculative_config=object()),
        "pipeline parallelism": _config(pipeline_parallel_size=2),
        r"dual-batch overlap \(--enable-dbo": _config(enable_dbo=True),
        "micro-batches": _config(enable_dbo=False, ubatch_size=2),
        r"prefill context parallelism \(--prefill-context-parallel-size": _config(
            prefill_context_parallel_size=2
        ),
    }
    for reason, config in refused.items():
        with pytest.raises(UnsupportedSetupError, match=reason):
            compat.refuse_runner_shapes(config)


def test_the_settings_refused_have_these_names_in_the_installed_vllm():
    """refuse_runner_shapes reads them with defaults: a rename would pass silently, so the names
    are checked against vLLM's own ParallelConfig (0.32 here; the same in 0.33's)."""
    import dataclasses

    from vllm.config import ParallelConfig

    names = {field.name for field in dataclasses.fields(ParallelConfig)}
    assert {
        "pipeline_parallel_size",
        "enable_dbo",
        "ubatch_size",
        "prefill_context_parallel_size",
    } <= names
    with pytest.raises(UnsupportedSetupError, match="dual-batch overlap"):
        compat.refuse_runner_shapes(
            types.SimpleNamespace(
                speculative_config=None, parallel_config=ParallelConfig(enable_dbo=True)
            )
        )


def test_the_worker_refuses_dual_batch_overlap_before_it_touches_the_model():
    """install_on_runner (after Worker.load_model) fails the worker's start with the reason."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    runner.vllm_config = _config(enable_dbo=True)
    runner.model = _model(_FusedResidualLayer)
    with pytest.raises(UnsupportedSetupError, match="dual-batch overlap"):
        compat.install_on_runner(runner)
    assert type(runner.model.model.layers[0]) is _FusedResidualLayer  # the op never went on


def test_patches_run_when_the_module_is_imported(tmp_path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "acs_fake_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    when_imported("acs_fake_target", lambda module: seen.append(module.VALUE))
    assert seen == []
    import acs_fake_target  # noqa: F401

    assert seen == [1]
    when_imported("acs_fake_target", lambda module: seen.append(2))  # already imported: now
    assert seen == [1, 2]
    del sys.modules["acs_fake_target"]


class _Runner:
    """The few runner attributes _wrap_runner reads, around a model of fused-residual layers."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.input_batch = types.SimpleNamespace(
            req_id_to_index={},
            num_computed_tokens_cpu=np.zeros(4, dtype=np.int32),
            num_reqs=0,
            req_ids=[],
        )
        self.query_start_loc = types.SimpleNamespace(np=np.zeros(5, dtype=np.int32))
        self.outputs: list[torch.Tensor] = []

    def execute_model(self, scheduler_output: Any) -> None:
        batch = scheduler_output.batch  # request id -> (first position, tokens)
        self.input_batch.req_id_to_index = {req_id: i for i, req_id in enumerate(batch)}
        self.input_batch.req_ids = [*batch, None]  # vLLM's list may run past num_reqs
        self.input_batch.num_reqs = len(batch)
        lengths = [tokens for _, tokens in batch.values()]
        self.query_start_loc.np[: len(lengths) + 1] = np.cumsum([0, *lengths])
        self.input_batch.num_computed_tokens_cpu[: len(batch)] = [p for p, _ in batch.values()]
        hidden = torch.zeros(sum(lengths), 4, dtype=torch.bfloat16)
        self.outputs.append(self._model_forward(hidden))

    def _model_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(hidden)
        for layer in self.model.model.layers:
            hidden, residual = layer(None, hidden, residual)
        return hidden + residual


class _RunnerV2:
    """The V2 runner's step as _wrap_runner_v2 sees it: execute_model calls prepare_inputs,
    whose InputBatch holds the request order, query offsets and computed tokens in batch order
    (the arrays padded past num_reqs, as vLLM's are), then runs the forward pass; a dummy run
    (warm-up, graph capture) runs the forward without prepare_inputs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.outputs: list[torch.Tensor] = []
        self.fail_forward = False

    def prepare_inputs(self, scheduler_output: Any) -> Any:
        batch = scheduler_output.batch  # request id -> (first position, tokens)
        lengths = [tokens for _, tokens in batch.values()]
        starts = np.cumsum([0, *lengths]).astype(np.int32)
        return types.SimpleNamespace(
            req_ids=list(batch),
            num_reqs=len(batch),
            query_start_loc_np=np.concatenate([starts, starts[-1:]]),  # one padded request
            num_computed_tokens_np=np.array([p for p, _ in batch.values()], dtype=np.int32),
            num_tokens=int(starts[-1]),
        )

    def execute_model(self, scheduler_output: Any, dummy_run: bool = False) -> None:
        if dummy_run:
            self._forward(torch.zeros(2, 4, dtype=torch.bfloat16))
            return
        batch = self.prepare_inputs(scheduler_output)
        if self.fail_forward:
            raise RuntimeError("the forward pass failed")
        self.outputs.append(self._forward(torch.zeros(batch.num_tokens, 4, dtype=torch.bfloat16)))

    def _forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(hidden)
        for layer in self.model.model.layers:
            hidden, residual = layer(None, hidden, residual)
        return hidden + residual


def _scheduled(batch, new=(), finished=()):
    new_reqs = [
        types.SimpleNamespace(
            req_id=req_id,
            sampling_params=types.SimpleNamespace(extra_args=payload.to_extra_args(), max_tokens=2),
            prompt_token_ids=[1, 2, 3],
            prompt_embeds=None,
        )
        for req_id, payload in new
    ]
    return types.SimpleNamespace(
        batch=batch, scheduled_new_reqs=new_reqs, finished_req_ids=set(finished)
    )


@pytest.mark.parametrize(
    ("runner_class", "wrap"),
    [(_Runner, compat._wrap_runner), (_RunnerV2, compat._wrap_runner_v2)],
    ids=["v1", "v2"],
)
def test_the_op_on_every_layer_steers_and_captures_the_right_rows(tmp_path, runner_class, wrap):
    model = _model(_FusedResidualLayer, n=4)
    layers = decoder_layers(model)
    buffers = InterventionBuffers(
        n_layers=4, hidden=4, max_tokens=16, bank_slots=8, capture_mb=0.01, device=CPU
    )
    runtime = ActivationRuntime(buffers=buffers, root=tmp_path, writes_files=True)
    compat.put_op_on_layers(layers, buffers)
    assert type(layers[0]).__name__ == "_FusedResidualLayer" and layers[0].acs_layer == 0
    runner = runner_class(model)
    wrap(runner, runtime)

    runner.execute_model(_scheduled({"plain": (0, 3)}))
    assert not runner.outputs[-1].any()
    vector = encode_array(np.ones((1, 4), dtype=np.float32))
    steer = AcsPayload("s", steering=(SteeringEntry(vector, (2,)),))
    runner.execute_model(_scheduled({"plain": (3, 1), "S": (0, 3)}, new=[("S", steer)]))
    assert runner.outputs[-1][:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    runner.execute_model(
        _scheduled({"S": (3, 1), "C": (0, 3)}, new=[("C", AcsPayload("c", capture_layers=(0, 3)))])
    )
    assert runner.outputs[-1][:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    runner.execute_model(_scheduled({"C": (3, 1)}, finished=["S"]))
    assert check_applied("s", n_rows=4, root=tmp_path).rows_done == 4
    runner.execute_model(_scheduled({"plain": (4, 1)}, finished=["C"]))
    assert check_applied("c", n_rows=4, root=tmp_path).rows_done == 4
    assert not runtime.needs_step and not runner.outputs[-1].any()
    assert buffers.steering.free_slots == 7  # the vector's slot is free again


def test_on_the_v2_runner_dummy_runs_pass_and_a_failed_forward_keeps_no_rows(tmp_path):
    model = _model(_FusedResidualLayer, n=4)
    buffers = InterventionBuffers(
        n_layers=4, hidden=4, max_tokens=16, bank_slots=8, capture_mb=0.01, device=CPU
    )
    runtime = ActivationRuntime(buffers=buffers, root=tmp_path, writes_files=True)
    compat.put_op_on_layers(decoder_layers(model), buffers)
    runner = _RunnerV2(model)
    compat._wrap_runner_v2(runner, runtime)

    capture = AcsPayload("c", capture_layers=(0, 3))
    runner.fail_forward = True
    with pytest.raises(RuntimeError):
        runner.execute_model(_scheduled({"C": (0, 3)}, new=[("C", capture)]))
    assert read_header("c", root=tmp_path).rows_done == 0  # nothing of the failed step
    runner.fail_forward = False
    runner.execute_model(None, dummy_run=True)  # no scheduler output, no step: left alone
    runner.execute_model(_scheduled({"C": (0, 3)}))
    runner.execute_model(_scheduled({"C": (3, 1)}))
    runner.execute_model(_scheduled({}, finished=["C"]))
    assert check_applied("c", n_rows=4, root=tmp_path).rows_done == 4
    assert not runtime.needs_step


def test_the_runner_wrapper_is_chosen_by_the_runner_class():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert compat._runner_wrapper(object.__new__(GPUModelRunner)) is compat._wrap_runner
    assert compat._runner_wrapper(object.__new__(GPUModelRunnerV2)) is compat._wrap_runner_v2
    with pytest.raises(UnsupportedSetupError, match="V1 or V2 model runner, found _Runner"):
        compat._runner_wrapper(_Runner(_model(_FusedResidualLayer)))


# Run in a fresh interpreter: the tile state, once granted, stays for the process's life.
_XTILE_CHECK = """
import ctypes, torch
from vllm_acs.hooks.compat import allow_amx_tiles
ARCH_GET_XCOMP_PERM, XFEATURE_XTILEDATA = 0x1022, 18
def granted():
    mask = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(158, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:  # 158: arch_prctl
        return None  # a kernel without the call: no AMX state to ask for
    return bool(mask.value >> XFEATURE_XTILEDATA & 1)
before = granted()
allow_amx_tiles()
print(torch.cpu._is_amx_tile_supported(), before, granted())
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="arch_prctl is x86 Linux's"
)
def test_the_worker_asks_for_the_amx_tile_state_where_the_cpu_has_amx():
    """vLLM's AMX attention kernel dies of SIGILL in a process that never asked for the tile
    state; the worker asks before its model loads. Where the CPU has no AMX, nothing is asked."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _XTILE_CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    has_amx, before, after = done.stdout.split()
    if has_amx == "True":
        assert (before, after) == ("False", "True")
    else:
        assert after in ("False", "None")
