"""The Open Inference Protocol (KServe's "v2" REST API, Triton's HTTP API) over the same hooks, with Triton's binary
tensor data extension and its model repository extension.

Followed as written in kserve/open-inference-protocol ``specification/protocol/inference_rest.md`` (health, server
and model metadata, inference; errors as ``{"error": "..."}``) and triton-inference-server/server
``docs/protocol/extension_binary_data.md`` and ``extension_model_repository.md``:

- ``GET /v2/health/live``, ``GET /v2/health/ready`` (ready is ``/ping``'s answer: the model loaded, ``ping_fn``,
  not draining), ``GET /v2`` (server metadata and extensions);
- ``GET /v2/models/{name}[/versions/{version}]`` (the model's tensors, from the ``model_metadata`` hook; without
  declared inputs, :data:`ANY_INPUT`), ``.../ready``, ``POST .../infer``: the request's tensors reach ``predict_fn``
  as a ``dict`` of arrays (binary tensors as views on the body: :mod:`inference_server.codecs.v2`) through the same
  lifecycle as ``/invocations`` (deadline, drain, model slot, micro-batching, metrics), and its prediction goes back
  as output tensors. A ``predict_fn`` that raises on that ``dict`` as code does on data of another kind (a model
  written for ``/invocations`` alone) gets a 500 that says what v2 gave it and where the how-to is;
- ``GET /v2/models[/{name}[/versions/{version}]]/stats`` (Triton's statistics extension, unless ``--no-metrics``):
  each model's invocations over every protocol, summed over the workers, from the metrics (``inferences_total``,
  ``inference_seconds_total``, ``stage_duration_seconds``): ``success`` and ``fail`` (by status: below 400 or not)
  with their whole durations, ``queue`` (the wait from arrival to ``input_fn``: the body, the model's load, a model
  slot), ``compute_input`` (``input_fn`` or the v2 decoding), ``compute_infer`` (``predict_fn``, with
  micro-batching its wait for its group too) and ``compute_output``;
- with several models (``--multi-model``): every loaded model by its name, and ``POST /v2/repository/index``,
  ``POST /v2/repository/models/{name}/load`` (from ``--model-root``) and ``.../unload`` over the same registry as
  SageMaker's ``/models`` API.

There are no model versions: a version in the path is accepted and ignored, and none is reported.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from inference_server import _plugins, metrics
from inference_server._multimodel import check_name
from inference_server._pipeline import Output, Stream
from inference_server._version import __version__
from inference_server.codecs import v2
from inference_server.errors import BadRequest, HookError, NotFound, ServiceUnavailable
from inference_server.wsgi._invoke import MODEL, Target
from inference_server.wsgi._replies import Answer, Invoke, Invoking, Reply, Request, json_reply, problem_for

if TYPE_CHECKING:
    from inference_server._multimodel import MultiModel
    from inference_server.wsgi._service import Service

logger = logging.getLogger("inference_server")

#: What ``GET /v2`` says this server implements beyond the core protocol (the repository with several models).
EXTENSIONS = ("binary_tensor_data",)
STATISTICS = "statistics"
#: The route of the gRPC front's ModelInfer (the model's name in the path), answered only for the front: the environ
#: of its calls has :data:`GRPC` set, to the message as the front read it (``grpc.wire.Parsed``).
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer/{name}"
GRPC = "inference_server.grpc"
REPOSITORY = "model_repository"
#: The largest body of a repository request read.
_MAX_REPOSITORY_BODY = 1 << 16
#: The input ``GET /v2/models/NAME`` shows for a model that declares none: the specification's metadata has no
#: "any" (a datatype is one of the table's, a shape a list of sizes), so this names what a client may send (an input
#: named as outputs are, ``output_0``, with the datatype that carries anything) while every request is taken.
ANY_INPUT: dict[str, Any] = {"name": "input_0", "datatype": "BYTES", "shape": [-1]}
#: What code raises on data of a kind it did not expect (``float(data)``, ``data.shape``, ``data[0]`` on a dict).
_ON_OTHER_DATA = (TypeError, AttributeError, KeyError, IndexError, ValueError)
#: Where the reader of an error learns how v2 hands a model its inputs.
_HOW_TO = 'docs/how-to/v2.md, "A model written for /invocations"'


def register(app: Service) -> None:
    """Add the protocol's routes to ``app`` (unless ``--no-v2``)."""
    if not app.settings.v2:
        return
    handlers = _Handlers(app)
    route = functools.partial(_route, app)
    route("/v2", handlers.server_metadata)
    route("/v2/health/live", handlers.live)
    route("/v2/health/ready", handlers.ready)
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        route(base, handlers.model_metadata)
        route(f"{base}/ready", handlers.model_ready)
        app.route(f"{base}/infer", Invoking(functools.partial(_answered_invoking, app, handlers.infer)), "POST")
    if app.settings.grpc_port:  # what the gRPC front's ModelInfer calls, in-process (see inference_server.grpc.front)
        app.route(GRPC_INFER, Invoking(functools.partial(_answered_invoking, app, handlers.grpc_infer)), "POST")
    if app.recorder is not None:
        route("/v2/models/stats", handlers.statistics)
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            route(f"{base}/stats", handlers.statistics)
    if handlers.models is not None:
        route("/v2/repository/index", handlers.index, "POST")
        route("/v2/repository/models/{name}/load", handlers.load, "POST")
        route("/v2/repository/models/{name}/unload", handlers.unload, "POST")


