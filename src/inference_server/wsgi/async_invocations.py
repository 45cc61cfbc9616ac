"""SageMaker Runtime's ``InvokeEndpointAsync``, as boto3's ``invoke_endpoint_async`` and the SageMaker SDK's
``AsyncPredictor`` call it: ``POST /endpoints/{name}/async-invocations``, the request in ``X-Amzn-SageMaker-*``
headers (botocore's ``sagemaker-runtime`` service model is the contract), its input at ``InputLocation`` or, since
botocore 1.44, inline as the body (up to 128,000 bytes). It is answered 202 at once, once the request is queued
durably: ``{"InferenceId"}`` in the body, ``X-Amzn-SageMaker-OutputLocation`` and ``-FailureLocation`` in headers
(where botocore reads them). The work is done later (:mod:`inference_server._async_inference`).

What the service checks and botocore does not (it checks only minimums) is checked here, each a 400 with
``x-amzn-ErrorType: ValidationError`` (boto3 raises ``ValidationError`` with the message): the endpoint's name, the
bounds of ``RequestTTLSeconds`` (60 to 21600) and ``InvocationTimeoutSeconds`` (1 to 3600), the inference id's,
``Filename``'s and ``S3OutputPathExtension``'s forms, and exactly one of ``InputLocation`` and a body. A full queue is a
503 ``ThrottlingException`` (botocore retries it). Off (no ``--async-output``): a 404 saying how to turn it on.

Input locations are ``s3://`` URLs, as SageMaker's; a local path (or ``file://``) too when the answers are written
to a local directory, a server that is all on one machine. An https URL is refused: the service's form for S3, which
this server does not read.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from inference_server import _async_inference
from inference_server.errors import BadRequest, NotFound, PayloadTooLarge, ServiceUnavailable
from inference_server.wsgi._replies import Reply, Request, json_reply

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from inference_server.wsgi._service import Service

PATH = "/endpoints/{name}/async-invocations"
#: InvokeEndpointAsync's limits, from its service model.
TTL = (60, 21600, 21600)
TIMEOUT = (1, 3600, 900)
_VALIDATION = [("x-amzn-ErrorType", "ValidationError")]
_ENDPOINT = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
_INFERENCE_ID = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,63}")
_FILENAME = re.compile(r"(?!.*\..*\.)[a-zA-Z0-9][a-zA-Z0-9\-_.]{0,31}")
_EXTENSION = re.compile(r"(?!s3:|https:)[a-zA-Z0-9!_.*'()/\-]{1,512}")
_ASCII = re.compile(r"[\x00-\x7f]{0,1024}")
_DIGITS = re.compile(r"[0-9]{1,6}")


def register(app: Service) -> None:
    """Add ``InvokeEndpointAsync``'s route to ``app``."""
    settings = app.settings

    def invocations(request: Request) -> Reply:
        if settings.async_output is None:
            raise NotFound(
                "asynchronous inference is off: start the server with --async-output URI (a directory, or "
                "s3://bucket/prefix) to serve InvokeEndpointAsync"
            )
        environ = request.environ
        endpoint = request.params["name"]
        if len(endpoint) > 63 or not _ENDPOINT.fullmatch(endpoint):
            _invalid(f"the endpoint name {endpoint[:80]!r} is not one SageMaker allows (up to 63 letters, digits, -)")
        location = _header(environ, "INPUTLOCATION")
        try:
            body = app.read_body(environ, _async_inference.MAX_INLINE)
        except PayloadTooLarge:
            _invalid(f"the Body is larger than {_async_inference.MAX_INLINE} bytes: put it in S3 as InputLocation")
        if location is not None and body:
            _invalid("Body and InputLocation are mutually exclusive: give one of them")
        if location is None and not body:
            _invalid("the input is missing: give InputLocation (X-Amzn-SageMaker-InputLocation) or a Body")
        if location is not None:
            _check_location(location, settings.async_output)
        inference_id = _header(environ, "INFERENCE_ID")
        if inference_id is None:
            inference_id = environ["HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID"] = str(uuid.uuid4())  # (in the access line)
        elif not _INFERENCE_ID.fullmatch(inference_id):
            _invalid("the InferenceId must be 1 to 64 printable ASCII characters, the first not a space")
        filename = _header(environ, "FILENAME")
        if filename is not None and not _FILENAME.fullmatch(filename):
            _invalid("the Filename must be 1 to 32 letters, digits, -, _ or ., with at most one .")
        extension = _header(environ, "S3OUTPUTPATHEXTENSION")
        if extension is not None and (
            not _EXTENSION.fullmatch(extension) or ".." in extension.split("/") or extension.startswith("/")
        ):
            _invalid("the S3OutputPathExtension must be a relative path of letters, digits and !_.*'()/- (no ..)")
        ttl = _seconds(environ, "REQUESTTTLSECONDS", "RequestTTLSeconds", TTL)
        timeout = _seconds(environ, "INVOCATIONTIMEOUTSECONDS", "InvocationTimeoutSeconds", TIMEOUT)
        fields = {}
        for name, header in (("content_type", "CONTENT_TYPE"), ("accept", "ACCEPT")):
            fields[name] = value = _header(environ, header)
            if value is not None and not _ASCII.fullmatch(value):
                _invalid(f"X-Amzn-SageMaker-{header.title().replace('_', '-')} must be up to 1024 ASCII characters")
        custom = _header(environ, "CUSTOM_ATTRIBUTES")
        if custom is not None and not _ASCII.fullmatch(custom):
            _invalid("the CustomAttributes must be up to 1024 ASCII characters")
        output, failure = _async_inference.locations(settings, _async_inference.file_stem(filename, extension))
        inline = location is None
        if inline:
            location = _async_inference.keep_inline(settings, bytes(body))
        received, accepted = time.time(), False
        try:
            accepted = _async_inference.accept(
                settings,
                {
                    "inference_id": inference_id,
                    "endpoint": endpoint,
                    "input": location,
                    "input_location": "(inline)" if inline else location,
                    "inline": inline,
                    "output": output,
                    "failure": failure,
                    **fields,
                    "custom_attributes": custom,
                    "request_id": request.request_id,
                    "timeout": timeout,
                    "ttl": ttl,
                    "received": received,
                    "received_time": _async_inference.timestamp(received),
                },
                ttl,
            )
        finally:
            if inline and not accepted:  # (refused, or the queue failed: its input is not kept)
                Path(str(location)).unlink(missing_ok=True)
        if not accepted:
            raise ServiceUnavailable(
                f"the asynchronous requests' queue is full ({settings.async_max_queue} queued or running; "
                "--async-max-queue): send it again later",
                [("x-amzn-ErrorType", "ThrottlingException"), ("Retry-After", "1")],
            )
        return json_reply(
            202,
            {"InferenceId": inference_id},
            [("X-Amzn-SageMaker-OutputLocation", output), ("X-Amzn-SageMaker-FailureLocation", failure)],
        )

    app.route(PATH, invocations, "POST")


