"""``application/x-npz``: several named arrays in one zip of ``.npy`` members, as ``np.savez`` writes.

Decoding reads the zip's central directory itself: stored members become arrays that view the body (no copy),
deflated members (``np.savez_compressed``) are inflated within :class:`Limits`, and an archive whose declared sizes
exceed the limits is refused before anything is inflated. Encoding writes stored members whose data are the
arrays' own memory. The result is a plain ``dict[str, ndarray]`` in archive order.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.codecs.npy import as_array, decode_npy, encode_npy
from inference_server.errors import DecodeError

MEDIA_TYPE = "application/x-npz"

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")
_LOCAL_SIG, _CENTRAL_SIG, _EOCD_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_ZIP64_LOCATOR_SIG, _ZIP64_EOCD_SIG = 0x07064B50, 0x06064B50
_MAX32, _MAX16 = 0xFFFFFFFF, 0xFFFF
_STORED, _DEFLATED = 0, 8
_DOS_DATE = 0x21  # 1980-01-01, the zip epoch: our archives are reproducible


class _Member(NamedTuple):
    name: str
    method: int
    crc: int
    compressed_size: int
    size: int
    offset: int


def _find_end(view: memoryview) -> int:
    tail_start = max(0, view.nbytes - _EOCD.size - _MAX16)
    position = bytes(view[tail_start:]).rfind(b"PK\x05\x06")
    if position < 0:
        raise DecodeError("not an npz body: no zip end-of-central-directory record")
    return tail_start + position


def _directory(view: memoryview, limits: Limits) -> Iterator[_Member]:
    end = _find_end(view)
    if end + _EOCD.size > view.nbytes:
        raise DecodeError("npz body is truncated inside its end-of-central-directory record")
    _, _, _, _, count, directory_size, directory_offset, _ = _EOCD.unpack_from(view, end)
    if count == _MAX16 or _MAX32 in (directory_size, directory_offset):
        locator = end - _ZIP64_LOCATOR.size
        if locator < 0 or _ZIP64_LOCATOR.unpack_from(view, locator)[0] != _ZIP64_LOCATOR_SIG:
            raise DecodeError("npz body declares zip64 sizes but has no zip64 locator")
        zip64_end = _ZIP64_LOCATOR.unpack_from(view, locator)[2]
        if zip64_end + _ZIP64_EOCD.size > locator or _ZIP64_EOCD.unpack_from(view, zip64_end)[0] != _ZIP64_EOCD_SIG:
            raise DecodeError("npz body has a broken zip64 end-of-central-directory record")
        *_, count, directory_size, directory_offset = _ZIP64_EOCD.unpack_from(view, zip64_end)
        end = zip64_end
    if count > limits.max_archive_members:
        raise DecodeError(f"npz archive has {count} members; at most {limits.max_archive_members} are allowed")
    if directory_offset + directory_size > end:
        raise DecodeError("npz body is truncated: its central directory lies beyond the end of the body")
    position = directory_offset
    for _ in range(count):
        if position + _CENTRAL.size > end:
            raise DecodeError("npz central directory is truncated")
        fields = _CENTRAL.unpack_from(view, position)
        if fields[0] != _CENTRAL_SIG:
            raise DecodeError("npz central directory is corrupt (bad entry signature)")
        flags, method, crc, compressed_size, size = fields[3], fields[4], fields[7], fields[8], fields[9]
        name_length, extra_length, comment_length, offset = fields[10], fields[11], fields[12], fields[16]
        name_start = position + _CENTRAL.size
        raw_name = bytes(view[name_start : name_start + name_length])
        extra = view[name_start + name_length : name_start + name_length + extra_length]
        size, compressed_size, offset = _zip64_extra(extra, size, compressed_size, offset)
        if flags & 0x1:
            raise DecodeError(f"npz member {raw_name!r} is encrypted")
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        yield _Member(name, method, crc, compressed_size, size, offset)
        position = name_start + name_length + extra_length + comment_length


def _zip64_extra(extra: memoryview, size: int, compressed_size: int, offset: int) -> tuple[int, int, int]:
    position = 0
    while position + 4 <= extra.nbytes:
        header_id, length = struct.unpack_from("<HH", extra, position)
        if header_id == 0x0001:
            values = iter(struct.unpack_from(f"<{min(length, 24) // 8}Q", extra, position + 4))
            size = next(values, size) if size == _MAX32 else size
            compressed_size = next(values, compressed_size) if compressed_size == _MAX32 else compressed_size
            offset = next(values, offset) if offset == _MAX32 else offset
        position += 4 + length
    if _MAX32 in (size, compressed_size, offset):
        raise DecodeError("npz member declares zip64 sizes but has no zip64 extra field")
    return size, compressed_size, offset


def _member_data(view: memoryview, member: _Member, limit: int) -> Buffer:
    if member.offset + _LOCAL.size > view.nbytes:
        raise DecodeError(f"npz member {member.name!r} starts beyond the end of the body")
    fields = _LOCAL.unpack_from(view, member.offset)
    if fields[0] != _LOCAL_SIG:
        raise DecodeError(f"npz member {member.name!r} has a corrupt local header")
    start = member.offset + _LOCAL.size + fields[9] + fields[10]
    end = start + member.compressed_size
    if end > view.nbytes:
        raise DecodeError(
            f"npz member {member.name!r} is truncated: {member.compressed_size} bytes declared, "
            f"{max(0, view.nbytes - start)} present"
        )
    raw = view[start:end]
    if member.method == _STORED:
        if member.size != member.compressed_size:
            raise DecodeError(f"npz member {member.name!r} is stored but its two sizes differ")
        return raw
    if member.method != _DEFLATED:
        raise DecodeError(f"npz member {member.name!r} uses zip method {member.method}; only stored and deflated")
    inflater = zlib.decompressobj(-15)
    try:
        data = inflater.decompress(raw, min(member.size, limit) + 1)
    except zlib.error as exc:
        raise DecodeError(f"npz member {member.name!r} is not valid deflate data: {exc}") from None
    if len(data) > member.size:
        raise DecodeError(f"npz member {member.name!r} inflates beyond its declared {member.size} bytes")
    if len(data) < member.size or not inflater.eof:
        raise DecodeError(f"npz member {member.name!r} is truncated: it inflates to fewer bytes than declared")
    if zlib.crc32(data) != member.crc:
        raise DecodeError(f"npz member {member.name!r} fails its CRC check")
    return data


def decode_npz(data: Buffer, limits: Limits) -> dict[str, np.ndarray[Any, Any]]:
    """Decode an ``.npz`` body into a dict of arrays, in archive order."""
    view = memoryview(data).cast("B")
    members = list(_directory(view, limits))
    spans = sorted(
        (member.offset, member.offset + _LOCAL.size + member.compressed_size, member.name) for member in members
    )
    for (_, end, name), (start, _, other) in itertools.pairwise(spans):
        if start < end:  # one stored member listed 1,024 times would decode to 1,024 arrays from one body
            raise DecodeError(f"npz members {name!r} and {other!r} overlap in the body; each must have its own bytes")
    inflated = sum(member.size for member in members if member.method != _STORED)
    if inflated > limits.max_decompressed_bytes:
        raise limits.decompressed_too_large(f"npz members would inflate to {inflated} bytes")
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for member in members:
        key = member.name.removesuffix(".npy")
        if key in arrays:
            raise DecodeError(f"npz archive has two members named {member.name!r}")
        member_data = _member_data(view, member, limits.max_decompressed_bytes)
        try:
            arrays[key] = decode_npy(member_data)
        except DecodeError as exc:
            raise DecodeError(f"npz member {member.name!r}: {exc.description}") from None
    return arrays


def named_arrays(obj: Any) -> dict[str, Any]:
    """A dict of arrays (names kept), a tuple or list (``arr_0``...), or one array (``arr_0``)."""
    if isinstance(obj, Mapping):
        return {str(name): value for name, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return {f"arr_{i}": value for i, value in enumerate(obj)}
    return {"arr_0": obj}


def encode_npz(obj: Any) -> list[Buffer]:
    """Stored (uncompressed) members whose data are the arrays' own memory."""
    parts: list[Buffer] = []
    directory: list[bytes] = []
    offset = 0
    for name, value in named_arrays(obj).items():
        npy = encode_npy(value)
        size = sum(memoryview(part).nbytes for part in npy)
        crc = 0
        for part in npy:
            crc = zlib.crc32(part, crc)
        filename = f"{name}.npy".encode()
        local, central = _headers(filename, crc, size, offset)
        parts += [local, *npy]
        directory.append(central)
        offset += len(local) + size
    directory_size = sum(len(entry) for entry in directory)
    parts += directory
    parts.append(_end(len(directory), directory_size, offset))
    return parts