def _route(app: Service, path: str, handler: Callable[[Request], Reply], method: str = "GET") -> None:
    """Add a route whose errors are answered as the protocol says: ``{"error": "..."}``."""
    app.route(path, functools.partial(_answered, app, handler), method)


def _answered(app: Service, handler: Callable[[Request], Reply], request: Request) -> Reply:
    try:
        return handler(request)
    except Exception as exc:  # (HTTP errors keep their status)
        return _error(app, request, exc)


async def _answered_invoking(
    app: Service, handler: Callable[[Request, Invoke], Awaitable[Answer]], request: Request, invoke: Invoke
) -> Answer:
    try:
        return await handler(request, invoke)
    except Exception as exc:  # (HTTP errors keep their status)
        return _error(app, request, exc)


def _error(app: Service, request: Request, exc: Exception) -> Reply:
    """``exc`` answered as the protocol says: ``{"error": "..."}`` with the status and headers it would have."""
    problem = problem_for(exc, request.request_id, request.environ, app.settings.debug)
    return json_reply(problem.status, {"error": problem.message}, problem.headers)


def model_name(app: Service) -> str:
    """The one model's name: ``--model-name``, else the plugin that implements ``predict_fn`` or ``model_fn`` (a
    script by its file's name), else ``model``."""
    if app.settings.model_name:
        return app.settings.model_name
    if app.pipeline.script is not None:
        return os.path.splitext(os.path.basename(app.pipeline.script))[0]
    for hook in ("predict_fn", "model_fn"):
        for name in _plugins.providers(app.pipeline.pm, hook):
            if name != _plugins.DEFAULTS_NAME:
                return name
    return "model"