def _invalid(message: str) -> NoReturn:
    raise BadRequest(message, _VALIDATION)


def _header(environ: WSGIEnvironment, name: str) -> str | None:
    value = environ.get(f"HTTP_X_AMZN_SAGEMAKER_{name}")
    return None if value is None or value == "" else str(value)


def _seconds(environ: WSGIEnvironment, header: str, name: str, bounds: tuple[int, int, int]) -> int:
    """A whole number of seconds within ``bounds`` (least, most, default)."""
    least, most, default = bounds
    value = _header(environ, header)
    if value is None:
        return default
    if not _DIGITS.fullmatch(value) or not least <= int(value) <= most:
        _invalid(f"{name} must be a whole number of seconds from {least} to {most}, not {value[:40]!r}")
    return int(value)


def _check_location(location: str, output: str) -> None:
    """Refuse an input location this server cannot or will not read."""
    if len(location) > 1024:
        _invalid("the InputLocation is longer than 1024 characters")
    if location.startswith("s3://"):
        if len(location) <= len("s3://") or location[5] == "/":
            _invalid(f"the InputLocation {location[:100]!r} names no bucket")
        return
    if location.startswith(("https://", "http://")):
        _invalid(f"the InputLocation {location[:100]!r} is an https URL: give an s3:// URL")
    local = location.removeprefix("file://")
    if "://" in local or not local.startswith("/"):
        _invalid(f"the InputLocation {location[:100]!r} is neither an s3:// URL nor an absolute local path")
    if "://" in output and not output.startswith("file://"):
        _invalid(
            f"the InputLocation {location[:100]!r} is a local path, but answers go to {output}: a server that writes "
            "them to S3 reads its inputs from S3 too"
        )
