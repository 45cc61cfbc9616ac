"""The HTTP contract, end to end through real ``inference-server serve`` processes, and WSGI compliance in-process."""

from __future__ import annotations

import contextlib
import http.client
import io
import re
import wsgiref.validate
from pathlib import Path
from typing import Any

import orjson
import pytest
import werkzeug.exceptions
import werkzeug.test

from inference_server import _plugins, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App, Routes

FORECAST = {
    "wind": "Southwesterly gale force 8 continuing",
    "sea_state": "Rough or very rough, occasionally moderate in southeast.",
    "weather": "Thundery showers.",
    "visibility": "Good, occasionally poor.",
}

FRAGILE = """
    import inference_server
    from werkzeug.exceptions import UnsupportedMediaType

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        if content_type.startswith("image/"):
            raise UnsupportedMediaType("images are not for this model")
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if data == b"boom":
            raise RuntimeError("secret internals exploded")
        return data.upper()
"""


def test_seed_example_answers_the_forecast(servers: Any) -> None:
    """The seed's shipping forecast, installed by entry point, answers a JSON request over HTTP."""
    server = servers.start(plugins=["shipping_forecast"])
    reply = server.request("POST", "/invocations", b'{"location": "Fair Isle"}', {"Content-Type": "application/json"})
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == FORECAST


def test_no_accept_header_means_anything(servers: Any) -> None:
    """A request without Accept (curl's default) satisfies the seed's ``assert accept.accept_json``."""
    server = servers.start(plugins=["shipping_forecast"])
    with contextlib.closing(server.connection()) as connection:
        connection.putrequest("POST", "/invocations", skip_accept_encoding=True)
        body = b'{"location": "Dogger"}'
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        assert (response.status, orjson.loads(response.read())) == (200, FORECAST)


def test_unknown_path_wrong_method_and_head(servers: Any) -> None:
    """Unknown paths are 404, wrong methods 405 with Allow, and HEAD works where GET does."""
    server = servers.start(plugins=[])
    assert server.request("GET", "/nope").status == 404
    reply = server.request("GET", "/invocations")
    assert reply.status == 405
    assert reply.headers["Allow"] == "POST"
    reply = server.request("POST", "/ping")
    assert (reply.status, reply.headers["Allow"]) == (405, "GET, HEAD")
    head = server.request("HEAD", "/execution-parameters")
    get = server.request("GET", "/execution-parameters")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["Content-Length"] == get.headers["Content-Length"] == str(len(get.body))


def test_hook_error_is_500_without_traceback_and_server_keeps_serving(servers: Any, plugin_site: Any) -> None:
    """A hook's exception is a JSON 500 with the request id; the traceback is only in the log."""
    plugin_site.add("fragile", FRAGILE)
    server = servers.start()
    reply = server.request("POST", "/invocations", b"boom", {"X-Request-Id": "req-42"})
    assert reply.status == 500
    assert reply.json()["request_id"] == "req-42"
    assert "secret internals" not in reply.body.decode()
    assert "Traceback" not in reply.body.decode()
    assert server.request("POST", "/invocations", b"calm").body == b"CALM"
    assert "RuntimeError: secret internals exploded" in server.output()


def test_the_500_names_the_hook_and_points_to_the_log(servers: Any, plugin_site: Any) -> None:
    """The 500's message says which hook raised what, and the request id to find it in the log; no data."""
    plugin_site.add("fragile", FRAGILE)
    server = servers.start()
    reply = server.request("POST", "/invocations", b"boom", {"X-Request-Id": "req-7"})
    assert reply.json()["message"] == "predict_fn raised RuntimeError; see the server log for request req-7"
    assert "Request req-7 POST /invocations: predict_fn raised RuntimeError" in server.output()


def test_debug_puts_the_exception_and_traceback_in_the_500(servers: Any, plugin_site: Any) -> None:
    """With --debug the 500 carries the exception's message and its traceback (never on by default)."""
    plugin_site.add("fragile", FRAGILE)
    server = servers.start("--debug")
    answer = server.request("POST", "/invocations", b"boom").json()
    assert answer["message"].endswith("RuntimeError: secret internals exploded")
    assert "in predict_fn" in answer["traceback"]


