"""Log lines: the text and JSON formatters, the request ids joined to a request's lines, the access line, and what
real servers on both backends write."""

from __future__ import annotations

import contextvars
import copy
import io
import logging
import logging.config
import re
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference_server import _logging
from tests.conftest import PluginSite, Reply, ServerFactory

RFC3339_UTC_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
#: The fields of every JSON line, and those access lines add.
BASE = {"time", "level", "logger", "message", "pid"}
HTTP = {"method", "path", "route", "status", "duration_ms", "request_bytes", "response_bytes"}
ACCESS = {
    "method": "POST",
    "path": "/invocations",
    "route": "/invocations",
    "status": 200,
    "seconds": 0.0042,
    "request_bytes": 512,
    "response_bytes": 123,
    "request_id": "req-1",
    "inference_id": "inf-1",
    "quiet": False,
}


def _record(message: str = "hello %s", args: tuple[Any, ...] = ("world",), **attributes: Any) -> logging.LogRecord:
    record = logging.LogRecord("my_model", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(attributes)
    return record


def _json(record: logging.LogRecord) -> dict[str, Any]:
    line = _logging.JsonFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = orjson.loads(line)
    return parsed


@pytest.fixture
def access_lines() -> Iterator[Any]:
    """``access_lines(fmt)``: a stream that the access logger writes to in ``fmt``, at debug level, for this test."""
    logger = _logging.access_logger
    saved = logger.handlers[:], logger.level, logger.propagate
    stream = io.StringIO()

    def use(fmt: str) -> io.StringIO:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(_logging.formatter(fmt))
        logger.handlers[:] = [handler]
        return stream

    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield use
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


# formatters --------------------------------------------------------------------------------------------------------


def test_json_line_has_the_base_fields() -> None:
    """A JSON line is one object with time, level, logger, the formatted message and the pid, and nothing else."""
    line = _json(_record())
    assert set(line) == BASE
    assert (line["level"], line["logger"], line["message"], line["pid"]) == ("INFO", "my_model", "hello world",
                                                                            _record().process)  # fmt: skip


def test_json_time_is_rfc3339_utc_with_milliseconds() -> None:
    """``time`` is the record's creation time in UTC, to the millisecond, with a ``Z``; each second's stamp is
    computed anew (the cache follows the clock)."""
    formatter = _logging.JsonFormatter()
    stamps = []
    for created in (0.0, 1_790_000_000.0423, 1_790_000_000.999, 1_790_000_001.5):
        record = _record()
        record.created = created
        stamps.append(orjson.loads(formatter.format(record))["time"])
    assert stamps == ["1970-01-01T00:00:00.000Z", "2026-09-21T14:13:20.042Z", "2026-09-21T14:13:20.999Z",
                      "2026-09-21T14:13:21.500Z"]  # fmt: skip
    assert all(RFC3339_UTC_MS.fullmatch(stamp) for stamp in stamps)


def test_json_exception_is_one_string_field() -> None:
    """An exception is the formatted traceback in one ``exc_info`` string; the message stays the message."""
    try:
        raise RuntimeError("exploded")
    except RuntimeError:
        record = _record("failed", (), exc_info=sys.exc_info())
    line = _json(record)
    assert line["message"] == "failed"
    assert line["exc_info"].startswith("Traceback (most recent call last):\n")
    assert line["exc_info"].endswith("RuntimeError: exploded")


def test_json_stack_info_is_one_string_field() -> None:
    """``stack_info=True`` gives the stack in one ``stack_info`` string."""
    line = _json(_record(stack_info="Stack (most recent call last):\n  File x"))
    assert line["stack_info"] == "Stack (most recent call last):\n  File x"


def test_json_line_survives_a_string_that_is_not_utf8() -> None:
    """A message holding a lone surrogate (bytes decoded with surrogateescape) is still one JSON line."""
    assert _json(_record("path %s", (b"caf\xe9".decode(errors="surrogateescape"),)))["message"] == "path caf\\udce9"


def test_lines_logged_in_a_request_carry_its_ids() -> None:
    """Between bind and unbind, lines carry request_id and inference_id; inference_id is left out when absent;
    after unbind, neither."""
    token = _logging.bind("req-1", "inf-1")
    try:
        inside = _json(_record())
    finally:
        _logging.unbind(token)
    token = _logging.bind("req-2", None)
    try:
        without = _json(_record())
    finally:
        _logging.unbind(token)
    assert (inside["request_id"], inside["inference_id"]) == ("req-1", "inf-1")
    assert without["request_id"] == "req-2"
    assert "inference_id" not in without
    assert "request_id" not in _json(_record())


def test_a_thread_running_in_the_request_context_logs_its_ids() -> None:
    """A helper thread run in a copy of the request's context (as the hooks' threads are) logs the request's ids."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_logging.JsonFormatter())
    logger = logging.getLogger("tests.test_logging.thread")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    token = _logging.bind("req-t", "inf-t")
    try:
        context = contextvars.copy_context()
    finally:
        _logging.unbind(token)
    thread = threading.Thread(target=context.run, args=(logger.info, "from a helper thread"))
    thread.start()
    thread.join()
    logger.removeHandler(handler)
    line = orjson.loads(stream.getvalue())
    assert (line["message"], line["request_id"], line["inference_id"]) == ("from a helper thread", "req-t", "inf-t")


def test_text_line_keeps_the_format_and_appends_the_request() -> None:
    """A text line is FORMAT, with ``[request ID, inference ID]`` after the message of a request's line."""
    formatter = _logging.TextFormatter()
    record = _record()
    plain = formatter.format(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[\d+\] \[INFO\] my_model: hello world", plain)
    token = _logging.bind("req-1", "inf-1")
    try:
        assert formatter.format(record) == f"{plain} [request req-1, inference inf-1]"
    finally:
        _logging.unbind(token)
    assert formatter.format(_record(request_id="req-2")).endswith("hello world [request req-2]")


def test_text_time_follows_the_clock() -> None:
    """The text time stamp of each second is computed anew, with the record's milliseconds."""
    formatter = _logging.TextFormatter()
    first, second = _record(), _record()
    first.created, first.msecs = 1_790_000_000.25, 250.0
    second.created, second.msecs = 1_790_000_061.5, 500.0
    expected = [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(record.created))) + f",{int(record.msecs):03d}"
        for record in (first, second)
    ]
    assert [formatter.formatTime(first), formatter.formatTime(second)] == expected
    assert formatter.formatTime(first, "%Y") == time.strftime("%Y", time.localtime(first.created))


