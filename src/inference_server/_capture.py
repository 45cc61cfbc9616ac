"""SageMaker Data Capture done by the server itself: a sample of the requests and their responses, written as JSON
Lines in SageMaker's format and layout to a local directory or an ``s3://`` prefix (the ``[s3]`` extra), so that what
reads SageMaker's capture (Model Monitor, Clarify, one's own jobs) reads ours.

A record is SageMaker's, one JSON object a line (the Developer Guide's ``model-monitor-data-capture-endpoint.md``,
https://docs.aws.amazon.com/sagemaker/latest/dg/model-monitor-data-capture-endpoint.html; wrapped here)::

    {"captureData": {"endpointInput": {"observedContentType": "text/csv", "mode": "INPUT",
                                       "data": "69,0,153.7\\n", "encoding": "CSV"},
                     "endpointOutput": {"observedContentType": "text/csv; charset=utf-8", "mode": "OUTPUT",
                                        "data": "0.0254181120544672", "encoding": "CSV"}},
     "eventMetadata": {"eventId": "<uuid4>", "inferenceId": "<if given>", "customAttributes": "<if given>",
                       "inferenceTime": "2022-02-14T17:25:49Z"},
     "eventVersion": "0"}

A body whose media type (parameters such as ``charset`` ignored, in any case) is one of the CSV or JSON types is kept
as its UTF-8 text, and any other body, or one that is not UTF-8, as base64: the AWS example encodes
``text/csv; charset=utf-8`` as ``CSV`` with the list ``text/csv``. ``observedContentType`` is the content type as
given; a body without one (or with an empty one) is observed as ``application/octet-stream``, what HTTP lets a
recipient assume of it (RFC 9110, section 8.3), and so is base64. The mode ``input`` or ``output`` leaves the other
key out, and a request with nothing to capture in the mode (no response, in mode ``output``) writes no record.

The files go where SageMaker puts them: ``<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/<MM-SS-mmm>-<uuid4>.jsonl``,
the folder the UTC hour of the records' inference and the name the minute, second and millisecond of the file's first
record. A file holds one hour's records and at most ``max_file_bytes`` (more only for a single larger record).

Capture never slows a request beyond building its line, and never fails it: :meth:`Capture.record` appends the line
to a buffer in memory and a writer thread writes the buffer every ``flush_seconds``. The buffer is bounded: a record
that would take it past ``max_buffer_bytes`` is dropped and counted, with a warning at most once a minute, rather
than waiting for the destination or growing without end. A write that fails keeps its lines to retry, and the oldest
are dropped past the bound (with the lines being written, memory holds at most twice ``max_buffer_bytes``).

Locally, each flush appends its lines to the hour's file with one write, cut back to the file's previous length if
the write fails midway (a full disk), so between flushes a file holds only whole lines, and they are visible within
``flush_seconds``. A hidden ``.<name>.incomplete`` file renamed when finished was the alternative, dropped because a
file is finished only at the end of its hour or at ``max_file_bytes``: its records would be out of sight that long.
An object store cannot append: each flush writes new objects, which appear only once uploaded whole. Every
worker process has a :class:`Capture` of its own, and the uuid in each name keeps their files apart.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from inference_server.errors import ConfigurationError

logger = logging.getLogger("inference_server")

#: What a record is taken to hold in the buffer besides its bodies' bytes (their copies): its line's fields, as
#: :meth:`Capture.record` counts it against ``max_buffer_bytes`` before the writer's thread makes its line.
RECORD_BYTES = 512
#: What each capture mode writes: (the request, the response).
MODES = {"input": (True, False), "output": (False, True), "both": (True, True)}
#: How a body without a content type is observed.
DEFAULT_CONTENT_TYPE = "application/octet-stream"
MIB = 1024 * 1024
#: The same trouble is logged at most this often (seconds).
LOG_EVERY = 60.0
#: Files kept open for appending, one per hour folder: the last hours' (a record of an earlier hour starts a new file).
OPEN_HOURS = 2
EXTRA = "pip install 'inference-server[s3]'"

#: A captured body: its content type (None if it had none) and its bytes.
Body = tuple[str | None, bytes | bytearray | memoryview]
#: A buffered record: when its inference was (seconds since the epoch) and its line.
_Entry = tuple[float, bytes]
#: A record as :meth:`Capture.record` keeps it until the writer makes its line: the bodies' copies and the ids.
_Kept = tuple["Body | None", "Body | None", "str | None", "str | None"]


class _TooLarge(Exception):
    """A body larger than the whole buffer: not copied."""


def _copied(data: Any, limit: int) -> bytes:
    """``data``'s bytes, kept (``bytes`` are not copied again); :class:`_TooLarge` past ``limit`` bytes, before any
    copy; TypeError for what is not a buffer."""
    if type(data) is bytes:
        if len(data) > limit:
            raise _TooLarge
        return data
    if memoryview(data).nbytes > limit:
        raise _TooLarge
    return bytes(data)


def _held(kept: bytes | _Kept) -> int:
    """What a buffered record holds: its line, or its bodies' copies and :data:`RECORD_BYTES`."""
    if isinstance(kept, bytes):
        return len(kept)
    return RECORD_BYTES + sum(len(body[1]) for body in kept[:2] if body is not None)


