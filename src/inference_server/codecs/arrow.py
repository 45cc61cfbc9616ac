"""``application/vnd.apache.arrow.stream`` and ``.file``: Arrow IPC tables, read zero-copy from the body.

``pyarrow`` is the optional extra ``inference-server[arrow]``; without it these media types answer 415 (decoding)
or are left out of negotiation (encoding), with a message naming the extra.
"""

from __future__ import annotations

import importlib
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


def _load() -> ModuleType | None:
    """pyarrow, or None when it cannot be imported.

    A failed import is remembered: retrying it costs about 300 us, on every request that negotiates. A module in
    ``sys.modules`` wins over that memory either way (imported since, or blocked with ``None`` by a test).
    """
    global _missing
    if "pyarrow" in sys.modules:
        return sys.modules["pyarrow"]
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
            table = reader.read_all()
            table.validate(full=True)  # offsets and lengths inside the body: never read out of bounds later
            return table
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
