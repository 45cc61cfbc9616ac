"""The ``inference-server`` command line: ``serve`` starts the production HTTP server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import inference_server
from inference_server import _plugins
from inference_server._app import App
from inference_server._settings import MODEL_DIR_ENV, SERVERS, VARIABLES, Settings
from inference_server.errors import ConfigurationError, PluginError

logger = logging.getLogger("inference_server")


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
    serve.add_argument("--host", help="address to listen on (default: 0.0.0.0)")
    serve.add_argument("--port", help="TCP port (default: $SAGEMAKER_BIND_TO_PORT, else 8080)")
    serve.add_argument(
        "--workers",
        help="worker processes, each loading the model (default: $SAGEMAKER_MODEL_SERVER_WORKERS, "
        "else the number of CPUs)",
    )
    serve.add_argument(
        "--threads",
        help="request threads per worker; above 1 the model must be thread-safe "
        "(default: $INFERENCE_SERVER_THREADS, else 1)",
    )
    serve.add_argument(
        "--timeout",
        help="seconds a request may take before it is answered 504; work that cannot be stopped gets its worker "
        "replaced; 0: no limit, and requests run on the server's threads, a little faster "
        "(default: $SAGEMAKER_MODEL_SERVER_TIMEOUT, else 60)",
    )
    serve.add_argument(
        "--read-timeout",
        help="seconds a client may take to send a request's headers (else the connection is closed), and again its "
        "body (else 408) (default: $INFERENCE_SERVER_READ_TIMEOUT, else 30)",
    )
    serve.add_argument(
        "--graceful-timeout",
        help="seconds requests in flight get to finish after SIGTERM, while /ping and new requests get 503 "
        "(default: $INFERENCE_SERVER_GRACEFUL_TIMEOUT, else 25; SageMaker kills at 30)",
    )
    serve.add_argument(
        "--max-requests",
        help="replace a worker after it served this many requests, to contain leaks in model code; 0: never "
        "(default: $INFERENCE_SERVER_MAX_REQUESTS, else 0)",
    )
    serve.add_argument(
        "--max-requests-jitter",
        help="add up to this many requests to each worker's --max-requests so that workers restart apart "
        "(default: $INFERENCE_SERVER_MAX_REQUESTS_JITTER, else 0)",
    )
    serve.add_argument(
        "--max-header-bytes",
        help="largest request line and headers accepted, in bytes; beyond it 431 "
        "(default: $INFERENCE_SERVER_MAX_HEADER_BYTES, else 65536)",
    )
    serve.add_argument(
        "--model-dir", help=f"directory passed to model_fn (default: ${MODEL_DIR_ENV}, else /opt/ml/model)"
    )
    serve.add_argument(
        "--server",
        choices=SERVERS,
        help="HTTP server: granian, fastest for real-time requests, or gunicorn, faster and leaner for bodies "
        "of many MB (default: $INFERENCE_SERVER_BACKEND, else granian)",
    )
    serve.add_argument(
        "--log-level",
        help="critical, error, warning, info or debug (default: $INFERENCE_SERVER_LOG_LEVEL, else info)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        parser.print_help(sys.stderr)
        return 2
    try:
        settings = Settings.from_env(host=args.host, **{field: getattr(args, field) for field in VARIABLES})
    except ConfigurationError as exc:
        parser.exit(2, f"inference-server: error: {exc}\n")
    return serve(settings)


def serve(settings: Settings) -> int:
    """Check the plugins and settings, then serve until SIGTERM; return the exit status (1 if the drain timed out)."""
    logging.basicConfig(
        level=settings.log_level_number, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    os.environ.update(settings.environ())  # worker processes, create_app() and warmup() in user code agree
    try:
        app = App(settings, _plugins.manager())
    except (PluginError, ConfigurationError) as exc:
        logger.error("Cannot start: %s", exc)
        print(f"inference-server: error: {exc}", file=sys.stderr)
        return 1
    from inference_server import _server

    if settings.server == "granian":
        return _server.run_granian(app)
    _server.GunicornServer(app).run()  # exits the process itself
    return 0
