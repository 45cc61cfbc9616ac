"""Deserializers with the SageMaker Python SDK v2 interface: ``deserialize(stream, content_type)`` and ``ACCEPT``.

Media types match case-insensitively, parameters ignored. They decode with the server's codecs, so ``.npy`` and
``.npz`` answers become arrays that view the response body, and nothing is ever unpickled.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from inference_server import codecs
from inference_server.codecs import arrow, json, jsonlines, npy, npz
from inference_server.codecs import csv as csv_codec


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


class BaseDeserializer:
    """Turns a response body into Python objects; ``ACCEPT`` lists the media types it asks for."""

    def __init__(self, accept: str | tuple[str, ...] = "*/*") -> None:
        self.accept = accept

    @property
    def ACCEPT(self) -> tuple[str, ...]:
        """The media types to send in ``Accept``."""
        return (self.accept,) if isinstance(self.accept, str) else tuple(self.accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        """Read and close ``stream`` and decode it as ``content_type``."""
        raise NotImplementedError

    def _refuse(self, content_type: str, readable: tuple[str, ...]) -> ValueError:
        return ValueError(
            f"{type(self).__name__} cannot decode a {content_type!r} response; it reads {', '.join(readable)}"
        )


class BytesDeserializer(BaseDeserializer):
    """The body as ``bytes``."""

    def deserialize(self, stream: Any, content_type: str) -> bytes:
        return bytes(read_all(stream))


class StringDeserializer(BaseDeserializer):
    """The body as ``str``."""

    def __init__(self, encoding: str = "UTF-8", accept: str | tuple[str, ...] = json.MEDIA_TYPE) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> str:
        return str(read_all(stream), self.encoding)


class StreamDeserializer(BaseDeserializer):
    """``(stream, content_type)`` unread: the caller reads and closes the stream."""

    def deserialize(self, stream: Any, content_type: str) -> tuple[Any, str]:
        return stream, content_type


class _CodecDeserializer(BaseDeserializer):
    """Decodes with the codec of the response's media type, among those it reads."""

    readable: tuple[str, ...] = ()

    def deserialize(self, stream: Any, content_type: str) -> Any:
        media_type = codecs.bare(content_type or "")
        if media_type not in self.readable:
            read_all(stream)
            raise self._refuse(content_type, self.readable)
        return self._convert(codecs.loads(read_all(stream), media_type), media_type)

    def _convert(self, value: Any, media_type: str) -> Any:
        return value


class JSONDeserializer(_CodecDeserializer):
    """JSON as Python objects."""

    readable = (json.MEDIA_TYPE,)

    def __init__(self, accept: str | tuple[str, ...] = json.MEDIA_TYPE) -> None:
        super().__init__(accept)


class JSONLinesDeserializer(_CodecDeserializer):
    """JSON Lines as a list of objects."""

    readable = (jsonlines.MEDIA_TYPE,)

    def __init__(self, accept: str | tuple[str, ...] = jsonlines.MEDIA_TYPE) -> None:
        super().__init__(accept)


class CSVDeserializer(BaseDeserializer):
    """CSV as a list of rows of strings, as the SDK returns it."""

    def __init__(self, encoding: str = "utf-8", accept: str | tuple[str, ...] = csv_codec.MEDIA_TYPE) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> list[list[str]]:
        text = str(read_all(stream), self.encoding)
        return [row for row in csv.reader(io.StringIO(text, newline="")) if row]


class NumpyDeserializer(_CodecDeserializer):
    """``.npy`` as an array, ``.npz`` as a ``dict[str, ndarray]`` in archive order, JSON and CSV as arrays.

    ``allow_pickle=True`` is refused: inference-server never unpickles (object arrays are a security hole).
    """

    readable = (npy.MEDIA_TYPE, npz.MEDIA_TYPE, json.MEDIA_TYPE, csv_codec.MEDIA_TYPE)

    def __init__(
        self, dtype: Any = None, accept: str | tuple[str, ...] = npy.MEDIA_TYPE, allow_pickle: bool = False
    ) -> None:
        if allow_pickle:
            raise ValueError(
                "allow_pickle=True is refused: unpickling a response runs code chosen by whoever wrote it; "
                "send arrays of plain dtypes (or several as application/x-npz) instead"
            )
        super().__init__(accept)
        self.dtype = dtype
        self.allow_pickle = False

    def _convert(self, value: Any, media_type: str) -> Any:
        if media_type == json.MEDIA_TYPE:
            return np.asarray(value, dtype=self.dtype)
        if media_type == csv_codec.MEDIA_TYPE:  # like the SDK's np.genfromtxt: one row or one column is 1-D
            array = np.asarray(value, dtype=self.dtype)
            return np.squeeze(array) if array.ndim == 2 and 1 in array.shape else array
        return value


class NpzDeserializer(_CodecDeserializer):
    """``.npz`` as a ``dict[str, ndarray]`` in archive order (also reads a single ``.npy`` as ``{"arr_0": ...}``)."""

    readable = (npz.MEDIA_TYPE, npy.MEDIA_TYPE)

    def __init__(self, accept: str | tuple[str, ...] = npz.MEDIA_TYPE) -> None:
        super().__init__(accept)

    def _convert(self, value: Any, media_type: str) -> Any:
        return value if isinstance(value, dict) else {"arr_0": value}


class ArrowDeserializer(_CodecDeserializer):
    """Arrow IPC (stream or file) as a ``pyarrow.Table`` that views the body."""

    readable = (arrow.STREAM, arrow.FILE)

    def __init__(self, accept: str | tuple[str, ...] = arrow.STREAM) -> None:
        super().__init__(accept)


class PandasDeserializer(BaseDeserializer):
    """CSV or JSON as a pandas DataFrame (pandas must be installed)."""

    def __init__(self, accept: str | tuple[str, ...] = (csv_codec.MEDIA_TYPE, json.MEDIA_TYPE)) -> None:
        super().__init__(accept)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        try:
            import pandas as pd
        except ImportError:
            read_all(stream)
            raise ImportError("PandasDeserializer needs pandas: pip install pandas") from None
        media_type = codecs.bare(content_type or "")
        body = io.BytesIO(read_all(stream))
        if media_type == csv_codec.MEDIA_TYPE:
            return pd.read_csv(body)
        if media_type == json.MEDIA_TYPE:
            return pd.read_json(body)
        raise self._refuse(content_type, (csv_codec.MEDIA_TYPE, json.MEDIA_TYPE))
