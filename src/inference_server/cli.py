"""The ``inference-server`` command line: ``serve`` starts the HTTP server, ``plugins`` checks the plugins,
``transform`` runs a Batch Transform job over local files."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from inference_server import _models, _plugins, _script, server
from inference_server._hookspecs import ENTRY_POINT_GROUP
from inference_server._plugins import PLUGINS_ENV
from inference_server._settings import DEFAULTS, VARIABLES, Settings, Variable
from inference_server._version import __version__
from inference_server.errors import ConfigurationError, ModelLoadError, PluginError, TransformError
from inference_server.transform.records import ASSEMBLE_WITH, SPLIT_TYPES

#: Variables read by the built-in hooks and the plugin loader rather than by the server's options.
OTHER_VARIABLES = {
    PLUGINS_ENV: "comma-separated entry-point names of the installed plugins to load, as --plugins (default: every "
    "installed one; with a script, none)",
    "SAGEMAKER_MAX_PAYLOAD_IN_MB": "largest request body in MB, beyond it 413; 0: no limit (default: 6)",
    "SAGEMAKER_BATCH_STRATEGY": "SingleRecord or MultiRecord, for /execution-parameters (default: MultiRecord)",
    "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "for /execution-parameters (default: 1)",
    "SAGEMAKER_BATCH": "true in a Batch Transform container: the default --timeout becomes 600 s",
}


def _versions() -> str:
    """This version and the installed plugins' (read from their metadata, none imported)."""
    plugins = [
        f"{entry_point.name} {entry_point.dist.version if entry_point.dist else '?'}"
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    ]
    return f"inference-server {__version__} (plugins: {', '.join(plugins) or 'none installed'})"


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="inference-server",
        description="Serve a model package over HTTP with the Amazon SageMaker container contract.",
    )
    parser.add_argument("--version", action="version", version=_versions())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="start the HTTP server (what SageMaker runs as 'docker run IMAGE serve')",
        description="Start the production HTTP server: GET /ping, POST /invocations, GET /execution-parameters. "
        "Command-line options win over environment variables.",
        epilog="also read from the environment:\n"
        + "\n".join(f"  {name}: {text}" for name, text in OTHER_VARIABLES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for field in VARIABLES:
        _add_setting(serve, field)
    _add_plugins_option(serve)
    plugins = commands.add_parser(
        "plugins",
        help="list the plugins, which of them provides each hook, and mistakes in the set; then exit",
        description="Print what 'serve' would log at start-up about the plugins (--plugins or INFERENCE_SERVER_PLUGINS "
        "selects them; a script is served alone unless they name some), with a warning for each mistake found. Exit "
        "status 1 if a plugin cannot be loaded, or with --strict if there is any warning: a container build can "
        "check its plugin set this way.",
    )
    plugins.add_argument("--strict", action="store_true", help="exit 1 if there is any warning")
    _add_plugins_option(plugins)
    for field in SCRIPT_SETTINGS:
        _add_setting(plugins, field)
    return parser, {"serve": serve, "plugins": plugins, "transform": _transform_parser(commands)}


def _transform_parser(commands: Any) -> argparse.ArgumentParser:
    transform = commands.add_parser(
        "transform",
        help="run a Batch Transform job over local files with the installed hooks, as SageMaker would",
        description="Transform every file under INPUT (a file or a directory, recursively, in sorted order) into "
        "OUTPUT/<relative path>.out with the installed hooks, with the semantics of SageMaker's CreateTransformJob. "
        "Options left out take the hooks' execution parameters (batch_strategy, max_payload_in_mb, "
        "max_concurrent_transforms). Exit status 1 if any file failed.",
    )
    transform.add_argument("input", metavar="INPUT", help="a file, or a directory of files")
    transform.add_argument("output", metavar="OUTPUT", help="the directory for the .out files")
    add = transform.add_argument
    add("--content-type", help=f"the requests' Content-Type (default: {UNTYPED})")
    add("--accept", default="*/*", help="the requests' Accept (default: %(default)s)")
    add("--split-type", default="None", choices=SPLIT_TYPES, help="how to cut files into records (default: None)")
    add("--batch-strategy", choices=["SingleRecord", "MultiRecord"], help="one record per request, or as many as fit")
    add("--max-payload-in-mb", type=int, help="largest request in MB, at most 100; 0: whole files, no limit")
    add("--max-concurrent-transforms", type=int, help="requests at once (x max payload: at most 100 MB)")
    add(
        "--assemble-with",
        default="None",
        choices=ASSEMBLE_WITH,
        help="Line: a newline after each answer, as SageMaker adds it: an answer that ends in a newline already "
        "(JSON Lines, CSV) is then followed by an empty line (default: None, answers back to back)",
    )
    add("--resume", action="store_true", help="skip inputs whose .out exists and is newer than the input")
    add("--fail-fast", action="store_true", help="stop at the first file that fails")
    add("--quiet", action="store_true", help="no progress lines, no summary, no Dask or Ray lines below error level")
    add("--model-dir", help="the model directory given to model_fn (default: $INFERENCE_SERVER_MODEL_DIR)")
    add("--input-filter", default="$", help="JSONPath of what the model gets of each record, e.g. '$[1:]'")
    add("--join-source", default="None", choices=["None", "Input"], help="Input: each answer joined to its record")
    add("--output-filter", default="$", help="JSONPath of what is written of each joined record, e.g. '$[0,-1]'")
    add("--engine", default="local", choices=["local", "dask", "ray"], help="where the files are transformed")
    add("--engine-address", help="an existing Dask scheduler (tcp://...) or Ray cluster; else a local one")
    add("--workers", type=int, help="processes, each with its own model (default: 1; a LocalCluster's: 2)")
    add("--dask-dashboard", metavar="HOST:PORT", help="with --engine dask and no --engine-address: serve the "
        "LocalCluster's dashboard there, e.g. 127.0.0.1:8787 (default: no dashboard)")  # fmt: skip
    add(
        "--part-size-mb",
        type=int,
        default=256,
        help="with --workers, dask or ray, files over this are cut at records into parts of about this size, "
        "transformed side by side; requests never span two parts, whatever the engine (default: %(default)s)",
    )
    add("--endpoint", help="a running container's URL: send the requests there instead of to the installed hooks")
    add("--invocations-timeout-in-seconds", type=int, default=600, help="per request, with --endpoint (at most 3600)")
    add("--invocations-max-retries", type=int, default=3, help="retries of a 5xx or lost connection (at most 3)")
    _add_plugins_option(transform)
    for field in SCRIPT_SETTINGS:
        _add_setting(transform, field)
    return transform  # type: ignore[no-any-return]


#: The settings that ``plugins`` and ``transform`` take too: which hooks run.
SCRIPT_SETTINGS = ("script", "script_defaults")


def _add_setting(command: argparse.ArgumentParser, field: str) -> None:
    """The option of setting ``field``, from its row of the settings table."""
    variable = VARIABLES[field]
    option, help = f"--{field.replace('_', '-')}", _help(variable, field)
    if variable.flag:
        command.add_argument(option, action="store_const", const="true", help=help)
        negative = f"--no-{field.replace('_', '-')}"
        command.add_argument(negative, dest=field, action="store_const", const="false", help=f"turn {option} off")
    elif variable.repeat:
        command.add_argument(option, action="append", help=help)
    else:
        command.add_argument(option, choices=variable.choices, help=help)


def _add_plugins_option(command: argparse.ArgumentParser) -> None:
    """``--plugins NAMES``: the installed plugins to load, as ``INFERENCE_SERVER_PLUGINS`` names them."""
    command.add_argument(
        "--plugins",
        metavar="NAMES",
        help=f"comma-separated entry-point names of the installed plugins to load, '' for none; with a script, the "
        f"plugins whose hooks run after the script's (default: ${PLUGINS_ENV}, else every installed one, or none "
        "with a script)",
    )


def _export_plugins(args: argparse.Namespace) -> None:
    """``--plugins`` as ``INFERENCE_SERVER_PLUGINS``, which the plugin manager reads in this process and in the
    processes it starts (the server's workers, a job's)."""
    if args.plugins is not None:
        os.environ[PLUGINS_ENV] = args.plugins


def _export_script_settings(args: argparse.Namespace) -> None:
    """``--script`` and ``--script-defaults`` of ``plugins`` and ``transform`` as their variables, which the job's
    pipelines read, in this process and in its worker processes (``--workers``, Dask, Ray) alike."""
    for field in SCRIPT_SETTINGS:
        value = getattr(args, field)
        env = VARIABLES[field].env
        if value is not None and env is not None:
            os.environ[env] = os.path.abspath(value) if field == "script" else value


def _help(variable: Variable, field: str) -> str:
    default = variable.default_text or DEFAULTS[field]
    if variable.env is None:
        return f"{variable.help} (default: {default})"
    return f"{variable.help} (default: ${variable.env}, else {default})"


def _unrecognized(command: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for unknown arguments, with the closest options: ``--model_dir`` -> ``--model-dir``."""
    options = [option for action in command._actions for option in action.option_strings]
    parts = []
    for extra in extras:
        if extra.startswith("-"):
            guess = difflib.get_close_matches(extra.split("=", 1)[0].replace("_", "-"), options, n=1, cutoff=0.6)
            parts.append(f"{extra} (did you mean {guess[0]}?)" if guess else extra)
        else:
            parts.append(extra)
    return f"unrecognized arguments: {' '.join(parts)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser, commands = _parsers()
    args, extras = parser.parse_known_args(argv)
    command = commands.get(args.command)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    if extras:
        command.error(_unrecognized(command, extras))
    _export_plugins(args)
    if args.command in ("plugins", "transform"):
        _export_script_settings(args)
    if args.command == "plugins":
        return _plugins_report(strict=args.strict)
    if args.command == "transform":
        return _transform(command, args)
    try:
        settings = Settings.from_env(**{field: getattr(args, field) for field in VARIABLES})
    except ConfigurationError as exc:
        command.exit(2, f"inference-server serve: error: {exc}\n")
    return server.serve(settings)


#: What transform sends without --content-type.
UNTYPED = "application/octet-stream"


def _transform(command: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from inference_server import _logging, transform
    from inference_server.transform import local

    _logging.configure(logging.WARNING if args.quiet else logging.INFO)
    untyped = args.content_type is None
    if untyped:
        args.content_type = UNTYPED
    names = [field.name for field in dataclasses.fields(transform.TransformOptions)]
    try:
        options = transform.TransformOptions(**{name: getattr(args, name) for name in names})
        if args.dask_dashboard and (args.engine != "dask" or args.engine_address):
            command.exit(2, "inference-server transform: error: --dask-dashboard needs --engine dask, no address\n")
        if args.engine in ("dask", "ray"):
            engine = importlib.import_module(f"inference_server.transform.{args.engine}")
            extra = {"dashboard": args.dask_dashboard} if args.dask_dashboard else {}
            summary = engine.run(
                args.input, args.output, options, address=args.engine_address, workers=args.workers, **extra
            )
        elif args.engine_address:
            command.exit(2, "inference-server transform: error: --engine-address needs --engine dask or ray\n")
        else:
            summary = local.run(args.input, args.output, options, workers=args.workers)
    except ConfigurationError as exc:
        command.exit(2, f"inference-server transform: error: {exc}\n")
    except (PluginError, TransformError, ModelLoadError) as exc:
        hint = _model_dir_hint(args) if isinstance(exc, ModelLoadError) else ""
        print(f"inference-server transform: error: {exc}{hint and f' ({hint})'}", file=sys.stderr)
        return 1
    for name, reason in summary.failed:
        print(f"failed: {reason if reason.startswith(f'{name}: ') else f'{name}: {reason}'}", file=sys.stderr)
    if any("ModelLoadError" in reason for _, reason in summary.failed) and (hint := _model_dir_hint(args)):
        print(f"hint: {hint}", file=sys.stderr)  # the model failed to load in the job's worker processes
    if untyped and any("ModelLoadError" not in reason for _, reason in summary.failed):
        print(
            f"hint: the requests were sent as {UNTYPED}, since no --content-type was given; name the files' type, "
            "e.g. --content-type text/csv",
            file=sys.stderr,
        )
    if not args.quiet:
        print(summary.line(), file=sys.stderr)
    return 0 if summary.ok else 1


def _model_dir_hint(args: argparse.Namespace) -> str:
    """Why a model may have failed to load: no --model-dir, and the default directory does not exist."""
    model_dir = Settings.from_env(model_dir=args.model_dir).model_dir
    if args.model_dir is None and _models.missing_dir(model_dir):
        return f"from {model_dir}, which does not exist: --model-dir chooses the model's directory"
    return ""


def _plugins_report(*, strict: bool) -> int:
    try:
        pm = _plugins.manager()
        script = _script.plugin(Settings.from_env())  # a framework container script is a plugin too
        if script is not None:
            pm = _plugins.view(pm, script.plugin, script.name)
    except (PluginError, ConfigurationError) as exc:
        print(f"inference-server: error: {exc}", file=sys.stderr)
        return 1
    for line in _plugins.describe(pm):
        print(line)
    warnings = _plugins.problems(pm)
    for warning in warnings:
        print(f"warning: {warning}")
    return 1 if strict and warnings else 0
