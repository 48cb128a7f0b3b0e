"""compat.py without an engine: layer discovery, the request patch, post-import patching."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from vllm_acs.hooks import compat
from vllm_acs.hooks.compat import UnsupportedSetupError, decoder_layers
from vllm_acs.hooks.post_import import when_imported


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
