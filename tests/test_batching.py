"""Micro-batching (``batching.py``): real servers with a plugin that logs every ``predict_fn`` call, concurrent
clients checking every value of their own answer, and the batcher's rules in-process."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

import inference_server
from inference_server import batching, testing
from inference_server._settings import Settings
from inference_server.errors import ConfigurationError, HookError
from inference_server.wsgi._app import App
from tests.conftest import Reply, Server, wait_until

#: predict_fn doubles and adds one (every answer differs from its input); a row starting with -1 makes it raise;
#: MIS_SIZE drops a row of every batch of several requests; a row ending in 99 takes 2.5 s, others PREDICT_SLEEP;
#: each call is logged as "rows dtype trailing-shape".
BATCHED = """
    import os
    import time

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "model"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{len(data)} {data.dtype} {'x'.join(map(str, data.shape[1:]))}\\n")
        time.sleep(2.5 if (data[:, -1] == 99).any() else float(os.environ.get("PREDICT_SLEEP", "0.05")))
        if (data[:, 0] == -1).any():
            raise ValueError("a row starts with -1")
        if os.environ.get("MIS_SIZE") and len(data) > 1:
            return data[1:]
        return data * 2 + 1
"""

#: predict_batch_fn for JSON objects: one answer per input, saying how many shared the call.
BATCH_FN = """
    import os
    import time

    import inference_server

    @inference_server.plugin_hook
    def predict_batch_fn(data, model):
        if not isinstance(data[0], dict):
            return None
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{len(data)} objects\\n")
        time.sleep(0.05)
        return [{"x": item["x"], "shared": len(data)} for item in data]
"""


#: predict_fn for JSON inputs: rows (lists) and records (dicts) answered row by row; a dict alone answered whole;
#: MIS_SIZE drops a row of every group of several; a first row starting with 99 takes 1.5 s. Each call is logged as
#: "rows type".
JSON_ROWS = """
    import os
    import time

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "model"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        with open(os.environ["CALLS_LOG"], "a") as log:
            log.write(f"{len(data) if isinstance(data, list) else 1} {type(data).__name__}\\n")
        if isinstance(data, dict):
            return {"alone": data["x"]}
        busy = isinstance(data[0], list) and data[0][0] == 99
        time.sleep(1.5 if busy else 0.05)
        if os.environ.get("MIS_SIZE") and len(data) > 1:
            data = data[1:]
        return [[value * 2 + 1 for value in row] if isinstance(row, list) else {"y": row["x"] * 2 + 1} for row in data]
"""
JSON = {"Content-Type": "application/json", "Accept": "application/json"}


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _post(server: Server, array: np.ndarray) -> Reply:
    headers = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}
    return server.request("POST", "/invocations", _npy(array), headers)


def _at_once(count: int, send: Callable[[int], Any]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))


class Calls:
    """The plugin's call log: one line per predict_fn (or predict_batch_fn) call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def rows(self) -> list[int]:
        return [int(line.split()[0]) for line in self.lines()]


@pytest.fixture
def calls(tmp_path: Path) -> Calls:
    return Calls(tmp_path / "calls.log")


@pytest.fixture
def start(servers: Any, plugin_site: Any, calls: Calls) -> Callable[..., Server]:
    """Start a server with the batched plugin (and more env)."""
    plugin_site.add("batched", BATCHED)

    def start(*args: str, **env: str) -> Server:
        server: Server = servers.start(*args, env={"CALLS_LOG": str(calls.path), **env})
        return server

    return start


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_64_concurrent_requests_each_get_exactly_their_own_answer(
    backend: str, start: Callable[..., Server], calls: Calls
) -> None:
    """64 requests at once, each with its own values and 1 to 3 rows: every value of every answer is its own
    input's prediction, and the model saw fewer calls than requests (groups formed), all rows accounted for."""
    server = start("--server", backend, "--max-batch-size", "16")

    def send(i: int) -> np.ndarray:
        rows = i % 3 + 1
        data = np.arange(rows * 4, dtype="f4").reshape(rows, 4) + 1000 * i
        reply = _post(server, data)
        assert reply.status == 200, reply.body
        answer = np.load(io.BytesIO(reply.body))
        np.testing.assert_array_equal(answer, data * 2 + 1)
        return answer

    _at_once(64, send)
    rows = calls.rows()
    assert sum(rows) == sum(i % 3 + 1 for i in range(64))
    assert len(rows) < 64, rows
    assert max(rows) > 3


