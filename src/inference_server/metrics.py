"""Prometheus metrics: recorded at one edge, kept cheaply in each process, one scrape over every worker.

What is measured, and where: the WSGI app records each request once its answer is handed to the server (route,
method, status, duration, body sizes, requests in flight); the pipeline times its three hooks; the micro-batcher
reports its groups and queue; the workers their model loads, and on a multi-model endpoint its models' unloads, cache
hits and what they hold; the serving process its workers' restarts. Nothing is counted inside a protocol's handlers.

**Cheap on the request path.** The Prometheus client's own ``inc()`` and ``observe()`` take about 3 us each in its
multiprocess mode (a lock and a write to a memory-mapped file); a request updates about ten values. So a request
only adds to plain counters in this process under one lock (about 1 us in all, see ``benchmarks/app_overhead.py``),
and :meth:`Recorder.flush` moves them into the Prometheus client's metrics, at most every :data:`FLUSH_INTERVAL`
seconds in a worker of ``serve`` and before every scrape.

**One scrape over every worker.** ``serve`` puts the Prometheus client's multiprocess files in its private run
directory (:func:`use_directory`, before the client is imported, so that a plugin's own metrics made with the
``prometheus_client`` API are shared the same way). Each worker writes its own files; ``GET /metrics`` on any worker
reads all of them: a scrape is at most :data:`FLUSH_INTERVAL` behind the other workers. A worker that dies or is
replaced keeps its counters and histograms (its files stay); its live gauges (requests in flight, queue depth,
model loaded) are removed by the serving process (:func:`process_dead`). Outside ``serve`` (the app in another WSGI
server) a process scrapes its own metrics and the default registry's, or every process's if the
``PROMETHEUS_MULTIPROC_DIR`` of the Prometheus client's multiprocess mode is set.

**The models of a multi-model endpoint, once per machine.** A model held by two workers is one loaded model, so
``models_loaded`` cannot be a sum of per-worker gauges. A scrape asks the worker's multi-model endpoint
(:meth:`Recorder.serves_models`), which reads what every live worker says it holds (the shared registry of
:mod:`inference_server._registry`): ``models_loaded`` counts each model once, and ``model_memory_bytes`` is what they
cost the machine, by kind: ``private`` (each worker's own memory, summed) and ``mapped`` (the models' files mapped,
each once). A worker that died leaves the scrape at once.

The ``prometheus_client`` module is imported on first use, never at import of this module.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import dataclasses
import functools
import itertools
import logging
import multiprocessing.util
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import prometheus_client

logger = logging.getLogger("inference_server")

#: The Prometheus client's variable naming the directory of its multiprocess files.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds between a worker's moves of its counts into the shared files (when it has counted anything).
FLUSH_INTERVAL = 0.1
PREFIX = "inference_server_"
#: The text exposition format ``GET /metrics`` answers in.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds, from 0.5 ms to 60 s.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds waited for the model, from 0.1 ms.
QUEUE_BUCKETS = (0.0001, 0.00025, *DURATION_BUCKETS[:-3])
#: Bytes, from 256 B to 1 GiB by fours.
BYTES_BUCKETS = tuple(float(256 << (2 * i)) for i in range(12))
#: Requests per predict_fn call.
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
#: Rows per predict_fn call, by fours.
ROWS_BUCKETS = tuple(float(1 << (2 * i)) for i in range(11))

#: Methods counted by name; anything else is counted as ``other``.
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"))
#: The route of a request that matched none.
OTHER = "other"
#: The scrape's own route: never counted in flight.
ROUTE = "/metrics"
#: An invocation's stages: waiting (from its arrival to ``input_fn``: its body, the model's load, a model slot), then
#: each hook.
STAGES = ("wait", "input", "predict", "output")
#: How an invocation ended, by status: ``success`` (below 400) or ``fail``.
OUTCOMES = ("success", "fail")
#: Label sets remembered by their raw values (past it, a new method or model name is bounded on each request).
MAX_KINDS = 10_000
#: Why a worker was replaced (``worker_restarts_total``).
RESTART_REASONS = ("crash", "max-requests", "stuck")
#: Why a worker of a multi-model endpoint unloaded a model (``model_unloads_total``): an unload asked for (``DELETE
#: /models/{name}``, through any worker), made room for another (least recently used), or a load that failed.
UNLOAD_REASONS = ("request", "evicted", "failed")
#: Seconds of a model load, or of an invocation's wait for one: from 1 ms to 10 min.
LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _Histogram:
    """Counts per bucket (the last is +Inf) and a sum, not cumulative: what the Prometheus client stores."""

    __slots__ = ("counts", "total")

    def __init__(self, counts: list[int], total: float) -> None:
        self.counts = counts
        self.total = total

    @classmethod
    def of(cls, bounds: Sequence[float], values: Sequence[float]) -> _Histogram:
        """The histogram of ``values`` (``le`` buckets: a value equal to a bound counts in that bound's bucket)."""
        counts = [0] * (len(bounds) + 1)
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
        return cls(counts, float(sum(values)))


def _histograms(
    bounds: Sequence[float], values: np.ndarray, groups: np.ndarray | None, names: list[str]
) -> dict[str, _Histogram]:
    """The histogram of ``values`` for each group (``groups[i]`` indexes ``names``; None: all in ``names[0]``)."""
    edges = np.asarray(bounds, dtype=np.float64)
    buckets = len(bounds) + 1
    index = np.searchsorted(edges, values, side="left")
    if groups is None:
        counts = np.bincount(index, minlength=buckets)[None, :]
        totals = [float(values.sum())]
    else:
        counts = np.bincount(groups * buckets + index, minlength=len(names) * buckets).reshape(len(names), buckets)
        totals = np.bincount(groups, weights=values, minlength=len(names)).tolist()
    return {name: _Histogram(counts[row].tolist(), totals[row]) for row, name in enumerate(names)}


def _taken(queue: collections.deque[Any]) -> list[Any]:
    """What ``queue`` holds now, taken out (what other threads add meanwhile stays for the next time)."""
    return list(itertools.starmap(queue.popleft, itertools.repeat((), len(queue))))


def _taken_rows(queue: collections.deque[tuple[float, ...]], width: int) -> np.ndarray:
    """What ``queue`` holds now, taken out, as an array of rows of ``width`` numbers."""
    rows = _taken(queue)
    numbers = struct.pack(f"{len(rows) * width}d", *itertools.chain.from_iterable(rows))  # (numpy's array() is slower)
    return np.frombuffer(numbers, dtype=np.float64).reshape(-1, width)


class Recorder:
    """This process's metrics: what a request adds is one tuple appended to a queue (no lock: ``deque.append`` is
    atomic), counted into the Prometheus client's metrics by :meth:`flush`, vectorised."""

    def __init__(self) -> None:
        arrivals: collections.deque[None] = collections.deque()
        batches: collections.deque[tuple[int, int, list[float]]] = collections.deque()
        self._queues = arrivals, batches
        # a request's numbers as one tuple of floats (not a container the garbage collector tracks once it has
        # seen it), made into an array by the flush: appending to an array.array parses every number on the way
        requests: collections.deque[tuple[float, ...]] = collections.deque()
        self._requests = requests
        self._stages: collections.deque[tuple[float, float, float, float, float, str]] = collections.deque()
        stages = self._stages
        #: A request matched a route and is in flight from now on (``arrived(None)``).
        self.arrived = arrivals.append
        #: A request ended: ``ended((kind, started, ended, received, sent))``, ``kind`` from :meth:`kind`, the
        #: times from ``time.perf_counter()``, the sizes the bodies' bytes.
        self.ended = requests.append
        #: One invocation that passed its hooks, as ``_pipeline.Timed``: ``timed((arrived, started, decoded,
        #: predicted, encoded, model))``: waiting from ``arrived`` to ``started``, ``input_fn`` to ``decoded``,
        #: ``predict_fn`` to ``predicted`` (with micro-batching, its wait for the group included), ``output_fn`` to
        #: ``encoded``.
        self.timed = stages.append
        #: The route patterns whose requests invoke a model (``inferences_total`` counts them).
        self.invocation_routes: set[str] = set()
        #: The number of each kind of request (route, method, status, model) seen (see :meth:`kind`), and the labels
        #: of each number.
        self.kinds: dict[tuple[str, str, int, str], int] = {}
        self._kind_labels: list[tuple[str, str, int, str]] = []
        #: One ``predict_fn`` call of the micro-batcher: ``batched((requests, rows, [seconds each request waited
        #: from its arrival in the queue to the call]))``.
        self.batched = batches.append
        self._in_flight = 0
        #: Distinct values of the ``model`` label at most (further models count as ``other``), and those seen.
        self.max_models = 100
        self._models: set[str] = set()
        self._families: _Families | None = None
        self._flush_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._pid = os.getpid()
        #: The batchers of this process, whose queues ``queue_depth`` sums.
        self.batchers: weakref.WeakSet[Any] = weakref.WeakSet()
        hits: collections.deque[None] = collections.deque()
        self._hits = hits
        #: An invocation of a multi-model endpoint found its model loaded in this worker: ``model_hit(None)``.
        self.model_hit = hits.append
        #: A multi-model endpoint's account of the machine's models (else None): how many are loaded, and the bytes
        #: of private and of mapped memory they cost.
        self._account: Callable[[], tuple[int, int, int]] | None = None
        #: The models this worker holds, by (kind, name), on a multi-model endpoint (else None).
        self._held: set[tuple[str, str]] | None = None  # (replaced whole, under the lock; read without it)
        #: Told the registry at each flush, to count into it what is counted elsewhere in this process (data
        #: capture's records).
        self.flushing: list[Callable[[prometheus_client.CollectorRegistry], None]] = []
        self._held_lock = threading.Lock()
        self._model_families: _ModelFamilies | None = None

    # -- rare events: straight into the Prometheus client -----------------------------------------------------
    def model_loaded(self, seconds: float | None) -> None:
        """This worker loaded its model in ``seconds`` (serving one model); None: it has the model that the serving
        process loaded before it started (counted there: :func:`model_preloaded`)."""
        families = self.families()
        if seconds is not None:
            families.model_loads.inc()
            families.model_load_seconds.observe(seconds)
        families.model_loaded.set(1)

    # -- a multi-model endpoint's models (hits are counted by the flush; the rest straight in) -------------------
    def serves_models(self, account: Callable[[], tuple[int, int, int]]) -> None:
        """This process serves a multi-model endpoint, whose ``account()`` says how many models the machine holds and
        what they cost it (bytes of private memory, bytes mapped): their metrics are exported, at zero until used."""
        self._account = account
        with self._held_lock:
            if self._held is None:
                self._held = set()

    def loaded(self, key: tuple[str, str], seconds: float) -> None:
        """This worker loaded the model ``key`` of a multi-model endpoint in ``seconds``."""
        families = self.families()
        families.model_loads.inc()
        families.model_load_seconds.observe(seconds)
        with self._held_lock:
            self._held = (self._held or set()) | {key}

    def load_failed(self, seconds: float) -> None:
        """This worker's load of a model failed after ``seconds`` (its ``model_fn`` raised)."""
        families = self.families()
        families.model_loads.inc()
        families.model_load_seconds.observe(seconds)
        self.model_families().unloads.labels("failed").inc()

    def unloaded(self, key: tuple[str, str], reason: str) -> None:
        """This worker unloaded the model ``key`` (``reason`` one of :data:`UNLOAD_REASONS`)."""
        self.model_families().unloads.labels(reason).inc()
        with self._held_lock:
            self._held = (self._held or set()) - {key}

    def missed(self, waited: float) -> None:
        """An invocation did not find its model loaded in this worker, and waited ``waited`` seconds for its load."""
        families = self.model_families()
        families.misses.inc()
        families.wait_seconds.observe(waited)

    def models(self) -> tuple[int, int, int] | None:
        """The machine's models (:meth:`serves_models`): how many, bytes private, bytes mapped; None unless this
        process serves a multi-model endpoint."""
        account = self._account
        return None if account is None else account()

    def model_families(self) -> _ModelFamilies:
        """The multi-model endpoint's metrics (made on first use)."""
        families = self._model_families
        if families is None:
            registry = self.families().registry
            with self._flush_lock:
                if self._model_families is None:
                    self._model_families = _ModelFamilies(registry)
                families = self._model_families
        return families

    # -- moving counts into the Prometheus client --------------------------------------------------------------
    def families(self) -> _Families:
        """The Prometheus client's metrics (made, and ``prometheus_client`` imported, on first use)."""
        families = self._families
        if families is None:
            with self._flush_lock:
                if self._families is None:
                    self._families = _Families()
                families = self._families
        return families

    def flush(self) -> None:
        """Count what this process recorded into the Prometheus client's metrics (its files, when shared)."""
        families = self.families()
        with self._flush_lock:
            arrivals, batches = (_taken(queue) for queue in self._queues)
            requests, stages = _taken_rows(self._requests, 5), _taken(self._stages)
            self._in_flight += len(arrivals)
            if stages:
                self._add_stages(families, stages)
            if batches:
                sizes, rows, waits = zip(*batches, strict=True)
                _add(families.batch_size, _Histogram.of(BATCH_BUCKETS, sizes))
                _add(families.batch_rows, _Histogram.of(ROWS_BUCKETS, rows))
                _add(families.queue_seconds, _Histogram.of(QUEUE_BUCKETS, [wait for group in waits for wait in group]))
            if len(requests):  # last: its totals say the rest of these requests' metrics are written
                self._in_flight -= self._add_requests(families, requests)
            families.requests_in_flight.set(self._in_flight)
            families.queue_depth.set(sum(batcher.waiting for batcher in list(self.batchers)))
            hits = len(_taken(self._hits))
        if hits or self._held is not None:  # (a multi-model endpoint's metrics exist from its first flush)
            self.model_families().hits.inc(hits)
        for report in self.flushing:
            report(families.registry)

    def _add_stages(self, families: _Families, stages: list[tuple[float, float, float, float, float, str]]) -> None:
        """Count ``stages`` (rows of :attr:`timed`) into ``stage_duration_seconds``, by model and stage."""
        spent = np.diff(np.array([row[:5] for row in stages]), axis=1)
        names = [row[5] for row in stages]
        by_name = {name: self._model_label(name) for name in set(names)}
        labels = sorted(set(by_name.values()))
        groups = None
        if len(labels) > 1:
            number = {label: index for index, label in enumerate(labels)}
            groups = np.fromiter((number[by_name[name]] for name in names), np.intp, len(names))
        for column, stage in enumerate(STAGES):
            for model, histogram in _histograms(DURATION_BUCKETS, spent[:, column], groups, labels).items():
                _add(families.stage_duration.labels(model, stage), histogram)

    def kind(self, route: str, method: str, status: int, model: str) -> int:
        """The number :attr:`ended` takes for a request with these labels (``model``: the name a multi-model endpoint
        invoked, "" otherwise); methods and models are bounded here (``other``), so their numbers are too."""
        number = self.kinds.get((route, method, status, model))
        if number is None:
            return self._new_kind(route, method, status, model)
        return number

    def _new_kind(self, route: str, method: str, status: int, model: str) -> int:
        with self._flush_lock:
            bounded = (route, method if method in METHODS else OTHER, status, self._model_label(model))
            number = self.kinds.get(bounded)
            if number is None:
                self._kind_labels.append(bounded)
                number = self.kinds[bounded] = len(self._kind_labels) - 1
            if len(self.kinds) < MAX_KINDS:  # else unknown methods and model names are bounded again each time
                self.kinds[(route, method, status, model)] = number
            return number

    def _model_label(self, model: str) -> str:
        """``model`` as the label says it: bounded to :attr:`max_models` distinct names in this process, and only for
        a model this worker holds (a name invoked but absent, refused or unloaded, which any client may send, gets
        no label of its own: it would take the place of a real model)."""
        if not model or model in self._models:
            return model
        held = self._held
        if held is not None and not any(name == model for _, name in list(held)):
            return ""
        if len(self._models) < self.max_models:
            self._models.add(model)
            return model
        return OTHER

    def _add_requests(self, families: _Families, requests: np.ndarray) -> int:
        """Count ``requests`` (rows of :attr:`ended`); returns how many were in flight: those that matched a route
        (:attr:`arrived`), scrapes excepted."""
        kinds = requests[:, 0].astype(np.intp)
        seconds = requests[:, 2] - requests[:, 1]
        labels = self._kind_labels
        counts = np.bincount(kinds, minlength=len(labels)).tolist()
        present = [number for number, count in enumerate(counts) if count]
        routes: dict[str, int] = {}
        models: dict[tuple[str, str], int] = {}
        route_of = np.zeros(len(labels), dtype=np.intp)
        model_of = np.full(len(labels), -1, dtype=np.intp)
        for number in present:
            route, _, _, model = labels[number]
            route_of[number] = routes.setdefault(route, len(routes))
            if model:
                model_of[number] = models.setdefault((route, model), len(models))
        groups = route_of[kinds] if len(routes) > 1 else None
        route_labels = list(routes)
        for family, bounds, values in (
            (families.request_duration, DURATION_BUCKETS, seconds),
            (families.request_body, BYTES_BUCKETS, requests[:, 3]),
            (families.response_body, BYTES_BUCKETS, requests[:, 4]),
        ):
            for label, histogram in _histograms(bounds, values, groups, route_labels).items():
                _add(family.labels(label), histogram)
        if models:
            by_model = model_of[kinds]
            invoked = by_model >= 0
            keys = list(models)
            for index, histogram in enumerate(
                _histograms(
                    DURATION_BUCKETS, seconds[invoked], by_model[invoked], [str(i) for i in range(len(keys))]
                ).values()
            ):
                _add(families.model_duration.labels(*keys[index]), histogram)
        if self.invocation_routes:
            self._add_inferences(families, requests, kinds, seconds, present)
        # the totals last: a scrape that sees a request counted sees its histograms too (within one worker)
        in_flight = 0
        for number in present:
            route, method, status, model = labels[number]
            count = counts[number]
            families.requests_total.labels(route, method, str(status)).inc(count)
            if model:
                families.model_requests_total.labels(route, model, str(status)).inc(count)
            if route not in (ROUTE, OTHER):
                in_flight += count
        return in_flight

    def _add_inferences(
        self, families: _Families, requests: np.ndarray, kinds: np.ndarray, seconds: np.ndarray, present: list[int]
    ) -> None:
        """Count the invocations among ``requests`` into ``inferences_total`` and ``inference_seconds_total`` by
        model and outcome, and the last success of each model into ``last_inference_timestamp_seconds``."""
        labels = self._kind_labels
        groups: dict[tuple[str, str], int] = {}
        group_of = np.full(len(labels), -1, dtype=np.intp)
        for number in present:
            route, _, status, model = labels[number]
            if route in self.invocation_routes and status != 404:  # (a 404 never reached a model)
                group_of[number] = groups.setdefault((model, OUTCOMES[status >= 400]), len(groups))
        if not groups:
            return
        by_group = group_of[kinds]
        invoked = by_group >= 0
        counts = np.bincount(by_group[invoked], minlength=len(groups)).tolist()
        totals = np.bincount(by_group[invoked], weights=seconds[invoked], minlength=len(groups)).tolist()
        ends = requests[invoked, 2]
        to_wall = time.time() - time.perf_counter()
        for (model, outcome), index in groups.items():
            families.inferences.labels(model, outcome).inc(counts[index])
            families.inference_seconds.labels(model, outcome).inc(totals[index])
            if outcome == "success":
                last = float(ends[by_group[invoked] == index].max())
                families.last_inference.labels(model).set(to_wall + last)

    def start_flushing(self) -> None:
        """In a worker of ``serve``: flush every :data:`FLUSH_INTERVAL` seconds, and at exit."""
        if self._flusher is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._flusher = threading.Thread(target=self._flush_regularly, name="metrics-flush", daemon=True)
        self._flusher.start()
        atexit.register(self.flush)
        # a forked multiprocessing child (granian's workers) leaves through os._exit, after running these only
        multiprocessing.util.Finalize(self, self.flush, exitpriority=100)

    def _flush_regularly(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            try:
                self.flush()
            except Exception:  # a full disk, a removed run directory: the next flush tries again
                logger.debug("Metrics: flush failed", exc_info=True)


class _Families:
    """Our metrics as the Prometheus client's objects, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry(auto_describe=True)

        def histogram(name: str, help: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, help, labels, buckets=buckets, registry=registry)

        self.requests_total = Counter(
            PREFIX + "requests_total",
            "Requests answered, by route pattern (other: no route matched), method and status",
            ("route", "method", "status"),
            registry=registry,
        )
        self.model_requests_total = Counter(
            PREFIX + "model_requests_total",
            "Requests that invoked a model of a multi-model endpoint, by route pattern, model (at most "
            "--metrics-max-models names per worker, then other) and status",
            ("route", "model", "status"),
            registry=registry,
        )
        self.model_duration = histogram(
            "model_request_duration_seconds",
            "Seconds of the requests that invoked a model of a multi-model endpoint, by route pattern and model",
            ("route", "model"),
            DURATION_BUCKETS,
        )
        self.request_duration = histogram(
            "request_duration_seconds",
            "Seconds from a request's arrival in the app to the end of its answer, by route pattern",
            ("route",),
            DURATION_BUCKETS,
        )
        self.request_body = histogram(
            "request_body_bytes", "Bytes of request bodies read, by route pattern", ("route",), BYTES_BUCKETS
        )
        self.response_body = histogram(
            "response_body_bytes", "Bytes of response bodies, by route pattern", ("route",), BYTES_BUCKETS
        )
        self.stage_duration = histogram(
            "stage_duration_seconds",
            "Seconds in each stage of the invocations that passed their three hooks, by model (a model of a "
            "multi-model endpoint; empty for the server's one model) and stage: wait (from the request's arrival to "
            "input_fn: its body, the model's load, a model slot), input (input_fn), predict (predict_fn; with "
            "micro-batching, the wait for its group included), output (output_fn)",
            ("model", "stage"),
            DURATION_BUCKETS,
        )
        self.inferences = Counter(
            PREFIX + "inferences_total",
            "Requests that invoked a model (any protocol; a 404, no such model, is not counted), by model (a model of "
            "a multi-model endpoint; empty for the server's one model) and outcome: success (a status below 400) or "
            "fail",
            ("model", "outcome"),
            registry=registry,
        )
        self.inference_seconds = Counter(
            PREFIX + "inference_seconds_total",
            "Seconds of the requests counted by inferences_total (arrival in the app to the end of the answer), by "
            "model and outcome",
            ("model", "outcome"),
            registry=registry,
        )
        self.last_inference = Gauge(
            PREFIX + "last_inference_timestamp_seconds",
            "When each model last answered an invocation with success (Unix time), by model",
            ("model",),
            registry=registry,
            multiprocess_mode="max",
        )
        self.batch_size = histogram(
            "batch_size", "Requests per predict_fn call of the micro-batcher", (), BATCH_BUCKETS
        )
        self.batch_rows = histogram("batch_rows", "Rows per predict_fn call of the micro-batcher", (), ROWS_BUCKETS)
        self.queue_seconds = histogram(
            "queue_seconds",
            "Seconds a micro-batched request waited from its arrival in the queue to its predict_fn call",
            (),
            QUEUE_BUCKETS,
        )
        self.requests_in_flight = Gauge(
            PREFIX + "requests_in_flight",
            "Requests being handled, over all workers (GET /metrics itself not counted)",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.queue_depth = Gauge(
            PREFIX + "queue_depth",
            "Requests waiting for the model in the micro-batchers' queues, over all workers",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.model_loads, self.model_load_seconds = load_metrics(registry)
        self.model_loaded = Gauge(
            PREFIX + "model_loaded",
            "Workers whose model is loaded",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.worker_restarts = restarts_counter(registry)  # counted by the serving process; zeros here
        for stage in STAGES:
            self.stage_duration.labels("", stage)


class _ModelFamilies:
    """A multi-model endpoint's metrics, in the registry of :class:`_Families` (``models_loaded`` and
    ``model_memory_bytes`` are read from every worker's held models at each scrape: :class:`_HeldModels`)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.unloads = Counter(
            PREFIX + "model_unloads_total",
            "Models unloaded by the workers of a multi-model endpoint, by reason: request (DELETE /models/{name}), "
            "evicted (the least recently used TargetModel, to make room), failed (a load that failed: model_fn "
            "raised, or the model did not fit)",
            ("reason",),
            registry=registry,
        )
        for reason in UNLOAD_REASONS:
            self.unloads.labels(reason)
        self.hits = Counter(
            PREFIX + "model_cache_hits_total",
            "Invocations of a multi-model endpoint that found their model loaded in the worker that served them",
            registry=registry,
        )
        self.misses = Counter(
            PREFIX + "model_cache_misses_total",
            "Invocations of a multi-model endpoint whose model was not loaded in the worker that served them",
            registry=registry,
        )
        self.wait_seconds = Histogram(
            PREFIX + "model_wait_seconds",
            "Seconds an invocation of a multi-model endpoint waited for its model to load (cache misses)",
            buckets=LOAD_BUCKETS,
            registry=registry,
        )


class _HeldModels:
    """A collector of the models the live workers hold: ``models_loaded`` (each model once, however many workers
    hold it) and ``model_memory_bytes`` (what they cost the machine, by kind); nothing on a single-model endpoint."""

    def collect(self) -> Iterator[prometheus_client.Metric]:
        from prometheus_client.core import GaugeMetricFamily

        found = recorder.models()
        if found is None:
            return
        count, private, mapped = found
        yield GaugeMetricFamily(
            PREFIX + "models_loaded",
            "Models loaded on this machine (a multi-model endpoint), each counted once however many workers hold it",
            value=count,
        )
        memory = GaugeMetricFamily(
            PREFIX + "model_memory_bytes",
            "Bytes of memory the loaded models cost the machine, by kind: private (what their loads made resident in "
            "each worker, summed over the workers) and mapped (their files mapped into memory, each file once)",
            labels=("kind",),
        )
        memory.add_metric(("private",), private)
        memory.add_metric(("mapped",), mapped)
        yield memory


def _add(child: prometheus_client.Histogram, histogram: _Histogram) -> None:
    """Add ``histogram``'s counts to the Prometheus client's histogram ``child`` at once (its ``observe`` adds one
    value; its bucket values are the per-bucket counts it keeps, not cumulative ones)."""
    counts = histogram.counts
    if not any(counts):
        return
    buckets = child._buckets  # private, checked by tests/test_metrics.py against observe()
    for index, count in enumerate(counts):
        if count:
            buckets[index].inc(count)
    child._sum.inc(histogram.total)


#: This process's recorder.
recorder = Recorder()
#: Collectors of what is counted elsewhere than in the workers' files (the asynchronous requests' queue), added to
#: every scrape.
collectors: list[Any] = []


def use_directory(run_dir: Path) -> None:
    """Share every process's metrics through files in ``run_dir/metrics`` (the serving process, at start-up).

    Must come before the ``prometheus_client`` module is imported, by us or by a plugin (it chooses its multiprocess
    mode at import); if it was imported already, its choice is changed for the metrics made from now on.
    """
    path = run_dir / "metrics"
    path.mkdir(exist_ok=True)
    os.environ[MULTIPROCESS_ENV] = str(path)
    values: Any = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


def shared_directory() -> str | None:
    """The directory of the Prometheus client's multiprocess files this process writes, if any."""
    path = os.environ.get(MULTIPROCESS_ENV)
    return path if path and os.path.isdir(path) else None


def scrape() -> bytes:
    """Every process's metrics (this one's flushed first) in the Prometheus text format."""
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    recorder.flush()
    held = CollectorRegistry()
    held.register(_HeldModels())
    for collector in collectors:
        held.register(collector)
    path = shared_directory()
    if path is not None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
        return generate_latest(registry) + generate_latest(held)
    return generate_latest(recorder.families().registry) + generate_latest(held) + generate_latest(REGISTRY)


#: What :func:`statistics` reads, by sample name: the part of a model's statistics each adds to.
_STATISTICS = {
    PREFIX + "inferences_total": "count",
    PREFIX + "inference_seconds_total": "seconds",
    PREFIX + "stage_duration_seconds_count": "count",
    PREFIX + "stage_duration_seconds_sum": "seconds",
}


@dataclasses.dataclass
class Statistics:
    """One model's invocations, summed over the workers: for each outcome (:data:`OUTCOMES`) and stage
    (:data:`STAGES`), how many and their seconds in all; and when it last answered with success (Unix time, 0 if
    never). The server's one model (``""``) has the micro-batcher's ``predict_fn`` calls too, of every model."""

    parts: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {part: [0.0, 0.0] for part in (*OUTCOMES, *STAGES)}
    )
    last_inference: float = 0.0
    batches: float = 0.0


