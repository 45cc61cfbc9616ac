"""The exceptions of inference-server.

Catch :class:`InferenceServerError` for anything this package raises on purpose::

    InferenceServerError
    ├── ConfigurationError (ValueError)   bad environment variable, option or hook value at start-up
    ├── PluginError                       a plugin failed to import, or a hook does not match its spec
    ├── PredictionError                   the client: a server or endpoint answered with an error status
    ├── HookError                         a hook (the model's code) failed while answering a request: 500
    ├── TransformError                    a Batch Transform input file could not be transformed (the file named)
    └── HTTPError                         an answer with a status (``code``) and a message (``description``)
        ├── BadRequest            400
        │   └── DecodeError (ValueError)  a body the built-in codecs cannot decode
        ├── Forbidden             403   a model directory outside those the server loads models from
        ├── NotFound              404   no such model (multi-model endpoints), or its directory is missing
        ├── RequestTimeout        408   the client took longer than the read timeout to send its request
        ├── Conflict              409   a model of that name is loaded already
        ├── LengthRequired        411   a chunked body on a server that cannot tell whether it arrived whole
        ├── PayloadTooLarge       413
        ├── URITooLong            414
        ├── UnsupportedMediaType  415
        ├── NotAcceptable         406
        ├── EncodeError           500   no codec can encode the prediction (the model's output, not the client)
        ├── ServiceUnavailable    503
        │   └── ModelLoadError    503   model_fn raised; the reason is in the log
        ├── GatewayTimeout        504   handling the request took longer than the timeout
        └── InsufficientStorage   507   a model does not fit (memory, --max-models): SageMaker unloads others

A hook may raise these, or any :class:`werkzeug.exceptions.HTTPException` (as in inference-server 1.x), to choose the
status of the response; the message is its ``description``. They are not werkzeug's classes, so that the client and
the codecs load no part of werkzeug.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

__all__ = [
    "BadRequest",
    "ConfigurationError",
    "Conflict",
    "DecodeError",
    "EncodeError",
    "Forbidden",
    "GatewayTimeout",
    "HTTPError",
    "HookError",
    "InferenceServerError",
    "InsufficientStorage",
    "LengthRequired",
    "ModelLoadError",
    "NotAcceptable",
    "NotFound",
    "PayloadTooLarge",
    "PluginError",
    "PredictionError",
    "RequestTimeout",
    "ServiceUnavailable",
    "TransformError",
    "URITooLong",
    "UnsupportedMediaType",
]


class InferenceServerError(Exception):
    """Base class of every exception inference-server raises on purpose."""


class ConfigurationError(InferenceServerError, ValueError):
    """A setting (environment variable, command-line option or hook value) is invalid."""


class PluginError(InferenceServerError):
    """A plugin could not be loaded: it failed to import or one of its hooks does not match the spec."""


class PredictionError(InferenceServerError):
    """The client's view of an error answer: ``status`` (the model's own for an endpoint), ``message``, ``body``."""

    def __init__(self, status: int, message: str, body: bytes = b"", request_id: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body
        self.request_id = request_id


class HookError(InferenceServerError):
    """A hook raised (or returned something unusable) while answering a request: the server answers 500.

    ``hook`` names it and ``error`` is what it raised (also the ``__cause__``); ``summary`` says it in a few words
    without the exception's message, which may hold request data.
    """

    def __init__(self, hook: str, error: BaseException, summary: str = "") -> None:
        self.hook = hook
        self.error = error
        self.summary = summary or f"{hook} raised {type(error).__name__}"
        super().__init__(self.summary)


class TransformError(InferenceServerError):
    """A Batch Transform input file could not be transformed: its framing, a record over the limit, a failed
    request. The message starts with the file's name; the other files of the job go on."""


class HTTPError(InferenceServerError):
    """An error that becomes an HTTP response with the class's ``code``; ``description`` is its message."""

    code: ClassVar[int] = 500
    description: str = "The server could not answer the request."

    def __init__(self, description: str | None = None, headers: Sequence[tuple[str, str]] = ()) -> None:
        if description is not None:
            self.description = description
        #: Headers the response carries beside the JSON error body (e.g. ``Retry-After``).
        self.headers = list(headers)
        super().__init__(self.description)


class BadRequest(HTTPError):
    """400: the request is malformed."""

    code = 400
    description = "The request is malformed."


class DecodeError(BadRequest, ValueError):
    """400: the body is not valid for its declared media type."""


class Forbidden(HTTPError):
    """403: a model directory outside those the server may load models from (``--model-root``,
    ``--allow-model-dir``, SageMaker's ``/opt/ml/models``); the answer names none of them, the server's log does."""

    code = 403
    description = "The model directory is outside the directories this server loads models from."


class NotFound(HTTPError):
    """404: no model of that name is loaded (multi-model endpoints), or the model's directory does not exist."""

    code = 404
    description = "Not found."


class Conflict(HTTPError):
    """409: a model of that name is loaded (or being loaded) already."""

    code = 409
    description = "The model is loaded already."


class RequestTimeout(HTTPError):
    """408: the client did not send its whole request within the read timeout."""

    code = 408
    description = "The request was not received in time."


class LengthRequired(HTTPError):
    """411: a chunked body on a server that cannot tell the app whether it arrived whole (granian)."""

    code = 411
    description = "A Content-Length is required."


class PayloadTooLarge(HTTPError):
    """413: the body is larger than ``MaxPayloadInMB``."""

    code = 413
    description = "The body is too large."


class URITooLong(HTTPError):
    """414: the request's path and query are longer than the server accepts."""

    code = 414
    description = "The path and query are too long."


class UnsupportedMediaType(HTTPError):
    """415: no decoder for the request's ``Content-Type``."""

    code = 415
    description = "The body's media type is not supported."


class NotAcceptable(HTTPError):
    """406: no encoding of the prediction is acceptable to the client."""

    code = 406
    description = "No acceptable representation of the answer exists."


class EncodeError(HTTPError):
    """500: no codec can encode the prediction at all; the message names the prediction's type, not its data."""

    code = 500
    description = "The prediction could not be encoded."


class ServiceUnavailable(HTTPError):
    """503: the model is not loaded or not healthy, the server is shutting down, or its queue is full."""

    code = 503
    description = "The model is not available."


class GatewayTimeout(HTTPError):
    """504: handling the request took longer than the server's timeout; the work was stopped or abandoned."""

    code = 504
    description = "The request took longer than the server's timeout."


class ModelLoadError(ServiceUnavailable):
    """503: ``model_fn`` raised, so there is no model to serve; the reason is in the log."""


class InsufficientStorage(HTTPError):
    """507: the model does not fit: ``model_fn`` ran out of memory, or the server's ``--max-models`` or
    ``--max-model-memory`` is reached. SageMaker answers it by unloading models it has not used lately."""

    code = 507
    description = "The model does not fit."
