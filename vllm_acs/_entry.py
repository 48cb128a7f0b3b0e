"""vLLM entry points: `vllm.general_plugins: acs` and `vllm.endpoint_plugins: acs`.

The only module that wires the package's parts together. Imports are lazy: the general plugin
loads in every vLLM process (API server, EngineCore, workers) and must stay cheap there.
"""

from __future__ import annotations

import contextlib
import logging
from argparse import Namespace
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from pluggy import PluginManager
    from starlette.datastructures import State

    from .jobs.runner import JobRunner
    from .routes.harvest.service import HarvestService
    from .routes.jobs.service import JobService
    from .routes.keys.service import KeyService
    from .routes.looms.generation_service import GenerationService
    from .routes.looms.service import LoomService
    from .settings import Settings
    from .storage import Storage

logger = logging.getLogger(__name__)

_general_registered = False


def _configure_logging() -> None:
    """vLLM configures only its own `vllm` logger; give ours a handler in the same style."""
    package_logger = logging.getLogger("vllm_acs")
    if package_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.INFO)


def register_general() -> None:
    """`vllm.general_plugins`: runs once per process, in every vLLM process. Idempotent.

    Installs the capture and steering hooks (`hooks/compat.py`): they patch vLLM's worker and
    request classes when those are imported, and refuse unsupported vLLM versions here.
    """
    global _general_registered
    if _general_registered:
        return
    from .hooks.compat import install

    _configure_logging()
    install()
    _general_registered = True
    logger.debug("vllm_acs general plugin registered")


