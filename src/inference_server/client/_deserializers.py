"""Deserializers of the SageMaker Python SDK v2, behaviour for behaviour: ``deserialize(stream, content_type)``
and ``ACCEPT``.

Each returns what the SDK's class of the same name returns for the same body and raises the same exception types
(a bad JSON body: ``json.JSONDecodeError`` with the decoder's message). The deliberate differences: nothing is ever
unpickled (``allow_pickle=True`` is refused), ``.npz`` becomes a plain ``dict``, and media types match as HTTP says
(case and parameters such as ``charset`` ignored). Faster paths where the result is the same: ``.npy`` answers are
arrays over the body's own memory when it is writable, JSON is parsed by orjson (the standard library's parser when
orjson refuses, so the result and any error are the SDK's). ``NpzDeserializer`` and ``ArrowDeserializer`` are ours.
"""

from __future__ import annotations

import abc
import csv
import io
import json as stdlib_json
import re
from typing import Any

import numpy as np
import orjson

from inference_server import codecs
from inference_server.client import _sdk
from inference_server.client._serializers import _torch_module
from inference_server.codecs import arrow, json, jsonlines, npy, npz
from inference_server.codecs import csv as csv_codec
from inference_server.codecs import recordio_protobuf as _record


class Body:
    """A response body already read into memory: ``read()`` works as on a stream, ``buffer`` gives it uncopied."""

    def __init__(self, buffer: codecs.Buffer) -> None:
        self.buffer = buffer

    def read(self, size: int = -1) -> bytes:
        return bytes(self.buffer)

    def close(self) -> None:
        pass


def read_all(stream: Any) -> codecs.Buffer:
    """The whole body of ``stream`` (our Predictor's buffer as it is), closing the stream as the SDK does."""
    if isinstance(stream, Body):
        return stream.buffer
    try:
        return stream.read()  # type: ignore[no-any-return]
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _text(stream: Any, encoding: str = "utf-8") -> str:
    return str(read_all(stream), encoding)


#: A run of digits long enough to be an integer beyond 64 bits, which orjson reads as a float and json as an int.
_LONG_NUMBER, _LONG_NUMBER_TEXT = re.compile(rb"[0-9]{19}"), re.compile(r"[0-9]{19}")


def _load_json(body: str | codecs.Buffer) -> Any:
    """``json.loads``'s result and errors, by orjson when that gives the same: not for NaN and Infinity literals
    (orjson refuses them) nor integers beyond 64 bits (orjson reads them as floats)."""
    long = _LONG_NUMBER_TEXT.search(body) if isinstance(body, str) else _LONG_NUMBER.search(body)
    if long is None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return stdlib_json.loads(body if isinstance(body, str) else str(body, "utf-8"))


def _media_type(content_type: str | None) -> str:
    return codecs.bare(content_type or "")


