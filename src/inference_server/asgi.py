"""inference-server as an ASGI 3 application, for any ASGI server: uvicorn, hypercorn, Ray Serve's ingress.

The same app as ``serve``'s, on the event-loop request path (the routes that invoke the model on the server's loop,
async hooks on it, sync hooks on a thread; the others bridged): every protocol (SageMaker's routes, the runtime's
response stream, ``/models``, the Open Inference Protocol's ``/v2``, ``/metrics``). Settings come from the same
variables as ``serve``'s (``INFERENCE_SERVER_*``, ``SAGEMAKER_*``), or from a mapping of them::

    uvicorn --factory inference_server.asgi:create_app --host 127.0.0.1 --port 8080

What ``serve`` adds around the app stays with ``serve``: worker processes sharing one loaded model, the drain on
SIGTERM, the replacement of stuck workers, the metrics summed over workers. Under another server the process is
that server's: the model is loaded once per process, at the lifespan's startup (a model or plugin that cannot load
fails the startup, with the reason; or with the first request when the
server sends no lifespan events), and ``/metrics`` counts that process's requests.

The app holds only its settings until it starts, so it can be pickled and started elsewhere: that is how
:mod:`inference_server.ray_serve` gives it to each replica.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from inference_server import _logging, _plugins
from inference_server._settings import Settings
from inference_server.wsgi._app import App, Backend
from inference_server.wsgi._asgi import AsgiFront

__all__ = ["Application", "create_app"]

#: What the app is told under an ASGI server: its WSGI routes are called on the front's bridge threads with the body
#: read into memory, as a PEP 3333 server would hand it over; HEAD is answered by the app.
ASGI_BACKEND = Backend(check_head=True)


class Application:
    """An ASGI 3 application that builds inference-server's app (and loads the model) when its server starts it.

    ``environ``: the variables that set it up (``Settings.environ()`` and ``INFERENCE_SERVER_PLUGINS``), put in the
    process's environment when it starts, so that the hooks and ``create_app`` in user code see what ``serve``'s
    would; None: the process's environment as it is.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = dict(environ) if environ is not None else None
        self._front: AsgiFront | None = None
        self._starting: asyncio.Lock | None = None
        self._failed: BaseException | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"environ": self.environ}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["environ"])  # type: ignore[misc]

    @property
    def app(self) -> App | None:
        """inference-server's app, once started."""
        return None if self._front is None else self._front.app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        front = self._front if self._front is not None else await self.start()
        await front(scope, receive, send)

    async def start(self) -> AsgiFront:
        """Build the app and load the model (on a thread: the loop keeps turning), once."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._failed is not None:  # (once: a server without lifespan events would build it for each request)
                raise self._failed
            if self._front is None:
                try:
                    front = await asyncio.to_thread(self._build)
                except Exception as exc:
                    self._failed = exc
                    raise
                front.adopt(asyncio.get_running_loop())
                self._front = front
        return self._front

    def _build(self) -> AsgiFront:
        from inference_server.server import load_model

        if self.environ is not None:
            os.environ.update(self.environ)
        settings = Settings.from_env()
        _logging.configure(settings.log_level_number, _logging.resolve_format(settings.log_format), background=True)
        app = App(settings, _plugins.manager(), ASGI_BACKEND)
        if app.recorder is not None:
            app.recorder.start_flushing()
        load_model(app, required=True)  # (a model that cannot load fails the startup: the server says why)
        return AsgiFront(app)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:  # a plugin that cannot load, a setting that is wrong: the server says why
                    await send({"type": "lifespan.startup.failed", "message": f"inference-server: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._front is not None:
                    self._front.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app() -> Application:
    """The app factory for ASGI servers (``uvicorn --factory inference_server.asgi:create_app``): settings from the
    environment."""
    return Application()
