"""The one reader of the plugin's configuration, in every process that loads it.

Sources, strongest first: vLLM's `--additional-config '{"acs": {...}}'`, then `VLLM_ACS_*`
environment variables, then the defaults below. A leaf module: it imports nothing of the project.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "VLLM_ACS_"
ADDITIONAL_CONFIG_KEY = "acs"


class SettingsError(ValueError):
    """A setting has a value the plugin cannot use; the message names the setting."""


def _default_home() -> Path:
    return Path(os.path.expanduser("~/.local/share/vllm-acs"))


@dataclass(frozen=True)
class Settings:
    # The short id clients send as `model` (e.g. `llama-8b`); default: derived from the checkpoint.
    model_id: str | None = None
    # The short id a request without `model` means, and the one `default: true` in /v1/models:
    # every node of a deployment sets the same (a node of another model forwards such requests
    # to a node of it). Unset: this node's own model (one node, or one model).
    default_model: str | None = None
    # The operator's description of the hardware (`X-Acs-Upstream-Gpu`, `gpu_shape` in /v1/models);
    # default: detected from vLLM's platform when the server starts.
    gpu_shape: str | None = None
    home: Path = field(default_factory=_default_home)
    # Default: SQLite under `home`.
    database_url: str | None = None
    # The cap on a positive `logprobs` / `prompt_logprobs`: `capabilities.max_logprobs`.
    max_logprobs: int = 100
    full_vocab_max_prompt_tokens: int = 256
    # Shared counters (slots, starts, holds) across processes and nodes; unset: embedded, one
    # API process only.
    redis_url: str | None = None
    # Every Redis key of this deployment starts with it, so deployments can share one Redis.
    redis_prefix: str = "acs"
    # Per-key traffic limits when the key sets none.
    default_max_running: int = 16
    default_max_waiting: int = 64
    default_starts_per_minute: int = 600
    # Activation requests (capture or steering) per key and UTC month when the key sets none;
    # unset: unlimited.
    default_monthly_activation_requests: int | None = None
    # Live (active or paused) keys per account, for `POST /v1/keys` (`429 key_capacity`) and
    # `vllm-acs keys create` alike; 0: no cap.
    max_keys_per_account: int = 100
    # How long a slot or a hold outlives the process holding it (the holder renews it).
    lease_ms: int = 30_000
    # Full-vocabulary prompt logprobs together with an activation capture.
    full_vocab_max_prompt_tokens_with_capture: int = 16
    # The longest prompt an inline capture takes (`capabilities.max_activation_prompt_tokens`,
    # also bounded by the model's context): every layer of every token comes back in one answer.
    max_activation_prompt_tokens: int = 4096
    # The /v1/completions contract (shared/spec/DECISIONS.md): each an operator default.
    body_limit_bytes: int = 8 * 1024 * 1024
    max_output_work: int = 32000  # prompt_count x n x max_tokens
    default_max_tokens: int = 32000  # injected for one prompt with n = 1
    deadline_max_tokens: int = 15600  # the most a request without `stream` may ask for
    # The request window (docs/decisions.md): a non-streamed completion that has not answered
    # after `request_window_s` is stopped and answered `504 upstream_deadline` (0: no window);
    # one that has not started answering after `keepalive_after_s` gets its 200 and then one
    # whitespace byte every `keepalive_every_s` until its body comes (0: never), so a proxy's
    # idle timeout does not cut it. Seconds; fractions allowed.
    request_window_s: float = 840.0
    keepalive_after_s: float = 20.0
    keepalive_every_s: float = 10.0
    # Where workers write capture files for the API server to read (activations/store.py);
    # unset: /dev/shm/vllm-acs. Every process of one deployment on a host must agree.
    capture_dir: Path | None = None
    # Each worker's capture buffer on the model's device, in MB: the rows one forward step can
    # capture (a row is one token at one layer, 2 x hidden bytes). Fixed, whatever the depth or
    # the batch; a step that would need more fails the captures that do not fit, with a message.
    capture_buffer_mb: float = 256.0
    # Each worker's steering bank: distinct steering vectors (summed per request, layer and
    # position) in flight at once; a request that would need more fails, with a message.
    steering_slots: int = 1024
    # The node's surface (shared/spec/DECISIONS.md): vLLM's routes outside the public API answer
    # 404 unless listed here (exact paths, e.g. `/tokenize,/version`; never under /v1). They are
    # served as vLLM serves them, without a key: for a node on a private network.
    expose_vllm_routes: tuple[str, ...] = ()
    # vLLM's Prometheus `/metrics`, with the plugin's own series beside vLLM's.
    expose_metrics: bool = True
    # The browser Workbench at /workbench (false: it is a 404 like any path off the surface), and
    # the Feedback link of its top navigation: a mailto: address or an http(s) URL (unset: none).
    workbench: bool = True
    feedback_url: str | None = None
    # Completion jobs: unfinished jobs per key (`429 job_capacity`), jobs this process runs at
    # once, how long a claimed job outlives a dead process, runs before a job fails, and
    # `?wait=` reads one node holds at once before it answers `X-Acs-Longpoll: declined`.
    max_jobs_per_key: int = 1000
    job_concurrency: int = 32
    # Whether this node claims harvests and completion jobs from the queue (false: an
    # interactive-only node; the deployment's other nodes take the batch work).
    batch_work: bool = True
    # Whether batch requests (harvest prompts, completion jobs) sit out the engine steps that
    # carry a live request, for up to 50 ms at a time (engine_core/live_first.py). Unset: yes
    # on a CPU (where a step's time follows its tokens), no on a GPU.
    batch_sits_out_live_steps: bool | None = None
    # Prompt tokens one batch request adds to an engine step while a live request is in the
    # engine, or was within 0.25 s: the smaller, the less a harvest slows live requests, and
    # the slower it goes beside them. Unset: 128 on a CPU (there it bounds the steps between a
    # client's requests), 64 on a GPU (where a hundred more tokens cost a decode step little;
    # not yet measured there).
    batch_chunk_beside_live: int | None = None
    job_lease_ms: int = 30_000
    job_max_attempts: int = 3
    job_long_polls: int = 1024
    # Usage rows waiting for the database (an outage) that one API process keeps; beyond it a
    # row is not kept but logged at ERROR and counted (`acs_usage_rows_dropped{reason=
    # "queue_full"}`). About 1 KB each.
    usage_queue_max_rows: int = 50_000
    # Harvests: where job files live (unset: `home`/files), prompts one harvest keeps in the
    # engine at once (interactive requests share the engine meanwhile), harvests not ended in
    # the deployment before a submit is refused (`429 harvest_capacity_exceeded`), harvests per
    # key and UTC month (`429 harvest_quota_exceeded`; unset: unlimited), and `?wait=` reads one
    # node holds at once before it answers `X-Acs-Longpoll: declined`.
    files_dir: Path | None = None
    harvest_prompts_in_flight: int = 8
    # A harvest runs as parts of this many consecutive shards (more when a harvest would have
    # more than 256 parts), which any node of its model claims; a node runs at most
    # `harvest_parts_per_node` parts at once (its prompts in flight shared among them).
    harvest_part_shards: int = 4
    harvest_parts_per_node: int = 1
    harvest_capacity: int = 4
    harvest_monthly_quota: int | None = None
    harvest_long_polls: int = 64
    # The secret that signs download URLs (harvest files). Unset: one is made and kept in `home`
    # (url-secret); nodes that share a deployment must share it.
    url_secret: str | None = field(default=None, repr=False)
    # Job files in an S3-compatible object store instead of `files_dir`: set `s3_bucket` to use
    # one. `s3_endpoint` is the store's URL as the nodes reach it (unset: AWS S3 of `s3_region`);
    # `s3_public_endpoint` the same store as researchers reach it, the host of the presigned
    # download URLs (unset: `s3_endpoint`). Credentials unset: the AWS_* environment or the
    # instance's. Every key starts with `s3_prefix`; nodes of one deployment share bucket and
    # prefix.
    s3_bucket: str | None = None
    s3_endpoint: str | None = None
    s3_public_endpoint: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = field(default=None, repr=False)
    s3_prefix: str = ""
    # Looms: Nodes in one Loom (`409 loom_node_limit`), characters of text in one Node, bytes of
    # an import file (`413`), and Looms per key (`429 loom_capacity`).
    loom_max_nodes: int = 10_000
    loom_max_text_chars: int = 100_000
    loom_import_max_bytes: int = 16 * 1024 * 1024
    looms_per_key: int = 1_000
    # Looms by size: tokens of all the Nodes of one import together (`400`), bytes of text and
    # records in one Loom (`409 loom_node_limit`) and in all the Looms of one key (`429
    # loom_capacity`). A Loom is read whole by its changes, so its quota bounds their memory.
    loom_import_max_tokens: int = 200_000
    loom_max_bytes: int = 32 * 1024 * 1024
    loom_bytes_per_key: int = 1024 * 1024 * 1024
    # The deployment (several nodes sharing the database): where other nodes reach this one
    # (unset: http://127.0.0.1:<port>, enough for nodes of one host), how often it beats its
    # heartbeat, and how long a silent node stays listed.
    advertise_url: str | None = None
    registry_heartbeat_ms: int = 2_000
    registry_node_ttl_ms: int = 10_000
    # Apply for access (docs/admin-console.md): `open` lets anyone reach `POST /v1/applications`
    # without a key; `closed` (the default, so a node is not open to the network by surprise)
    # answers it 404. Applications one client address may make per hour (`429 rate_limited`),
    # applications waiting for review at most (`429 applications_full`), and days an
    # application's claim code lives (pending or approved, not yet claimed).
    applications: str = "closed"
    applications_per_address: int = 3
    applications_pending_cap: int = 200
    application_ttl_days: int = 30

    def __post_init__(self) -> None:
        if self.applications not in ("open", "closed"):
            raise SettingsError(
                f"{ENV_PREFIX}APPLICATIONS must be open or closed, got {self.applications!r}"
            )
        if self.application_ttl_days < 1:
            raise SettingsError(f"{ENV_PREFIX}APPLICATION_TTL_DAYS must be at least 1")
        if self.batch_chunk_beside_live is not None and self.batch_chunk_beside_live < 1:
            raise SettingsError(f"{ENV_PREFIX}BATCH_CHUNK_BESIDE_LIVE must be at least 1")
        if self.usage_queue_max_rows < 1:
            raise SettingsError(f"{ENV_PREFIX}USAGE_QUEUE_MAX_ROWS must be at least 1")
        if self.keepalive_after_s and not self.keepalive_every_s:
            raise SettingsError(
                f"{ENV_PREFIX}KEEPALIVE_EVERY_S must be above 0 while keepalive_after_s is set "
                "(keepalive_after_s 0 turns the keepalive off)"
            )
        if self.feedback_url is not None and not self.feedback_url.startswith(
            ("mailto:", "https://", "http://")
        ):
            raise SettingsError(
                f"{ENV_PREFIX}FEEDBACK_URL must be a mailto: address or an http(s) URL, "
                f"got {self.feedback_url!r}"
            )

    @property
    def resolved_files_dir(self) -> Path:
        return self.files_dir or self.home / "files"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.home / 'vllm-acs.sqlite3'}"

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str] | None = None,
        additional_config: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Reads the environment and vLLM's additional config into one validated object."""
        environ = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name in fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        overrides = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY) or {}
        if not isinstance(overrides, Mapping):
            raise SettingsError(
                f'--additional-config "{ADDITIONAL_CONFIG_KEY}" must be an object of settings'
            )
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise SettingsError(
                f"unknown vllm_acs setting(s) in --additional-config: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(fields))}"
            )
        values.update(overrides)
        return cls(**{name: _coerce(name, fields[name], value) for name, value in values.items()})


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _coerce(name: str, spec: dataclasses.Field, value: Any) -> Any:
    kind = str(spec.type)
    where = f"{ENV_PREFIX}{name.upper()} / additional_config.{ADDITIONAL_CONFIG_KEY}.{name}"
    if kind in ("bool", "bool | None"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise SettingsError(f"{where} must be true or false, got {value!r}")
    if kind.startswith("tuple"):
        return _route_paths(where, value)
    if kind.startswith("int"):
        if isinstance(value, bool):
            raise SettingsError(f"{where} must be an integer, got {value!r}")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise SettingsError(f"{where} must be an integer, got {value!r}") from None
        if number < 0:
            raise SettingsError(f"{where} must not be negative, got {number}")
        return number
    if kind == "float":
        if isinstance(value, bool):
            raise SettingsError(f"{where} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SettingsError(f"{where} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise SettingsError(f"{where} must be a finite number, not negative, got {value!r}")
        return number
    if kind.startswith("Path"):
        return Path(os.path.expanduser(str(value)))
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{where} must be a non-empty string, got {value!r}")
    return value.strip()


def _route_paths(where: str, value: Any) -> tuple[str, ...]:
    """Exact URL paths, from a comma-separated string or a JSON list; none under /v1."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise SettingsError(f"{where} must be a list of paths, got {value!r}")
    paths = tuple(dict.fromkeys(i.strip() for i in items if i.strip()))
    for path in paths:
        if not path.startswith("/") or any(c in path for c in "*?# "):
            raise SettingsError(f"{where}: {path!r} is not an exact path like /tokenize")
        if path == "/v1" or path.startswith("/v1/"):
            raise SettingsError(
                f"{where}: {path!r} is under /v1, the public API, which the plugin serves "
                "itself; only vLLM routes outside /v1 can be exposed"
            )
    return paths
