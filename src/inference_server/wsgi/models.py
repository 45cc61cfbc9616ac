"""SageMaker's model management API for multi-model endpoints (``serve --multi-model``), as its developer guide's
"Custom Containers Contract for Multi-Model Endpoints" (mms-container-apis) defines it:

- ``POST /models`` ``{"model_name", "url"}``: load; 200, 409 if loaded, 404 for a missing directory, 507 when it does
  not fit (SageMaker then unloads others);
- ``GET /models`` (``next_page_token``, ``page_size``): ``{"models": [{"modelName", "modelUrl"}], "nextPageToken"?}``;
- ``GET /models/{name}``, ``DELETE /models/{name}``: one entry, unload; 404 if not loaded;
- ``POST /models/{name}/invoke``: the hooks with that model, as ``/invocations``.

Each entry also says what the model costs the machine (``memoryBytes``: ``privateBytesByWorker`` and ``mappedBytes``);
see :mod:`inference_server._multimodel`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from inference_server.errors import BadRequest
from inference_server.wsgi._invoke import MODEL, Target
from inference_server.wsgi._replies import Invoking, Reply, Request, json_reply

if TYPE_CHECKING:
    from inference_server._multimodel import MultiModel
    from inference_server.wsgi._service import Service

logger = logging.getLogger("inference_server")

#: The largest ``POST /models`` body read.
_MAX_LOAD_BODY = 1 << 16


def register(app: Service) -> None:
    """Add the model management API to ``app`` when it serves several models."""
    models = app.multi_model
    if models is None or not app.settings.multi_model:
        return
    handlers = _Handlers(app, models)
    app.route("/models", handlers.listing)
    app.route("/models", handlers.load, "POST")
    app.route("/models/{name}", handlers.describe)
    app.route("/models/{name}", handlers.unload, "DELETE")
    app.route("/models/{name}/invoke", Invoking.of(handlers.target), "POST")


class _Handlers:
    def __init__(self, app: Service, models: MultiModel) -> None:
        self.app = app
        self.models = models

    def load(self, request: Request) -> Reply:
        example = '{"model_name": "...", "url": "/opt/ml/models/..."}'
        fields = self.app.read_json(request.environ, _MAX_LOAD_BODY, example=example)
        name, url = (_text(fields, field) for field in ("model_name", "url"))
        self.models.load(name, url)
        return json_reply(200, {"status": f"Model {name!r} loaded"})

    def listing(self, request: Request) -> Reply:
        arguments = _query(request.environ)
        return json_reply(200, self.models.listing(arguments.get("next_page_token"), arguments.get("page_size")))

    def describe(self, request: Request) -> Reply:
        return json_reply(200, self.models.describe(request.params["name"]))

    def unload(self, request: Request) -> Reply:
        name = request.params["name"]
        self.models.unload(name)
        return json_reply(200, {"status": f"Model {name!r} unloaded"})

    def target(self, request: Request) -> Target:
        """What ``/models/{name}/invoke`` invokes."""
        name = request.params["name"]
        request.environ[MODEL] = name
        return self.app.model_target(name)


def _text(fields: dict[str, Any], field: str) -> str:
    value = fields.get(field)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field} must be a non-empty string, not {value!r}")
    return value


def _query(environ: Any) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
