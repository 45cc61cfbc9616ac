"""Hostile clients over raw sockets, on both backends: each attack gets a 4xx (never a 500), the server keeps
answering ``/ping`` within 2 s during and after, and memory stays bounded where memory is the point.

The attacks are those of issue 12's attack run; each test names the one it pins.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import io
import json
import resource
import socket
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference_server import codecs
from inference_server.server.granian import READ_BUFFER
from tests.conftest import GRANIAN_INTERFACE, wait_until

NPY = "application/x-npy"


@pytest.fixture(params=["granian", "gunicorn"])
def server(request: pytest.FixtureRequest, servers: Any) -> Any:
    """A one-worker server with the default echo hooks on each backend."""
    started = servers.start("--server", request.param, "--read-timeout", "3", plugins=[])
    started.backend = request.param
    return started


def _raw(port: int, data: bytes, *, half_close: bool = False, wait: float = 3.0) -> bytes:
    """Send ``data`` on a fresh connection and read what comes back until the server closes or ``wait`` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + wait
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
                if b"\r\n\r\n" in received and not half_close and _complete(received):
                    break
        return received


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _status(received: bytes) -> int:
    assert received.startswith(b"HTTP/1."), received[:200]
    return int(received.split(b" ", 2)[1])


def _wait_for_the_write_timeout(server: Any) -> None:
    """On granian, wait until the worker has set its write timeout (TCP_USER_TIMEOUT) on its listening socket, which
    it does once granian has opened it, just after the model loads; gunicorn sets it on each connection."""
    if server.backend == "granian":
        wait_until(lambda: "clients that stop reading are cut" in server.output(), 10, "no write timeout was set")


def _ping_fast(server: Any) -> None:
    """``/ping`` answers 200 within 2 s."""
    started = time.monotonic()
    assert server.request("GET", "/ping", timeout=2).status == 200
    assert time.monotonic() - started < 2


def _refuses_chunked(backend: str, limit: str) -> bool:
    """Whether ``backend`` refuses chunked bodies with 411 under a body limit: granian, which cannot tell the app
    whether one arrived whole, unless through the ASGI front, which can."""
    return backend == "granian" and limit != "0" and GRANIAN_INTERFACE != "asgi"


def _worker_rss(server: Any) -> int:
    [worker] = server.workers()
    for line in Path(f"/proc/{worker}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_stalled_bodies_never_wedge_the_worker(server: Any) -> None:
    """Attack 1: 40 clients send the headers of a 1,000-byte body, 10 bytes, then silence (more than the server's
    33 threads): others are served throughout; gunicorn answers each 408 after --read-timeout; granian keeps the
    connections until their clients leave (before: one such client on granian, or 33 on gunicorn, froze /ping)."""
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(40)]
    try:
        for sock in held:
            sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        for _ in range(5):  # across the read timeout (3 s)
            _ping_fast(server)
            time.sleep(1)
        if server.backend == "gunicorn":
            for sock in held:
                sock.settimeout(3)
                assert sock.recv(200).startswith(b"HTTP/1.1 408")
    finally:
        for sock in held:
            sock.close()
    _ping_fast(server)
    assert server.request("POST", "/invocations", b"fine").body == b"fine"


@pytest.mark.parametrize(
    "chunks",
    [
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"5;" + b"e" * 100_000 + b"\r\nhello\r\n0\r\n\r\n",
        b"3\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n",
    ],
    ids=["plus", "hex-prefix", "negative", "huge-extension", "data-longer-than-size", "trailer-content-length"],
)
def test_malformed_chunked_bodies_are_400_on_gunicorn(servers: Any, chunks: bytes) -> None:
    """Attack 4 on gunicorn: malformed chunk framing is a 400 saying so, never a 500; gunicorn closes the
    connection when it cannot parse what follows. (granian: test_a_chunked_body_cut_short_never_reaches_the_model.)"""
    server = servers.start("--server", "gunicorn", plugins=[])
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    received = _raw(server.port, head + chunks)
    if received:  # gunicorn may also refuse to parse the request at all and close
        assert 400 <= _status(received) < 500, received[:300]
        if _status(received) == 400 and b"application/json" in received:
            assert b"the chunked body is malformed" in received
    _ping_fast(server)