def test_inputs_of_other_shapes_or_dtypes_are_grouped_apart(start: Callable[..., Server], calls: Calls) -> None:
    """A burst of (n, 4) float32, (n, 3) float32 and (n, 4) float64 inputs: all succeed, and no call mixes them."""
    server = start("--max-batch-size", "16")
    kinds = [("f4", 4), ("f4", 3), ("f8", 4)]

    def send(i: int) -> None:
        dtype, width = kinds[i % 3]
        data = np.full((1, width), i, dtype=dtype)
        reply = _post(server, data)
        assert reply.status == 200, reply.body
        answer = np.load(io.BytesIO(reply.body))
        assert answer.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(answer, data * 2 + 1)

    _at_once(36, send)
    lines = calls.lines()
    assert {line.split(" ", 1)[1] for line in lines} == {"float32 4", "float32 3", "float64 4"}
    assert sum(calls.rows()) == 36
    assert len(lines) < 36


def test_a_bad_input_fails_alone_while_its_group_succeeds(start: Callable[..., Server], calls: Calls) -> None:
    """16 inputs queued behind a busy model go as one group; one of them makes predict_fn raise, so the group is
    run again one by one: only that request gets the 500 (naming predict_fn), the 15 others their own answers."""
    server = start("--max-batch-size", "16")
    with concurrent.futures.ThreadPoolExecutor(17) as pool:
        busy = pool.submit(_post, server, np.array([[1, 99]], dtype="f4"))  # holds the model for 2.5 s
        wait_until(lambda: calls.rows() == [1], 10, "the busy call did not begin")
        futures = [pool.submit(_post, server, np.array([[-1.0 if i == 7 else i, 0.0]], dtype="f4")) for i in range(16)]
        replies = [future.result() for future in futures]
        assert busy.result().status == 200
    assert [reply.status for reply in replies].count(500) == 1
    assert replies[7].status == 500
    assert "predict_fn raised ValueError" in replies[7].json()["message"]
    for i, reply in enumerate(replies):
        if i != 7:
            np.testing.assert_array_equal(np.load(io.BytesIO(reply.body)), [[2.0 * i + 1, 1.0]])
    assert calls.rows() == [1, 16] + [1] * 16  # the busy call, the group that failed, each input again alone


def test_a_mis_sized_prediction_fails_its_whole_group_with_a_message(
    start: Callable[..., Server], calls: Calls
) -> None:
    """predict_fn returning one row fewer than its group's rows (8 requests queued behind a busy model): every
    request of the group gets a 500 saying so, never another request's rows; a request alone is answered."""
    server = start("--max-batch-size", "8", MIS_SIZE="1")
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        busy = pool.submit(_post, server, np.array([[1, 99]], dtype="f4"))
        wait_until(lambda: calls.rows() == [1], 10, "the busy call did not begin")
        replies = list(pool.map(lambda i: _post(server, np.full((1, 2), i, dtype="f4")), range(8)))
        assert busy.result().status == 200
    assert [reply.status for reply in replies] == [500] * 8
    for reply in replies:
        assert "rows for a batch of 8 rows from 8 requests" in reply.json()["message"]
        assert "one row per input row" in reply.json()["message"]
    assert calls.rows() == [1, 8]


