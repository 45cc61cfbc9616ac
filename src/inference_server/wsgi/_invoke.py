"""One request lifecycle for every protocol: drain admission, the body, the deadline, the model slot, the batcher,
and cleanup in the reply body's ``close()``.

A protocol module turns its request into a :class:`Target` and (later) its own decoding, calls
:meth:`Lifecycle.invoke`, and gets a reply whose body is an iterable of buffers; the work that must follow the
answer (leaving the drain's count) runs when the server closes that body, so that an answer may be streamed.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from inference_server import _deadlines, _loop, batching, codecs, metrics
from inference_server._pipeline import Framing, Output, Pipeline, Stream
from inference_server._settings import Settings
from inference_server.errors import GatewayTimeout, HookError, RequestTimeout, ServiceUnavailable
from inference_server.wsgi._body import PEP_3333, Reading, read_body
from inference_server.wsgi._replies import HAND_OVER, Body, Reply, Request, close

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from inference_server._capture import Capture
    from inference_server._multimodel import MultiModel

logger = logging.getLogger("inference_server")

#: The environ key naming the model a request invokes on a multi-model endpoint (the metrics' ``model`` label).
MODEL = "inference_server.model"
#: The environ key of a deadline the client set (``time.monotonic()``; the gRPC front's, from the RPC's deadline):
#: the request is answered 504 then if ``--timeout`` would come later.
CLIENT_DEADLINE = "inference_server.client_deadline"
#: The environ key of a request's own timeout in seconds, in place of ``--timeout`` (an asynchronous request's
#: ``InvocationTimeoutSeconds``); set only by the server's own code, never from a header.
OWN_TIMEOUT = "inference_server.own_timeout"


def stream_timeout(settings: Settings, environ: WSGIEnvironment) -> int:
    """The seconds a streamed answer may take: the request's own timeout (``OWN_TIMEOUT``: an asynchronous request's
    whole ``InvocationTimeoutSeconds``), else ``--stream-timeout`` (0: no limit)."""
    own = environ.get(OWN_TIMEOUT)
    return int(own) if own else settings.stream_timeout


#: The header SageMaker passes the original ``TargetModel`` in, under both names its documentation has used.
TARGET_MODEL_HEADERS = ("HTTP_X_AMZN_SAGEMAKER_TARGET_MODEL", "HTTP_X_AMZN_TARGET_MODEL")


def target_model_header(environ: WSGIEnvironment) -> str | None:
    """The request's ``TargetModel`` header as sent, under either name (empty if sent empty), or None."""
    for header in TARGET_MODEL_HEADERS:
        value = environ.get(header)
        if value is not None:
            return str(value)
    return None


def target_model(environ: WSGIEnvironment) -> str | None:
    """The request's ``TargetModel``, or None (for an empty one too)."""
    return target_model_header(environ) or None