def test_a_body_of_unknown_type_that_the_model_fails_on_is_415(servers: Any, plugin_site: Any) -> None:
    """A typo in Content-Type (or curl -d's form type) sends the model bytes; when it then fails, the answer is a
    415 naming the type and the known ones (with the curl hint for the form type), not a 500; a model that takes the
    bytes answers 200; a body without any Content-Type is said once in the log."""
    plugin_site.add(
        "locations",
        """
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            if data == b"bytes welcome":
                return data
            return data["location"]
        """,
    )
    server = servers.start()
    reply = server.request("POST", "/invocations", b'{"location": "Dogger"}', {"Content-Type": "application/jsn"})
    assert reply.status == 415
    assert reply.json()["message"] == (
        "the Content-Type application/jsn matches no codec, and the model could not use the body as bytes "
        "(predict_fn raised TypeError); known types: application/x-npy, application/x-npz, "
        "application/vnd.apache.arrow.stream, application/vnd.apache.arrow.file, application/json, "
        "application/jsonlines, text/csv, text/plain, application/octet-stream"
    )
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    reply = server.request("POST", "/invocations", b'{"location": "Dogger"}', form)
    assert reply.status == 415
    assert "is what curl -d sends when no type is given" in reply.json()["message"]
    assert server.request("POST", "/invocations", b"bytes welcome", form).body == b"bytes welcome"
    server.request("POST", "/invocations", b"one", {"Content-Type": ""})
    server.request("POST", "/invocations", b"two", {"Content-Type": ""})
    assert server.output().count("A request came without Content-Type, so the model receives its body as bytes") == 1


def test_model_fn_returning_none_is_503_with_the_reason(servers: Any, plugin_site: Any) -> None:
    """A model_fn that returns None is a failed load, not a silent echo model: /ping and invocations say 503."""
    plugin_site.add(
        "forgot_return",
        """
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            model = len
        """,
    )
    server = servers.start("--no-preload")  # (in a worker: with --preload, serve stops at start-up)
    assert server.request("GET", "/ping").status == 503
    reply = server.request("POST", "/invocations", b"x")
    assert reply.status == 503
    assert "model_fn of 'forgot_return' returned None: return the model" in reply.json()["message"]


def test_hook_raising_http_exception_keeps_its_status(servers: Any, plugin_site: Any) -> None:
    """A hook raising werkzeug's UnsupportedMediaType gives 415 with the hook's message."""
    plugin_site.add("fragile", FRAGILE)
    server = servers.start()
    reply = server.request("POST", "/invocations", b"\x89PNG", {"Content-Type": "image/png"})
    assert reply.status == 415
    assert reply.json()["message"] == "images are not for this model"


def test_ping_is_503_when_ping_fn_says_unhealthy(servers: Any, plugin_site: Any) -> None:
    """``ping_fn`` returning False makes /ping 503 saying so, in its body and in the log."""
    plugin_site.add(
        "sick",
        """
        import inference_server

        @inference_server.plugin_hook
        def ping_fn(model):
            return False
        """,
    )
    server = servers.start()
    reply = server.request("GET", "/ping", headers={"Accept": "*/*"})
    assert (reply.status, reply.json()["message"]) == (503, "ping_fn returned False")
    assert "ping_fn returned False" in server.output()


def test_failing_model_fn_gives_503_and_logs_the_reason(servers: Any, plugin_site: Any) -> None:
    """A ``model_fn`` that raises leaves the server up, answering 503 on /ping and /invocations."""
    plugin_site.add(
        "broken",
        """
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            raise FileNotFoundError("model.bin is missing from " + model_dir)
        """,
    )
    server = servers.start("--model-dir", "/nonexistent/model", "--no-preload")  # (a worker that failed)
    assert server.request("GET", "/ping").status == 503
    reply = server.request("POST", "/invocations", b"x")
    assert reply.status == 503
    assert "model.bin is missing" in reply.json()["message"]
    assert "FileNotFoundError: model.bin is missing from /nonexistent/model" in server.output()


def test_custom_attributes_and_request_id_are_echoed(servers: Any) -> None:
    """Custom attributes come back on the response; X-Request-Id is kept when given, else generated."""
    server = servers.start(plugins=[])
    reply = server.request(
        "POST",
        "/invocations",
        b"abc",
        {"X-Amzn-SageMaker-Custom-Attributes": "trace=1,mode=fast", "X-Request-Id": "abc-123"},
    )
    assert reply.status == 200
    assert reply.headers["X-Amzn-SageMaker-Custom-Attributes"] == "trace=1,mode=fast"
    assert reply.headers["X-Request-Id"] == "abc-123"
    generated = server.request("GET", "/ping").headers["X-Request-Id"]
    assert len(generated) == 32
    assert generated != server.request("GET", "/ping").headers["X-Request-Id"]


