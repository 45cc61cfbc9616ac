"""Streamed answers: the JSON Lines, server-sent events and raw decoders, fed split at every byte, and
``Predictor.predict_stream`` against a real chunked HTTP server on 127.0.0.1."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import sseclient

from inference_server import client
from inference_server.client import ServerSentEvent as Event
from inference_server.errors import PredictionError

# The decoders --------------------------------------------------------------------------------------------------


def _decode(chunks: list[bytes], content_type: str) -> list[Any]:
    return list(client.decode_stream(chunks, content_type))


def _splits(data: bytes) -> Iterator[list[bytes]]:
    """``data`` whole, in two at every byte position, byte by byte, and byte by byte with empty chunks between."""
    yield [data]
    for position in range(len(data) + 1):
        yield [data[:position], data[position:]]
    yield [data[i : i + 1] for i in range(len(data))]
    yield [piece for i in range(len(data)) for piece in (b"", data[i : i + 1])] + [b""]


def _assert_split_anywhere(data: bytes, content_type: str, expected: list[Any]) -> None:
    for chunks in _splits(data):
        assert _decode(chunks, content_type) == expected, chunks


JSON_LINES = {
    "unicode": (
        '{"name": "Fair Isle ✓", "emoji": "😀"}\n["é", 1.5]\n'.encode(),
        [{"name": "Fair Isle ✓", "emoji": "😀"}, ["é", 1.5]],
    ),
    "crlf, blank lines, last line without newline": (
        b'\r\n{"a": [1, 2]}\r\n\r\n  \r\n"text"\r\n3',
        [{"a": [1, 2]}, "text", 3],
    ),
    "lf, blank lines, nested values": (
        b'\n\nnull\n{"x": {"y": [true, false]}}\n\n\n',
        [None, {"x": {"y": [True, False]}}],
    ),
    "empty": (b"", []),
}


@pytest.mark.parametrize("name", list(JSON_LINES))
def test_json_lines_split_anywhere(name: str) -> None:
    """JSON Lines decode to the same records however the stream is split, also inside a UTF-8 character."""
    data, expected = JSON_LINES[name]
    _assert_split_anywhere(data, "application/jsonlines", expected)


def test_json_lines_error_names_the_line() -> None:
    """A line that is not JSON raises JSONLinesError (a ValueError) naming its line number, blank lines counted."""
    decoder = client.JSONLinesDecoder()
    assert decoder.feed(b"1\n\n") == [1]
    with pytest.raises(client.JSONLinesError) as caught:
        decoder.feed(b"{bad}\n")
    assert isinstance(caught.value, ValueError)
    assert caught.value.line == 3
    assert "line 3 of the JSON Lines stream is not JSON" in str(caught.value)


def test_json_lines_bad_last_line_fails_at_the_end() -> None:
    """A last line without a newline is decoded when the stream ends, and fails then if it is not JSON."""
    with pytest.raises(client.JSONLinesError, match="line 2"):
        _decode([b'"ok"\n{"cut": '], "application/x-ndjson")


SSE = {
    "fields, comments, multi-line data": (
        b": a comment\nevent: update\nid: 1\nretry: 3000\ndata: first line\ndata: second line\n\n"
        b"data:no space\ndata:  two spaces\n\n",
        [
            Event("first line\nsecond line", "update", "1", 3000),
            Event("no space\n two spaces", "message", "1", 3000),  # id and retry persist
        ],
    ),
    "crlf": (
        b"data: a\r\ndata: b\r\n\r\nid: 7\r\nevent: e\r\ndata: c\r\n\r\n",
        [Event("a\nb"), Event("c", "e", "7")],
    ),
    "cr only": (
        b"data: a\rdata: b\r\rid: 7\revent: e\rdata: c\r\r",
        [Event("a\nb"), Event("c", "e", "7")],
    ),
    "mixed line endings": (
        b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\n\r",
        [Event("a\nb\nc"), Event("d")],
    ),
    "one leading BOM is dropped, a later one is not": (
        "\ufeffdata: 1\n\n\ufeffdata: 2\n\ndata: 3\n\n".encode(),
        [Event("1"), Event("3")],  # the second BOM makes the field "\ufeffdata", which is ignored
    ),
    "an incomplete trailing event is discarded": (
        b"data: 1\n\ndata: 2\n",
        [Event("1")],
    ),
    "a trailing line without an ending is discarded": (
        b"data: 1\n\ndata: 2",
        [Event("1")],
    ),
    "unicode": (
        "data: Fair Isle ✓\ndata: 😀 é\n\n: ✓\nevent: ✓\ndata: 1\n\n".encode(),
        [Event("Fair Isle ✓\n😀 é"), Event("1", "✓")],
    ),
    "invalid UTF-8 as U+FFFD": (
        b"data: \xff\xfe!\n\ndata: \xe2\x9c\n\n",  # the second: a character cut short
        [Event("\ufffd\ufffd!"), Event("\ufffd")],
    ),
    "edge fields": (
        b"data\n\n"  # no colon: an empty value; the data buffer is "\n", so the event is dispatched with ""
        b"event: lost\n\n"  # no data: not dispatched, and its type does not carry over
        b"id: a\x00b\ndata: 1\n\n"  # an id with NUL is ignored
        b"id: 5\ndata: 2\n\n"
        b"id\ndata: 3\n\n"  # an empty id resets it
        b"retry: 12a\nretry: \xd9\xa1\xd9\xa2\nretry:\ndata: 4\n\n"  # not ASCII digits: ignored
        b"retry: 0010\nfoo: bar\ndata : no\ndata: a:b: c\n\n"  # unknown fields ignored; only the first colon splits
        b": data: comment\ndata:\n\n",
        [
            Event(""),
            Event("1"),
            Event("2", id="5"),
            Event("3"),
            Event("4"),
            Event("a:b: c", retry=10),
            Event("", retry=10),
        ],
    ),
    "empty": (b"", []),
}


@pytest.mark.parametrize("name", list(SSE))
def test_sse_split_anywhere(name: str) -> None:
    """Server-sent events decode per the WHATWG spec to the same events however the stream is split."""
    # a CR ending one chunk and an LF starting the next are one line ending; a UTF-8 character or BOM may split
    data, expected = SSE[name]
    _assert_split_anywhere(data, "text/event-stream; charset=utf-8", expected)


#: The samples sseclient-py parses as the spec says: it keeps an unfinished last event, does not drop a BOM, and
#: keeps neither id nor retry from one event to the next (so only the ids and retries it reports are compared).
AGREED = [
    "fields, comments, multi-line data",
    "crlf",
    "cr only",
    "unicode",
]


@pytest.mark.parametrize("name", AGREED)
def test_sse_agrees_with_sseclient(name: str) -> None:
    """Our SSE decoder parses the same events as sseclient-py, a real SSE client, where that follows the spec."""
    data, expected = SSE[name]
    theirs = list(sseclient.SSEClient([data], char_enc="utf-8").events())
    ours = _decode([data], "text/event-stream")
    assert ours == expected
    assert [(event.event, event.data) for event in theirs] == [(event.event, event.data) for event in ours]
    for their, our in zip(theirs, ours, strict=True):
        assert their.id is None or their.id == our.id
        assert their.retry is None or int(their.retry) == our.retry


def test_sse_decoder_after_end_takes_a_reconnected_stream() -> None:
    """After end(), an SSEDecoder takes a reconnected stream: BOM dropped, id and retry kept, old event gone."""
    decoder = client.SSEDecoder()
    assert decoder.feed(b"id: 5\nretry: 100\ndata: a\n\ndata: lost\r") == [Event("a", id="5", retry=100)]
    assert decoder.end() == []
    assert decoder.feed("\ufeffdata: b\n\n".encode()) == [Event("b", id="5", retry=100)]


def test_server_sent_event_json() -> None:
    """ServerSentEvent.json() parses its data; the event is a frozen value."""
    event = Event('{"token": "hi", "n": [1]}')
    assert event.json() == {"token": "hi", "n": [1]}
    with pytest.raises(AttributeError):
        event.data = "x"  # type: ignore[misc]


def test_raw_chunks_pass_through() -> None:
    """Any other media type yields the chunks as bytes, as they came, empty ones dropped."""
    chunks = [b"\x00\x01", b"", bytearray(b"two"), memoryview(b"three")]
    assert _decode(chunks, "application/octet-stream") == [b"\x00\x01", b"two", b"three"]  # type: ignore[arg-type]
    assert _decode([b"a"], "") == [b"a"]


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("application/jsonlines", client.JSONLinesDecoder),
        ("application/jsonl", client.JSONLinesDecoder),
        ("Application/X-JSONLines; charset=utf-8", client.JSONLinesDecoder),
        ("application/x-ndjson", client.JSONLinesDecoder),
        ("text/event-stream", client.SSEDecoder),
        ("TEXT/Event-Stream ; charset=UTF-8", client.SSEDecoder),
        ("application/json", client.RawDecoder),
        ("text/plain", client.RawDecoder),
        ("", client.RawDecoder),
        (None, client.RawDecoder),
    ],
)
def test_stream_decoder_chooses_by_media_type(content_type: str | None, kind: type) -> None:
    """The decoder is chosen by media type, case and parameters ignored; anything unknown is raw."""
    assert type(client.stream_decoder(content_type)) is kind


# predict_stream against a real HTTP server -------------------------------------------------------------------------

WAIT = 10  # seconds: only a broken client waits this long


class _Handler(http.server.BaseHTTPRequestHandler):
    """Hands each POST to the test's ``respond``, with helpers to send a chunked answer."""

    protocol_version = "HTTP/1.1"
    timeout = WAIT  # an idle kept-alive connection ends, so the server can stop
    server: _Server

    def do_POST(self) -> None:
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.clients.append(self.client_address)
        self.server.respond(self)

    def begin(self, content_type: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def last_chunk(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def hang_up(self) -> None:
        """Close the connection after this handler returns, wherever the answer is."""
        self.close_connection = True

    def client_gone(self) -> bool:
        """Whether the client closed its end: a read sees the end of the stream or a reset."""
        self.connection.settimeout(WAIT)
        try:
            return self.connection.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    respond: Callable[[_Handler], None]
    clients: list[tuple[str, int]]


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[_Handler], None]], str]]:
    """Start a chunked HTTP server on a free port of 127.0.0.1 answering with ``respond``; return its URL."""
    started: list[tuple[_Server, threading.Thread]] = []

    def start(respond: Callable[[_Handler], None]) -> str:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.respond, server.clients = respond, []
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        started.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()  # joins the handlers' threads
        thread.join()