class AcsEndpointPlugin:
    """`vllm.endpoint_plugins`: the plugin's routes and middleware on vLLM's API server."""

    name = "acs"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        from .served_model import NodeModels

        self.models = NodeModels()
        self.storage: Storage | None = None
        self.plugins: PluginManager | None = None
        self.app: FastAPI | None = None
        self.jobs: JobService | None = None
        self.harvests: HarvestService | None = None
        self.looms: LoomService | None = None
        self.generations: GenerationService | None = None
        self.keys: KeyService | None = None
        # Apply for access and the operator's console (issue 34).
        self.applications: Any = None
        self.admin: Any = None
        self.admin_reports: Any = None
        self.runner: JobRunner | None = None
        self.registry: Any = None
        self.forwarding_client: Any = None
        self.engine_client: Any = None
        from .jobs.batch_share import LiveTraffic

        # Live completions in flight here, which batch work keeps its share beside.
        self.live = LiveTraffic()
        self.batch: Any = None

    def attach_router(self, app: FastAPI) -> None:
        from starlette.middleware.gzip import GZipMiddleware

        from . import __version__
        from .contract.harvest_request import HARVEST_BODY_LIMIT_BYTES
        from .contract.routes import Surface
        from .jobs.runner import utc_now
        from .middleware.activation_response import ActivationResponseMiddleware
        from .middleware.auth import AuthMiddleware
        from .middleware.body_limit import BodyLimitMiddleware
        from .middleware.completion_rewrite import CompletionRewriteMiddleware
        from .middleware.deferred import DeferredMiddleware
        from .middleware.error_envelope import ErrorEnvelopeMiddleware
        from .middleware.request_id import RequestIdMiddleware
        from .middleware.request_metrics import RequestMetricsMiddleware
        from .middleware.request_window import RequestWindowMiddleware
        from .middleware.route_gate import RouteGateMiddleware
        from .middleware.strict_validation import StrictValidationMiddleware
        from .middleware.usage_chunk import UsageChunkMiddleware
        from .plugins import build_plugin_manager
        from .routes.admin.api_router import build_router as build_admin_router
        from .routes.admin.reports import AdminReports
        from .routes.admin.service import AdminService
        from .routes.applications.api_router import build_router as build_applications_router
        from .routes.applications.protocol import APPLICATION_BODY_LIMIT_BYTES
        from .routes.applications.service import (
            APPLICATIONS_PATH,
            OPEN_PATHS,
            ApplicationService,
        )
        from .routes.docs_page import build_router as build_docs_router
        from .routes.harvest.api_router import build_router as build_harvest_router
        from .routes.harvest.service import HARVEST_PATH, HarvestService
        from .routes.jobs.api_router import build_router as build_jobs_router
        from .routes.jobs.service import JobService
        from .routes.keys.api_router import build_router as build_keys_router
        from .routes.keys.service import KeyService
        from .routes.looms.api_router import build_router as build_looms_router
        from .routes.looms.generation_service import GenerationService
        from .routes.looms.service import IMPORT_PATH, LoomService
        from .routes.models.api_router import build_router
        from .routes.openapi import build_openapi
        from .routes.usage.api_router import build_router as build_usage_router
        from .routes.workbench.api_router import build_router as build_workbench_router
        from .settings import Settings
        from .storage import check_counters_backend

        _configure_logging()
        # Read the settings now so that a bad one stops the server before it serves anything.
        args = app.state.args
        settings = Settings.load(additional_config=_additional_config(args))
        check_counters_backend(settings, getattr(args, "api_server_count", None) or 1)
        # Operators' authenticators now; the built-in key check joins once storage is open.
        self.plugins = build_plugin_manager()
        app.include_router(build_router(self.models, lambda: self.registry))
        self.app = app
        self.jobs = JobService(self.models, settings, utc_now)
        app.include_router(build_jobs_router(self.jobs))
        self.harvests = HarvestService(self.models, settings, utc_now)
        app.include_router(build_harvest_router(self.harvests))
        self.looms = LoomService(settings, utc_now)
        self.generations = GenerationService(self.looms, self.models, settings, utc_now)
        app.include_router(build_looms_router(self.looms, self.generations))
        self.keys = KeyService(utc_now, settings.max_keys_per_account)
        app.include_router(build_keys_router(self.keys))
        app.include_router(build_usage_router(lambda: self.storage, utc_now))
        self.applications = ApplicationService(settings, utc_now)
        app.include_router(build_applications_router(self.applications))
        self.admin = AdminService(utc_now)
        self.admin_reports = AdminReports(utc_now, settings.registry_node_ttl_ms / 1000)
        app.include_router(build_admin_router(self.admin, self.admin_reports))
        app.include_router(build_docs_router("vllm_acs"))
        app.include_router(build_workbench_router(settings.feedback_url))
        document = build_openapi(settings, __version__)
        app.openapi = lambda: document  # type: ignore[method-assign]
        surface = Surface(
            settings.expose_vllm_routes,
            metrics=settings.expose_metrics,
            workbench=settings.workbench,
        )
        # add_middleware puts each new one outside the previous: innermost first.
        app.add_middleware(CompletionRewriteMiddleware, live=self.live)
        app.add_middleware(ActivationResponseMiddleware, capture_dir=settings.capture_dir)
        app.add_middleware(DeferredMiddleware, build=self._admission)
        app.add_middleware(UsageChunkMiddleware)
        app.add_middleware(
            RequestWindowMiddleware,
            window_s=settings.request_window_s,
            keepalive_after_s=settings.keepalive_after_s,
            keepalive_every_s=settings.keepalive_every_s,
        )
        app.add_middleware(StrictValidationMiddleware, models=self.models, settings=settings)
        app.add_middleware(DeferredMiddleware, build=self._idempotency)
        # Inside Auth: no body is read (to find its model) before the key is checked.
        app.add_middleware(DeferredMiddleware, build=self._forwarding)
        app.add_middleware(AuthMiddleware, plugin_manager=self.plugins, open_paths=OPEN_PATHS)
        app.add_middleware(
            BodyLimitMiddleware,
            limit_bytes=settings.body_limit_bytes,
            route_limits={
                HARVEST_PATH: HARVEST_BODY_LIMIT_BYTES,
                IMPORT_PATH: settings.loom_import_max_bytes,
                APPLICATIONS_PATH: APPLICATION_BODY_LIMIT_BYTES,
            },
        )
        app.add_middleware(ErrorEnvelopeMiddleware)
        app.add_middleware(GZipMiddleware, minimum_size=500)
        _outside_everything(
            app,
            lambda stack: RequestIdMiddleware(
                RequestMetricsMiddleware(RouteGateMiddleware(stack, surface), surface)
            ),
        )
        _close_at_shutdown(app, self.close)

    def _admission(self, inner: Any) -> Any:
        from .middleware.admission import AdmissionMiddleware

        if self.storage is None:
            raise RuntimeError("vllm_acs storage is not open: init_state did not run")
        return AdmissionMiddleware(inner, self.storage.counters, self.storage.ledger)

    def _forwarding(self, inner: Any) -> Any:
        import httpx

        from .middleware.forwarding import FORWARDING_KEEPALIVE_S, ForwardingMiddleware

        if self.registry is None or self.storage is None:
            raise RuntimeError("vllm_acs registry is not open: init_state did not run")
        # No read timeout: a stream lasts as long as the serving node streams.
        timeout = httpx.Timeout(connect=3.0, read=None, write=60.0, pool=60.0)
        # httpx's default pool (100 connections, 20 kept idle), idle ones dropped sooner.
        limits = httpx.Limits(
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=FORWARDING_KEEPALIVE_S,
        )
        self.forwarding_client = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)
        return ForwardingMiddleware(
            inner,
            self.models,
            self.registry,
            self.forwarding_client,
            self.storage.looms.recorded_model,
            default_model=self.storage.settings.default_model,
        )

    async def _start_registry(self, settings: Settings, args: Namespace) -> None:
        import vllm

        from . import __version__
        from .deployment.registry import NodeRegistry
        from .jobs.runner import new_owner, utc_now
        from .storage.registry import NodeVersions

        assert self.storage is not None
        host = getattr(args, "host", None)
        if not host or host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        address = settings.advertise_url or f"http://{host}:{getattr(args, 'port', 8000)}"
        self.registry = NodeRegistry(
            self.storage.registry,
            new_owner(),
            address,
            self.models.own,
            heartbeat_s=settings.registry_heartbeat_ms / 1000,
            ttl_s=settings.registry_node_ttl_ms / 1000,
            clock=utc_now,
            default_model=settings.default_model,
            versions=NodeVersions(__version__, getattr(vllm, "__version__", None)),
        )
        await self.registry.start()

    def _idempotency(self, inner: Any) -> Any:
        from .account.sealed_answer import seal_created_key, unseal_created_key
        from .middleware.idempotency import IdempotencyMiddleware
        from .routes.harvest.service import HARVEST_PATH
        from .routes.jobs.service import JOBS_PATH
        from .routes.keys.service import KEYS_PATH
        from .routes.looms.api_router import NODE
        from .routes.looms.service import IMPORT_PATH, LOOMS_PATH

        if self.storage is None:
            raise RuntimeError("vllm_acs storage is not open: init_state did not run")
        # Path template -> whether the key is required there (shared/spec/DECISIONS.md).
        routes = {JOBS_PATH: True, HARVEST_PATH: False, LOOMS_PATH: False, IMPORT_PATH: False}
        routes[NODE + "/branch"] = False
        routes[KEYS_PATH] = False
        # A created key's secret is stored sealed by the caller's own secret, never readable.
        seals = {KEYS_PATH: (seal_created_key, unseal_created_key)}
        return IdempotencyMiddleware(inner, self.storage.idempotency, routes, seals=seals)

    def _bind_console(self) -> None:
        """Apply for access and the console share the key manager of /v1/keys."""
        from .account.account_manager import AccountManager

        assert self.storage is not None and self.keys is not None
        assert self.keys.manager is not None
        storage = self.storage
        self.applications.bind(storage, self.keys.manager)
        accounts = AccountManager(storage.accounts, storage.keys, storage.key_events, storage.usage)
        self.admin.bind(self.applications.applications, accounts, self.keys.manager)
        self.admin_reports.bind(storage)

    def _start_jobs(self, settings: Settings) -> None:
        from .harvest.download_urls import UrlSigner, load_or_create_secret
        from .harvest.job import KIND as HARVEST_KIND
        from .harvest.job import PART_KIND, HarvestJobKind, HarvestPartKind
        from .jobs.completion import KIND, CompletionJobKind
        from .jobs.runner import JobRunner, utc_now
        from .looms.branch import KIND as LOOM_BRANCH_KIND
        from .looms.branch import LoomBranchKind

        assert self.storage is not None and self.app is not None and self.jobs is not None
        assert self.looms is not None and self.generations is not None
        completions = CompletionJobKind(self.app, self.storage.keys, settings, self.batch)
        branches = LoomBranchKind(
            self.app,
            self.storage.looms,
            self.storage.idempotency,
            self.generations.progress,
            settings,
            completions.current_principal,
            utc_now,
        )
        harvests = self._harvest_context(completions)
        kinds: dict[str, Any] = {
            KIND: completions,
            HARVEST_KIND: HarvestJobKind(harvests),
            PART_KIND: HarvestPartKind(harvests),
            LOOM_BRANCH_KIND: branches,
        }
        # A node kept out of batch work (`batch_work` false) claims only Loom branches (a dead
        # node's, reaped): harvests, their parts and completion jobs wait for the nodes that
        # take them.
        claimed = list(kinds) if settings.batch_work else [LOOM_BRANCH_KIND]
        self.runner = JobRunner(
            self.storage.jobs,
            kinds,
            lambda: [model.id for model in self.models.all()],
            concurrency=settings.job_concurrency,
            lease_s=settings.job_lease_ms / 1000,
            claim_kinds=claimed,
            kind_limits={PART_KIND: max(1, settings.harvest_parts_per_node)},
        )
        harvests.wake_runner = self.runner.wake
        harvests.wait_ended = self.runner.watch.wait_ended
        self.jobs.bind(self.storage, self.runner)
        signer = UrlSigner(load_or_create_secret(settings.url_secret, settings.home))
        self.harvests.bind(self.storage, self.runner, signer)
        self.looms.bind(self.storage)
        assert self.keys is not None
        self.keys.bind(self.storage)
        self._bind_console()
        self.generations.bind(self.storage, self.runner, self.app)
        self.runner.start()

    def _harvest_context(self, completions: Any) -> Any:
        from . import __version__
        from .harvest.context import HarvestContext, HarvestModel

        assert self.storage is not None and self.engine_client is not None
        engine, settings = self.engine_client, self.storage.settings
        tokenizer = engine.get_tokenizer()

        def model() -> HarvestModel:
            import vllm

            served = self.models.own()
            assert served is not None
            return HarvestModel(
                id=served.id,
                checkpoint=served.checkpoint,
                hidden_size=served.hidden_size,
                n_layers=served.n_layers,
                bos_token_id=getattr(tokenizer, "bos_token_id", None),
                vllm_version=vllm.__version__,
                vllm_acs_version=__version__,
            )

        return HarvestContext(
            engine=engine,
            files=self.storage.files,
            counters=self.storage.counters,
            usage=self.storage.usage,
            settings=settings,
            model=model,
            principal_now=completions.current_principal,
            jobs=self.storage.jobs,
            batch=self.batch,
            on_charged=lambda row: self._usage_written(row),
        )

    def _usage_written(self, row: Any) -> None:
        if self.storage is not None and self.storage.ledger.on_written is not None:
            self.storage.ledger.on_written(row)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        from .auth.key_auth import KeyAuthPlugin
        from .plugins import notify_usage_recorded
        from .routes.models.service import served_model_from_engine, tokenizer_of
        from .settings import Settings
        from .storage import open_storage

        if engine_client is None:
            raise RuntimeError("vllm_acs needs an engine; it cannot run on a render-only server")
        settings = Settings.load(additional_config=_additional_config(args))
        served = served_model_from_engine(
            engine_client.model_config, engine_client.vllm_config, settings
        )
        self.models.register(served, tokenizer_of(engine_client))
        self.engine_client = engine_client
        self.batch = _batch_scheduling(engine_client, self.live)
        _keep_off_worker_cores()
        self.storage = storage = await open_storage(settings)
        plugins = self.plugins
        plugins.register(KeyAuthPlugin(storage.keys, settings))
        storage.ledger.on_written = lambda row: notify_usage_recorded(plugins, row)
        self._start_jobs(settings)
        await self._start_registry(settings, args)
        logger.info(
            "vllm_acs serving %s as model id %r (gpu_shape %s; database %s; counters %s)",
            served.checkpoint,
            served.id,
            served.gpu_shape,
            settings.resolved_database_url.split("://", 1)[0],
            "redis" if settings.redis_url else "embedded",
        )

    async def close(self) -> None:
        """At shutdown: hands running jobs back, drains the usage queue, closes the database."""
        if self.registry is not None:
            await self.registry.close()
            self.registry = None
        if self.forwarding_client is not None:
            await self.forwarding_client.aclose()
            self.forwarding_client = None
        if self.runner is not None:
            await self.runner.close()
            self.runner = None
        if self.storage is not None:
            await self.storage.close()
            self.storage = None


