"""The gRPC front: the Open Inference Protocol's ``GRPCInferenceService`` on ``--grpc-port`` in every worker, each
RPC answered by the app's own route, called in-process on the RPC's thread.

So one lifecycle serves both transports: ``ModelInfer`` is the app's ``/inference.GRPCInferenceService/ModelInfer/
{name}`` route (:mod:`inference_server.wsgi.v2`), with its drain, ``--timeout``, model slots, micro-batching,
metrics, access line and request id (the ``x-request-id`` metadata, if sent), its tensors decoded from the
message's own bytes (:mod:`.wire`); health, metadata, statistics and the repository RPCs are the HTTP routes of the
same names, their JSON made into the protocol's messages. An error answer becomes the status code of its HTTP
status (:data:`CODES`) with the same message.

gRPC's own server (``grpcio``) runs the RPCs on a pool of ``--threads`` + :data:`EXTRA_THREADS` threads, each RPC
(a stream: while it is open) holding one; an RPC past the pool is refused at once with ``RESOURCE_EXHAUSTED``. It
receives messages up to ``MaxPayloadInMB`` (larger ones: ``RESOURCE_EXHAUSTED``, from gRPC) and listens with
``SO_REUSEPORT`` on ``--host``: every worker binds the same port and the kernel spreads connections.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from inference_server.errors import DecodeError
from inference_server.grpc import wire
from inference_server.grpc._messages import SERVICE, message
from inference_server.wsgi._body import given_environ
from inference_server.wsgi._invoke import CLIENT_DEADLINE
from inference_server.wsgi.v2 import GRPC, GRPC_STREAM_TYPE

if TYPE_CHECKING:
    import grpc

    from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")

#: RPC threads beyond ``--threads``: RPCs waiting for a model slot, streams, health and metadata. An RPC holds a
#: thread to its end (a stream while it is open); past the pool an RPC is refused at once (``RESOURCE_EXHAUSTED``).
EXTRA_THREADS = 60


def codes() -> dict[int, grpc.StatusCode]:
    """The status code of each HTTP status an answer may have (else ``UNKNOWN``)."""
    import grpc

    code = grpc.StatusCode
    return {
        400: code.INVALID_ARGUMENT,
        403: code.PERMISSION_DENIED,
        404: code.NOT_FOUND,
        405: code.UNIMPLEMENTED,
        406: code.INVALID_ARGUMENT,
        408: code.DEADLINE_EXCEEDED,
        409: code.ALREADY_EXISTS,
        411: code.INVALID_ARGUMENT,
        413: code.RESOURCE_EXHAUSTED,
        414: code.INVALID_ARGUMENT,
        415: code.INVALID_ARGUMENT,
        422: code.INVALID_ARGUMENT,
        429: code.RESOURCE_EXHAUSTED,
        500: code.INTERNAL,
        501: code.UNIMPLEMENTED,
        503: code.UNAVAILABLE,
        504: code.DEADLINE_EXCEEDED,
        507: code.RESOURCE_EXHAUSTED,
    }


#: The fronts started in this process.
RUNNING: list[Front] = []


def check() -> None:
    """ImportError, naming the extra, unless the front can run here (the serving process asks before its workers
    start)."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ImportError("--grpc-port needs grpcio and protobuf: pip install 'inference-server[grpc]'") from exc
    message("ModelInferRequest")