def test_beyond_the_queue_requests_get_503_with_retry_after_and_ping_stays_200(
    start: Callable[..., Server], calls: Calls
) -> None:
    """--max-queue 2 with a slow model: of 12 requests at once, those beyond the queue get 503 with Retry-After
    before the model's first call ends, the rest succeed, and /ping answers 200 within 2 s meanwhile."""
    server = start("--max-batch-size", "2", "--max-queue", "2", PREDICT_SLEEP="1")
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(_post, server, np.full((1, 2), i, dtype="f4")) for i in range(12)]
        wait_until(lambda: any(future.done() for future in futures), 10, "no request was answered")
        assert len(calls.rows()) <= 1, "the first refusal came only after the model's first call"
        assert server.request("GET", "/ping", timeout=2).status == 200
        replies = [future.result() for future in futures]
    refused = [reply for reply in replies if reply.status == 503]
    assert refused
    assert all(reply.status in (200, 503) for reply in replies)
    for reply in refused:
        assert reply.headers["Retry-After"] == "1"
        assert "queue is full (2 requests waiting)" in reply.json()["message"]
    assert len(refused) <= 12 - 3  # the running group and the queue's 2 at least were served


def test_sigterm_with_a_full_queue_answers_every_queued_request(servers: Any, plugin_site: Any, calls: Calls) -> None:
    """SIGTERM while 12 requests wait for a slow model: every one of them is answered 200 with its own values,
    then the server exits 0."""
    plugin_site.add("batched", BATCHED)
    env = {"CALLS_LOG": str(calls.path), "PREDICT_SLEEP": "0.5"}
    server = servers.start("--max-batch-size", "4", "--max-queue", "16", env=env)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(_post, server, np.full((1, 2), i, dtype="f4")) for i in range(12)]
        server.wait_arrived(12)
        server.process.send_signal(signal.SIGTERM)
        replies = [future.result() for future in futures]
    for i, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        np.testing.assert_array_equal(np.load(io.BytesIO(reply.body)), [[2.0 * i + 1] * 2])
    assert server.process.wait(15) == 0
    assert sum(calls.rows()) == 12


def test_a_queued_request_past_its_timeout_gets_504_and_never_runs(start: Callable[..., Server], calls: Calls) -> None:
    """--timeout 1 while the model takes 2.5 s: requests queued behind it get 504 with their request id, leave the
    queue unrun (the model saw one call), and a request sent once the model is free is served (on the event-loop
    fronts the 504s come at the deadline, while the busy call still runs: one sent then waits behind it, and may be
    answered 504 unrun too)."""
    server = start("--max-batch-size", "2", "--max-queue", "4", "--timeout", "1")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(_post, server, np.array([[1, 99]], dtype="f4"))
        wait_until(lambda: calls.rows() == [1], 10, "the busy call did not begin")
        queued = [pool.submit(_post, server, np.full((1, 2), i, dtype="f4")) for i in (2, 3)]
        for future in queued:
            reply = future.result()
            assert reply.status == 504
            assert reply.json()["request_id"] == reply.headers["X-Request-Id"]
            assert "waiting for the model" in reply.json()["message"]
        assert first.result().status == 504
    statuses: list[int] = []
    deadline = time.monotonic() + 15
    while not statuses or statuses[-1] != 200:
        assert time.monotonic() < deadline, f"no request was served once the busy call ended: {statuses}"
        statuses.append(_post(server, np.full((1, 2), 4, dtype="f4")).status)
    assert set(statuses[:-1]) <= {504}, statuses
    assert calls.rows() == [1, 1]  # (the queued ones never ran)


def test_a_lone_request_waits_for_nothing(start: Callable[..., Server], calls: Calls) -> None:
    """With a 10 s --max-batch-delay and no other request on its way, a request goes to the model at once (each is
    answered before the delay would end)."""
    server = start("--max-batch-size", "8", "--max-batch-delay", "10000", PREDICT_SLEEP="0")
    for _ in range(3):
        started = time.monotonic()
        assert _post(server, np.zeros((1, 2), dtype="f4")).status == 200
        assert time.monotonic() - started < 10