class BaseDeserializer(abc.ABC):
    """Turns a response body into Python objects (the SDK's abstract base).

    An instance also counts as one of the SDK's ``BaseDeserializer`` (v2 and v3) once the SDK is imported.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _sdk.register(cls, "BaseDeserializer")
        return super().__new__(cls)

    @abc.abstractmethod
    def deserialize(self, stream: Any, content_type: str) -> Any:
        """Read and close ``stream`` and decode it as ``content_type``."""

    @property
    @abc.abstractmethod
    def ACCEPT(self) -> Any:
        """The media types expected from the endpoint."""


class SimpleBaseDeserializer(BaseDeserializer):
    """A deserializer whose ``ACCEPT`` is given at construction (the SDK's ``SimpleBaseDeserializer``)."""

    def __init__(self, accept: str | tuple[str, ...] = "*/*") -> None:
        self.accept = accept

    @property
    def ACCEPT(self) -> Any:
        """The media types to send in ``Accept``: a tuple (the one given, as the SDK does, when not a str)."""
        return (self.accept,) if isinstance(self.accept, str) else self.accept


class BytesDeserializer(SimpleBaseDeserializer):
    """The body as ``bytes``."""

    def deserialize(self, stream: Any, content_type: str) -> bytes:
        return bytes(read_all(stream))


class StringDeserializer(SimpleBaseDeserializer):
    """The body as ``str``."""

    def __init__(self, encoding: str = "UTF-8", accept: str | tuple[str, ...] = json.MEDIA_TYPE) -> None:
        super().__init__(accept=accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> str:
        return _text(stream, self.encoding)


class StreamDeserializer(SimpleBaseDeserializer):
    """``(stream, content_type)`` unread: the caller reads and closes the stream."""

    def deserialize(self, stream: Any, content_type: str) -> tuple[Any, str]:
        return stream, content_type


class JSONDeserializer(SimpleBaseDeserializer):
    """The body as JSON, whatever its media type, as Python objects."""

    def __init__(self, accept: str | tuple[str, ...] = json.MEDIA_TYPE) -> None:
        super().__init__(accept=accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        return _load_json(read_all(stream))


class JSONLinesDeserializer(SimpleBaseDeserializer):
    """The body as JSON Lines, a list of values (trailing whitespace dropped; an empty body is an error)."""

    def __init__(self, accept: str | tuple[str, ...] = jsonlines.MEDIA_TYPE) -> None:
        super().__init__(accept=accept)

    def deserialize(self, stream: Any, content_type: str) -> list[Any]:
        return [_load_json(line) for line in _text(stream).rstrip().split("\n")]


class CSVDeserializer(SimpleBaseDeserializer):
    """The body as CSV, a list of rows of strings, one per line (an empty line is an empty row)."""

    def __init__(self, encoding: str = "utf-8", accept: str | tuple[str, ...] = csv_codec.MEDIA_TYPE) -> None:
        super().__init__(accept=accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> list[list[str]]:
        return list(csv.reader(_text(stream, self.encoding).splitlines()))


class NumpyDeserializer(SimpleBaseDeserializer):
    """``.npy`` as an array, ``.npz`` as a ``dict[str, ndarray]`` in archive order, CSV (``np.genfromtxt``) and
    JSON as arrays of ``dtype``.

    ``allow_pickle=True`` is refused: inference-server never unpickles (object arrays are a security hole).
    """

    def __init__(
        self, dtype: Any = None, accept: str | tuple[str, ...] = npy.MEDIA_TYPE, allow_pickle: bool = False
    ) -> None:
        if allow_pickle:
            raise ValueError(
                "allow_pickle=True is refused: unpickling a response runs code chosen by whoever wrote it; "
                "send arrays of plain dtypes (or several as application/x-npz) instead"
            )
        super().__init__(accept=accept)
        self.dtype = dtype
        self.allow_pickle = False

    def deserialize(self, stream: Any, content_type: str) -> Any:
        media_type = _media_type(content_type)
        if media_type == csv_codec.MEDIA_TYPE:
            return np.genfromtxt(io.StringIO(_text(stream)), delimiter=",", dtype=self.dtype)
        if media_type == json.MEDIA_TYPE:
            return np.array(_load_json(read_all(stream)), dtype=self.dtype)
        if media_type in (npy.MEDIA_TYPE, npz.MEDIA_TYPE):
            return _writable(codecs.loads(read_all(stream), media_type))
        read_all(stream)
        raise ValueError(f"{type(self).__name__} cannot read content type {content_type}.")


def _writable(value: Any) -> Any:
    """Arrays as ``np.load`` gives them: writable (a copy only when they view a read-only body, such as bytes)."""
    if isinstance(value, dict):
        return {name: _writable(array) for name, array in value.items()}
    return value if value.flags.writeable else value.copy()


class PandasDeserializer(SimpleBaseDeserializer):
    """CSV or JSON (columns orient) as a pandas DataFrame (pandas must be installed)."""

    def __init__(self, accept: str | tuple[str, ...] = (csv_codec.MEDIA_TYPE, json.MEDIA_TYPE)) -> None:
        super().__init__(accept=accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        try:
            import pandas as pd
        except ImportError:
            read_all(stream)
            raise ImportError("PandasDeserializer needs pandas: pip install pandas") from None
        media_type = _media_type(content_type)
        body = io.BytesIO(read_all(stream))
        if media_type == csv_codec.MEDIA_TYPE:
            return pd.read_csv(body)
        if media_type == json.MEDIA_TYPE:
            return pd.read_json(body)
        raise ValueError(f"{type(self).__name__} cannot read content type {content_type}.")


class RecordDeserializer(SimpleBaseDeserializer):
    """RecordIO-protobuf as a list of records with the fields of the SDK's protobuf ``Record`` (``features``,
    ``label``: dicts of values whose ``float32_tensor``, ``float64_tensor`` and ``int32_tensor`` have ``values``,
    ``keys`` and ``shape`` lists), read without protobuf."""

    def __init__(self, accept: str | tuple[str, ...] = "application/x-recordio-protobuf") -> None:
        super().__init__(accept=accept)

    def deserialize(self, stream: Any, content_type: str) -> list[_record.Record]:
        return _record.read_records(bytes(read_all(stream)))


class TorchTensorDeserializer(SimpleBaseDeserializer):
    """A ``.npy`` body, whatever its declared type, as a ``torch.Tensor`` sharing the array's memory; PyTorch must be
    installed (the constructor imports it, as the SDK's does). A body that is not ``.npy`` is a ValueError."""

    def __init__(self, accept: str | tuple[str, ...] = "tensor/pt") -> None:
        super().__init__(accept=accept)
        self.numpy_deserializer = NumpyDeserializer()
        self.convert_npy_to_tensor = _torch_module("TorchTensorDeserializer").from_numpy

    def deserialize(self, stream: Any, content_type: str = "tensor/pt") -> Any:
        try:
            array = self.numpy_deserializer.deserialize(stream, npy.MEDIA_TYPE)
            return self.convert_npy_to_tensor(array)
        except Exception as exc:
            raise ValueError(f"Unable to deserialize your data to torch.Tensor: {exc}") from exc


class _CodecDeserializer(SimpleBaseDeserializer):
    """Decodes with the codec of the response's media type, among those it reads."""

    readable: tuple[str, ...] = ()

    def deserialize(self, stream: Any, content_type: str) -> Any:
        media_type = _media_type(content_type)
        if media_type not in self.readable:
            read_all(stream)
            raise ValueError(
                f"{type(self).__name__} cannot read content type {content_type}; it reads {', '.join(self.readable)}"
            )
        return self._convert(codecs.loads(read_all(stream), media_type))

    def _convert(self, value: Any) -> Any:
        return value


class NpzDeserializer(_CodecDeserializer):
    """``.npz`` as a ``dict[str, ndarray]`` in archive order (also reads a single ``.npy`` as ``{"arr_0": ...}``)."""

    readable = (npz.MEDIA_TYPE, npy.MEDIA_TYPE)

    def __init__(self, accept: str | tuple[str, ...] = npz.MEDIA_TYPE) -> None:
        super().__init__(accept=accept)

    def _convert(self, value: Any) -> Any:
        return value if isinstance(value, dict) else {"arr_0": value}


class ArrowDeserializer(_CodecDeserializer):
    """Arrow IPC (stream or file) as a ``pyarrow.Table`` that views the body."""

    readable = (arrow.STREAM, arrow.FILE)

    def __init__(self, accept: str | tuple[str, ...] = arrow.STREAM) -> None:
        super().__init__(accept=accept)
