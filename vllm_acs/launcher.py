"""Runs vLLM's own `serve` subcommand in this process, with the plugin enabled.

API server process (before vLLM starts). It does what `vllm serve` does without going through
vLLM's CLI main, whose version lookup fails on the CPU build (`PackageNotFoundError: vllm`).
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from collections.abc import MutableMapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

PLUGIN_NAME = "acs"

# Added to the operator's arguments unless they give the flag (or its --no- form) themselves:
# -1 lets vLLM compute full-vocabulary prompt logprobs (the plugin caps positive counts).
# Compilation is the operator's (vLLM's default, `--enforce-eager`, `-O`, `--compilation-config`):
# capture and steering run inside compiled graphs as a custom op (hooks/intervention_op.py).
# --enable-offline-docs: /docs loads Swagger UI from the files vLLM ships (/static/...), never
# from a CDN: a node often has no internet.
# --scheduling-policy priority: live requests go ahead of harvests and completion jobs, which
# enter the engine with a lower priority (jobs/batch_share.py); --scheduler-cls: inside each
# step, batch prefills go in small chunks beside live requests (engine_core/live_first.py).
LIVE_FIRST_SCHEDULER = "vllm_acs.engine_core.live_first.live_first_scheduler"
DEFAULT_SERVE_ARGS: dict[str, list[str]] = {
    "--max-logprobs": ["--max-logprobs", "-1"],
    "--enable-offline-docs": ["--enable-offline-docs"],
    "--scheduling-policy": ["--scheduling-policy", "priority"],
    "--scheduler-cls": ["--scheduler-cls", LIVE_FIRST_SCHEDULER],
}


def plugin_environment(environ: MutableMapping[str, str]) -> None:
    """Puts `acs` into VLLM_PLUGINS (an allowlist for every group), keeping the others."""
    names = [n for n in environ.get("VLLM_PLUGINS", "").split(",") if n.strip()]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    environ["VLLM_PLUGINS"] = ",".join(names)


def with_default_args(args: Sequence[str]) -> list[str]:
    given = {a.split("=", 1)[0].replace("--no-", "--", 1) for a in args if a.startswith("--")}
    extra = [
        arg
        for flag, flag_args in DEFAULT_SERVE_ARGS.items()
        if flag not in given
        for arg in flag_args
    ]
    return [*args, *extra]


def _serve_parser() -> tuple[Any, Any]:
    """vLLM's `serve` subcommand and an argument parser that has only it."""
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm-acs", description="vllm serve with vllm_acs")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    (serve,) = cmd_init()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser, serve


def parse_serve_args(serve_args: Sequence[str]) -> Namespace:
    """The Namespace `vllm-acs serve SERVE_ARGS...` runs with (our default arguments added)."""
    parser, _ = _serve_parser()
    return parser.parse_args(["serve", *with_default_args(serve_args)])


def run_vllm_serve(serve_args: Sequence[str], plugin: bool = True) -> None:
    """`vllm serve SERVE_ARGS...` with the plugin on; returns when the server stops.

    `plugin=False` leaves VLLM_PLUGINS as it is (plain vLLM, for benchmarks/serve_overhead.py).
    """
    if plugin:
        plugin_environment(os.environ)
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    parser, serve = _serve_parser()
    args = parser.parse_args(["serve", *with_default_args(serve_args)])
    configure_logging_from_args(args)
    if plugin:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            from .cpu_kv_cache import apply_default

            apply_default(args, os.environ, serve_args)
    serve.validate(args)
    args.dispatch_function(args)
