"""SageMaker Asynchronous Inference, done locally: requests accepted at once into a durable queue
(:mod:`inference_server._asyncqueue`), run through the same lifecycle as ``/invocations``, their answers written to
the output location and their errors to the failure location, each announced as SageMaker announces it.

``serve --async-output URI`` turns it on (:func:`check` at start-up, :func:`start` in each worker once its model is
loaded). The route (:mod:`inference_server.wsgi.async_invocations`) validates a request and calls :func:`accept`;
``--async-workers`` runner threads in each worker claim entries (at most that many running on the machine) and
:meth:`Runner.run` each:

1. An entry whose ``RequestTTLSeconds`` ran out while it waited becomes a failure (``expired``), without a model call.
2. The input is read from its location (``s3://`` through s3fs, or a local path) into one buffer of its size: up to
   :data:`MAX_INPUT` bytes (SageMaker's 1 GB), whatever ``MaxPayloadInMB`` says for real-time requests.
3. The app is called as a server calls it, ``POST /invocations`` with that body (given, not read again), the
   request's ``ContentType``, ``Accept``, ``CustomAttributes`` and ``InferenceId`` as headers, and its
   ``InvocationTimeoutSeconds`` in place of ``--timeout``: the hooks, codecs, micro-batching, metrics, access line
   and span are those of every invocation.
4. A 2xx answer is written to ``<output>/<name>.out`` with its media type (the S3 object's ``Content-Type``, which the
   SageMaker SDK's ``AsyncPredictor`` decodes by); any other to ``<failure>/<name>-error.out``, the container's error
   body as it is, as SageMaker writes it. Locally a file appears under its name only once it is whole.
5. The success or error notification is sent, then the entry is finished. A notification that cannot be delivered
   is logged and counted, never retried for ever.

Nothing accepted is lost: the entry outlives the worker and the server (see :mod:`inference_server._asyncqueue` for
what happens when a runner dies mid-way), and a drain stops the runners from claiming more while the running ones
finish within ``--graceful-timeout``.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import logging
import os
import re
import stat
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from inference_server import _asyncqueue, metrics
from inference_server.errors import ConfigurationError, InferenceServerError

if TYPE_CHECKING:
    from inference_server._settings import Settings
    from inference_server.wsgi._app import App

logger = logging.getLogger("inference_server")

#: The largest input object, in bytes: SageMaker's limit for asynchronous requests (1 GB).
MAX_INPUT = 1 << 30
#: An inline body's limit (InvokeEndpointAsync's ``Body``, botocore 1.44): SageMaker's.
MAX_INLINE = 128_000
#: The bytes of an input read at a time, into its buffer.
_READ_CHUNK = 8 << 20
#: Seconds an idle runner waits before looking at the queue again (other workers' entries, expired ones).
POLL = 0.5
#: Seconds between two looks for the entries of runners that died.
RECOVER_EVERY = 5.0
#: Seconds a notification's delivery may take.
NOTIFY_TIMEOUT = 10.0
#: An SNS topic's ARN, as SageMaker's NotificationConfig takes it.
_SNS_ARN = re.compile(r"arn:aws[a-z\-]*:sns:([a-z0-9\-]*):[0-9]{12}:[a-zA-Z0-9_.\-]+")


class InputError(InferenceServerError):
    """The input of an asynchronous request could not be read (SageMaker's ``RequestDownloadFailures``)."""


def default_queue_directory(settings: Settings) -> Path:
    """Where the queue lives unless ``--async-queue`` says: under ``$XDG_STATE_HOME`` (else ``~/.local/state``), in a
    directory of the server's own, named by what makes it the same server when it starts again (its output and
    failure locations, model directory and script): two servers of other models never run each other's requests."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    identity = "\0".join(
        str(part) for part in (settings.async_output, settings.async_failure, settings.model_dir, settings.script)
    )
    return Path(state) / "inference-server" / "async-queue" / hashlib.sha256(identity.encode()).hexdigest()[:16]


def check(settings: Settings) -> None:
    """Refuse, at start-up, settings asynchronous inference cannot work with (a ConfigurationError saying why)."""
    if settings.async_output is None:
        for option in ("async_failure", "async_notify_success", "async_notify_error"):
            if getattr(settings, option) is not None:
                raise ConfigurationError(f"--{option.replace('_', '-')} needs --async-output URI")
        return
    for option in ("async_output", "async_failure"):
        location = getattr(settings, option)
        if location is not None:
            _store(location, f"--{option.replace('_', '-')}")
    for option in ("async_notify_success", "async_notify_error"):
        target = getattr(settings, option)
        if target is not None and not target.startswith(("http://", "https://")) and not _SNS_ARN.fullmatch(target):
            raise ConfigurationError(
                f"--{option.replace('_', '-')} {target!r} is neither an http(s):// URL nor an SNS topic ARN "
                "(arn:aws:sns:REGION:ACCOUNT:NAME)"
            )
        if target is not None and target.startswith("arn:") and importlib.util.find_spec("boto3") is None:
            raise ConfigurationError(
                f"--{option.replace('_', '-')}: SNS notifications need boto3: pip install 'inference-server[aws]'"
            )
    Queue.of(settings).close()  # the directory can be made and the database opened (not kept: never across a fork)
    Queue.forget(settings)


class Queue:
    """The queue of this process, for its settings (opened once per process: a forked worker opens its own)."""

    _opened: dict[tuple[int, Path], _asyncqueue.Queue] = {}  # noqa: RUF012

    @classmethod
    def of(cls, settings: Settings) -> _asyncqueue.Queue:
        key = cls._key(settings)
        directory = key[1]
        queue = cls._opened.get(key)
        if queue is None:
            try:
                queue = cls._opened[key] = _asyncqueue.Queue(directory)
            except Exception as exc:
                raise ConfigurationError(f"the asynchronous requests' queue {str(directory)!r}: {exc}") from exc
        return queue

    @classmethod
    def forget(cls, settings: Settings) -> None:
        """Drop this process's queue for ``settings`` (closed by the caller)."""
        cls._opened.pop(cls._key(settings), None)

    @staticmethod
    def _key(settings: Settings) -> tuple[int, Path]:
        directory = Path(settings.async_queue) if settings.async_queue else default_queue_directory(settings)
        return os.getpid(), directory.resolve()


def locations(settings: Settings, name: str) -> tuple[str, str]:
    """Where the answer and the error of the request whose files are called ``name`` go."""
    assert settings.async_output is not None
    output = _joined(settings.async_output, f"{name}.out")
    failure = _joined(settings.async_failure or settings.async_output, f"{name}-error.out")
    return output, failure


def _joined(location: str, name: str) -> str:
    """``name`` under the directory or prefix ``location`` (a local one made absolute)."""
    if "://" in location and not location.startswith("file://"):
        return f"{location.rstrip('/')}/{name}"
    return str(Path(location.removeprefix("file://")).absolute() / name)


def file_stem(filename: str | None, extension: str | None) -> str:
    """The name (before ``.out``) of a request's files: its ``Filename`` (``S3OutputPathExtension`` before it), else a
    new UUID, never the client's inference id (as SageMaker names them: a request sent again with the same id must
    not find the answer of the one before)."""
    stem = filename if filename is not None else str(uuid.uuid4())
    return f"{extension.strip('/')}/{stem}" if extension else stem


def accept(settings: Settings, request: dict[str, Any], ttl: int) -> bool:
    """Queue an accepted request durably; False if the queue is full. The runners of this process are woken."""
    accepted = Queue.of(settings).put(request, ttl, settings.async_max_queue)
    if accepted:
        _wake.set()
    return accepted


def keep_inline(settings: Settings, body: bytes) -> str:
    """Keep an inline body in the queue's directory (synced to disk) until its request is done; its path."""
    directory = Queue.of(settings).directory / "inputs"
    path = directory / f"{uuid.uuid4()}.in"
    with open(path, "wb") as sink:
        sink.write(body)
        sink.flush()
        os.fsync(sink.fileno())
    return str(path)


#: Set when this process queued something: its runners look at the queue at once.
_wake = threading.Event()


def _store(location: str, what: str = "the location") -> Any:
    """The storage of ``location`` (a ConfigurationError if it needs what is not installed)."""
    from inference_server.transform import storage

    try:
        return storage.store(location)
    except InferenceServerError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None


def read_input(location: str, limit: int = MAX_INPUT) -> bytearray:
    """The object or file at ``location``, read into one buffer of its size (an InputError saying why not)."""
    if location.startswith(("http://", "https://")):
        raise InputError(f"the input location {location!r} is an https URL: give an s3:// URL or a local path")
    try:
        store = _store(location)
        if not hasattr(store, "fs") and not stat.S_ISREG(os.stat(store.root).st_mode):
            raise InputError(f"the input location {location!r} is not a file")  # (a FIFO would block for ever)
        size = store.size(store.root)
    except (OSError, InferenceServerError) as exc:
        raise InputError(f"the input location {location!r} cannot be read: {exc}") from None
    if size > limit:
        raise InputError(f"the input at {location!r} is {size} bytes, more than the limit of {limit} bytes")
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    try:
        with store.open(store.root) as source:
            while got < size:
                count = source.readinto(view[got : got + _READ_CHUNK])
                if not count:
                    break
                got += count
    except (OSError, InferenceServerError) as exc:
        raise InputError(f"the input at {location!r} could not be read: {exc}") from None
    if got != size:
        raise InputError(f"the input at {location!r} changed while it was read ({got} of {size} bytes)")
    return buffer


def write(location: str, chunks: Iterable[Any], content_type: str | None) -> None:
    """Write ``chunks`` as the file or object ``location``, which appears only once whole, with ``content_type``
    where the store keeps one (S3)."""
    store = _store(location)
    with store.writing(store.root, content_type) as sink:
        for chunk in chunks:
            sink.write(chunk)


def timestamp(seconds: float | None = None) -> str:
    """A time (now, or ``seconds`` since the epoch) as SageMaker's notifications write it: UTC, milliseconds, ``Z``."""
    moment = (
        datetime.datetime.now(datetime.timezone.utc)
        if seconds is None
        else (datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc))
    )
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "local"


