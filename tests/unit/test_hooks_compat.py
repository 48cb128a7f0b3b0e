"""compat.py without an engine: layer discovery, the request patch, post-import patching, the
runner wrapper (on a stand-in runner)."""

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
from vllm_acs.activations.store import check_applied
from vllm_acs.hooks import compat
from vllm_acs.hooks.compat import UnsupportedSetupError, decoder_layers
from vllm_acs.hooks.post_import import when_imported
from vllm_acs.hooks.runtime import ActivationRuntime


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


class _Request:
    @classmethod
    def from_engine_core_request(cls, request: _EngineRequest, block_hasher: Any) -> tuple:
        return cls, request.sampling_params.skip_reading_prefix_cache, request.cache_salt


def test_acs_requests_neither_read_nor_feed_the_prefix_cache():
    module = types.SimpleNamespace(Request=_Request)
    compat._patch_request(module)
    compat._patch_request(module)  # idempotent
    acs = _EngineRequest("r1", _Params({"acs": "{}"}), cache_salt="user")
    assert _Request.from_engine_core_request(acs, None) == (_Request, True, "user|acs:r1")
    plain = _EngineRequest("r2", _Params({"acs_temperature_scale": 2.0}))
    assert _Request.from_engine_core_request(plain, None) == (_Request, False, None)


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
            req_id_to_index={}, num_computed_tokens_cpu=np.zeros(4, dtype=np.int32)
        )
        self.query_start_loc = types.SimpleNamespace(np=np.zeros(5, dtype=np.int32))

    def execute_model(self, scheduler_output: Any) -> None:
        batch = scheduler_output.batch  # request id -> (first position, tokens)
        self.input_batch.req_id_to_index = {req_id: i for i, req_id in enumerate(batch)}
        lengths = [tokens for _, tokens in batch.values()]
        self.query_start_loc.np[: len(lengths) + 1] = np.cumsum([0, *lengths])
        self.input_batch.num_computed_tokens_cpu[: len(batch)] = [p for p, _ in batch.values()]
        hidden = torch.zeros(sum(lengths), 4)
        self._model_forward(hidden)

    def _model_forward(self, hidden: torch.Tensor) -> None:
        residual = torch.zeros_like(hidden)
        for layer in self.model.model.layers:
            hidden, residual = layer(None, hidden, residual)


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


def test_only_the_layers_in_use_are_hooked_and_only_while_in_use(tmp_path):
    model = _model(_FusedResidualLayer, n=4)
    layers = decoder_layers(model)
    runtime = ActivationRuntime(
        n_layers=4,
        hidden=4,
        device=torch.device("cpu"),
        root=tmp_path,
        writes_files=True,
    )
    runner = _Runner(model)
    compat._wrap_runner(runner, runtime, layers)

    def hooked() -> list[int]:
        return [i for i, layer in enumerate(layers) if layer._forward_hooks]

    runner.execute_model(_scheduled({"plain": (0, 3)}))
    assert hooked() == []
    vector = encode_array(np.ones((1, 4), dtype=np.float32))
    steer = AcsPayload("s", steering=(SteeringEntry(vector, (2,)),))
    runner.execute_model(_scheduled({"S": (0, 3)}, new=[("S", steer)]))
    assert hooked() == [2]
    runner.execute_model(
        _scheduled({"S": (3, 1), "C": (0, 3)}, new=[("C", AcsPayload("c", capture_layers=(0,)))])
    )
    assert hooked() == [0, 2]
    runner.execute_model(_scheduled({"C": (3, 1)}, finished=["S"]))
    assert hooked() == [0]
    assert check_applied("s", n_rows=4, root=tmp_path).rows_done == 4
    runner.execute_model(_scheduled({}, finished=["C"]))
    assert hooked() == []
    assert check_applied("c", n_rows=4, root=tmp_path).rows_done == 4


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