def _batch_scheduling(engine_client: Any, live: Any) -> Any:
    """Batch work's priority follows the engine's policy (vLLM refuses a priority but 0 under
    fcfs): `vllm-acs serve` sets `priority` unless the operator chose a policy."""
    from .jobs.batch_share import BatchScheduling
    from .launcher import LIVE_FIRST_SCHEDULER

    config = getattr(getattr(engine_client, "vllm_config", None), "scheduler_config", None)
    policy = str(getattr(config, "policy", "fcfs"))
    if policy != "priority":
        logger.warning(
            "vLLM schedules %s: live requests do not go ahead of harvests and completion jobs "
            "in the engine (start with --scheduling-policy priority; vllm-acs serve does)",
            policy,
        )
    elif (scheduler := getattr(config, "scheduler_cls", None)) != LIVE_FIRST_SCHEDULER:
        logger.warning(
            "vLLM's scheduler is %s: a harvest prompt's or a completion job's whole prefill "
            "shares an engine step with live requests (start with --scheduler-cls %s; "
            "vllm-acs serve does)",
            scheduler or "its default",
            LIVE_FIRST_SCHEDULER,
        )
    return BatchScheduling(policy == "priority", live)


def _keep_off_worker_cores() -> None:
    """On the CPU build, once the engine is up: the API server's and EngineCore's threads go to
    the cores vLLM left free of its workers (core_placement.py says why)."""
    import psutil
    from vllm.platforms import current_platform

    from .core_placement import keep_off_worker_cores

    if not current_platform.is_cpu():
        return
    try:
        cores = keep_off_worker_cores()
    except (OSError, psutil.Error) as error:  # never a reason not to serve
        logger.warning("could not keep the node's threads off the workers' cores: %s", error)
        return
    if cores is not None:
        logger.info(
            "the API server's and EngineCore's threads run on cores %s, off the CPU workers'",
            ",".join(map(str, sorted(cores))),
        )


def _outside_everything(app: FastAPI, wrap: Callable[[Any], Any]) -> None:
    """Puts `wrap(stack)` around the whole middleware stack, vLLM's middleware included.

    vLLM adds its own middleware (CORS, scaling, SageMaker's) after the endpoint plugins, so
    `add_middleware` alone would leave them outside the plugin. Starlette builds the stack once,
    on the first request, through `build_middleware_stack`: wrapping that puts the route gate in
    front of everything vLLM registers, now or in a later release.
    """
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: wrap(build())  # type: ignore[method-assign]


def _close_at_shutdown(app: FastAPI, close: Callable[[], Awaitable[None]]) -> None:
    """Runs `close` after vLLM's own lifespan ends (the endpoint interface has no shutdown hook)."""
    inner_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(lifespan_app: Any) -> AsyncIterator[Any]:
        try:
            async with inner_lifespan(lifespan_app) as lifespan_state:
                yield lifespan_state
        finally:
            await close()

    app.router.lifespan_context = lifespan


def _additional_config(args: Namespace) -> dict[str, Any]:
    config = getattr(args, "additional_config", None)
    return config if isinstance(config, dict) else {}