_sns_clients: dict[str, Any] = {}
_sns_lock = threading.Lock()


def _sns_client(region: str) -> Any:
    """An SNS client for ``region``, made once, from a boto3 session of its own (the default session is not
    thread-safe)."""
    with _sns_lock:
        client = _sns_clients.get(region)
        if client is None:
            import boto3  # type: ignore[import-untyped]

            client = _sns_clients[region] = boto3.session.Session().client("sns", region_name=region or None)
        return client


def notify(target: str, message: dict[str, Any]) -> None:
    """Deliver ``message`` to ``target``: POSTed as JSON to an http(s) URL, or published to an SNS topic."""
    data = orjson.dumps(message)
    found = _SNS_ARN.fullmatch(target)
    if found is not None:
        _sns_client(found.group(1)).publish(TopicArn=target, Message=data.decode())
        return
    request = urllib.request.Request(target, data, {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=NOTIFY_TIMEOUT) as answer:
        answer.read()


def _notification(request: dict[str, Any], status: str, **fields: Any) -> dict[str, Any]:
    """SageMaker's notification of a finished asynchronous request (``status``: Completed or Failed), as its
    developer guide shows it (``async-inference-check-predictions``), with ``fields`` of the outcome."""
    parameters = {"endpointName": request["endpoint"], "inputLocation": request["input_location"]}
    if request.get("content_type") is not None:
        parameters = {"contentType": request["content_type"], **parameters}
    return {
        "awsRegion": _region(),
        "eventTime": timestamp(),
        "receivedTime": request["received_time"],
        "invocationStatus": status,
        **fields,
        "requestParameters": parameters,
        "inferenceId": request["inference_id"],
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }


class _Answer:
    """What the app answered an entry: status, headers, and its body's chunks as they come."""

    status = 0
    headers: list[tuple[str, str]]

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        self.status = int(status.split(" ", 1)[0])
        self.headers = headers
        return None

    @property
    def content_type(self) -> str | None:
        return next((value for name, value in self.headers if name.lower() == "content-type"), None)


class Runner:
    """The runners of one worker: ``--async-workers`` threads taking entries from the queue and running them."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.settings = settings = app.settings
        self.queue = Queue.of(settings)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._recovered = 0.0

    def start(self) -> None:
        self.queue.recover()
        self._recovered = time.monotonic()
        for number in range(self.settings.async_workers):
            thread = threading.Thread(target=self._serve, name=f"async-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10) -> None:
        """Stop claiming; wait up to ``timeout`` seconds for the entries running to finish (tests, in-process)."""
        self._stopping.set()
        _wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def _draining(self) -> bool:
        """Whether to stop taking entries: asked to, or the worker drains or is to be replaced."""
        worker = self.app.worker
        if self._stopping.is_set():
            return True
        if worker is None:
            return False
        stop_requested = getattr(worker, "stop_requested", None)
        return worker.draining or (stop_requested is not None and bool(stop_requested()))

    def _serve(self) -> None:
        while not self._draining():
            try:
                if time.monotonic() - self._recovered > RECOVER_EVERY:
                    self._recovered = time.monotonic()
                    recovered = self.queue.recover()
                    if recovered:
                        logger.warning("%d asynchronous request(s) of a stopped worker are queued again", recovered)
                entry = self.queue.claim(self.settings.async_workers)
            except Exception:
                logger.exception("The asynchronous requests' queue failed; trying again in %s s", POLL)
                time.sleep(POLL)
                continue
            if entry is None:
                _wake.wait(POLL)
                _wake.clear()
                continue
            worker = self.app.worker
            if worker is not None:  # in flight from now on: a drain waits for it (--graceful-timeout)
                worker.enter()
            try:
                if self._draining():  # (the drain began as it was claimed)
                    self.queue.release(entry)
                else:
                    self.run(entry)
            except Exception:  # our bug: the entry is failed, not left running for ever
                logger.exception("Asynchronous request %s failed in the server", entry.request.get("inference_id"))
                try:
                    self._failed(entry, 500, [b'{"message": "the server failed; see its log"}'], "application/json")
                except Exception:
                    logger.exception("... and could not be finished: it runs again after a restart")
            finally:
                if worker is not None:
                    worker.leave()

    def run(self, entry: _asyncqueue.Entry) -> None:
        """Run one entry to its end (see the module's text)."""
        request = entry.request
        if entry.expired:
            waited = time.time() - request["received"]
            message = (
                f"the request waited {waited:.0f} s in the queue, past its RequestTTLSeconds of {request['ttl']} s"
            )
            logger.warning("Asynchronous request %s expired: %s", request["inference_id"], message)
            self._failed(entry, 0, [orjson.dumps({"message": message})], "application/json", "expired", message)
            return
        if entry.attempts > _asyncqueue.MAX_ATTEMPTS:
            message = (
                f"the worker running it stopped {_asyncqueue.MAX_ATTEMPTS} times (a crash, or it was replaced as stuck)"
            )
            self._failed(entry, 0, [orjson.dumps({"message": message})], "application/json", reason=message)
            return
        try:
            body = read_input(request["input"])
        except InputError as exc:
            logger.warning("Asynchronous request %s: %s", request["inference_id"], exc)
            self._failed(entry, 0, [orjson.dumps({"message": str(exc)})], "application/json", reason=str(exc))
            return
        answer = _Answer()
        chunks = self.app(self._environ(request, body), answer.start_response)
        try:
            if answer.status == 503:  # refused for now (a drain, a full micro-batch queue, a model not ready)
                self.queue.release(entry)
                if not self._draining():
                    time.sleep(POLL)
                return
            if 200 <= answer.status < 300:
                try:
                    write(request["output"], iter(chunks), answer.content_type)
                except Exception as exc:  # (S3 or the disk failed: SageMaker's ResponseUploadFailures)
                    logger.error("Asynchronous request %s: its answer could not be written", request["inference_id"])
                    message = f"the answer could not be written to {request['output']}: {exc}"
                    self._failed(entry, 0, [orjson.dumps({"message": message})], "application/json", reason=message)
                    return
                self._done(entry, answer.content_type)
            else:
                self._failed(entry, answer.status, list(chunks), answer.content_type)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if request.get("inline"):
            Path(request["input"]).unlink(missing_ok=True)

    def _environ(self, request: dict[str, Any], body: bytearray) -> dict[str, Any]:
        """The WSGI environ of ``POST /invocations`` for ``request``, its body given."""
        from inference_server.wsgi._body import GIVEN_BOUNDED, given_environ
        from inference_server.wsgi._invoke import OWN_TIMEOUT

        environ = given_environ(
            "POST", "/invocations", body, ("localhost", self.settings.port), "HTTP/1.1", "127.0.0.1"
        )
        environ.update(
            {
                "HTTP_HOST": "localhost",
                "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID": request["inference_id"],
                GIVEN_BOUNDED: True,
                OWN_TIMEOUT: request["timeout"],
            }
        )
        for key, header in (
            ("content_type", "CONTENT_TYPE"),
            ("accept", "HTTP_ACCEPT"),
            ("custom_attributes", "HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES"),
            ("request_id", "HTTP_X_REQUEST_ID"),
        ):
            if request.get(key) is not None:
                environ[header] = request[key]
        return environ

    def _done(self, entry: _asyncqueue.Entry, content_type: str | None) -> None:
        request = entry.request
        target = self.settings.async_notify_success
        if target is not None:
            response = {"contentType": content_type, "outputLocation": request["output"]}
            self._notify(target, _notification(request, "Completed", responseParameters=response))
        self.queue.finish(entry, "done")

    def _failed(
        self,
        entry: _asyncqueue.Entry,
        status: int,
        chunks: list[Any],
        content_type: str | None,
        outcome: str = "failed",
        reason: str | None = None,
    ) -> None:
        """Write the error of ``entry`` to its failure location, announce it, and finish it as ``outcome``.
        ``status``: what the model answered (0: it was not called; ``reason`` says why)."""
        request = entry.request
        try:
            write(request["failure"], chunks, content_type)
        except Exception:
            logger.exception("Asynchronous request %s: its error could not be written", request["inference_id"])
        if reason is None:
            kind = "client" if status < 500 else "server"
            reason = (
                f"ClientError: Received {kind} error ({status}) from model. See the server's log for request "
                f"{request['inference_id']}."
            )
        target = self.settings.async_notify_error
        if target is not None:
            failure = {"failureReason": reason, "failureLocation": request["failure"]}
            self._notify(target, _notification(request, "Failed", **failure))
        self.queue.finish(entry, outcome)
        if request.get("inline"):
            Path(request["input"]).unlink(missing_ok=True)

    def _notify(self, target: str, message: dict[str, Any]) -> None:
        try:
            notify(target, message)
        except Exception as exc:
            logger.error("Notifying %s of asynchronous request %s failed: %s", target, message["inferenceId"], exc)
            self.queue.count(_asyncqueue.NOTIFICATION_FAILED)


_runners: list[Runner] = []


def start(app: App) -> Runner:
    """Start this worker's runners (``serve``, once the model is loaded)."""
    runner = Runner(app)
    runner.start()
    _runners.append(runner)
    if app.recorder is not None and not any(isinstance(found, Collector) for found in metrics.collectors):
        metrics.collectors.append(Collector(app.settings))
    return runner


class Collector:
    """A Prometheus collector of the queue's counts, read from the database at each scrape (so every worker's)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counts = Queue.of(self.settings).counts()
        now = GaugeMetricFamily(
            "inference_server_async_requests",
            "Asynchronous requests in the queue on this machine, by state (queued, running)",
            labels=("state",),
        )
        for state in ("queued", "running"):
            now.add_metric((state,), counts[state])
        yield now
        ended = CounterMetricFamily(
            "inference_server_async_requests_finished",
            "Asynchronous requests finished since the queue was made, by outcome: done (answer written), failed "
            "(error written), expired (past RequestTTLSeconds before it ran)",
            labels=("outcome",),
        )
        for outcome in _asyncqueue.OUTCOMES:
            ended.add_metric((outcome,), counts[outcome])
        yield ended
        yield CounterMetricFamily(
            "inference_server_async_notification_failures",
            "Notifications of asynchronous requests that could not be delivered",
            value=counts[_asyncqueue.NOTIFICATION_FAILED],
        )
