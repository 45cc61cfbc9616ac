"""What a protocol module (:mod:`.sagemaker`, :mod:`.runtime`, :mod:`.models`, :mod:`.v2`, :mod:`.prometheus`) may
use of the app: :class:`Service`. A protocol adds routes; a route that invokes the model is an
:class:`~inference_server.wsgi._replies.Invoking` handed the lifecycle's ``invoke``, and asks the service which
:class:`~inference_server.wsgi._invoke.Target` a request invokes; the rest is read-only: the settings, the hooks'
pipeline, the models of a multi-model endpoint, readiness (:class:`~inference_server.wsgi._invoke.Health`) and the
metrics' recorder. :class:`~inference_server.wsgi._app.App` is the one implementation; protocols never import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from inference_server import metrics
    from inference_server._multimodel import MultiModel
    from inference_server._pipeline import Pipeline
    from inference_server._settings import Settings
    from inference_server.wsgi._invoke import Health, Target
    from inference_server.wsgi._replies import Handler, Invoking, Request


class Service(Protocol):
    """The app as its protocols see it."""

    @property
    def settings(self) -> Settings:
        """The server's settings."""
        ...

    @property
    def pipeline(self) -> Pipeline:
        """The hooks: execution parameters, decoding limits, the plugins (``pm``), the script served."""
        ...

    @property
    def multi_model(self) -> MultiModel | None:
        """The models loaded by name (``--multi-model``, ``--model-root``), else None."""
        ...

    @property
    def health(self) -> Health:
        """Whether the server can take requests now."""
        ...

    @property
    def recorder(self) -> metrics.Recorder | None:
        """Where requests are counted (``--metrics``), else None."""
        ...

    @property
    def target(self) -> Target:
        """What ``/invocations`` runs: the app's own model."""
        ...

    def route(self, path: str, handler: Handler | Invoking, method: str = "GET") -> None:
        """Answer ``method`` requests for ``path`` with ``handler``."""
        ...

    def invoked(self, request: Request) -> Target:
        """What a SageMaker invocation runs: the app's model, or its ``TargetModel``'s."""
        ...

    def model_target(self, name: str, target_model: bool = False) -> Target:
        """What an invocation of the multi-model endpoint's model ``name`` runs."""
        ...

    def read_body(self, environ: WSGIEnvironment, limit: int) -> bytearray | bytes:
        """A control route's body, at most ``limit`` bytes (else 413)."""
        ...

    def read_json(
        self, environ: WSGIEnvironment, limit: int, example: str = "", empty_ok: bool = False
    ) -> dict[str, Any]:
        """A control route's body (at most ``limit`` bytes) as a JSON object, else a 400 saying what is wrong."""
        ...