def statistics() -> dict[str, Statistics]:
    """Every model's :class:`Statistics` from the metrics (this process's flushed first), by the ``model`` label
    ("" for the server's one model): what Triton's statistics extension reports."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    recorder.flush()
    path = shared_directory()
    registry = recorder.families().registry
    if path is not None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
    found: dict[str, Statistics] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == PREFIX + "batch_size_count":
                found.setdefault("", Statistics()).batches += sample.value
            model = sample.labels.get("model")
            if model is None:
                continue
            if sample.name == PREFIX + "last_inference_timestamp_seconds":
                stats = found.setdefault(model, Statistics())
                stats.last_inference = max(stats.last_inference, sample.value)
                continue
            field = _STATISTICS.get(sample.name)
            if field is not None:
                part = sample.labels.get("outcome") or sample.labels["stage"]
                found.setdefault(model, Statistics()).parts[part][field == "seconds"] += sample.value
    return found


def load_metrics(
    registry: prometheus_client.CollectorRegistry,
) -> tuple[prometheus_client.Counter, prometheus_client.Histogram]:
    """``model_loads_total`` and ``model_load_seconds`` in ``registry``."""
    from prometheus_client import Counter, Histogram

    loads = Counter(
        PREFIX + "model_loads_total",
        "Model loads begun (model_fn calls), over all workers and the serving process (--preload); a load that "
        "failed is also counted in model_unloads_total{reason=failed} on a multi-model endpoint",
        registry=registry,
    )
    seconds = Histogram(
        PREFIX + "model_load_seconds",
        "Seconds each model load took (model_fn), over all workers and the serving process (--preload)",
        buckets=LOAD_BUCKETS,
        registry=registry,
    )
    return loads, seconds


@functools.cache
def _serving_loads() -> tuple[prometheus_client.Counter, prometheus_client.Histogram]:
    """The serving process's own ``model_loads_total`` and ``model_load_seconds`` (``--preload``)."""
    from prometheus_client import CollectorRegistry

    return load_metrics(CollectorRegistry())