#: Seconds an overrunning request's work may go on after its 504 before the worker is replaced.
RECYCLE_GRACE = 2.0


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the HTTP server running the app does or leaves to it (each backend of ``server/`` gives its own)."""

    #: Copy body buffers to ``bytes`` as PEP 3333 requires; False hands servers the arrays' own memory.
    bytes_only: bool = True
    #: The server calls ``close()`` on a ``list`` answer too, once it is sent (PEP 3333). granian does not: it sends
    #: a list whole, at once (its fast path), so a small whole answer's cleanups (leaving the drain's count of
    #: requests in flight) run when it is handed over, and it goes as a list.
    closes_lists: bool = True
    #: Read the body on the server's own thread, not on the helper that has a deadline (granian: its body read,
    #: called from a thread of ours, stalls the whole worker while the client is slow to send). The body then has
    #: no deadline of ours (no 408) and ``--timeout`` counts from its arrival.
    read_on_server_thread: bool = False
    #: Check the head here as RFC 9112 asks, for servers that do not: one Host header (none at all is an error in
    #: HTTP/1.1), and a header section within ``--max-header-bytes`` (granian's own bound is loose: a head that
    #: arrives in one large read passes up to about twice the size).
    check_head: bool = False
    #: How the server hands over request bodies (``100 Continue``, chunked bodies, its body errors).
    body: Reading = PEP_3333
    #: When the request reached the server (``time.monotonic()``), for servers that can say (gunicorn): one that was
    #: waiting for a server thread when the drain began is answered, not refused.
    arrival: Callable[[WSGIEnvironment], float | None] | None = None
    #: Run the routes that invoke the model on the worker's event loop (the lifecycle of the event-loop fronts: the
    #: 504 at the deadline, async hooks on the loop), the server's thread reading the body, then waiting
    #: (:mod:`inference_server.wsgi._onloop`); else on the server's thread (:class:`Lifecycle`).
    on_loop: bool = False


class WorkerState(Protocol):
    """What the app needs of the serving process's shared state (``server._state.Worker`` when ``serve`` runs it)."""

    @property
    def draining(self) -> bool: ...

    @property
    def draining_since(self) -> float: ...

    def enter(self) -> None: ...

    def leave(self) -> None: ...

    def request_recycle(self, reason: str, kind: str = "stuck") -> None: ...


@dataclasses.dataclass(frozen=True)
class Target:
    """What a request invokes: a pipeline, its model (``model()`` loads it on first use) and its batcher, if any;
    for a model that may load while requests wait (of a multi-model endpoint), ``at_hand()``: the model when it is
    loaded, else None, without waiting (what the event loop asks before it hands ``model()`` to a thread)."""

    pipeline: Pipeline
    model: Callable[[], Any]
    batcher: batching.Batcher | None = None
    at_hand: Callable[[], Any] | None = None

    @classmethod
    def serving(cls, pipeline: Pipeline, settings: Settings) -> Target:
        """The pipeline's own model, micro-batched when the settings or the ``batching`` hook ask for it."""
        options = batching_options(pipeline, settings)
        recorder = metrics.recorder if settings.metrics else None
        batcher = (
            batching.Batcher.for_hooks(options, pipeline.pm, pipeline.predict, recorder) if options.enabled else None
        )
        return cls(pipeline, pipeline.model, batcher)


class ModelTargets:
    """The targets of a multi-model endpoint's models, by name: loaded through the model management API, or
    (``target_model``) SageMaker Runtime's ``TargetModel`` under ``--model-root``; each model loads on first use,
    within its request's deadline. One target per name is kept once its model has loaded (so that names of no model
    never fill the cache), for at most 10,000 names. Micro-batched as the app's own model is, by the worker's one
    batcher, which groups inputs of the same model only (its groups are keyed by model)."""

    def __init__(self, pipeline: Pipeline, models: MultiModel, batcher: batching.Batcher | None) -> None:
        self._pipeline = pipeline
        self._models = models
        self._batcher = batcher
        self._kept: dict[tuple[str, bool], Target] = {}

    def get(self, name: str, target_model: bool = False) -> Target:
        """What an invocation of model ``name`` runs."""
        key = (name, target_model)
        target = self._kept.get(key)
        if target is None:  # (kept by whichever finds its model first: the loop asks at_hand, a thread model())
            return Target(
                self._pipeline, functools.partial(self._keep, key), self._batcher, functools.partial(self._found, key)
            )
        return target

    def _load(self, name: str, target_model: bool) -> Any:
        return self._models.target_model(name) if target_model else self._models.model(name)

    def _keep(self, key: tuple[str, bool]) -> Any:
        """Load the model of ``key`` and, now that it exists, keep its target."""
        model = self._load(*key)
        self._kept_target(key)
        return model

    def _found(self, key: tuple[str, bool]) -> Any:
        """The model of ``key`` if it is at hand (its target kept, now that it exists), else None."""
        model = self._models.at_hand(*key)
        if model is not None:
            self._kept_target(key)
        return model

    def _kept_target(self, key: tuple[str, bool]) -> None:
        if key not in self._kept and len(self._kept) < 10_000:
            model = functools.partial(self._load, *key)
            self._kept[key] = Target(
                self._pipeline, model, self._batcher, functools.partial(self._models.at_hand, *key)
            )


