"""Serializers with the SageMaker Python SDK v2 interface: ``serialize(data) -> bytes`` and ``CONTENT_TYPE``.

They drop into ``sagemaker.Predictor`` unchanged and encode with the same codecs the server decodes with.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

import numpy as np

from inference_server import codecs
from inference_server.codecs import arrow, json, jsonlines, npy, npz, text
from inference_server.codecs import csv as csv_codec


class BaseSerializer:
    """Turns data into a request body of media type ``CONTENT_TYPE``."""

    #: Whether a ``str`` (as UTF-8) or ``bytes`` is taken to be serialized already, as the SDK's text formats do.
    TEXT_AS_IS = False

    def __init__(self, content_type: str = text.OCTET_STREAM) -> None:
        self.content_type = content_type

    @property
    def CONTENT_TYPE(self) -> str:
        """The ``Content-Type`` of the serialized data."""
        return self.content_type

    def serialize(self, data: Any) -> bytes:
        """Serialize ``data``; a file-like object (with ``read``) is sent as it is."""
        if hasattr(data, "read"):
            return bytes(data.read())
        if self.TEXT_AS_IS and isinstance(data, (str, bytes)):
            return data.encode() if isinstance(data, str) else data
        return self._serialize(data)

    def _serialize(self, data: Any) -> bytes:
        raise NotImplementedError


class IdentitySerializer(BaseSerializer):
    """Sends bytes (or a str, as UTF-8) unchanged."""

    TEXT_AS_IS = True

    def __init__(self, content_type: str = text.OCTET_STREAM) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        return bytes(data)


class NumpySerializer(BaseSerializer):
    """An array (or anything ``np.asarray`` takes) as ``.npy``, cast to ``dtype`` if given."""

    def __init__(self, dtype: Any = None, content_type: str = npy.MEDIA_TYPE) -> None:
        super().__init__(content_type)
        self.dtype = dtype

    def _serialize(self, data: Any) -> bytes:
        array = np.asarray(data, dtype=self.dtype)
        if array.size == 0:
            raise ValueError("cannot serialize an empty array")
        return codecs.dumps(array, npy.MEDIA_TYPE)


class NpzSerializer(BaseSerializer):
    """Several named arrays as ``.npz``: a dict (names kept), a tuple or list (``arr_0``...), or one array."""

    def __init__(self, content_type: str = npz.MEDIA_TYPE) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        return codecs.dumps({name: np.asarray(v) for name, v in npz.named_arrays(data).items()}, npz.MEDIA_TYPE)


class JSONSerializer(BaseSerializer):
    """Any JSON-able value, NumPy arrays and scalars included."""

    def __init__(self, content_type: str = json.MEDIA_TYPE) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        return json.dumps(data)


class JSONLinesSerializer(BaseSerializer):
    """An iterable of records, one JSON document per line; a str is sent as it is."""

    TEXT_AS_IS = True

    def __init__(self, content_type: str = jsonlines.MEDIA_TYPE) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        return codecs.dumps(data, jsonlines.MEDIA_TYPE)


def _is_row(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) and not isinstance(value, (str, bytes))


class CSVSerializer(BaseSerializer):
    """Rows as CSV, as the SDK does: a 1-D sequence is one row, a 2-D one is several; a str is sent as it is."""

    TEXT_AS_IS = True

    def __init__(self, content_type: str = csv_codec.MEDIA_TYPE) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        if isinstance(data, np.ndarray):
            data = data.tolist()
        rows: Iterable[Any] = data
        if len(data) == 0:
            raise ValueError("cannot serialize empty data as CSV")
        if not _is_row(data[0]):
            rows = [data]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return out.getvalue().rstrip("\n").encode()


class ArrowSerializer(BaseSerializer):
    """A pyarrow Table, RecordBatch, dict of 1-D arrays or pandas DataFrame as an Arrow IPC stream."""

    def __init__(self, content_type: str = arrow.STREAM) -> None:
        super().__init__(content_type)

    def _serialize(self, data: Any) -> bytes:
        return codecs.dumps(data, codecs.bare(self.content_type))