def test_text_exception_follows_the_line() -> None:
    """A text line's traceback follows it on the next lines, as logging writes it."""
    try:
        raise RuntimeError("exploded")
    except RuntimeError:
        record = _record("failed", (), exc_info=sys.exc_info(), request_id="req-1")
    first, *rest = _logging.TextFormatter().format(record).splitlines()
    assert first.endswith("my_model: failed [request req-1]")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: exploded"


# the access line ---------------------------------------------------------------------------------------------------


def test_json_access_line_has_the_http_fields(access_lines: Any) -> None:
    """A JSON access line has the base fields, the request's ids (its own, not the context's) and the HTTP fields,
    the duration in milliseconds."""
    stream = access_lines("json")
    token = _logging.bind("some-other-request", None)
    try:
        _logging.access(**ACCESS)
    finally:
        _logging.unbind(token)
    line = orjson.loads(stream.getvalue())
    assert set(line) == BASE | HTTP | {"request_id", "inference_id"}
    assert {key: line[key] for key in HTTP} == {
        "method": "POST",
        "path": "/invocations",
        "route": "/invocations",
        "status": 200,
        "duration_ms": 4.2,
        "request_bytes": 512,
        "response_bytes": 123,
    }
    assert (line["request_id"], line["inference_id"]) == ("req-1", "inf-1")
    assert (line["level"], line["logger"]) == ("INFO", "inference_server.access")
    assert line["message"] == '"POST /invocations" 200 4.2 ms, 512 B in, 123 B out'


