"""Streamed records encoded one at a time: JSON Lines, server-sent events framed as the standard says, one JSON
array, text; and how the built-in output_fn picks among them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import werkzeug.http
from werkzeug.datastructures import MIMEAccept

from inference_server import default_plugin
from inference_server.client import SSEDecoder
from inference_server.codecs import streams
from inference_server.codecs.streams import ServerSentEvent
from inference_server.errors import NotAcceptable


def accept(header: str) -> MIMEAccept:
    return werkzeug.http.parse_accept_header(header, MIMEAccept)


def test_each_json_lines_record_is_one_line() -> None:
    """Each record is one JSON document and a newline, numpy values and NaN included (as null)."""
    chunks = streams.encode(streams.JSON_LINES, {"a": 1}, iter(["b", [1.5, float("nan")]]))
    assert list(chunks) == [b'{"a":1}\n', b'"b"\n', b"[1.5,null]\n"]


def test_server_sent_events_frame_multi_line_data_and_fields_as_the_standard_says() -> None:
    """A str is the data itself, each of its lines (LF, CRLF or CR) a data field; an object is JSON; an event's
    type, id and retry are fields before the data; our own decoder reads them back the same."""
    records = ["one", "two\r\nlines\rand\nmore", {"x": [1, 2]}, ServerSentEvent("done", event="end", id="7", retry=500)]
    chunks = list(streams.encode(streams.EVENT_STREAM, records[0], iter(records[1:])))
    assert chunks == [
        b"data: one\n\n",
        b"data: two\ndata: lines\ndata: and\ndata: more\n\n",
        b'data: {"x":[1,2]}\n\n',
        b"event: end\nid: 7\nretry: 500\ndata: done\n\n",
    ]
    decoder = SSEDecoder()
    events = decoder.feed(b"".join(chunks)) + decoder.end()
    assert [event.data for event in events] == ["one", "two\nlines\nand\nmore", '{"x":[1,2]}', "done"]
    assert (events[3].event, events[3].id, events[3].retry) == ("end", "7", 500)


@pytest.mark.parametrize(("field", "value"), [("event", "a\nb"), ("id", "a\rb"), ("id", "a\0b")])
def test_an_event_type_or_id_that_would_break_the_framing_is_refused(field: str, value: str) -> None:
    """A line end in the type or id (or NUL in the id, which clients ignore) cannot be sent as one field."""
    with pytest.raises(ValueError, match=f"event's {field} cannot hold"):
        ServerSentEvent("data", **{field: value}).encode()


def test_a_json_array_is_sent_record_by_record_and_parses_whole() -> None:
    """application/json: an opening bracket with the first record, a comma before each next one, a closing
    bracket: the concatenation is one JSON document."""
    chunks = list(streams.encode(streams.JSON, 1, iter([{"b": 2}, "c"])))
    assert chunks == [b"[1", b',{"b":2}', b',"c"', b"]"]
    assert orjson.loads(b"".join(chunks)) == [1, {"b": 2}, "c"]


def test_text_records_must_be_str() -> None:
    """text/plain sends str records as UTF-8 and refuses anything else by name."""
    chunks = streams.encode(streams.TEXT, "h\u00e9", iter([3]))
    assert next(chunks) == "h\u00e9".encode()
    with pytest.raises(TypeError, match="must be str, not int"):
        next(chunks)


def tokens(*items: Any) -> Iterator[Any]:
    yield from items


@pytest.mark.parametrize(
    ("header", "media_type"),
    [
        ("*/*", "application/jsonlines"),
        ("text/event-stream", "text/event-stream"),
        ("application/json", "application/json"),
        ("text/plain", "text/plain"),
        ("text/csv;q=1, text/event-stream;q=0.5", "text/event-stream"),
    ],
)
def test_the_built_in_output_fn_streams_a_generator_in_the_type_the_client_accepts(
    header: str, media_type: str
) -> None:
    """A generator prediction is encoded record by record in the best streamed type the Accept allows (JSON Lines
    for anything); its records are made only as the chunks are asked for."""
    made: list[str] = []

    def generated() -> Iterator[str]:
        for token in ("a", "b"):
            made.append(token)
            yield token

    chunks, content_type = default_plugin.output_fn(generated(), accept(header))
    assert content_type == media_type
    assert made == ["a"]  # the first record is made to choose the type; the rest waits
    assert len(list(chunks)) >= 2
    assert made == ["a", "b"]


def test_bytes_records_are_sent_as_they_are_and_an_empty_stream_is_empty() -> None:
    """A generator of bytes is sent raw as application/octet-stream; one that yields nothing is an empty body."""
    chunks, content_type = default_plugin.output_fn(tokens(b"\x00\x01", b"\x02"), accept("*/*"))
    assert (list(chunks), content_type) == ([b"\x00\x01", b"\x02"], "application/octet-stream")
    chunks, content_type = default_plugin.output_fn(tokens(), accept("*/*"))
    assert list(chunks) == []


def test_an_accept_that_allows_no_streamed_type_is_a_406_and_closes_the_generator() -> None:
    """Accept: text/csv for a generator of objects is a 406 naming the types there are (text only for str
    records), and the generator is closed (its finally runs)."""
    closed = []

    def generated() -> Iterator[dict[str, int]]:
        try:
            yield {"a": 1}
            yield {"a": 2}
        finally:
            closed.append(True)

    with pytest.raises(NotAcceptable, match="application/jsonlines, text/event-stream, application/json,") as caught:
        default_plugin.output_fn(generated(), accept("text/csv"))
    assert "text/plain" not in caught.value.description
    assert closed == [True]
    assert list(itertools.islice(default_plugin.output_fn(tokens("x"), accept("text/plain"))[0], 1)) == [b"x"]


@pytest.mark.parametrize("media_type", [*streams.MEDIA_TYPES, "raw"])
def test_closing_the_chunks_closes_the_records_at_once(media_type: str) -> None:
    """Closing the encoded chunks (a client that went away) closes the records' iterator then, not when it is
    collected: a generator's finally runs."""
    closed = []

    def generated() -> Iterator[Any]:
        try:
            while True:
                yield b"x" if media_type == "raw" else "x"
        finally:
            closed.append(True)

    records = generated()
    first = next(records)
    chunks = streams.raw(first, records) if media_type == "raw" else streams.encode(media_type, first, records)
    next(chunks)
    next(chunks)
    held = [records]  # a reference elsewhere (a traceback, a log record) keeps it from being collected
    chunks.close()  # type: ignore[attr-defined]
    assert closed == [True]
    assert held