def batching_options(pipeline: Pipeline, settings: Settings) -> batching.Options:
    """How ``pipeline``'s invocations are micro-batched (off unless asked for): options given on the command line
    win over the ``batching`` hook, which wins over the environment; ``--threads`` groups run at once."""
    names = {"max_batch_size": "max_batch_size", "max_batch_delay": "max_batch_delay_ms", "max_queue": "max_queue"}
    given = {key: getattr(settings, name) for name, key in names.items()}
    chosen = frozenset(names[name] for name in settings.given if name in names)
    return batching.options(given, chosen, pipeline.pm.hook.batching(), settings.threads)


class Lifecycle:
    """The life of every invocation of one app, whatever its protocol (see the module's text)."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        #: This process's share of the server's state when ``serve`` runs it (drain flag, requests in flight).
        self.worker: WorkerState | None = None
        self._timeout = settings.timeout or None
        self._model_slots = _deadlines.model_slots(settings.threads)
        self._watchdog = _deadlines.Watchdog(RECYCLE_GRACE)
        #: Helper threads for the chunks of streams under ``--stream-timeout``.
        self._helpers = _deadlines.Pool("stream")
        #: The model threads: the hooks, or the micro-batches' groups, of a model not known to be quick run there,
        #: under the deadline (at most ``--threads`` at once: each holds a model slot or a batcher's slot).
        self._models = _deadlines.Pool("model")
        self._paces = _deadlines.Paces(_deadlines.ON_THREAD, _deadlines.ON_THREAD)
        self._told_no_content_type = False
        #: Where a sample of the answered invocations is captured (``--data-capture``), else None.
        self.captures: Capture | None = None

    def invoke(self, request: Request, target: Target, framing: Framing | None = None) -> Reply:
        """Answer one invocation of ``target`` with the request's body, ``Content-Type`` and ``Accept``: 200 and the
        encoded prediction, or an exception for the app to answer (503 while draining, 408, 504, the hooks' own).
        A protocol's ``framing`` decodes the body and encodes the answer in place of ``input_fn`` and ``output_fn``."""
        worker = self.worker
        if worker is None:
            return self._bounded(request, target, framing)
        worker.enter()
        try:
            if worker.draining and not self._arrived_before(worker.draining_since, request.environ):
                raise ServiceUnavailable("the server is shutting down; send the request again")
            status, headers, body = self._bounded(request, target, framing)
        except BaseException:
            worker.leave()
            raise
        if (  # the usual small answer, for a server that never closes a list: what Body.prepare would do at once
            not self.backend.closes_lists
            and type(body) is list
            and len(body) == 1
            and type(body[0]) is bytes
            and len(body[0]) <= HAND_OVER
        ):
            worker.leave()
            return status, headers, body
        return status, headers, Body(body, worker.leave)

    def _arrived_before(self, moment: float, environ: WSGIEnvironment) -> bool:
        """Whether the request had reached the server before ``moment`` (then a drain answers it), as far as the
        server says (``arrival``); without it, requests that reach the app after the drain began are refused."""
        arrival = self.backend.arrival
        arrived = arrival(environ) if arrival is not None else None
        return arrived is not None and arrived < moment

    def _bounded(self, request: Request, target: Target, framing: Framing | None) -> Reply:
        """Invoke on this thread, watched by the watchdog: 408 if the body overruns ``--read-timeout``, 504 if the
        whole overruns ``--timeout`` (answered when the work stops at its next stage), and the worker replaced if the
        work is still running ``RECYCLE_GRACE`` seconds past its deadline (see :mod:`inference_server._deadlines`)."""
        start = time.monotonic()
        environ = request.environ
        timeout = own = environ.get(OWN_TIMEOUT, self._timeout)
        client = environ.get(CLIENT_DEADLINE)
        if client is not None and (timeout is None or client < start + timeout):
            timeout = max(client - start, 0.0)
        else:
            client = None
        if timeout is None:
            return self._invoke(request, target, None, start, framing)
        body = None
        if self.backend.read_on_server_thread:
            body = read_body(request.environ, target.pipeline.max_body, self.backend.body)
            read_deadline = math.inf
        else:
            read_deadline = start + min(timeout, self.settings.read_timeout)
        call = _deadlines.Call(read_deadline, start + timeout, self._abort_read, self._recycle_stuck, request)
        if client is not None:  # a client's deadline bounds the wait; once the hooks run, only --timeout does
            call.stuck = None
            call.after_wait = (start + own if own else math.inf, self._recycle_stuck)
        self._watchdog.watch(call)
        try:
            reply = self._invoke(request, target, call, start, framing, body)
        except _deadlines.Cancelled:
            reply = None
        except OSError:
            if call.stage != _deadlines.READING:
                raise
            call.cancel()  # the server's own receive timeout (gunicorn's SO_RCVTIMEO, --read-timeout) ended the read
            reply = None
        except Exception:
            if not (call.cancelled and call.overran == _deadlines.READING):
                raise
            reply = None  # the read the watchdog ended failed
        finally:
            self._watchdog.unwatch(call)
        if call.cancelled:
            if reply is not None:
                close(reply[2])
            if call.overran == _deadlines.READING:
                limit = min(timeout, self.settings.read_timeout)
                raise RequestTimeout(f"the request body did not arrive within {limit} s")
            if client is not None and call.overran != _deadlines.RUNNING:
                raise GatewayTimeout(f"the client's deadline passed (while {call.overran})")
            raise GatewayTimeout(f"the request took longer than its timeout of {own} s (while {call.overran})")
        assert reply is not None
        return reply

    def read_watched(self, environ: WSGIEnvironment, limit: int | None) -> bytearray | bytes:
        """The body, read on this thread (see :func:`read_body`) within ``--read-timeout`` (and ``--timeout``), its
        read ended by the watchdog past it where the server can end it (a 408)."""
        read_timeout = self.settings.read_timeout
        if self._timeout is not None:
            read_timeout = min(read_timeout, self._timeout)
        call = _deadlines.Call(time.monotonic() + read_timeout, abort=self._abort_read_of, context=environ)
        self._watchdog.watch(call)
        try:
            body = read_body(environ, limit, self.backend.body)
            if call.read():  # (else the watchdog ended the read meanwhile)
                return body
        except OSError:  # (the server's own receive timeout, gunicorn's SO_RCVTIMEO of --read-timeout, or the end)
            pass
        except Exception:
            if not call.cancelled:
                raise
        finally:
            self._watchdog.unwatch(call)
        raise RequestTimeout(f"the request body did not arrive within {read_timeout} s")

    def _abort_read_of(self, environ: WSGIEnvironment) -> None:
        """The watchdog's end of a body read that overran ``--read-timeout`` (where the server can end it)."""
        abort = self.backend.body.abort
        if abort is not None:
            abort(environ)

    def _abort_read(self, request: Request) -> None:
        self._abort_read_of(request.environ)

    def _recycle_stuck(self, request: Request) -> None:
        """The watchdog's report of work still running ``RECYCLE_GRACE`` seconds past its deadline."""
        self.recycle(request.request_id)

    def _recycle_if_stuck(self, helper: Any, request_id: str) -> None:
        """A stream's helper thread abandoned at its deadline: the worker is replaced if it still runs."""
        if helper.abandoned:
            self.recycle(request_id)

    def recycle(self, request_id: str) -> None:
        """Replace this worker: request ``request_id``'s work is stuck."""
        reason = f"request {request_id} was still running {RECYCLE_GRACE} s after its timeout"
        if self.worker is not None:
            self.worker.request_recycle(reason)
        else:
            logger.error("%s; this process cannot be replaced (it was not started by inference-server serve)", reason)

    def _invoke(
        self,
        request: Request,
        target: Target,
        call: _deadlines.Call | None,
        start: float,
        framing: Framing | None,
        body: bytearray | bytes | None = None,
    ) -> Reply:
        environ = request.environ
        pipeline = target.pipeline
        if body is None:
            body = read_body(environ, pipeline.max_body, self.backend.body)
        if call is not None:
            call.enter(_deadlines.WAITING)  # (the model may load first, on a multi-model endpoint)
        model = target.model()
        content_type = environ.get("CONTENT_TYPE") or (self.no_content_type() if framing is None else "")
        accept = environ.get("HTTP_ACCEPT") or "*/*"
        name = environ.get(MODEL, "")
        if target.batcher is not None:
            hand_off = None if call is None else functools.partial(self._hand_off_group, model, request)
            output = _batched(
                pipeline, target.batcher, body, content_type, accept, model, call, framing, start, name, hand_off
            )
        elif call is None:
            with self._model_slots:
                output = pipeline.invoke(
                    body, content_type, accept, model, streamed=True, framing=framing, arrived=start, name=name
                )
        else:
            call.take_slot(self._model_slots)
            pace = self._paces.get(id(model)) or self._paces.of(model)
            if pace.inline or call.deadline == math.inf:  # (written out: the common case, for a quick model)
                began = time.perf_counter()
                try:
                    output = pipeline.invoke(
                        body, content_type, accept, model, streamed=True, framing=framing, arrived=start, name=name
                    )
                finally:
                    call.give_back()
                    pace.ended_inline(began)
            else:
                invoke = functools.partial(
                    pipeline.invoke, body, content_type, accept, model, None, True, framing, start, name
                )
                output = self._on_model_thread(invoke, pace, call, request)
        if self.captures is not None:
            self.captures.invocation(environ, body, output)
        if output.stream is not None:
            timeout = stream_timeout(self.settings, environ)
            deadline = start + timeout if timeout else None
            streamed = Streamed(output.buffers, output.stream, self, request, deadline)
            return 200, [("Content-Type", output.media_type), *output.headers], streamed
        headers = [("Content-Type", output.media_type), ("Content-Length", str(output.nbytes)), *output.headers]
        return 200, headers, output.buffers

    def _on_model_thread(
        self, invoke: Callable[[], Output], pace: _deadlines.Pace, call: _deadlines.Call, request: Request
    ) -> Output:
        """``invoke()`` (the hooks) on a model thread, holding the call's model slot until it ends; this thread waits
        until the call's deadline, then stops waiting (:class:`Cancelled`: the 504) while the hooks run on, and the
        worker is replaced if they still run ``RECYCLE_GRACE`` seconds later."""
        slot = call.hand_over()
        ran = False

        def work() -> Output:
            nonlocal ran
            ran = True
            try:
                return pace.timed(invoke)
            finally:
                slot.release()

        context = contextvars.copy_context()
        try:
            output: Output = self._models.run(work, lambda: call.deadline, context)
        except _deadlines.TimedOut as exc:
            call.cancel()
            timer = threading.Timer(RECYCLE_GRACE, self._recycle_if_stuck, (exc.helper, request.request_id))
            timer.daemon = True
            timer.start()
            raise _deadlines.Cancelled from None
        except BaseException:
            if not ran:  # (no thread to run it: the slot was never the work's)
                slot.release()
            raise
        _loop.carry(context)
        return output

    def _hand_off_group(self, model: Any, request: Request, group: list[Any], run: Callable[[], None]) -> None:
        """Run a micro-batch's group formed on this thread: here while the model's calls are known to be quick;
        else on a model thread, watched until it ends (still running ``RECYCLE_GRACE`` seconds past its members'
        last deadline, the worker is replaced), this thread going back to wait for its own input's answer."""
        pace = self._paces.of(model)
        if pace.inline:
            pace.inline_call(run)
            return
        deadlines = [member.call.deadline for member in group if member.call is not None]
        watched = _deadlines.Call(deadline=max(deadlines, default=math.inf), stuck=self.recycle,
                                  context=request.request_id)  # fmt: skip
        watched.stage = _deadlines.RUNNING

        def group_run() -> None:
            try:
                pace.timed(run)
            except BaseException:
                logger.exception("Micro-batching: a group failed")
            finally:
                self._watchdog.unwatch(watched)

        self._watchdog.watch(watched)
        try:
            self._models.spawn(group_run)
        except RuntimeError:  # (no thread can be started: the process is going down) run it here
            self._watchdog.unwatch(watched)
            run()

    def no_content_type(self) -> str:
        """The media type of a body sent without ``Content-Type``: bytes, with a hint in the log once per worker."""
        content_type = "application/octet-stream"
        if not self._told_no_content_type:  # once per worker: a hint, not a complaint per request
            self._told_no_content_type = True
            logger.info(
                "A request came without Content-Type, so the model receives its body as bytes (as %s); known types: %s",
                content_type,
                ", ".join(codecs.media_types()),
            )
        return content_type


#: Seconds ``ping_fn`` (and the model check) may take before /ping answers 503; SageMaker waits 2 s in all.
PING_TIMEOUT = 1.0


class Health:
    """Whether the server can take requests: what ``/ping`` (and the Open Inference Protocol's readiness) say."""

    def __init__(self, lifecycle: Lifecycle, pipeline: Pipeline, settings: Settings) -> None:
        self._lifecycle = lifecycle
        self._pipeline = pipeline
        self._multi_model = settings.multi_model
        self._pings = _deadlines.Pool("ping")

    def unready(self) -> str | None:
        """Why the server cannot serve now (draining, the model failed to load, ``ping_fn`` said no or took longer
        than PING_TIMEOUT), or None when it can. With several models the server is up with none loaded."""
        worker = self._lifecycle.worker
        if worker is not None and worker.draining:
            return "the server is shutting down"
        if self._pings.overrunning:
            logger.warning("Ping: an earlier check has been running for over %s s; answering 503", PING_TIMEOUT)
            return f"an earlier health check has been running for over {PING_TIMEOUT} s"
        if self._multi_model:
            return None  # up: the models are loaded through /models, each on its own
        if self._pipeline.surely_healthy():  # (no hook to run: no hand-off to a ping thread and back)
            return None
        deadline = time.monotonic() + PING_TIMEOUT
        try:
            return self._pings.run(self._pipeline.unhealthy, lambda: deadline)  # type: ignore[no-any-return]
        except _deadlines.TimedOut:
            logger.warning("Ping: the model check took longer than %s s; answering 503", PING_TIMEOUT)
            return f"the health check (ping_fn) took longer than {PING_TIMEOUT} s"


def _batched(
    pipeline: Pipeline,
    batcher: batching.Batcher,
    body: bytearray | bytes,
    content_type: str,
    accept: str,
    model: Any,
    call: _deadlines.Call | None,
    framing: Framing | None,
    arrived: float,
    name: str,
    hand_off: Callable[[list[Any], Callable[[], None]], None] | None = None,
) -> Any:
    """The hooks with ``predict_fn`` run by the batcher: ``input_fn`` and ``output_fn`` on this thread; a group this
    thread forms runs here unless ``hand_off`` takes it (:meth:`Batcher.predict <inference_server.batching.Batcher.
    predict>`)."""
    with batcher.coming() as coming:

        def predict(data: Any) -> Any:
            return batcher.predict(data, model, call, coming=coming, hand_off=hand_off)

        return pipeline.invoke(
            body, content_type, accept, model, predict, streamed=True, framing=framing, arrived=arrived, name=name
        )


class StreamFailed(Exception):
    """A streamed answer could not go on: the model's iterator raised (``code`` ``StreamBroken``) or the stream
    overran ``--stream-timeout`` (``ModelInvocationTimeExceeded``, SageMaker's names for them). The status and
    the first chunks are sent already: a server that gets this from the body ends the connection without the
    chunked coding's last chunk, which tells the client the answer is incomplete."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Streamed:
    """A streamed answer's chunks, each made when the server asks for the next: under the model slot (as a hook
    call is), and, with ``--stream-timeout``, on a helper thread that the whole stream's deadline bounds.

    ``close()`` (the server is done: the last chunk was sent or the client went away) closes the model's iterator,
    so a generator's ``finally`` runs; if a chunk is being made on a helper thread right then, that thread closes
    it once the chunk is made."""

    def __init__(
        self,
        first: list[codecs.Buffer],
        stream: Stream,
        lifecycle: Lifecycle,
        request: Request,
        deadline: float | None,
    ) -> None:
        self._first = first
        self._stream = stream
        self._lifecycle = lifecycle
        self._request = request
        self._deadline = deadline
        self._lock = threading.Lock()
        self._making = False  # a chunk is being made (on a helper thread)
        self._closed = False

    def __iter__(self) -> Iterator[codecs.Buffer]:
        return self.chunks()

    def chunks(self) -> Iterator[codecs.Buffer]:
        """The chunks; :class:`StreamFailed` if the stream cannot go on (after logging why)."""
        yield from self._first
        self._first = []
        while True:
            chunk = self._next()
            if chunk is None:
                return
            yield chunk

    def _next(self) -> codecs.Buffer | None:
        if self._closed:
            return None
        if self._deadline is None:
            with self._lifecycle._model_slots:
                return self._made(self._stream.next)
        if time.monotonic() >= self._deadline:
            self._timed_out()
        with self._lock:
            self._making = True
        try:
            return self._lifecycle._helpers.run(self._make, lambda: self._deadline or 0.0)  # type: ignore[no-any-return]
        except _deadlines.TimedOut as exc:
            timer = threading.Timer(
                RECYCLE_GRACE, self._lifecycle._recycle_if_stuck, (exc.helper, self._request.request_id)
            )
            timer.daemon = True
            timer.start()
            self._timed_out()
            raise  # (not reached)

    def _make(self) -> codecs.Buffer | None:
        """On a helper thread: the next chunk, under the model slot; then close the stream if that was asked."""
        try:
            with self._lifecycle._model_slots:
                return self._made(self._stream.next)
        finally:
            with self._lock:
                self._making = False
                closing = self._closed
            if closing:
                self._close_stream()

    def _made(self, make: Callable[[], codecs.Buffer | None]) -> codecs.Buffer | None:
        try:
            return make()
        except HookError as exc:
            environ = self._request.environ
            logger.error(
                "Request %s %s %s: %s; the stream is cut",
                self._request.request_id,
                environ["REQUEST_METHOD"],
                environ.get("PATH_INFO"),
                exc.summary,
                exc_info=exc.error,
            )
            raise StreamFailed(
                "StreamBroken", f"{exc.summary}; see the server log for request {self._request.request_id}"
            ) from None

    def _timed_out(self) -> NoReturn:
        timeout = stream_timeout(self._lifecycle.settings, self._request.environ)
        logger.error(
            "Request %s: the stream took longer than its stream timeout (%d s); it is cut",
            self._request.request_id,
            timeout,
        )
        self.close()
        raise StreamFailed(
            "ModelInvocationTimeExceeded", f"the stream took longer than the server's stream timeout of {timeout} s"
        )

    def close(self) -> None:
        """Close the model's iterator now, or once the chunk being made is made (once, whoever calls first)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            making = self._making
        if not making:
            self._close_stream()

    def _close_stream(self) -> None:
        try:
            self._stream.close()
        except Exception:
            logger.exception("Request %s: closing the stream raised", self._request.request_id)
