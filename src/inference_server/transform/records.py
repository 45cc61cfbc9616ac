"""Records and requests as SageMaker Batch Transform makes them: split a file by ``SplitType``, pack the records
into request bodies by ``BatchStrategy`` and ``MaxPayloadInMB``, assemble the answers by ``AssembleWith``.

SageMaker's rules (``TransformInput.SplitType`` in the API reference):

- ``None``: the whole file is one record. ``Line``: records end at a newline. ``RecordIO`` (MXNet's framing) and
  ``TFRecord`` (TensorFlow's): records framed in the file.
- ``SingleRecord`` sends each record alone, without its framing: a line without its newline, a RecordIO or TFRecord
  record's data without header, padding or checksums ("padding is removed"). ``MultiRecord`` sends as many
  consecutive records of one file as fit in ``MaxPayloadInMB``, each as it is in the file ("padding is not removed").
- ``AssembleWith Line`` puts a newline after each request's answer; ``None`` concatenates the answers.

Files are read as streams: a record is held only until its request is sent, so memory does not grow with the file
(except ``None``, which is the whole file by definition).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from inference_server._settings import BatchStrategy
from inference_server.errors import TransformError

SPLIT_TYPES = ("None", "Line", "RecordIO", "TFRecord")
ASSEMBLE_WITH = ("None", "Line")

#: MXNet RecordIO: each record starts with this magic number, then a word of 3 bits of continuation flag and
#: 29 bits of length; the data follows, padded with zeros to a multiple of 4 bytes. A record whose data holds the
#: magic number is written in parts (flag 1: first, 2: middle, 3: last) and the magic is put back between them.
RECORDIO_MAGIC = 0xCED7230A
_RECORDIO_HEADER = struct.Struct("<II")
_READ = 1 << 20


@dataclass(frozen=True)
class Record:
    """One record of a file: where it is, its bytes as framed in the file, and its data without the framing."""

    index: int
    offset: int
    framed: bytes
    payload: bytes
    #: The record as read, when an input filter changed ``framed`` and ``payload`` (a join needs it).
    original: bytes | None = None


@dataclass(frozen=True)
class Request:
    """One request body and the records it carries (``first`` is the index of the first)."""

    body: bytes
    first: int
    count: int
    #: The records as read, one per record, when they are needed after the answer (``JoinSource Input``).
    originals: tuple[bytes, ...] = ()
    #: Where the last record ends in the file: how far the job has read.
    end: int = 0


def split(stream: BinaryIO, split_type: str, name: str, start: int = 0, end: int | None = None) -> Iterator[Record]:
    """The records of ``stream`` (a binary file positioned at ``start``, a record's start: see :func:`start_at`),
    as ``split_type`` frames them, up to the last record that starts before ``end``."""
    if split_type == "None":
        data = stream.read()
        yield Record(0, 0, data, data)
        return
    if split_type == "Line":
        records = _lines(stream, start)
    elif split_type == "RecordIO":
        records = _recordio(stream, name, start)
    elif split_type == "TFRecord":
        records = _tfrecord(stream, name, start)
    else:
        raise ValueError(f"split type {split_type!r}: use one of {', '.join(SPLIT_TYPES)}")
    if end is None:
        yield from records
        return
    for record in records:
        if record.offset >= end:
            break
        yield record


def _lines(stream: BinaryIO, offset: int) -> Iterator[Record]:
    """Lines ending in ``\\n`` (a ``\\r`` before it is part of the terminator); blank lines are no records."""
    index = 0
    for line in stream:
        payload = line.rstrip(b"\n")
        if payload.endswith(b"\r"):
            payload = payload[:-1]
        if payload:
            yield Record(index, offset, line, payload)
            index += 1
        offset += len(line)


def _exactly(stream: BinaryIO, size: int, name: str, what: str, offset: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise TransformError(f"{name}: {what} at byte {offset} is cut short ({len(data)} of {size} bytes)")
    return data


def _recordio(stream: BinaryIO, name: str, offset: int) -> Iterator[Record]:
    index = 0
    while header := stream.read(8):
        start, parts, framed = offset, [], []
        while True:
            if len(header) != 8:
                raise TransformError(f"{name}: the RecordIO header at byte {offset} is cut short")
            magic, word = _RECORDIO_HEADER.unpack(header)
            if magic != RECORDIO_MAGIC:
                raise TransformError(f"{name}: no RecordIO magic number at byte {offset}; is it a RecordIO file?")
            flag, length = word >> 29, word & ((1 << 29) - 1)
            padded = length + (-length % 4)
            body = _exactly(stream, padded, name, "the RecordIO record", offset)
            framed += [header, body]
            parts.append(body[:length])
            offset += 8 + padded
            if flag in (0, 3):
                break
            if flag not in (1, 2) or (flag == 2 and len(parts) == 1):
                raise TransformError(f"{name}: RecordIO continuation flag {flag} out of order at byte {offset}")
            header = stream.read(8)
        if flag == 3 and len(parts) == 1:
            raise TransformError(f"{name}: RecordIO record at byte {start} ends a record that never began")
        payload = struct.pack("<I", RECORDIO_MAGIC).join(parts)
        yield Record(index, start, b"".join(framed), payload)
        index += 1


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(stream: BinaryIO, name: str, offset: int) -> Iterator[Record]:
    """TFRecord: a uint64 length, the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data.

    The length's checksum is verified (a misframed file fails at once, naming the byte); the data's is not, as
    SageMaker hands records to the model unchecked.
    """
    index = 0
    while head := stream.read(12):
        if len(head) != 12:
            raise TransformError(f"{name}: the TFRecord header at byte {offset} is cut short")
        length_bytes, (crc,) = head[:8], struct.unpack("<I", head[8:])
        if _masked_crc(length_bytes) != crc:
            raise TransformError(f"{name}: the TFRecord length at byte {offset} fails its checksum")
        (length,) = struct.unpack("<Q", length_bytes)
        rest = _exactly(stream, length + 4, name, "the TFRecord record", offset)
        yield Record(index, offset, head + rest, rest[:-4])
        offset += 12 + length + 4
        index += 1


def start_at(stream: BinaryIO, split_type: str, position: int, name: str) -> int:
    """The offset of the first record that starts at or after ``position`` (the file's size if none does), found
    by reading forward from ``position`` only; ``stream`` is left there, ready for :func:`split`.

    This is how a large file is cut into parts that are transformed apart (see ``PART_SIZE``): every record starting
    in ``[k * size, (k + 1) * size)`` is in part ``k``, whoever reads it. Lines: the byte after the first newline at
    or after ``position - 1``. RecordIO: the first magic number on a 4-byte boundary (records are 4-byte aligned, and
    the writer splits any record whose data holds the magic there) that begins a record (flag 0 or 1). TFRecord has
    no marker: the first offset whose length word passes its checksum, a length that fits in the file, and whose
    next record's length word passes too (or which ends the file): a false start has odds below 2^-64.
    """
    if position <= 0:
        stream.seek(0)
        return 0
    if split_type == "Line":
        stream.seek(position - 1)
        found = position - 1 + len(stream.readline())
    elif split_type == "RecordIO":
        found = _recordio_start(stream, position + (-position % 4))
    elif split_type == "TFRecord":
        found = _tfrecord_start(stream, position, name)
    else:
        raise ValueError(f"split type {split_type!r} has no parts: one record per file")
    stream.seek(found)
    return found


def _recordio_start(stream: BinaryIO, position: int) -> int:
    magic = struct.pack("<I", RECORDIO_MAGIC)
    stream.seek(position)
    window, base = b"", position  # base: the offset of window[0], a multiple of 4
    while chunk := stream.read(_READ):
        window += chunk
        at = window.find(magic)
        while at != -1 and at + 8 <= len(window):
            if at % 4 == 0 and window[at + 7] >> 5 in (0, 1):
                return base + at
            at = window.find(magic, at + 1)
        keep = len(window) - len(window) % 4 - 4 if len(window) >= 8 else 0
        window, base = window[keep:], base + keep
    return base + len(window)


def _tfrecord_start(stream: BinaryIO, position: int, name: str) -> int:
    stream.seek(0, 2)
    size = stream.tell()
    offset = position
    stream.seek(offset)
    window = stream.read(_READ)
    while offset + 12 <= size:
        if offset - position + 12 > len(window):
            stream.seek(offset)
            window, position = stream.read(_READ), offset
        at = offset - position
        (length,) = struct.unpack_from("<Q", window, at)
        after = offset + 12 + length + 4
        if after <= size and _masked_crc(window[at : at + 8]) == struct.unpack_from("<I", window, at + 8)[0]:
            if after == size:
                return offset
            stream.seek(after)
            head = stream.read(12)
            if len(head) == 12 and _masked_crc(head[:8]) == struct.unpack("<I", head[8:])[0]:
                return offset
        offset += 1
    return size


def requests(
    records: Iterable[Record], strategy: BatchStrategy, limit: int | None, name: str, part_size: int | None = None
) -> Iterator[Request]:
    """Request bodies for ``records``: one per record (SingleRecord), or as many consecutive records as fit in
    ``limit`` bytes (MultiRecord), never two records of different parts (``part_size``: see :func:`start_at`), so
    that a file's requests are the same whether its parts are transformed together or apart. ``limit`` None: no
    limit. A record that cannot fit fails the file."""
    single = strategy is BatchStrategy.SINGLE_RECORD
    pending: list[bytes] = []
    originals: list[bytes] = []
    size = first = end = part_of = 0
    for record in records:
        original = () if record.original is None else (record.original,)
        part = record.payload if single else record.framed
        if limit is not None and len(part) > limit:
            raise TransformError(
                f"{name}: record {record.index} (at byte {record.offset}) is {len(part)} bytes, over the limit of "
                f"{limit} bytes (MaxPayloadInMB); raise --max-payload-in-mb (at most 100) or split the file"
            )
        if single:
            yield Request(part, record.index, 1, original, record.offset + len(record.framed))
            continue
        if pending and (
            (limit is not None and size + len(part) > limit)
            or (part_size is not None and record.offset // part_size != part_of)
        ):
            yield Request(b"".join(pending), first, len(pending), tuple(originals), end)
            pending, originals, size = [], [], 0
        if not pending:
            first = record.index
            part_of = record.offset // part_size if part_size else 0
        pending.append(part)
        originals.extend(original)
        size += len(part)
        end = record.offset + len(record.framed)
    if pending:
        yield Request(b"".join(pending), first, len(pending), tuple(originals), end)


def assembled(answer: bytes, assemble_with: str) -> bytes:
    """A request's answer as it goes into the output file."""
    return answer + b"\n" if assemble_with == "Line" else answer


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of a few bytes (TFRecord's length words; pure Python: slow for large data)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
