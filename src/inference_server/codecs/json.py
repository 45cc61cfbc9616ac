"""``application/json`` with orjson: NumPy arrays and scalars are encoded natively."""

from __future__ import annotations

import json as stdjson
from typing import Any

import numpy as np
import orjson

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError, EncodeError

MEDIA_TYPE = "application/json"
OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


#: What a cell of an object array may hold to be sent as text (JSON, JSON Lines, CSV); bytes must be UTF-8.
PLAIN_CELLS = (str, bytes, int, float, type(None), np.number, np.bool_)


def _cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


_cells = np.frompyfunc(_cell, 1, 1)


def has_plain_cells(array: np.ndarray[Any, Any]) -> bool:
    """Whether an object array holds only strings, UTF-8 bytes and numbers (scikit-learn's string labels)."""
    for value in array.flat:
        if not isinstance(value, PLAIN_CELLS):
            return False
        if isinstance(value, bytes):
            try:
                value.decode()
            except UnicodeDecodeError:
                return False
    return True


def as_lists(array: np.ndarray[Any, Any]) -> Any:
    """Nested lists of plain Python values (an object array's bytes as UTF-8 strings); nothing is unpickled."""
    if array.dtype.hasobject:
        return _cells(array).tolist() if array.ndim else _cell(array.item())
    return array.tolist()


def default(obj: Any) -> Any:
    """What orjson cannot encode natively: non-contiguous, unusual or object arrays, NumPy scalars."""
    if isinstance(obj, np.ndarray) and (not obj.dtype.hasobject or has_plain_cells(obj)):
        return as_lists(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__} as JSON")


def dumps(obj: Any, nan: str = "null") -> bytes:
    """One JSON document; NaN and infinities become ``null`` (strict JSON), ``NaN`` / ``Infinity`` tokens
    (``nan="literal"``, as Python's json and pandas write and read them), or an :class:`EncodeError` (``"error"``)."""
    if nan == "null":
        return orjson.dumps(obj, default=default, option=OPTIONS)
    try:  # the standard library writes the tokens, or refuses them; arrays go through default() as lists
        text = stdjson.dumps(obj, default=default, allow_nan=nan == "literal", separators=(",", ":"))
    except ValueError:
        raise EncodeError(
            "the prediction holds NaN or infinity, which strict JSON cannot represent (INFERENCE_SERVER_JSON_NAN "
            "is 'error'; 'null' sends null, 'literal' sends NaN and Infinity)"
        ) from None
    return text.encode()


def loads(data: Buffer, what: str = "JSON") -> Any:
    """Parse one JSON document, raising DecodeError with orjson's position of the problem."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid {what}: {exc}") from None


class JSONCodec(Codec):
    """Any JSON value; the fallback format for predictions."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> Any:
        return loads(data)

    def encode(self, obj: Any, nan: str = "null") -> list[Buffer]:
        return [dumps(obj, nan)]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return not obj.dtype.hasobject or has_plain_cells(obj)
        return not isinstance(obj, (bytes, bytearray, memoryview)) and type(obj).__module__.split(".")[0] not in (
            "pyarrow",
            "pandas",
        )

    def natural_for(self, obj: Any) -> bool:
        return not isinstance(obj, (np.ndarray, str))
