"""The ``inference-server`` command line: ``serve`` starts the production HTTP server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import inference_server
from inference_server import server
from inference_server._settings import DEFAULTS, VARIABLES, Settings, Variable
from inference_server.errors import ConfigurationError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-server",
        description="Serve a model package over HTTP with the Amazon SageMaker container contract.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {inference_server.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="start the HTTP server (what SageMaker runs as 'docker run IMAGE serve')",
        description="Start the production HTTP server: GET /ping, POST /invocations, GET /execution-parameters. "
        "Command-line options win over environment variables.",
    )
    for field, variable in VARIABLES.items():
        serve.add_argument(f"--{field.replace('_', '-')}", choices=variable.choices, help=_help(variable, field))
    return parser


def _help(variable: Variable, field: str) -> str:
    default = variable.default_text or DEFAULTS[field]
    if variable.env is None:
        return f"{variable.help} (default: {default})"
    return f"{variable.help} (default: ${variable.env}, else {default})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        parser.print_help(sys.stderr)
        return 2
    try:
        settings = Settings.from_env(**{field: getattr(args, field) for field in VARIABLES})
    except ConfigurationError as exc:
        parser.exit(2, f"inference-server: error: {exc}\n")
    return server.serve(settings)