class _Failed(Exception):
    """An answer with an error status: its status and message."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class Front:
    """The gRPC server of one worker, over ``app``."""

    def __init__(self, app: App, port: int, host: str = "0.0.0.0") -> None:
        self._app = app
        self._port = port
        self._host = host
        self._server: grpc.Server | None = None
        self._codes = codes()

    def start(self) -> None:
        """Listen and serve (on gRPC's threads)."""
        import grpc

        limit = self._app.pipeline.max_body
        options = [
            ("grpc.max_receive_message_length", limit if limit is not None else -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
        ]
        threads = self._app.settings.threads + EXTRA_THREADS
        pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="grpc")
        # (an RPC holds a thread to its end, a stream while it is open: past the pool, RESOURCE_EXHAUSTED at once)
        server = grpc.server(pool, options=options, maximum_concurrent_rpcs=threads)
        unary = {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata,
            "ModelInfer": self.model_infer,
            "ModelStatistics": self.model_statistics,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_load,
            "RepositoryModelUnload": self.repository_unload,
        }
        handlers = {name: grpc.unary_unary_rpc_method_handler(self._unary(call)) for name, call in unary.items()}
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self.model_stream_infer)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_insecure_port(f"{self._host}:{self._port}")
        server.start()
        self._server = server
        RUNNING.append(self)  # (a gRPC server that is garbage collected stops)
        logger.info("Worker serving the Open Inference Protocol over gRPC on %s:%d", self._host, self._port)

    # -- calling the app -----------------------------------------------------------------------------------------
    def _call(
        self, method: str, path: str, context: Any, body: bytes = b"", extra: dict[str, Any] | None = None
    ) -> tuple[int, list[Any]]:
        """The app's answer to ``method path`` with ``body``: its status and body buffers."""
        status, _, answer = self._open(method, path, context, body, extra)
        try:
            return status, list(answer)
        finally:
            _close(answer)

    def _open(
        self, method: str, path: str, context: Any, body: bytes = b"", extra: dict[str, Any] | None = None
    ) -> tuple[int, str, Any]:
        """The app's answer to ``method path`` with ``body``: its status, media type and body (an iterable the caller
        reads, then closes with :func:`_close`: a streamed answer's chunks are made as it is read)."""
        environ = self._environ(method, path, context, body, extra)
        answered: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            media_type = next((value for name, value in headers if name.lower() == "content-type"), "")
            answered[:] = [int(status[:3]), media_type]
            return None

        answer = self._app(environ, start_response)
        return answered[0], answered[1], answer

    def _environ(
        self, method: str, path: str, context: Any, body: bytes, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """What the app is handed for an RPC: a WSGI environ whose body is the message (``GIVEN_BODY``), with the
        client's deadline and ``x-request-id``."""
        environ = given_environ(method, path, body, (self._host, self._port), "HTTP/2", _peer(context))
        environ["CONTENT_TYPE"] = "application/json"
        environ.update(extra or {})
        remaining = context.time_remaining()
        if remaining is not None:
            environ[CLIENT_DEADLINE] = time.monotonic() + remaining
        for key, value in context.invocation_metadata() or ():
            if key == "x-request-id" and isinstance(value, str):
                environ["HTTP_X_REQUEST_ID"] = value
        return environ

    def _json(self, method: str, path: str, context: Any, fields: dict[str, Any] | None = None) -> Any:
        """The app's JSON answer, or :class:`_Failed` for an error status."""
        body = orjson.dumps(fields) if fields is not None else b""
        status, buffers = self._call(method, path, context, body)
        data = b"".join(buffers)
        if status >= 400:
            raise _Failed(status, _message(data, status))
        return orjson.loads(data) if data else None

    def _code(self, status: int) -> grpc.StatusCode:
        """The status code of an HTTP status: the table's, else ``INVALID_ARGUMENT`` for the client's errors and
        ``INTERNAL`` for the server's."""
        code = self._codes.get(status)
        if code is None:
            code = self._codes[400 if status < 500 else 500]
        return code

    def _unary(self, call: Any) -> Any:
        """``call(request bytes, context)`` with its errors as status codes."""

        def rpc(request: bytes, context: Any) -> bytes:
            try:
                return call(request, context)  # type: ignore[no-any-return]
            except _Failed as failed:
                context.abort(self._code(failed.status), failed.text)
            except DecodeError as exc:
                context.abort(self._codes[400], str(exc))
            raise AssertionError("unreachable")  # (abort raises)

        return rpc

    # -- health and metadata -------------------------------------------------------------------------------------
    def server_live(self, request: bytes, context: Any) -> bytes:
        status, _ = self._call("GET", "/v2/health/live", context)
        return message("ServerLiveResponse")(live=status == 200).SerializeToString()  # type: ignore[no-any-return]

    def server_ready(self, request: bytes, context: Any) -> bytes:
        status, _ = self._call("GET", "/v2/health/ready", context)
        return message("ServerReadyResponse")(ready=status == 200).SerializeToString()  # type: ignore[no-any-return]

    def model_ready(self, request: bytes, context: Any) -> bytes:
        name = _name(_parsed("ModelReadyRequest", request).name)
        status, _ = self._call("GET", f"/v2/models/{name}/ready", context)
        return message("ModelReadyResponse")(ready=status == 200).SerializeToString()  # type: ignore[no-any-return]

    def server_metadata(self, request: bytes, context: Any) -> bytes:
        fields = self._json("GET", "/v2", context)
        return message("ServerMetadataResponse")(**fields).SerializeToString()  # type: ignore[no-any-return]

    def model_metadata(self, request: bytes, context: Any) -> bytes:
        name = _name(_parsed("ModelMetadataRequest", request).name)
        fields = self._json("GET", f"/v2/models/{name}", context)
        response = message("ModelMetadataResponse")(
            name=fields["name"],
            platform=fields["platform"],
            inputs=_tensors(fields["inputs"]),
            outputs=_tensors(fields["outputs"]),
        )
        return response.SerializeToString()  # type: ignore[no-any-return]

    def model_statistics(self, request: bytes, context: Any) -> bytes:
        name = _parsed("ModelStatisticsRequest", request).name
        path = f"/v2/models/{_name(name)}/stats" if name else "/v2/models/stats"
        fields = self._json("GET", path, context)
        for stats in fields["model_stats"]:
            stats.pop("batch_stats", None)
        return message("ModelStatisticsResponse")(**fields).SerializeToString()  # type: ignore[no-any-return]

    # -- the model repository ------------------------------------------------------------------------------------
    def repository_index(self, request: bytes, context: Any) -> bytes:
        ready = _parsed("RepositoryIndexRequest", request).ready
        models = self._json("POST", "/v2/repository/index", context, {"ready": ready})
        return message("RepositoryIndexResponse")(models=models).SerializeToString()  # type: ignore[no-any-return]

    def repository_load(self, request: bytes, context: Any) -> bytes:
        name = _name(_parsed("RepositoryModelLoadRequest", request).model_name)
        self._json("POST", f"/v2/repository/models/{name}/load", context, {})
        return b""  # (RepositoryModelLoadResponse has no fields)

    def repository_unload(self, request: bytes, context: Any) -> bytes:
        name = _name(_parsed("RepositoryModelUnloadRequest", request).model_name)
        self._json("POST", f"/v2/repository/models/{name}/unload", context, {})
        return b""

    # -- inference -----------------------------------------------------------------------------------------------
    def model_infer(self, request: bytes, context: Any) -> bytes:
        started = time.perf_counter()
        media_type, answer = self._infer(request, context, self._parse(request, context, started), started)
        try:
            if media_type == GRPC_STREAM_TYPE:
                raise _Failed(400, "the model streams its answer (a generator predict_fn): call ModelStreamInfer")
            return b"".join(answer)
        finally:
            _close(answer)

    def _parse(self, request: bytes, context: Any, started: float) -> wire.Parsed:
        """The ModelInferRequest read; or the front's refusal of a message that is not one (:class:`DecodeError`),
        counted and logged as the app's own refusals before a route are (:meth:`_refused`), then raised. ``started``:
        ``time.perf_counter()`` when the RPC began."""
        try:
            return wire.parse(request, self._app.pipeline.limits)
        except DecodeError:
            self._refused(request, context, 400, started)
            raise

    def _refused(self, request: bytes, context: Any, status: int, started: float) -> None:
        """A ModelInfer the front answers ``status`` without calling the app: counted and logged by the app."""
        self._app.refused(self._environ("POST", f"/{SERVICE}/ModelInfer", context, request), status, started)

    def _infer(self, request: bytes, context: Any, parsed: wire.Parsed, started: float) -> tuple[str, Any]:
        """The app's answer to one ModelInferRequest (``parsed``: read already, handed to the route's framing), its
        media type and body (:class:`_Failed` for an error status; a name no model can have is refused here, 404)."""
        try:
            name = _name(parsed.request.model_name)
        except _Failed as failed:
            self._refused(request, context, failed.status, started)
            raise
        path = f"/inference.GRPCInferenceService/ModelInfer/{name}"
        status, media_type, answer = self._open("POST", path, context, request, {GRPC: parsed})
        if status >= 400:
            try:
                data = b"".join(answer)
            finally:
                _close(answer)
            raise _Failed(status, _message(data, status))
        return media_type, answer

    def model_stream_infer(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        """Each request of the stream answered in turn with ``ModelStreamInferResponse``s: its inference (one for
        each item a streamed ``predict_fn`` yields, as it is made), or its error's message; the stream goes on."""
        for request in requests:
            request_id = ""
            try:
                started = time.perf_counter()
                parsed = self._parse(request, context, started)
                request_id = parsed.request.id
                media_type, answer = self._infer(request, context, parsed, started)
            except (_Failed, DecodeError) as exc:
                yield _stream_error(exc.text if isinstance(exc, _Failed) else str(exc), request_id)
                continue
            try:
                if media_type == GRPC_STREAM_TYPE:
                    not_final = _final_flag(False)
                    for response in wire.unframed(answer):
                        yield wire.field_header(2, len(response) + len(not_final)) + response + not_final
                    if _wants_empty_final(parsed.request):  # (the end of a decoupled model's answers, said)
                        final = message("ModelStreamInferResponse")()
                        final.infer_response.model_name = parsed.request.model_name
                        final.infer_response.id = request_id
                        final.infer_response.parameters["triton_final_response"].bool_param = True
                        yield final.SerializeToString()
                else:
                    buffers = [*answer, _final_flag(True)]
                    size = sum(memoryview(buffer).nbytes for buffer in buffers)
                    yield b"".join([wire.field_header(2, size), *buffers])
            except Exception as exc:  # the model's stream broke (the app logged it): said, and the stream goes on
                yield _stream_error(f"the model's stream failed: {exc}", request_id)
            finally:
                _close(answer)


@functools.cache
def _final_flag(final: bool) -> bytes:
    """A ModelInferResponse's ``parameters`` entry ``triton_final_response`` (Triton's flag on each response of a
    stream: whether it is its request's last), serialised: appended to a response, it is one more map entry."""
    response = message("ModelInferResponse")()
    response.parameters["triton_final_response"].bool_param = final
    return response.SerializeToString()  # type: ignore[no-any-return]


def _wants_empty_final(request: Any) -> bool:
    """Whether the request asks for an empty response ending its answers (tritonclient's
    ``enable_empty_final_response``)."""
    parameter = request.parameters.get("triton_enable_empty_final_response")
    return parameter is not None and parameter.WhichOneof("parameter_choice") == "bool_param" and parameter.bool_param


def _stream_error(text: str, request_id: str) -> bytes:
    """A ``ModelStreamInferResponse`` saying ``text``, with the request's id (what a client matches it by)."""
    failed = message("ModelStreamInferResponse")(error_message=text)
    failed.infer_response.id = request_id
    return failed.SerializeToString()  # type: ignore[no-any-return]


def _close(answer: Any) -> None:
    """Close an answer of the app (a stream's iterator stops; the request is counted finished)."""
    close = getattr(answer, "close", None)
    if close is not None:
        close()


def _parsed(kind: str, data: bytes) -> Any:
    """The request message ``kind`` from ``data``: a :class:`DecodeError` (INVALID_ARGUMENT) if it is not one."""
    try:
        return message(kind).FromString(data)
    except Exception as exc:  # protobuf's DecodeError (its module is the extra's)
        raise DecodeError(f"the {kind} is not a valid protobuf message: {exc}") from None


def _tensors(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A signature's tensors with the fields TensorMetadata has (a hook's may carry more)."""
    return [{"name": tensor["name"], "datatype": tensor["datatype"], "shape": tensor["shape"]} for tensor in tensors]


def _name(name: str) -> str:
    """A model name as one path segment: a 404 for one that cannot be (empty, or with a ``/``)."""
    if not name or "/" in name:
        raise _Failed(404, f"no model named {name!r}")
    return name


def _message(data: bytes, status: int) -> str:
    """The message of an error answer's body (``{"error": ...}`` or the server's ``{"message": ...}``)."""
    try:
        fields = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace") or f"HTTP status {status}"
    if isinstance(fields, dict):
        return str(fields.get("error") or fields.get("message") or f"HTTP status {status}")
    return f"HTTP status {status}"


def _peer(context: Any) -> str:
    """The client's address, from gRPC's ``ipv4:127.0.0.1:5000``."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer
