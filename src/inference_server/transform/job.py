"""What every engine runs a transform job's files with: :class:`Job` (the predictor, the pools and bounds, the running
totals) transforms one input file, or one :class:`Task` (a part of a large file), into its output.

The local engine runs a whole job in one ``Job``; the others (``--workers`` processes, Dask, Ray) run one ``Job`` per
task in their worker processes (:func:`~inference_server.transform.tasks.run_task`). Below the engines and below the
planning of the tasks they share (:mod:`~inference_server.transform.tasks`): it imports neither.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from inference_server._settings import BatchStrategy
from inference_server.errors import HookError, HTTPError, PredictionError, TransformError
from inference_server.transform import TransformSummary, filters, records

if TYPE_CHECKING:
    from inference_server.transform import Predictor, TransformOptions
    from inference_server.transform.storage import Store

logger = logging.getLogger("inference_server")

#: Seconds between progress lines.
PROGRESS_EVERY = 10.0


@dataclass(frozen=True)
class Task:
    """A unit of a job that another engine runs: a whole input file, or part ``part`` of ``parts`` of it."""

    path: str
    name: str
    part: int = 0
    parts: int = 1

    def target(self, output: Store) -> str:
        """Where this task writes: the file's ``.out``, or for a part, a part file that
        :func:`~inference_server.transform.tasks.finish` joins."""
        target = output.target(self.name)
        return target if self.parts == 1 else f"{target}.part-{self.part:05d}"


def done(source: Store, output: Store, path: str, name: str) -> bool:
    """Whether the input's ``.out`` exists and is at least as new as the input (``resume`` skips it)."""
    finished, started = output.modified(output.target(name)), source.modified(path)
    return finished is not None and started is not None and finished >= started


