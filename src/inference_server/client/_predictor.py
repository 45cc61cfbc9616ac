"""A small Predictor for a container URL (HTTP, kept-alive) or a SageMaker endpoint (boto3, an optional extra)."""

from __future__ import annotations

import http.client
import importlib
import threading
import urllib.parse
import weakref
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from inference_server.client._deserializers import BaseDeserializer, Body, BytesDeserializer
from inference_server.client._serializers import BaseSerializer, IdentitySerializer
from inference_server.client._stream import StreamError, decode_stream
from inference_server.codecs._registry import Buffer
from inference_server.errors import PredictionError

#: SageMaker Runtime's InvokeEndpoint parameters besides EndpointName and Body (what ``initial_args`` takes, as the
#: SageMaker SDK's Predictor passes it to boto3), with the header each is sent as (botocore's service model).
_HEADERS = {
    "ContentType": "Content-Type",
    "Accept": "Accept",
    "CustomAttributes": "X-Amzn-SageMaker-Custom-Attributes",
    "TargetModel": "X-Amzn-SageMaker-Target-Model",
    "TargetVariant": "X-Amzn-SageMaker-Target-Variant",
    "TargetContainerHostname": "X-Amzn-SageMaker-Target-Container-Hostname",
    "InferenceId": "X-Amzn-SageMaker-Inference-Id",
    "EnableExplanations": "X-Amzn-SageMaker-Enable-Explanations",
    "InferenceComponentName": "X-Amzn-SageMaker-Inference-Component",
    "SessionId": "X-Amzn-SageMaker-Session-Id",
    "PrefixAwareId": "X-Amzn-SageMaker-Prefix-Aware-Id",
}
_READ_BLOCK = 1 << 20
#: The most one read of a streamed answer returns: whatever has arrived, up to this.
_STREAM_BLOCK = 1 << 16


class _Transport(Protocol):
    def invoke(self, body: bytes, args: dict[str, str]) -> tuple[str, Any]:
        """Send one request; return the response's content type and body (stream or Body), or raise."""
        ...

    def stream(self, body: bytes, args: dict[str, str]) -> tuple[str, Iterator[bytes]]:
        """Send one request; return the response's content type and its body's chunks as they arrive, or raise.

        Closing the chunks' iterator, or dropping it, ends the answer and frees its connection."""
        ...


