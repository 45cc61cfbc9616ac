"""SageMaker Runtime's front end, as boto3 and the SageMaker SDK call it (``InvokeEndpoint``):
``POST /endpoints/{name}/invocations`` for any endpoint name, where a container error becomes 424 ``ModelError``;
with ``TargetModel`` (the ``X-Amzn-SageMaker-Target-Model`` header) the model of that name under ``--model-root``,
loaded on first use as SageMaker's front end loads it from S3.

Serving it lets the real clients talk to a local server (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from inference_server import codecs
from inference_server.wsgi import _eventstream
from inference_server.wsgi._invoke import StreamFailed
from inference_server.wsgi._replies import Reply, Request, close, error_for, json_reply

if TYPE_CHECKING:
    from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")


def register(app: App) -> None:
    """Add the runtime's routes to ``app``."""

    def invocations(request: Request) -> Reply:
        """``/invocations`` as SageMaker Runtime answers it: a container error becomes 424 ``ModelError``; a
        ``TargetModel`` refused before any model is involved is SageMaker Runtime's own 400, as its ValidationError."""
        invoked = app.invoked(request)
        try:
            status, headers, body = app.lifecycle.invoke(request, invoked)
        except Exception as exc:
            status, headers, body = error_for(exc, request.request_id, request.environ, app.settings.debug)
        if status < 400:
            headers.append(("X-Amzn-Invoked-Production-Variant", "AllTraffic"))
            return status, headers, body
        original = b"".join(bytes(chunk) for chunk in body).decode(errors="replace")
        close(body)
        kind = "client" if status < 500 else "server"
        return json_reply(
            424,
            {
                "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
                "OriginalStatusCode": status,
                "OriginalMessage": original,
                "Message": f'Received {kind} error ({status}) from model with message "{original}".',
            },
            [("x-amzn-ErrorType", "ModelError")],
        )

    def response_stream(request: Request) -> Reply:
        """``InvokeEndpointWithResponseStream``: the answer as SageMaker Runtime sends it, each chunk a ``PayloadPart``
        event of the ``application/vnd.amazon.eventstream`` framing (see :mod:`._eventstream`), the model's media
        type in ``X-Amzn-SageMaker-Content-Type``; a stream that fails goes on with a ``ModelStreamError`` event and
        ends. An error before the first chunk is the 424 ``ModelError`` of ``invocations``."""
        environ = request.environ
        # the model's answer's media type comes as X-Amzn-SageMaker-Accept (Accept is about the framing)
        environ["HTTP_ACCEPT"] = environ.get("HTTP_X_AMZN_SAGEMAKER_ACCEPT") or "*/*"
        status, headers, body = invocations(request)
        if status >= 400:
            return status, headers, body
        media_type = next((value for key, value in headers if key == "Content-Type"), "application/octet-stream")
        kept = [(k, v) for k, v in headers if k not in ("Content-Type", "Content-Length")]
        framed = _EventStream(body, request.request_id)
        return (
            200,
            [("Content-Type", _eventstream.MEDIA_TYPE), ("X-Amzn-SageMaker-Content-Type", media_type), *kept],
            framed,
        )

    app.route("/endpoints/{name}/invocations", invocations, "POST")
    app.route("/endpoints/{name}/invocations-response-stream", response_stream, "POST")


class _EventStream:
    """A body's chunks as ``PayloadPart`` events; a failed stream's end as a ``ModelStreamError`` event."""

    def __init__(self, body: Iterable[codecs.Buffer], request_id: str) -> None:
        self._body = body
        self._request_id = request_id

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._body:
                yield from _eventstream.payload_parts(chunk)
        except StreamFailed as exc:
            yield _eventstream.model_stream_error(exc.message, exc.code)
        except Exception:  # our bug: SageMaker Runtime's own failure event says so
            logger.exception("Request %s: the response stream failed", self._request_id)
            yield _eventstream.internal_stream_failure(
                f"the server failed; see the server log for request {self._request_id}"
            )

    def close(self) -> None:
        close(self._body)
