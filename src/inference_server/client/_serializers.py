"""Serializers of the SageMaker Python SDK v2, behaviour for behaviour: ``serialize(data)`` and ``CONTENT_TYPE``.

Each returns what the SDK's class of the same name returns for the same data (``str`` where the SDK returns
``str``, text byte for byte as the SDK writes it, the object a file-like's ``read()`` gives) and raises the same
exception types, so they drop into ``sagemaker.Predictor`` and into code written against the SDK. The deliberate
differences (never pickling; NumPy values inside JSON written instead of refused) are listed in
docs/reference/client.md.
``NpzSerializer`` and ``ArrowSerializer`` are ours; they encode with the codecs the server decodes with.
"""

from __future__ import annotations

import abc
import csv
import importlib
import io
import json as stdlib_json
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from inference_server import codecs
from inference_server.client import _sdk
from inference_server.codecs import arrow, npy, npz, text
from inference_server.codecs import csv as csv_codec
from inference_server.codecs import recordio_protobuf as _record


class BaseSerializer(abc.ABC):
    """Turns data into a request body of media type ``CONTENT_TYPE`` (the SDK's abstract base).

    An instance also counts as one of the SDK's ``BaseSerializer`` (v2 and v3) once the SDK is imported.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _sdk.register(cls, "BaseSerializer")
        return super().__new__(cls)

    @abc.abstractmethod
    def serialize(self, data: Any) -> Any:
        """Serialize ``data`` into the media type of ``CONTENT_TYPE``."""

    @property
    @abc.abstractmethod
    def CONTENT_TYPE(self) -> str:
        """The ``Content-Type`` of the serialized data."""


class SimpleBaseSerializer(BaseSerializer):
    """A serializer whose ``CONTENT_TYPE`` is given at construction (the SDK's ``SimpleBaseSerializer``)."""

    def __init__(self, content_type: str = "application/json") -> None:
        if not isinstance(content_type, str):
            raise ValueError(
                "content_type must be a string specifying the MIME type of the data sent in requests: e.g. "
                f"'application/json', 'text/csv', etc. Got {content_type}"
            )
        self.content_type = content_type

    @property
    def CONTENT_TYPE(self) -> str:
        """The ``Content-Type`` of the serialized data."""
        return self.content_type


def _numpy_value(value: Any) -> Any:
    """``json.dumps``'s ``default``: NumPy arrays and scalars as the lists and numbers ``tolist()`` gives."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json(value: Any) -> str:
    return stdlib_json.dumps(value, default=_numpy_value)


class IdentitySerializer(SimpleBaseSerializer):
    """Returns the data unchanged (bytes from a file's ``read()``, say)."""

    def __init__(self, content_type: str = text.OCTET_STREAM) -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        return data


class StringSerializer(SimpleBaseSerializer):
    """A ``str`` as UTF-8 bytes."""

    def __init__(self, content_type: str = "text/plain") -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> bytes:
        if isinstance(data, str):
            return data.encode("utf-8")
        raise ValueError(f"Object of type {type(data)} is not String serializable.")


def _npy(array: np.ndarray) -> bytes:
    """The bytes ``np.save`` writes, refusing object arrays (which it would pickle)."""
    if array.dtype.hasobject:
        raise ValueError(
            f"cannot serialize an array of dtype {array.dtype} as .npy: object arrays are pickled, and "
            "inference-server never pickles (a pickle runs code when loaded); convert it to a plain dtype"
        )
    if array.flags.c_contiguous and not array.dtype.names:  # our codec: the same bytes, one copy fewer
        return codecs.dumps(array, npy.MEDIA_TYPE)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


class NumpySerializer(SimpleBaseSerializer):
    """An array, a list (cast to ``dtype`` if given) or anything ``np.array`` takes, as ``.npy``."""

    def __init__(self, dtype: Any = None, content_type: str = npy.MEDIA_TYPE) -> None:
        super().__init__(content_type=content_type)
        self.dtype = dtype

    def serialize(self, data: Any) -> Any:
        if isinstance(data, np.ndarray):
            if data.size == 0:
                raise ValueError("Cannot serialize empty array.")
            return _npy(data)
        if isinstance(data, list):
            if len(data) == 0:
                raise ValueError("Cannot serialize empty array.")
            return _npy(np.array(data, self.dtype))
        if hasattr(data, "read"):
            return data.read()
        return _npy(np.array(data))


class NpzSerializer(SimpleBaseSerializer):
    """Several named arrays as ``.npz``: a dict (names kept), a tuple or list (``arr_0``...), or one array."""

    def __init__(self, content_type: str = npz.MEDIA_TYPE) -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if hasattr(data, "read"):
            return data.read()
        return codecs.dumps({name: np.asarray(v) for name, v in npz.named_arrays(data).items()}, npz.MEDIA_TYPE)


class JSONSerializer(SimpleBaseSerializer):
    """Any JSON-able value as ``json.dumps`` writes it; NumPy arrays and scalars as their ``tolist()``."""

    def serialize(self, data: Any) -> Any:
        if hasattr(data, "read") and not isinstance(data, dict):
            return data.read()
        return _json(data)


class JSONLinesSerializer(SimpleBaseSerializer):
    """An iterable of values, one ``json.dumps`` per line (no newline after the last); a str as it is."""

    def __init__(self, content_type: str = "application/jsonlines") -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if isinstance(data, str):
            return data
        if hasattr(data, "read"):
            return data.read()
        if isinstance(data, Iterable):
            return "\n".join(_json(element) for element in data)
        raise ValueError(f"Object of type {type(data)} is not JSON Lines serializable.")


def _sequence_like(data: Any) -> bool:
    return hasattr(data, "__iter__") and hasattr(data, "__getitem__")


class CSVSerializer(SimpleBaseSerializer):
    """Rows as CSV text: a sequence of sequences (strings count: each is a row as it is) is one row per line, any
    other sequence one row; a DataFrame without header and index; a str as it is."""

    def __init__(self, content_type: str = csv_codec.MEDIA_TYPE) -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if hasattr(data, "read"):
            return data.read()
        pandas = sys.modules.get("pandas")  # a DataFrame exists only if pandas was imported
        if pandas is not None and isinstance(data, pandas.DataFrame):
            return data.to_csv(header=False, index=False)
        mutable = _sequence_like(data) and hasattr(data, "__setitem__")
        several = len(data) > 0 and _sequence_like(data[0])  # as the SDK: TypeError for what has no len()
        if mutable and several:
            return "\n".join(self._row(row) for row in data)
        return self._row(data)

    @staticmethod
    def _row(data: Any) -> str:
        if isinstance(data, str):
            return data
        if isinstance(data, np.ndarray):
            data = data.flatten()
        if hasattr(data, "__len__"):
            if len(data) == 0:
                raise ValueError("Cannot serialize empty array")
            out = io.StringIO()
            csv.writer(out, delimiter=",").writerow(data)
            return out.getvalue().rstrip("\r\n")
        raise ValueError(f"Unable to handle input format: {type(data)}")


class LibSVMSerializer(SimpleBaseSerializer):
    """Text already in LibSVM format (``<label> <index>:<value> ...``), a str or a file-like object."""

    def __init__(self, content_type: str = "text/libsvm") -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if isinstance(data, str):
            return data
        if hasattr(data, "read"):
            return data.read()
        raise ValueError(f"Unable to handle input format: {type(data)}")


class DataSerializer(SimpleBaseSerializer):
    """The raw bytes of a file: a path (str), bytes, or a dict whose ``"data"`` is one of those."""

    def __init__(self, content_type: str = "file-path/raw-bytes") -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if isinstance(data, str):
            try:
                with open(data, "rb") as file:
                    return file.read()
            except Exception as exc:
                raise ValueError(f"Could not open/read file: {data}. {exc}") from exc
        if isinstance(data, bytes):
            return data
        if isinstance(data, dict) and "data" in data:
            return self.serialize(data["data"])
        raise ValueError(f"Object of type {type(data)} is not Data serializable.")


class SparseMatrixSerializer(SimpleBaseSerializer):
    """A SciPy sparse matrix (csc, csr, bsr, dia or coo) as ``.npz``, written by ``scipy.sparse.save_npz``."""

    def __init__(self, content_type: str = npz.MEDIA_TYPE) -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> bytes:
        try:
            import scipy.sparse  # type: ignore[import-untyped]
        except ImportError:
            raise ImportError("SparseMatrixSerializer needs SciPy: pip install scipy") from None
        buffer = io.BytesIO()
        scipy.sparse.save_npz(buffer, data)
        return buffer.getvalue()


class RecordSerializer(SimpleBaseSerializer):
    """A 1-D or 2-D array (int64, float64 or float32) as RecordIO-protobuf, one record per row, in a ``BytesIO``:
    the format of SageMaker's built-in algorithms, written without protobuf."""

    def __init__(self, content_type: str = "application/x-recordio-protobuf") -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> io.BytesIO:
        if len(data.shape) == 1:
            data = data.reshape(1, data.shape[0])
        if len(data.shape) != 2:
            raise ValueError(f"Expected a 1D or 2D array, but got a {len(data.shape)}D array instead.")
        return io.BytesIO(_record.write_dense(data))


class TorchTensorSerializer(SimpleBaseSerializer):
    """A ``torch.Tensor`` (on the CPU) as ``.npy``, sent as ``tensor/pt`` unless told otherwise; PyTorch must be
    installed (the constructor imports it, as the SDK's does)."""

    def __init__(self, content_type: str = "tensor/pt") -> None:
        super().__init__(content_type=content_type)
        self.torch_tensor = _torch_module("TorchTensorSerializer").Tensor
        self.numpy_serializer = NumpySerializer()

    def serialize(self, data: Any) -> Any:
        if isinstance(data, self.torch_tensor):
            try:
                return self.numpy_serializer.serialize(data.detach().numpy())
            except Exception as exc:
                raise ValueError(f"Unable to serialize your data because: {exc}.") from exc
        raise ValueError(f"Object of type {type(data)} is not a torch.Tensor")


def _torch_module(user: str) -> Any:
    """PyTorch, imported when a TorchTensor class is made (an ImportError naming it when it is missing)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ImportError(f"{user} needs PyTorch: pip install torch") from None


class ArrowSerializer(SimpleBaseSerializer):
    """A pyarrow Table, RecordBatch, dict of 1-D arrays or pandas DataFrame as an Arrow IPC stream."""

    def __init__(self, content_type: str = arrow.STREAM) -> None:
        super().__init__(content_type=content_type)

    def serialize(self, data: Any) -> Any:
        if hasattr(data, "read"):
            return data.read()
        return codecs.dumps(data, codecs.bare(self.content_type))
