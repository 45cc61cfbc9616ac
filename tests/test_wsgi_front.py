"""The event-loop fronts (``--granian-interface asgi`` and ``rsgi``) on real servers: every hook may be ``async
def``, async predictions overlap on one model thread, the 504 comes at the deadline while a sync hook still runs (its
slot given back when it returns, its worker replaced when it is stuck), a request still waiting for the model at its
deadline never reaches it, micro-batched requests wait for their groups on the loop (no thread each; dropped unrun
at their deadline), and stalled bodies are answered 408 without holding threads, over HTTP/1.1 and HTTP/2. On ASGI,
a chunked body is verified (cut short: 400; whole: served under a body limit), a stream that fails mid-way is cut
short, and a header that is not UTF-8 reaches the app's checks. gunicorn runs its invocations on the loop too (its
thread waits): the tests of the lifecycle run on it as well."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import logging
import os
import signal
import socket
import struct
import textwrap
import time
import tracemalloc
from pathlib import Path
from typing import Any

import botocore.eventstream
import orjson
import pytest

from inference_server import _loop, _plugins, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App
from inference_server.wsgi._asgi import AsgiFront
from inference_server.wsgi._invoke import StreamFailed
from tests.conftest import GRANIAN_INTERFACE, wait_until

JSON = {"Content-Type": "application/json"}
FRONTS = ["asgi", "rsgi"]


#: The ``serve`` options of each server whose invocations run on the event loop: the fronts, and gunicorn (its
#: thread waits for the loop).
ON_LOOP = {
    "asgi": ("--server", "granian", "--granian-interface", "asgi"),
    "rsgi": ("--server", "granian", "--granian-interface", "rsgi"),
    "gunicorn": ("--server", "gunicorn"),
}


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The ``serve`` options of each event-loop front."""
    return ON_LOOP[request.param]


@pytest.fixture(params=list(ON_LOOP))
def on_loop(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The ``serve`` options of each server whose invocations run on the event loop."""
    return ON_LOOP[request.param]


#: The servers that answer a sync hook's overrun at the deadline: those of :data:`ON_LOOP`, and granian's WSGI
#: interface, whose lifecycle runs the hooks of a model not known to be quick on a model thread while the server's
#: thread waits until the deadline.
AT_THE_DEADLINE = {**ON_LOOP, "wsgi": ("--server", "granian", "--granian-interface", "wsgi")}


@pytest.fixture(params=list(AT_THE_DEADLINE))
def at_the_deadline(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The ``serve`` options of each server that answers a sync hook's overrun at the deadline."""
    return AT_THE_DEADLINE[request.param]


#: Every hook ``async def``, each leaving its mark on the answer.
ASYNC_HOOKS = """
    import asyncio

    import inference_server

    {marker}
    async def model_fn(model_dir):
        await asyncio.sleep(0)
        return ["model_fn"]

    {marker}
    async def input_fn(input_data, content_type):
        await asyncio.sleep(0)
        return [bytes(input_data).decode(), "input_fn"]

    {marker}
    async def predict_fn(data, model):
        await asyncio.sleep(0)
        return [*model, *data, "predict_fn"]

    {marker}
    async def output_fn(prediction, accept):
        await asyncio.sleep(0)
        return ",".join([*prediction, "output_fn"]), "text/plain"

    {marker}
    async def ping_fn(model):
        await asyncio.sleep(0)
        return model == ["model_fn"]
"""

#: A sync model: it sleeps ``sleep`` seconds, then writes the file ``called`` if given, and echoes the request.
SLEEPER = """
    import pathlib
    import time

    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        time.sleep(data.get("sleep", 0))
        if data.get("called"):
            pathlib.Path(data["called"]).write_text("called")
        return data
"""

#: An async model that answers "together" once ``together`` requests are in it at once (else "alone" after 30 s),
#: and an async one that blocks the loop with ``time.sleep`` when asked.
TOGETHER = """
    import asyncio
    import time

    import inference_server

    inside = 0
    everyone = None

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        global inside, everyone
        if data.get("block"):
            time.sleep(data["block"])
            return {"blocked": True}
        everyone = everyone or asyncio.Event()
        inside += 1
        if inside >= data["together"]:
            everyone.set()
        try:
            await asyncio.wait_for(everyone.wait(), 30)
            return {"answer": "together"}
        except asyncio.TimeoutError:
            return {"answer": "alone"}
"""


def _post(server: Any, value: Any, timeout: float = 60) -> Any:
    return server.request("POST", "/invocations", orjson.dumps(value), JSON, timeout=timeout)


@pytest.mark.parametrize("kind", ["plugin", "script"])
def test_every_hook_may_be_async(
    on_loop: tuple[str, ...], kind: str, plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """model_fn, input_fn, predict_fn, output_fn and ping_fn as async def, in a plugin and in an inference.py
    script, are awaited on the front's loop: /ping says 200 and the answer bears each hook's mark."""
    if kind == "plugin":
        plugin_site.add("hooks", ASYNC_HOOKS.format(marker="@inference_server.plugin_hook"))
        server = servers.start(*on_loop)
    else:
        script = tmp_path / "code" / "inference.py"
        script.parent.mkdir()
        script.write_text(textwrap.dedent(ASYNC_HOOKS.format(marker="")))
        server = servers.start(*on_loop, "--script", str(script), plugins=[])
    assert server.request("GET", "/ping").status == 200
    answer = server.request("POST", "/invocations", b"hello", {"Content-Type": "text/plain"})
    assert (answer.status, answer.body) == (200, b"model_fn,hello,input_fn,predict_fn,output_fn")


def test_async_predictions_overlap_with_one_model_thread(
    on_loop: tuple[str, ...], plugin_site: Any, servers: Any
) -> None:
    """Five requests to an async predict_fn are all inside it at once under --threads 1: async hooks run on the
    loop, not on the model threads."""
    plugin_site.add("together", TOGETHER)
    server = servers.start(*on_loop, "--threads", "1")
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda _: _post(server, {"together": 5}), range(5)))
    assert [orjson.loads(answer.body) for answer in answers] == [{"answer": "together"}] * 5