def media_type(content_type: str) -> str:
    """A content type's media type, lower-cased, without parameters: ``Text/CSV; charset=utf-8`` -> ``text/csv``."""
    return content_type.partition(";")[0].strip().lower()


def _event_ids(count: int) -> Iterator[str]:
    """``count`` random (version 4) UUIDs as ``str(uuid.uuid4())`` writes them, from one read of ``os.urandom``: a
    third of their cost one by one."""
    digits = os.urandom(16 * count).hex()
    for start in range(0, 32 * count, 32):
        d = digits[start : start + 32]
        yield f"{d[:8]}-{d[8:12]}-4{d[13:16]}-{_VARIANT[d[16]]}{d[17:20]}-{d[20:]}"


#: The first hex digit of a UUID's variant field (RFC 9562: binary 10xx), from any hex digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def inference_time(when: float) -> str:
    """``when`` as SageMaker writes ``inferenceTime``: UTC to the second, ``2022-02-14T17:25:49Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def hour_folder(when: float) -> str:
    """The folder of the records of ``when``'s UTC hour: ``yyyy/mm/dd/hh``."""
    return time.strftime("%Y/%m/%d/%H", time.gmtime(when))


def file_name(when: float) -> str:
    """A new file whose first record is of ``when``: ``MM-SS-mmm-<uuid4>.jsonl``."""
    return f"{time.strftime('%M-%S', time.gmtime(when))}-{int(when * 1000) % 1000:03d}-{uuid.uuid4()}.jsonl"


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL for fsspec rather than a local path (as ``transform.storage.is_url``)."""
    return "://" in location and not location.startswith("file://")


class _Directory:
    """Capture files in a local directory, each flush appended with one write."""

    appends = True

    def __init__(self, root: str) -> None:
        self.root = root.removeprefix("file://")

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def write(self, path: str, data: bytes) -> None:
        """Append ``data`` to ``path``, or leave the file as it was if that fails."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                rest = memoryview(data)
                while rest:
                    rest = rest[os.write(fd, rest) :]
            except BaseException:
                with contextlib.suppress(OSError):
                    if start:
                        os.ftruncate(fd, start)  # no partial line for a reader, and none to follow the retry's
                    else:
                        os.unlink(path)
                raise
        finally:
            os.close(fd)


class _Bucket:
    """Capture objects on an fsspec filesystem (S3), a new object for each flush: objects cannot be appended to."""

    appends = False

    def __init__(self, url: str) -> None:
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError:
            raise ConfigurationError(f"data capture to {url} needs fsspec and its filesystems: {EXTRA}") from None
        try:
            # an instance of our own: fsspec's cached one may have been made for other settings
            self.fs: Any
            self.fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
        except (ImportError, ValueError) as exc:
            raise ConfigurationError(f"data capture to {url}: {exc} ({EXTRA} for s3://)") from None
        self.root = str(root).rstrip("/")

    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)


