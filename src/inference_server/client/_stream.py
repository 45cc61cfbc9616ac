"""Decoders of streamed answers: JSON Lines, server-sent events, and raw chunks.

Each is fed the body's chunks as they arrive (``feed``) and told when it has ended (``end``); both return the
records completed so far. Chunk boundaries mean nothing: a record, an event, a line ending or a UTF-8 character may
be split over any number of chunks. They keep no more than the unfinished line, so they suit async clients too.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Generator, Iterable
from typing import Any

import orjson

from inference_server.codecs.streams import ServerSentEvent
from inference_server.errors import InferenceServerError, PredictionError

#: Media types streamed as JSON Lines: SageMaker's and the other names in use.
JSON_LINES_TYPES = frozenset(
    {"application/jsonlines", "application/jsonl", "application/x-jsonlines", "application/x-ndjson"}
)
EVENT_STREAM_TYPE = "text/event-stream"


class JSONLinesError(InferenceServerError, ValueError):
    """A line of a streamed JSON Lines answer is not JSON; ``line`` is its number (from 1, blank lines counted)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line} of the JSON Lines stream is not JSON: {reason}")
        self.line = line


class StreamError(PredictionError):
    """A streamed answer failed after it began: the connection closed before its end, or an endpoint sent a
    ``ModelStreamError`` or ``InternalStreamFailure``.

    ``code`` names the failure (``"IncompleteStream"``, or SageMaker's error code); ``status`` is the status the
    answer began with (2xx), so the failure is told apart by its type and ``code``, not its status.
    """

    def __init__(self, code: str, message: str, status: int = 200) -> None:
        super().__init__(status, message)
        self.code = code
        self.args = (f"{code}: {message}",)


class JSONLinesDecoder:
    """Records from a JSON Lines stream: one JSON value a line, ``\\n`` or ``\\r\\n`` endings, blank lines skipped;
    a last line without a newline is a record once the stream ends. A line that is not JSON raises
    :class:`JSONLinesError`."""

    def __init__(self) -> None:
        self._pending = bytearray()  # the start of a line whose newline has not arrived
        self._lines = 0

    def feed(self, chunk: bytes) -> list[Any]:
        """The records completed by ``chunk``."""
        self._pending += chunk
        if b"\n" not in chunk:
            return []
        *lines, rest = self._pending.split(b"\n")
        self._pending = rest
        return [record for line in lines for record in self._record(line)]

    def end(self) -> list[Any]:
        """The last record, when the stream ends without a newline."""
        line, self._pending = self._pending, bytearray()
        return self._record(line)

    def _record(self, line: bytearray) -> list[Any]:
        self._lines += 1
        if not line.strip():  # strip() also drops the CR of a CRLF
            return []
        try:
            return [orjson.loads(line)]
        except orjson.JSONDecodeError as exc:
            raise JSONLinesError(self._lines, f"{exc.msg} at column {exc.colno}") from None


_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEDecoder:
    """Events from a ``text/event-stream``, as the WHATWG HTML standard's "Interpreting an event stream" says.

    UTF-8 (invalid bytes become U+FFFD), one leading BOM dropped; lines end with CRLF, LF or CR; a blank line
    dispatches the event, unless its data is empty; an event not ended by a blank line when the stream ends is
    discarded. Decoding never fails."""

    def __init__(self) -> None:
        # utf-8-sig drops one BOM at the start only, and waits for a BOM or a character split over chunks
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        self._pending: list[str] = []  # the start of a line whose ending has not arrived
        self._after_cr = False  # the last text ended with CR: an LF starting the next is the same line ending
        self._data: list[str] = []
        self._event = ""
        self._id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events completed by ``chunk``."""
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if self._after_cr and text[0] == "\n":
            text = text[1:]
        self._after_cr = text.endswith("\r")
        *lines, rest = _LINE_END.split(text)
        if not lines:
            self._pending.append(rest)
            return []
        lines[0] = "".join(self._pending) + lines[0]
        self._pending = [rest] if rest else []
        events = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def end(self) -> list[ServerSentEvent]:
        """Nothing: an event the stream did not finish with a blank line is discarded, as the spec says. The decoder
        may then be fed the stream that reconnects: the last event id and reconnection time go on, as in a browser."""
        self._decoder.reset()
        self._pending, self._after_cr, self._data, self._event = [], False, [], ""
        return []

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":  # a comment
            return None
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent("\n".join(data), event or "message", self._id, self._retry)


class RawDecoder:
    """The chunks as they arrive, as ``bytes`` (empty ones dropped)."""

    def feed(self, chunk: bytes) -> list[bytes]:
        """``chunk``, unless empty."""
        return [bytes(chunk)] if chunk else []

    def end(self) -> list[bytes]:
        """Nothing: every byte was passed on."""
        return []


def stream_decoder(content_type: str | None) -> JSONLinesDecoder | SSEDecoder | RawDecoder:
    """A new decoder for a stream of ``content_type`` (case and parameters ignored): JSON Lines
    (``application/jsonlines``, ``application/jsonl``, ``application/x-jsonlines``, ``application/x-ndjson``),
    server-sent events (``text/event-stream``), else raw chunks."""
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type in JSON_LINES_TYPES:
        return JSONLinesDecoder()
    if media_type == EVENT_STREAM_TYPE:
        return SSEDecoder()
    return RawDecoder()


def decode_stream(chunks: Iterable[bytes], content_type: str | None) -> Generator[Any, None, None]:
    """The records of ``chunks`` (a body of ``content_type``), each yielded as soon as its last chunk arrives.

    Closing this iterator closes ``chunks`` (when it has ``close``), so an answer read half-way is not left open."""
    decoder = stream_decoder(content_type)
    try:
        for chunk in chunks:
            yield from decoder.feed(chunk)
        yield from decoder.end()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