def test_text_access_line_is_readable(access_lines: Any) -> None:
    """A text access line says the request line, status, duration and sizes, then the request's ids."""
    stream = access_lines("text")
    _logging.access(**{**ACCESS, "inference_id": None})
    expected = 'inference_server.access: "POST /invocations" 200 4.2 ms, 512 B in, 123 B out [request req-1]\n'
    assert stream.getvalue().endswith(expected)


def test_quiet_access_lines_are_debug(access_lines: Any) -> None:
    """A quiet request's line (/ping, /metrics) is at DEBUG, so the default INFO level drops it."""
    stream = access_lines("json")
    _logging.access(**{**ACCESS, "path": "/ping", "route": "/ping", "quiet": True})
    assert orjson.loads(stream.getvalue())["level"] == "DEBUG"
    _logging.access_logger.setLevel(logging.INFO)
    _logging.access(**{**ACCESS, "path": "/ping", "route": "/ping", "quiet": True})
    assert len(stream.getvalue().splitlines()) == 1


# choosing and configuring ------------------------------------------------------------------------------------------


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_format_defaults_to_text_on_a_terminal_and_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting: text when stderr is a terminal, JSON when it is not (or is gone); a setting wins."""
    monkeypatch.setattr(sys, "stderr", _Stream(tty=True))
    assert (_logging.resolve_format(None), _logging.resolve_format("json")) == ("text", "json")
    monkeypatch.setattr(sys, "stderr", _Stream(tty=False))
    assert (_logging.resolve_format(None), _logging.resolve_format("text")) == ("json", "text")
    monkeypatch.setattr(sys, "stderr", None)
    assert _logging.resolve_format(None) == "json"


def test_dict_config_routes_the_backend_and_root_through_one_formatter() -> None:
    """The backend's loggers and the root logger write through the chosen formatter on stderr; the backend's access
    logger passes warnings only (the app writes the access line); a copy of the config applies again, as each
    worker applies it (spawned workers are tested below)."""
    names = ("tests.backend.error", "tests.backend.access")
    saved = logging.root.handlers[:], logging.root.level
    try:
        config = _logging.dict_config("debug", names, "json")
        logging.config.dictConfig(copy.deepcopy(config))
        logging.config.dictConfig(config)  # twice: granian applies it in the serving process and in each worker
        error, access = (logging.getLogger(name) for name in names)
        for logger in (logging.root, error, access):
            (handler,) = logger.handlers
            assert isinstance(handler, logging.StreamHandler)
            assert isinstance(handler.formatter, _logging.JsonFormatter)
            assert handler.stream is sys.stderr
        assert (logging.root.level, error.level, access.level) == (logging.DEBUG, logging.DEBUG, logging.WARNING)
        assert not error.propagate
        quiet = _logging.dict_config("error", names, "text")["loggers"]
        assert quiet["tests.backend.access"]["level"] == "ERROR"
        assert _logging.dict_config("info", names)["formatters"]["inference_server"]["()"] is _logging.TextFormatter
    finally:
        for name in names:
            logging.getLogger(name).handlers.clear()
        logging.root.handlers[:], logging.root.level = saved


# real servers ------------------------------------------------------------------------------------------------------

MODEL = """
    import logging
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        logging.getLogger("my_model").info("predicting %d bytes", len(data))
        if bytes(data[:4]) == b"boom":
            raise RuntimeError("secret internals exploded")
        return data
