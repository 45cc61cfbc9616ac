"""Asynchronous inference from the client's side: :class:`AsyncPredictor`, beside the SageMaker SDK v2's
``sagemaker.predictor_async.AsyncPredictor``, with our serializers and deserializers.

``predict_async`` puts the serialized data at an input location (S3 through boto3, or a local file for a server that
writes to a local directory), or sends it inline (SageMaker's ``Body``, up to 128,000 bytes) when no location is
configured, and calls InvokeEndpointAsync (``POST /endpoints/{name}/async-invocations`` on a URL, boto3's
``invoke_endpoint_async`` for an endpoint). The :class:`AsyncInferenceResponse` it returns reads the answer at the
output location (decoded by the S3 object's ``Content-Type``, as the SDK decodes it; a local file, which has none,
as the deserializer's first concrete ``ACCEPT`` type) or the model's error at the failure location, at once or
polling (:class:`WaiterConfig`).

Unlike the SDK, the request names its ``ContentType`` (the serializer's), so the server decodes the body as
``/invocations`` would; the SDK sends none (a server then takes the body as bytes). Polling reads both locations in
turn on one thread (GetObject, a missing key meaning not yet), where the SDK runs an S3 waiter per location on two
threads (HeadObject, then GetObject) and leaves the one that did not find its object polling to its last attempt.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import os
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from inference_server.client._deserializers import BaseDeserializer, Body, BytesDeserializer
from inference_server.client._predictor import _error, _HTTPTransport, _message, _request_body
from inference_server.client._serializers import BaseSerializer, IdentitySerializer
from inference_server.errors import InferenceServerError, PredictionError

#: InvokeEndpointAsync's parameters ``initial_args`` takes (as boto3 names them), with the header each is sent as
#: (botocore's service model). EndpointName, InputLocation and Body are the predictor's and the call's own.
_HEADERS = {
    "ContentType": "X-Amzn-SageMaker-Content-Type",
    "Accept": "X-Amzn-SageMaker-Accept",
    "CustomAttributes": "X-Amzn-SageMaker-Custom-Attributes",
    "InferenceId": "X-Amzn-SageMaker-Inference-Id",
    "RequestTTLSeconds": "X-Amzn-SageMaker-RequestTTLSeconds",
    "InvocationTimeoutSeconds": "X-Amzn-SageMaker-InvocationTimeoutSeconds",
    "S3OutputPathExtension": "X-Amzn-SageMaker-S3OutputPathExtension",
    "Filename": "X-Amzn-SageMaker-Filename",
}
_WIRE = {**_HEADERS, "InputLocation": "X-Amzn-SageMaker-InputLocation"}
#: The largest inline body InvokeEndpointAsync takes, in bytes (its ``Body``, botocore 1.44's service model).
MAX_INLINE = 128_000
#: S3's error codes for an object that is not there (GetObject's, HeadObject's).
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
#: Not computed yet (a result may be ``None``).
_UNSET: Any = object()


class AsyncInferenceModelError(PredictionError):
    """The model failed an asynchronous request: its error, read from the failure location.

    ``status`` and ``message`` are the model's (``status`` 0 when the model was not called: the input could not be
    read, or the request expired in the queue), ``body`` the error as written; ``failure_path`` where it was.
    """

    def __init__(
        self, status: int, message: str, body: bytes = b"", request_id: str | None = None, failure_path: str = ""
    ) -> None:
        super().__init__(status, message, body, request_id)
        self.failure_path = failure_path
        if not status:
            self.args = (message,)


class ObjectNotExistedError(InferenceServerError):
    """Neither the answer nor an error is at its location yet: the inference could still be running."""

    def __init__(self, output_path: str, message: str | None = None) -> None:
        super().__init__(message or f"no result at {output_path} yet: the inference could still be running")
        self.output_path = output_path


class PollingTimeoutError(ObjectNotExistedError):
    """Polling ran out (``WaiterConfig``'s attempts) before the answer or an error appeared."""

    def __init__(self, output_path: str, seconds: float) -> None:
        super().__init__(
            output_path,
            f"no result at {output_path} after polling for {seconds:g} seconds: the inference could still be running",
        )
        self.seconds = seconds


@dataclasses.dataclass(frozen=True)
class WaiterConfig:
    """How :meth:`AsyncInferenceResponse.get_result` polls: the SDK's names and defaults."""

    #: Looks at the output and failure locations, at most.
    max_attempts: int = 60
    #: Seconds between two looks.
    delay: float = 15


def _boto3(what: str) -> Any:
    try:
        return importlib.import_module("boto3")
    except ImportError:
        raise ImportError(f"{what} needs boto3: pip install 'inference-server[aws]'") from None


def _s3_parts(location: str) -> tuple[str, str]:
    """The bucket and key of an ``s3://bucket/key`` URL."""
    bucket, _, key = location.removeprefix("s3://").partition("/")
    if not bucket or not key:
        raise ValueError(f"expected s3://bucket/key, not {location!r}")
    return bucket, key


def _local(location: str) -> str:
    """The absolute path of a local location (a path, or a ``file://`` URL)."""
    return os.path.abspath(location.removeprefix("file://"))


def _timestamp() -> str:
    """The time now as the SDK names its uploads: ``YYYY-mm-dd-HH-MM-SS-mmm``, UTC."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H-%M-%S-%f")[:-3]


class _HTTPAsync:
    """InvokeEndpointAsync on a server's URL: ``POST /endpoints/{name}/async-invocations``."""

    def __init__(self, url: str, endpoint_name: str, timeout: float) -> None:
        self.http = _HTTPTransport(url, timeout)
        self.path = f"{self.http.base}/endpoints/{urllib.parse.quote(endpoint_name, safe='')}/async-invocations"

    def invoke(self, body: bytes | None, args: dict[str, Any]) -> tuple[str | None, str, str | None]:
        headers = {_WIRE[key]: str(value) for key, value in args.items()}
        response, data = self.http.request("POST", self.path, body or b"", headers)
        if response.status >= 300:
            raise _error(response, data)
        output = response.getheader("X-Amzn-SageMaker-OutputLocation")
        if not output:
            raise PredictionError(response.status, "the server accepted the request but named no OutputLocation")
        try:
            inference_id = orjson.loads(bytes(data)).get("InferenceId")
        except (orjson.JSONDecodeError, AttributeError):
            inference_id = None
        return inference_id, output, response.getheader("X-Amzn-SageMaker-FailureLocation")

    def close(self) -> None:
        self.http.close()


class _RuntimeAsync:
    """InvokeEndpointAsync through a boto3 ``sagemaker-runtime`` client."""

    def __init__(self, endpoint_name: str, client: Any) -> None:
        self.endpoint_name = endpoint_name
        self.client = client

    def invoke(self, body: bytes | None, args: dict[str, Any]) -> tuple[str | None, str, str | None]:
        if body is not None:
            operation = self.client.meta.service_model.operation_model("InvokeEndpointAsync")
            if "Body" not in operation.input_shape.members:
                raise ValueError(
                    f"botocore {importlib.import_module('botocore').__version__} cannot send an inline Body to "
                    "InvokeEndpointAsync (a newer one can): upgrade it, or give the AsyncPredictor an input_path "
                    "(s3://bucket/prefix)"
                )
            args = {**args, "Body": body}
        response = self.client.invoke_endpoint_async(EndpointName=self.endpoint_name, **args)
        return response.get("InferenceId"), response["OutputLocation"], response.get("FailureLocation")

    def close(self) -> None:
        pass


class AsyncPredictor:
    """Send data through a serializer to a model asynchronously, and read the answer through a deserializer.

    ``AsyncPredictor("http://127.0.0.1:8080", input_path="s3://bucket/inputs")`` talks to a server started with
    ``serve --async-output``; :meth:`for_endpoint` to a SageMaker asynchronous endpoint. ``input_path`` is where
    :meth:`predict_async` puts the serialized data, one new object or file a call: an S3 prefix, or a local directory
    for a server that writes its answers to a local directory. Without it, data goes inline (up to 128,000 bytes).
    ``s3_client`` reads and writes S3 (default: ``boto3.client("s3")``, made when first needed, which honours
    ``AWS_ENDPOINT_URL_S3``).
    """

    def __init__(
        self,
        url: str,
        serializer: BaseSerializer | Any = None,
        deserializer: BaseDeserializer | Any = None,
        *,
        endpoint_name: str = "local",
        input_path: str | None = None,
        s3_client: Any = None,
        timeout: float = 60.0,
    ) -> None:
        self._setup(serializer, deserializer, _HTTPAsync(url, endpoint_name, timeout), input_path, s3_client)
        self.endpoint_name = endpoint_name

    def _setup(
        self,
        serializer: Any,
        deserializer: Any,
        transport: _HTTPAsync | _RuntimeAsync,
        input_path: str | None,
        s3_client: Any,
    ) -> None:
        self.serializer = serializer if serializer is not None else IdentitySerializer()
        self.deserializer = deserializer if deserializer is not None else BytesDeserializer()
        self.input_path = input_path
        self._transport = transport
        self._s3_client = s3_client

    @classmethod
    def for_endpoint(
        cls,
        endpoint_name: str | Any,
        serializer: BaseSerializer | Any = None,
        deserializer: BaseDeserializer | Any = None,
        *,
        input_path: str | None = None,
        client: Any = None,
        s3_client: Any = None,
    ) -> AsyncPredictor:
        """An AsyncPredictor for a SageMaker endpoint, by name or as the SageMaker SDK v3's ``Endpoint`` resource;
        ``client`` defaults to ``boto3.client("sagemaker-runtime")``."""
        if not isinstance(endpoint_name, str):
            endpoint_name = endpoint_name.endpoint_name
        if client is None:
            client = _boto3("AsyncPredictor.for_endpoint").client("sagemaker-runtime")
        predictor = cls.__new__(cls)
        predictor._setup(serializer, deserializer, _RuntimeAsync(endpoint_name, client), input_path, s3_client)
        predictor.endpoint_name = endpoint_name
        return predictor

    @property
    def s3_client(self) -> Any:
        """The boto3 S3 client this predictor reads and writes S3 with (made when first needed)."""
        if self._s3_client is None:
            self._s3_client = _boto3("reading and writing S3").client("s3")
        return self._s3_client

    def predict_async(
        self,
        data: Any = None,
        input_path: str | None = None,
        initial_args: Mapping[str, Any] | None = None,
        inference_id: str | None = None,
    ) -> AsyncInferenceResponse:
        """Send ``data`` (serialized, put at ``input_path`` if given, else under the predictor's ``input_path``, else
        inline), or the input already at ``input_path``, for asynchronous inference; return where its answer will be.

        ``initial_args`` takes InvokeEndpointAsync's parameters as boto3 names them (``CustomAttributes``,
        ``RequestTTLSeconds``, ``InvocationTimeoutSeconds``, ...); another key is a ``ValueError``.
        """
        if data is None and input_path is None:
            raise ValueError("give data, or the input_path of an input already there")
        args = self._args(initial_args, inference_id)
        body = None
        if data is not None:
            serialized = _request_body(self.serializer.serialize(data))
            if input_path is None and self.input_path is None:
                if len(serialized) > MAX_INLINE:
                    raise ValueError(
                        f"the serialized data is {len(serialized)} bytes, more than the {MAX_INLINE} an inline body "
                        "may be: give the AsyncPredictor an input_path (s3://bucket/prefix or a directory)"
                    )
                body = serialized
            else:
                input_path = self._upload(serialized, input_path)
        if input_path is not None:
            args["InputLocation"] = input_path if input_path.startswith("s3://") else _local(input_path)
        returned_id, output, failure = self._transport.invoke(body, args)
        return AsyncInferenceResponse(self, output, failure, returned_id)

    def predict(
        self,
        data: Any = None,
        input_path: str | None = None,
        initial_args: Mapping[str, Any] | None = None,
        inference_id: str | None = None,
        waiter_config: WaiterConfig | None = None,
    ) -> Any:
        """:meth:`predict_async`, then wait for the answer (``waiter_config``, default :class:`WaiterConfig`'s) and
        return it deserialized; a model error raises :class:`AsyncInferenceModelError`."""
        response = self.predict_async(data, input_path, initial_args, inference_id)
        return response.get_result(waiter_config or WaiterConfig())

    def _args(self, initial_args: Mapping[str, Any] | None, inference_id: str | None) -> dict[str, Any]:
        args: dict[str, Any] = {
            "ContentType": self.serializer.CONTENT_TYPE,
            "Accept": ", ".join(self.deserializer.ACCEPT),
        }
        if initial_args:
            unknown = [key for key in initial_args if key not in _HEADERS]
            if unknown:
                raise ValueError(
                    f"initial_args takes InvokeEndpointAsync's {', '.join(_HEADERS)}, not "
                    f"{', '.join(map(repr, unknown))} (the endpoint is the predictor's; the input is data or "
                    "input_path)"
                )
            args.update(initial_args)
        if inference_id is not None:
            args["InferenceId"] = inference_id
        return args

    def _upload(self, body: bytes, input_path: str | None) -> str:
        """Put ``body`` at ``input_path``, else at a new name under the predictor's ``input_path``; where it is."""
        if input_path is None:
            assert self.input_path is not None
            input_path = f"{self.input_path.rstrip('/')}/{_timestamp()}-{uuid.uuid4()}"
        if input_path.startswith("s3://"):
            bucket, key = _s3_parts(input_path)
            self.s3_client.put_object(Bucket=bucket, Key=key, Body=body, ContentType=self.serializer.CONTENT_TYPE)
            return input_path
        path = _local(input_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as sink:
            sink.write(body)
        return path

    def _read(self, location: str) -> tuple[Any, str | None] | None:
        """The body (a stream, closed by whoever reads it) and content type at ``location``; None if nothing is there.
        A local file has no content type."""
        if location.startswith("s3://"):
            bucket, key = _s3_parts(location)
            client_error = importlib.import_module("botocore.exceptions").ClientError  # (boto3 made the client)
            try:
                found = self.s3_client.get_object(Bucket=bucket, Key=key)
            except client_error as exc:
                if exc.response.get("Error", {}).get("Code") in _MISSING:
                    return None
                raise
            return found["Body"], found.get("ContentType")
        try:
            with open(_local(location), "rb") as source:
                return Body(source.read()), None
        except FileNotFoundError:
            return None

    def _content_type(self) -> str:
        """The media type of a local answer, which has none of its own: the deserializer's first concrete one."""
        return next((accept for accept in self.deserializer.ACCEPT if "*" not in accept), "application/octet-stream")

    def close(self) -> None:
        """Close the kept-alive connections to the server's URL; used again, it opens new ones."""
        self._transport.close()

    def __enter__(self) -> AsyncPredictor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncInferenceResponse:
    """Where an asynchronous request's answer (``output_path``) or error (``failure_path``) will be, and its
    ``inference_id``; :meth:`get_result` reads it."""

    def __init__(
        self,
        predictor_async: AsyncPredictor,
        output_path: str,
        failure_path: str | None,
        inference_id: str | None = None,
    ) -> None:
        self.predictor_async = predictor_async
        self.output_path = output_path
        self.failure_path = failure_path
        self.inference_id = inference_id
        self._result: Any = _UNSET

    def get_result(self, waiter_config: WaiterConfig | None = None) -> Any:
        """The answer, deserialized (kept: a second call reads nothing). Without ``waiter_config``, one look:
        nothing there yet raises :class:`ObjectNotExistedError`; with it, the locations are polled until one is
        there, else :class:`PollingTimeoutError`. The model's error raises :class:`AsyncInferenceModelError`."""
        if self._result is not _UNSET:
            return self._result
        if waiter_config is None:
            found = self._look()
            if found is _UNSET:
                raise ObjectNotExistedError(self.output_path)
            self._result = found
            return found
        for attempt in range(waiter_config.max_attempts):
            if attempt:
                time.sleep(waiter_config.delay)
            found = self._look()
            if found is not _UNSET:
                self._result = found
                return found
        raise PollingTimeoutError(self.output_path, waiter_config.delay * waiter_config.max_attempts)

    def _look(self) -> Any:
        """The deserialized answer if it is there; the model's error raised if that is; else ``_UNSET``."""
        predictor = self.predictor_async
        answer = predictor._read(self.output_path)
        if answer is not None:
            body, content_type = answer
            return predictor.deserializer.deserialize(body, content_type or predictor._content_type())
        if self.failure_path is None:
            return _UNSET
        error = predictor._read(self.failure_path)
        if error is None:
            return _UNSET
        stream = error[0]
        try:
            data = bytes(stream.read())
        finally:
            stream.close()
        message, request_id = _message(data)
        try:
            status = orjson.loads(data).get("status")
        except (orjson.JSONDecodeError, AttributeError):
            status = None
        raise AsyncInferenceModelError(
            status if isinstance(status, int) else 0, message, data, request_id, self.failure_path
        )
