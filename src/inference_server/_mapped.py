"""Model files loaded memory-mapped and read-only (:func:`mapped`): the workers that load the same file share its
pages through the page cache instead of each holding a copy.

A model loaded before the workers start is shared by ``fork`` (``serve --preload``); one loaded later in each worker
(a multi-model endpoint's, a ``TargetModel``'s, the v2 repository's) can share only what the system shares: a file's
pages. :func:`mapped` maps the arrays of NumPy's ``.npy`` and ``.npz`` files and of the safetensors format (what
Hugging Face stores weights in) straight from the file, read-only: a page is read from disk once, the first time any
worker touches it, and is then in memory once for the machine, counted in each worker's PSS by its share. Nothing is
unpickled: an array of Python objects is refused, as the codecs refuse it.

A part of a file that cannot be mapped is read into memory instead, with a DEBUG line saying so: a compressed member of
an ``.npz`` (``numpy.savez_compressed``). The arrays are read-only: a model that writes to its weights gets an error
at the write, not a private copy of the page. An ``.npz`` member's data lies where the zip format puts it, not aligned
to its dtype (the zip header before it shifts numpy's padding), and NumPy copies unaligned operands before some
operations (a matrix product through BLAS): ``.npy`` and safetensors files keep their data aligned.

A file that is malformed, cut short or hostile (offsets past its end, a shape larger than its data, a header of
absurd size or depth) is a :class:`ValueError` that names it and says what is wrong, never a view past its end.
"""

from __future__ import annotations

import json
import logging
import lzma
import math
import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("inference_server")

#: What reading a malformed or hostile file can raise, each turned into a :class:`ValueError` naming the file.
_UNREADABLE = (
    OSError, EOFError, ValueError, TypeError, KeyError, OverflowError, RecursionError, NotImplementedError,
    struct.error, zipfile.BadZipFile, zlib.error, lzma.LZMAError, UnicodeDecodeError,
)  # fmt: skip

#: The largest safetensors header read (its format's own limit is 100 MB).
MAX_HEADER = 100_000_000
#: safetensors' dtypes that NumPy has, little-endian as the format stores them.
_SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}  # fmt: skip


def mapped(path: str | os.PathLike[str]) -> Any:
    """The arrays of the file at ``path``, memory-mapped and read-only: an ``.npy`` file's array; a dict of name to
    array for ``.npz`` (the names :func:`numpy.load` gives) and ``.safetensors``. :class:`ValueError` says what is
    wrong with a file that is not one of these or is malformed."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except _UNREADABLE as exc:
            raise ValueError(f"{path}: not a readable .npy file: {exc}") from None
        if not isinstance(array, np.ndarray):  # (a zip archive: numpy.load gives an NpzFile)
            array.close()
            raise ValueError(f"{path}: not a readable .npy file: it is a zip archive (.npz)")
        return array
    if suffix == ".npz":
        return _npz(path)
    if suffix == ".safetensors":
        return _safetensors(path)
    raise ValueError(
        f"{path}: inference_server.mapped reads .npy, .npz and .safetensors files, not {suffix or path.name!r}"
    )


def _npz(path: Path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive, path.open("rb") as file:
            for member in archive.infolist():
                if member.flag_bits & 0x1:
                    raise ValueError(f"{member.filename} is encrypted")
                name = member.filename.removesuffix(".npy")
                array = _stored(file, member) if member.compress_type == zipfile.ZIP_STORED else None
                if array is None:
                    logger.debug(
                        "%s: %s cannot be mapped (it is compressed, or its .npy header is of version 3), so it is "
                        "read into memory",
                        path,
                        member.filename,
                    )
                    with archive.open(member) as data:
                        array = np.lib.format.read_array(data, allow_pickle=False)
                    array.flags.writeable = False
                arrays[name] = array
    except _UNREADABLE as exc:
        raise ValueError(f"{path}: not a readable .npz file: {exc}") from None
    return arrays


def member_offset(file: Any, member: zipfile.ZipInfo) -> int:
    """Where the data of the zip member ``member`` starts in ``file`` (the archive, opened for reading): after its
    local header, whose name and extra field may differ from the central directory's. :class:`ValueError` if there
    is no local header there, or the data would end past the file's end."""
    file.seek(member.header_offset)
    local = file.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{member.filename} has no local header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    start = int(member.header_offset) + 30 + int(name_length) + int(extra_length)
    if start + member.compress_size > os.fstat(file.fileno()).st_size:
        raise ValueError(f"{member.filename} ends past the end of the file")
    return start


def _stored(file: Any, member: zipfile.ZipInfo) -> np.ndarray | None:
    """An uncompressed ``.npz`` member's array, mapped where its bytes lie in the file; None for a header this does
    not read (the ``.npy`` format's version 3, for UTF-8 field names), which is read into memory instead."""
    start = member_offset(file, member)
    file.seek(start)
    version = np.lib.format.read_magic(file)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
    else:
        return None
    if dtype.hasobject:
        raise ValueError(f"{member.filename} holds Python objects, which are never unpickled")
    offset = file.tell()
    size = math.prod(shape) * dtype.itemsize  # (Python's integers: a hostile shape cannot overflow)
    if offset - start + size != member.file_size:
        raise ValueError(f"{member.filename}'s header does not match its size")
    if size == 0:
        empty = np.empty(shape, dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(file.name, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > MAX_HEADER:
                raise ValueError(f"its header declares {length} bytes, more than {MAX_HEADER}")
            raw = file.read(length)
            if len(raw) != length:
                raise ValueError(f"the file ends inside its {length}-byte header")
            header = json.loads(raw, object_pairs_hook=_once)
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        start, whole = 8 + length, np.memmap(path, dtype=np.uint8, mode="r")
        arrays = {}
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            arrays[name] = _tensor(name, tensor, whole, start)
    except _UNREADABLE as exc:
        raise ValueError(f"{path}: not a readable .safetensors file: {exc}") from None
    return arrays


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (a repeated tensor name is refused, not the last one kept)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("its header names a key twice")
    return found


def _integers(value: Any, what: str, count: int | None = None) -> list[int]:
    """``value`` as a list of non-negative integers below 2**63 (``count`` of them, if given), else ValueError."""
    if not isinstance(value, list) or (count is not None and len(value) != count):
        raise ValueError(f"its {what} is not a list of {count or 'some'} integers")
    if not all(type(n) is int and 0 <= n < 1 << 63 for n in value):
        raise ValueError(f"its {what} holds something other than a non-negative integer")
    return value


def _tensor(name: str, tensor: Any, whole: np.memmap, start: int) -> np.ndarray:
    if not isinstance(tensor, dict):
        raise ValueError(f"tensor {name!r} is not described by a JSON object")
    kind = tensor["dtype"]
    if not isinstance(kind, str) or kind not in _SAFETENSORS_DTYPES:
        raise ValueError(
            f"tensor {name!r} is {kind}, which NumPy has no dtype for: load it with safetensors' own loader "
            "(safetensors.safe_open), which maps it too"
        )
    dtype = np.dtype(_SAFETENSORS_DTYPES[kind])
    shape = tuple(_integers(tensor["shape"], f"tensor {name!r}'s shape"))
    begin, end = _integers(tensor["data_offsets"], f"tensor {name!r}'s data_offsets", 2)
    if not 0 <= begin <= end <= whole.size - start or end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"tensor {name!r}'s offsets do not match its shape and the file")
    return whole[start + begin : start + end].view(dtype).reshape(shape)