def _message(body: bytes) -> tuple[str, str | None]:
    """The server's message and request id from an error body (ours is JSON), else the body as text."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip() or "(no message)", None
    if isinstance(value, dict) and "message" in value:
        return str(value["message"]), value.get("request_id")
    if isinstance(value, dict) and "error" in value:  # the Open Inference Protocol's errors
        return str(value["error"]), None
    return body.decode(errors="replace"), None


class _HTTPTransport:
    """HTTP requests (POST to ``/invocations``, or any path under the URL) over one kept-alive connection per thread,
    all of which :meth:`close` closes."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, not {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        path = parts.path.rstrip("/")
        self.path = path if path.endswith("/invocations") else f"{path}/invocations"
        #: The URL's path without ``/invocations``: where the other routes are.
        self.base = path.removesuffix("/invocations")
        self.timeout = timeout
        self._local = threading.local()
        #: The kept-alive connections not in use right now, of every thread (a thread that ends drops its own).
        self._idle: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        #: How many times :meth:`close` was called: a connection made before its last call is not used again.
        self._closes = 0
        self._lock = threading.Lock()

    def _connection(self) -> tuple[http.client.HTTPConnection, int, bool]:
        """This thread's kept-alive connection, in use (out of :meth:`close`'s reach) until :meth:`_give_back`, with
        the count of closes it was made after, and whether it served before; a new one if the thread has none, or
        if :meth:`close` was called since it was made."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with self._lock:
                self._idle.discard(connection)
                closes = self._local.closes
                current = closes == self._closes
            if current:
                return connection, closes, True
            connection.close()
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=self.timeout), self._closes, False

    def _give_back(self, connection: http.client.HTTPConnection, closes: int) -> None:
        """Keep ``connection`` for this thread's next request; closed instead if :meth:`close` was called since it
        was made (``closes``), or if the thread has another already (it made one while streaming on this)."""
        with self._lock:
            keep = closes == self._closes and getattr(self._local, "connection", None) is None
            if keep:
                self._idle.add(connection)
                self._local.connection, self._local.closes = connection, closes
        if not keep:
            connection.close()

    def close(self) -> None:
        """Close the kept-alive connection of every thread: now if it is idle, else when its request ends (a stream
        being read keeps its own until it ends or is closed). Used again, the transport opens new connections."""
        with self._lock:
            self._closes += 1
            idle = list(self._idle)
            self._idle.clear()
        for connection in idle:
            connection.close()

    def invoke(self, body: bytes, args: dict[str, str]) -> tuple[str, Any]:
        headers = {_HEADERS[key]: value for key, value in args.items() if key in _HEADERS}
        response, data = self.request("POST", self.path, body, headers)
        if response.status >= 300:
            raise _error(response, data)
        return response.getheader("Content-Type", ""), Body(data)

    def request(
        self, method: str, path: str, body: bytes | Sequence[Buffer] | None, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, memoryview | bytes]:
        """Send one request (a body given as buffers is sent as they are, with its Content-Length) and read its
        answer whole; retried once on a new connection if the server had closed a kept-alive one."""
        for attempt in (1, 2):
            connection, closes, reused = self._connection()
            try:
                response = _exchange(connection, path, body, headers, method)
                data = _read(response)
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                if not reused or attempt == 2:  # only a kept-alive connection the server closed is retried
                    raise
            except BaseException:
                connection.close()
                raise
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection, closes)
        return response, data

    def stream(self, body: bytes, args: dict[str, str]) -> tuple[str, Iterator[bytes]]:
        headers = {_HEADERS[key]: value for key, value in args.items() if key in _HEADERS}
        connection, closes, response = self._open(body, headers)
        if response.status >= 300:
            try:
                data = response.read()
            except BaseException:
                connection.close()
                raise
            self._release(connection, closes, response)
            raise _error(response, data)
        chunks = self._chunks(connection, closes, response)
        next(chunks)  # started, so that closing it or dropping it unread runs its finally: the connection closes
        return response.getheader("Content-Type", ""), chunks

    def _open(
        self, body: bytes, headers: dict[str, str]
    ) -> tuple[http.client.HTTPConnection, int, http.client.HTTPResponse]:
        """Send the request on this thread's connection, taken for the stream's own until it ends (a predict
        while streaming opens another); retried once on a new connection if the server had closed a kept-alive one."""
        attempt = 1
        while True:
            connection, closes, reused = self._connection()
            try:
                return connection, closes, _exchange(connection, self.path, body, headers)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                if not reused or attempt == 2:
                    raise
            except BaseException:
                connection.close()
                raise
            attempt += 1

    def _release(self, connection: http.client.HTTPConnection, closes: int, response: http.client.HTTPResponse) -> None:
        """After an answer read to its end: keep the connection for the next request, unless either side closes."""
        response.close()
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection, closes)

    def _chunks(
        self, connection: http.client.HTTPConnection, closes: int, response: http.client.HTTPResponse
    ) -> Iterator[bytes]:
        """The body's bytes as they arrive; an answer cut short raises :class:`StreamError`. Closed early (or on
        any error), the connection is closed, so the server sees the client go; read to its end, it is kept."""
        done = False
        received = 0
        try:
            yield b""  # the priming step of stream()
            while True:
                try:
                    chunk = response.read1(_STREAM_BLOCK)
                except (http.client.IncompleteRead, ConnectionError) as exc:
                    raise _ended_early(response.status, received, exc) from exc
                if not chunk:
                    break
                received += len(chunk)
                yield chunk
            if response.length:  # read1 returns b"" when the connection closes short of Content-Length
                raise _ended_early(response.status, received, None)
            done = True
        finally:
            if done:
                self._release(connection, closes, response)
            else:
                response.close()
                connection.close()


def _ended_early(status: int, received: int, cause: BaseException | None) -> StreamError:
    reason = f": {type(cause).__name__}" if cause is not None else ""
    return StreamError(
        "IncompleteStream",
        f"the stream ended early: the connection closed before the end of the answer, after {received} bytes{reason}",
        status,
    )


def _exchange(
    connection: http.client.HTTPConnection,
    path: str,
    body: bytes | Sequence[Buffer] | None,
    headers: dict[str, str],
    method: str = "POST",
) -> http.client.HTTPResponse:
    """Send the request and return the response, also when the server answers before the whole body is sent. A body
    of several buffers is sent one buffer after another (no joined copy), with its Content-Length."""
    if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
        parts = [memoryview(part).cast("B") for part in body]
        headers = {**headers, "Content-Length": str(sum(part.nbytes for part in parts))}
        body = parts
    try:
        connection.request(method, path, body=body, headers=headers)
    except (BrokenPipeError, ConnectionResetError) as exc:
        try:  # an early answer, such as 413 for a body over the limit, may be waiting
            return connection.getresponse()
        except (OSError, http.client.HTTPException):
            raise exc from None
    return connection.getresponse()


def _error(response: http.client.HTTPResponse, data: memoryview | bytes) -> PredictionError:
    """The :class:`PredictionError` of an error answer, with the server's message and its request id."""
    message, request_id = _message(bytes(data))
    return PredictionError(response.status, message, bytes(data), request_id or response.getheader("X-Request-Id"))


