"""RecordIO-protobuf, the format of SageMaker's built-in algorithms (``application/x-recordio-protobuf``), written and
read without protobuf (by the client's Record classes and the XGBoost script defaults; not a registered codec): the
few messages it uses are encoded here by hand, byte for byte as protobuf writes them.

A body is a sequence of RecordIO records (magic ``0xCED7230A``, length, data padded to 4 bytes), each one ``Record``
message: ``features`` and ``label`` are maps of name to ``Value``; a ``Value`` holds one tensor (``float32_tensor``,
``float64_tensor`` or ``int32_tensor``: packed ``values``, ``keys``, ``shape``) or ``bytes``.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

MAGIC = 0xCED7230A
#: Value's field number for each tensor kind, and the dtype its packed values are written in.
TENSORS = {"float32_tensor": (2, "<f4"), "float64_tensor": (3, "<f8"), "int32_tensor": (7, None)}
_BYTES_FIELD = 9


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32 values are written as ten-byte varints, as protobuf does
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _tensor_type(dtype: np.dtype[Any]) -> str:
    """The tensor a dense array of ``dtype`` is written as (the SDK's rule: only these three dtypes)."""
    if dtype == np.dtype(int):
        return "int32_tensor"
    if dtype == np.dtype(float):
        return "float64_tensor"
    if dtype == np.dtype("float32"):
        return "float32_tensor"
    raise ValueError(f"Unsupported dtype {dtype} on array")


def _dense_value(kind: str, vector: np.ndarray) -> bytes:
    number, wire_dtype = TENSORS[kind]
    if wire_dtype is None:
        if vector.size and (vector.min() < -(2**31) or vector.max() >= 2**31):
            raise ValueError("Value out of range: an int32 tensor holds values from -2**31 to 2**31 - 1")
        packed = b"".join(_varint(int(value)) for value in vector)
    else:
        packed = np.ascontiguousarray(vector, dtype=wire_dtype).tobytes()
    tensor = _field(1, packed) if packed else b""
    return _field(number, tensor)


def _recordio(data: bytes) -> bytes:
    padding = -len(data) % 4
    return struct.pack("<II", MAGIC, len(data)) + data + bytes(padding)


def write_dense(array: np.ndarray) -> bytes:
    """One record per row of a 2-D array, its row as ``features["values"]`` (the SDK's ``RecordSerializer``)."""
    if array.ndim != 2:
        raise ValueError("Array must be a Matrix")
    kind = _tensor_type(array.dtype)
    entry_key = _field(1, b"values")
    return b"".join(_recordio(_field(1, entry_key + _field(2, _dense_value(kind, row)))) for row in array)


@dataclasses.dataclass
class Tensor:
    """A tensor's packed fields, as lists (an absent tensor reads as empty, as protobuf's do)."""

    values: list[Any] = dataclasses.field(default_factory=list)
    keys: list[int] = dataclasses.field(default_factory=list)
    shape: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Value:
    """One feature or label: the tensor kinds, and ``bytes``."""

    float32_tensor: Tensor = dataclasses.field(default_factory=Tensor)
    float64_tensor: Tensor = dataclasses.field(default_factory=Tensor)
    int32_tensor: Tensor = dataclasses.field(default_factory=Tensor)
    bytes: list[bytes] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Record:
    """One record, with the fields of the SDK's protobuf ``Record``."""

    features: dict[str, Value] = dataclasses.field(default_factory=dict)
    label: dict[str, Value] = dataclasses.field(default_factory=dict)
    uid: str = ""
    metadata: str = ""
    configuration: str = ""


class _Reader:
    """Protobuf's wire format over one message's bytes; malformed input raises ValueError saying what."""

    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def varint(self) -> int:
        value = shift = 0
        while True:
            if self.position >= len(self.data) or shift > 63:
                raise ValueError("RecordIO-protobuf: a varint is cut short or longer than ten bytes")
            byte = self.data[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    def fields(self) -> Any:
        """(field number, wire type, payload): bytes for length-delimited fields, an int otherwise."""
        while self.position < len(self.data):
            tag = self.varint()
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                yield number, wire, self.varint()
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
                yield number, wire, self.take(size)
            elif wire == 2:
                yield number, wire, self.take(self.varint())
            else:
                raise ValueError(f"RecordIO-protobuf: unsupported wire type {wire} in field {number}")

    def take(self, size: int) -> bytes:
        if self.position + size > len(self.data):
            raise ValueError("RecordIO-protobuf: a field runs past the end of its record")
        chunk = self.data[self.position : self.position + size]
        self.position += size
        return chunk


def _packed_varints(payload: bytes, signed32: bool) -> list[int]:
    reader, values = _Reader(payload), []
    while reader.position < len(payload):
        value = reader.varint()
        if signed32:
            value &= 0xFFFFFFFF
            value = value - (1 << 32) if value >= 1 << 31 else value
        values.append(value)
    return values


def _tensor(payload: bytes, dtype: str | None) -> Tensor:
    tensor = Tensor()
    for number, wire, value in _Reader(payload).fields():
        if number == 1 and wire == 2:
            if dtype is None:
                tensor.values.extend(_packed_varints(value, signed32=True))
            else:
                if len(value) % np.dtype(dtype).itemsize:
                    raise ValueError("RecordIO-protobuf: packed values of a size that is not a whole number")
                tensor.values.extend(np.frombuffer(value, dtype=dtype).tolist())
        elif number in (2, 3) and wire == 2:
            (tensor.keys if number == 2 else tensor.shape).extend(_packed_varints(value, signed32=False))
    return tensor


def _value(payload: bytes) -> Value:
    value = Value()
    kinds = {number: (name, dtype) for name, (number, dtype) in TENSORS.items()}
    for number, wire, field in _Reader(payload).fields():
        if wire != 2:
            continue
        if number in kinds:
            name, dtype = kinds[number]
            setattr(value, name, _tensor(field, dtype))
        elif number == _BYTES_FIELD:
            value.bytes.extend(item for _, _, item in _Reader(field).fields())
    return value


def _text(field: bytes) -> str:
    try:
        return field.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"RecordIO-protobuf: a string field is not UTF-8 ({exc})") from None


def _record(data: bytes) -> Record:
    record = Record()
    for number, wire, field in _Reader(data).fields():
        if wire != 2:
            continue
        if number in (1, 2):
            key, value = "", Value()
            for entry_number, _, entry_field in _Reader(field).fields():
                if entry_number == 1:
                    key = _text(entry_field)
                elif entry_number == 2:
                    value = _value(entry_field)
            (record.features if number == 1 else record.label)[key] = value
        elif number in (3, 4, 5):
            setattr(record, ("uid", "metadata", "configuration")[number - 3], _text(field))
    return record


def read_records(data: bytes) -> list[Record]:
    """Every record of a RecordIO-protobuf body."""
    records, position = [], 0
    while position < len(data):
        if position + 8 > len(data):
            raise ValueError(f"RecordIO: a record header is cut short at byte {position}")
        magic, length = struct.unpack_from("<II", data, position)
        if magic != MAGIC:
            raise ValueError(f"RecordIO: no record magic at byte {position} (found {magic:#010x})")
        start = position + 8
        if start + length > len(data):
            raise ValueError(f"RecordIO: the record at byte {position} declares {length} bytes; fewer follow")
        records.append(_record(data[start : start + length]))
        position = start + length + (-length % 4)
    return records
