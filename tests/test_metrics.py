"""Prometheus metrics: what each request, hook, group and worker adds, one scrape over every worker of a real server,
bounded labels, a scrape while the model is busy, a plugin's own metrics, and nothing when turned off."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference_server import _plugins, metrics, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App
from tests.conftest import wait_until

SLOW = """
    import time

    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if data == {"sleep": True}:
            time.sleep(2)
        if data == {"fail": True}:
            raise RuntimeError("the model failed")
        return data
"""

OWN_METRICS = """
    import inference_server
    from prometheus_client import Counter

    PREDICTIONS = Counter("my_model_predictions_total", "Predictions made by my model")

    @inference_server.plugin_hook
    def predict_fn(data, model):
        PREDICTIONS.inc()
        return data
"""

MULTI_MODEL = """
    import os
    import time

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        if os.path.exists(os.path.join(model_dir, "sleep")):
            time.sleep(float(open(os.path.join(model_dir, "sleep")).read()))
        size = int(open(os.path.join(model_dir, "size_mb")).read())  # a directory without it fails to load
        return {"name": os.path.basename(model_dir.rstrip("/")), "weights": np.ones(size << 17)}

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if isinstance(data, dict):
            time.sleep(data["sleep"])
        return {"model": model["name"], "pid": os.getpid()}
