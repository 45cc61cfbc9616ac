"""``application/x-npy``: NumPy's ``.npy`` format, zero-copy both ways, never unpickling.

The header is parsed by a fast path for what ``np.save`` writes and by :func:`ast.literal_eval` (literals only,
never code) for anything else; the array is a view on the body (``np.frombuffer``), and encoding returns the header
plus a memoryview of the array's own memory.
"""

from __future__ import annotations

import ast
import functools
import math
import re
import struct
from typing import Any

import numpy as np

from inference_server.codecs._registry import Buffer, Codec, Limits, cache_short
from inference_server.errors import DecodeError

MEDIA_TYPE = "application/x-npy"
MAGIC = b"\x93NUMPY"
#: numpy refuses headers longer than this by default; so do we.
MAX_HEADER = 10_000
_ALIGN = 64
_FAST_HEADER = re.compile(r"\{'descr': '([^']*)', 'fortran_order': (True|False), 'shape': \(((?:\d+, ?)*\d*)\), \}\s*")


def _make_dtype(descr: Any) -> np.dtype[Any]:
    try:
        dtype = np.dtype(descr if isinstance(descr, str) else _listify(descr))
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"npy header has an invalid dtype {descr!r}: {exc}") from None
    if dtype.hasobject:
        raise DecodeError("npy data of object dtype is refused: it would need unpickling")
    if dtype.subdtype is not None:
        raise DecodeError(f"npy header has a sub-array dtype {descr!r}; np.save never writes one")
    if dtype.itemsize == 0:  # any element count fits in no bytes: a few bytes could declare billions
        raise DecodeError(f"npy header has a dtype of zero size {descr!r}: it carries no data")
    if dtype.names is not None:
        try:
            dtype.descr  # noqa: B018  (raises for fields that overlap or are out of order)
        except ValueError:
            raise DecodeError(
                "npy header has a structured dtype with overlapping fields; np.save never writes one"
            ) from None
    return dtype


_dtype = cache_short(512)(_make_dtype)


def _listify(descr: Any) -> Any:
    """literal_eval gives tuples; np.dtype wants a list of fields for a structured descr."""
    if isinstance(descr, tuple):
        return tuple(_listify(item) for item in descr)
    if isinstance(descr, list):
        return [_listify(item) for item in descr]
    return descr


@cache_short(1024)
def _layout(raw: bytes, utf8: bool) -> tuple[np.dtype[Any], bool, tuple[int, ...], int]:
    """dtype, fortran order, shape and element count of a raw header; cached, as a server sees the same few
    headers again and again."""
    try:
        text = raw.decode("utf-8" if utf8 else "latin-1")
    except UnicodeDecodeError:
        raise DecodeError("npy header is not valid UTF-8") from None
    dtype, fortran_order, shape = _parse_header(text)
    return dtype, fortran_order, shape, math.prod(shape)


def _parse_header(header: str) -> tuple[np.dtype[Any], bool, tuple[int, ...]]:
    match = _FAST_HEADER.fullmatch(header)
    if match:
        descr, fortran, shape_text = match.groups()
        shape = tuple(int(n) for n in shape_text.split(",") if n.strip())
        return _dtype(descr), fortran == "True", shape
    try:
        fields = ast.literal_eval(header)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise DecodeError(f"npy header is not a Python literal: {header[:80]!r}") from None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise DecodeError("npy header must be a dict with exactly the keys descr, fortran_order and shape")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise DecodeError(f"npy header has an invalid shape {shape!r}")
    if not isinstance(fortran, bool):
        raise DecodeError(f"npy header has an invalid fortran_order {fortran!r}")
    descr = fields["descr"]
    return (_dtype(descr) if isinstance(descr, str) else _make_dtype(descr)), fortran, shape


