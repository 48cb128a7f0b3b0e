"""`vllm-acs`: the operator's command line (serve, tiny-model, accounts, keys, usage, db, jobs,
local-key), one module per command group.

Runs in the operator's shell. Each subcommand imports what it needs only when it runs, so
`vllm-acs --help` is fast and works without vLLM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _serve(vllm_args: list[str]) -> int:
    from ..launcher import run_vllm_serve

    if not vllm_args:
        raise SystemExit("usage: vllm-acs serve MODEL [any vllm serve arguments]")
    run_vllm_serve(vllm_args)
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from ..tiny_model import write_tiny_model

    out = write_tiny_model(args.directory)
    print(f"tiny Llama written to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-acs", description="Operate a vllm_acs research API node."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="start vLLM's OpenAI server with the plugin enabled",
        description="vllm-acs serve MODEL [any vllm serve arguments]",
    )
    # main() hands everything after `serve` to vLLM's own parser, which knows every flag
    # (`vllm-acs serve --help` prints vLLM's help); this entry is only for the listing.
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="MODEL and vllm serve flags")

    tiny = sub.add_parser(
        "tiny-model", help="write the deterministic tiny random-weight Llama used by the tests"
    )
    tiny.add_argument("directory")
    tiny.set_defaults(handler=_tiny_model)

    from ..auth.local_key import add_local_key_command
    from .accounts import add_account_commands
    from .applications import add_application_commands
    from .common import command
    from .db import add_db_commands
    from .jobs import add_job_commands
    from .keys import add_key_commands
    from .usage import add_usage_command

    add_account_commands(sub, command)
    add_application_commands(sub, command)
    add_key_commands(sub, command)
    add_usage_command(sub, command)
    add_db_commands(sub, command)
    add_job_commands(sub, command)
    add_local_key_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
