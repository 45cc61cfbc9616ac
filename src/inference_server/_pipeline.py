"""One invocation without HTTP: (body, content type, Accept, model) -> ``input_fn`` -> ``predict_fn`` -> ``output_fn``.

Every protocol of the WSGI app and Batch Transform call the same :class:`Pipeline`, so every mode runs the hooks
alike. It knows nothing of WSGI: no environ, no status line, no body reading. A pipeline's hooks are its own: a
script it serves is registered into a view of the shared plugin manager made for it alone (``_plugins.view``), and
each invocation runs its hooks in a copy of the caller's ``contextvars`` context.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol, TypeVar

import pluggy
import werkzeug.exceptions
import werkzeug.http
from werkzeug.datastructures import MIMEAccept

from inference_server import _loop, _models, _plugins, _script, codecs, default_plugin
from inference_server._settings import BatchStrategy, Settings
from inference_server.errors import ConfigurationError, HookError, HTTPError, ModelLoadError, UnsupportedMediaType

logger = logging.getLogger("inference_server")

_MB = 1 << 20
_T = TypeVar("_T")

#: How the event-loop lifecycle runs a sync hook off the loop: ``on_thread(function, *args)`` runs it on a model
#: thread (under a model slot) in a copy of the caller's context, sets there what it set, and gives its result.
OnThread = Callable[..., Awaitable[Any]]
#: One invocation that passed its three hooks, as the pipeline tells its ``timed``: when the request arrived (its
#: lifecycle began: the model slot, or the model's load, were waited for from then), when ``input_fn``,
#: ``predict_fn`` and ``output_fn`` began and when ``output_fn`` ended (``time.monotonic()``), and the model's name
#: on a multi-model endpoint ("" for the server's one model).
Timed = tuple[float, float, float, float, float, str]


class Output(NamedTuple):
    """What ``output_fn`` made of a prediction: the body as buffers, its media type, and extra headers."""

    #: The body is the concatenation of these (an array's own memory, not a copy); for a stream, its first chunk.
    buffers: list[codecs.Buffer]
    media_type: str
    #: Response headers ``output_fn`` asked for (its optional third item), e.g. custom attributes.
    headers: list[tuple[str, str]]
    #: The rest of an answer made as it is sent (``output_fn`` gave an iterator), else None.
    stream: Stream | None = None

    @property
    def nbytes(self) -> int:
        """The body's length in bytes."""
        buffers = self.buffers
        if len(buffers) == 1 and type(buffers[0]) is bytes:  # the usual small answer: no memoryview needed
            return len(buffers[0])
        return sum(memoryview(buffer).nbytes for buffer in buffers)


#: The stages of an invocation, as errors and spans name them.
_HOOKS = ("input_fn", "predict_fn", "output_fn")


class Framing(Protocol):
    """A protocol's own framing of the body (the Open Inference Protocol's tensors), in place of ``input_fn`` and
    ``output_fn`` for its requests: what ``predict_fn`` gets, and its answer."""

    #: The stages' names for errors and spans: (decoding, "predict_fn", encoding).
    stages: tuple[str, str, str]

    def decode(self, body: codecs.Buffer, model: Any) -> Any:
        """``predict_fn``'s input from the body (an :class:`HTTPError` for a bad body)."""
        ...

    def encode(self, prediction: Any) -> Output:
        """The answer to the prediction."""
        ...