class _Handlers:
    def __init__(self, app: Service) -> None:
        self.app = app
        #: The models of a multi-model endpoint, by name; else None (one model, :attr:`name`).
        self.models: MultiModel | None = app.multi_model if app.settings.multi_model else None
        self.name = model_name(app)

    # -- health and metadata -------------------------------------------------------------------------------------
    def server_metadata(self, request: Request) -> Reply:
        extensions = [
            *EXTENSIONS,
            *([STATISTICS] if self.app.recorder is not None else []),
            *([REPOSITORY] if self.models is not None else []),
        ]
        return json_reply(200, {"name": "inference-server", "version": __version__, "extensions": extensions})

    def live(self, request: Request) -> Reply:
        return json_reply(200, {"live": True})

    def ready(self, request: Request) -> Reply:
        reason = self.app.health.unready()
        if reason is not None:
            raise ServiceUnavailable(reason)
        return json_reply(200, {"ready": True})

    def model_ready(self, request: Request) -> Reply:
        self._model(request)
        reason = self.app.health.unready()
        if reason is not None:
            raise ServiceUnavailable(reason)
        return json_reply(200, {"name": request.params["name"], "ready": True})

    def model_metadata(self, request: Request) -> Reply:
        name = request.params["name"]
        metadata = _signature(self.app, self._model(request))
        return json_reply(
            200,
            {
                "name": name,
                "platform": "inference-server",
                "inputs": metadata.get("inputs") or [dict(ANY_INPUT)],
                "outputs": metadata.get("outputs", []),
            },
        )

    def _model(self, request: Request) -> Any:
        """The model the path names (loaded; 404 for another name, 503 if it failed to load)."""
        return self._target(request).model()

    def _target(self, request: Request) -> Target:
        name = request.params["name"]
        if self.models is None:
            if name != self.name:
                raise NotFound(f"no model named {name!r}: this server serves {self.name!r}")
            return self.app.target
        request.environ[MODEL] = name
        return self.app.model_target(name)

    def statistics(self, request: Request) -> Reply:
        name = request.params.get("name")
        found = metrics.statistics()
        if self.models is None:
            if name is not None and name != self.name:
                raise NotFound(f"no model named {name!r}: this server serves {self.name!r}")
            batched = self.app.target.batcher is not None
            return json_reply(200, {"model_stats": [model_statistics(self.name, found.get(""), batched)]})
        loaded = sorted(self.models.names())
        if name is not None and name not in loaded:
            raise NotFound(f"no model named {name!r} is loaded")
        names = loaded if name is None else [name]
        return json_reply(200, {"model_stats": [model_statistics(model, found.get(model)) for model in names]})

    # -- inference -----------------------------------------------------------------------------------------------
    async def infer(self, request: Request, invoke: Invoke, framing_type: type[Framing] | None = None) -> Answer:
        target = self._target(request)
        framing = (framing_type or Framing)(self.app, request.params["name"], request.environ)
        try:
            return await invoke(target, framing)
        except HookError as exc:
            explained = framing.explained(exc)
            if explained is exc:
                raise
            raise explained from exc.error

    async def grpc_infer(self, request: Request, invoke: Invoke) -> Answer:
        if not request.environ.get(GRPC):
            raise NotFound("ModelInfer is served over gRPC (--grpc-port), not HTTP")
        return await self.infer(request, invoke, GrpcFraming)

    # -- the model repository ------------------------------------------------------------------------------------
    def index(self, request: Request) -> Reply:
        assert self.models is not None
        fields = self._fields(request)
        ready_only = fields.get("ready", False) is True
        loaded = set(self.models.names())
        entries = [{"name": name, "state": "READY"} for name in sorted(loaded)]
        if not ready_only and self.models.root is not None:
            for name in sorted(os.listdir(self.models.root)):
                if name not in loaded and not name.startswith("."):
                    entries.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
        return json_reply(200, entries)

    def load(self, request: Request) -> Reply:
        assert self.models is not None
        self._fields(request)
        name = request.params["name"]
        check_name(name)  # before its archive, if any, is unpacked
        directory = self.models.root_directory(name, "a model of the repository")
        self.models.load(name, directory)
        return json_reply(200, {})

    def unload(self, request: Request) -> Reply:
        assert self.models is not None
        self._fields(request)
        name = request.params["name"]
        self.models.unload(name)
        return json_reply(200, {})

    def _fields(self, request: Request) -> dict[str, Any]:
        return self.app.read_json(request.environ, _MAX_REPOSITORY_BODY, empty_ok=True)


