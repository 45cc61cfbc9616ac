"""SageMaker Runtime's front end, as boto3 and the SageMaker SDK call it (``InvokeEndpoint``):
``POST /endpoints/{name}/invocations`` for any endpoint name, where a container error becomes 424 ``ModelError``;
with ``TargetModel`` (the ``X-Amzn-SageMaker-Target-Model`` header) the model of that name under ``--model-root``,
loaded on first use as SageMaker's front end loads it from S3.

Serving it lets the real clients talk to a local server (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from inference_server.errors import BadRequest
from inference_server.wsgi._invoke import MODEL, Target, target_model
from inference_server.wsgi._replies import Reply, Request, close, error_for, json_reply

if TYPE_CHECKING:
    from inference_server.wsgi._app import App


def register(app: App) -> None:
    """Add the runtime's routes to ``app``."""

    targets: dict[str, Target] = {}

    def target(request: Request) -> Target:
        """The model invoked: the app's own, or the ``TargetModel`` under ``--model-root``."""
        name = target_model(request.environ)
        if name is None:
            return app.target
        models = app.multi_model
        if models is None:
            raise BadRequest(
                f"TargetModel {name!r} was given, but this server serves one model: start it with --model-root DIR "
                "(DIR/<TargetModel> holds each model) to serve a multi-model endpoint"
            )
        request.environ[MODEL] = name
        found = targets.get(name)
        if found is None:  # the model loads within the request's deadline, in the lifecycle
            found = Target(app.pipeline, functools.partial(models.target_model, name))
            if len(targets) < 10_000:
                targets[name] = found
        return found

    def invocations(request: Request) -> Reply:
        """``/invocations`` as SageMaker Runtime answers it: a container error becomes 424 ``ModelError``."""
        invoked = target(request)
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

    app.route("/endpoints/{name}/invocations", invocations, "POST")