def _headers(filename: bytes, crc: int, size: int, offset: int) -> tuple[bytes, bytes]:
    big, far = size >= _MAX32, offset >= _MAX32
    version = 45 if big or far else 20
    local_extra = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
    stored_size = _MAX32 if big else size
    local = _LOCAL.pack(
        _LOCAL_SIG, version, 0x800, _STORED, 0, _DOS_DATE, crc, stored_size, stored_size, len(filename),
        len(local_extra),
    ) + filename + local_extra  # fmt: skip
    values = ([size, size] if big else []) + ([offset] if far else [])
    central_extra = struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values) if values else b""
    central = _CENTRAL.pack(
        _CENTRAL_SIG, version, version, 0x800, _STORED, 0, _DOS_DATE, crc, stored_size, stored_size,
        len(filename), len(central_extra), 0, 0, 0, 0o644 << 16, _MAX32 if far else offset,
    ) + filename + central_extra  # fmt: skip
    return local, central


def _end(count: int, directory_size: int, directory_offset: int) -> bytes:
    if count < _MAX16 and directory_size < _MAX32 and directory_offset < _MAX32:
        return _EOCD.pack(_EOCD_SIG, 0, 0, count, count, directory_size, directory_offset, 0)
    zip64_end = directory_offset + directory_size
    return (
        _ZIP64_EOCD.pack(_ZIP64_EOCD_SIG, 44, 45, 45, 0, 0, count, count, directory_size, directory_offset)
        + _ZIP64_LOCATOR.pack(_ZIP64_LOCATOR_SIG, 0, zip64_end, 1)
        + _EOCD.pack(_EOCD_SIG, 0, 0, _MAX16, _MAX16, _MAX32, _MAX32, 0)
    )


def _arrays_only(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return not obj.dtype.hasobject
    if isinstance(obj, Mapping):
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        return False
    return bool(values) and all(isinstance(v, np.ndarray) and not v.dtype.hasobject for v in values)


class NpzCodec(Codec):
    """Several named arrays as ``.npz``."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> dict[str, np.ndarray[Any, Any]]:
        return decode_npz(data, limits)

    def encode(self, obj: Any) -> list[Buffer]:
        for value in named_arrays(obj).values():
            as_array(value)  # refuse object arrays before writing anything
        return encode_npz(obj)

    def can_encode(self, obj: Any) -> bool:
        return _arrays_only(obj)

    def natural_for(self, obj: Any) -> bool:
        return isinstance(obj, Mapping) and _arrays_only(obj)
