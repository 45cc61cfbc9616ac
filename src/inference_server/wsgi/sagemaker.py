"""The SageMaker container contract: ``GET /ping``, ``POST /invocations``, ``GET /execution-parameters``, and the
OpenAPI description of the HTTP interface at ``GET /openapi.json``."""

from __future__ import annotations

import functools
import importlib.resources
import logging
import time
from typing import TYPE_CHECKING

from inference_server import _deadlines, codecs
from inference_server.wsgi._replies import Reply, Request, json_reply

if TYPE_CHECKING:
    from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")

#: Seconds ``ping_fn`` (and the model check) may take before /ping answers 503; SageMaker waits 2 s in all.
PING_TIMEOUT = 1.0
_EMPTY = (("Content-Type", "text/plain"), ("Content-Length", "0"))


def register(app: App) -> None:
    """Add the contract's routes to ``app``."""
    handlers = _Handlers(app)
    app.route("/ping", handlers.ping)
    app.route("/invocations", handlers.invocations, "POST")
    app.route("/execution-parameters", handlers.execution_parameters)
    app.route("/openapi.json", handlers.openapi)


class Health:
    """Whether the server can take requests: what ``/ping`` (and the Open Inference Protocol's readiness) say."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._pings = _deadlines.Pool("ping")

    def unready(self) -> str | None:
        """Why the server cannot serve now (draining, the model failed to load, ``ping_fn`` said no or took longer
        than PING_TIMEOUT), or None when it can. With several models the server is up with none loaded."""
        worker = self.app.lifecycle.worker
        if worker is not None and worker.draining:
            return "the server is shutting down"
        if self._pings.overrunning:
            logger.warning("Ping: an earlier check has been running for over %s s; answering 503", PING_TIMEOUT)
            return f"an earlier health check has been running for over {PING_TIMEOUT} s"
        if self.app.settings.multi_model:
            return None  # up: the models are loaded through /models, each on its own
        deadline = time.monotonic() + PING_TIMEOUT
        try:
            return self._pings.run(self.app.pipeline.unhealthy, lambda: deadline)  # type: ignore[no-any-return]
        except _deadlines.TimedOut:
            logger.warning("Ping: the model check took longer than %s s; answering 503", PING_TIMEOUT)
            return f"the health check (ping_fn) took longer than {PING_TIMEOUT} s"


class _Handlers:
    def __init__(self, app: App) -> None:
        self.app = app

    def ping(self, request: Request) -> Reply:
        """200 with an empty body when the model is loaded, ``ping_fn`` says yes within PING_TIMEOUT and the server
        is not draining; else 503 saying which (see ``_unhealthy``)."""
        reason = self.app.health.unready()
        if reason is not None:
            return self._unhealthy(request, reason)
        return 200, list(_EMPTY), []

    @staticmethod
    def _unhealthy(request: Request, reason: str) -> Reply:
        """503 saying why, to a client that accepts JSON (curl's ``*/*`` does); a client that sends no ``Accept``
        gets the empty body of inference-server 1.x, whose own tests check it."""
        accept = request.environ.get("HTTP_ACCEPT")
        if accept is None or not codecs.quality(accept, "application/json"):
            return 503, list(_EMPTY), []
        return json_reply(503, {"message": reason, "request_id": request.request_id, "status": 503})

    def invocations(self, request: Request) -> Reply:
        return self.app.lifecycle.invoke(request, self.app.invoked(request))

    def execution_parameters(self, request: Request) -> Reply:
        return json_reply(200, self.app.pipeline.execution_parameters)

    def openapi(self, request: Request) -> Reply:
        body = _openapi_document()
        return 200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], [body]


@functools.cache
def _openapi_document() -> bytes:
    """The OpenAPI description of the HTTP interface (``docs/openapi.yaml``, shipped as JSON)."""
    return importlib.resources.files("inference_server").joinpath("openapi.json").read_bytes()
