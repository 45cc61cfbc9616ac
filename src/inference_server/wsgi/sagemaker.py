"""The SageMaker container contract: ``GET /ping``, ``POST /invocations``, ``GET /execution-parameters``, and the
OpenAPI description of the HTTP interface at ``GET /openapi.json``."""

from __future__ import annotations

import functools
import importlib.resources
import logging
from typing import TYPE_CHECKING

from inference_server import codecs
from inference_server.wsgi._replies import Invoking, Reply, Request, json_reply

if TYPE_CHECKING:
    from inference_server.wsgi._service import Service

logger = logging.getLogger("inference_server")

_EMPTY = (("Content-Type", "text/plain"), ("Content-Length", "0"))


def register(app: Service) -> None:
    """Add the contract's routes to ``app``."""
    handlers = _Handlers(app)
    app.route("/ping", handlers.ping)
    app.route("/invocations", Invoking.of(app.invoked), "POST")
    app.route("/execution-parameters", handlers.execution_parameters)
    app.route("/openapi.json", handlers.openapi)


class _Handlers:
    def __init__(self, app: Service) -> None:
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

    def execution_parameters(self, request: Request) -> Reply:
        return json_reply(200, self.app.pipeline.execution_parameters)

    def openapi(self, request: Request) -> Reply:
        body = _openapi_document()
        return 200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], [body]


@functools.cache
def _openapi_document() -> bytes:
    """The OpenAPI description of the HTTP interface (``docs/openapi.yaml``, shipped as JSON)."""
    return importlib.resources.files("inference_server").joinpath("openapi.json").read_bytes()