def model_preloaded(seconds: float) -> None:
    """The serving process loaded the model its workers share (``--preload``), in ``seconds``."""
    loads, load_seconds = _serving_loads()
    loads.inc()
    load_seconds.observe(seconds)


#: ``data_capture_records_total`` by the registry it counts into (made once in each: an app made before the workers
#: forked leaves its reporter in theirs, beside their own app's).
_capture_counters: dict[int, prometheus_client.Counter] = {}


def capture_reporter(counts: Callable[[], dict[str, int]]) -> Callable[[prometheus_client.CollectorRegistry], None]:
    """What :attr:`Recorder.flushing` is given for data capture: ``counts()``'s growth since the last flush counted
    into ``data_capture_records_total`` by outcome (captured, dropped, written)."""
    last: dict[str, int] = {}

    def report(registry: prometheus_client.CollectorRegistry) -> None:
        from prometheus_client import Counter

        counter = _capture_counters.get(id(registry))
        if counter is None:
            counter = _capture_counters[id(registry)] = Counter(
                PREFIX + "data_capture_records_total",
                "Records of invocations for data capture (--data-capture), by outcome: captured (buffered), dropped "
                "(its buffer full, or its destination failing past it), written",
                ("outcome",),
                registry=registry,
            )
        for outcome, count in counts().items():
            grown = count - last.get(outcome, 0)
            child = counter.labels(outcome)
            if grown:
                child.inc(grown)
            last[outcome] = count

    return report


def restarts_counter(registry: prometheus_client.CollectorRegistry) -> prometheus_client.Counter:
    """``worker_restarts_total`` in ``registry``, with each reason at zero."""
    from prometheus_client import Counter

    counter = Counter(
        PREFIX + "worker_restarts_total",
        "Workers replaced, by reason: crash (it died), max-requests (--max-requests), stuck (work past its --timeout)",
        ("reason",),
        registry=registry,
    )
    for reason in RESTART_REASONS:
        counter.labels(reason)
    return counter


@functools.cache
def _serving_restarts() -> prometheus_client.Counter:
    """The serving process's own ``worker_restarts_total``: its only metric (no gauges of a worker of its own)."""
    from prometheus_client import CollectorRegistry

    return restarts_counter(CollectorRegistry())


def worker_restarted(reason: str) -> None:
    """The serving process replaced a worker (``reason`` one of :data:`RESTART_REASONS`)."""
    _serving_restarts().labels(reason).inc()


def process_dead(pid: int) -> None:
    """Worker ``pid`` is gone: its live gauges and the models it held leave the scrape (its counters and histograms
    stay)."""
    path = shared_directory()
    if path is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