def _closed_loop(batcher: batching.Batcher, clients: int, rounds: int, turnaround: float) -> None:
    """``clients`` threads each sending ``rounds`` inputs one after another, ``turnaround`` seconds apart."""

    def client(number: int) -> None:
        for _ in range(rounds):
            row = np.full((1, 2), number, dtype="f4")
            np.testing.assert_array_equal(batcher.predict(row, "model"), row + 1)
            time.sleep(turnaround)

    _at_once(clients, client)


class _Watched(batching.Batcher):
    """A batcher that notes each time a free model chose to wait for company rather than run the queued inputs:
    the inputs made to wait, and for how long at most; what a test checks instead of timing the calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept_waiting: dict[Any, float] = {}  # (the inputs themselves: ids of freed ones are reused)

    def _ready(self) -> tuple[list[Any], float]:
        group, wait = super()._ready()
        if not group and self._queue:
            head = self._queue[0]
            self.kept_waiting[head] = max(wait, self.kept_waiting.get(head, 0.0))
        return group, wait


def _slow_batcher(seconds: float, delay: float) -> tuple[_Watched, list[int]]:
    """A batcher of up to 8 whose model takes ``seconds`` a call whatever its size, and the sizes of its calls."""
    sizes: list[int] = []

    def predict(data: np.ndarray, model: Any) -> np.ndarray:
        sizes.append(len(data))
        time.sleep(seconds)
        return data + 1

    return _Watched(batching.Options(max_batch_size=8, max_batch_delay=delay, max_queue=32), predict), sizes


def test_at_saturation_answered_clients_are_waited_for_so_groups_fill() -> None:
    """8 closed-loop clients of a model that takes 8 at the cost of 1: the free model waits for the clients it has
    just answered, so groups hold all 8 rather than alternate between a few and the rest."""
    batcher, sizes = _slow_batcher(0.06, delay=0.5)
    _closed_loop(batcher, clients=8, rounds=10, turnaround=0.002)
    assert sum(sizes) == 80
    assert len(sizes) <= 14, sizes  # 10 groups of 8, and a few smaller ones while the clients start


def test_a_lone_client_is_its_own_return_and_waits_for_nothing() -> None:
    """One closed-loop client with a 2 s delay: it answered itself, so each input goes to the model at once."""
    batcher, sizes = _slow_batcher(0.3, delay=2.0)
    _closed_loop(batcher, clients=1, rounds=3, turnaround=0)
    assert sizes == [1, 1, 1]
    assert batcher.kept_waiting == {}


def test_clients_that_do_not_come_back_are_waited_for_once() -> None:
    """After a group of 4 whose clients leave, a lone client waits for them once (at most the model's cheapest
    call), then no more."""
    batcher, sizes = _slow_batcher(0.2, delay=2.0)
    _closed_loop(batcher, clients=4, rounds=1, turnaround=0)
    before = dict(batcher.kept_waiting)
    _closed_loop(batcher, clients=1, rounds=3, turnaround=0)
    waits = [wait for head, wait in batcher.kept_waiting.items() if head not in before]
    assert len(waits) == 1, batcher.kept_waiting  # the lone client's first input, not the next two
    assert 0 < waits[0] <= 0.2 + 0.05  # for the cheapest call at most (learnt: ~0.2 s), not the 2 s delay
    assert sizes[-3:] == [1, 1, 1]


class _Escaped(BaseException):
    """What a predict_fn may raise that is not an Exception (as ``SystemExit`` is)."""


def test_on_the_loop_a_group_that_escapes_fails_each_of_its_requests() -> None:
    """Inputs waiting on an event loop whose group's predict_fn raises a BaseException each get a HookError naming
    predict_fn (not an answer of None), and the batcher's slot is given back for the next group."""
    calls: list[int] = []

    def predict(data: np.ndarray, model: Any) -> np.ndarray:
        calls.append(len(data))
        if len(calls) == 1:
            raise _Escaped
        return data + 1

    batcher = batching.Batcher(batching.Options(max_batch_size=4, max_batch_delay=0.05, max_queue=8), predict)
    threads = concurrent.futures.ThreadPoolExecutor(1)

    async def main() -> list[Any]:
        async def one(value: float) -> Any:
            try:
                return await batcher.apredict(np.full((1, 2), value), None, None, threads.submit)
            except Exception as exc:
                return exc

        first = await asyncio.gather(*(one(value) for value in range(3)))
        return [*first, await one(9)]

    try:
        answers = asyncio.run(main())
    finally:
        threads.shutdown()
    assert [type(answer).__name__ for answer in answers[:3]] == ["HookError"] * 3
    assert all(answer.hook == "predict_fn" for answer in answers[:3])
    np.testing.assert_array_equal(answers[3], [[10.0, 10.0]])
    assert calls == [3, 1]


