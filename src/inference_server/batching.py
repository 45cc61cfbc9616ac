"""Adaptive micro-batching: the inputs of concurrent requests share one ``predict_fn`` call. Knows nothing of HTTP.

Each request runs ``input_fn`` on its own thread, then hands its input to the worker's :class:`Batcher` and waits
for its own prediction; ``output_fn`` runs on its thread again. Inputs are grouped by what can be joined:

- ndarrays of one dtype and one shape after axis 0 are concatenated along axis 0, ``predict_fn`` runs once on the
  whole, and its prediction (an ndarray, a dict, tuple or list of ndarrays, a pandas DataFrame or an Arrow table,
  whose leading dimension is the total of rows) is cut back into each request's rows: views, never copies;
- lists of rows (lists of one length) or of records (dicts of the same keys), as JSON and JSON Lines bodies decode,
  are joined into one list and the prediction (a list, an ndarray, a DataFrame, a dict of columns...) is cut back
  the same way;
- a plugin's ``predict_batch_fn(data, model)`` takes any group (of arrays too) as a list, one prediction per input;
- anything else runs alone (a worker says so once, at WARNING).

Each group's size is logged at DEBUG.

**Adaptive.** No thread of its own and no fixed window: the request that finds the model free takes the oldest
group at once (itself, when it is alone: a lone request waits for nothing) unless more requests are about to come:

- requests still in ``input_fn`` on their way to the queue;
- requests that the last groups answered and that have not sent again yet: a client that was answered usually sends
  its next request at once, so a free model waits for them rather than run a small group and leave the rest to
  gather behind it (at saturation, groups alternating between a few and most of the clients). A lone client is its
  own return, so it still waits for nothing; clients that do not come back are waited for once.

It waits until the group is full, or for ``max_batch_delay`` from when the oldest input found the model free. For
answered requests it waits only when it pays: when gathering all the clients takes less than a call's fixed cost
(the call it saves), both learnt as it runs (the intercept of recent calls' times against their sizes; the worker's
time per request outside the model, from the gaps between arrivals and between answers), and for at most that
fixed cost. Otherwise, with many clients or costly requests, whoever is queued goes at once and the others gather
behind the running group. While the model is busy, inputs gather in the queue and go together when it frees. A
group holds at most ``max_batch_size`` requests; ``slots`` groups run at once (``--threads``).

Each waiting request's thread waits on an event of its own: an arrival wakes the one thread that forms the next
group, not every waiting one, and the requests of a group that ended go on without taking the batcher's lock.
On an event-loop front (:meth:`Batcher.apredict`) a request waits on the loop instead, holding no thread: the loop
forms the groups by the same rules (looking again when the oldest should go) and runs each on a model thread; a
request cancelled at its deadline takes its input out of the queue. Requests of both kinds share one queue.

**Errors stay per request.** When ``predict_fn`` raises for a group of several, each input of the group is run
again alone, so only the inputs that fail get an error (the cost: one more call per input of a failed group). A
prediction whose leading dimension is not the total of rows is an error for the whole group, never a silent
mis-split.

**Contexts.** Each input keeps its request's ``contextvars`` context. A lone input's ``predict_fn`` runs in it; a
group's runs in a context of its own, where :func:`members` gives the group's requests' contexts in order (what a
toolkit script's batched ``context`` reads its i-th request's headers from).

**Bounded.** At most ``max_queue`` inputs wait; one more is refused at once (:class:`~inference_server.errors.
ServiceUnavailable` with ``Retry-After``). An input whose request was answered already (a timeout) leaves the queue
unrun.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import concurrent.futures
import contextvars
import dataclasses
import functools
import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pluggy

from inference_server._deadlines import WAITING, Call, Cancelled
from inference_server.errors import ConfigurationError, HookError, ServiceUnavailable

if TYPE_CHECKING:
    from inference_server import metrics

logger = logging.getLogger("inference_server")

#: The built-in defaults: off; 5 ms of waiting for company; a queue of 4 groups.
DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BATCH_DELAY_MS, QUEUE_PER_BATCH = 1, 5, 4
#: The longest queue a worker may hold: each waiting request holds a server thread, and a worker starts up to
#: about 1,000 (see ``server.SLOW_CLIENT_THREADS``), some of which must stay free for /ping.
MAX_QUEUE = 960
#: Seconds a refused request is told to wait before it tries again.
RETRY_AFTER = 1
#: Seconds between checks, by a waiting request, of whether it was answered already (a timeout).
_POLL = 0.25
#: How many of the last calls (their sizes and times) and of the last gaps between arrivals the batcher learns from.
_HISTORY = 32


_members: contextvars.ContextVar[tuple[contextvars.Context, ...]] = contextvars.ContextVar("inference_server_group")


def members() -> tuple[contextvars.Context, ...] | None:
    """In a ``predict_fn`` call for a group of requests, their contexts in the order of their inputs; else None."""
    return _members.get(None)


@dataclasses.dataclass(frozen=True)
class Options:
    """How one worker batches: ``max_batch_size`` 1 is off."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    #: Seconds.
    max_batch_delay: float = DEFAULT_MAX_BATCH_DELAY_MS / 1000
    max_queue: int = DEFAULT_MAX_BATCH_SIZE * QUEUE_PER_BATCH
    #: Groups run at once.
    slots: int = 1

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 1


