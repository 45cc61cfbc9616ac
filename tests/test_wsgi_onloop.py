"""gunicorn's way onto the event loop (``wsgi/_onloop.py``), in process: the WSGI app of a backend with ``on_loop``
runs an invocation on the worker's loop while the calling thread waits, counts it in flight for the drain from before
its body is read until the server closes its answer, reads no body of a request the drain refuses, and answers a hook
that raises ``SystemExit`` with a 500 while the loop goes on serving."""

from __future__ import annotations

import io
import time
from typing import Any

import orjson
import pytest

from inference_server import _plugins, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App
from inference_server.wsgi._invoke import Backend


class _Worker:
    """A serving process's state as the app sees it: the requests it counts in flight, and whether it drains."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self.draining_since = 0.0

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def request_recycle(self, reason: str, kind: str = "stuck") -> None:
        raise AssertionError(f"nothing here asks to be replaced: {reason}")


class _Input(io.BytesIO):
    """A request body that notes how many requests the worker counted in flight at each read."""

    def __init__(self, data: bytes, worker: _Worker) -> None:
        super().__init__(data)
        self.worker = worker
        self.seen: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.seen.append(self.worker.in_flight)
        return super().read(size)


class _Exits:
    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        if data == {"exit": True}:
            raise SystemExit(3)
        return data


def _app(*plugins: Any) -> tuple[App, _Worker]:
    app = App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], list(plugins)), Backend(on_loop=True))
    worker = _Worker()
    app.worker = worker
    return app, worker


def _call(app: App, body: bytes, worker: _Worker) -> tuple[str, _Input, Any]:
    """POST ``body`` to /invocations: the status line, the body's input, and the answer (not closed)."""
    reply: list[str] = []
    stream = _Input(body, worker)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/invocations",
        "QUERY_STRING": "",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "x",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": stream,
    }
    answer = app(environ, lambda status, headers, exc_info=None: reply.append(status))  # type: ignore[arg-type,misc]
    return reply[0], stream, answer


def _body(answer: Any) -> bytes:
    """The answer's bytes, then closed as a WSGI server closes it."""
    try:
        return b"".join(bytes(chunk) for chunk in answer)
    finally:
        if hasattr(answer, "close"):
            answer.close()


def test_an_invocation_counts_in_flight_from_its_body_until_its_answer_is_closed() -> None:
    """The request is counted in flight while its body is read on the server's thread and until the server closes
    the answer the loop made (the drain waits for an upload under way, and for an answer being written)."""
    app, worker = _app()
    status, stream, answer = _call(app, b'{"a": 1}', worker)
    assert status.startswith("200")
    assert stream.seen
    assert set(stream.seen) == {1}
    assert worker.in_flight == 1
    assert orjson.loads(_body(answer)) == {"a": 1}
    assert worker.in_flight == 0


def test_a_request_the_drain_refuses_is_answered_503_without_its_body_read() -> None:
    """While the worker drains, a request that did not arrive before the drain is answered 503 and its body is never
    read (no ``100 Continue``, no upload for nothing); it leaves the count of requests in flight."""
    app, worker = _app()
    worker.draining, worker.draining_since = True, time.monotonic()
    status, stream, answer = _call(app, b'{"a": 1}', worker)
    assert status.startswith("503")
    assert b"shutting down" in _body(answer)
    assert stream.seen == []
    assert worker.in_flight == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_hook_that_raises_systemexit_is_a_500_and_the_loop_serves_on() -> None:
    """A predict_fn raising SystemExit is answered 500 naming it (it would otherwise end the worker's event loop,
    and every request after it would wait for ever); the next request is served."""
    app, worker = _app(_Exits())
    status, _, answer = _call(app, b'{"exit": true}', worker)
    assert status.startswith("500")
    assert b"predict_fn raised SystemExit" in _body(answer)
    status, _, answer = _call(app, b'{"b": 2}', worker)
    assert (status[:3], orjson.loads(_body(answer))) == ("200", {"b": 2})
    assert worker.in_flight == 0
