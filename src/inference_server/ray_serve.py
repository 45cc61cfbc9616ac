"""inference-server on Ray Serve: the same hooks and settings as ``serve``, as a Ray Serve application.

Each replica is a Ray actor running the ASGI app of :mod:`inference_server.asgi` behind Serve's HTTP proxy: the model
is loaded once per replica (``model_fn`` when the replica starts), ``/invocations`` and the other routes that invoke
the model run on the replica's event loop (async hooks on it, sync hooks on its threads), and every protocol of
``serve`` answers the same bytes. Serve adds what it is for: replicas spread over a cluster, its autoscaler, its
router and proxy, the replacement of a dead replica, graceful shutdown. Micro-batching is our batcher inside each
replica (``--max-batch-size``), so requests are grouped per replica.

From the command line::

    inference-server serve --engine ray --replicas 2            # a local Ray, started and stopped with serve
    inference-server serve --engine ray --ray-address auto --autoscale 1:8

From Python, in a Ray driver of your own::

    from ray import serve
    from inference_server import ray_serve

    serve.run(ray_serve.app(model_dir="/opt/ml/model", max_batch_size=16), route_prefix="/")

Needs the extra: ``pip install 'inference-server[ray]'``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Any

from inference_server import _logging, _ray
from inference_server._settings import Settings
from inference_server.asgi import Application
from inference_server.errors import ConfigurationError

__all__ = ["EXTRA", "app", "deployment_options", "replica_environ", "serve"]

logger = logging.getLogger("inference_server")

EXTRA = "pip install 'inference-server[ray]'"
#: The Serve application's name (``serve status``, the replicas' actor names).
NAME = "inference-server"
#: Requests a replica takes at once: Serve's ``max_ongoing_requests``. Serve's default, 5, would starve
#: micro-batching (a batch is formed from the requests a replica holds) and streams; past this, requests wait in
#: Serve's router for a replica with room.
MAX_ONGOING_REQUESTS = 256
#: The settings that name local paths, given to the replicas as absolute ones.
_PATHS = ("model_dir", "script", "model_root")
#: The prefixes of the variables a replica is given (:func:`replica_environ`).
REPLICA_VARIABLES = ("SAGEMAKER_", "INFERENCE_SERVER_", "HF_")


def _ray_serve() -> Any:
    """The ``ray.serve`` module, or a :class:`ConfigurationError` naming the extra."""
    try:
        from ray import serve
    except ImportError:
        raise ConfigurationError(f"--engine ray needs Ray Serve: {EXTRA}") from None
    return serve


def replica_environ(settings: Settings) -> dict[str, str]:
    """The variables each replica starts with, wherever it runs: those of this process that the server, the built-in
    hooks and the containers' defaults read (``SAGEMAKER_*``, ``INFERENCE_SERVER_*``, ``HF_*``: the script's name,
    the plugins chosen, the payload limit...), then the settings, and the log format resolved here (a replica's
    stderr is a file, where the default would be JSON whatever the terminal)."""
    environ = {name: value for name, value in os.environ.items() if name.startswith(REPLICA_VARIABLES)}
    local = {field: getattr(settings, field) for field in _PATHS if getattr(settings, field)}
    absolute = {field: os.path.abspath(path) for field, path in local.items() if "://" not in path}
    environ.update(dataclasses.replace(settings, **absolute).environ())  # (a replica's working directory is Ray's)
    environ["INFERENCE_SERVER_LOG_FORMAT"] = _logging.resolve_format(settings.log_format)
    return environ


def deployment_options(settings: Settings) -> dict[str, Any]:
    """Serve's deployment options for the settings: the replicas (or the autoscaler's bounds), the requests each
    takes at once, and the drain's length (``--graceful-timeout``)."""
    options: dict[str, Any] = {
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "graceful_shutdown_timeout_s": float(settings.graceful_timeout),
        "max_surge_percent": 100,  # (a rolling update starts each new replica before an old one stops)
    }
    if settings.autoscale is not None:
        least, most = (int(part) for part in settings.autoscale.split(":"))
        options["num_replicas"] = "auto"
        options["autoscaling_config"] = {
            "min_replicas": least,
            "initial_replicas": max(least, 1),
            "max_replicas": most,
        }
    else:
        options["num_replicas"] = settings.replicas
    return options


