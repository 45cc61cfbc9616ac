"""Request bodies sent compressed (Content-Encoding gzip or deflate): decoded before any hook sees them, on both
backends and granian's event-loop fronts, within the body limit counted on the decoded bytes (a decompression bomb is
a 413 that costs the worker no more than the limit), an unknown coding 415, data that is not what it says 400; and
answers compressed when the client accepts it."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference_server.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from inference_server.wsgi._body import decoded

JSON = {"Content-Type": "application/json"}
MB = 1 << 20


def _decode(body: bytes, coding: str, limit: int | None = 1 << 20) -> bytes:
    return bytes(decoded({"HTTP_CONTENT_ENCODING": coding}, body, limit))


def test_gzip_deflate_and_identity_bodies_decode_in_the_order_applied() -> None:
    """gzip (and x-gzip), deflate with zlib's header or raw (as some clients send it), identity, and two codings
    applied one after the other (listed in that order) all give back the original bytes."""
    data = b'{"instances": [[1, 2, 3]]}' * 100
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert _decode(gzip.compress(data), "gzip") == data
    assert _decode(gzip.compress(data), "X-Gzip") == data
    assert _decode(zlib.compress(data), "deflate") == data
    assert _decode(raw.compress(data) + raw.flush(), "deflate") == data
    assert _decode(data, "identity") == data
    assert _decode(gzip.compress(zlib.compress(data)), "deflate, gzip") == data
    assert decoded({}, data, 10) is data  # (no coding: the body as it is)


@pytest.mark.parametrize(
    ("body", "coding", "error", "message"),
    [
        (b"not compressed at all", "gzip", BadRequest, "is not gzip data"),
        (gzip.compress(b"x" * 1000, mtime=0)[:-12], "gzip", BadRequest, "is cut short"),
        (zlib.compress(b"x" * 1000) + b"tail", "deflate", BadRequest, "4 bytes after its compressed stream"),
        (b"...", "br", UnsupportedMediaType, "Content-Encoding 'br' is not supported"),
        (b"...", "gzip, compress", UnsupportedMediaType, "'gzip, compress' is not supported"),
    ],
    ids=["not gzip", "cut short", "trailing bytes", "br", "compress"],  # (gzip's header holds the time: no ids of it)
)
def test_bodies_that_are_not_what_they_say_are_refused_saying_why(
    body: bytes, coding: str, error: type[Exception], message: str
) -> None:
    """Data that is not gzip, a stream cut short, bytes after the stream: 400; a coding not decoded here: 415."""
    with pytest.raises(error, match=message):
        _decode(body, coding)


def test_a_body_that_inflates_past_the_limit_stops_at_the_limit() -> None:
    """64 MB of zeros in 64 KB of deflate with a 1 MB limit: 413 naming both sizes, after at most the limit was
    inflated (the decoder is asked for limit + 1 bytes, not for all of it)."""
    bomb = zlib.compress(bytes(64 * MB), 9)
    assert len(bomb) < 128 << 10
    with pytest.raises(PayloadTooLarge, match=r"deflate decoded, passes the limit .* of 1048576 bytes \(it was"):
        _decode(bomb, "deflate", 1 * MB)
    assert len(_decode(bomb, "deflate", 64 * MB)) == 64 * MB
    assert len(_decode(bomb, "deflate", None)) == 64 * MB  # (no limit: SageMaker's MaxPayloadInMB 0)


def gzipped_zeros(megabytes: int) -> bytes:
    """``megabytes`` MB of zeros as one gzip member, made without compressing them all: after a full flush, deflate
    writes the same bytes for each further MB of zeros, so that block is repeated (the CRC is computed)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    zeros = bytes(MB)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    assert packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH) == block
    crc = 0
    for _ in range(megabytes):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, megabytes * MB & 0xFFFFFFFF)
    return header + block * megabytes + packer.flush() + trailer


def test_the_bomb_is_gzip_of_zeros() -> None:
    """The bomb the servers are sent is what it claims: gzip.decompress gives back the zeros (at 8 MB)."""
    assert gzip.decompress(gzipped_zeros(8)) == bytes(8 * MB)


@pytest.fixture(scope="module")
def gigabyte_bomb() -> bytes:
    """1 GB of zeros, gzip compressed (about 1 MB)."""
    bomb = gzipped_zeros(1024)
    assert len(bomb) < 2 * MB
    return bomb


FRONTS = {
    "granian": ("--server", "granian"),
    "granian rsgi": ("--server", "granian", "--granian-interface", "rsgi"),
    "gunicorn": ("--server", "gunicorn"),
}


@pytest.mark.parametrize("front", list(FRONTS))
def test_a_server_decodes_compressed_bodies_and_refuses_a_bomb_within_its_limit(
    servers: Any, front: str, gigabyte_bomb: bytes
) -> None:
    """Each backend and front: a gzip and a deflate JSON body reach the model decoded; 1 GB of zeros gzipped is 413
    while the worker's resident memory grows by less than 64 MB (the limit is 6 MB); an answer is gzipped when the
    client accepts it; an unknown coding is 415; the server then answers as before."""
    server = servers.start(*FRONTS[front], plugins=[])
    (worker,) = server.workers()
    rows = orjson.dumps({"instances": [[1.5, 2.5]] * 200})
    for coding, packed in (("gzip", gzip.compress(rows)), ("deflate", zlib.compress(rows))):
        reply = server.request("POST", "/invocations", packed, {**JSON, "Content-Encoding": coding})
        assert (reply.status, reply.json()) == (200, orjson.loads(rows)), coding
    before = _rss(worker)
    bomb = server.request("POST", "/invocations", gigabyte_bomb, {**JSON, "Content-Encoding": "gzip"})
    assert bomb.status == 413
    assert "gzip decoded, passes the limit (MaxPayloadInMB) of 6291456 bytes" in bomb.json()["message"]
    assert _rss(worker) - before < 64 * MB
    answer = server.request("POST", "/invocations", gzip.compress(rows), {**JSON, "Content-Encoding": "gzip",
                            "Accept-Encoding": "gzip, deflate"})  # fmt: skip
    assert (answer.status, answer.headers["Content-Encoding"]) == (200, "gzip")
    assert answer.headers["Vary"] == "Accept-Encoding"
    assert int(answer.headers["Content-Length"]) == len(answer.body) < len(rows) // 4
    assert orjson.loads(gzip.decompress(answer.body)) == orjson.loads(rows)
    unknown = server.request("POST", "/invocations", rows, {**JSON, "Content-Encoding": "br"})
    assert unknown.status == 415
    assert "'br' is not supported" in unknown.json()["message"]
    assert server.request("POST", "/invocations", rows, JSON).json() == orjson.loads(rows)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")
