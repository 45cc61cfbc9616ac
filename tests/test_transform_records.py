"""Splitting files into records and packing records into requests, as SageMaker Batch Transform does."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import crc32c as reference_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfrecord.writer import TFRecordWriter

from inference_server._settings import BatchStrategy
from inference_server.errors import TransformError
from inference_server.transform import records

MULTI, SINGLE = BatchStrategy.MULTI_RECORD, BatchStrategy.SINGLE_RECORD


def _split(data: bytes, split_type: str) -> list[records.Record]:
    return list(records.split(io.BytesIO(data), split_type, "in.bin"))


def _recordio(*payloads: bytes) -> bytes:
    """MXNet RecordIO as its published format describes it (dmlc-core recordio.h), written independently here:
    magic, then (flag << 29 | length), data, zero padding to 4 bytes; data holding the magic at a 4-byte boundary is
    written in parts (flag 1 first, 2 middle, 3 last) with the magic left out between them."""
    magic = struct.pack("<I", records.RECORDIO_MAGIC)
    out = b""
    for payload in payloads:
        cuts = [i for i in range(0, len(payload) - 3, 4) if payload[i : i + 4] == magic]
        parts, start = [], 0
        for cut in cuts:
            parts.append(payload[start:cut])
            start = cut + 4
        parts.append(payload[start:])
        for number, part in enumerate(parts):
            flag = 0 if len(parts) == 1 else 1 if number == 0 else 3 if number == len(parts) - 1 else 2
            out += magic + struct.pack("<I", flag << 29 | len(part)) + part + bytes(-len(part) % 4)
    return out


def test_none_is_the_whole_file() -> None:
    """SplitType None: one record, the file's bytes."""
    [record] = _split(b"a\nb\n", "None")
    assert record.payload == record.framed == b"a\nb\n"


def test_lines_keep_their_newline_framed_and_lose_it_as_payload() -> None:
    """Line: records end at \\n (\\r\\n too); blank lines are skipped; offsets count every byte."""
    got = _split(b"1,2\r\n\n3,4\n5,6", "Line")
    assert [(r.index, r.offset, r.framed, r.payload) for r in got] == [
        (0, 0, b"1,2\r\n", b"1,2"),
        (1, 6, b"3,4\n", b"3,4"),
        (2, 10, b"5,6", b"5,6"),
    ]


def test_recordio_from_an_independent_writer() -> None:
    """RecordIO written from the spec (padding, a record holding the magic in three parts) splits back exactly."""
    magic = struct.pack("<I", records.RECORDIO_MAGIC)
    payloads = [b"abc", b"", b"0123" + magic + b"4567" + magic + b"89", b"x" * 9]
    data = _recordio(*payloads)
    got = _split(data, "RecordIO")
    assert [r.payload for r in got] == payloads
    assert b"".join(r.framed for r in got) == data
    assert [r.offset for r in got] == [0, 12, 20, 20 + 8 + 4 + 8 + 4 + 8 + 4]


def test_tfrecord_from_the_tfrecord_package(tmp_path: Path) -> None:
    """TFRecord files written by the ``tfrecord`` package split into their serialized examples, framing intact."""
    path = tmp_path / "data.tfrecord"
    writer = TFRecordWriter(str(path))
    examples = [{"x": (float(i), "float"), "name": (f"n{i}".encode(), "byte")} for i in range(5)]
    for example in examples:
        writer.write(example)
    writer.close()
    data = path.read_bytes()
    got = _split(data, "TFRecord")
    assert [r.payload for r in got] == [TFRecordWriter.serialize_tf_example(e) for e in examples]
    assert b"".join(r.framed for r in got) == data


def test_crc32c_matches_the_crc32c_package() -> None:
    """Our CRC-32C (for TFRecord's length words) agrees with the C implementation."""
    for data in (b"", b"a", struct.pack("<Q", 123456789), bytes(range(256))):
        assert records.crc32c(data) == reference_crc32c.crc32c(data)


@pytest.mark.parametrize(
    ("split_type", "data", "message"),
    [
        ("RecordIO", b"\x00" * 8, "no RecordIO magic number at byte 0"),
        ("RecordIO", _recordio(b"abcdef")[:-3], "cut short"),
        ("TFRecord", struct.pack("<Q", 5) + b"\x00\x00\x00\x00" + b"hello" + bytes(4), "fails its checksum"),
        ("TFRecord", b"\x01\x02", "header at byte 0 is cut short"),
    ],
    ids=["recordio-magic", "recordio-truncated", "tfrecord-crc", "tfrecord-truncated"],
)
def test_broken_framing_fails_the_file_naming_the_byte(split_type: str, data: bytes, message: str) -> None:
    """A file that is not in the split type's framing fails with the file's name and where it broke."""
    with pytest.raises(TransformError, match=f"in.bin: .*{message}"):
        _split(data, split_type)