@pytest.mark.parametrize(
    ("calls", "fixed"),
    [
        ([(1, 0.00502), (32, 0.00564), (16, 0.00532), (8, 0.00516)], 0.005),  # 5 ms a call plus 20 us a request
        ([(8, 0.004), (8, 0.003), (8, 0.005)], 0.003),  # one size: the cheapest call
        ([(1, 0.001), (10, 0.010), (20, 0.020)], 0.0),  # no fixed cost
        ([(1, 0.010), (2, 0.002), (3, 0.001)], 0.001),  # dearer when smaller: at most the cheapest call
    ],
    ids=["fixed-and-per-request", "one-size", "per-request-only", "noisy"],
)
def test_fixed_cost_is_the_intercept_of_calls_against_their_sizes(calls: list[tuple[int, float]], fixed: float) -> None:
    """What a call costs whatever its size: the least-squares intercept, within 0 and the cheapest call."""
    assert batching.fixed_cost(calls) == pytest.approx(fixed, abs=1e-9)


def test_predict_batch_fn_groups_inputs_that_are_not_arrays(servers: Any, plugin_site: Any, calls: Calls) -> None:
    """A plugin's predict_batch_fn gets JSON objects of concurrent requests as one list, and each request gets
    its own item back; arrays (which it declines) are still concatenated for predict_fn."""
    plugin_site.add("batched", BATCHED)
    plugin_site.add("batch_fn", BATCH_FN)
    server = servers.start("--max-batch-size", "8", env={"CALLS_LOG": str(calls.path)})
    headers = {"Content-Type": "application/json", "Accept": "application/json"}

    def send(i: int) -> dict[str, int]:
        reply = server.request("POST", "/invocations", orjson.dumps({"x": i}), headers)
        assert reply.status == 200, reply.body
        answer: dict[str, int] = reply.json()
        assert answer["x"] == i
        return answer

    answers = _at_once(24, send)
    assert max(answer["shared"] for answer in answers) > 1
    objects = [line for line in calls.lines() if line.endswith("objects")]
    assert sum(int(line.split()[0]) for line in objects) == 24
    arrays = _at_once(8, lambda i: _post(server, np.full((1, 2), i, dtype="f4")))
    assert all(reply.status == 200 for reply in arrays)


@pytest.fixture
def json_rows(servers: Any, plugin_site: Any, calls: Calls) -> Callable[..., Server]:
    """Start a server with the JSON rows plugin (and more env)."""
    plugin_site.add("json_rows", JSON_ROWS)

    def start(*args: str, **env: str) -> Server:
        server: Server = servers.start(*args, env={"CALLS_LOG": str(calls.path), **env})
        return server

    return start


def test_json_rows_and_records_of_concurrent_requests_share_predict_fn(
    json_rows: Callable[..., Server], calls: Calls
) -> None:
    """32 concurrent JSON clients, half sending rows (arrays of arrays) and half records (arrays of objects): their
    rows are joined into lists for predict_fn, and each client gets exactly its own rows back."""
    server = json_rows("--max-batch-size", "16")

    def send(i: int) -> Reply:
        body: Any = [[i, 0.5], [i, 1.5]] if i % 2 else [{"x": i}]
        return server.request("POST", "/invocations", orjson.dumps(body), JSON)

    replies = _at_once(32, send)
    for i, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        assert reply.json() == ([[2 * i + 1, 2.0], [2 * i + 1, 4.0]] if i % 2 else [{"y": 2 * i + 1}])
    assert sum(calls.rows()) == 16 * 2 + 16
    assert max(calls.rows()) > 2  # groups formed: more rows than one request sends
    assert {line.split()[1] for line in calls.lines()} == {"list"}