class InferenceServer:
    """A replica of the app (Serve's ingress gives it the ASGI app, built when the replica starts)."""


#: The header SageMaker's ``TargetModel`` arrives in, and the one Serve's model multiplexing routes by.
TARGET_MODEL = b"x-amzn-sagemaker-target-model"
MULTIPLEXED_MODEL = b"serve_multiplexed_model_id"
#: What makes Serve's HTTP proxies call :func:`proxy_middlewares` (in the environment of the proxies' node).
PROXY_CALLBACK = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "inference_server.ray_serve:proxy_middlewares"}


def _target_model(scope: dict[str, Any]) -> bytes | None:
    return next((value for name, value in scope["headers"] if name.lower() == TARGET_MODEL), None)


class _TargetModelRouting:
    """Serve's proxy middleware: a request's ``TargetModel`` becomes its multiplexed model id too, so that Serve's
    router sends it to a replica that holds that model, when there is one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            target = _target_model(scope)
            if target is not None and all(name.lower() != MULTIPLEXED_MODEL for name, _ in scope["headers"]):
                scope = {**scope, "headers": [*scope["headers"], (MULTIPLEXED_MODEL, target)]}
        await self.app(scope, receive, send)


def proxy_middlewares() -> list[Any]:
    """The middlewares of Serve's HTTP proxies (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` names this function):
    ``TargetModel`` routed as Serve's multiplexed model id."""
    from starlette.middleware import Middleware

    return [Middleware(_TargetModelRouting)]


class _Replica(Application):
    """The app in a replica: a request's ``TargetModel`` is also a multiplexed model of the replica for Serve (at
    most ``--max-models``, least recently used first out), which tells Serve's router that the replica holds it. The
    model itself is loaded and kept by the app, as on ``serve``."""

    def __init__(self, environ: dict[str, str], max_models: int, generation: int = 0) -> None:
        super().__init__(environ)
        #: Each reload's (SIGHUP) is another: what makes Serve see a new version and replace the replicas.
        self.max_models, self.generation = max_models, generation
        self._held: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "max_models": self.max_models, "generation": self.generation}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["environ"], state["max_models"], state["generation"])  # type: ignore[misc]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            target = _target_model(scope)
            if target is not None:
                await self._hold(target.decode("latin-1"))
        await super().__call__(scope, receive, send)

    async def _hold(self, model: str) -> None:
        if self._held is None:
            from ray import serve

            async def held(model_id: str) -> str:
                return model_id  # (a token: the app holds the model)

            self._held = serve.multiplexed(max_num_models_per_replica=self.max_models or -1)(held)
        await self._held(model)


def app(settings: Settings | None = None, *, generation: int = 0, **options: Any) -> Any:
    """A Ray Serve application (``serve.run`` takes it) serving the app for ``settings`` (else settings from
    ``options``, named as :class:`~inference_server._settings.Settings`' fields, and the environment, as ``serve``
    reads them). Give it ``route_prefix="/"``: SageMaker's routes are at the root. Another ``generation`` of a running
    application replaces its replicas one by one (Serve sees new code), each new one started before an old one
    stops."""
    serve = _ray_serve()
    settings = settings if settings is not None else Settings.from_env(**options)
    ingress = serve.ingress(_Replica(replica_environ(settings), settings.max_models, generation))
    deployment = serve.deployment(name="InferenceServer", **deployment_options(settings))
    return deployment(ingress(InferenceServer)).bind()