def test_records_are_yielded_as_they_arrive(serve: Any) -> None:
    """The first record is yielded before the server sends the rest; records split over chunks are joined."""
    # the server sends the rest only once the client has the first record (an Event, not timing)
    client_has_first = threading.Event()
    first = '{"n": 1}\n{"s": "é'.encode()  # the second record, and its "é", continue in the next chunk

    def respond(handler: _Handler) -> None:
        handler.begin("application/jsonlines")
        handler.chunk(first[:-1])
        if not client_has_first.wait(WAIT):
            return handler.hang_up()  # the client waited for the whole body: fail it
        handler.chunk(first[-1:] + b'", "n": 2}\n{"n"')
        handler.chunk(b": 3}")
        handler.last_chunk()

    with client.Predictor(serve(respond)) as predictor:
        records = predictor.predict_stream(b"prompt")
        assert next(records) == {"n": 1}
        client_has_first.set()
        assert list(records) == [{"s": "é", "n": 2}, {"n": 3}]


def test_server_sent_events_over_http(serve: Any) -> None:
    """A text/event-stream answer yields ServerSentEvents as they arrive, a CRLF split between chunks included."""
    client_has_first = threading.Event()

    def respond(handler: _Handler) -> None:
        handler.begin("text/event-stream; charset=utf-8")
        handler.chunk(b': keep-alive\r\nevent: token\r\ndata: {"t": "Hel"}\r\n\r')
        handler.chunk(b"\n")  # ends the blank line: the first event is complete only now
        if not client_has_first.wait(WAIT):
            return handler.hang_up()
        handler.chunk(b'event: token\r\ndata: {"t": "lo"}\r\n\r\nevent: done\r\ndata: [DONE]\r\n\r\n')
        handler.last_chunk()

    with client.Predictor(serve(respond)) as predictor:
        events = predictor.predict_stream(b"prompt")
        assert next(events).json() == {"t": "Hel"}
        client_has_first.set()
        rest = list(events)
    assert [(event.event, event.data) for event in rest] == [("token", '{"t": "lo"}'), ("done", "[DONE]")]