def _read(response: http.client.HTTPResponse) -> memoryview | bytes:
    """Read the body into one buffer of Content-Length (no chain of copies), else whole.

    The buffer is uninitialised memory (``np.empty``): a ``bytearray`` would first write zeros over all of it."""
    if response.length is None:
        return response.read()
    view = memoryview(np.empty(response.length, dtype=np.uint8))  # type: ignore[arg-type]
    position = 0
    while position < view.nbytes:
        count = response.readinto(view[position : position + _READ_BLOCK])
        if not count:
            raise http.client.IncompleteRead(bytes(view[:position]), view.nbytes - position)
        position += count
    return view


def _request_body(serialized: Any) -> bytes:
    """What a serializer gave as the bytes to send: a str as UTF-8 (as boto3 sends it), a file-like read whole."""
    if hasattr(serialized, "read"):
        serialized = serialized.read()
    if isinstance(serialized, str):
        return serialized.encode("utf-8")
    return serialized  # type: ignore[no-any-return]


class _RuntimeTransport:
    """SageMaker Runtime's InvokeEndpoint through a boto3 ``sagemaker-runtime`` client."""

    def __init__(self, endpoint_name: str, client: Any) -> None:
        self.endpoint_name = endpoint_name
        self.client = client

    def invoke(self, body: bytes, args: dict[str, str]) -> tuple[str, Any]:
        try:
            response = self.client.invoke_endpoint(EndpointName=self.endpoint_name, Body=body, **args)
        except self.client.exceptions.ModelError as exc:
            raise _model_error(exc) from None
        return response.get("ContentType", ""), response["Body"]

    def stream(self, body: bytes, args: dict[str, str]) -> tuple[str, Iterator[bytes]]:
        # SageMaker's streaming call has no TargetModel (multi-model endpoints do not stream): boto3 refuses it
        try:
            response = self.client.invoke_endpoint_with_response_stream(
                EndpointName=self.endpoint_name, Body=body, **args
            )
        except self.client.exceptions.ModelError as exc:
            raise _model_error(exc) from None
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 200))
        parts = self._parts(response["Body"], status)
        next(parts)  # started, so that closing it or dropping it unread runs its finally: the stream closes
        return response.get("ContentType", ""), parts

    @staticmethod
    def _parts(events: Any, status: int) -> Iterator[bytes]:
        """The ``PayloadPart`` bytes of an EventStream; its error events raise :class:`StreamError`."""
        # botocore (and its urllib3) are there: they made the client
        stream_error = importlib.import_module("botocore.exceptions").EventStreamError
        cut_short = importlib.import_module("urllib3.exceptions").ProtocolError
        received = 0
        try:
            yield b""  # the priming step of stream()
            for event in events:
                part = event.get("PayloadPart")
                if part and part.get("Bytes"):
                    received += len(part["Bytes"])
                    yield part["Bytes"]
        except stream_error as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code") or "EventStreamError"
            detail = exc.response.get("ErrorCode") or error.get("ErrorCode")
            message = error.get("Message") or str(exc)
            raise StreamError(code, f"{detail}: {message}" if detail else message, status) from None
        except cut_short as exc:
            raise _ended_early(status, received, exc) from exc
        finally:
            events.close()


def _model_error(exc: Any) -> PredictionError:
    """SageMaker's ModelError as the PredictionError of the model's own status and message."""
    original = exc.response.get("OriginalMessage", "")
    message, request_id = _message(original.encode())
    status = int(exc.response.get("OriginalStatusCode", 424))
    return PredictionError(status, message, original.encode(), request_id)


