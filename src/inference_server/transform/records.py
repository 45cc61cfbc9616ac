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

``MultiRecord`` requests of ``Line`` records, the common case, are cut by :func:`line_requests` with byte searches
(``rfind`` of the last newline that fits, ``count`` of the newlines) instead of a :class:`Record` per line: the same
requests, 0.3 s for 100 MB of 100-byte lines where :func:`split` and :func:`requests` take 2.4 s, more than all the
rest of a job with a cheap model (``benchmarks/transform.py``).
"""

from __future__ import annotations

import re
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
#: A blank line after a newline (one search for both: ``bytes.find`` of each was twice as slow).
_BLANK = re.compile(rb"\n\r?\n")


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
            raise _over_limit(name, record.index, record.offset, len(part), limit)
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


def _over_limit(name: str, index: int, offset: int, size: int, limit: int) -> TransformError:
    return TransformError(
        f"{name}: record {index} (at byte {offset}) is {size} bytes, over the limit of {limit} bytes "
        "(MaxPayloadInMB); raise --max-payload-in-mb (at most 100) or split the file"
    )


def line_requests(
    stream: BinaryIO, limit: int | None, name: str, start: int = 0, end: int | None = None, part_size: int | None = None
) -> Iterator[Request]:
    """``requests(split(stream, "Line", name, start, end), MULTI_RECORD, limit, name, part_size)`` without an object
    per record: the same requests (bodies, first records, counts, ends) and the same failures, cut with byte searches.

    From a record's start, a request is the file's bytes up to the last newline within ``limit`` (``rfind``; the
    rest of the file if it fits), shortened to the lines that start in the first record's part; its records are
    its newlines (``count``). Blank lines are no records and take no room, so a request with one among its lines or
    right after them is packed line by line instead (:func:`_packed`), as :func:`requests` packs it. A request is
    yielded only once the next record is known to fit, as :func:`requests` fails a file at a record over the limit
    without sending the request before it.
    """
    window = _Window(stream, start)
    held: Request | None = None
    index = position = 0
    while True:
        window.drop(position)
        position = window.skip_blank_lines(0)
        offset = window.base + position
        if position == len(window.data) or (end is not None and offset >= end):
            break
        if limit is not None:
            window.fill(position + limit + 2)
            if len(window.data) - position > limit and window.data.find(b"\n", position, position + limit) == -1:
                raise _over_limit(name, index, offset, window.line_length(position), limit)
        if held is not None:
            yield held
        stop = end
        if part_size:
            boundary = (offset // part_size + 1) * part_size
            stop = boundary if stop is None else min(stop, boundary)
        held = _cut(window, position, index, limit, stop)
        if held is None:
            held = _packed(window, position, index, limit, stop)
        index += held.count
        position = held.end - window.base
    if held is not None:
        yield held


def _cut(window: _Window, position: int, index: int, limit: int | None, stop: int | None) -> Request | None:
    """The request from the record at ``position`` as whole lines of the file, or None if a blank line would make
    :func:`requests` pack it otherwise."""
    if limit is None:
        cut = window.line_start(stop - window.base) if stop is not None else window.fill(None)
    else:
        data = window.data  # filled to position + limit + 2, or to the end of the stream
        cut = len(data) if len(data) - position <= limit else data.rfind(b"\n", position, position + limit) + 1
        if stop is not None and window.base + cut > stop:
            first = data.find(b"\n", stop - window.base - 1, cut)  # the line that starts in the next part
            if first != -1:
                cut = first + 1
    window.fill(cut + 2)
    data = window.data
    scope = min(len(data), cut + 2)  # the lines starting up to the cut, the one starting there included
    if _BLANK.search(data, position, scope) or (window.eof and scope == len(data) and data.endswith(b"\n\r")):
        return None
    count = data.count(b"\n", position, cut) + (data[cut - 1] != ord("\n"))
    return Request(data[position:cut], index, count, (), window.base + cut)


def _packed(window: _Window, position: int, index: int, limit: int | None, stop: int | None) -> Request:
    """The request from the record at ``position``, packed line by line as :func:`requests` packs it: records while
    they fit and start before ``stop``, blank lines skipped."""
    pieces: list[bytes] = []
    size = 0
    ends = position
    while True:
        position = window.skip_blank_lines(position)
        if position == len(window.data) or (stop is not None and window.base + position >= stop):
            break
        after = window.line_end(position, None if limit is None else limit - size)
        if after is None:  # the next request's first record (or one over the limit, which fails the file there)
            break
        pieces.append(window.data[position:after])
        size += after - position
        position = ends = after
    return Request(b"".join(pieces), index, len(pieces), (), window.base + ends)


class _Window:
    """A stream's bytes from offset ``base`` on, read as far as asked: ``data``, positions counted from ``base``."""

    def __init__(self, stream: BinaryIO, base: int) -> None:
        self.stream, self.base = stream, base
        self.data = b""
        self.eof = False

    def fill(self, size: int | None) -> int:
        """Read until ``data`` holds ``size`` bytes (None: all) or the stream ends; the size of ``data``."""
        while not self.eof and (size is None or len(self.data) < size):
            more = self.stream.read() if size is None else self.stream.read(max(size - len(self.data), _READ))
            if more:
                self.data += more
            else:
                self.eof = True
        return len(self.data)

    def drop(self, size: int) -> None:
        """Forget the first ``size`` bytes."""
        if size:
            self.data = self.data[size:]
            self.base += size

    def skip_blank_lines(self, position: int) -> int:
        """The first position from ``position`` on that is not the start of a blank line (``\\n``, ``\\r\\n``, or
        ``\\r`` ending the stream)."""
        while True:
            self.fill(position + 2)
            data = self.data
            if data.startswith(b"\n", position):
                position += 1
            elif data.startswith(b"\r\n", position):
                position += 2
            elif self.eof and position == len(data) - 1 and data[position] == ord("\r"):
                position += 1
            else:
                return position

    def line_end(self, position: int, room: int | None) -> int | None:
        """Where the line starting at ``position`` ends (after its newline, or at the end of the stream); None if it
        is longer than ``room`` bytes."""
        if room is None:
            return self.line_start(position + 1)
        self.fill(position + room + 1)
        newline = self.data.find(b"\n", position, position + room)
        if newline != -1:
            return newline + 1
        return len(self.data) if len(self.data) - position <= room else None

    def line_start(self, position: int) -> int:
        """The first start of a line at or after ``position`` (at least 1): after the first newline from
        ``position - 1`` on, or the end of the stream."""
        searched = position - 1
        self.fill(position)
        while (newline := self.data.find(b"\n", searched)) == -1 and not self.eof:
            searched = len(self.data)
            self.fill(2 * len(self.data))
        return newline + 1 if newline != -1 else len(self.data)

    def line_length(self, position: int) -> int:
        """The size of the line starting at ``position`` with its newline, read to its end but not kept."""
        length = 0
        while (newline := self.data.find(b"\n", position)) == -1 and not self.eof:
            length += len(self.data) - position
            self.drop(len(self.data))
            position = 0
            self.fill(_READ)
        return length + (newline + 1 if newline != -1 else len(self.data)) - position


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
