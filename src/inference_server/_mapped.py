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
at the write, not a private copy of the page.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("inference_server")

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
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
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
                    logger.debug("%s: %s is compressed, so it is read into memory, not mapped", path, member.filename)
                    with archive.open(member) as data:
                        array = np.lib.format.read_array(data, allow_pickle=False)
                arrays[name] = array
    except (zipfile.BadZipFile, EOFError, OSError, struct.error, ValueError) as exc:
        raise ValueError(f"{path}: not a readable .npz file: {exc}") from None
    return arrays


def _stored(file: Any, member: zipfile.ZipInfo) -> np.ndarray | None:
    """An uncompressed ``.npz`` member's array, mapped where its bytes lie in the file; None for a header this does
    not read (the ``.npy`` format's version 3, for UTF-8 field names), which is read into memory instead."""
    file.seek(member.header_offset)
    local = file.read(30)
    if local[:4] != b"PK\x03\x04":
        raise ValueError(f"{member.filename} has no local header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    start = member.header_offset + 30 + name_length + extra_length
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
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset - start + size != member.file_size:
        raise ValueError(f"{member.filename}'s header does not match its size")
    if size == 0:
        return np.empty(shape, dtype)
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
            header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        start, whole = 8 + length, np.memmap(path, dtype=np.uint8, mode="r")
        arrays = {}
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            arrays[name] = _tensor(name, tensor, whole, start)
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a readable .safetensors file: {exc}") from None
    return arrays


def _tensor(name: str, tensor: dict[str, Any], whole: np.memmap, start: int) -> np.ndarray:
    kind = tensor["dtype"]
    if kind not in _SAFETENSORS_DTYPES:
        raise ValueError(
            f"tensor {name!r} is {kind}, which NumPy has no dtype for: load it with safetensors' own loader "
            "(safetensors.safe_open), which maps it too"
        )
    dtype = np.dtype(_SAFETENSORS_DTYPES[kind])
    shape = tuple(int(n) for n in tensor["shape"])
    begin, end = (int(n) for n in tensor["data_offsets"])
    if (
        not 0 <= begin <= end <= whole.size - start
        or end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    ):
        raise ValueError(f"tensor {name!r}'s offsets do not match its shape and the file")
    return whole[start + begin : start + end].view(dtype).reshape(shape)