def test_output_fn_may_set_custom_attributes(servers: Any, plugin_site: Any) -> None:
    """A third item from ``output_fn`` adds headers, and its custom attributes win over the echo."""
    plugin_site.add(
        "attributes",
        """
        import inference_server

        @inference_server.plugin_hook
        def output_fn(prediction, accept):
            return b"ok", "text/plain", {"X-Amzn-SageMaker-Custom-Attributes": "answered"}
        """,
    )
    server = servers.start()
    reply = server.request("POST", "/invocations", b"", {"X-Amzn-SageMaker-Custom-Attributes": "asked"})
    assert reply.headers.get_all("X-Amzn-SageMaker-Custom-Attributes") == ["answered"]


def test_two_plugin_packages_combine_hooks(servers: Any, plugin_site: Any) -> None:
    """A shared JSON plugin and a model plugin in different packages serve together (the seed's tip)."""
    plugin_site.add(
        "json_codec",
        """
        import orjson
        import inference_server

        @inference_server.plugin_hook
        def input_fn(input_data, content_type):
            return orjson.loads(input_data)

        @inference_server.plugin_hook
        def output_fn(prediction, accept):
            return orjson.dumps(prediction), "application/json"
        """,
    )
    plugin_site.add(
        "doubler",
        """
        import inference_server

        @inference_server.plugin_hook
        def model_fn(model_dir):
            return lambda values: [2 * v for v in values]
        """,
    )
    server = servers.start()
    reply = server.request("POST", "/invocations", b"[1, 2, 3]", {"Content-Type": "application/json"})
    assert (reply.status, reply.json()) == (200, [2, 4, 6])


def test_body_over_max_payload_is_413(servers: Any) -> None:
    """A declared length over SAGEMAKER_MAX_PAYLOAD_IN_MB is refused with 413, and the server keeps serving."""
    server = servers.start(plugins=[], env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"})
    with contextlib.closing(server.connection()) as connection:
        connection.putrequest("POST", "/invocations")
        connection.putheader("Content-Length", str(2 << 20))
        connection.endheaders()  # the answer comes before the body: a client still sending might see a reset
        response = connection.getresponse()
        assert response.status == 413
        assert "limit" in orjson.loads(response.read())["message"]
    assert server.request("POST", "/invocations", b"small").body == b"small"


def test_execution_parameters_from_environment(servers: Any) -> None:
    """/execution-parameters reports SageMaker's variables, in SageMaker's JSON spelling."""
    env = {
        "SAGEMAKER_BATCH_STRATEGY": "SINGLE_RECORD",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20",
    }
    server = servers.start(plugins=[], env=env)
    assert server.request("GET", "/execution-parameters").json() == {
        "BatchStrategy": "SingleRecord",
        "MaxConcurrentTransforms": 4,
        "MaxPayloadInMB": 20,
    }


def test_execution_parameters_from_hooks(servers: Any, plugin_site: Any) -> None:
    """Hooks override the environment's execution parameters."""
    plugin_site.add(
        "tuned",
        """
        import inference_server

        @inference_server.plugin_hook
        def batch_strategy():
            return inference_server.BatchStrategy.SINGLE_RECORD

        @inference_server.plugin_hook
        def max_concurrent_transforms():
            return 8

        @inference_server.plugin_hook
        def max_payload_in_mb():
            return 12
        """,
    )
    server = servers.start(env={"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "2"})
    assert server.request("GET", "/execution-parameters").json() == {
        "BatchStrategy": "SingleRecord",
        "MaxConcurrentTransforms": 8,
        "MaxPayloadInMB": 12,
    }


class _Echo:
    @plugin_hook
    def output_fn(self, prediction: Any, accept: Any) -> tuple[bytes, str]:
        return bytes(prediction), "application/octet-stream"


def _app(*plugins: object) -> App:
    return App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], plugins))


def test_app_is_wsgi_compliant() -> None:
    """Every route, including errors and HEAD, passes ``wsgiref.validate``."""
    client = werkzeug.test.Client(wsgiref.validate.validator(_app(_Echo())))
    for method, path, status in [
        ("GET", "/ping", 200),
        ("HEAD", "/ping", 200),
        ("POST", "/invocations", 200),
        ("GET", "/execution-parameters", 200),
        ("GET", "/missing", 404),
        ("PUT", "/ping", 405),
    ]:
        with client.open(path, method=method, data=b"abc" if method == "POST" else None) as response:
            assert response.status_code == status
            if method in ("POST", "HEAD"):
                assert response.get_data() == (b"abc" if method == "POST" else b"")


