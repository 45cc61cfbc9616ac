"""Streamed answers: a prediction that is an iterator of records, encoded one record at a time as it is made.

Each function takes the first record (already made: it decides the media type) and the iterator of the rest, and
returns an iterator of chunks to send as they come. The media types:

- ``application/jsonlines``: one JSON document and ``\\n`` per record;
- ``text/event-stream``: one server-sent event per record (the WHATWG HTML standard, "Server-sent events": each line
  of the data as a ``data:`` field, the event ended by a blank line); a ``str`` is the event's data as it is,
  a :class:`ServerSentEvent` sets the other fields, anything else is sent as JSON;
- ``application/json``: one JSON array, ``[`` with the first record, ``,`` and each next one, then ``]``: a client that
  reads the whole body gets a valid document;
- ``text/plain``: ``str`` records as UTF-8, as they are (tokens of text).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from inference_server.codecs import json

JSON_LINES = "application/jsonlines"
EVENT_STREAM = "text/event-stream"
JSON = "application/json"
TEXT = "text/plain"

#: Line ends in an event's data (each line becomes a ``data:`` field of its own).
_LINES = re.compile(r"\r\n|\r|\n")


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One server-sent event: what a model yields to set more than the data (its ``event`` type, ``id``, ``retry``
    in ms), and what the client's decoder gives (there ``id`` and ``retry`` are the stream's last ones, which
    persist from earlier events as the standard says)."""

    data: str
    event: str = "message"
    id: str = ""
    retry: int | None = None

    def json(self) -> Any:
        """``data`` parsed as JSON."""
        return orjson.loads(self.data)

    def encode(self) -> bytes:
        """The event as the standard frames it: fields, then a blank line (type ``message`` is the default)."""
        for name, value in (("event", self.event), ("id", self.id)):
            if _LINES.search(value) or (name == "id" and "\0" in value):
                raise ValueError(f"a server-sent event's {name} cannot hold a line end or NUL: {value!r}")
        fields = [
            f"event: {self.event}\n" if self.event not in ("", "message") else "",
            f"id: {self.id}\n" if self.id else "",
        ]
        if self.retry is not None:
            fields.append(f"retry: {int(self.retry)}\n")
        fields.extend(f"data: {line}\n" for line in _LINES.split(self.data))
        return ("".join(fields) + "\n").encode()


def event(record: Any, nan: str = "null") -> bytes:
    """``record`` as one server-sent event: a ``str`` is the data itself, a :class:`ServerSentEvent` as it says,
    anything else as JSON."""
    if isinstance(record, ServerSentEvent):
        return record.encode()
    if isinstance(record, (bytes, bytearray, memoryview)):
        record = bytes(record).decode()
    if not isinstance(record, str):
        record = json.dumps(record, nan).decode()
    return ServerSentEvent(record).encode()


def json_line(record: Any, nan: str = "null") -> bytes:
    """``record`` as one line of JSON Lines."""
    return json.dumps(record, nan) + b"\n"


def text(record: Any, nan: str = "null") -> bytes:
    """A ``str`` record as UTF-8."""
    if not isinstance(record, str):
        raise TypeError(f"a text/plain stream's records must be str, not {type(record).__name__}")
    return record.encode()


def json_array(first: Any, rest: Iterator[Any], nan: str = "null") -> Iterator[bytes]:
    """The records as one JSON array, sent as they come; closed, it closes ``rest`` (see :func:`encode`)."""
    try:
        yield b"[" + json.dumps(first, nan)
        for record in rest:
            yield b"," + json.dumps(record, nan)
        yield b"]"
    finally:
        _close(rest)


ENCODERS: dict[str, Callable[[Any, str], bytes]] = {JSON_LINES: json_line, EVENT_STREAM: event, TEXT: text}
#: What a stream of records can be sent as, in the server's order of preference (``*/*`` gets the first).
MEDIA_TYPES = (JSON_LINES, EVENT_STREAM, JSON, TEXT)


def encode(media_type: str, first: Any, rest: Iterator[Any], nan: str = "null") -> Iterator[bytes]:
    """The chunks of the stream ``first, *rest`` as ``media_type`` (one of :data:`MEDIA_TYPES`).

    Closing them (a client that goes away) closes ``rest`` at once: a generator's ``finally`` runs then, and an
    async generator's ``aclose()`` on the worker's loop (:mod:`inference_server._loop`), not when it is collected.
    """
    if media_type == JSON:
        return json_array(first, rest, nan)
    return _records(ENCODERS[media_type], first, rest, nan)


def raw(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """Records sent as they are (bytes-like), closing ``rest`` when closed as :func:`encode` does."""
    return _records(_as_is, first, rest, "null")


def _as_is(record: Any, nan: str) -> Any:
    return record


def _records(encoder: Callable[[Any, str], Any], first: Any, rest: Iterator[Any], nan: str) -> Iterator[Any]:
    try:
        yield encoder(first, nan)
        for record in rest:
            yield encoder(record, nan)
    finally:
        _close(rest)


def _close(records: Iterator[Any]) -> None:
    close = getattr(records, "close", None)
    if close is not None:
        close()