class Predictor:
    """Send data through a serializer to a model and read the answer through a deserializer.

    ``Predictor("http://127.0.0.1:8080")`` talks to a container (POST ``/invocations``, kept-alive);
    :meth:`for_endpoint` to a SageMaker endpoint. An error answer raises :class:`PredictionError` with the status
    (the model's own, for an endpoint) and the server's message.
    """

    def __init__(
        self,
        url: str,
        serializer: BaseSerializer | Any = None,
        deserializer: BaseDeserializer | Any = None,
        *,
        timeout: float = 60.0,
    ) -> None:
        self._setup(serializer, deserializer, _HTTPTransport(url, timeout))

    def _setup(self, serializer: Any, deserializer: Any, transport: _Transport) -> None:
        self.serializer = serializer if serializer is not None else IdentitySerializer()
        self.deserializer = deserializer if deserializer is not None else BytesDeserializer()
        self._transport = transport

    @classmethod
    def for_endpoint(
        cls,
        endpoint_name: str | Any,
        serializer: BaseSerializer | Any = None,
        deserializer: BaseDeserializer | Any = None,
        *,
        client: Any = None,
    ) -> Predictor:
        """A Predictor for a SageMaker endpoint, by name or as the SageMaker SDK v3's ``Endpoint`` resource (whose own
        ``invoke_with_response_stream`` fails in sagemaker-core 2.27: use :meth:`predict_stream` on this);
        ``client`` defaults to ``boto3.client("sagemaker-runtime")``."""
        if not isinstance(endpoint_name, str):
            endpoint_name = endpoint_name.endpoint_name
        if client is None:
            try:
                boto3 = importlib.import_module("boto3")
            except ImportError:
                raise ImportError("Predictor.for_endpoint needs boto3: pip install 'inference-server[aws]'") from None
            client = boto3.client("sagemaker-runtime")
        predictor = cls.__new__(cls)
        predictor._setup(serializer, deserializer, _RuntimeTransport(endpoint_name, client))
        return predictor

    def predict(
        self,
        data: Any,
        *,
        custom_attributes: str | None = None,
        inference_id: str | None = None,
        target_model: str | None = None,
        initial_args: Mapping[str, str] | None = None,
    ) -> Any:
        """Serialize ``data``, invoke the model and return the deserialized answer. ``initial_args`` takes
        InvokeEndpoint's parameters as boto3 names them (``TargetVariant``, ``SessionId``, ...), sent to a URL as
        SageMaker's headers; another key is a ``ValueError``, for a URL and an endpoint alike."""
        args = self._args(custom_attributes, inference_id, target_model, initial_args)
        content_type, body = self._transport.invoke(_request_body(self.serializer.serialize(data)), args)
        return self.deserializer.deserialize(body, content_type)

    def predict_stream(
        self,
        data: Any,
        *,
        custom_attributes: str | None = None,
        inference_id: str | None = None,
        target_model: str | None = None,
        initial_args: Mapping[str, str] | None = None,
    ) -> Generator[Any, None, None]:
        """Serialize ``data``, invoke the model and yield its streamed answer's records as they arrive.

        The request is sent, and an error status raised as :class:`PredictionError`, before this returns. The
        records are chosen by the answer's Content-Type, not the deserializer (whose ``ACCEPT`` is sent as for
        :meth:`predict`): JSON Lines values, :class:`ServerSentEvent` objects, or else the raw ``bytes`` chunks.
        An answer cut short, or an endpoint's stream error, raises :class:`StreamError`. ``close()`` the iterator
        (or drop it) to stop early: the connection is closed, so the server sees the client go. An endpoint is
        invoked with InvokeEndpointWithResponseStream, which has no ``target_model``.
        """
        args = self._args(custom_attributes, inference_id, target_model, initial_args)
        content_type, chunks = self._transport.stream(_request_body(self.serializer.serialize(data)), args)
        return decode_stream(chunks, content_type)

    def _args(
        self,
        custom_attributes: str | None,
        inference_id: str | None,
        target_model: str | None,
        initial_args: Mapping[str, str] | None,
    ) -> dict[str, str]:
        """The InvokeEndpoint arguments beside the body (the HTTP transport sends them as headers); a key of
        ``initial_args`` that is not one of them is a ``ValueError``, for a URL and an endpoint alike."""
        args = {"ContentType": self.serializer.CONTENT_TYPE, "Accept": ", ".join(self.deserializer.ACCEPT)}
        if initial_args:
            unknown = [key for key in initial_args if key not in _HEADERS]
            if unknown:
                own = (
                    " (the endpoint is the Predictor's, the body the data)"
                    if {"EndpointName", "Body"} & {*unknown}
                    else ""
                )
                raise ValueError(
                    f"initial_args takes InvokeEndpoint's {', '.join(_HEADERS)}, not "
                    f"{', '.join(map(repr, unknown))}{own}"
                )
            args.update(initial_args)
        for key, value in (
            ("CustomAttributes", custom_attributes),
            ("InferenceId", inference_id),
            ("TargetModel", target_model),
        ):
            if value is not None:
                args[key] = value
        return args

    def close(self) -> None:
        """Close the kept-alive connections of every thread that used this Predictor (a stream being read keeps its
        own until it ends or is closed); used again, it opens new ones."""
        close = getattr(self._transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
