"""RecordIO-protobuf written and read by hand: round trips, and malformed bodies refused with what is wrong."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from inference_server.codecs import recordio_protobuf as rp


@pytest.mark.parametrize(
    ("array", "kind"),
    [
        (np.arange(6, dtype=np.float32).reshape(2, 3) / 3, "float32_tensor"),
        (np.arange(4, dtype=np.float64).reshape(4, 1) * -2.5, "float64_tensor"),
        (np.array([[-(2**31), 0, 2**31 - 1]]), "int32_tensor"),
    ],
)
def test_dense_rows_round_trip(array: np.ndarray, kind: str) -> None:
    """Each row comes back as its record's features["values"] tensor of the dtype's kind, values exact."""
    records = rp.read_records(rp.write_dense(array))
    assert len(records) == array.shape[0]
    for record, row in zip(records, array, strict=True):
        assert list(record.features) == ["values"]
        assert getattr(record.features["values"], kind).values == row.tolist()
        assert record.label == {}


def test_records_are_padded_to_four_bytes() -> None:
    """Every record starts on a 4-byte boundary with the magic, as RecordIO requires."""
    body = rp.write_dense(np.array([[1.5]], dtype=np.float32).repeat(3, axis=0))
    assert len(body) % 4 == 0
    assert struct.unpack_from("<I", body)[0] == rp.MAGIC


def test_unknown_fields_are_skipped() -> None:
    """Fields the reader does not know (every wire type) are skipped, as protobuf skips them."""
    unknown = rp._varint(15 << 3 | 0) + rp._varint(7)  # varint
    unknown += rp._varint(16 << 3 | 1) + bytes(8)  # fixed64
    unknown += rp._varint(17 << 3 | 5) + bytes(4)  # fixed32
    unknown += rp._field(18, b"anything")  # length-delimited
    value = rp._field(2, rp._field(1, struct.pack("<f", 2.0)))
    record = unknown + rp._field(1, rp._field(1, b"values") + rp._field(2, value)) + rp._field(3, b"uid-1")
    (parsed,) = rp.read_records(rp._recordio(record))
    assert parsed.features["values"].float32_tensor.values == [2.0]
    assert parsed.uid == "uid-1"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x0a\x23\xd7", "header is cut short"),
        (struct.pack("<II", 0x12345678, 0), "no record magic"),
        (struct.pack("<II", rp.MAGIC, 100) + bytes(8), "declares 100 bytes"),
        (rp._recordio(b"\x0a\xff"), "cut short or longer than ten bytes"),
        (rp._recordio(b"\x0a" + b"\xff" * 11 + b"\x01"), "cut short or longer than ten bytes"),
        (rp._recordio(b"\x0a\x05ab"), "runs past the end"),
        (rp._recordio(b"\x0b"), "unsupported wire type 3"),
        (rp._recordio(rp._field(1, rp._field(2, rp._field(2, rp._field(1, b"abc"))))), "not a whole number"),
        (rp._recordio(rp._field(1, rp._field(1, b"\xff\xfe"))), "not UTF-8"),
    ],
)
def test_malformed_bodies_say_what_is_wrong(body: bytes, reason: str) -> None:
    """A malformed body is a ValueError naming the problem, never an IndexError or a hang."""
    with pytest.raises(ValueError, match=reason):
        rp.read_records(body)


def test_only_three_dtypes_are_written() -> None:
    """int64, float64 and float32, as the SDK; anything else says which dtype it got."""
    with pytest.raises(ValueError, match="Unsupported dtype float16"):
        rp.write_dense(np.zeros((1, 1), dtype=np.float16))
