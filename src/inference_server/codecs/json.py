"""``application/json`` with orjson: NumPy arrays and scalars are encoded natively."""

from __future__ import annotations

import json as stdjson
import re
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
    """Nested lists of plain Python values (bytes as UTF-8 strings); nothing is unpickled."""
    if array.dtype.kind == "S":
        array = array.astype(object)
    if array.dtype.hasobject:
        return _cells(array).tolist() if array.ndim else _cell(array.item())
    return array.tolist()


#: Most nesting of arrays and objects a JSON body may have: orjson writes at most this many levels, so a deeper
#: body could never be answered in JSON (decoding refuses it with 400 instead).
MAX_DEPTH = 255
#: NumPy kinds JSON can carry: bool, integers, floats, datetimes (ISO 8601 strings), str; bytes when UTF-8.
_JSON_KINDS = frozenset("biufMU")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def array_is_jsonable(array: np.ndarray[Any, Any]) -> bool:
    """Whether JSON can carry ``array``: not complex, timedelta or raw void; structured arrays field by field."""
    dtype = array.dtype
    if dtype.names is not None:
        return all(array_is_jsonable(array[name]) for name in dtype.names)
    if dtype.kind in _JSON_KINDS:
        return True
    if dtype.kind == "S":
        return has_plain_cells(array.astype(object))
    return dtype.kind == "O" and has_plain_cells(array)


def default(obj: Any) -> Any:
    """What orjson cannot encode natively: non-contiguous, big-endian, unusual or object arrays, NumPy scalars,
    bytes (as UTF-8 text)."""
    if isinstance(obj, np.ndarray) and array_is_jsonable(obj):
        return as_lists(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes):
        return obj.decode()
    raise TypeError(f"cannot send a {type(obj).__name__} as JSON")


def _native(obj: Any) -> Any:
    """``obj`` with big-endian arrays (which orjson refuses outright, before ``default``) in native byte order."""
    if isinstance(obj, np.ndarray) and obj.dtype.byteorder not in "=|":
        return obj.astype(obj.dtype.newbyteorder("="))
    if isinstance(obj, dict):
        return {key: _native(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_native(value) for value in obj]
    return obj


def depth(data: Buffer) -> int:
    """How deeply arrays and objects nest in a JSON text (strings skipped), counted at C speed."""
    text = bytes(data)
    if text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return 0  # cannot be too deep: the common case costs two counts
    codes = np.frombuffer(_STRING.sub(b"", text), dtype=np.uint8)
    opens = (codes == ord("[")) | (codes == ord("{"))
    closes = (codes == ord("]")) | (codes == ord("}"))
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def dumps(obj: Any, nan: str = "null") -> bytes:
    """One JSON document; NaN and infinities become ``null`` (strict JSON), ``NaN`` / ``Infinity`` tokens
    (``nan="literal"``, as Python's json and pandas write and read them), or an :class:`EncodeError` (``"error"``)."""
    if nan == "null":
        try:
            return orjson.dumps(obj, default=default, option=OPTIONS)
        except orjson.JSONEncodeError as exc:
            if "native-endianness" not in str(exc):
                raise
            return orjson.dumps(_native(obj), default=default, option=OPTIONS)
    try:  # the standard library writes the tokens, or refuses them; arrays go through default() as lists
        text = stdjson.dumps(obj, default=default, allow_nan=nan == "literal", separators=(",", ":"))
    except ValueError:
        raise EncodeError(
            "the prediction holds NaN or infinity, which strict JSON cannot represent (INFERENCE_SERVER_JSON_NAN "
            "is 'error'; 'null' sends null, 'literal' sends NaN and Infinity)"
        ) from None
    return text.encode()


def number_table(array: np.ndarray[Any, Any], kinds: str = "biuf", finite_only: bool = False) -> bytes | None:
    """orjson's text of a 1-D or 2-D array of booleans or numbers (``[1,2]``, ``[[1,2],[3,4]]``), or None when the
    array is of another kind, structured or empty, or (``finite_only``) holds NaN or infinity.

    No value's text holds a comma or a bracket, so JSON Lines and CSV can cut this text into lines and cells: about
    50 times faster than writing value by value, and without a Python object per value.
    """
    if array.dtype.kind not in kinds or array.dtype.names is not None or array.ndim not in (1, 2) or not array.size:
        return None
    if finite_only and array.dtype.kind == "f" and not np.isfinite(array).all():
        return None
    return dumps(array)


_ONE_PER_LINE = bytes.maketrans(b",", b"\n")


def lines_of(text: bytes, ndim: int, row_brackets: bool) -> bytes:
    """:func:`number_table`'s text as lines: one value per line for 1-D, one row per line for 2-D (as a JSON array
    with ``row_brackets``, else its values joined by commas)."""
    if ndim == 1:
        return text.translate(_ONE_PER_LINE, b"[]") + b"\n"
    if row_brackets:
        return text[1:-1].replace(b"],[", b"]\n[") + b"\n"
    return text[2:-2].replace(b"],[", b"\n") + b"\n"


def loads(data: Buffer, what: str = "JSON") -> Any:
    """Parse one JSON document, raising DecodeError with orjson's position of the problem, or for nesting deeper
    than :data:`MAX_DEPTH`."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid {what}: {exc}") from None
    nesting = depth(data)
    if nesting > MAX_DEPTH:
        raise DecodeError(f"{what} nests {nesting} levels deep; at most {MAX_DEPTH} are accepted")
    return value


class JSONCodec(Codec):
    """Any JSON value; the fallback format for predictions."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> Any:
        return loads(data)

    def encode(self, obj: Any, nan: str = "null") -> list[Buffer]:
        return [dumps(obj, nan)]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return array_is_jsonable(obj)
        return not isinstance(obj, (bytes, bytearray, memoryview)) and type(obj).__module__.split(".")[0] not in (
            "pyarrow",
            "pandas",
        )

    def natural_for(self, obj: Any) -> bool:
        return not isinstance(obj, (np.ndarray, str))