def test_raw_chunks_over_http(serve: Any) -> None:
    """Another media type yields the body's bytes as they arrive."""
    client_has_first = threading.Event()

    def respond(handler: _Handler) -> None:
        handler.begin("audio/wav")
        handler.chunk(b"RIFF")
        if not client_has_first.wait(WAIT):
            return handler.hang_up()
        handler.chunk(b"\x00" * 100_000)
        handler.last_chunk()

    with client.Predictor(serve(respond)) as predictor:
        chunks = predictor.predict_stream(b"text")
        assert next(chunks) == b"RIFF"
        client_has_first.set()
        assert b"".join(chunks) == b"\x00" * 100_000


def test_request_carries_body_and_headers(serve: Any) -> None:
    """predict_stream serializes as predict does and sends the same headers (Accept from the deserializer)."""
    seen: dict[str, Any] = {}

    def respond(handler: _Handler) -> None:
        seen.update(body=handler.body, headers=dict(handler.headers))
        handler.begin("application/jsonlines")
        handler.chunk(b"1\n")
        handler.last_chunk()

    predictor = client.Predictor(serve(respond), client.JSONSerializer(), client.JSONLinesDeserializer())
    with predictor:
        assert list(predictor.predict_stream({"q": "✓"}, custom_attributes="a=1", inference_id="i-1")) == [1]
    assert orjson.loads(seen["body"]) == {"q": "✓"}
    headers = seen["headers"]
    assert (headers["Content-Type"], headers["Accept"]) == ("application/json", "application/jsonlines")
    assert headers["X-Amzn-SageMaker-Custom-Attributes"] == "a=1"
    assert headers["X-Amzn-SageMaker-Inference-Id"] == "i-1"