"""

JSON = {"Content-Type": "application/json"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape's samples by name and sorted labels (parsed by the Prometheus client's own parser)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, keys), value in scraped.items() if sample == name and wanted <= set(keys))


def call(app: App, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> int:
    """Send one request through the WSGI app and close its body, as a server does; returns the status."""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()},
    }
    if headers and "Content-Type" in headers:
        environ["CONTENT_TYPE"] = headers["Content-Type"]
    statuses = []
    reply = app(environ, lambda status, headers, exc_info=None: statuses.append(status))
    b"".join(bytes(chunk) for chunk in reply)
    getattr(reply, "close", lambda: None)()
    return int(statuses[0].split()[0])


def scrape(app: App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "SERVER_PROTOCOL": "HTTP/1.1"}
    reply = app(environ, lambda status, headers, exc_info=None: None)
    text = b"".join(bytes(chunk) for chunk in reply).decode()
    getattr(reply, "close", lambda: None)()
    return samples(text)


class Echo:
    """Echoes its input; raises on {"fail": true}."""

    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        if data == {"fail": True}:
            raise RuntimeError("the model failed")
        return data


@pytest.fixture
def app(only_plugin: Callable[[Any], Any]) -> App:
    """An app in this process whose model echoes JSON and raises on {"fail": true}."""
    only_plugin(Echo())
    return App(Settings.from_env(), _plugins.manager())


def test_a_histogram_added_at_once_equals_the_same_values_observed_one_by_one() -> None:
    """The flush's bulk add into the Prometheus client's histogram (its private per-bucket values) gives what
    ``observe`` gives: the check that guards our use of its internals."""
    values = [0.0001, 0.0005, 0.003, 0.003, 0.2, 7.0, 100.0]
    by_one, at_once = CollectorRegistry(), CollectorRegistry()
    one = Histogram("h", "help", buckets=metrics.DURATION_BUCKETS, registry=by_one)
    for value in values:
        one.observe(value)
    ours = metrics._Histogram.of(metrics.DURATION_BUCKETS, values)
    metrics._add(Histogram("h", "help", buckets=metrics.DURATION_BUCKETS, registry=at_once), ours)
    grouped = metrics._histograms(metrics.DURATION_BUCKETS, np.array(values), np.zeros(len(values), np.intp), ["h"])
    assert grouped["h"].counts == ours.counts
    created = "h_created"  # when each histogram was made: the one difference

    def read(registry: CollectorRegistry) -> dict[Any, float]:
        return {key: value for key, value in samples(generate_latest(registry).decode()).items() if key[0] != created}

    assert read(at_once) == read(by_one)


def test_requests_are_counted_by_route_pattern_method_and_status(app: App) -> None:
    """Each request adds one to requests_total under its route's pattern, method and status, and one observation
    to its duration and body-size histograms; requests in flight go back to zero."""
    before = scrape(app)
    assert call(app, "POST", "/invocations", b'{"a": 1}', JSON) == 200
    assert call(app, "POST", "/invocations", b"{not json", JSON) == 400
    assert call(app, "POST", "/invocations", b'{"fail": true}', JSON) == 500
    assert call(app, "GET", "/ping") == 200
    assert call(app, "POST", "/endpoints/my-endpoint/invocations", b'{"a": 1}', JSON) == 200
    assert call(app, "DELETE", "/ping") == 405
    after = scrape(app)

    def added(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    for status in ("200", "400", "500"):
        assert added("inference_server_requests_total", route="/invocations", method="POST", status=status) == 1
    assert added("inference_server_requests_total", route="/endpoints/{name}/invocations", status="200") == 1
    assert added("inference_server_requests_total", route="/ping", method="DELETE", status="405") == 1
    assert added("inference_server_request_duration_seconds_count", route="/invocations") == 3
    assert added("inference_server_request_body_bytes_sum", route="/invocations") == 8 + 9 + 14
    assert added("inference_server_response_body_bytes_count", route="/invocations") == 3
    assert added("inference_server_stage_duration_seconds_count", stage="predict") == 2  # the 500 failed in it
    assert added("inference_server_requests_in_flight") == 0


def test_unknown_paths_count_as_route_other_and_cannot_grow_the_labels(app: App) -> None:
    """1,000 random paths are all counted under route "other": the label set stays as it was."""
    call(app, "GET", "/warm-up-the-other-route")
    before = scrape(app)
    for _ in range(1000):
        call(app, random.choice(["GET", "POST", "BREW"]), f"/{random.getrandbits(64):x}/{random.getrandbits(32):x}")
    after = scrape(app)
    assert (
        total(after, "inference_server_requests_total", route="other")
        - total(before, "inference_server_requests_total", route="other")
        == 1000
    )
    grown = {
        labels
        for (name, labels), value in after.items()
        if name == "inference_server_requests_total" and value != before.get((name, labels))
    }  # (this process's recorder counted other tests' apps too)
    assert {dict(labels)["route"] for labels in grown} <= {"other", "/metrics"}
    assert {dict(labels)["method"] for labels in grown} <= metrics.METHODS | {"other"}


def test_in_flight_counts_a_request_while_the_app_handles_it(only_plugin: Callable[[Any], Any]) -> None:
    """A request is in flight from its arrival until its answer is handed to the server; a scrape is not."""
    entered, release = threading.Event(), threading.Event()

    class Waiting:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            entered.set()
            release.wait(5)
            return data

    only_plugin(Waiting())
    app = App(Settings.from_env(timeout=0), _plugins.manager())
    before = total(scrape(app), "inference_server_requests_in_flight")  # this process's other tests' leftovers
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(call, app, "POST", "/invocations", b"[]", JSON)
        assert entered.wait(5)
        assert total(scrape(app), "inference_server_requests_in_flight") == before + 1
        release.set()
        assert answer.result() == 200
    assert total(scrape(app), "inference_server_requests_in_flight") == before


def test_no_metrics_means_no_route_and_nothing_counted(only_plugin: Callable[[Any], Any]) -> None:
    """--no-metrics: /metrics is 404 and requests add nothing to this process's metrics."""
    only_plugin(Echo())
    app = App(Settings.from_env(metrics=False), _plugins.manager())
    metrics.recorder.flush()
    before = generate_latest(metrics.recorder.families().registry)
    assert call(app, "GET", "/metrics") == 404
    assert call(app, "POST", "/invocations", b"[1]", JSON) == 200
    metrics.recorder.flush()
    assert generate_latest(metrics.recorder.families().registry) == before


