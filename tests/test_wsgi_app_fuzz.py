"""Hypothesis drives the WSGI app with random requests: every answer is a well-formed 2xx/4xx, never a crash."""

from __future__ import annotations

import io
import logging
import wsgiref.validate
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_server import _plugins, codecs
from inference_server._settings import Settings
from inference_server.wsgi._app import App

MEDIA_TYPES = [
    "application/json",
    "application/jsonlines",
    "application/x-npy",
    "application/x-npz",
    "application/vnd.apache.arrow.stream",
    "application/vnd.apache.arrow.file",
    "application/octet-stream",
    "text/csv",
    "text/plain",
    "image/png",
    "*/*",
    "application/*",
    "",
]
PATHS = ["/ping", "/invocations", "/execution-parameters", "/openapi.json", "/endpoints/my-model/invocations", "/"]
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
VALID_BODIES = [
    (b'{"instances": [[1, 2], [3, 4]]}', "application/json"),
    (codecs.dumps(np.arange(12.0).reshape(3, 4), "application/x-npy"), "application/x-npy"),
    (codecs.dumps({"a": np.arange(3), "b": np.ones((2, 2))}, "application/x-npz"), "application/x-npz"),
    (b"1,2\n3,4\n", "text/csv"),
    (b'{"a": 1}\n{"a": 2}\n', "application/jsonlines"),
]


@pytest.fixture(scope="module")
def app() -> Any:
    """The default plugins (an echo model) behind ``wsgiref.validate``, which asserts WSGI compliance."""
    return wsgiref.validate.validator(App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], [])))


def _call(app: Any, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    path, _, query = path.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in headers.items():
        key = name.upper().replace("-", "_")
        environ[key if key == "CONTENT_TYPE" else f"HTTP_{key}"] = value
    answer: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer["status"], answer["headers"] = status, dict(response_headers)
        return lambda data: None

    iterable = app(environ, start_response)
    try:
        content = b"".join(iterable)
    finally:
        iterable.close()
    return int(answer["status"].split()[0]), answer["headers"], content


def _check(status: int, headers: dict[str, str], content: bytes, method: str) -> None:
    assert 200 <= status < 500, (status, content[:300])
    assert headers["X-Request-Id"]
    if method != "HEAD":
        assert int(headers["Content-Length"]) == len(content)
    if status == 424 and method != "HEAD":  # SageMaker Runtime's ModelError wraps the model's own answer
        error = orjson.loads(content)
        assert 400 <= error["OriginalStatusCode"] < 500
        assert error["Message"]
    elif status >= 400 and method != "HEAD":
        error = orjson.loads(content)
        assert error["status"] == status
        assert error["message"]


requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(METHODS),
        "path": st.one_of(st.sampled_from(PATHS), st.text(min_size=1, max_size=40).map(lambda p: "/" + p)),
        "headers": st.dictionaries(
            st.sampled_from(["Content-Type", "Accept", "X-Request-Id", "X-Amzn-SageMaker-Custom-Attributes", "X-Foo"]),
            st.one_of(st.sampled_from(MEDIA_TYPES), HEADER_TEXT),
            max_size=4,
        ),
        "body": st.one_of(st.binary(max_size=2000), st.sampled_from([body for body, _ in VALID_BODIES])),
    }
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_random_requests_get_2xx_or_4xx(app: Any, request: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Any method, path, headers (random Content-Type and Accept) and body: a well-formed 2xx or 4xx answer."""
    with caplog.at_level(logging.ERROR, logger="inference_server"):
        status, headers, content = _call(app, request["method"], request["path"], request["headers"], request["body"])
    _check(status, headers, content, request["method"])
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    valid=st.sampled_from(VALID_BODIES),
    cut=st.integers(min_value=0, max_value=4000),
    flips=st.lists(st.tuples(st.integers(min_value=0, max_value=4000), st.integers(0, 255)), max_size=6),
    accept=st.sampled_from(MEDIA_TYPES),
)
def test_mutated_bodies_get_2xx_or_4xx(app: Any, valid: tuple[bytes, str], cut: int, flips: Any, accept: str) -> None:
    """Valid bodies of every codec, truncated and with bytes flipped, with any Accept: 2xx or a clean 4xx."""
    body, content_type = valid
    mutated = bytearray(body[: cut % (len(body) + 1)])
    for position, value in flips:
        if mutated:
            mutated[position % len(mutated)] = value
    headers = {"Content-Type": content_type, "Accept": accept}
    status, response_headers, content = _call(app, "POST", "/invocations", headers, bytes(mutated))
    _check(status, response_headers, content, "POST")


def test_valid_bodies_round_trip(app: Any) -> None:
    """The fuzzers' valid bodies are answered 200 in their own media type (so the mutations start from success)."""
    for body, content_type in VALID_BODIES:
        status, headers, _ = _call(
            app, "POST", "/invocations", {"Content-Type": content_type, "Accept": content_type}, body
        )
        assert (status, headers["Content-Type"]) == (200, content_type)