class Job:
    """One run of the local engine (or one task of another engine): the predictor, the pools and bounds, the
    running totals. ``file`` transforms one input file."""

    def __init__(self, options: TransformOptions, predictor: Predictor, source: Store, output: Store) -> None:
        self.options = options
        self.source, self.output = source, output
        self.predictor = predictor
        concurrency = options.max_concurrent_transforms or 1
        self.requests = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="transform-request")
        self.bodies = threading.BoundedSemaphore(2 * concurrency)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.processing = filters.Processing.create(
            options.content_type, options.input_filter, options.join_source, options.output_filter
        )
        self.summary = TransformSummary()
        #: The progress bar, when there is one (see :func:`progress_bar`).
        self.bar: Any = None
        self.started = time.monotonic()
        self.reported = self.started

    def count(self, records: int, bytes_in: int, bytes_out: int, read: int = 0) -> None:
        """Add one request to the totals; ``read``: bytes of its input file it got through (for the bar)."""
        with self.lock:
            self.summary.records += records
            self.summary.requests += 1
            self.summary.bytes_in += bytes_in
            self.summary.bytes_out += bytes_out
            now = time.monotonic()
            if self.bar is not None:
                self.bar.update(read)
                self.bar.set_postfix_str(f"{self.summary.records} records", refresh=False)
            elif not self.options.quiet and now - self.reported >= PROGRESS_EVERY:
                self.reported = now
                elapsed = now - self.started
                logger.info(
                    "Transform: %d records in %d requests, %d bytes, %.0f records/s",
                    self.summary.records,
                    self.summary.requests,
                    self.summary.bytes_in,
                    self.summary.records / elapsed,
                )

    def predict(self, request: records.Request, name: str) -> bytes:
        try:
            answer, _ = self.predictor.predict(request.body, self.options.content_type, self.options.accept)
        except HookError as exc:
            logger.error("%s: %s", name, exc.summary, exc_info=exc.error)
            raise TransformError(
                f"{name}: the request of records {request.first} to {request.first + request.count - 1} failed: "
                f"{exc.summary}: {exc.error}"
            ) from exc
        except PredictionError as exc:
            what = f"answered {exc.status}" if exc.status else "failed"
            raise TransformError(
                f"{name}: the request of records {request.first} to {request.first + request.count - 1} {what}: "
                f"{exc.message}"
            ) from exc
        except HTTPError as exc:
            raise TransformError(
                f"{name}: the request of records {request.first} to {request.first + request.count - 1} was "
                f"refused ({exc.code}): {exc.description}"
            ) from exc
        if self.processing is not None and (self.processing.join or self.processing.output_filter):
            return self._joined(request, answer, name)
        return records.assembled(answer, self.options.assemble_with)

    def _joined(self, request: records.Request, answer: bytes, name: str) -> bytes:
        """One line per record: its answer joined with it and filtered; the answer must have a line per record."""
        assert self.processing is not None
        lines = [answer.rstrip(b"\r\n")] if request.count == 1 else answer.splitlines()
        if len(lines) != request.count:
            raise TransformError(
                f"{name}: the answer to records {request.first} to {request.first + request.count - 1} has "
                f"{len(lines)} lines for {request.count} records; joining and output filters need one per record"
            )
        return b"".join(
            self.processing.output(original, line, f"{name}: record {request.first + number}") + b"\n"
            for number, (original, line) in enumerate(zip(request.originals, lines, strict=True))
        )

    def split(self, source: BinaryIO, name: str, start: int = 0, end: int | None = None) -> Iterator[records.Record]:
        """The file's records (those starting in ``[start, end)``), with the input filter applied (the original
        kept for a join)."""
        split = records.split(source, self.options.split_type, name, start, end)
        processing = self.processing
        if processing is None:
            yield from split
            return
        keep = processing.join
        for record in split:
            payload = processing.filter_input(record.payload, f"{name}: record {record.index}")
            framed = payload + b"\n" if self.options.split_type == "Line" else payload
            yield records.Record(record.index, record.offset, framed, payload, record.payload if keep else None)

    def requests_of(self, source: BinaryIO, name: str, start: int, end: int | None) -> Iterator[records.Request]:
        """The requests for the file's records starting in ``[start, end)``. MultiRecord Line records without filters or
        a join are never needed one by one: their requests are cut from the file with byte searches."""
        strategy = self.options.batch_strategy
        assert strategy is not None  # resolved
        limit, part_size = self.options.limit, self.options.part_size
        if self.options.split_type == "Line" and strategy is BatchStrategy.MULTI_RECORD and self.processing is None:
            return records.line_requests(source, limit, name, start, end, part_size)
        return records.requests(self.split(source, name, start, end), strategy, limit, name, part_size)

    def answers(self, requests: Iterator[records.Request], name: str) -> Iterator[tuple[records.Request, bytes]]:
        """The answers to ``requests`` in their order, computed up to the bound of bodies held at once."""
        pending: collections.deque[tuple[records.Request, concurrent.futures.Future[bytes]]] = collections.deque()
        try:
            for request in requests:
                if self.stop.is_set():
                    raise TransformError(f"{name}: stopped after another file failed (--fail-fast)")
                while not self.bodies.acquire(blocking=False):  # all held: ours are freed by taking answers
                    if pending:
                        yield self._next(pending)
                    else:  # other files hold them all; they free them as their answers arrive
                        self.bodies.acquire()
                        break
                pending.append((request, self.requests.submit(self.predict, request, name)))
                while pending and pending[0][1].done():
                    yield self._next(pending)
            while pending:
                yield self._next(pending)
        finally:
            for _, future in pending:
                future.cancel()
                self.bodies.release()

    def _next(
        self, pending: collections.deque[tuple[records.Request, concurrent.futures.Future[bytes]]]
    ) -> tuple[records.Request, bytes]:
        request, future = pending.popleft()
        try:
            return request, future.result()
        finally:
            self.bodies.release()

    def file(self, path: str, name: str) -> None:
        """Transform one whole input file into its ``.out`` (skipped with ``resume`` if that is newer)."""
        if self.options.resume and done(self.source, self.output, path, name):
            with self.lock:
                self.summary.skipped += 1
            return
        self.task(Task(path, name))

    def task(self, task: Task) -> None:
        """Transform a file, or one part of it into its part file (see ``tasks.plan``)."""
        part_size = self.options.part_size
        name = task.name
        try:
            with self.source.open(task.path) as source, self.output.writing(task.target(self.output)) as sink:
                start, end = 0, None
                if task.parts > 1:
                    assert part_size is not None
                    start = records.start_at(source, self.options.split_type, task.part * part_size, name)
                    end = (task.part + 1) * part_size
                    name = f"{name} (part {task.part + 1} of {task.parts}, records counted from byte {start})"
                read = start
                for request, answer in self.answers(self.requests_of(source, name, start, end), name):
                    sink.write(answer)
                    self.count(request.count, len(request.body), len(answer), request.end - read)
                    read = request.end
        except OSError as exc:
            raise TransformError(f"{name}: {exc}") from exc