def test_micro_batched_groups_are_counted_with_their_rows_and_waits(only_plugin: Callable[[Any], Any]) -> None:
    """With micro-batching, batch_size counts requests per predict_fn call, batch_rows their rows, queue_seconds
    each request's wait: as many waits as requests."""
    gate = threading.Event()

    class Model:
        calls = 0

        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            Model.calls += 1
            gate.wait(5)
            return data

    only_plugin(Model())
    app = App(Settings.from_env(max_batch_size=8, max_batch_delay=50, timeout=0), _plugins.manager())
    before = scrape(app)
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(call, app, "POST", "/invocations", b"[[1, 2], [3, 4]]", JSON) for _ in range(12)]
        batcher = app.target.batcher
        assert batcher is not None
        # the first group holds the model (at most 8): the others queue behind it, to share the next calls
        wait_until(lambda: Model.calls == 1 and batcher.waiting >= 4, 10, "the requests did not queue")
        gate.set()
        assert [future.result() for future in futures] == [200] * 12
    after = scrape(app)

    def added(name: str) -> float:
        return total(after, name) - total(before, name)

    assert added("inference_server_batch_size_count") == Model.calls
    assert added("inference_server_batch_size_sum") == 12
    assert added("inference_server_batch_rows_sum") == 24
    assert added("inference_server_queue_seconds_count") == 12
    assert Model.calls < 12  # some requests shared a call


def test_a_scrape_of_a_real_server_covers_every_worker_and_keeps_a_replaced_workers_counts(
    servers: Any, plugin_site: Any
) -> None:
    """Two granian workers, each replaced after 7 requests: after 40 invocations (200, 400, 500) and one unknown
    path, one scrape shows exactly those requests, histogram counts equal to them, nothing in flight, the
    replacements counted as max-requests, and one model load (the serving process's, which every worker shares)."""
    plugin_site.add("slow", SLOW)
    server = servers.start("--workers", "2", "--max-requests", "7")
    expected = {"200": 0, "400": 0, "500": 0}
    for index in range(40):
        kind = index % 4
        body = [b"[1, 2]", b"{oops", b'{"fail": true}', b"[4]"][kind]
        reply = server.request("POST", "/invocations", body, JSON)
        expected[str(reply.status)] += 1
    assert server.request("GET", "/no/such/path").status == 404
    assert expected == {"200": 20, "400": 10, "500": 10}

    def invocations(scraped: dict[Any, float]) -> float:
        return total(scraped, "inference_server_requests_total", route="/invocations")

    deadline = time.monotonic() + 10
    scraped = samples(server.request("GET", "/metrics").body.decode())
    while (
        invocations(scraped) < 40
        or total(scraped, "inference_server_request_duration_seconds_count", route="/invocations") < 40
        or total(scraped, "inference_server_requests_total", route="other") < 1
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
        scraped = samples(server.request("GET", "/metrics").body.decode())
    for status, count in expected.items():
        assert total(scraped, "inference_server_requests_total", route="/invocations", status=status) == count
    assert invocations(scraped) == 40
    assert total(scraped, "inference_server_requests_total", route="other", status="404") == 1
    assert total(scraped, "inference_server_request_duration_seconds_count", route="/invocations") == 40
    assert total(scraped, "inference_server_requests_in_flight") == 0
    deadline = time.monotonic() + 30  # a replaced worker is counted once its successor serves and it has stopped
    while total(scraped, "inference_server_worker_restarts_total", reason="max-requests") < 1:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.2)
        scraped = samples(server.request("GET", "/metrics").body.decode())
    assert invocations(scraped) == 40  # (a scrape is not an invocation)

    def live_gauges_are_the_live_workers() -> bool:  # (each scrape is a request too: workers go on being replaced)
        live = len(server.workers())
        scraped = samples(server.request("GET", "/metrics").body.decode())
        loads = total(scraped, "inference_server_model_load_seconds_count")
        loaded = total(scraped, "inference_server_model_loaded") == live == len(server.workers())
        return loaded and loads == 1  # (the serving process's load: the replacements share it)

    deadline = time.monotonic() + 30
    while not live_gauges_are_the_live_workers():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.3)


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_metrics_answers_while_the_model_is_busy_and_counts_a_crashed_worker(
    backend: str, servers: Any, plugin_site: Any
) -> None:
    """/metrics answers while predict_fn sleeps (before it ends), showing it in flight; a worker killed with
    SIGKILL is counted as a crash, and the requests it answered before stay counted."""
    plugin_site.add("slow", SLOW)
    server = servers.start("--server", backend, "--workers", "2")
    for _ in range(6):
        assert server.request("POST", "/invocations", b"[1]", JSON).status == 200
    in_flight = functools.partial(server.metric, "inference_server_requests_in_flight")
    wait_until(lambda: in_flight() == 0, 10, "the answered requests still count in flight")  # (flushed)
    with ThreadPoolExecutor(1) as pool:
        sleeping = pool.submit(server.request, "POST", "/invocations", b'{"sleep": true}', JSON)
        wait_until(lambda: in_flight() == 1, 10, "the sleeping request was not shown in flight")
        reply = server.request("GET", "/metrics", timeout=5)
        assert not sleeping.done(), "/metrics answered only once the prediction had ended"
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert sleeping.result().status == 200
    wait_until(  # the workers' counts reach the shared files within metrics.FLUSH_INTERVAL
        lambda: server.metric("inference_server_requests_total", route="/invocations") == 7, 10, "7 invocations"
    )
    victim = min(server.workers())
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while victim in server.workers() or len(server.workers()) < 2:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.1)
    scraped = samples(server.request("GET", "/metrics").body.decode())
    while total(scraped, "inference_server_worker_restarts_total", reason="crash") < 1:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.2)
        scraped = samples(server.request("GET", "/metrics").body.decode())
    assert total(scraped, "inference_server_worker_restarts_total", reason="crash") == 1
    assert total(scraped, "inference_server_requests_total", route="/invocations", status="200") == 7