class Stream:
    """The chunks of an iterator that ``output_fn`` returned (a generator ``predict_fn`` made, encoded one by one),
    each made when asked for, in the invocation's context: the context variables its hooks saw."""

    __slots__ = ("_captured_bytes", "_chunks", "_ended", "_limit", "captured", "context", "made", "records")

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks = chunks
        #: The chunks made so far of a stream being captured (SageMaker's Data Capture), and what is told them all
        #: once the stream ends whole (:meth:`capture`).
        self.captured: list[codecs.Buffer] | None = None
        self._ended: Callable[[list[codecs.Buffer] | None], None] | None = None
        self._captured_bytes = self._limit = 0
        #: Where each chunk is made (set by :meth:`Pipeline.invoke` to the invocation's own).
        self.context = contextvars.Context()
        #: The records of an async generator ``predict_fn`` made, when they are what the chunks are made of: the
        #: event-loop lifecycle awaits each on the loop (:meth:`_loop.Items.prefetch`), then makes its chunk there.
        self.records: _loop.Items | None = None
        #: Chunks made so far, empty ones included.
        self.made = 0

    def next(self) -> codecs.Buffer | None:
        """The next chunk that is not empty, or None at the end; a :class:`HookError` if the iterator raised."""
        while True:
            chunk = self.next_made()
            if chunk is None or memoryview(chunk).nbytes:  # an empty chunk would end HTTP's chunked coding
                return chunk

    def close(self) -> None:
        """Close the iterator (a generator's ``finally`` runs, in the invocation's context); ``ValueError`` if it is
        making a chunk on another thread right now."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            self.context.run(close)

    def next_made(self) -> codecs.Buffer | None:
        """The next chunk, empty ones included (each made of one record, so that each record can be fetched
        first), or None at the end; a :class:`HookError` if the iterator raised."""
        try:
            item = self.context.run(next, self._chunks)
        except StopIteration:
            ended = self._ended
            if ended is not None and self.captured is not None:
                self._ended = None
                ended(self.captured)
            return None
        except Exception as exc:
            raise HookError("output_fn", exc, summary=f"the response stream raised {type(exc).__name__}") from exc
        self.made += 1
        chunk = _chunk(item)
        if self.captured is not None:
            self._captured_bytes += memoryview(chunk).nbytes
            if self._captured_bytes <= self._limit:
                self.captured.append(chunk)
            else:  # more than may be kept: let go of them, and say so at once
                ended, self.captured, self._ended = self._ended, None, None
                if ended is not None:
                    ended(None)
        return chunk

    def capture(self, first: codecs.Buffer, ended: Callable[[list[codecs.Buffer] | None], None], limit: int) -> None:
        """Keep the chunks from ``first`` (made already) on, and tell ``ended`` them all if the stream ends whole; or
        None, and keep no more, once they pass ``limit`` bytes."""
        self.captured = [first]
        self._ended = ended
        self._captured_bytes, self._limit = memoryview(first).nbytes, limit

    async def anext(self) -> codecs.Buffer | None:
        """On the event loop, for a stream of an async generator's records: the next chunk that is not empty, or
        None at the end (each record awaited on the loop, its chunk made there). A record is fetched only when the
        chunks' iterator has made a chunk of each one it took (the built-in encoders take the first record before
        their first chunk, and one record per chunk after it)."""
        records = self.records
        assert records is not None
        while True:
            if records.taken <= self.made:  # the chunks' iterator holds no record yet: its next one is fetched first
                try:
                    await records.prefetch()
                except Exception as exc:
                    summary = f"the response stream raised {type(exc).__name__}"
                    raise HookError("predict_fn", exc, summary=summary) from exc
            chunk = self.next_made()
            if chunk is None or memoryview(chunk).nbytes:
                return chunk

    async def aclose(self) -> None:
        """On the event loop: close the chunks' iterator, then the async generator's records (``aclose()``)."""
        try:
            self.close()
        finally:
            if self.records is not None:
                await self.records.aclose()

    def drain(self) -> list[codecs.Buffer]:
        """Every remaining chunk (for callers that answer whole: Batch Transform)."""
        chunks = []
        try:
            while (chunk := self.next()) is not None:
                chunks.append(chunk)
        finally:
            self.close()
        return chunks


def execution_parameters(pm: pluggy.PluginManager) -> dict[str, Any]:
    """SageMaker's execution parameters from the hooks; an invalid hook value is a :class:`ConfigurationError`."""
    strategy = pm.hook.batch_strategy()
    try:
        strategy = BatchStrategy.parse(strategy)
    except ValueError as exc:
        raise ConfigurationError(f"hook batch_strategy returned {exc}") from None
    values: dict[str, Any] = {"BatchStrategy": strategy.value}
    for hook_name, key, minimum in (
        ("max_concurrent_transforms", "MaxConcurrentTransforms", 1),
        ("max_payload_in_mb", "MaxPayloadInMB", 0),
    ):
        value = getattr(pm.hook, hook_name)()
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(f"hook {hook_name} returned {value!r}: it must be an integer >= {minimum}")
        values[key] = value
    return values