class Framing:
    """A v2 inference request's tensors as ``predict_fn``'s input (a ``dict`` of arrays by input name) and its
    prediction as output tensors (see :mod:`inference_server.codecs.v2`), checked against the ``model_metadata``
    hook's signature when the model has one."""

    stages = ("decoding the v2 request", "predict_fn", "encoding the v2 response")

    def __init__(self, app: Service, name: str, environ: Any) -> None:
        self._app = app
        self._name = name
        self._environ = environ
        self._request: v2.InferenceRequest | None = None
        self._signature: dict[str, Any] = {}

    def decode(self, body: Any, model: Any) -> dict[str, Any]:
        header_length = v2.parse_header_length(self._environ.get("HTTP_INFERENCE_HEADER_CONTENT_LENGTH"))
        request = v2.decode_request(body, header_length, self._app.pipeline.limits)
        self._signature = _signature(self._app, model)
        _check_inputs(self._signature.get("inputs"), request)
        self._request = request
        return request.inputs

    def explained(self, error: HookError) -> HookError:
        """``error`` saying what v2 gave ``predict_fn`` and where the how-to is, when ``predict_fn`` raised as code
        does on data of a kind it did not expect (likely written for what ``input_fn`` makes); else ``error``."""
        request = self._request
        if error.hook != "predict_fn" or request is None or not isinstance(error.error, _ON_OTHER_DATA):
            return error
        names = list(request.inputs)
        shown = [f"{name[:64]!r}: {request.datatypes[name]} {list(request.inputs[name].shape)}" for name in names[:4]]
        more = f", and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
        summary = (
            f"{error.summary} on what v2 gives it: a dict of arrays by input name ({{{', '.join(shown)}{more}}}), "
            f"not what input_fn makes of an /invocations body; see {_HOW_TO}"
        )
        return HookError(error.hook, error.error, summary)

    def encode(self, prediction: Any) -> Output:
        assert self._request is not None
        declared = {tensor["name"]: tensor["datatype"] for tensor in self._signature.get("outputs", [])}
        encoded = v2.respond(self._name, self._request, prediction, declared)
        headers = [] if encoded.header_length is None else [(v2.HEADER_LENGTH, str(encoded.header_length))]
        return Output(encoded.body, encoded.content_type, headers)


class GrpcFraming(Framing):
    """A gRPC ``ModelInferRequest``'s tensors as ``predict_fn``'s input, and its prediction as a ``ModelInferResponse``
    (:mod:`inference_server.grpc.wire`), checked against the signature as over HTTP."""

    stages = ("decoding the ModelInferRequest", "predict_fn", "encoding the ModelInferResponse")

    def decode(self, body: Any, model: Any) -> dict[str, Any]:
        from inference_server.grpc import wire

        parsed = self._environ.get(GRPC)  # (what the front read of the message already)
        _, request = wire.decode_request(body, self._app.pipeline.limits, parsed)
        self._signature = _signature(self._app, model)
        _check_inputs(self._signature.get("inputs"), request)
        self._request = request
        return request.inputs

    def encode(self, prediction: Any) -> Output:
        from inference_server.grpc import wire

        assert self._request is not None
        declared = {tensor["name"]: tensor["datatype"] for tensor in self._signature.get("outputs", [])}
        if isinstance(prediction, Iterator) and not isinstance(prediction, Mapping):  # a streamed predict_fn
            return Output([], GRPC_STREAM_TYPE, [], Stream(self._responses(prediction, declared)))
        return Output(wire.encode_response(self._name, self._request, prediction, declared), GRPC_CONTENT_TYPE, [])

    def _responses(self, items: Iterator[Any], declared: dict[str, str]) -> Iterator[bytes]:
        """A ``ModelInferResponse`` for each item a streamed ``predict_fn`` yields, framed (Triton's decoupled
        models answer ``ModelStreamInfer`` so)."""
        from inference_server.grpc import wire

        assert self._request is not None
        for item in items:
            yield wire.framed(wire.encode_response(self._name, self._request, item, declared))


#: What the gRPC front's ModelInfer answers carry (never sent over HTTP): one ``ModelInferResponse``, or several,
#: framed (``wire.framed``), for a streamed ``predict_fn``.
GRPC_CONTENT_TYPE = "application/grpc+proto"
GRPC_STREAM_TYPE = "application/grpc+proto; stream"