def test_a_plugins_own_prometheus_metrics_are_exported_summed_over_workers(servers: Any, plugin_site: Any) -> None:
    """A plugin's Counter made with the prometheus_client API at import shows in /metrics, over both workers."""
    plugin_site.add("own_metrics", OWN_METRICS, requires=["prometheus-client"])
    server = servers.start("--workers", "2")
    for _ in range(10):
        assert server.request("POST", "/invocations", b"[1]", JSON).status == 200
    deadline = time.monotonic() + 5
    while True:
        scraped = samples(server.request("GET", "/metrics").body.decode())
        if total(scraped, "my_model_predictions_total") == 10 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert total(scraped, "my_model_predictions_total") == 10


def test_no_metrics_on_a_real_server(servers: Any) -> None:
    """serve --no-metrics: /metrics is 404 and no metrics directory is made."""
    server = servers.start("--no-metrics", plugins=[])
    assert server.request("GET", "/metrics").status == 404


def test_requests_recorded_by_many_threads_while_flushing_are_each_counted_once() -> None:
    """Four threads recording 5,000 requests each while another thread flushes without pause: every request is
    counted once, in its own labels, with its duration and sizes (the values are kept as C doubles and taken out
    while they are being added)."""
    recorder = metrics.Recorder()
    recorder.max_models = 2
    recorder.invocation_routes.add("/models/{name}/invoke")
    done = threading.Event()

    def flushing() -> None:
        while not done.is_set():
            recorder.flush()

    def recording(status: int) -> None:
        for index in range(5000):
            model = f"model-{index % 3}"
            kind = recorder.kind("/models/{name}/invoke", "POST", status, model)
            recorder.ended((kind, 1.0, 1.002, 300.0, 70000.0))
            recorder.timed((0.999, 1.0, 1.001, 1.003, 1.006, model))

    flusher = threading.Thread(target=flushing)
    flusher.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(recording, [200, 200, 404, 500]))
    done.set()
    flusher.join()
    recorder.flush()
    scraped = samples(generate_latest(recorder.families().registry).decode())
    route = "/models/{name}/invoke"
    for status, count in (("200", 10000), ("404", 5000), ("500", 5000)):
        assert total(scraped, "inference_server_requests_total", route=route, status=status) == count
    assert total(scraped, "inference_server_request_duration_seconds_bucket", route=route, le="0.001") == 0
    assert total(scraped, "inference_server_request_duration_seconds_bucket", route=route, le="0.0025") == 20000
    assert total(scraped, "inference_server_request_body_bytes_sum", route=route) == 300.0 * 20000
    assert total(scraped, "inference_server_response_body_bytes_bucket", route=route, le="65536.0") == 0
    assert total(scraped, "inference_server_stage_duration_seconds_count", stage="output") == 20000
    assert total(scraped, "inference_server_stage_duration_seconds_sum", stage="wait") == pytest.approx(0.001 * 20000)
    assert total(scraped, "inference_server_inferences_total", outcome="success") == 10000
    assert total(scraped, "inference_server_inferences_total", outcome="fail") == 5000  # the 500s: a 404 is no model's
    assert total(scraped, "inference_server_inference_seconds_total", outcome="fail") == pytest.approx(0.002 * 5000)
    models = {dict(labels)["model"] for name, labels in scraped if name == "inference_server_model_requests_total"}
    assert len(models - {"other"}) == 2  # at most max_models names, the rest as other
    assert "other" in models
    assert (
        sum(value for (name, _), value in scraped.items() if name == "inference_server_model_requests_total") == 20000
    )
    assert total(scraped, "inference_server_model_request_duration_seconds_count") == 20000