def test_invalid_hook_value_is_a_start_up_error() -> None:
    """An execution-parameter hook returning nonsense stops the app from being created."""

    class Bad:
        @plugin_hook
        def max_payload_in_mb(self) -> Any:
            return "lots"

    with pytest.raises(ValueError, match="max_payload_in_mb returned 'lots'"):
        _app(Bad())


def test_truncated_body_is_400() -> None:
    """A body shorter than its Content-Length is a 400 that says how much arrived."""
    environ = werkzeug.test.EnvironBuilder(method="POST", path="/invocations").get_environ()
    environ.update({"wsgi.input": io.BytesIO(b"abc"), "CONTENT_LENGTH": "10"})
    statuses: list[str] = []
    body = b"".join(_app()(environ, lambda status, headers: statuses.append(status)))  # type: ignore[arg-type,func-returns-value]
    assert statuses == ["400 Bad Request"]
    assert "ended after 3 of 10 bytes" in orjson.loads(body)["message"]


class _Trickle:
    """A ``wsgi.input`` whose reads return at most ``step`` bytes, as a server's may."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._step = io.BytesIO(data), step

    def read(self, size: int = -1) -> bytes:
        return self._data.read(min(self._step, size) if size >= 0 else self._step)


@pytest.mark.parametrize("size", [10, 70_000])
def test_a_body_whose_reads_come_short_reaches_the_model_whole(size: int) -> None:
    """A server's read returning less than asked (small bodies are read in one call first) is read on, and the
    model gets the whole body as a bytearray."""
    seen: list[Any] = []

    class Record:
        @plugin_hook
        def input_fn(self, input_data: Any, content_type: str) -> Any:
            seen.append(input_data)
            return b"ok"

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    environ = werkzeug.test.EnvironBuilder(method="POST", path="/invocations").get_environ()
    environ.update({"wsgi.input": _Trickle(data, 4093), "CONTENT_LENGTH": str(size)})
    statuses: list[str] = []
    body = b"".join(_app(Record())(environ, lambda status, headers: statuses.append(status)))  # type: ignore[arg-type,func-returns-value]
    assert (statuses, body) == (["200 OK"], b"ok")
    assert type(seen[0]) is bytearray
    assert seen[0] == data


def test_http_exceptions_from_werkzeug_keep_their_status() -> None:
    """Any werkzeug HTTPException from a hook (here 409) keeps its status and description."""

    class Conflict:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            raise werkzeug.exceptions.Conflict("already predicting")

    response = werkzeug.test.Client(_app(Conflict())).post("/invocations", data=b"")
    assert response.status_code == 409
    assert response.json["message"] == "already predicting"
    assert http.client.responses[409] in response.status


def test_a_new_protocol_is_one_module_that_registers_routes() -> None:
    """The example protocol of docs/explanation/architecture.md, executed: its pattern route runs the served model
    through the lifecycle, its segment reaches the handler, and the route table lists it in 404s and answers 405
    with Allow."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "explanation" / "architecture.md").read_text()
    example = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]
    namespace: dict[str, Any] = {}
    exec(compile(example, "docs/explanation/architecture.md", "exec"), namespace)
    app = _app(_Echo())
    namespace["register"](app)
    client = werkzeug.test.Client(wsgiref.validate.validator(app))
    with client.post("/hello/world", data=b"abc") as response:
        assert (response.status_code, response.get_data(), response.headers["X-Hello"]) == (200, b"abc", "world")
    with client.get("/hello/world") as response:
        assert response.headers["Allow"] == "POST"
    with client.get("/hello") as response:
        assert "/hello/{name}" in response.json["message"]
    with client.post("/hello/", data=b"abc") as response:
        assert response.status_code == 404