@pytest.mark.parametrize("cut", ["between chunks", "inside a chunk", "short of Content-Length"])
def test_a_stream_cut_short_raises(serve: Any, cut: str) -> None:
    """A connection closed before the answer's end raises StreamError (ended early); the next call works."""

    def respond(handler: _Handler) -> None:
        if handler.body == b"next":
            handler.begin("application/jsonlines")
            handler.chunk(b"2\n")
            return handler.last_chunk()
        if cut == "short of Content-Length":
            handler.send_response(200)
            handler.send_header("Content-Type", "application/jsonlines")
            handler.send_header("Content-Length", "100")
            handler.end_headers()
            handler.wfile.write(b"1\n")
        else:
            handler.begin("application/jsonlines")
            handler.chunk(b"1\n")
            if cut == "inside a chunk":
                handler.wfile.write(b"10\r\n{")  # announces 16 bytes, sends 1
        handler.hang_up()

    with client.Predictor(serve(respond)) as predictor:
        records = predictor.predict_stream(b"x")
        assert next(records) == 1
        with pytest.raises(client.StreamError, match="the stream ended early") as caught:
            next(records)
        assert isinstance(caught.value, PredictionError)
        assert (caught.value.code, caught.value.status) == ("IncompleteStream", 200)
        assert list(predictor.predict_stream(b"next")) == [2]


def test_an_error_status_raises_prediction_error(serve: Any) -> None:
    """An error status raises PredictionError (status, message, request id) at once; the next call works."""

    def respond(handler: _Handler) -> None:
        if handler.body == b"bad":
            handler.begin("application/json", status=400)
            handler.chunk(b'{"message": "the prompt is ')
            handler.chunk(b'empty", "request_id": "r-1"}')
            return handler.last_chunk()
        handler.begin("application/jsonlines")
        handler.chunk(b'"fine"\n')
        handler.last_chunk()

    url = serve(respond)
    with client.Predictor(url) as predictor:
        with pytest.raises(PredictionError) as caught:
            predictor.predict_stream(b"bad")
        assert type(caught.value) is PredictionError
        assert (caught.value.status, caught.value.message, caught.value.request_id) == (
            400,
            "the prompt is empty",
            "r-1",
        )
        assert list(predictor.predict_stream(b"good")) == ["fine"]


@pytest.mark.parametrize("how", ["close()", "break", "dropped unread"])
def test_closing_early_closes_the_connection(serve: Any, how: str) -> None:
    """Closing, breaking out of or dropping a stream closes its connection (the server sees it); the next works."""
    stopped, gone = threading.Event(), threading.Event()

    def respond(handler: _Handler) -> None:
        if handler.body == b"next":
            handler.begin("application/jsonlines")
            handler.chunk(b"2\n")
            return handler.last_chunk()
        handler.begin("application/jsonlines")
        handler.chunk(b"1\n2\n")
        if stopped.wait(WAIT) and handler.client_gone():
            gone.set()
        handler.hang_up()

    url = serve(respond)
    with client.Predictor(url) as predictor:
        if how == "close()":
            records = predictor.predict_stream(b"x")
            assert next(records) == 1
            records.close()
        elif how == "break":
            for record in predictor.predict_stream(b"x"):
                assert record == 1
                break
        else:
            predictor.predict_stream(b"x")
        stopped.set()
        assert gone.wait(WAIT)
        assert list(predictor.predict_stream(b"next")) == [2]


def test_a_finished_stream_keeps_the_connection(serve: Any) -> None:
    """A stream read to its end keeps its connection alive; a predict during a stream uses its own connection."""
    servers: list[Any] = []

    def respond(handler: _Handler) -> None:
        servers.append(handler.server)
        handler.begin("application/jsonlines")
        handler.chunk(b'"a"\n')
        handler.last_chunk()

    url = serve(respond)
    with client.Predictor(url, deserializer=client.JSONLinesDeserializer()) as predictor:
        assert list(predictor.predict_stream(b"1")) == ["a"]
        assert list(predictor.predict_stream(b"2")) == ["a"]
        records = predictor.predict_stream(b"3")
        assert predictor.predict(b"4") == ["a"]  # while the third stream is open
        assert list(records) == ["a"]
    clients = servers[0].clients
    assert clients[0] == clients[1] == clients[2]  # one kept-alive connection for the streams
    assert clients[3] != clients[2]  # the predict's own