def test_a_hook_that_blocks_the_loop_is_named_once(on_loop: tuple[str, ...], plugin_site: Any, servers: Any) -> None:
    """An async predict_fn calling time.sleep is named in one WARNING saying how long it held the loop, however
    often it does it."""
    plugin_site.add("together", TOGETHER)
    server = servers.start(*on_loop)
    for _ in range(2):
        assert _post(server, {"block": 0.3}).status == 200
    warned = [line for line in server.output().splitlines() if "held the event loop" in line]
    assert len(warned) == 1
    assert "predict_fn" in warned[0]


@pytest.mark.parametrize("batching", [(), ("--max-batch-size", "4")], ids=["alone", "micro-batched"])
def test_the_504_comes_at_the_deadline_and_a_stuck_worker_is_replaced(
    at_the_deadline: tuple[str, ...], batching: tuple[str, ...], plugin_site: Any, servers: Any
) -> None:
    """A sync predict_fn sleeping 12 s under --timeout 2 is answered 504 before its sleep ends, alone or as a
    micro-batch's group; still running 2 s later, its worker is replaced, and the next request is served before that
    sleep would have ended."""
    plugin_site.add("sleeper", SLEEPER)
    server = servers.start(*at_the_deadline, "--timeout", "2", "--threads", "1", *batching)
    started = time.monotonic()
    answer = _post(server, {"sleep": 12})
    assert answer.status == 504
    assert time.monotonic() - started < 12
    assert "timeout of 2 s" in orjson.loads(answer.body)["message"]
    wait_until(lambda: "asks to be replaced" in server.output(), 10, "the stuck worker was not replaced")
    wait_until(lambda: _post(server, {"ok": 1}, timeout=5).status == 200, 8, "no request was served after the 504")
    assert time.monotonic() - started < 12


def test_an_overrunning_hook_gives_its_slot_back_when_it_returns(
    at_the_deadline: tuple[str, ...], plugin_site: Any, servers: Any
) -> None:
    """Under --threads 1, a predict_fn that overruns --timeout by less than the grace is answered 504; the next
    request gets the model thread once that hook returns and is served, and the worker is not replaced."""
    plugin_site.add("sleeper", SLEEPER)
    server = servers.start(*at_the_deadline, "--timeout", "2", "--threads", "1")
    workers = server.workers()
    assert _post(server, {"sleep": 2.6}).status == 504
    assert orjson.loads(_post(server, {"ok": 1}).body) == {"ok": 1}
    time.sleep(2)  # past the first request's grace: it returned in time, so nothing asks to be replaced
    assert "asks to be replaced" not in server.output()
    assert server.workers() == workers