def serve(settings: Settings) -> int:
    """``serve --engine ray``: deploy the app on Ray Serve, its proxy on ``--host`` and ``--port``, then wait for
    SIGTERM or SIGINT (SIGHUP: a rolling update, every replica replaced by one that loads the model again); then
    delete the application (Serve drains its replicas within ``--graceful-timeout``), and stop the local Ray if it
    was started here, or else Serve if it serves nothing else. Returns the exit status."""
    from inference_server.server import cannot_start

    _ray.prepare(log_to_driver=True)
    if not settings.ray_address:  # (a local Ray's proxies have this environment; a cluster's, that of `ray start`)
        for name, value in PROXY_CALLBACK.items():
            os.environ.setdefault(name, value)
    try:
        serve_module = _ray_serve()
    except ConfigurationError as exc:
        return cannot_start(str(exc))
    if settings.grpc_port:
        return cannot_start(
            "--grpc-port is not served with --engine ray: Serve's proxy carries HTTP (the Open Inference Protocol's "
            "REST routes, /v2, are served)"
        )
    if settings.async_output is not None or settings.async_failure is not None:
        return cannot_start("--async-output is not served with --engine ray yet; serve it with --engine local")
    stopping = threading.Event()

    reloading = threading.Event()

    def stop_when_told() -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, frame: stopping.set())
        signal.signal(signal.SIGHUP, lambda number, frame: reloading.set())

    stop_when_told()
    most = int(settings.autoscale.split(":")[1]) if settings.autoscale else settings.replicas
    try:  # a local Ray: a CPU for each replica, at least this machine's; the replicas' lines (access lines) come here
        ray, started_here = _ray.start(settings.ray_address, max(os.cpu_count() or 1, most), log_to_driver=True)
    except BaseException as exc:  # (SIGTERM while Ray starts is its SystemExit): end what it started, if anything
        import ray as ray_module

        _ray.stop(ray_module)
        if not isinstance(exc, Exception):
            raise
        where = f"join the Ray cluster at {settings.ray_address}" if settings.ray_address else "start a local Ray"
        return cannot_start(f"could not {where}: {_first_line(exc)}")
    stop_when_told()  # again: Ray's core worker put its own handler (which aborts the process) in place of ours
    began, ours = time.monotonic(), False
    try:
        try:
            serve_module.start(http_options={"host": settings.host, "port": settings.port})
            if not started_here and NAME in serve_module.status().applications:
                return cannot_start(
                    f"an application named {NAME!r} already runs on the Ray cluster at {settings.ray_address} "
                    "(another serve --engine ray): stop it first"
                )
            if not stopping.is_set():
                # the replicas' access lines are ours (one per request, with its request id): Serve's would double
                quiet = {"enable_access_log": False, "log_level": "WARNING"}
                ours = True
                serve_module.run(app(settings), name=NAME, route_prefix="/", logging_config=quiet)
        except Exception as exc:  # (Serve's RuntimeError: a replica that cannot start, its log above)
            return cannot_start(f"Ray Serve could not deploy the app: {_first_line(exc)}")
        if not stopping.is_set():
            autoscaled = f"{settings.autoscale} replicas (autoscaled)" if settings.autoscale else None
            logger.info(
                "Serving on http://%s:%d through Ray Serve: %s ready in %.1f s%s",
                settings.host,
                settings.port,
                autoscaled or f"{settings.replicas} replica(s)",
                time.monotonic() - began,
                "" if started_here else f", on the cluster at {settings.ray_address}",
            )
        generation = 0
        while not stopping.wait(0.2):
            if reloading.is_set():  # SIGHUP: new replicas, with the model loaded again, in place of the old ones
                reloading.clear()
                generation += 1
                logger.info("SIGHUP: replacing the replicas one by one, each new one loading the model again")
                try:
                    serve_module.run(app(settings, generation=generation), name=NAME, route_prefix="/")
                except Exception as exc:  # (the new replicas could not start: the old ones stay, or Serve says)
                    logger.error("The reload failed: %s", _first_line(exc))
                else:
                    logger.info("Reloaded: every replica serves the model loaded again")
        logger.info("Stopping: Ray Serve drains the replicas (at most %d s)", settings.graceful_timeout)
    finally:
        _stop(serve_module, ray, started_here, ours)
    return 0


def _stop(serve_module: Any, ray: Any, started_here: bool, ours: bool) -> None:
    """Delete the application first: its replicas finish their requests (at most ``--graceful-timeout``) while the
    proxy still carries their answers (Serve's shutdown alone stops the proxies at once, cutting them). Then stop
    Serve, and the local Ray if it was started here; on a cluster, Serve only when it serves nothing else (so that
    the next ``serve`` can choose its port: Serve keeps the HTTP options it was first started with). ``ours``: the
    application was deployed here (else the one of that name is another's, and stays)."""
    try:
        if ours:
            serve_module.delete(NAME)
        if started_here or (ours and not serve_module.status().applications):
            serve_module.shutdown()
    except Exception:  # (the cluster gone, Serve never started): what is left of a local Ray is ended below
        logger.warning("Ray Serve could not be stopped cleanly", exc_info=True)
    if started_here:
        _ray.stop(ray)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