def model_statistics(name: str, stats: metrics.Statistics | None, batched: bool = False) -> dict[str, Any]:
    """``stats`` as Triton's statistics extension reports a model's (``$model_stat``): its executions are its
    successes, or the micro-batcher's ``predict_fn`` calls when it is the server's one model and ``batched``."""
    stats = stats or metrics.Statistics()
    parts = stats.parts
    successes = int(parts["success"][0])

    def duration(part: str) -> dict[str, int]:
        count, seconds = parts[part]
        return {"count": int(count), "ns": round(seconds * 1e9)}

    return {
        "name": name,
        "last_inference": round(stats.last_inference * 1000),
        "inference_count": successes,
        "execution_count": int(stats.batches) if batched else successes,
        "inference_stats": {
            "success": duration("success"),
            "fail": duration("fail"),
            "queue": duration("wait"),
            "compute_input": duration("input"),
            "compute_infer": duration("predict"),
            "compute_output": duration("output"),
            "cache_hit": {"count": 0, "ns": 0},
        },
        "batch_stats": [],
    }


def _check_inputs(declared: list[dict[str, Any]] | None, request: v2.InferenceRequest) -> None:
    """400 unless the request's inputs are the signature's: the same names, datatypes and shapes (``-1``: any)."""
    if not declared:
        return
    expected = {tensor["name"]: tensor for tensor in declared}
    for name in request.inputs:
        if name not in expected:
            raise BadRequest(f"input {name!r} is not one of the model's inputs: {', '.join(map(repr, expected))}")
    for name, tensor in expected.items():
        if name not in request.inputs:
            raise BadRequest(f"input {name!r} is missing: the model takes {', '.join(map(repr, expected))}")
        if request.datatypes[name] != tensor["datatype"]:
            raise BadRequest(f"input {name!r} is {request.datatypes[name]}, but the model takes {tensor['datatype']}")
        shape = tuple(request.inputs[name].shape)
        wanted = tuple(tensor["shape"])
        if len(shape) != len(wanted) or any(want not in (-1, got) for want, got in zip(wanted, shape, strict=True)):
            raise BadRequest(f"input {name!r} has shape {list(shape)}, but the model takes {list(wanted)}")


def _signature(app: Service, model: Any) -> dict[str, Any]:
    """The ``model_metadata`` hook's answer for ``model``, or no tensors; an answer that is not a signature is the
    hook's error (a 500 saying what is wrong with it, in the log too)."""
    pm = app.pipeline.pm
    if _plugins.is_default(pm, "model_metadata"):  # (the built-in says None: no hook call on every request)
        return {}
    metadata = pm.hook.model_metadata(model=model)
    if metadata is None:
        return {}
    problem = _signature_problem(metadata)
    if problem is not None:
        error = TypeError(f"model_metadata returned {problem}")
        raise HookError("model_metadata", error, f"model_metadata returned {problem}")
    return metadata  # type: ignore[no-any-return]


def _signature_problem(metadata: Any) -> str | None:
    """What makes ``metadata`` not a signature (``{"inputs": [...], "outputs": [...]}``, each tensor a dict with a
    ``name``, a v2 ``datatype`` and a ``shape`` of integers, -1 for any size), or None."""
    if not isinstance(metadata, dict):
        return f"a {type(metadata).__name__}, not a dict or None"
    for side in ("inputs", "outputs"):
        tensors = metadata.get(side, [])
        if not isinstance(tensors, list):
            return f"{side} as a {type(tensors).__name__}, not a list"
        for index, tensor in enumerate(tensors):
            where = f"{side}[{index}]"
            if not isinstance(tensor, dict):
                return f"{where} as a {type(tensor).__name__}, not a dict"
            if not isinstance(tensor.get("name"), str):
                return f"{where} without a str name"
            if tensor.get("datatype") not in v2.DATATYPES:
                return f"{where} ({tensor['name']!r}) with datatype {tensor.get('datatype')!r}, not a v2 datatype"
            shape = tensor.get("shape")
            if not isinstance(shape, list) or not all(type(dim) is int and dim >= -1 for dim in shape):
                return f"{where} ({tensor['name']!r}) with shape {shape!r}, not a list of integers (-1: any size)"
    return None
