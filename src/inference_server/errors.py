"""The exceptions of inference-server.

Catch :class:`InferenceServerError` for anything this package raises on purpose::

    InferenceServerError
    ├── ConfigurationError (ValueError)   bad environment variable, option or hook value at start-up
    ├── PluginError                       a plugin failed to import, or a hook does not match its spec
    ├── PredictionError                   the client: a server or endpoint answered with an error status
    ├── HookError                         a hook (the model's code) failed while answering a request: 500
    └── HTTPError (werkzeug HTTPException) an answer with a status, raised on the request path
        ├── BadRequest            400
        │   └── DecodeError (ValueError)  a body the built-in codecs cannot decode
        ├── RequestTimeout        408   the client took longer than the read timeout to send its request
        ├── PayloadTooLarge       413
        ├── URITooLong            414
        ├── UnsupportedMediaType  415
        ├── NotAcceptable         406
        ├── EncodeError           500   no codec can encode the prediction (the model's output, not the client)
        ├── ServiceUnavailable    503
        │   └── ModelLoadError    503   model_fn raised; the reason is in the log
        └── GatewayTimeout        504   handling the request took longer than the timeout

A hook may raise any :class:`werkzeug.exceptions.HTTPException` (these included) to choose the status of the
response; the message is its ``description``.
"""

from __future__ import annotations

import werkzeug.exceptions

__all__ = [
    "BadRequest",
    "ConfigurationError",
    "DecodeError",
    "EncodeError",
    "GatewayTimeout",
    "HTTPError",
    "HookError",
    "InferenceServerError",
    "ModelLoadError",
    "NotAcceptable",
    "PayloadTooLarge",
    "PluginError",
    "PredictionError",
    "RequestTimeout",
    "ServiceUnavailable",
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
    without the exception's message, which may hold request data; ``hint`` says what probably went wrong.
    """

    def __init__(self, hook: str, error: BaseException, summary: str = "", hint: str = "") -> None:
        self.hook = hook
        self.error = error
        self.summary = summary or f"{hook} raised {type(error).__name__}"
        self.hint = hint
        super().__init__(self.summary)


class HTTPError(InferenceServerError, werkzeug.exceptions.HTTPException):
    """An error that becomes an HTTP response with the class's ``code``."""


class BadRequest(HTTPError, werkzeug.exceptions.BadRequest):
    """400: the request is malformed."""


class DecodeError(BadRequest, ValueError):
    """400: the body is not valid for its declared media type."""


class RequestTimeout(HTTPError, werkzeug.exceptions.RequestTimeout):
    """408: the client did not send its whole request within the read timeout."""


class PayloadTooLarge(HTTPError, werkzeug.exceptions.RequestEntityTooLarge):
    """413: the body is larger than ``MaxPayloadInMB``."""


class URITooLong(HTTPError, werkzeug.exceptions.RequestURITooLarge):
    """414: the request's path and query are longer than the server accepts."""


class UnsupportedMediaType(HTTPError, werkzeug.exceptions.UnsupportedMediaType):
    """415: no decoder for the request's ``Content-Type``."""


class NotAcceptable(HTTPError, werkzeug.exceptions.NotAcceptable):
    """406: no encoding of the prediction is acceptable to the client."""


class EncodeError(HTTPError, werkzeug.exceptions.InternalServerError):
    """500: no codec can encode the prediction at all; the message names the prediction's type, not its data."""


class ServiceUnavailable(HTTPError, werkzeug.exceptions.ServiceUnavailable):
    """503: the model is not loaded or not healthy."""


class GatewayTimeout(HTTPError, werkzeug.exceptions.GatewayTimeout):
    """504: handling the request took longer than the server's timeout; the work was stopped or abandoned."""


class ModelLoadError(ServiceUnavailable):
    """503: ``model_fn`` raised, so there is no model to serve; the reason is in the log."""