def test_a_request_still_waiting_for_the_model_at_its_deadline_never_reaches_it(
    at_the_deadline: tuple[str, ...], plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """Under --threads 1, a request queued behind a 4 s prediction is answered 504 at its 2 s deadline, and its
    predict_fn is never called, even once the model thread is free."""
    plugin_site.add("sleeper", SLEEPER)
    server = servers.start(*at_the_deadline, "--timeout", "2", "--threads", "1")
    called = tmp_path / "called"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, server, {"sleep": 3.5})
        server.wait_arrived(1)
        second = pool.submit(_post, server, {"called": str(called)})
        assert second.result().status == 504
        assert first.result().status == 504
    assert orjson.loads(_post(server, {"ok": 2}).body) == {"ok": 2}  # after the model thread freed up
    assert not called.exists()


#: A sync model that sleeps ``data["sleep"]`` seconds (a number, or an array of one under v2) and says so.
SLOW = """
    import time

    import numpy

    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        seconds = float(numpy.ravel(data["sleep"])[0])
        time.sleep(seconds)
        return {"slept": numpy.asarray([seconds])}
"""

#: Each route that invokes the model besides ``/invocations``, with the front it is tried on (both fronts in all).
INVOKING = [
    ("asgi", "/endpoints/e/invocations"),
    ("rsgi", "/endpoints/e/invocations-response-stream"),
    ("rsgi", "/v2/models/m/infer"),
    ("asgi", "/models/m/invoke"),
    ("gunicorn", "/endpoints/e/invocations"),
    ("gunicorn", "/endpoints/e/invocations-response-stream"),
    ("gunicorn", "/v2/models/m/infer"),
    ("gunicorn", "/models/m/invoke"),
    ("wsgi", "/endpoints/e/invocations"),
    ("wsgi", "/endpoints/e/invocations-response-stream"),
    ("wsgi", "/v2/models/m/infer"),
    ("wsgi", "/models/m/invoke"),
]


def _start_for(route: str, interface: str, servers: Any, tmp_path: Path, *options: str) -> Any:
    """A server of model ``m`` on ``interface`` for ``route``: of several models, ``m`` loaded, for ``/models``."""
    front = (*AT_THE_DEADLINE[interface], "--model-name", "m", *options)
    if not route.startswith("/models/"):
        return servers.start(*front)
    root = tmp_path / "root"
    (root / "m").mkdir(parents=True)
    server = servers.start(*front, "--multi-model", "--model-root", str(root))
    loaded = server.request("POST", "/models", orjson.dumps({"model_name": "m", "url": str(root / "m")}), JSON)
    assert loaded.status == 200, loaded.body
    return server


def _sleep_body(route: str, seconds: float) -> bytes:
    if route.startswith("/v2/"):
        return orjson.dumps({"inputs": [{"name": "sleep", "datatype": "FP64", "shape": [1], "data": [seconds]}]})
    return orjson.dumps({"sleep": seconds})