def test_multirecord_packs_as_many_records_as_fit() -> None:
    """MultiRecord fills each request up to the limit with whole framed records, never more, in order."""
    lines = [b"%03d,abcdef\n" % i for i in range(100)]  # 11 bytes each
    got = list(records.requests(_split(b"".join(lines), "Line"), MULTI, 100, "in.csv"))
    assert [len(request.body) for request in got] == [99] * 11 + [11]
    assert [request.first for request in got] == list(range(0, 100, 9))
    assert b"".join(request.body for request in got) == b"".join(lines)


def test_singlerecord_sends_payloads_without_framing() -> None:
    """SingleRecord sends each record alone, padding and headers removed."""
    got = list(records.requests(_split(_recordio(b"abc", b"defgh"), "RecordIO"), SINGLE, 100, "in.rec"))
    assert [(r.body, r.first, r.count) for r in got] == [(b"abc", 0, 1), (b"defgh", 1, 1)]


def test_a_record_over_the_limit_names_file_index_offset_size_and_limit() -> None:
    """One record larger than MaxPayloadInMB fails its file with where it is and how large."""
    data = b"ok\n" + b"x" * 50 + b"\n"
    with pytest.raises(TransformError, match=r"in.csv: record 1 \(at byte 3\) is 51 bytes, over the limit of 40"):
        list(records.requests(_split(data, "Line"), MULTI, 40, "in.csv"))


def test_no_limit_packs_everything_in_one_request() -> None:
    """MaxPayloadInMB 0 (no limit): MultiRecord sends the whole file in one request."""
    [request] = records.requests(_split(b"a\nb\nc\n", "Line"), MULTI, None, "in.csv")
    assert (request.body, request.count) == (b"a\nb\nc\n", 3)


def test_assemble_with_line_adds_a_newline_after_each_answer() -> None:
    """AssembleWith Line: a newline after each request's answer; None: the answer as it is."""
    assert records.assembled(b"1,2", "Line") == b"1,2\n"
    assert records.assembled(b"1,2", "None") == b"1,2"


def _tfrecords(tmp_path: Path, count: int) -> bytes:
    path = tmp_path / "many.tfrecord"
    writer = TFRecordWriter(str(path))
    for i in range(count):
        writer.write({"x": (float(i), "float"), "name": (b"n" * (i % 23), "byte")})
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("split_type", ["Line", "RecordIO", "TFRecord"])
def test_start_at_finds_the_first_record_at_or_after_any_byte(split_type: str, tmp_path: Path) -> None:
    """From every byte of a file, start_at reads forward to the first record starting there or later (the file's
    end past the last), for independently written RecordIO and TFRecord too, and leaves the stream there."""
    magic = struct.pack("<I", records.RECORDIO_MAGIC)
    data = {
        "Line": b"1,2\r\n\n33,4\n" + b"".join(b"%d\n" % (i * 7) for i in range(40)) + b"last",
        "RecordIO": _recordio(*[b"r" * (i % 9) + (magic if i % 5 == 0 else b"") + b"xy" for i in range(30)]),
        "TFRecord": _tfrecords(tmp_path, 30),
    }[split_type]
    offsets = [record.offset for record in _split(data, split_type)]
    stream = io.BytesIO(data)
    for position in range(len(data) + 1):
        starts = [offset for offset in offsets if offset >= position]
        if split_type == "Line":  # blank lines start no record but do start a line
            starts = [offset for offset in range(position, len(data)) if offset == 0 or data[offset - 1] == 10]
        expected = starts[0] if starts else len(data)
        assert records.start_at(stream, split_type, position, "in") == expected, position
        assert stream.tell() == expected


