"""settings.py: environment, --additional-config, precedence and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acs.settings import Settings, SettingsError


def test_defaults_put_sqlite_under_home():
    settings = Settings.load(environ={"VLLM_ACS_HOME": "/srv/acs"})
    assert settings.home == Path("/srv/acs")
    assert settings.resolved_database_url == "sqlite+aiosqlite:////srv/acs/vllm-acs.sqlite3"
    assert settings.model_id is None
    assert settings.max_logprobs == 100


def test_default_home():
    assert Settings.load(environ={}).home == Path("~/.local/share/vllm-acs").expanduser()


def test_environment_values():
    settings = Settings.load(
        environ={
            "VLLM_ACS_MODEL_ID": "llama-8b",
            "VLLM_ACS_GPU_SHAPE": "1xH100",
            "VLLM_ACS_DATABASE_URL": "postgresql+asyncpg://127.0.0.1/acs",
            "VLLM_ACS_FULL_VOCAB_MAX_PROMPT_TOKENS": "64",
        }
    )
    assert settings.model_id == "llama-8b"
    assert settings.gpu_shape == "1xH100"
    assert settings.resolved_database_url == "postgresql+asyncpg://127.0.0.1/acs"
    assert settings.full_vocab_max_prompt_tokens == 64


def test_additional_config_wins_over_environment():
    settings = Settings.load(
        environ={"VLLM_ACS_MODEL_ID": "from-env"},
        additional_config={"acs": {"model_id": "from-cli", "max_logprobs": 20}},
    )
    assert settings.model_id == "from-cli"
    assert settings.max_logprobs == 20


def test_unknown_additional_config_key_is_named():
    with pytest.raises(SettingsError, match="modle_id"):
        Settings.load(environ={}, additional_config={"acs": {"modle_id": "x"}})


@pytest.mark.parametrize("value", ["many", "-3", True])
def test_bad_integer_is_refused(value):
    with pytest.raises(SettingsError, match="MAX_LOGPROBS"):
        Settings.load(environ={}, additional_config={"acs": {"max_logprobs": value}})


def test_other_additional_config_keys_are_left_to_vllm():
    assert Settings.load(environ={}, additional_config={"other": 1}).model_id is None


def test_surface_settings():
    default = Settings.load(environ={})
    assert (default.expose_vllm_routes, default.expose_metrics) == ((), True)
    environ = {"VLLM_ACS_EXPOSE_VLLM_ROUTES": "/tokenize, /version", "VLLM_ACS_EXPOSE_METRICS": "0"}
    settings = Settings.load(environ=environ)
    assert settings.expose_vllm_routes == ("/tokenize", "/version")
    assert settings.expose_metrics is False
    listed = Settings.load(environ={}, additional_config={"acs": {"expose_vllm_routes": ["/ping"]}})
    assert listed.expose_vllm_routes == ("/ping",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/v1/embeddings", "under /v1"),
        ("/v1", "under /v1"),
        ("tokenize", "exact path"),
        ("/static/*", "exact path"),
    ],
)
def test_bad_exposed_routes_are_refused(value, message):
    with pytest.raises(SettingsError, match=message):
        Settings.load(environ={"VLLM_ACS_EXPOSE_VLLM_ROUTES": value})


def test_bad_boolean_is_refused():
    with pytest.raises(SettingsError, match=r"EXPOSE_METRICS.*true or false"):
        Settings.load(environ={"VLLM_ACS_EXPOSE_METRICS": "maybe"})
