"""``application/vnd.apache.arrow.stream`` and ``.file``: Arrow IPC tables, read zero-copy from the body.

``pyarrow`` is the optional extra ``inference-server[arrow]``; without it these media types answer 415 (decoding)
or are left out of negotiation (encoding), with a message naming the extra.
"""

from __future__ import annotations

import importlib
import struct
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError, UnsupportedMediaType

STREAM = "application/vnd.apache.arrow.stream"
FILE = "application/vnd.apache.arrow.file"
EXTRA = "pip install 'inference-server[arrow]'"


_missing = False
_ABSENT: Any = object()


def _load() -> ModuleType | None:
    """pyarrow, or None when it cannot be imported.

    A failed import is remembered: retrying it costs about 300 us, on every request that negotiates. A module in
    ``sys.modules`` wins over that memory either way (imported since, or blocked with ``None`` by a test), once it
    is whole: while another thread is still importing it, the import below waits for that thread.
    """
    global _missing
    module: ModuleType | None = sys.modules.get("pyarrow", _ABSENT)
    if module is None or (module is not _ABSENT and not getattr(module.__spec__, "_initializing", False)):
        return module
    if _missing:
        return None
    try:
        return importlib.import_module("pyarrow")
    except ImportError:
        _missing = True
        return None


def pyarrow() -> ModuleType:
    """Import pyarrow, or raise 415 naming the extra to install."""
    module = _load()
    if module is None:
        raise UnsupportedMediaType(f"Arrow needs pyarrow, which is not installed: {EXTRA}")
    return module


def _installed() -> bool:
    return _load() is not None


def as_table(obj: Any) -> Any:
    """A Table from a Table, RecordBatch, dict of 1-D arrays, or pandas DataFrame."""
    pa = pyarrow()
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if isinstance(obj, Mapping):
        return pa.table(dict(obj))
    if type(obj).__name__ == "DataFrame" and hasattr(obj, "to_numpy"):
        return pa.Table.from_pandas(obj, preserve_index=False)
    raise TypeError(f"cannot send a {type(obj).__name__} as Arrow: send a Table, RecordBatch or dict of 1-D arrays")


class _Table:
    """A FlatBuffers table: just enough of the format to read the sizes Arrow's IPC metadata declares.

    Every read is bounds-checked by ``struct`` (``struct.error`` on hostile offsets), and vectors must fit in the data.
    """

    def __init__(self, data: memoryview, position: int) -> None:
        self.data, self.position = data, position
        self.vtable = position - struct.unpack_from("<i", data, position)[0]
        self.vtable_size = struct.unpack_from("<H", data, self.vtable)[0]

    @classmethod
    def root(cls, data: memoryview) -> _Table:
        return cls(data, struct.unpack_from("<I", data, 0)[0])

    def _field(self, index: int) -> int:
        entry = 4 + 2 * index
        return struct.unpack_from("<H", self.data, self.vtable + entry)[0] if entry < self.vtable_size else 0

    def scalar(self, index: int, fmt: str, default: int) -> int:
        offset = self._field(index)
        return struct.unpack_from(fmt, self.data, self.position + offset)[0] if offset else default

    def table(self, index: int) -> _Table | None:
        offset = self._field(index)
        if not offset:
            return None
        at = self.position + offset
        return _Table(self.data, at + struct.unpack_from("<I", self.data, at)[0])

    def structs(self, index: int, size: int) -> range:
        """The positions of a vector of structs of ``size`` bytes."""
        offset = self._field(index)
        if not offset:
            return range(0)
        at = self.position + offset
        vector = at + struct.unpack_from("<I", self.data, at)[0]
        count = struct.unpack_from("<I", self.data, vector)[0]
        if vector + 4 + count * size > len(self.data):
            raise struct.error("a vector runs past the end of the metadata")
        return range(vector + 4, vector + 4 + count * size, size)


#: Arrow's MessageHeader union: the types of messages that carry buffers.
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3