"""
#: The same model in granian workers that are spawned, not forked (as on macOS and Python 3.14): they configure
#: their logging from what the serving process passes them, not from what they inherit.
SPAWNED = textwrap.dedent(MODEL) + "\nimport multiprocessing\n\nmultiprocessing.set_start_method('spawn', force=True)\n"


@dataclass
class Served:
    """What a server wrote while it answered a fixed set of requests, then stopped."""

    backend: str
    pid: int
    output: str
    replies: dict[str, Reply]

    def lines(self) -> list[dict[str, Any]]:
        """Every line of the output, parsed as JSON (failing on the first that is not)."""
        parsed = []
        for number, line in enumerate(self.output.splitlines(), 1):
            try:
                parsed.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                pytest.fail(f"line {number} of the {self.backend} server's output is not JSON: {line!r}")
        return parsed

    def access(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["logger"] == "inference_server.access"]


def _serve(tmp_path: Path, backend: str, *args: str, source: str = MODEL, env: dict[str, str] | None = None) -> Served:
    """Serve the logging model, send it an invocation, a failing one and two pings, stop it, and return its log."""
    site = PluginSite(tmp_path / "site")
    site.path.mkdir()
    site.add("chatty", source)
    factory = ServerFactory(tmp_path, site)
    try:
        server = factory.start("--server", backend, *args, env=env)
        replies = {
            "ok": server.request("POST", "/invocations", b"hello", {
                "X-Request-Id": "req-ok", "X-Amzn-SageMaker-Inference-Id": "inf-ok",
                "Content-Type": "application/octet-stream"}),
            "boom": server.request("POST", "/invocations", b"boom", {
                "X-Request-Id": "req-boom", "Content-Type": "application/octet-stream"}),
            "ping": server.request("GET", "/ping", headers={"X-Request-Id": "req-ping"}),
        }  # fmt: skip
        assert server.stop() == 0
        return Served(backend, server.process.pid, server.output(), replies)
    finally:
        factory.close()


@pytest.fixture(scope="module", params=["granian", "gunicorn"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Served:
    """A server on each backend with ``--log-format json`` (started, used and stopped once per module)."""
    return _serve(tmp_path_factory.mktemp(f"json-{request.param}"), request.param, "--log-format", "json")


def test_server_writes_json_lines_only(served: Served) -> None:
    """With --log-format json, every line the server and its workers write is a JSON object with the base fields
    and an RFC 3339 UTC time."""
    lines = served.lines()
    assert lines
    assert all(set(line) >= BASE and RFC3339_UTC_MS.fullmatch(line["time"]) for line in lines)


def test_one_access_line_per_request_with_the_ids_sent(served: Served) -> None:
    """Each invocation gets exactly one access line, carrying the X-Request-Id the client sent and the SageMaker
    inference id; the backend writes none of its own."""
    access = served.access()
    assert [line["request_id"] for line in access] == ["req-ok", "req-boom"]  # /ping is at DEBUG
    ok, boom = access
    assert {key: ok[key] for key in HTTP - {"duration_ms"}} == {
        "method": "POST", "path": "/invocations", "route": "/invocations", "status": 200, "request_bytes": 5,
        "response_bytes": 5}  # fmt: skip
    assert ok["inference_id"] == "inf-ok"
    assert "inference_id" not in boom
    assert (boom["status"], boom["response_bytes"]) == (500, len(served.replies["boom"].body))
    assert all(isinstance(line["duration_ms"], float) and line["duration_ms"] > 0 for line in access)
    assert not [line for line in served.lines() if line["logger"] in ("gunicorn.access", "granian.access")]


def test_model_code_lines_carry_the_request_id(served: Served) -> None:
    """A line the model's own code logs in predict_fn carries its request's ids, written by the worker."""
    model = [line for line in served.lines() if line["logger"] == "my_model"]
    assert [(line["message"], line["request_id"], line.get("inference_id")) for line in model] == [
        ("predicting 5 bytes", "req-ok", "inf-ok"),
        ("predicting 4 bytes", "req-boom", None),
    ]
    assert model[0]["pid"] != served.pid


def test_500_traceback_is_in_the_log_not_the_response(served: Served) -> None:
    """A hook's exception: its log line holds the traceback in exc_info, with the request id; the 500 holds
    neither traceback nor message."""
    (error,) = [line for line in served.lines() if line["level"] == "ERROR"]
    assert error["request_id"] == "req-boom"
    assert error["message"] == "Request req-boom POST /invocations: predict_fn raised RuntimeError"
    assert error["exc_info"].startswith("Traceback (most recent call last):")
    assert error["exc_info"].endswith("RuntimeError: secret internals exploded")
    reply = served.replies["boom"]
    assert reply.status == 500
    assert b"Traceback" not in reply.body
    assert b"secret internals" not in reply.body


def test_worker_and_backend_lines_are_json(served: Served) -> None:
    """The serving process's lines (loading the model), the worker's own (serving it) and the backend's are in the
    chosen format."""
    lines = served.lines()
    loading = next(line for line in lines if line["message"].startswith("Loading the model"))
    assert loading["pid"] == served.pid
    serving = next(line for line in lines if "serving the model loaded before it started" in line["message"])
    assert serving["pid"] != served.pid
    backend_logger = "gunicorn.error" if served.backend == "gunicorn" else "_granian"
    assert any(line["logger"].startswith(backend_logger) for line in lines)


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_ping_access_lines_only_at_debug(tmp_path: Path, backend: str) -> None:
    """With --log-level debug, /ping gets its access line, at DEBUG."""
    served = _serve(tmp_path, backend, "--log-format", "json", "--log-level", "debug")
    pings = [line for line in served.access() if line["request_id"] == "req-ping"]
    assert [(line["level"], line["route"], line["status"]) for line in pings] == [("DEBUG", "/ping", 200)]


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_no_access_log(tmp_path: Path, backend: str) -> None:
    """--no-access-log: no access line at all, even at debug level; the other lines stay."""
    served = _serve(tmp_path, backend, "--log-format", "json", "--log-level", "debug", "--no-access-log")
    assert served.access() == []
    assert any(line["logger"] == "my_model" for line in served.lines())


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_json_is_the_default_when_stderr_is_not_a_terminal(tmp_path: Path, backend: str) -> None:
    """Without --log-format, a server whose stderr is a file writes JSON lines, its workers too."""
    served = _serve(tmp_path, backend)
    assert [line["request_id"] for line in served.access()] == ["req-ok", "req-boom"]


def test_format_from_the_environment(tmp_path: Path) -> None:
    """INFERENCE_SERVER_LOG_FORMAT=text: text lines, the access line and the model's with the request's ids."""
    output = _serve(tmp_path, "granian", env={"INFERENCE_SERVER_LOG_FORMAT": "text"}).output
    assert re.search(r'\[INFO\] inference_server\.access: "POST /invocations" 200 [\d.]+ ms, 5 B in, 5 B out '
                     r"\[request req-ok, inference inf-ok\]$", output, re.MULTILINE)  # fmt: skip
    assert re.search(r"\[INFO\] my_model: predicting 5 bytes \[request req-ok, inference inf-ok\]$", output, re.M)
    assert not output.lstrip().startswith("{")


def test_spawned_granian_workers_write_the_chosen_format(tmp_path: Path) -> None:
    """granian workers started with multiprocessing's spawn (nothing inherited) still write JSON lines with the
    request ids: the serving process hands them its logging configuration."""
    served = _serve(tmp_path, "granian", "--log-format", "json", source=SPAWNED)
    model = [line for line in served.lines() if line["logger"] == "my_model"]
    assert [line["request_id"] for line in model] == ["req-ok", "req-boom"]
    assert [line["request_id"] for line in served.access()] == ["req-ok", "req-boom"]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_an_access_line_written_directly_is_the_line_its_record_would_give(fmt: str) -> None:
    """The access line written straight to serve's handler (no record) equals, but for its time, what the same line
    gives through a record (a filter on the way forces that path)."""
    stream = io.StringIO()
    handler = _logging.Handler(stream)
    handler.setFormatter(_logging.formatter(fmt))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    fields = dict(
        method="POST",
        path="/invocations",
        route="/invocations",
        status=200,
        seconds=0.0123,
        request_bytes=16,
        response_bytes=9,
        request_id="order-1138",
        inference_id="5b6f0e1a-42",
        quiet=False,
    )
    try:
        assert _logging._only_handler(logging.INFO) is handler
        _logging.access(**fields)  # type: ignore[arg-type]
        handler.addFilter(lambda record: True)
        assert _logging._only_handler(logging.INFO) is None
        _logging.access(**fields)  # type: ignore[arg-type]
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    handler.flush()
    direct, through_record = stream.getvalue().splitlines()
    if fmt == "json":
        direct_line, record_line = orjson.loads(direct), orjson.loads(through_record)
        assert direct_line.pop("time")[:16] == record_line.pop("time")[:16]
        assert direct_line == record_line
    else:
        assert direct.split(" [", 1)[1] == through_record.split(" [", 1)[1]
