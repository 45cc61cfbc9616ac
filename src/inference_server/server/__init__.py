"""What ``inference-server serve`` runs: the chosen HTTP server backend, with our process lifecycle on top.

Either backend (:mod:`.granian`, the default, or :mod:`.gunicorn`) runs in the process that ``serve`` started (no
wrapper process), with the worker processes as its children. The serving process loads the model before the workers
start, and they share it (:mod:`._preload`); else (``--no-preload``, or a model unsafe to fork) each worker loads it
before it accepts traffic.
Only the chosen backend is imported. On top of each backend's own supervisor:

- SIGTERM drains (:mod:`._drain`): workers answer ``/ping`` and new invocations 503 while requests in flight finish
  (at most ``graceful_timeout`` seconds), then the backend stops as usual and the process exits 0 (1 if time ran
  out). A second SIGTERM, or SIGINT, kills the workers and exits at once with 128 + the signal number.
- A worker that dies is replaced; one that asks to be replaced (``--max-requests``, work stuck past its timeout)
  finishes its requests in flight while a new one takes over. The serving process and its workers share that state
  through :mod:`._state`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time

from inference_server import _logging, _models, _plugins, _rundir, _script, metrics
from inference_server._settings import DEFAULT_HOOKS_ENV, Settings
from inference_server.errors import ConfigurationError, ModelLoadError, PluginError
from inference_server.server import _port, _preload
from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")

#: Keep idle client connections open longer than the usual 60 s idle timeout of load balancers. granian (hyper) has
#: one timer for an idle kept-alive connection and for a client's slow headers: there both are the larger of this
#: and ``--read-timeout``.
KEEPALIVE = 65
#: Server threads per worker beyond the model's own (``--threads``): /ping and requests waiting for the model must
#: not queue inside the server, where they could neither be answered quickly nor be counted while draining.
EXTRA_SERVER_THREADS = 32
#: More server threads, for slow clients: each holds one while it trickles its headers (gunicorn) or its body (both;
#: granian has no body timeout). Both servers start threads only when all are busy, and stop idle ones, so these
#: cost nothing until slow clients come.
SLOW_CLIENT_THREADS = 992
#: The soft limit of open files asked for when the hard limit is unlimited.
FILE_LIMIT = 65536


def server_threads(settings: Settings) -> int:
    """Threads each worker's HTTP server runs requests on."""
    return settings.threads + EXTRA_SERVER_THREADS


def load_model(app: App, required: bool = False) -> None:
    """Load the model in a worker before it serves, unless it has the one the serving process loaded before it
    started (:mod:`._preload`); a failure is logged (with its traceback) and /ping says 503, or with ``required``
    raises :class:`ModelLoadError` (a replica on Ray Serve, which Serve then replaces)."""
    _models.warn_missing_dir = False  # the serving process warned once already
    if app.multi_model is not None:
        app.multi_model.start_watching()
    if not app.settings.multi_model:  # (else models are loaded through /models)
        started, preloaded = time.perf_counter(), _preload.preloaded()
        with contextlib.nullcontext() if required else contextlib.suppress(ModelLoadError):
            app.model()  # (preloaded: in the store already, the serving process's)
            if preloaded:
                logger.info("Worker %d: serving the model loaded before it started (shared)", os.getpid())
            if app.recorder is not None:
                app.recorder.model_loaded(None if preloaded else time.perf_counter() - started)
    if app.settings.grpc_port:
        from inference_server.grpc.front import Front

        Front(app, app.settings.grpc_port, app.settings.host).start()
    if app.settings.async_output is not None:
        from inference_server import _async_inference

        _async_inference.start(app)