@pytest.mark.parametrize(("interface", "route"), INVOKING)
def test_every_route_that_invokes_the_model_answers_at_the_deadline(
    interface: str, route: str, plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """SageMaker Runtime's routes, v2's infer and /models/{name}/invoke answer at the deadline too: a sync predict_fn
    sleeping 8 s under --timeout 1 is answered before its sleep ends (504; Runtime's 424 ModelError wrapping it),
    and the next request is served on the other model thread meanwhile."""
    plugin_site.add("slow", SLOW)
    server = _start_for(route, interface, servers, tmp_path, "--timeout", "1", "--threads", "2")
    started = time.monotonic()
    answer = server.request("POST", route, _sleep_body(route, 8), JSON, timeout=30)
    assert time.monotonic() - started < 8
    if route.startswith("/endpoints/"):
        assert answer.status == 424, answer.body
        error = orjson.loads(answer.body)
        assert error["OriginalStatusCode"] == 504
        assert "timeout of 1 s" in error["OriginalMessage"]
    else:
        assert answer.status == 504, answer.body
        assert "timeout of 1 s" in answer.body.decode()
    served = server.request("POST", route, _sleep_body(route, 0), JSON, timeout=30)
    assert served.status == 200, served.body
    assert time.monotonic() - started < 8


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_stalled_bodies_are_answered_408_without_holding_threads(front: tuple[str, ...], servers: Any) -> None:
    """500 clients that send half a body and stop are each answered 408 after --read-timeout, while the worker's
    thread count stays that of an idle worker (a stalled body waits on the loop) and /ping answers throughout."""
    server = servers.start(*front, "--read-timeout", "3", "--metrics", plugins=[])
    [worker] = server.workers()
    idle = _threads(worker)
    held = []
    try:
        for _ in range(500):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
            sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
            held.append(sock)
        server.wait_in_flight(500)
        assert _threads(worker) <= idle + 2
        assert server.request("GET", "/ping", timeout=2).status == 200
        for sock in held:
            assert sock.recv(200).startswith(b"HTTP/1.1 408")
    finally:
        for sock in held:
            sock.close()
    assert _threads(worker) <= idle + 2
    assert server.request("POST", "/invocations", b"fine").body == b"fine"


#: A sync model that takes 0.3 s a call and answers each row with the size of the group it ran in.
GROUPED = """
    import time

    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        time.sleep(0.3)
        return [[len(data), row[0]] for row in data]
"""


@pytest.mark.parametrize(
    ("interface", "route"), [("asgi", "/invocations"), ("rsgi", "/invocations"), ("rsgi", "/models/m/invoke")]
)
def test_micro_batched_requests_wait_on_the_loop(
    interface: str, route: str, plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """64 requests to a micro-batching model (--max-batch-size 32, --threads 1), through /invocations or a
    multi-model endpoint's /models/{name}/invoke, wait for their groups on the loop: the worker's thread count stays
    that of an idle worker plus its model thread while they wait, they share calls, and each gets its own rows
    back."""
    plugin_site.add("grouped", GROUPED)
    options = ("--max-batch-size", "32", "--threads", "1", "--metrics")
    server = _start_for(route, interface, servers, tmp_path, *options)
    [worker] = server.workers()
    idle = _threads(worker)

    def post(rows: Any) -> Any:
        return server.request("POST", route, orjson.dumps(rows), JSON, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = [pool.submit(post, [[i, i]]) for i in range(64)]
        server.wait_in_flight(40)
        assert _threads(worker) <= idle + 2
        rows = [orjson.loads(answer.result().body) for answer in answers]
    assert [row[0][1] for row in rows] == list(range(64))
    assert max(row[0][0] for row in rows) > 1


def test_a_micro_batched_request_past_its_deadline_never_runs(
    at_the_deadline: tuple[str, ...], plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """--timeout 1, one model thread busy for 2.5 s: the request it runs for is answered 504 before it ends;
    requests queued for a group are answered 504 at their deadline ("waiting for the model"), leave the queue, and
    never reach predict_fn."""
    calls = tmp_path / "calls"
    plugin_site.add("logged", f"""
        import time

        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            with open({str(calls)!r}, "a") as log:
                log.write(f"{{len(data)}}\\n")
            time.sleep(data[0][1])
            return data
    """)  # fmt: skip
    server = servers.start(*at_the_deadline, "--max-batch-size", "2", "--threads", "1", "--timeout", "1")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        started = time.monotonic()
        busy = pool.submit(_post, server, [[0, 2.5]])
        wait_until(calls.exists, 10, "the busy call did not begin")
        queued = [pool.submit(_post, server, [[i, 0]]) for i in (1, 2)]
        for answer in queued:
            assert answer.result().status == 504
            assert "waiting for the model" in orjson.loads(answer.result().body)["message"]
        assert busy.result().status == 504
        assert time.monotonic() - started < 2.5
    wait_until(lambda: _post(server, [[3, 0]]).status == 200, 10, "no request was served once the model was free")
    assert calls.read_text().split() == ["1", "1"]  # the busy call and the last: the queued ones never ran


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _hpack_literal(name: bytes, value: bytes) -> bytes:
    """A header as HPACK's literal field without indexing, new name, no Huffman coding (RFC 7541, 6.2.2)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


def _h2_stalled_streams(port: int, streams: int) -> socket.socket:
    """An HTTP/2 connection with ``streams`` POSTs to /invocations, each sending 10 of its 1,000 bytes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, b"")
    head = b"".join(
        _hpack_literal(name, value)
        for name, value in (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/invocations"),
            (b":authority", b"x"),
            (b"content-length", b"1000"),
        )
    )
    for index in range(streams):
        stream = 1 + 2 * index
        data += _h2_frame(1, 0x4, stream, head) + _h2_frame(0, 0, stream, b"0123456789")
    sock.sendall(data)
    return sock


def _h2_heads(sock: socket.socket, streams: int, deadline: float) -> dict[int, bytes]:
    """The HEADERS frames' payloads the server sends back, by stream, until each of ``streams`` has one (HPACK
    coded: the statuses are read from the server's metrics)."""
    received, buffer, end = {}, b"", time.monotonic() + deadline
    while len(received) < streams and time.monotonic() < end:
        with contextlib.suppress(TimeoutError):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, stream = buffer[3], int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            if kind == 1:
                received[stream] = buffer[9 : 9 + length]
            buffer = buffer[9 + length :]
    return received


def test_stalled_http2_streams_are_answered_408_and_sigterm_does_not_wait_for_them(
    front: tuple[str, ...], servers: Any
) -> None:
    """With --http2, 50 connections of 10 streams each sending half a body are answered 408 after --read-timeout
    (no thread held meanwhile); their clients then leave without a word, and SIGTERM exits 0 long before the
    graceful timeout."""
    server = servers.start(
        *front, "--http2", "--read-timeout", "3", "--graceful-timeout", "60", "--metrics", plugins=[]
    )
    [worker] = server.workers()
    idle = _threads(worker)
    held = [_h2_stalled_streams(server.port, 10) for _ in range(50)]
    try:
        for sock in held:
            assert len(_h2_heads(sock, 10, 30)) == 10
        assert server.metric("inference_server_requests_total", route="/invocations", status="408") == 500
        assert _threads(worker) <= idle + 2
        abandoned = [_h2_stalled_streams(server.port, 10) for _ in range(5)]  # in flight, then their clients leave
        server.wait_in_flight(50)
        for sock in abandoned:
            sock.close()
    finally:
        for sock in held:
            sock.close()
    started = time.monotonic()
    assert server.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - started < 30


ASGI = ("--server", "granian", "--granian-interface", "asgi")


def _raw(port: int, data: bytes, wait: float = 10) -> bytes:
    """Send ``data`` on a fresh connection; what comes back until the server closes it or ``wait`` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


def test_a_chunked_body_is_verified_on_asgi(servers: Any) -> None:
    """On the ASGI front a chunked body under a body limit is read and served (granian's RSGI and WSGI refuse it
    with 411), and one whose connection ends before its last chunk is a 400 that never reaches the model."""
    server = servers.start(*ASGI, "--metrics", plugins=[])
    whole = _raw(
        server.port,
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    assert whole.startswith(b"HTTP/1.1 200"), whole[:200]
    assert whole.endswith(b"hello world")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nhe"
        )
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            sock.recv(1000)  # (the server may answer 400 to a client that has gone: nobody reads it)
    wait_until(
        lambda: server.metric("inference_server_requests_total", route="/invocations", status="400") == 1,
        10,
        "the body cut short was not answered 400",
    )
    reply = server.request("POST", "/invocations", b"after", {"Content-Type": "text/plain"})
    assert reply.body == b"after"


STREAM_FAILS = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        def records():
            yield {"record": 1}
            raise RuntimeError("the model failed mid-stream")

        return records()
"""


def test_a_stream_that_fails_midway_is_cut_short_on_asgi(plugin_site: Any, servers: Any) -> None:
    """On the ASGI front a generator that raises after its first record ends the connection without the chunked
    coding's last chunk: the client sees an incomplete body, not a whole one (granian's RSGI cannot do this)."""
    plugin_site.add("fails", STREAM_FAILS)
    server = servers.start(*ASGI)
    connection = server.connection()
    try:
        connection.request("POST", "/invocations", b"{}", JSON)
        response = connection.getresponse()
        assert response.status == 200
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    finally:
        connection.close()
    assert "the model failed mid-stream" in server.output()
    assert server.request("GET", "/ping").status == 200


def test_a_target_model_that_is_not_utf8_is_refused_on_asgi(servers: Any, tmp_path: Path) -> None:
    """On the ASGI front a TargetModel header whose bytes are not ASCII reaches the app's check and is a 400 (granian's
    RSGI drops such a header before the app sees it)."""
    (tmp_path / "models" / "model").mkdir(parents=True)
    server = servers.start(*ASGI, "--model-root", str(tmp_path / "models"), plugins=[])
    answer = _raw(
        server.port,
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n"
        b"X-Amzn-SageMaker-Target-Model: caf\xc3\xa9\r\n\r\n{}",
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"printable ASCII" in answer


#: A sync model that says which thread ran it, after sleeping ``sleep`` seconds.
WHERE = """
    import asyncio
    import threading
    import time

    import inference_server

    def on_a_loop():
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @inference_server.plugin_hook
    def predict_fn(data, model):
        time.sleep(data.get("sleep", 0))
        return {"thread": threading.current_thread().name, "loop": on_a_loop()}
"""


def test_a_quick_model_runs_inline_until_a_call_is_slow(
    at_the_deadline: tuple[str, ...], plugin_site: Any, servers: Any
) -> None:
    """A sync model's first calls run on a model thread; after enough quick ones in a row they run on the loop's
    thread (on granian's WSGI interface: the server's thread), no hand-off, and a slow call there sends them back to
    the model threads. (How quick a call is counts its wall time, so a loaded machine may take more calls to get
    there: the test waits for it, within 60 s.)"""
    plugin_site.add("where", WHERE)
    server = servers.start(*at_the_deadline)

    def thread(**value: Any) -> str:
        return str(orjson.loads(_post(server, value).body)["thread"])

    assert thread().startswith("model")
    wait_until(lambda: not thread().startswith("model"), 60, "the quick model's calls never ran on the loop")
    slow_inline = False
    deadline = time.monotonic() + 60
    while not slow_inline and time.monotonic() < deadline:
        if not thread().startswith("model"):  # inline now: the next call, a slow one, runs inline too
            slow_inline = not thread(sleep=0.15).startswith("model")
    assert slow_inline, "no slow call ran inline"
    assert thread().startswith("model")


ASYNC_SLEEPER = """
    import asyncio

    import inference_server

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        await asyncio.sleep(data.get("sleep", 0))
        return data
"""


@pytest.mark.skipif(bool(GRANIAN_INTERFACE), reason="TEST_GRANIAN_INTERFACE chooses every server's interface")
def test_granian_serves_an_async_model_on_the_asgi_front_unless_told(plugin_site: Any, servers: Any) -> None:
    """On granian with no --granian-interface, a model with an async def hook is served through the ASGI front (said
    at start-up): its predict_fn awaiting 12 s under --timeout 2 is answered 504 before it ends; with
    --granian-interface wsgi it is not (and its hooks, on a model thread, are answered 504 at the deadline too); a
    model of sync hooks stays on the WSGI interface (its hooks never on an event loop)."""
    plugin_site.add("sleeper", ASYNC_SLEEPER)
    server = servers.start("--server", "granian", "--timeout", "2")
    assert "granian's ASGI interface (the event-loop front): a hook is async def" in server.output()
    started = time.monotonic()
    assert _post(server, {"sleep": 12}).status == 504
    assert time.monotonic() - started < 12
    told = servers.start("--server", "granian", "--timeout", "1", "--granian-interface", "wsgi")
    assert "the event-loop front" not in told.output()
    started = time.monotonic()
    assert _post(told, {"sleep": 2}).status == 504
    assert time.monotonic() - started < 2
    plugin_site.add("where", WHERE)
    synchronous = servers.start("--server", "granian", plugins=["where"])
    assert "the event-loop front" not in synchronous.output()
    assert not any(orjson.loads(_post(synchronous, {}).body)["loop"] for _ in range(40))


# -- in process, through the ASGI interface as a server drives it ------------------------------------------------------


class _Streams:
    """A model whose prediction is a generator of ``data["items"]``, raising at index ``fail_at``; counts closings."""

    def __init__(self) -> None:
        self.closed = 0

    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        def made() -> Any:
            try:
                for index, item in enumerate(data["items"]):
                    if index == data.get("fail_at"):
                        raise RuntimeError("the model failed mid-stream")
                    yield item
            finally:
                self.closed += 1

        return made()


class _Worker:
    """The worker's count of requests in flight, as the drain reads it."""

    draining, draining_since, inside = False, 0.0, 0

    def enter(self) -> None:
        self.inside += 1

    def leave(self) -> None:
        self.inside -= 1

    def request_recycle(self, reason: str, kind: str = "stuck") -> None:
        raise AssertionError(reason)


@pytest.fixture(autouse=True)
def _own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process tests' front adopts their ``asyncio.run`` loop as the process's: forgotten after each test, so
    that later tests in this process start a loop of their own for async hooks."""
    monkeypatch.setattr(_loop, "_running", None)


def _asgi_front(*plugins: object, **settings: Any) -> tuple[AsgiFront, _Worker]:
    app = App(Settings(model_dir="/nonexistent", **settings), _plugins.build_manager([], list(plugins)))
    app.worker = worker = _Worker()
    return AsgiFront(app), worker


async def _drive(front: AsgiFront, path: str, value: Any, send: Any) -> None:
    """One POST of ``value`` as JSON to ``path``, its answer's messages handed to ``send``."""
    body = orjson.dumps(value)
    headers = [(b"host", b"x"), (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "http_version": "1.1",
             "scheme": "http", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "headers": headers}  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # (the client stays: no http.disconnect)
        raise AssertionError("not reached")

    await front(scope, receive, send)


STREAMED_ROUTES = ["/invocations", "/endpoints/e/invocations-response-stream"]


@pytest.mark.parametrize("path", STREAMED_ROUTES)
def test_a_stream_whose_head_cannot_be_sent_is_closed_and_leaves_the_drain(path: str) -> None:
    """A server whose send raises at the answer's head (the client gone, as ASGI allows): the stream's generator is
    closed and the request leaves the worker's count of requests in flight, so a drain does not wait for it."""
    streams = _Streams()
    front, worker = _asgi_front(streams)

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client went away")

    with contextlib.suppress(OSError):
        asyncio.run(_drive(front, path, {"items": [1, 2, 3]}, send))
    assert (streams.closed, worker.inside) == (1, 0)


@pytest.mark.parametrize("path", ["/invocations", "/endpoints/e/invocations"])
def test_a_stream_cut_midway_is_logged_with_the_bytes_it_sent(path: str, caplog: pytest.LogCaptureFixture) -> None:
    """A stream whose model fails after two records of 1,000 characters is cut; its access line counts what was
    sent before (each record's JSON line, 1,003 bytes), not 0."""
    front, _ = _asgi_front(_Streams(), access_log=True)
    caplog.set_level(logging.INFO, "inference_server.access")

    async def send(message: dict[str, Any]) -> None:
        return None

    with contextlib.suppress(StreamFailed):
        asyncio.run(_drive(front, path, {"items": ["a" * 1000, "b" * 1000, "c"], "fail_at": 2}, send))
    [line] = [record.getMessage() for record in caplog.records if record.name == "inference_server.access"]
    assert line.endswith(" 2006 B out"), line


def test_a_whole_answer_is_framed_as_events_one_at_a_time_on_the_loop() -> None:
    """A 64 MiB whole answer on the response-stream route goes out as four PayloadPart events of 16 MiB carrying its
    bytes in order, each framed when the server asks for it: the memory the request takes at its peak is the answer
    and a few events, never the answer framed whole beside it."""
    size = 64 << 20

    class Big:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            return b"\x07" * size

        @plugin_hook
        def output_fn(self, prediction: Any, accept: Any) -> Any:
            return prediction, "application/octet-stream"

    front, worker = _asgi_front(Big())
    sizes = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            events = botocore.eventstream.EventStreamBuffer()  # (each message one whole event)
            events.add_data(message["body"])
            [event] = list(events)
            assert event.payload == b"\x07" * len(event.payload)
            sizes.append(len(event.payload))

    tracemalloc.start()
    try:
        asyncio.run(_drive(front, "/endpoints/e/invocations-response-stream", [1], send))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sizes == [16 << 20] * 4
    assert peak < size + 4 * (16 << 20), f"{peak >> 20} MiB"
    assert worker.inside == 0