class Capture:
    """SageMaker Data Capture's writer for one endpoint variant: ask :meth:`sampled`, then :meth:`record` the request.

    The counters, for metrics: ``captured`` (records accepted), ``dropped`` (records lost to a full buffer, to a
    failing destination, or arriving after :meth:`close`), ``written`` (records written), ``write_errors`` (writes that
    failed, each retried) and ``record_errors`` (records that could not be built, each logged).
    """

    def __init__(
        self,
        destination: str,
        *,
        sampling: float,
        mode: str,
        csv_types: Sequence[str] = ("text/csv",),
        json_types: Sequence[str] = ("application/json",),
        endpoint: str,
        variant: str = "AllTraffic",
        max_buffer_bytes: int = 64 * MIB,
        max_file_bytes: int = 64 * MIB,
        flush_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 <= sampling <= 100:
            raise ConfigurationError(f"data capture sampling {sampling!r}: not a percentage from 0 to 100")
        if mode not in MODES:
            raise ConfigurationError(f"data capture mode {mode!r}: not one of {', '.join(MODES)}")
        for name, value in (("endpoint", endpoint), ("variant", variant)):
            if not value or "/" in value:
                raise ConfigurationError(f"data capture {name} {value!r}: not a name (empty, or with a '/')")
        for name, number in (
            ("max_buffer_bytes", max_buffer_bytes),
            ("max_file_bytes", max_file_bytes),
            ("flush_seconds", flush_seconds),
        ):
            if not number > 0:
                raise ConfigurationError(f"data capture {name} {number!r}: not positive")
        csv, json = {media_type(t) for t in csv_types}, {media_type(t) for t in json_types}
        if csv & json:
            raise ConfigurationError(f"data capture: {', '.join(sorted(csv & json))} listed as both CSV and JSON")
        self.destination = destination
        self._sink = _Bucket(destination) if is_url(destination) else _Directory(destination)
        self._sampling = sampling / 100
        self._input, self._output = MODES[mode]
        #: media type -> how its bodies are written (any other: BASE64)
        self._encodings = {**dict.fromkeys(csv, "CSV"), **dict.fromkeys(json, "JSON")}
        self._by_type: dict[str, str] = {}  # content type as observed -> its encoding
        self._second, self._time = -1, ""  # the last inference time written, by its second
        self._prefix = f"{endpoint}/{variant}"
        self._max_buffer_bytes = max_buffer_bytes
        self._max_file_bytes = max_file_bytes
        self._flush_seconds = flush_seconds
        self._clock = clock

        self.captured = self.dropped = self.written = self.write_errors = self.record_errors = 0
        self._lock = threading.Lock()  # the buffer and the counters a request changes
        self._waiting: collections.deque[tuple[float, bytes | _Kept]] = collections.deque()
        self._waiting_bytes = 0
        self._in_flight = 0  # records taken by a flush and not yet written or put back
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # one flush at a time; the files below
        self._files: dict[str, tuple[str, int]] = {}  # hour folder -> (its file being appended to, its size)
        self._dropped_warned = 0
        self._next_drop_warning = self._next_error_log = self._next_record_error_log = 0.0

    def sampled(self) -> bool:
        """Whether to capture this request: true with the sampling percentage's probability."""
        return random.random() < self._sampling

    def invocation(self, environ: Mapping[str, Any], body: Any, output: Any) -> None:
        """Capture one answered invocation if it is sampled: its body, the request's ``Content-Type``, inference id
        and custom attributes from the WSGI ``environ``, and ``output`` (the pipeline's
        :class:`~inference_server._pipeline.Output`): a whole answer now, a streamed one once it ends whole, its
        chunks joined (what the lifecycle calls, for every route that invokes the model)."""
        if self._sampling < 1.0 and random.random() >= self._sampling:
            return
        request = (
            environ.get("CONTENT_TYPE") or None,
            body,
            output.media_type,
            environ.get("HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID"),
            environ.get("HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES"),
        )
        if output.stream is None:
            self._answered(request, output.buffers)
        else:
            output.stream.capture(output.buffers[0], functools.partial(self._answered, request), self._max_buffer_bytes)

    def _answered(self, request: tuple[Any, ...], chunks: list[Any] | None) -> None:
        """Record ``request`` (its content type, body, answer's media type and ids) with its answer's ``chunks`` (None:
        more than the buffer holds)."""
        if chunks is None or (
            len(chunks) > 1 and sum(memoryview(chunk).nbytes for chunk in chunks) > self._max_buffer_bytes
        ):  # (larger than the buffer: dropped before it is joined)
            with self._lock:
                self.dropped += 1
            self._warn_dropped()
            return
        content_type, body, media_type, inference_id, custom = request
        answer = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.record(
            input=(content_type, body),
            output=(media_type, answer),
            inference_id=inference_id,
            custom_attributes=custom,
        )

    def record(
        self,
        *,
        input: Body | None,
        output: Body | None,
        inference_id: str | None = None,
        custom_attributes: str | None = None,
        when: float | None = None,
    ) -> None:
        """Buffer the record of one invocation (``when`` it was inferred, by default now), to be written soon: its
        bodies copied (a copy of at most ``max_buffer_bytes``), its line made by the writer's thread.

        Never raises: a record that cannot be built is logged and counted in ``record_errors``.
        """
        wanted_input = self._input and input is not None
        wanted_output = self._output and output is not None
        if not (wanted_input or wanted_output):
            return  # (nothing to capture in the mode)
        try:
            kept: _Kept = (
                (input[0], _copied(input[1], self._max_buffer_bytes)) if wanted_input else None,  # type: ignore[index]
                (output[0], _copied(output[1], self._max_buffer_bytes)) if wanted_output else None,  # type: ignore[index]
                inference_id,
                custom_attributes,
            )
        except _TooLarge:
            kept = None  # type: ignore[assignment]
        except Exception:
            self._record_failed()
            return
        if kept is None:
            size = self._max_buffer_bytes + 1
        else:  # (what _held says, written out: this is the request's path)
            size = RECORD_BYTES
            if kept[0] is not None:
                size += len(kept[0][1])
            if kept[1] is not None:
                size += len(kept[1][1])
        moment = self._clock() if when is None else when
        start = dropped = False
        with self._lock:
            if self._closed:
                self.dropped += 1
                self._dropped_warned += 1  # not the buffer's fault: nothing to warn about
                return
            if self._waiting_bytes + size > self._max_buffer_bytes:
                self.dropped += 1
                dropped = True
            else:
                self._waiting.append((moment, kept))
                self._waiting_bytes += size
                self.captured += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="data-capture", daemon=True)
                    start = True
        if start:
            self._start()
        elif dropped:
            self._warn_dropped()

    def flush(self) -> None:
        """Write what is buffered now (the writer thread does every ``flush_seconds``); a failure is logged."""
        with self._write_lock:
            with self._lock:
                taken, self._waiting = self._waiting, collections.deque()
                self._waiting_bytes = 0
                self._in_flight = len(taken)
            unwritten = self._write(self._lines(taken)) if taken else []
            with self._lock:
                self._in_flight = 0
                self._waiting.extendleft(reversed(unwritten))
                self._waiting_bytes += sum(len(line) for _, line in unwritten)
                while self._waiting_bytes > self._max_buffer_bytes:
                    _, kept = self._waiting.popleft()
                    self._waiting_bytes -= _held(kept)
                    self.dropped += 1
        self._warn_dropped()

    def close(self, timeout: float = 10) -> None:
        """Write everything buffered and stop the writer thread, waiting at most ``timeout`` seconds; a record after
        this is dropped. Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None or thread.ident is None:
            self.flush()
        else:
            self._stop.set()
            thread.join(timeout)
        with self._lock:
            left = len(self._waiting) + self._in_flight
        if left:
            logger.error("data capture closed with %d records not written to %s", left, self.destination)
        self._next_drop_warning = 0.0
        self._warn_dropped()

    def _lines(self, entries: collections.deque[tuple[float, bytes | _Kept]]) -> collections.deque[_Entry]:
        """``entries`` with their lines made (on the writer's thread); one that cannot be made is counted and
        logged."""
        lines: collections.deque[_Entry] = collections.deque()
        ids = _event_ids(len(entries))
        for moment, kept in entries:
            event_id = next(ids)
            if isinstance(kept, bytes):  # (made before: put back after a failed write)
                lines.append((moment, kept))
                continue
            try:
                line = self._line(kept[0], kept[1], kept[2], kept[3], moment, event_id)
            except Exception:
                self._record_failed()
                continue
            if line is not None:
                lines.append((moment, line))
        return lines

    def _line(
        self,
        input: Body | None,
        output: Body | None,
        inference_id: str | None,
        custom_attributes: str | None,
        when: float,
        event_id: str,
    ) -> bytes | None:
        """The record's JSON line, or None if there is nothing to capture in this mode."""
        capture: dict[str, dict[str, str]] = {}
        if self._input and input is not None:
            capture["endpointInput"] = self._data(input, "INPUT")
        if self._output and output is not None:
            capture["endpointOutput"] = self._data(output, "OUTPUT")
        if not capture:
            return None
        metadata = {"eventId": event_id}
        if inference_id is not None:
            metadata["inferenceId"] = inference_id
        if custom_attributes is not None:
            metadata["customAttributes"] = custom_attributes
        second = int(when)
        if second != self._second:  # (records come many a second: the time is written once for them)
            self._second, self._time = second, inference_time(when)
        metadata["inferenceTime"] = self._time
        record = {"captureData": capture, "eventMetadata": metadata, "eventVersion": "0"}
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)

    def _data(self, body: Body, mode: str) -> dict[str, str]:
        content_type, data = body
        observed = content_type or DEFAULT_CONTENT_TYPE
        encoding = self._by_type.get(observed)
        if encoding is None:  # (a content type's encoding, found once: a server sees few of them)
            encoding = self._encodings.get(media_type(observed), "BASE64")
            if len(self._by_type) < 256:
                self._by_type[observed] = encoding
        text = ""
        if encoding != "BASE64":
            try:
                text = str(data, "utf-8")
            except UnicodeDecodeError:
                encoding = "BASE64"
        if encoding == "BASE64":
            text = base64.b64encode(data).decode("ascii")
        return {"observedContentType": observed, "mode": mode, "data": text, "encoding": encoding}

    def _write(self, entries: collections.deque[_Entry]) -> list[_Entry]:
        """Write ``entries`` to their hours' files; the entries not written, if a write failed."""
        hours: dict[str, list[_Entry]] = {}
        folders_of: dict[int, str] = {}  # (the hour's folder, made once an hour)
        for entry in entries:
            hour = int(entry[0]) // 3600
            folder = folders_of.get(hour)
            if folder is None:
                folder = folders_of[hour] = hour_folder(entry[0])
            hours.setdefault(folder, []).append(entry)
        folders = list(hours)
        for index, folder in enumerate(folders):
            group, start = hours[folder], 0
            while start < len(group):
                path, size = self._files.get(folder, ("", 0))
                if not path or size + len(group[start][1]) > self._max_file_bytes:
                    path, size = self._sink.path(self._prefix, folder, file_name(group[start][0])), 0
                end, size = start + 1, size + len(group[start][1])
                while end < len(group) and size + len(group[end][1]) <= self._max_file_bytes:
                    size += len(group[end][1])
                    end += 1
                try:
                    self._sink.write(path, b"".join(line for _, line in group[start:end]))
                except Exception as exc:
                    self._write_failed(path, exc)
                    return group[start:] + [entry for later in folders[index + 1 :] for entry in hours[later]]
                self.written += end - start
                if self._sink.appends:
                    self._files[folder] = (path, size)
                start = end
        for folder in sorted(self._files)[:-OPEN_HOURS]:
            del self._files[folder]
        return []

    def _start(self) -> None:
        assert self._thread is not None
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had: the next record tries again
            with self._lock:
                self._thread = None
            logger.exception("data capture could not start its writer thread")

    def _run(self) -> None:
        while not self._stop.wait(self._flush_seconds):
            self._step()
        self._step()

    def _step(self) -> None:
        try:
            self.flush()
        except Exception:
            logger.exception("data capture's writer failed; it carries on")

    def _warn_dropped(self) -> None:
        now = time.monotonic()
        with self._lock:
            count = self.dropped - self._dropped_warned
            if not count or now < self._next_drop_warning:
                return
            self._dropped_warned = self.dropped
            self._next_drop_warning = now + LOG_EVERY
        logger.warning(
            "data capture dropped records, its buffer (max_buffer_bytes=%d) full: %d since the last warning, %d in "
            "all; lower the sampling percentage or capture to a faster destination",
            self._max_buffer_bytes,
            count,
            self.dropped,
        )

    def _write_failed(self, path: str, exc: Exception) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + LOG_EVERY
            logger.error(
                "data capture could not write %s (%d failed writes so far), its records are kept to retry: %s",
                path,
                self.write_errors,
                exc,
            )

    def _record_failed(self) -> None:
        with self._lock:
            self.record_errors += 1
            now = time.monotonic()
            log = now >= self._next_record_error_log
            if log:
                self._next_record_error_log = now + LOG_EVERY
        if log:
            logger.exception("data capture could not record a request (%d so far)", self.record_errors)