def test_the_label_sets_remembered_stay_bounded_under_endless_model_names() -> None:
    """Past MAX_KINDS remembered label sets, new model names are still counted (as other) without growing them."""
    recorder = metrics.Recorder()
    recorder.max_models = 1
    for index in range(metrics.MAX_KINDS + 500):
        recorder.ended((recorder.kind("/models/{name}/invoke", "POST", 200, f"m{index}"), 0.0, 0.001, 1.0, 1.0))
    assert len(recorder.kinds) <= metrics.MAX_KINDS + 1
    assert len(recorder._kind_labels) == 2  # m0, and other
    recorder.flush()
    scraped = samples(generate_latest(recorder.families().registry).decode())
    assert total(scraped, "inference_server_model_requests_total", model="other") == metrics.MAX_KINDS + 499


def _model_dirs(root: Path, sizes: dict[str, int]) -> None:
    """A model directory under ``root`` for each name, whose model_fn allocates its size in MB."""
    for name, size in sizes.items():
        (root / name).mkdir(parents=True)
        (root / name / "size_mb").write_text(str(size))


def _load(server: Any, name: str, url: Path) -> int:
    return server.request("POST", "/models", orjson.dumps({"model_name": name, "url": str(url)}), JSON).status


def _target(server: Any, target: str) -> int:
    headers = {**JSON, "X-Amzn-SageMaker-Target-Model": target}
    return server.request("POST", "/endpoints/mme/invocations", b"[1]", headers).status


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_a_multi_model_endpoint_counts_its_loads_unloads_waits_cache_hits_and_memory(
    backend: str, servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """One worker: two loads, hits, an unload by request, two TargetModel misses (one waiting for a 0.3 s load), an
    eviction past --max-models, a load whose model_fn raises and one past --max-model-memory (507): each counted
    once under its name and reason; models_loaded and model_memory_bytes fall as the models go."""
    plugin_site.add("mm_metrics", MULTI_MODEL)
    root = tmp_path / "root"
    _model_dirs(root, {"a": 1, "b": 1, "t1": 1, "t2": 1, "big": 80})
    (root / "t1" / "sleep").write_text("0.3")
    (root / "broken").mkdir()
    server = servers.start(
        *("--server", backend, "--multi-model", "--model-root", str(root)),
        *("--max-models", "2", "--max-model-memory", "50"),
        plugins=["mm_metrics"],
    )

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(server.request("GET", "/metrics").body.decode())

    empty = scrape()
    assert empty.get(("inference_server_models_loaded", ())) == 0
    for kind in ("private", "mapped"):
        assert empty.get(("inference_server_model_memory_bytes", (("kind", kind),))) == 0, kind
    for reason in ("request", "evicted", "failed"):
        assert empty.get(("inference_server_model_unloads_total", (("reason", reason),))) == 0, reason
    assert [_load(server, name, root / name) for name in ("a", "b")] == [200, 200]
    for name in ("a", "b", "a"):
        assert server.request("POST", f"/models/{name}/invoke", b"[1]", JSON).status == 200  # hits
    assert server.request("DELETE", "/models/b").status == 200
    assert [_target(server, target) for target in ("t1", "t1", "t2")] == [200, 200, 200]  # miss, hit, miss
    # t2 made room: --max-models 2 held a and t1, and t1 was the least recently used TargetModel
    assert _load(server, "broken", root / "broken") == 503  # its model_fn raised
    assert _load(server, "big", root / "big") == 507  # 80 MB, past --max-model-memory 50
    scraped = scrape()

    def value(name: str, **labels: str) -> float:
        return total(scraped, f"inference_server_{name}", **labels)

    assert value("model_loads_total") == 6  # a, b, t1, t2, broken, big
    assert value("model_load_seconds_count") == 6
    assert value("model_load_seconds_sum") >= 0.3
    assert [value("model_unloads_total", reason=reason) for reason in ("request", "evicted", "failed")] == [1, 1, 2]
    assert (value("model_cache_hits_total"), value("model_cache_misses_total")) == (4, 2)
    assert value("model_wait_seconds_count") == 2
    assert value("model_wait_seconds_sum") >= 0.3
    assert value("models_loaded") == 2  # a and t2
    assert value("requests_total", route="/models", status="507") == 1
    cost_a = server.request("GET", "/models/a").json()["memoryBytes"]
    memory = value("model_memory_bytes")
    assert memory > cost_a > 0
    assert value("model_memory_bytes", kind="mapped") == 0  # (its model_fn reads no file into memory)
    assert server.request("DELETE", "/models/a").status == 200
    scraped = scrape()
    assert value("models_loaded") == 1  # t2
    assert value("model_memory_bytes") == memory - cost_a
    assert value("model_unloads_total", reason="request") == 2
    assert value("model_loads_total") == 6


def _costs(server: Any, names: list[str]) -> dict[str, dict[str, int]]:
    """Each model's privateBytesByWorker (pid -> bytes) as GET /models lists it."""
    listing = server.request("GET", "/models").json()["models"]
    return {model["modelName"]: model["privateBytesByWorker"] for model in listing if model["modelName"] in names}


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_models_loaded_counts_each_model_once_per_machine_and_a_killed_worker_leaves_every_listing(
    backend: str, servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """Two workers holding a and b, one of them c: models_loaded is 3 (not 5), model_memory_bytes the sum of every
    cost GET /models lists; the holder of c killed with SIGKILL, within a second c and its costs leave both the
    scrape and privateBytesByWorker, while the counters stay; its replacement serves."""
    plugin_site.add("mm_metrics", MULTI_MODEL)
    root = tmp_path / "root"
    _model_dirs(root, {"a": 1, "b": 1, "c": 1})
    server = servers.start(
        "--server", backend, "--multi-model", "--model-root", str(root), "--workers", "2", plugins=["mm_metrics"]
    )
    deadline = time.monotonic() + 30
    while len(server.workers()) < 2:  # (gunicorn starts its second worker after the first answers)
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    assert [_load(server, name, root / name) for name in ("a", "b", "c")] == [200, 200, 200]
    while any(len(_costs(server, ["a", "b"]).get(name, {})) < 2 for name in ("a", "b")):  # both workers hold a, b
        assert time.monotonic() < deadline, _costs(server, ["a", "b"])
        with ThreadPoolExecutor(4) as pool:  # new connections, spread over the workers
            paths = [f"/models/{name}/invoke" for name in "abababab"]
            replies = pool.map(lambda path: server.request("POST", path, b"[1]", JSON), paths)
            assert {reply.status for reply in replies} == {200}

    def scraped_and_listed() -> tuple[dict[Any, float], dict[str, dict[str, int]]]:
        return samples(server.request("GET", "/metrics").body.decode()), _costs(server, ["a", "b", "c"])

    scraped, costs = scraped_and_listed()
    assert total(scraped, "inference_server_models_loaded") == 3, costs
    assert total(scraped, "inference_server_model_loads_total") == 5
    assert total(scraped, "inference_server_model_memory_bytes") == sum(
        cost for by_worker in costs.values() for cost in by_worker.values()
    )
    (holder,) = costs["c"]
    victim = int(holder)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    while True:  # within a second, the scrape and the listing both forget the worker
        with contextlib.suppress(ConnectionError):  # (granian: a connection the dead worker had queued is reset)
            scraped, costs = scraped_and_listed()
            listed = {pid for by_worker in costs.values() for pid in by_worker}
            if holder not in listed and total(scraped, "inference_server_models_loaded") == 2:
                break
        assert time.monotonic() - killed < 1.0, (costs, total(scraped, "inference_server_models_loaded"))
        time.sleep(0.02)
    assert costs["c"] == {}
    assert total(scraped, "inference_server_model_memory_bytes") == sum(costs["a"].values()) + sum(costs["b"].values())
    assert total(scraped, "inference_server_model_loads_total") == 5  # counters stay
    deadline = time.monotonic() + 30
    while victim in server.workers() or len(server.workers()) < 2:  # its replacement starts
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    server.wait_ready()
    for _ in range(10):  # whichever worker answers, c is served (loaded again where needed)
        assert server.request("POST", "/models/c/invoke", b"[1]", JSON).status == 200


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_a_worker_that_dies_while_the_server_drains_leaves_every_listing(
    backend: str, servers: Any, plugin_site: Any, tmp_path: Path
) -> None:
    """While the server drains (SIGTERM, a slow request in flight on one worker), the other worker, which holds a
    model, killed with SIGKILL: within a second what it paid for its models, the models it held and its live gauges
    leave the run directory (before, on granian: only when the server exited); the slow request still ends 200."""
    plugin_site.add("mm_metrics", MULTI_MODEL)
    root, runs = tmp_path / "root", tmp_path / "runs"
    _model_dirs(root, {"a": 1})
    runs.mkdir()
    server = servers.start(
        *("--server", backend, "--multi-model", "--model-root", str(root), "--workers", "2"),
        env={"TMPDIR": str(runs)},  # the run directory is made there
        plugins=["mm_metrics"],
    )
    deadline = time.monotonic() + 30
    while len(server.workers()) < 2:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    assert _load(server, "a", root / "a") == 200
    (holder,) = _costs(server, ["a"])["a"]
    while True:  # a kept-alive connection to the other worker: its next request goes there too
        other = server.connection()
        other.request("POST", "/models/a/invoke", b"[1]", JSON)
        pid = str(orjson.loads(other.getresponse().read())["pid"])
        if pid != holder:
            break
        other.close()
        assert time.monotonic() < deadline, "no connection reached the second worker"
    (run_dir,) = runs.glob("inference-server-*")

    def left_by_holder() -> list[str]:
        return [
            path.name
            for path in (*run_dir.glob(f"models/held/{holder}.json"), *run_dir.glob(f"metrics/*{holder}.*"))
            # (its counts stay, and when it last answered: the most recent of every worker's)
            if not path.name.startswith(("counter_", "histogram_", "gauge_max_"))
        ]

    assert f"{holder}.json" in left_by_holder(), left_by_holder()  # what it holds, and what that cost it
    with ThreadPoolExecutor(1) as pool:
        other.request("POST", "/models/a/invoke", b'{"sleep": 4}', JSON)
        slow = pool.submit(lambda: other.getresponse().status)
        while (run_dir / f"worker-{pid}").read_bytes() != (1).to_bytes(8, "little"):  # the worker counts it in flight
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        while server.request("GET", "/ping").status != 503:  # draining
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.02)
        os.kill(int(holder), signal.SIGKILL)
        killed = time.monotonic()
        while left_by_holder():
            assert time.monotonic() - killed < 1.0, left_by_holder()
            time.sleep(0.02)
        assert slow.result(timeout=30) == 200
    other.close()