@pytest.mark.parametrize("split_type", ["Line", "RecordIO", "TFRecord"])
def test_parts_read_apart_are_the_file_read_whole(split_type: str, tmp_path: Path) -> None:
    """Cut into parts of 100 bytes and each part split from its own start, a file gives exactly its records, and
    packing with the part size gives the same requests either way (none spans two parts)."""
    data = {
        "Line": b"".join(b"%d,%s\n" % (i, b"v" * (i % 13)) for i in range(200)),
        "RecordIO": _recordio(*[b"p" * (i % 31) for i in range(60)]),
        "TFRecord": _tfrecords(tmp_path, 60),
    }[split_type]
    size = 100
    whole = _split(data, split_type)
    apart: list[records.Record] = []
    bodies: list[bytes] = []
    for part in range(-(-len(data) // size)):
        stream = io.BytesIO(data)
        start = records.start_at(stream, split_type, part * size, "in")
        these = list(records.split(stream, split_type, "in", start, (part + 1) * size))
        apart += these
        bodies += [request.body for request in records.requests(these, MULTI, 250, "in", size)]
    assert [(r.offset, r.framed) for r in apart] == [(r.offset, r.framed) for r in whole]
    together = list(records.requests(whole, MULTI, 250, "in", size))
    assert [request.body for request in together] == bodies
    for request in together:
        carried = whole[request.first : request.first + request.count]
        assert len({record.offset // size for record in carried}) == 1
    assert len(together) > len(list(records.requests(whole, MULTI, 250, "in")))


def _packed_one_by_one(
    data: bytes, limit: int | None, start: int = 0, end: int | None = None, part_size: int | None = None
) -> list[Any]:
    """What split + requests give for Line and MultiRecord: each request's fields, then the failure's message."""
    stream = io.BytesIO(data)
    stream.seek(start)
    got: list[Any] = []
    try:
        for request in records.requests(records.split(stream, "Line", "in", start, end), MULTI, limit, "in", part_size):
            got.append((request.body, request.first, request.count, request.originals, request.end))
    except TransformError as exc:
        got.append(str(exc))
    return got


class _Trickling(io.BytesIO):
    """A stream that answers every read with 1 to 3 bytes, as a socket or an object store may."""

    def read(self, size: int | None = -1) -> bytes:
        return super().read() if size is None or size < 0 else super().read(min(size, 1 + self.tell() % 3))


def _cut_fast(
    data: bytes,
    limit: int | None,
    start: int = 0,
    end: int | None = None,
    part_size: int | None = None,
    stream: io.BytesIO | None = None,
) -> list[Any]:
    """What line_requests gives, in the same shape as :func:`_packed_one_by_one`."""
    stream = io.BytesIO(data) if stream is None else stream
    stream.seek(start)
    got: list[Any] = []
    try:
        for request in records.line_requests(stream, limit, "in", start, end, part_size):
            got.append((request.body, request.first, request.count, request.originals, request.end))
    except TransformError as exc:
        got.append(str(exc))
    return got


TRICKY = {
    "empty file": b"",
    "no trailing newline": b"1,2\n3,4\n5,6",
    "crlf": b"1,2\r\n3,4\r\n5,6\r\n",
    "crlf without the last": b"1,2\r\n3,4\r\n5,6\r",
    "blank lines": b"\n\n1,2\n\n\n3,4\r\n\r\n5,6\n\n",
    "only blank lines": b"\n\r\n\n\r",
    "a lone carriage return is data": b"\r\r\n\ra\n\r\n",
    "exactly the limit": b"0123456789abcdef01\n",
    "one byte over the limit": b"0123456789abcdef012\n",
    "a record over the limit after others": b"a\nb\n" + b"x" * 40 + b"\nc\n",
    "a record over the limit without a newline": b"a\n" + b"y" * 30,
    "a blank line after a full request": b"0123456789abcdefg\n\r\nz",  # 19 bytes of records: they fit
    "unicode": "é,ü\n漢字,😀\r\nñ\n".encode(),
}


@pytest.mark.parametrize("limit", [None, 1, 5, 19, 20, 64])
@pytest.mark.parametrize("data", list(TRICKY.values()), ids=list(TRICKY))
def test_lines_cut_with_byte_searches_are_the_records_packed_one_by_one(data: bytes, limit: int | None) -> None:
    """line_requests gives split + requests' MultiRecord requests (bodies, first records, counts, ends) and failures
    byte for byte, on inputs that break naive cutting: blank lines, CRLF, no final newline, records at and over the
    limit (the request before one over the limit is never given), an empty file, multi-byte characters."""
    assert _cut_fast(data, limit) == _packed_one_by_one(data, limit)


def test_a_record_over_the_limit_fails_line_requests_as_it_fails_requests() -> None:
    """A line over MaxPayloadInMB fails the file with the same message (index, offset, size, limit) whether the
    requests are cut fast or packed one record at a time, and nothing is sent before it in either."""
    data = b"ok\n" + b"x" * 50 + b"\n" + b"never\n"
    with pytest.raises(TransformError, match=r"in: record 1 \(at byte 3\) is 51 bytes, over the limit of 40") as raised:
        list(records.line_requests(io.BytesIO(data), 40, "in"))
    assert [str(raised.value)] == _packed_one_by_one(data, 40)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"a", b"bc,1", b"\xc3\xa9", b"long" * 4]), max_size=40),
    limit=st.sampled_from([None, 1, 2, 3, 5, 8, 13, 30]),
    part_size=st.sampled_from([None, 7, 16, 50]),
    part=st.integers(min_value=-1, max_value=6),
    trickle=st.booleans(),
)
def test_line_requests_match_requests_for_any_lines_limits_and_parts(
    pieces: list[bytes], limit: int | None, part_size: int | None, part: int, trickle: bool
) -> None:
    """For any mix of lines, blank lines and carriage returns, any limit and part size, a whole file or one part of
    it (from start_at, up to its end), and streams that return a few bytes a read, line_requests equals split +
    requests."""
    data = b"".join(pieces)
    start, end = 0, None
    if part_size is not None and part >= 0:
        start = records.start_at(io.BytesIO(data), "Line", part * part_size, "in")
        end = (part + 1) * part_size
    stream = _Trickling(data) if trickle else None
    expected = _packed_one_by_one(data, limit, start, end, part_size)
    assert _cut_fast(data, limit, start, end, part_size, stream) == expected