def test_the_route_table_matches_patterns_by_their_literal_segments_in_the_order_added() -> None:
    """A path matches the first pattern of its length whose literal segments it has and whose names it fills (an
    empty segment fills none); an exact path wins over a pattern; every path and pattern is listed in order."""
    routes = Routes()

    def handler(name: str) -> Any:
        return lambda request: name

    routes.add("/v2/models/{name}/infer", handler("infer"), "POST")
    routes.add("/v2/models/{name}/versions/{version}", handler("version"), "GET")
    routes.add("/v2/models/{name}/ready", handler("ready"), "GET")
    routes.add("/v2/models/stats/infer", handler("exact"), "POST")
    routes.add("/v2/models/{name}/infer", handler("infer GET"), "GET")
    routes.add("/v2/{kind}/{name}/ready", handler("later"), "GET")  # (matches what .../{name}/ready does: added later)
    routes.add("/{a}/{a}", handler("twice"), "GET")
    route, methods, params = routes.match("/v2/models/m1/infer") or ("", {}, {})
    assert (route, sorted(methods), params) == ("/v2/models/{name}/infer", ["GET", "POST"], {"name": "m1"})
    assert routes.match("/v2/models/m1/versions/3")[2] == {"name": "m1", "version": "3"}  # type: ignore[index]
    assert routes.match("/v2/models/m1/ready")[0] == "/v2/models/{name}/ready"  # type: ignore[index]
    assert routes.match("/v2/models/stats/infer")[0] == "/v2/models/stats/infer"  # type: ignore[index]
    assert routes.match("/v2/other/m1/ready")[0] == "/v2/{kind}/{name}/ready"  # type: ignore[index]
    assert routes.match("/x/y")[2] == {"a": "y"}  # type: ignore[index]
    for path in ("/v2/models//infer", "/v2/models/m1/versions/", "/v2/models/m1/other", "/v2/models/m1", "//y"):
        assert routes.match(path) is None, path
    assert routes.paths() == [
        "/v2/models/stats/infer",
        "/v2/models/{name}/infer",
        "/v2/models/{name}/versions/{version}",
        "/v2/models/{name}/ready",
        "/v2/{kind}/{name}/ready",
        "/{a}/{a}",
    ]


def test_ping_runs_a_ping_thread_only_when_a_hook_must_be_asked() -> None:
    """``/ping`` of a loaded model with the built-in ``ping_fn`` is answered without handing anything to a ping
    thread (nothing of a plugin runs); a plugin's ``ping_fn`` is still asked on one, and its no is a 503."""

    class No:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            return False

    quick = _app(_Echo())
    quick.model()
    asked = _app(_Echo(), No())
    asked.model()
    client, other = werkzeug.test.Client(quick), werkzeug.test.Client(asked)
    for _ in range(3):
        assert client.get("/ping").status_code == 200
        assert other.get("/ping").status_code == 503
    assert quick.health._pings.size == 0
    assert asked.health._pings.size == 1


def test_cleanup_runs_when_the_server_closes_the_body() -> None:
    """An invocation's body leaves the drain's count of requests in flight only once the server is done with it."""
    app = _app(_Echo())
    events: list[str] = []

    class Worker:
        draining, draining_since = False, 0.0

        def enter(self) -> None:
            events.append("enter")

        def leave(self) -> None:
            events.append("leave")

        def request_recycle(self, reason: str, kind: str = "stuck") -> None:
            raise AssertionError(reason)

    app.worker = Worker()
    environ = werkzeug.test.EnvironBuilder(method="POST", path="/invocations", data=b"abc").get_environ()
    body = app(environ, lambda status, headers: None)  # type: ignore[arg-type,func-returns-value]
    assert events == ["enter"]
    assert b"".join(body) == b"abc"
    assert events == ["enter"]  # sent, but the server has not said it is done with the body
    body.close()  # type: ignore[attr-defined]
    assert events == ["enter", "leave"]


def test_ping_503_says_why_in_its_body() -> None:
    """/ping answers 200 with an empty body, or 503 whose JSON error body gives the reason that was only logged, to
    a client that accepts JSON; without Accept the 503's body is empty, as 1.x's own tests check."""

    class Sick:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            return False

    class Broken:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            raise OSError("weights.bin: no such file")

    with werkzeug.test.Client(_app()).get("/ping") as response:
        assert (response.status_code, response.get_data()) == (200, b"")
    for plugin, reason in [
        (Sick(), "ping_fn returned False"),
        (Broken(), "the model failed to load: OSError: weights.bin: no such file"),
    ]:
        client = werkzeug.test.Client(_app(plugin))
        with client.get("/ping", headers={"X-Request-Id": "r1", "Accept": "*/*"}) as response:
            assert response.status_code == 503
            assert response.json == {"message": reason, "request_id": "r1", "status": 503}
        with client.get("/ping") as response:
            assert (response.status_code, response.get_data()) == (503, b"")