CUT_SHORT = {
    "mid-data": b"a\r\nhello",
    "after-a-chunk": b"5\r\nhello\r\n",
    "mid-size": b"5\r\nhello\r\n1",
}


@pytest.mark.parametrize("limit", ["6", "0"])
@pytest.mark.parametrize("cut", list(CUT_SHORT))
@pytest.mark.parametrize("name", ["granian", "gunicorn"])
def test_a_chunked_body_cut_short_never_reaches_the_model(
    servers: Any, tmp_path: Path, name: str, cut: str, limit: str
) -> None:
    """A chunked body whose client stops sending before the last chunk (half-closing the connection) never
    reaches the model: gunicorn answers 400 (not its NoMoreData 500); granian answers 411 before reading it while
    bodies have a limit (400 through its ASGI front, which verifies), and 400 without one (its whole-body read
    answers nothing for a broken body). The server
    keeps serving, and a whole chunked body still reaches the model."""
    calls = tmp_path / "calls"
    servers.plugin_site.add(
        "recording",
        f"""
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            with open({str(calls)!r}, "ab") as out:
                out.write(bytes(data) + b"|")
            return data
        """,
    )
    server = servers.start("--server", name, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": limit})
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n"
    received = _raw(server.port, head + CUT_SHORT[cut], half_close=True)
    expected = 411 if _refuses_chunked(name, limit) else 400
    if received:  # (a server may also close without answering a request it cannot finish reading)
        assert _status(received) == expected, received[:300]
    else:
        assert name == "granian", "gunicorn answers a body cut short"
    _ping_fast(server)
    assert not calls.exists(), calls.read_bytes()
    whole = _raw(server.port, head + b"5\r\nhello\r\n0\r\n\r\n")
    if expected == 411:
        assert _status(whole) == 411
        assert not calls.exists()
    else:
        assert _status(whole) == 200
        assert calls.read_bytes() == b"hello|"


@pytest.mark.parametrize(
    "array",
    [
        np.arange(3, dtype=">f8"),
        np.array([1 + 2j, 3j]),
        np.array([1, 2], dtype="m8[s]"),
        np.array([b"ab", b"\xff\xfe"], dtype="S5"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
    ],
    ids=["big-endian", "complex", "timedelta", "bytes", "structured"],
)
@pytest.mark.parametrize("accept", ["application/json", "text/csv", "application/jsonlines"])
def test_valid_npy_bodies_are_answered_or_refused_never_500(server: Any, array: Any, accept: str) -> None:
    """Attack 3: an echo of an unusual but valid npy dtype as a text format is 200 or a 406 listing the options."""
    reply = server.request("POST", "/invocations", codecs.dumps(array, NPY), {"Content-Type": NPY, "Accept": accept})
    assert reply.status in (200, 406), reply.body[:300]
    if reply.status == 406:
        assert "it can be sent as: application/x-npy" in reply.json()["message"]


def test_big_endian_arrays_are_sent_as_json(server: Any) -> None:
    """Attack 3: a big-endian float array is byte-swapped for JSON, not refused."""
    body = codecs.dumps(np.arange(3, dtype=">f8"), NPY)
    reply = server.request("POST", "/invocations", body, {"Content-Type": NPY, "Accept": "application/json"})
    assert (reply.status, reply.json()) == (200, [0.0, 1.0, 2.0])


def test_json_deeper_than_the_encoder_can_answer_is_400(server: Any) -> None:
    """Attack 3: JSON nested 300 deep is refused when decoded (orjson writes at most 255 levels), not a 500 later."""
    body = b"[" * 300 + b"]" * 300
    reply = server.request("POST", "/invocations", body, {"Content-Type": "application/json"})
    assert reply.status == 400
    assert reply.json()["message"] == "JSON nests 300 levels deep; at most 255 are accepted"


def _npy_with_header(header: str, data: bytes) -> bytes:
    raw = header.encode().ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + data


def test_npy_dtypes_np_save_never_writes_are_400(server: Any) -> None:
    """Attack 3 and 9: a zero-size dtype (billions of elements in no bytes) and overlapping fields are 400s."""
    zero = _npy_with_header("{'descr': '|V0', 'fortran_order': False, 'shape': (10000000,), }", b"")
    overlap = _npy_with_header(
        "{'descr': {'names': ['a', 'b'], 'formats': ['<i4', '<i4'], 'offsets': [0, 2], 'itemsize': 8}, "
        "'fortran_order': False, 'shape': (2,), }",
        bytes(16),
    )
    for body, message in [(zero, "a dtype of zero size"), (overlap, "overlapping fields")]:
        reply = server.request("POST", "/invocations", body, {"Content-Type": NPY, "Accept": "text/csv"})
        assert reply.status == 400
        assert message in reply.json()["message"]


def test_npz_members_aliasing_one_another_are_400(server: Any) -> None:
    """Attack 9: an npz whose directory lists one stored member 64 times (64x its size from one body) is a 400."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a.npy", codecs.dumps(np.zeros(1 << 16, dtype=np.uint8), NPY))
    body = buffer.getvalue()
    directory_at = struct.unpack_from("<I", body, len(body) - 6)[0]
    entry, end = body[directory_at:-22], bytearray(body[-22:])
    entries = b"".join(entry.replace(b"a.npy", f"{i:05d}".encode()) for i in range(64))
    struct.pack_into("<HHI", end, 8, 64, 64, len(entries))
    aliased = body[:directory_at] + entries + bytes(end)
    reply = server.request("POST", "/invocations", aliased, {"Content-Type": "application/x-npz"})
    assert reply.status == 400
    assert "overlap in the body" in reply.json()["message"]


def test_many_distinct_huge_accept_headers_do_not_grow_the_worker(server: Any) -> None:
    """Attack 10: 120 distinct 60 KB Accept headers leave no cache holding them (before: +730 MiB for 300)."""
    body, headers = codecs.dumps(np.zeros(4), NPY), {"Content-Type": NPY}
    server.request("POST", "/invocations", body, {**headers, "Accept": "application/json"})
    before = _worker_rss(server)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for i in range(120):
            accept = f"application/x-{i}, " + ", ".join(f"text/x-{i}-{j}" for j in range(4000))[: 60 * 1024]
            connection.request("POST", "/invocations", body, {**headers, "Accept": accept + ", */*"})
            assert connection.getresponse().read() is not None
    finally:
        connection.close()
    assert _worker_rss(server) - before < 64 << 20
    _ping_fast(server)


def test_http2_is_refused_unless_asked_for(servers: Any) -> None:
    """Attack 5: granian speaks HTTP/1.1 only by default (SageMaker's protocol); --http2 turns HTTP/2 on."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
    default = servers.start("--server", "granian", plugins=[])
    answer = _raw(default.port, preface, wait=2)
    assert answer[3:4] != b"\x04"  # no HTTP/2 SETTINGS frame back: an HTTP/1 error or a closed connection
    http2 = servers.start("--server", "granian", "--http2", plugins=[])
    assert _raw(http2.port, preface, wait=2)[3:4] == b"\x04"  # the server's SETTINGS frame


@contextlib.contextmanager
def _open_files(wanted: int) -> Any:
    """Raise this process's soft limit of open files to ``wanted`` (the test's own client sockets) for a while."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit of open files ({hard}) is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    ("backend", "first", "seconds"),
    [("granian", b"", 12), ("gunicorn", b"", 12), ("gunicorn", b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", 6)],
    ids=["granian", "gunicorn", "gunicorn-after-a-request"],
)
def test_slow_header_clients_leave_ping_answering(servers: Any, backend: str, first: bytes, seconds: int) -> None:
    """Attack 6: 2,000 slowloris connections (a header byte a second each, for 12 s) leave /ping answering within
    2 s every time on both backends, also when each first sends a whole request and trickles the next one behind it
    (before: gunicorn gave each a thread of its 1,025 while it read the head, and answered none of 15 pings; granian
    stopped accepting at its 1,024-connection default)."""
    clients = 2000
    server = servers.start("--server", backend, plugins=[])
    with _open_files(clients + 1024):
        held: list[socket.socket] = []
        try:
            for _ in range(clients):
                held.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
                held[-1].sendall(first + b"GET /ping HTTP/1.1\r\nHo")
            if first:  # each whole request answered first: what is timed below is the trickle, not 2,000 pings
                for sock in held:
                    assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "a whole request was not answered"
            for _ in range(seconds):
                started = time.monotonic()
                for sock in held:
                    with contextlib.suppress(OSError):
                        sock.send(b"s")
                _ping_fast(server)
                time.sleep(max(0.0, 1 - (time.monotonic() - started)))
        finally:
            for sock in held:
                sock.close()
    _ping_fast(server)


def test_clients_that_never_read_their_answers_do_not_hold_the_worker(server: Any) -> None:
    """Attack 6: 40 clients pipelining 5 MB echoes and never reading: /ping answers within 2 s once --read-timeout
    (3 s) has passed, on gunicorn because a send that makes no progress for that long closes the connection
    (before: /ping failed for as long as they stayed); granian never stops answering."""
    body = b"x" * 5_000_000
    request = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    def stall() -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.settimeout(8)
        with contextlib.suppress(OSError):
            for _ in range(2):
                sock.sendall(request)
        return sock

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        held = list(pool.map(lambda _: stall(), range(40)))
    try:
        time.sleep(1)
        _ping_fast(server)
        _ping_fast(server)
    finally:
        for sock in held:
            sock.close()
    _ping_fast(server)


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"GET /ping HTTP/9.9\r\nHost: x\r\n\r\n", 400, "HTTP Version"),
        (b"GET /ping HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "Bad Header"),
        (b"GET /ping HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, "headers"),
    ],
    ids=["version", "header-line", "header-size"],
)
def test_gunicorns_own_refusals_have_our_json_error_body(
    servers: Any, request_bytes: bytes, status: int, message: str
) -> None:
    """Attack 7: requests gunicorn refuses before the app sees them get our JSON error shape, not its HTML page."""
    server = servers.start("--server", "gunicorn", plugins=[])
    received = _raw(server.port, request_bytes)
    assert _status(received) == status
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head
    answer = json.loads(body)
    assert answer["status"] == status
    assert message in answer["message"]
    assert answer["request_id"]
    _ping_fast(server)


def test_unfinished_large_heads_hold_at_most_a_read_buffer_each(server: Any) -> None:
    """Attack 11b: 300 connections each sending 300 KB of a head that never ends hold at most granian's read buffer
    (408 KiB, what lets it read bodies in large reads) or gunicorn's 64 KiB each, and /ping answers meanwhile."""
    before = _worker_rss(server)
    held = []
    try:
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            with contextlib.suppress(OSError):  # gunicorn refuses the head once it passes the limit
                sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000)
            held.append(sock)
        _ping_fast(server)
        assert _worker_rss(server) - before < 300 * READ_BUFFER + (32 << 20)
    finally:
        for sock in held:
            sock.close()
    _ping_fast(server)


def test_a_header_section_over_the_limit_is_431_even_in_one_read(server: Any) -> None:
    """Attack 11: 100 headers of 60 KB (6 MB, sent at once) and one of 70 KB are 431 on both backends (before:
    gunicorn parsed 6 MB in 6 s and answered 200; granian passed heads up to about twice the limit)."""
    many = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 60_000) for i in range(100))
    with contextlib.suppress(OSError):  # the server may close before it has read everything
        assert _status(_raw(server.port, b"GET /ping HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")) == 431
    one = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert _status(_raw(server.port, one)) == 431
    assert _status(_raw(server.port, b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000 + b"\r\n\r\n")) == 200
    _ping_fast(server)


