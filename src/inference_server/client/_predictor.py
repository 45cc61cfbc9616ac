"""A small Predictor for a container URL (HTTP, kept-alive) or a SageMaker endpoint (boto3, an optional extra)."""

from __future__ import annotations

import http.client
import importlib
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import orjson

from inference_server.client._deserializers import BaseDeserializer, Body, BytesDeserializer
from inference_server.client._serializers import BaseSerializer, IdentitySerializer
from inference_server.errors import PredictionError

#: Header names for the keys of SageMaker's InvokeEndpoint request.
_HEADERS = {
    "ContentType": "Content-Type",
    "Accept": "Accept",
    "CustomAttributes": "X-Amzn-SageMaker-Custom-Attributes",
    "InferenceId": "X-Amzn-SageMaker-Inference-Id",
    "TargetModel": "X-Amzn-SageMaker-Target-Model",
}
_READ_BLOCK = 1 << 20


class _Transport(Protocol):
    def invoke(self, body: bytes, args: dict[str, str]) -> tuple[str, Any]:
        """Send one request; return the response's content type and body (stream or Body), or raise."""
        ...


def _message(body: bytes) -> tuple[str, str | None]:
    """The server's message and request id from an error body (ours is JSON), else the body as text."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip() or "(no message)", None
    if isinstance(value, dict) and "message" in value:
        return str(value["message"]), value.get("request_id")
    return body.decode(errors="replace"), None


class _HTTPTransport:
    """POST to ``/invocations`` over one kept-alive connection per thread."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, not {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        path = parts.path.rstrip("/")
        self.path = path if path.endswith("/invocations") else f"{path}/invocations"
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            connection = kind(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
        return connection

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def invoke(self, body: bytes, args: dict[str, str]) -> tuple[str, Any]:
        headers = {_HEADERS[key]: value for key, value in args.items() if key in _HEADERS}
        for attempt in (1, 2):
            reused = getattr(self._local, "connection", None) is not None
            connection = self._connection()
            try:
                response = _exchange(connection, self.path, body, headers)
                data = _read(response)
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if not reused or attempt == 2:  # only a kept-alive connection the server closed is retried
                    raise
            except BaseException:
                self.close()
                raise
        if response.will_close:
            self.close()
        if response.status >= 300:
            message, request_id = _message(bytes(data))
            raise PredictionError(
                response.status, message, bytes(data), request_id or response.getheader("X-Request-Id")
            )
        return response.getheader("Content-Type", ""), Body(data)


def _exchange(
    connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> http.client.HTTPResponse:
    """Send the request and return the response, also when the server answers before the whole body is sent."""
    try:
        connection.request("POST", path, body=body, headers=headers)
    except (BrokenPipeError, ConnectionResetError) as exc:
        try:  # an early answer, such as 413 for a body over the limit, may be waiting
            return connection.getresponse()
        except (OSError, http.client.HTTPException):
            raise exc from None
    return connection.getresponse()


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
            original = exc.response.get("OriginalMessage", "")
            message, request_id = _message(original.encode())
            status = int(exc.response.get("OriginalStatusCode", 424))
            raise PredictionError(status, message, original.encode(), request_id) from None
        return response.get("ContentType", ""), response["Body"]


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
        endpoint_name: str,
        serializer: BaseSerializer | Any = None,
        deserializer: BaseDeserializer | Any = None,
        *,
        client: Any = None,
    ) -> Predictor:
        """A Predictor for a SageMaker endpoint; ``client`` defaults to ``boto3.client("sagemaker-runtime")``."""
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
        """Serialize ``data``, invoke the model and return the deserialized answer."""
        args = {"ContentType": self.serializer.CONTENT_TYPE, "Accept": ", ".join(self.deserializer.ACCEPT)}
        args.update(initial_args or {})
        for key, value in (
            ("CustomAttributes", custom_attributes),
            ("InferenceId", inference_id),
            ("TargetModel", target_model),
        ):
            if value is not None:
                args[key] = value
        content_type, body = self._transport.invoke(_request_body(self.serializer.serialize(data)), args)
        return self.deserializer.deserialize(body, content_type)

    def close(self) -> None:
        """Close the kept-alive connection of this thread, if any."""
        close = getattr(self._transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
