"""SageMaker Runtime's front end, as boto3 and the SageMaker SDK call it (``InvokeEndpoint``):
``POST /endpoints/{name}/invocations`` for any endpoint name, where a container error becomes 424 ``ModelError``.

Serving it lets the real clients talk to a local server (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference_server.wsgi._replies import Reply, Request, close, error_for, json_reply

if TYPE_CHECKING:
    from inference_server.wsgi._app import App


def register(app: App) -> None:
    """Add the runtime's routes to ``app``."""

    def invocations(request: Request) -> Reply:
        """``/invocations`` as SageMaker Runtime answers it: a container error becomes 424 ``ModelError``."""
        try:
            status, headers, body = app.lifecycle.invoke(request, app.target)
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

    app.route("/endpoints/{name}/invocations", invocations, "POST")