def decode_npy(data: Buffer) -> np.ndarray[Any, Any]:
    """Decode one ``.npy`` body into an array that views the body's memory."""
    view = memoryview(data)
    if view[:6] != MAGIC[: view.nbytes]:
        raise DecodeError("not an npy body: it does not start with the \\x93NUMPY magic")
    if view.nbytes < 10:
        raise DecodeError(f"npy body is truncated: {view.nbytes} bytes, less than the smallest header")
    major = view[6]
    if major == 1:
        (header_length,) = struct.unpack_from("<H", view, 8)
        start = 10
    elif major in (2, 3):
        if view.nbytes < 12:
            raise DecodeError("npy body is truncated inside its header")
        (header_length,) = struct.unpack_from("<I", view, 8)
        start = 12
    else:
        raise DecodeError(f"npy format version {major} is not supported (1, 2 and 3 are)")
    if header_length > MAX_HEADER:
        raise DecodeError(f"npy header is {header_length} bytes; at most {MAX_HEADER} are allowed")
    end = start + header_length
    if end > view.nbytes:
        raise DecodeError(f"npy body is truncated: the header needs {end} bytes, the body has {view.nbytes}")
    dtype, fortran_order, shape, count = _layout(bytes(view[start:end]), major == 3)
    expected = count * dtype.itemsize
    available = view.nbytes - end
    if expected != available:
        raise DecodeError(f"npy header declares {expected} bytes of {dtype} data (shape {shape}), body has {available}")
    if count == 0 or dtype.itemsize == 0:
        return np.empty(shape, dtype)
    array: np.ndarray[Any, Any] = np.ndarray(shape, dtype, buffer=view, offset=end, order="F" if fortran_order else "C")
    return array


@functools.lru_cache(maxsize=512)
def _descr(dtype: np.dtype[Any]) -> str:
    return repr(np.lib.format.dtype_to_descr(dtype))


@functools.lru_cache(maxsize=1024)
def header(dtype: np.dtype[Any], shape: tuple[int, ...], fortran_order: bool) -> bytes:
    """The ``.npy`` header (magic, version, length, padded dict) for an array of this layout."""
    text = f"{{'descr': {_descr(dtype)}, 'fortran_order': {fortran_order}, 'shape': {shape!r}, }}"
    body = text.encode("latin-1")
    length = len(body) + 1  # the terminating newline
    version, prefix = (b"\x01\x00", 10) if length + _ALIGN < 65536 else (b"\x02\x00", 12)
    padding = -(prefix + length) % _ALIGN
    size = struct.pack("<H" if prefix == 10 else "<I", length + padding)
    return MAGIC + version + size + body + b" " * padding + b"\n"


def as_array(obj: Any) -> np.ndarray[Any, Any]:
    """``obj`` as an array we can send: object arrays (pickles) are refused."""
    array = obj if isinstance(obj, np.ndarray) else np.asarray(obj)
    if array.dtype.hasobject:
        raise TypeError("cannot send an array of object dtype as npy: it would need pickling")
    return array


def encode_npy(obj: Any) -> list[Buffer]:
    """Header plus a view of the array's memory (a copy only when the array is not contiguous)."""
    array = as_array(obj)
    if array.flags.c_contiguous:
        fortran_order = False
    elif array.flags.f_contiguous:
        fortran_order = True
    else:
        array, fortran_order = np.ascontiguousarray(array), False
    head = header(array.dtype, array.shape, fortran_order)
    if array.size == 0 or array.dtype.itemsize == 0:
        return [head]
    ordered: np.ndarray[Any, Any] = array.T if fortran_order else array
    try:
        return [head, memoryview(ordered).cast("B")]  # type: ignore[arg-type]  # ndarray exports a buffer
    except (TypeError, ValueError, NotImplementedError):  # dtypes without a buffer format (datetime64, ...)
        flat: np.ndarray[Any, Any] = ordered.reshape(-1).view(np.uint8)
        return [head, flat.data]


def _array_like(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return not obj.dtype.hasobject
    return isinstance(obj, (np.generic, int, float, complex, bool))


class NpyCodec(Codec):
    """NumPy arrays as ``.npy``."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> np.ndarray[Any, Any]:
        return decode_npy(data)

    def encode(self, obj: Any) -> list[Buffer]:
        return encode_npy(obj)

    def can_encode(self, obj: Any) -> bool:
        return _array_like(obj)

    def natural_for(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray)
