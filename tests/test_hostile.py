"""Hostile clients over raw sockets, on both backends: each attack gets a 4xx (never a 500), the server keeps
answering ``/ping`` within 2 s during and after, and memory stays bounded where memory is the point.

The attacks are those of issue 12's attack run; each test names the one it pins.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference_server import codecs

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


def _ping_fast(server: Any) -> None:
    """``/ping`` answers 200 within 2 s."""
    started = time.monotonic()
    assert server.request("GET", "/ping", timeout=2).status == 200
    assert time.monotonic() - started < 2


def _worker_rss(server: Any) -> int:
    [worker] = server.workers()
    for line in Path(f"/proc/{worker}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_stalled_body_never_wedges_the_worker(server: Any) -> None:
    """Attack 1: headers of a 1,000-byte body, 10 bytes, then silence: others are served throughout; gunicorn
    answers 408 after --read-timeout and closes; granian keeps the connection until the client leaves."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        for _ in range(5):  # across the read timeout (3 s)
            _ping_fast(server)
            time.sleep(1)
        if server.backend == "gunicorn":
            sock.settimeout(3)
            assert sock.recv(200).startswith(b"HTTP/1.1 408")
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
    connection when it cannot parse what follows.
    (granian hands the app a short body without telling it the framing was broken: known, not fixable here.)"""
    server = servers.start("--server", "gunicorn", plugins=[])
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    received = _raw(server.port, head + chunks)
    if received:  # gunicorn may also refuse to parse the request at all and close
        assert 400 <= _status(received) < 500, received[:300]
        if _status(received) == 400 and b"application/json" in received:
            assert b"the chunked body is malformed" in received
    _ping_fast(server)


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
    """Attack 10: 300 distinct 60 KB Accept headers leave no cache holding them (before: +730 MiB)."""
    body, headers = codecs.dumps(np.zeros(4), NPY), {"Content-Type": NPY}
    server.request("POST", "/invocations", body, {**headers, "Accept": "application/json"})
    before = _worker_rss(server)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for i in range(300):
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