def test_a_mis_sized_json_prediction_fails_its_whole_group_with_a_message(
    json_rows: Callable[..., Server], calls: Calls
) -> None:
    """8 JSON requests queued behind a busy model, whose predict_fn returns a row fewer than the group's: each gets a
    500 saying so, never another request's rows."""
    server = json_rows("--max-batch-size", "8", MIS_SIZE="1")
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        busy = pool.submit(server.request, "POST", "/invocations", b"[[99, 0]]", JSON)
        wait_until(lambda: calls.rows() == [1], 10, "the busy call did not begin")
        send = lambda i: server.request("POST", "/invocations", orjson.dumps([[i, 0]]), JSON)  # noqa: E731
        replies = list(pool.map(send, range(8)))
        assert busy.result().status == 200
    assert [reply.status for reply in replies] == [500] * 8
    for reply in replies:
        assert "a list of 7 rows for a batch of 8 rows from 8 requests" in reply.json()["message"]
    assert calls.rows() == [1, 8]


def test_inputs_that_cannot_be_joined_run_alone_with_one_warning(
    json_rows: Callable[..., Server], calls: Calls
) -> None:
    """JSON objects (not rows) are not joined: each runs alone, answered as its own, and the worker warns once,
    pointing to predict_batch_fn."""
    server = json_rows("--max-batch-size", "8")
    replies = _at_once(12, lambda i: server.request("POST", "/invocations", orjson.dumps({"x": i}), JSON))
    assert [reply.json() for reply in replies] == [{"alone": i} for i in range(12)]
    assert calls.rows() == [1] * 12
    output = server.output()
    assert output.count("an input of type dict runs alone") == 1
    assert "predict_batch_fn" in output


class Hooked:
    """A plugin asking for batches of 3 through the batching hook."""

    @inference_server.plugin_hook
    def batching(self) -> dict[str, int]:
        return {"max_batch_size": 3}


@pytest.fixture
def hooked(only_plugin: Callable[[Any], Any]) -> Hooked:
    """The defaults and the Hooked plugin only, for this test."""
    plugin: Hooked = only_plugin(Hooked())
    return plugin


def test_the_option_wins_over_the_hook_and_the_hook_over_the_variable(hooked: Hooked) -> None:
    """--max-batch-size beats the batching hook, which beats INFERENCE_SERVER_MAX_BATCH_SIZE; the queue is 4x the
    batch size unless set; serve's workers see the option as given (INFERENCE_SERVER_GIVEN)."""
    pm = testing.plugin_manager()
    variable = {"INFERENCE_SERVER_MAX_BATCH_SIZE": "5", "INFERENCE_SERVER_MAX_BATCH_DELAY_MS": "9"}
    from_variable = App(Settings.from_env(variable), pm).batching
    assert (from_variable.max_batch_size, from_variable.max_batch_delay, from_variable.max_queue) == (3, 0.009, 12)
    option = Settings.from_env(variable, max_batch_size=2)
    assert App(option, pm).batching.max_batch_size == 2
    in_a_worker = Settings.from_env(option.environ())
    assert App(in_a_worker, pm).batching.max_batch_size == 2
    pm.unregister(hooked)
    assert App(Settings.from_env(variable), pm).batching.max_batch_size == 5
    assert App(Settings.from_env({}), pm).batching.enabled is False


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([1, 2], "must be a dict or None"),
        ({"max_batch_size": 0}, "max_batch_size 0: it must be an integer >= 1"),
        ({"batch_size": 4}, "unknown keys batch_size"),
    ],
)
def test_a_bad_batching_hook_stops_start_up(answer: Any, message: str) -> None:
    """A batching hook returning something else than a dict of the two keys with valid values: ConfigurationError."""
    with pytest.raises(ConfigurationError, match=message):
        batching.options({}, frozenset(), answer, 1)