def test_several_host_headers_are_400(server: Any) -> None:
    """Attack 12: two Host headers are a 400 on both backends (RFC 9112); gunicorn also refuses none at all
    (granian supplies one of its own for a request without it)."""
    two = _raw(server.port, b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n")
    assert _status(two) == 400
    if server.backend == "gunicorn":
        assert _status(_raw(server.port, b"GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n")) == 400
    assert _status(_raw(server.port, b"GET /ping HTTP/1.0\r\n\r\n")) == 200  # HTTP/1.0 needs no Host


def test_100_continue_only_for_a_body_that_will_be_read(server: Any) -> None:
    """Attack 12: an over-limit body announced with Expect: 100-continue gets its 413 without a 100 Continue first
    (before: gunicorn invited the body, then refused it); an acceptable one gets 100 Continue, then its answer."""
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head % 999_999_999)
        assert sock.recv(100).startswith(b"HTTP/1.1 413")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head % 5)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"hello")
        answer = _raw_rest(sock)
        assert _status(answer) == 200
        assert answer.endswith(b"hello")


def _raw_rest(sock: socket.socket) -> bytes:
    """What follows on a socket until a complete answer has arrived."""
    received = b""
    while not (b"\r\n\r\n" in received and _complete(received)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")


def test_a_non_ascii_custom_attribute_is_never_echoed_empty(server: Any) -> None:
    """Attack 12: a non-ASCII X-Amzn-SageMaker-Custom-Attributes (SageMaker allows ASCII only) is echoed as sent
    on gunicorn and not at all on granian, which hands the app an empty value (before: an empty header)."""
    request = "POST /invocations HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
    request += "X-Amzn-SageMaker-Custom-Attributes: café=1\r\n\r\nhi"
    head = _raw(server.port, request.encode()).partition(b"\r\n\r\n")[0].lower()
    echoed = [line for line in head.split(b"\r\n") if line.startswith(b"x-amzn-sagemaker-custom-attributes:")]
    if server.backend == "granian" and GRANIAN_INTERFACE != "asgi":  # (the ASGI front sees the client's bytes)
        assert echoed == []
    else:
        assert echoed == ["x-amzn-sagemaker-custom-attributes: café=1".encode()]


@pytest.mark.parametrize("accept", ["text/csv", "application/jsonlines"])
def test_large_arrays_as_text_stay_small_in_memory(server: Any, accept: str) -> None:
    """Attack 11: a 6 MB uint8 .npy answered as CSV or JSON Lines (12 MB of text) leaves the worker's peak RSS
    within 128 MiB of where it was (before: 704 and 943 MiB, a Python object per value)."""
    body = codecs.dumps(np.arange(6_000_000, dtype=np.uint8), NPY)
    server.request("POST", "/invocations", codecs.dumps(np.zeros(4), NPY), {"Content-Type": NPY, "Accept": accept})
    [worker] = server.workers()
    before = _peak_rss(worker)
    reply = server.request("POST", "/invocations", body, {"Content-Type": NPY, "Accept": accept}, timeout=60)
    assert reply.status == 200
    assert reply.body.count(b"\n") == 6_000_000
    assert reply.body.startswith(b"0\n1\n2\n")
    assert _peak_rss(worker) - before < 128 << 20
    _ping_fast(server)


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_arrow_stream_declaring_more_than_the_budget_is_413(server: Any) -> None:
    """Attack 9: a 1 KB zstd Arrow stream whose buffer claims 64 GiB decompressed is refused by its declaration
    (before: no bound at all, an OOM kill for ~190 GB declared), and the worker's memory does not move."""
    pa = pytest.importorskip("pyarrow")
    sink = pa.BufferOutputStream()
    table = pa.table({"x": np.zeros(1000, dtype=np.int64)})
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    valid = sink.getvalue().to_pybytes()
    body = bytearray(valid)
    at = body.rindex((8000).to_bytes(8, "little"))
    body[at : at + 8] = (64 << 30).to_bytes(8, "little")
    arrow = {"Content-Type": "application/vnd.apache.arrow.stream"}
    assert server.request("POST", "/invocations", valid, arrow).status == 200  # pyarrow loaded in the worker
    before = _worker_rss(server)
    reply = server.request("POST", "/invocations", bytes(body), {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert reply.status == 413
    assert "decompressed" in reply.json()["message"]
    assert _worker_rss(server) - before < 32 << 20
    _ping_fast(server)


def _established(port: int) -> int:
    """The server's established connections on ``port`` (its side of each), from /proc/net/tcp."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def _never_reading(server: Any, request: bytes, held: list[socket.socket], count: int = 12) -> None:
    """Open ``count`` connections (into ``held``) that send ``request`` and never read its answer (a small window)."""
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: a small window)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(request)


def _until_cut(server: Any, baseline: int, deadline: float) -> float:
    """Seconds until the server holds no more connections than ``baseline``, /ping answering fast meanwhile."""
    started = time.monotonic()
    while _established(server.port) > baseline:
        assert time.monotonic() - started < deadline, f"{_established(server.port)} connections still held"
        _ping_fast(server)
        time.sleep(0.5)
    return time.monotonic() - started


def test_clients_that_stop_reading_are_cut_after_the_read_timeout(server: Any) -> None:
    """Attack 7: twice, 12 clients ask for 5 MB answers and never read them. Each connection is cut once its answer
    has made no progress for --read-timeout (3 s): gunicorn's send timeout, granian's TCP_USER_TIMEOUT (which it has
    no option for); others are served throughout, and the memory the answers held is reused, not kept per client
    (the second wave leaves the worker about as large as the first: 12 leaked answers would be 115 MB)."""
    array = np.random.default_rng(0).random(600_000)  # 4.8 MB of float64
    body = codecs.dumps(array, "application/x-npy")
    head = (
        f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\nAccept: application/x-npy\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    _wait_for_the_write_timeout(server)
    baseline = _established(server.port)
    after = []
    for _ in range(2):
        held: list[socket.socket] = []
        try:
            _never_reading(server, head + body, held)
            cut_after = _until_cut(server, baseline, 30)
        finally:
            for sock in held:
                sock.close()
        assert cut_after >= 2, cut_after  # not before the read timeout (3 s, less the time the answers took to stall)
        time.sleep(1)
        after.append(_worker_rss(server))
    assert after[1] - after[0] < 60 << 20, after  # half the leak: the threads' malloc arenas keep some in reserve
    assert server.request("POST", "/invocations", b"fine").body == b"fine"


def test_clients_that_never_read_an_answer_that_fits_in_the_buffers_are_cut(server: Any) -> None:
    """Attack 7: 12 clients ask for 256 KiB answers, which the server's socket buffers take whole, and never read
    them: each connection is cut once its data has gone unacknowledged for --read-timeout (3 s), on both backends
    (before: gunicorn kept them for its 65 s keep-alive; granian cut them)."""
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    request = head + b"Content-Length: %d\r\n\r\n" % (256 << 10) + bytes(256 << 10)
    _wait_for_the_write_timeout(server)
    baseline = _established(server.port)
    held: list[socket.socket] = []
    try:
        _never_reading(server, request, held)
        _until_cut(server, baseline, 40)
    finally:
        for sock in held:
            sock.close()
    assert server.request("POST", "/invocations", b"fine").body == b"fine"


#: Chunked bodies that a server would wait on for ever (until its read timeout) unless it refuses them at once.
HOSTILE_CHUNKS = {
    "size-2**80": b"%x\r\nhello\r\n0\r\n\r\n" % 2**80,
    "size-2**64+5": b"%x\r\nhello\r\n0\r\n\r\n" % (2**64 + 5),
    "bare-lf": b"5\nhello\n0\n\n",
    "bare-lf-after-size": b"5\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize(("backend", "limit"), [("gunicorn", "6"), ("granian", "6"), ("granian", "0")])
def test_hostile_chunk_sizes_and_bare_lf_framing_are_refused_at_once(servers: Any, backend: str, limit: str) -> None:
    """Attack 4: chunk sizes of 2**80 and 2**64+5 and chunk lines ended by a bare LF are answered at once, long
    before the read timeout (60 s): 400 saying what was wrong on gunicorn (before: no answer until its 408 at
    30 s), 411 on granian while bodies have a limit and 400 without one; on gunicorn a chunk larger than the body
    limit is a 413 at once."""
    server = servers.start("--server", backend, plugins=[], env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": limit})
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    expected = 411 if _refuses_chunked(backend, limit) else 400
    for name, chunks in HOSTILE_CHUNKS.items():
        received = _raw(server.port, head + chunks, wait=10)
        assert received, f"{name}: no answer within 10 s"
        assert _status(received) == expected, (name, received[:300])
        if backend == "gunicorn":
            message = json.loads(received.partition(b"\r\n\r\n")[2])["message"]
            assert ("bare LF" if "lf" in name else "larger than any body can be") in message, message
    if backend == "gunicorn":
        received = _raw(server.port, head + b"%x\r\nhello\r\n" % (1 << 40), wait=10)
        assert _status(received) == 413, received[:300]
        assert b"a chunk of 1099511627776 bytes is larger than the whole body may be" in received
    _ping_fast(server)


def _head_of(size: int, headers: int = 1, start: bytes = b"GET /ping HTTP/1.1\r\nHost: x\r\n") -> bytes:
    """A request (``GET /ping``) whose head (request line, header lines, the empty line) is ``size`` bytes, its
    padding spread over ``headers`` headers written as clients write them (``Name: value``)."""
    names = [b"X-Pad-%d" % i for i in range(headers)]
    pad = size - len(start) - 2 - sum(len(name) + 4 for name in names)
    lines = b"".join(name + b": " + b"a" * (pad // headers + (i < pad % headers)) + b"\r\n" for i, name in
                     enumerate(names))  # fmt: skip
    request = start + lines + b"\r\n"
    assert len(request) == size
    return request


@pytest.mark.parametrize("headers", [1, 90])
def test_the_head_limit_is_exact(server: Any, headers: int) -> None:
    """Attack 12: a head of exactly --max-header-bytes (64 KiB) is served and one byte more is 431, on both
    backends, in one header or spread over 90 (before: 65,537 bytes were accepted)."""
    assert _status(_raw(server.port, _head_of(65536, headers))) == 200
    assert _status(_raw(server.port, _head_of(65537, headers))) == 431
    assert _status(_raw(server.port, _head_of(65536 + 100, headers))) == 431
    post = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    echoed = _raw(server.port, _head_of(65536, headers, post) + b"hello")  # (the body in the same reads as the head)
    assert (_status(echoed), echoed[-5:]) == (200, b"hello")
    assert _status(_raw(server.port, _head_of(65537, headers, post) + b"hello")) == 431
    _ping_fast(server)


def test_transfer_codings_other_than_chunked_are_400_saying_so(server: Any) -> None:
    """Attack 12: a Transfer-Encoding other than chunked alone is a 400 on both backends, whose message (where the
    server lets the app answer) names the coding the request used (before: gunicorn answered some 501 "the server
    failed to handle the request")."""
    for coding in [b"gzip", b"foo", b"gzip, chunked", b"foo, chunked", b"chunked, chunked"]:
        request = b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %s\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        received = _raw(server.port, request % coding)
        assert _status(received) == 400, (coding, received[:300])
        head, _, body = received.partition(b"\r\n\r\n")
        if server.backend == "gunicorn" or b"application/json" in head:
            message = json.loads(body)["message"]
            assert "Transfer-Encoding" in message or "TRANSFER-ENCODING" in message, (coding, message)
    _ping_fast(server)


def test_compressed_bodies_decompress_to_at_most_ten_times_the_body_limit(server: Any, npz_bomb: Any) -> None:
    """Attack 9: a few-KB zstd Arrow stream and a 64 KB deflated .npz that decompress to 64 MiB, over 10 x the 6 MB
    body limit (60 MiB), are 413s naming the ratio, refused before they are inflated; the worker keeps serving and
    its memory does not move; what decompresses to 40 MiB is served (before: anything up to 1 GiB was inflated, a
    33.7 KB body became a 1 GiB array)."""
    pa = pytest.importorskip("pyarrow")

    def arrow(rows: int) -> bytes:
        sink = pa.BufferOutputStream()
        table = pa.table({"x": np.zeros(rows, dtype=np.int64)})
        with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    stream = {"Content-Type": "application/vnd.apache.arrow.stream"}
    npz = {"Content-Type": "application/x-npz", "Accept": "application/json"}
    assert server.request("POST", "/invocations", arrow(10), stream).status == 200  # pyarrow loaded in the worker
    before = _worker_rss(server)
    for body, headers, what in [
        (arrow(8 << 20), stream, "batches would hold 67108864 bytes decompressed"),
        (npz_bomb(64), npz, "npz members would inflate to 67108992 bytes"),
    ]:
        assert len(body) < 128 << 10
        reply = server.request("POST", "/invocations", body, headers)
        assert reply.status == 413, reply.body[:300]
        message = reply.json()["message"]
        assert what in message, message
        assert "at most 62914560 bytes are allowed: 10 x the body limit of 6 MB (MaxPayloadInMB)" in message, message
        _ping_fast(server)
    assert _worker_rss(server) - before < 32 << 20
    small = server.request("POST", "/invocations", npz_bomb(40), {"Content-Type": "application/x-npz"}, timeout=60)
    assert small.status == 200, small.body[:300]