def _log_summary(app: App, chosen_hooks: bool = False) -> list[str]:
    """The start-up summary at INFO (plugins, hooks, limits), and warnings for mistakes that would stay silent
    (``chosen_hooks``: the user chose the default hooks, so a plugin written for 1.x is not warned about); returns
    the warnings."""
    warnings: list[str] = []
    for line in _plugins.describe(app.pm):
        logger.info("%s", line)
    settings, mb = app.settings, app.execution_parameters["MaxPayloadInMB"]
    logger.info(
        "limits: bodies up to %s, timeout %s, read timeout %s s, graceful timeout %s s, headers up to %s bytes; "
        "%d worker(s) x %d thread(s) on %s",
        f"{mb} MB" if mb else "any size",
        f"{settings.timeout} s" if settings.timeout else "none",
        settings.read_timeout,
        settings.graceful_timeout,
        settings.max_header_bytes,
        settings.workers,
        settings.threads,
        settings.server,
    )
    if settings.default_hooks == "passthrough":
        logger.info("default hooks: passthrough (inference-server 1.x's: the body's bytes in, bytes out)")
    else:
        logger.info(
            "default hooks: codecs (the body decoded by Content-Type, the prediction encoded by Accept; 1.x passed "
            "bytes through: --default-hooks passthrough)"
        )
        for name in [] if chosen_hooks else _plugins.written_for_1x(app.pm):
            warnings.append(
                f"plugin {name!r} requires inference-server 1.x, whose built-in input_fn and output_fn passed bytes "
                "through; here they decode and encode by media type. If its hooks expect bytes, serve with "
                "--default-hooks passthrough (INFERENCE_SERVER_DEFAULT_HOOKS=passthrough); to keep the codecs, say "
                "--default-hooks codecs"
            )
    batching = app.batching
    if batching.enabled:
        logger.info(
            "micro-batching: up to %d requests per predict_fn call (%d at once), waiting at most %g ms for requests "
            "on their way; up to %d waiting per worker",
            batching.max_batch_size,
            batching.slots,
            batching.max_batch_delay * 1000,
            batching.max_queue,
        )
    warnings += _plugins.problems(app.pm)
    missing = None if settings.multi_model else _models.missing_dir(settings.model_dir)
    warnings += [missing] if missing else []
    for warning in warnings:
        logger.warning("%s", warning)
    return warnings


def cannot_start(reason: str) -> int:
    """Say in one line on stderr why the server cannot start, after the lines logged so far; the exit status is 1."""
    _logging.flush()
    print(f"inference-server: error: {reason}", file=sys.stderr)
    return 1


def _raise_file_limit() -> None:
    """Let the workers hold as many connections as the system allows: the soft limit of open files up to the hard one.

    Many systems start processes with a soft limit of 1,024, which slow clients reach long before the server's own
    connection limit; what a container runtime sets as the hard limit is the operator's decision.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, FILE_LIMIT)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    logger.debug("open files: at most %d per process", resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def serve(settings: Settings) -> int:
    """Check the plugins and settings, then serve until SIGTERM; return the exit status (1 if the drain timed out).

    The run directory the serving process shares with its workers is made first: the metrics' files live there, and
    the Prometheus client must know it before anything (a plugin) imports it.
    """
    started = _preload.Started.now()  # what the serving process starts again with (_preload.StartAgain)
    run_dir, pid = _rundir.create(), os.getpid()
    try:
        try:
            if settings.metrics:
                metrics.use_directory(run_dir)
            return _serve(settings, started)
        finally:
            if os.getpid() == pid:  # not in a gunicorn worker leaving through this frame (forked from here)
                _rundir.remove(run_dir)
    except _preload.StartAgain as again:  # (its run directory removed: the new process makes its own)
        again.start()


def _serve(settings: Settings, started: _preload.Started) -> int:
    log_format = _logging.resolve_format(settings.log_format)
    _logging.configure(settings.log_level_number, log_format, background=True)
    os.environ["INFERENCE_SERVER_LOG_FORMAT"] = log_format  # workers write what was resolved here
    chosen_hooks = "default_hooks" in settings.given or DEFAULT_HOOKS_ENV in os.environ
    os.environ.update(settings.environ())  # worker processes, create_app() and warmup() in user code agree
    try:
        if settings.install_requirements:
            script = _script.find(settings)
            if script is not None:
                _script.install_requirements(script)
        if settings.server == "granian":
            from inference_server.server import granian as backend
        else:
            from inference_server.server import gunicorn as backend  # type: ignore[no-redef]
        app = App(settings, _plugins.manager(), backend.BACKEND)
    except (PluginError, ConfigurationError) as exc:
        return cannot_start(str(exc))
    problem = _port.in_use(settings)
    if problem is not None:
        return cannot_start(problem)
    if settings.async_output is not None or settings.async_failure is not None:
        from inference_server import _async_inference

        try:
            _async_inference.check(settings)
        except ConfigurationError as exc:
            return cannot_start(str(exc))
    if settings.grpc_port:
        from inference_server.grpc import front

        try:
            front.check()
        except ImportError as exc:
            return cannot_start(str(exc))
    warnings = _log_summary(app, chosen_hooks)
    if settings.strict and warnings:
        return cannot_start(f"--strict: {len(warnings)} warning(s) at start-up, the first: {warnings[0]}")
    _raise_file_limit()
    if settings.engine == "ray":
        from inference_server import ray_serve

        return ray_serve.serve(settings)
    try:
        _preload.preload(app, started)
    except ModelLoadError as exc:
        return cannot_start(f"{exc.description} (in model_fn, its traceback above; --no-preload to serve anyway)")
    except _preload.StartAgain as again:
        logger.warning("%s", again.warning)
        if settings.strict:
            return cannot_start(f"--strict: a warning at start-up: {again.warning}")
        raise
    return backend.run(app)