def test_a_queue_longer_than_the_threads_can_hold_is_refused() -> None:
    """--max-queue above what a worker's threads hold is a ConfigurationError at start-up."""
    with pytest.raises(ConfigurationError, match="at most 960"):
        batching.options({"max_batch_size": 4, "max_queue": 5000}, frozenset(), None, 1)


def test_in_process_the_wsgi_app_batches_concurrent_requests(
    monkeypatch: pytest.MonkeyPatch, only_plugin: Callable[[Any], Any]
) -> None:
    """testing.client with INFERENCE_SERVER_MAX_BATCH_SIZE: concurrent requests from threads share calls, each with
    its own answer (a batched model tested without a server)."""
    monkeypatch.setenv("INFERENCE_SERVER_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("INFERENCE_SERVER_MAX_QUEUE", "48")  # (all 48 may be queued before the first group goes)
    seen: list[int] = []

    class Model:
        @inference_server.plugin_hook
        def predict_fn(self, data: np.ndarray, model: Any) -> np.ndarray:
            seen.append(len(data))
            time.sleep(0.01)
            return data + 0.5

    only_plugin(Model())
    client = testing.client()

    def send(i: int) -> None:
        body = _npy(np.full((1, 3), i, dtype="f8"))
        reply = client.post("/invocations", data=body, content_type="application/x-npy")
        assert reply.status_code == 200, reply.data
        np.testing.assert_array_equal(np.load(io.BytesIO(reply.data)), [[i + 0.5] * 3])

    _at_once(48, send)
    assert sum(seen) == 48
    assert len(seen) < 48


@pytest.mark.parametrize(
    "prediction",
    [
        np.arange(12).reshape(6, 2),
        {"a": np.arange(6), "b": np.arange(12).reshape(6, 2)},
        (np.arange(6), np.arange(6) * 2),
        [np.arange(6), np.arange(6)],
        list(range(6)),
        pd.DataFrame({"a": range(6)}),
        pa.table({"a": list(range(6))}),
    ],
    ids=["array", "dict", "tuple", "list-of-arrays", "list", "DataFrame", "Arrow"],
)
def test_split_cuts_every_supported_prediction_by_rows(prediction: Any) -> None:
    """split gives rows 0-1, 2 and 3-5 of each supported prediction type, as views of the same type."""
    first, second, third = batching.split(prediction, [2, 1, 3])
    if isinstance(prediction, np.ndarray):
        assert [len(first), len(second), len(third)] == [2, 1, 3]
        assert np.shares_memory(first, prediction)
    elif isinstance(prediction, dict):
        np.testing.assert_array_equal(third["b"], prediction["b"][3:])
    elif isinstance(prediction, tuple):
        assert isinstance(second, tuple)
        np.testing.assert_array_equal(second[1], [4])
    elif isinstance(prediction, list) and isinstance(prediction[0], np.ndarray):
        np.testing.assert_array_equal(first[0], [0, 1])
    elif isinstance(prediction, list):
        assert third == [3, 4, 5]
    elif isinstance(prediction, pd.DataFrame):
        assert third["a"].tolist() == [3, 4, 5]
    else:
        assert third.column("a").to_pylist() == [3, 4, 5]


@pytest.mark.parametrize(
    ("prediction", "what"),
    [
        (np.arange(5), "an array of 5 rows"),
        (np.float64(1.0), "a float64 of no rows"),
        ({"a": np.arange(6), "b": np.arange(2)}, "'b' of 2 rows"),
        ("text", "a str of no rows"),
    ],
)
def test_split_refuses_a_prediction_without_one_row_per_input_row(prediction: Any, what: str) -> None:
    """A prediction (or any of its parts) whose leading dimension is not the total of rows: a HookError naming
    what was wrong, for the whole group."""
    with pytest.raises(HookError) as caught:
        batching.split(prediction, [2, 1, 3])
    assert f"predict_fn returned {what} for a batch of 6 rows from 3 requests" in caught.value.summary