def _message_bytes(metadata: memoryview, body: memoryview) -> int:
    """The bytes a record or dictionary batch message's buffers hold once decompressed, as its metadata declares
    them (a compressed buffer starts with its uncompressed length; -1: stored as it is)."""
    message = _Table.root(metadata)
    kind, header = message.scalar(1, "<B", 0), message.table(2)
    batch = header.table(1) if kind == _DICTIONARY_BATCH and header is not None else header
    if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or batch is None:
        return 0
    compressed = batch.table(3) is not None
    total = 0
    for at in batch.structs(2, 16):
        offset, length = struct.unpack_from("<qq", metadata, at)
        if offset < 0 or length < 0:
            raise struct.error("a negative buffer offset or length")
        if compressed and length:
            declared = struct.unpack_from("<q", body, offset)[0]
            if declared < -1:
                raise struct.error("a negative uncompressed length")
            total += length - 8 if declared == -1 else declared
        else:
            total += length
    return total


def _declared_bytes(pa: Any, buffer: Any, stream: bool) -> int:
    """What the body's batches declare they hold, decompressed, and counted as often as they are referenced;
    a file's footer may not list one stretch of the body twice."""
    total = 0
    if stream:
        reader = pa.ipc.MessageReader.open_stream(buffer)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                return total
            if message.body is not None:
                total += _message_bytes(memoryview(message.metadata), memoryview(message.body))
    view = memoryview(buffer)
    footer_size = struct.unpack_from("<i", view, len(view) - 10)[0]
    footer = _Table.root(view[len(view) - 10 - footer_size : len(view) - 10])
    blocks = sorted(
        struct.unpack_from("<qi4xq", footer.data, at) for index in (2, 3) for at in footer.structs(index, 24)
    )
    for (start, metadata_length, body_length), following in zip(blocks, [*blocks[1:], None], strict=True):
        end = start + metadata_length + body_length
        if start < 8 or metadata_length < 0 or body_length < 0 or end > len(view):
            raise struct.error("a footer block outside the body")
        if following is not None and following[0] < end:
            raise DecodeError("the Arrow file's footer lists batches that overlap in the body; each needs its own")
        message = pa.ipc.read_message(buffer.slice(start, end - start))
        if message.body is not None:
            total += _message_bytes(memoryview(message.metadata), memoryview(message.body))
    return total


class ArrowCodec(Codec):
    """Arrow IPC, stream or file format."""

    def __init__(self, media_type: str) -> None:
        self.media_type = media_type  # type: ignore[misc]
        self.stream = media_type == STREAM

    def install_hint(self) -> str:
        return EXTRA

    def available(self) -> bool:
        return _installed()

    def decode(self, data: Buffer, limits: Limits) -> Any:
        pa = pyarrow()
        buffer = pa.py_buffer(data)
        try:
            reader = pa.ipc.open_stream(buffer) if self.stream else pa.ipc.open_file(buffer)
            try:
                declared = _declared_bytes(pa, buffer, self.stream)
            except struct.error as exc:
                raise DecodeError(f"invalid {self.media_type} body: its metadata is malformed ({exc})") from None
            if declared > limits.max_decompressed_bytes:
                raise limits.decompressed_too_large(
                    f"the {self.media_type} body's batches would hold {declared} bytes decompressed"
                )
            table = reader.read_all()
            table.validate(full=True)  # offsets and lengths inside the body: never read out of bounds later
            return table
        except DecodeError:
            raise
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise DecodeError(f"invalid {self.media_type} body: {exc}") from None

    def encode(self, obj: Any) -> list[Buffer]:
        pa = pyarrow()
        table = as_table(obj)
        sink = pa.BufferOutputStream()
        writer = pa.ipc.new_stream if self.stream else pa.ipc.new_file
        with writer(sink, table.schema) as out:
            out.write_table(table)
        return [memoryview(sink.getvalue())]

    def can_encode(self, obj: Any) -> bool:
        if not _installed():
            return False
        pa = pyarrow()
        if isinstance(obj, (pa.Table, pa.RecordBatch)):
            return True
        if isinstance(obj, Mapping):
            values = list(obj.values())
            return bool(values) and all(
                isinstance(v, np.ndarray) and v.ndim == 1 and len(v) == len(values[0]) for v in values
            )
        return type(obj).__name__ == "DataFrame" and hasattr(obj, "to_numpy")

    def natural_for(self, obj: Any) -> bool:
        return self.stream and _installed() and self.can_encode(obj) and not isinstance(obj, Mapping)