class Pipeline:
    """The hooks of one plugin set (and script) for one model directory, resolved once, run once per invocation."""

    def __init__(
        self,
        settings: Settings,
        shared: pluggy.PluginManager,
        *,
        stage: Callable[[str], AbstractContextManager[Any]] | None = None,
        timed: Callable[[Timed], None] | None = None,
    ) -> None:
        """``stage(hook)``: what each hook of an invocation runs within (a trace's span), if anything; ``timed``:
        told each invocation that passed its three hooks, as a :data:`Timed`, if anything. Whoever makes the pipeline
        gives them (the server: its tracing and metrics)."""
        script = _script.plugin(settings)
        #: The plugins whose hooks run: ``shared``'s, with the script first if there is one (in a view of its own).
        self.pm = pm = shared if script is None else _plugins.view(shared, script.plugin, script.name)
        #: The framework container script served as a plugin, if any (``--script``, ``SAGEMAKER_PROGRAM``): the
        #: server and Batch Transform alike.
        self.script = None if script is None else script.path
        self.model_dir = settings.model_dir
        #: The name of this pipeline's model in the process's store: pipelines of the same plugin manager, script
        #: (and its defaults) and directory share it (``warmup()`` loads what ``create_app()`` serves).
        self.key: Hashable = (
            id(shared),
            None if script is None else (script.name, settings.script_defaults),
            self.model_dir,
        )
        self._shared = shared  # held so that the id in the key is not reused while the pipeline lives
        #: ``/execution-parameters``: checked here, so that invalid hook values stop start-up.
        self.execution_parameters = execution_parameters(pm)
        mb = self.execution_parameters["MaxPayloadInMB"]
        #: The largest body accepted, in bytes (``None``: no limit, as for Batch Transform's chunked mode).
        self.max_body: int | None = mb * _MB if mb else None
        self._defaults = default_plugin.Defaults(
            codecs.Limits.for_payload(mb),
            settings.default_accept,
            settings.json_nan,
            passthrough=settings.default_hooks == "passthrough",
        )
        self._input_fn = _plugins.first_result_caller(pm, "input_fn")
        self._predict_fn = _plugins.first_result_caller(pm, "predict_fn")
        self._output_fn = _plugins.first_result_caller(pm, "output_fn")
        #: The stages for the event-loop lifecycle (:meth:`ainvoke`): each is awaited on the loop (an ``async def``
        #: hook), called on the loop (the built-in hook alone: ours, and quick), or run on a model thread.
        self._stages = {
            hook: _Stage(sync, _plugins.async_caller(pm, hook), _plugins.is_default(pm, hook))
            for hook, sync in (
                ("input_fn", self._input_fn),
                ("predict_fn", self._predict_fn),
                ("output_fn", self._output_fn),
            )
        }
        #: Whether a hook of an invocation is ``async def``: the event-loop lifecycle then runs it with
        #: :meth:`ainvoke`, else all of it on one model thread with :meth:`invoke`.
        self.asynchronous = any(stage.awaited is not None for stage in self._stages.values())
        self._stage = stage
        self._timed = timed
        # what :meth:`invoke` calls: the hooks, each within its stage when there is one (no context manager entered
        # per hook when there is not: one that did nothing cost 8% of a small request's instructions)
        self._run_input = self._within("input_fn", self._input_fn)
        self._run_predict = self._within("predict_fn", self._predict_fn)
        output_fn = self._output_fn
        #: With stages, ``output_fn`` and the check of its answer within its stage (without, written out inline).
        self._staged_output = self._within(
            "output_fn", lambda prediction, accept: _output(output_fn(prediction, accept))
        )

    def _within(self, hook: str, function: Callable[..., _T]) -> Callable[..., _T]:
        """``function``, run within the stage of ``hook`` (a trace's span) when the pipeline has stages."""
        stage = self._stage
        if stage is None:
            return function

        def staged(*args: Any) -> _T:
            with stage(hook):
                return function(*args)

        return staged

    @property
    def shared(self) -> pluggy.PluginManager:
        """The plugin manager the pipeline was made with (a script's view over it aside): pipelines made with it name
        the same model in the process's store."""
        return self._shared

    @property
    def limits(self) -> codecs.Limits:
        """How much a request's decoding may build (from ``MaxPayloadInMB``), as the built-in ``input_fn`` has it."""
        return self._defaults.limits

    def model(self) -> Any:
        """The loaded model (loading it now if needed); :class:`ModelLoadError` if ``model_fn`` failed."""
        # registering or unregistering a plugin of the manager replaces the model, as in 1.x
        return _models.store.model(self.key, self, self.model_dir, getattr(self._shared, "generation", 0))

    def load_model(self, model_dir: str) -> Any:
        """``model_fn``'s model for ``model_dir`` (no caching: see :mod:`inference_server._models`)."""
        return _plugins.call_model_fn(self.pm, model_dir)

    def surely_healthy(self) -> bool:
        """Whether :meth:`unhealthy` would say None without running any code of a plugin: the model is loaded and
        only the built-in ``ping_fn`` (which says yes) would be asked."""
        if not _plugins.is_default(self.pm, "ping_fn"):
            return False
        entry = _models.store.entry(self.key)
        return entry is not None and entry.loaded and entry.version == getattr(self._shared, "generation", 0)

    def unhealthy(self) -> str | None:
        """Why the model cannot serve (it failed to load, ``ping_fn`` said no or raised), or None when it can."""
        try:
            healthy = bool(self.pm.hook.ping_fn(model=self.model()))
        except ModelLoadError as exc:
            return str(exc.description)  # model_fn's traceback was logged when it failed
        except Exception as exc:
            logger.exception("ping_fn raised; answering 503")
            return f"ping_fn raised {type(exc).__name__}; see the server log"
        if not healthy:
            logger.warning("Ping: ping_fn returned False; answering 503")
            return "ping_fn returned False"
        return None

    def predict(self, data: Any, model: Any) -> Any:
        """``predict_fn`` alone (what a batch of inputs is run with)."""
        return self._predict_fn(data, model)

    def invoke(
        self,
        body: codecs.Buffer,
        content_type: str,
        accept: str,
        model: Any,
        predict: Callable[[Any], Any] | None = None,
        streamed: bool = False,
        framing: Framing | None = None,
        arrived: float | None = None,
        name: str = "",
    ) -> Output:
        """Run ``input_fn``, ``predict_fn`` (or ``predict``: a batcher's, which may run it with other inputs) and
        ``output_fn`` on one body; a protocol with a framing of its own (``framing``: the Open Inference Protocol's
        tensors) decodes the body and encodes the prediction in place of ``input_fn`` and ``output_fn``.

        When ``output_fn`` gives an iterator of chunks (a streamed answer), the first chunk is made now; with
        ``streamed`` the rest is left in :attr:`Output.stream` for the caller to send as it is made (and close),
        else it is made now too and the output is whole.

        ``arrived`` (``time.monotonic()``) and ``name``: when the request arrived and the model's name on a
        multi-model endpoint, as :data:`Timed` reports them.

        The hooks run in a copy of the caller's context: a context variable one of them sets is seen by the
        others of this invocation only. An HTTP exception raised by a hook keeps its status; anything else a hook
        raises becomes a :class:`HookError` naming the hook (a 500).
        """
        context = contextvars.copy_context()
        output = context.run(self._invoke, body, content_type, accept, model, predict, framing, arrived, name)
        if output.stream is None:
            return output
        stream = output.stream
        stream.context = context
        try:
            if not streamed:
                return output._replace(buffers=stream.drain(), stream=None)
            first = stream.next()  # made now, within the caller's deadline and model slot
        except BaseException:
            stream.close()
            raise
        if first is None:
            stream.close()
            return output._replace(buffers=[], stream=None)
        return output._replace(buffers=[first], stream=stream)

    async def ainvoke(
        self,
        body: codecs.Buffer,
        content_type: str,
        accept: str,
        model: Any,
        on_thread: OnThread,
        framing: Framing | None = None,
        predict: Callable[[Any], Awaitable[Any]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        arrived: float | None = None,
        name: str = "",
    ) -> Output:
        """:meth:`invoke` on the event loop, for a pipeline with an ``async def`` hook (:attr:`asynchronous`) or a
        micro-batched one (``predict``: a batcher's, awaited in place of ``predict_fn``): async hooks awaited on the
        loop, the built-in hooks called there, a plugin's sync hooks run by ``on_thread`` (a model thread). A
        streamed answer's first chunk is made now, the rest left in :attr:`Output.stream`. The hooks run in a copy
        of the caller's context, as with :meth:`invoke`. ``loop``: the running loop, when the caller knows it."""
        loop = loop or asyncio.get_running_loop()
        output, context = await loop.create_task(  # (a task: its context is a copy of the caller's)
            self._ainvoke(body, content_type, accept, model, on_thread, framing, predict, arrived, name)
        )
        if output.stream is None:
            return output
        stream = output.stream
        stream.context = context
        try:
            first = await stream.anext() if stream.records is not None else await on_thread(stream.next)
        except BaseException:
            await stream.aclose() if stream.records is not None else stream.close()
            raise
        if first is None:
            await stream.aclose() if stream.records is not None else stream.close()
            return output._replace(buffers=[], stream=None)
        return output._replace(buffers=[first], stream=stream)

    async def _ainvoke(
        self,
        body: codecs.Buffer,
        content_type: str,
        accept: str,
        model: Any,
        on_thread: OnThread,
        framing: Framing | None,
        predict: Callable[[Any], Awaitable[Any]] | None,
        arrived: float | None,
        name: str,
    ) -> tuple[Output, contextvars.Context]:
        default_plugin.current.set((self._defaults, content_type))
        hooks = _HOOKS if framing is None else framing.stages
        stages = self._stages
        stage = self._stage
        hook, data = hooks[0], None
        try:
            timed = self._timed
            started = time.monotonic() if timed is not None else 0.0
            step: Awaitable[Any]
            if framing is None:
                step = stages["input_fn"].run(on_thread, body, content_type)
            else:
                step = on_thread(framing.decode, body, model)
            data = await (step if stage is None else _staged(stage, hook, step))
            hook = "predict_fn"
            decoded = time.monotonic() if timed is not None else 0.0
            step = _predicted(stages["predict_fn"].run(on_thread, data, model) if predict is None else predict(data))
            prediction = await (step if stage is None else _staged(stage, hook, step))
            hook = hooks[2]
            predicted = time.monotonic() if timed is not None else 0.0
            if framing is None:
                step = _checked(stages["output_fn"].run(on_thread, prediction, parse_accept(accept)))
            else:
                step = on_thread(framing.encode, prediction)
            output = await (step if stage is None else _staged(stage, hook, step))
            if output.stream is not None and isinstance(prediction, _loop.Items):
                output.stream.records = prediction
            if timed is not None:
                timed((started if arrived is None else arrived, started, decoded, predicted, time.monotonic(), name))
            return output, contextvars.copy_context()
        except (HTTPError, HookError, werkzeug.exceptions.HTTPException):
            raise
        except Exception as exc:
            raise _failed(hook, exc, data is body, content_type) from exc
        except (SystemExit, KeyboardInterrupt) as exc:  # (a hook that exits: its 500, not the end of a thread or loop)
            raise HookError(hook, exc) from exc

    def _invoke(
        self,
        body: codecs.Buffer,
        content_type: str,
        accept: str,
        model: Any,
        predict: Callable[[Any], Any] | None,
        framing: Framing | None,
        arrived: float | None,
        name: str,
    ) -> Output:
        default_plugin.current.set((self._defaults, content_type))
        hooks = _HOOKS if framing is None else framing.stages
        timed = self._timed
        hook, data = hooks[0], None
        try:
            started = time.monotonic() if timed is not None else 0.0
            if framing is None:
                data = self._run_input(body, content_type)
            else:
                data = self._within(hook, framing.decode)(body, model)
            hook = "predict_fn"
            decoded = time.monotonic() if timed is not None else 0.0
            prediction = self._run_predict(data, model) if predict is None else self._within(hook, predict)(data)
            hook = hooks[2]
            predicted = time.monotonic() if timed is not None else 0.0
            if framing is None:
                if self._stage is None:
                    output = _output(self._output_fn(prediction, parse_accept(accept)))
                else:
                    output = self._staged_output(prediction, parse_accept(accept))
            else:
                output = self._within(hook, framing.encode)(prediction)
            if output.stream is not None and isinstance(prediction, _loop.Items):
                output.stream.records = prediction
            if timed is not None:
                timed((started if arrived is None else arrived, started, decoded, predicted, time.monotonic(), name))
            return output
        except (HTTPError, HookError, werkzeug.exceptions.HTTPException):
            raise
        except Exception as exc:
            raise _failed(hook, exc, data is body, content_type) from exc
        except (SystemExit, KeyboardInterrupt) as exc:  # (a hook that exits: its 500, not the end of a thread or loop)
            raise HookError(hook, exc) from exc


class _Stage(NamedTuple):
    """One hook of an invocation as the event-loop lifecycle runs it."""

    sync: Callable[..., Any]
    #: The first-result caller to await, when an implementation is ``async def``.
    awaited: Callable[..., Awaitable[Any]] | None
    #: The built-in implementation alone: called on the loop.
    inline: bool

    async def run(self, on_thread: OnThread, *args: Any) -> Any:
        if self.awaited is not None:
            return await self.awaited(*args)
        if self.inline:
            return self.sync(*args)
        return await on_thread(self.sync, *args)


async def _staged(stage: Callable[[str], AbstractContextManager[Any]], hook: str, step: Awaitable[_T]) -> _T:
    """``step`` (a coroutine, not started yet) awaited within the stage of ``hook``."""
    with stage(hook):
        return await step


async def _predicted(step: Awaitable[Any]) -> Any:
    """``predict_fn``'s prediction; an async generator's with its first record fetched (its model's work until then,
    which ``output_fn`` may look at on the loop)."""
    prediction = await step
    if isinstance(prediction, _loop.Items):
        await prediction.prefetch()
    return prediction


async def _checked(step: Awaitable[Any]) -> Output:
    """``output_fn``'s answer, checked (:func:`_output`)."""
    return _output(await step)


@codecs.cache_short(256)
def parse_accept(header: str) -> MIMEAccept:
    """The parsed Accept header (``*/*`` when empty); clients send the same few values again and again."""
    return werkzeug.http.parse_accept_header(header or "*/*", MIMEAccept)


#: What ``curl -d`` sends when it is not told the body's type.
FORM = "application/x-www-form-urlencoded"


#: What code raises when it is given bytes where it expected decoded data (``data["key"]``, ``data.shape``, ...).
_ON_BYTES = (TypeError, AttributeError, KeyError, IndexError, ValueError)


def _failed(hook: str, exc: Exception, on_bytes: bool, content_type: str) -> Exception:
    """What a hook's exception becomes: a :class:`HookError` naming the hook, or the 415 of :func:`_unknown_type`
    when ``predict_fn`` was given the body's bytes (``on_bytes``) of a type no codec decodes."""
    if hook == "predict_fn" and on_bytes and isinstance(exc, _ON_BYTES) and not codecs.lookup(content_type):
        return _unknown_type(hook, exc, content_type)
    return HookError(hook, exc)


def _unknown_type(hook: str, exc: Exception, content_type: str) -> UnsupportedMediaType:
    """The 415 for a body that no codec decodes and that ``predict_fn``, given its bytes, failed on as code does on
    data of the wrong kind: the client's ``Content-Type`` is the likely mistake (a typo, or none given), not the
    model. Other failures (a model that takes bytes and runs out of memory) stay 500s."""
    bare = codecs.bare(content_type) or "(none)"
    logger.info(
        "%s raised %s on a %s body, which no codec decodes; answering 415",
        hook,
        type(exc).__name__,
        bare,
        exc_info=exc,
    )
    hint = ""
    if bare == FORM:
        hint = (
            f"; {FORM} is what curl -d sends when no type is given: name the body's type, e.g. "
            "-H 'Content-Type: application/json'"
        )
    return UnsupportedMediaType(
        f"the Content-Type {bare} matches no codec, and the model could not use the body as bytes ({hook} raised "
        f"{type(exc).__name__}){hint}; known types: {', '.join(codecs.media_types())}"
    )


def _output(result: Any) -> Output:
    """Check ``output_fn``'s ``(body, content_type[, headers])`` and turn it into an :class:`Output`."""
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        shape = f"a tuple of {len(result)}" if isinstance(result, tuple) else f"a {type(result).__name__}"
        raise HookError(
            "output_fn",
            TypeError(f"output_fn must return (body, content_type) or (body, content_type, headers), not {result!r}"),
            summary=f"output_fn returned {shape}, not (body, content_type) or (body, content_type, headers)",
        )
    headers = [(str(name), str(value)) for name, value in result[2].items()] if len(result) == 3 else []
    content, media_type = result[0], result[1]
    if type(media_type) is not str:
        media_type = str(media_type)
    if type(content) is bytes:  # the usual answer: no checks against abstract classes
        return Output([content], media_type, headers)
    if isinstance(content, Iterator) and not isinstance(content, io.IOBase):
        return Output([], media_type, headers, Stream(content))
    return Output(_as_buffers(content), media_type, headers)


def _chunk(item: Any) -> codecs.Buffer:
    """One item of a streamed body as a buffer: bytes-like as it is, ``str`` as UTF-8."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return item
    if isinstance(item, str):
        return item.encode()
    raise TypeError(f"a streamed body's items must be bytes-like or str, not {type(item).__name__}")


def _as_buffers(content: Any) -> list[codecs.Buffer]:
    if isinstance(content, (bytes, bytearray, memoryview)):
        return [content]
    if isinstance(content, str):
        return [content.encode()]
    if isinstance(content, (list, tuple)):
        return [buffer for item in content for buffer in _as_buffers(item)]
    raise HookError(
        "output_fn",
        TypeError(f"output_fn returned a body of type {type(content).__name__}; expected bytes-like or str"),
        summary=f"output_fn returned a body of type {type(content).__name__}, not bytes-like or str",
    )