def options(given: Mapping[str, int | None], chosen: frozenset[str], hook: Any, slots: int) -> Options:
    """The worker's batching options: ``given`` (the settings; ``None``: unset), where those named in ``chosen``
    (given as options on the command line) win over the ``batching`` hook's dict, which wins over the rest."""
    if hook is not None and not isinstance(hook, dict):
        raise ConfigurationError(f"hook batching returned {hook!r}: it must be a dict or None")
    wanted = hook or {}
    unknown = set(wanted) - {"max_batch_size", "max_batch_delay_ms"}
    if unknown:
        raise ConfigurationError(
            f"hook batching returned unknown keys {', '.join(sorted(unknown))}: the keys are max_batch_size and "
            "max_batch_delay_ms"
        )

    def pick(name: str, default: int, minimum: int) -> int:
        value = given.get(name)
        if name not in chosen and name in wanted:
            value = wanted[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigurationError(f"hook batching returned {name} {value!r}: it must be an integer >= {minimum}")
        return default if value is None else value

    size = pick("max_batch_size", DEFAULT_MAX_BATCH_SIZE, 1)
    delay = pick("max_batch_delay_ms", DEFAULT_MAX_BATCH_DELAY_MS, 0)
    queue = given.get("max_queue") or QUEUE_PER_BATCH * size
    if queue > MAX_QUEUE:
        raise ConfigurationError(f"max queue {queue}: at most {MAX_QUEUE} (each waiting request holds a thread)")
    return Options(size, delay / 1000, queue, slots)


def _poke(poke: _thread.LockType) -> None:
    """Wake the thread waiting on an input's ``poke`` lock (or the next wait on it), with the batcher's lock held (so
    that two pokes never both release it)."""
    if poke.locked():
        poke.release()


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    """On the loop: inputs waited for there are done."""
    for future in futures:
        if not future.done():  # (cancelled: its request was answered already)
            future.set_result(None)


class _Input:
    """One request's input in the queue, and what became of it."""

    __slots__ = (
        "call",
        "context",
        "data",
        "done",
        "ended",
        "error",
        "future",
        "holder",
        "key",
        "model",
        "poke",
        "queued",
        "result",
        "since",
        "waiting",
    )

    def __init__(self, data: Any, model: Any, key: object, call: Call | None) -> None:
        self.data, self.model, self.key, self.call = data, model, key, call
        #: What its request's thread waits on: poked when the input is done, or when a group may be ready (for the
        #: oldest waiting input's thread). One per input, apart from the batcher's lock: an arrival wakes one
        #: thread, not every waiting one, and the inputs of a group that ended go on without taking the lock (32
        #: threads woken at once to take it again would hold back every arrival behind them). A bare lock, held
        #: while not poked (see :func:`_poke`): a ``threading.Event`` costs several times more per wait.
        self.poke = _thread.allocate_lock()
        self.poke.acquire()
        #: Its thread is waiting for ``poke`` (not running a group of other inputs).
        self.waiting = False
        #: For a request waiting on the event loop (:meth:`Batcher.apredict`), not on a thread: the loop's future
        #: it awaits, resolved there once the input is done.
        self.future: asyncio.Future[None] | None = None
        #: What is told the future of the group it runs in, as its ``future`` (:meth:`Batcher.apredict`).
        self.holder: Any = None
        #: The request's context (a copy: another thread may run this input's prediction).
        self.context = contextvars.copy_context()
        self.since = time.monotonic()
        self.queued = True
        self.done = False
        #: When the group it was in ended (monotonic seconds), else 0.
        self.ended = 0.0
        self.result: Any = None
        self.error: BaseException | None = None

    @property
    def answered(self) -> bool:
        """The request was answered already (its deadline passed): never run it."""
        return self.call is not None and self.call.cancelled


class Coming:
    """A request's input on its way to a batcher's queue (:meth:`Batcher.coming`): a free model waits for it. The
    block it closes (``with batcher.coming() as coming:``) hands it to :meth:`Batcher.predict` or
    :meth:`Batcher.apredict`; ended without that (``input_fn`` failed), the input is no longer waited for."""

    __slots__ = ("_batcher", "sent")

    def __init__(self, batcher: Batcher) -> None:
        self._batcher = batcher
        self.sent = False

    def __enter__(self) -> Coming:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.sent:
            self._batcher._gone()


class Batcher:
    """One worker's queue of inputs and the groups run from it (see the module's text)."""

    def __init__(
        self,
        settings: Options,
        predict: Callable[[Any, Any], Any],
        predict_batch: Callable[[list[Any], Any], list[Any] | None] | None = None,
        recorder: metrics.Recorder | None = None,
    ) -> None:
        self.options = settings
        #: Where groups are counted (``--metrics``), else None.
        self._recorder = recorder
        if recorder is not None:
            recorder.batchers.add(self)
        self._predict = predict
        self._predict_batch = predict_batch
        self._lock = threading.Lock()
        self._queue: collections.deque[_Input] = collections.deque()
        self._free = settings.slots
        #: Requests in ``input_fn``, on their way to the queue: a free model waits for them (up to the delay).
        self._coming = 0
        #: Requests answered by groups whose clients have not sent again yet: a free model waits for them too.
        self._owed = 0
        #: When a slot was last given back (monotonic seconds).
        self._freed = 0.0
        #: The last calls' (requests, seconds), and the seconds between the last arrivals in the queue.
        self._calls: collections.deque[tuple[int, float]] = collections.deque(maxlen=_HISTORY)
        self._gaps: collections.deque[float] = collections.deque(maxlen=_HISTORY)
        self._arrived = 0.0
        #: The seconds between the last inputs of a group going on to their answers, and when the last one did.
        #: Recorded without the lock (one float, one append: atomic for the interpreter); an estimate.
        self._leaves: collections.deque[float] = collections.deque(maxlen=_HISTORY)
        self._left = 0.0
        #: Learnt from them when a free model considers waiting for answered clients (not for every group: a lone
        #: client's requests never need them): a call's fixed cost, and the worker's time per request outside the
        #: model (seconds); ``_learnt``: they are up to date with the last group.
        self._fixed = 0.0
        self._per_request = 0.0
        self._learnt = False
        self._told_alone = False
        #: For requests on an event loop (:meth:`apredict`): the loop, what runs a group on a model thread, whether
        #: the loop was asked to form groups and not done so yet, and its timer to look again.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spawn: Callable[[Callable[[], None]], concurrent.futures.Future[None]] | None = None
        self._kicked = False
        self._later: asyncio.TimerHandle | None = None

    @classmethod
    def for_hooks(
        cls,
        settings: Options,
        pm: pluggy.PluginManager,
        predict: Callable[[Any, Any], Any],
        recorder: metrics.Recorder | None = None,
    ) -> Batcher:
        """A batcher calling ``predict`` (the ``predict_fn`` caller), and ``predict_batch_fn`` if a plugin has one."""
        from inference_server import _plugins

        implementations = pm.hook.predict_batch_fn.get_hookimpls()
        batch = None
        if any(impl.plugin_name != _plugins.DEFAULTS_NAME for impl in implementations):
            caller = _plugins.first_result_caller(pm, "predict_batch_fn")

            def batch(data: list[Any], model: Any) -> list[Any] | None:
                return caller(data, model)  # type: ignore[no-any-return]

        return cls(settings, predict, batch, recorder)

    @property
    def waiting(self) -> int:
        """Inputs in the queue now."""
        return len(self._queue)

    def coming(self) -> Coming:
        """A request started ``input_fn``: its input will follow, handed to :meth:`predict` or :meth:`apredict` with
        the :class:`Coming` returned, unless the block it closes ends without it (``input_fn`` failed)."""
        with self._lock:
            self._coming += 1
            if self._owed:
                self._owed -= 1
        return Coming(self)

    def _gone(self) -> None:
        """A request that said :meth:`coming` will send no input after all."""
        with self._lock:
            self._coming -= 1
            self._wake_head()

    def predict(
        self,
        data: Any,
        model: Any,
        call: Call | None = None,
        *,
        coming: Coming | None = None,
        hand_off: Callable[[list[_Input], Callable[[], None]], None] | None = None,
    ) -> Any:
        """The prediction for one request's input, computed with those of other requests where they can be joined.

        Raises what ``predict_fn`` raised for this input, :class:`ServiceUnavailable` when the queue is full, and
        :class:`Cancelled` when the request was answered while it waited. ``coming``: what :meth:`coming` gave the
        request before ``input_fn``. The thread that forms a group runs it, or, given ``hand_off(group, run)``,
        has that run it (``run()`` on this thread, or handed to a model thread): then a request answered while its
        group runs (its deadline) stops waiting too, and the group runs on without it.
        """
        item = self._input(data, model, call)
        with self._lock:
            self._admit(item, coming)
        while True:
            group = self._wait(item, leave=hand_off is not None)
            if group is None:
                break
            if hand_off is None:
                self._run_and_end(group)
            else:
                hand_off(group, functools.partial(self._run_and_end, group))
        return self._answer(item)

    async def apredict(
        self,
        data: Any,
        model: Any,
        call: Call | None,
        spawn: Callable[[Callable[[], None]], concurrent.futures.Future[None]],
        *,
        coming: Coming | None = None,
        holder: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Any:
        """:meth:`predict` for a request on an event loop: it waits there (no thread of its own), the groups are
        formed there and run by ``spawn`` (which runs a function on a model thread and gives its future; ``holder``,
        if any, is given the future of the group its input runs in as its ``future``). The request's task cancelled
        while its input is queued (its deadline) takes the input out of the queue. ``loop``: the running loop, when
        the caller knows it."""
        loop = loop or asyncio.get_running_loop()
        self._spawn, self._loop = spawn, loop
        item = self._input(data, model, call)
        item.holder = holder
        item.future = future = loop.create_future()
        with self._lock:
            self._admit(item, coming)
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if item.queued:
                    self._queue.remove(item)
                    item.queued = False
                    self._wake_head()
            raise
        return self._answer(item)

    def _input(self, data: Any, model: Any, call: Call | None) -> _Input:
        item = _Input(data, model, self._key(data, model), call)
        if item.key is None and not self._told_alone:
            self._told_alone = True  # once per worker: a hint, not a complaint per request
            logger.warning(
                "Micro-batching: an input of type %s runs alone: only arrays and lists of rows or records are joined "
                "with other requests' inputs; a plugin's predict_batch_fn can take any inputs as a group",
                type(data).__name__,
            )
        return item

    def _admit(self, item: _Input, coming: Coming | None) -> None:
        """Queue ``item`` (or refuse it: the queue is full); with the lock held."""
        if coming is not None:
            coming.sent = True
            self._coming -= 1
        elif self._owed:
            self._owed -= 1
        if len(self._queue) >= self.options.max_queue:
            self._wake_head()
            raise ServiceUnavailable(
                f"the model's queue is full ({self.options.max_queue} requests waiting); send the request "
                f"again in {RETRY_AFTER} s",
                headers=[("Retry-After", str(RETRY_AFTER))],
            )
        if item.call is not None:
            item.call.enter(WAITING)
        if self._arrived:
            self._gaps.append(item.since - self._arrived)
        self._arrived = item.since
        self._queue.append(item)
        self._wake_head()

    def _run_and_end(self, group: list[_Input]) -> None:
        """Run ``group``, give its slot back and tell its inputs' requests (on any thread). What escapes the run (not
        a ``predict_fn`` error, which is its input's own: a ``BaseException``) fails the inputs left without an
        answer, then goes on up."""
        started = time.monotonic()
        try:
            self._run(group)
        except BaseException as exc:
            failed = HookError("predict_fn", exc, f"predict_fn raised {type(exc).__name__} in a group")
            for member in group:
                if member.error is None and member.result is None:
                    member.error = failed
            raise
        finally:
            self._end(group, started)

    def _end(self, group: list[_Input], started: float) -> None:
        """``group`` ended: give its slot back, learn from it and tell its inputs' requests."""
        with self._lock:
            self._free += 1
            self._freed = now = time.monotonic()
            self._calls.append((len(group), now - started))
            self._learnt = False
            self._owed = min(self._owed + len(group), self.options.max_queue)
            futures = []
            for member in group:
                member.done, member.ended = True, now
                if member.future is not None:
                    futures.append(member.future)
                else:
                    _poke(member.poke)
            self._wake_head()
            if futures and self._loop is not None:  # (one wake-up of the loop for the group)
                self._loop.call_soon_threadsafe(_resolve, futures)

    def _answer(self, item: _Input) -> Any:
        """A done input's prediction (or its error, raised)."""
        if item.ended:  # the input of a group: how long after the last one it went on (see _turnaround)
            now = time.monotonic()
            if self._left > item.ended:
                self._leaves.append(now - self._left)
            self._left = now
        if item.error is not None:
            raise item.error
        return item.result

    def _schedule(self) -> None:
        """On the event loop: form the groups that should go now from the queue and spawn them, or look again when
        the oldest one should go."""
        self._kicked = False
        groups: list[list[_Input]] = []
        wait = 0.0
        with self._lock:
            while self._free and self._queue:
                group, wait = self._ready()
                if not group:
                    break
                self._free -= 1
                groups.append(group)
        if wait and self._queue and self._loop is not None:
            if self._later is not None:
                self._later.cancel()
            self._later = self._loop.call_later(wait, self._schedule)
        for group in groups:
            assert self._spawn is not None
            try:
                future = self._spawn(functools.partial(self._run_and_end, group))
            except RuntimeError:  # (the model threads are shut down: the worker is stopping)
                for member in group:
                    member.error = ServiceUnavailable("the server is shutting down; send the request again")
                self._end(group, time.monotonic())
                continue
            for member in group:
                if member.holder is not None:
                    member.holder.future = future

    def _wait(self, item: _Input, leave: bool = False) -> list[_Input] | None:
        """Wait until ``item`` is done (None) or this thread may run a group (taken from the queue, with a slot);
        :class:`Cancelled` once its request was answered while it was queued (``leave``: or while its group ran)."""
        while not item.done:  # (set before its poke, with the lock held)
            with self._lock:
                if item.done:
                    break
                if item.answered and (item.queued or leave):
                    if item.queued:
                        self._queue.remove(item)
                        item.queued = False
                        self._wake_head()
                    raise Cancelled
                wait = _POLL
                if self._free and item.queued:
                    group, wait = self._ready()
                    if group:
                        self._free -= 1
                        self._wake_head()  # (another slot may be free for the next group)
                        return group
                item.poke.acquire(False)  # (drops a poke not waited for; with the lock held, any later one is seen)
                item.waiting = True
            item.poke.acquire(True, wait)
            item.waiting = False
        return None

    def _wake_head(self) -> None:
        """If a slot is free, wake the oldest input's thread that is waiting: it forms the next group (any queued
        input's thread may; the oldest's is most likely idle); or, when the oldest such input waits on the event
        loop, ask the loop to form it. Call with the lock held."""
        if self._free:
            for item in self._queue:
                if item.waiting:
                    _poke(item.poke)
                    return
                if item.future is not None:
                    if not self._kicked and self._loop is not None:
                        self._kicked = True  # (before the call: the loop may run _schedule, which resets it, at once)
                        try:
                            self._loop.call_soon_threadsafe(self._schedule)
                        except RuntimeError:  # (the loop is closed)
                            self._kicked = False
                    return

    def _ready(self) -> tuple[list[_Input], float]:
        """The oldest group if it should go now (else empty), and how long to wait before asking again."""
        queue = self._queue
        while queue and queue[0].answered:  # its request had its answer (a timeout): never run it
            dropped = queue.popleft()
            dropped.queued, dropped.done, dropped.error = False, True, Cancelled()
            if dropped.future is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(_resolve, [dropped.future])
            else:
                _poke(dropped.poke)
        if not queue:
            return [], _POLL
        head = queue[0]
        size = self.options.max_batch_size
        if head.key is None:
            members = [head]
        else:
            members = [item for item in queue if item.key == head.key and not item.answered][:size]
        if len(members) < size and head.key is not None and (self._coming or self._owed):
            delay = self.options.max_batch_delay
            waited = time.monotonic() - max(head.since, self._freed)  # since the oldest input found the model free
            if self._coming and waited < delay:
                return [], delay - waited  # others are on their way: wait a little for them
            if self._owed:
                # Waiting for every client to be back pays when gathering them all takes less than the call it
                # saves (its fixed cost); else the model does better with whoever is queued, the others gathering
                # behind it (see the module's text).
                if not self._learnt:
                    self._fixed, self._per_request = fixed_cost(self._calls), _turnaround(self._gaps, self._leaves)
                    self._learnt = True
                delay = min(delay, self._fixed)
                clients = len(queue) + self._owed + self._coming
                if waited < delay and clients * self._per_request <= self._fixed:
                    return [], delay - waited  # answered clients send again: wait a little for them
                self._owed = 0  # they did not come back, or waiting would not pay: wait for them no more
        for member in members:
            queue.remove(member)
            member.queued = False
        return members, 0.0

    def _key(self, data: Any, model: Any) -> object:
        """What an input may be grouped by (None: alone): arrays by dtype and trailing shape; with
        ``predict_batch_fn``, anything else together too."""
        if isinstance(data, np.ndarray) and data.ndim >= 1 and not data.dtype.hasobject:
            return (id(model), data.dtype.str, data.shape[1:])
        if type(data) is list and data:
            first = data[0]
            if type(first) is list and all(type(row) is list and len(row) == len(first) for row in data):
                return (id(model), "rows", len(first))
            if type(first) is dict and all(type(row) is dict and row.keys() == first.keys() for row in data):
                return (id(model), "records", tuple(first))  # records of other fields would be joined with holes
        return (id(model), "any") if self._predict_batch is not None else None

    def _run(self, group: list[_Input]) -> None:
        """Run one group's prediction and give each input its own result or error; inputs whose requests were
        answered while the group waited for a model thread (their deadline) are left out."""
        if any(member.answered for member in group):
            for member in group:
                if member.answered:
                    member.error = Cancelled()
            group = [member for member in group if not member.answered and member.error is None]
            if not group:
                return
        for member in group:
            if member.call is not None:
                member.call.run()
        model = group[0].model
        logger.debug("Micro-batching: a group of %d request(s)", len(group))
        if self._recorder is not None:
            now = time.monotonic()
            rows = sum(_rows(member.data) for member in group)
            self._recorder.batched((len(group), rows, [now - member.since for member in group]))
        if len(group) == 1 and self._predict_batch is None:
            _alone(self._predict, group[0])
            return
        try:
            predictions = _in_group_context(group, self._together, group, model)
        except HookError as exc:  # a mis-sized answer: the group's, not one input's
            for member in group:
                member.error = exc
            return
        except Exception:
            for member in group:  # run each again alone, so that only the bad ones fail
                _alone(self._predict, member)
            return
        if predictions is None:  # predict_batch_fn declined and the inputs cannot be joined
            for member in group:
                _alone(self._predict, member)
            return
        for member, prediction in zip(group, predictions, strict=True):
            member.result = prediction

    def _together(self, group: list[_Input], model: Any) -> list[Any] | None:
        data = [member.data for member in group]
        if self._predict_batch is not None:
            predictions = self._predict_batch(data, model)
            if predictions is not None:
                if not isinstance(predictions, (list, tuple)) or len(predictions) != len(group):
                    raise HookError(
                        "predict_batch_fn",
                        TypeError("predict_batch_fn must return one prediction per input"),
                        summary=f"predict_batch_fn returned {_described(predictions)} for {len(group)} inputs; it "
                        "must return a list of one prediction per input",
                    )
                return list(predictions)
        if isinstance(data[0], np.ndarray):
            joined: Any = np.concatenate(data)
        elif type(data[0]) is list:
            joined = [row for rows in data for row in rows]
        else:
            return None
        rows = [len(rows) for rows in data]
        return split(self._predict(joined, model), rows)


def _turnaround(arrivals: Collection[float], leaves: Collection[float]) -> float:
    """The worker's time per request outside the model (seconds): the typical gap between arrivals in the queue
    (the request's way in) plus that between the inputs of a group going on to their answers (the way out)."""
    return (statistics.median(arrivals) if arrivals else 0.0) + (statistics.median(leaves) if leaves else 0.0)


def fixed_cost(calls: Collection[tuple[int, float]]) -> float:
    """What a call costs whatever its size (seconds): the intercept of a least-squares line through the calls'
    (requests, seconds), within 0 and the cheapest call; the cheapest call when all had one size."""
    sizes = [size for size, _ in calls]
    seconds = [took for _, took in calls]
    cheapest = min(seconds)
    mean_size, mean_seconds = statistics.fmean(sizes), statistics.fmean(seconds)
    spread = sum((size - mean_size) ** 2 for size in sizes)
    if not spread:
        return cheapest
    slope = sum((size - mean_size) * (took - mean_seconds) for size, took in zip(sizes, seconds, strict=True)) / spread
    return min(max(mean_seconds - slope * mean_size, 0.0), cheapest)


def _alone(predict: Callable[[Any, Any], Any], member: _Input) -> None:
    if member.answered:
        member.error = Cancelled()
        return
    try:
        member.result = member.context.run(predict, member.data, member.model)
    except Exception as exc:
        member.error = exc


def _in_group_context(group: list[_Input], function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a new context where :func:`members` gives the group's requests' contexts."""

    def run() -> Any:
        _members.set(tuple(member.context for member in group))
        return function(*args)

    return contextvars.Context().run(run)


def _described(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def split(prediction: Any, rows: list[int]) -> list[Any]:
    """Cut a prediction for the concatenated inputs back into one per input, by each input's row count: an ndarray
    (or list) by its leading dimension, each value of a dict, each item of a tuple or list of arrays, a pandas
    DataFrame's rows, an Arrow table's rows. Anything whose leading dimension is not the total is a
    :class:`HookError` for the whole group."""
    total = sum(rows)
    pieces = list(itertools.pairwise(itertools.accumulate(rows, initial=0)))

    def check(length: int | None, what: str) -> None:
        if length != total:
            got = "no rows" if length is None else f"{length} rows"
            raise HookError(
                "predict_fn",
                ValueError(f"predict_fn returned {got} for a batch of {total} rows"),
                summary=f"predict_fn returned {what} of {got} for a batch of {total} rows from {len(rows)} requests; "
                "a batched predict_fn must return one row per input row (or set max_batch_size 1)",
            )

    if isinstance(prediction, np.ndarray):
        check(len(prediction) if prediction.ndim else None, "an array")
        return [prediction[start:end] for start, end in pieces]
    if isinstance(prediction, dict):
        for key, value in prediction.items():
            check(_length(value), f"{key!r}")
        return [{key: value[start:end] for key, value in prediction.items()} for start, end in pieces]
    if (
        isinstance(prediction, (tuple, list))
        and prediction
        and all(isinstance(value, np.ndarray) and _length(value) == total for value in prediction)
    ):  # several outputs, each with a row per input row
        return [type(prediction)(value[start:end] for value in prediction) for start, end in pieces]
    if isinstance(prediction, tuple):
        for number, value in enumerate(prediction):
            check(_length(value), f"item {number}")
    if isinstance(prediction, list):
        check(len(prediction), "a list")
        return [prediction[start:end] for start, end in pieces]
    if hasattr(prediction, "iloc"):  # pandas
        check(len(prediction), f"a {type(prediction).__name__}")
        return [prediction.iloc[start:end] for start, end in pieces]
    if hasattr(prediction, "num_rows") and hasattr(prediction, "slice"):  # Arrow
        check(prediction.num_rows, f"a {type(prediction).__name__}")
        return [prediction.slice(start, end - start) for start, end in pieces]
    check(None, f"a {type(prediction).__name__}")
    raise AssertionError  # check raised


def _rows(data: Any) -> int:
    """An input's rows as the micro-batcher joins them: an array's or a list's length; anything else is one."""
    if type(data) is list or (isinstance(data, np.ndarray) and data.ndim):
        return len(data)
    return 1


def _length(value: Any) -> int | None:
    if isinstance(value, np.ndarray):
        return len(value) if value.ndim else None
    return len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else None
