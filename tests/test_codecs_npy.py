"""The npy codec: interoperability with numpy, zero copies, and clear refusals."""

import io
import pickle
import tracemalloc

import numpy as np
import pytest

from inference_server import codecs
from inference_server.codecs import npy
from inference_server.errors import DecodeError

NPY = "application/x-npy"


def _saved(array: np.ndarray, **kwargs: bool) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, **kwargs)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype="<i4").reshape(2, 3, 4),
        np.asfortranarray(np.ones((3, 2), dtype=">f4")),
        np.zeros(3, dtype=[("x", "<f8"), ("y", "<i2", (2,))]),
        np.array("text"),
    ],
)
def test_reads_np_save_and_np_load_reads_ours(array: np.ndarray) -> None:
    """Bodies from np.save decode; our bodies load with np.load(allow_pickle=False)."""
    decoded = codecs.loads(_saved(array), NPY)
    assert decoded.dtype == array.dtype
    assert np.array_equal(decoded, array)
    loaded = np.load(io.BytesIO(codecs.dumps(array, NPY)), allow_pickle=False)
    assert loaded.dtype == array.dtype
    assert np.array_equal(loaded, array)


def test_header_is_byte_identical_to_numpys() -> None:
    """Our encoding is exactly what np.save writes (version 1.0, 64-byte aligned)."""
    for array in (np.zeros((3, 4), np.float32), np.array(1, dtype=">u2"), np.empty((0,), "<U3")):
        assert codecs.dumps(array, NPY) == _saved(array)


def test_decode_is_a_view_on_the_body() -> None:
    """The decoded array shares the request buffer's memory (no copy)."""
    body = bytearray(codecs.dumps(np.arange(1000, dtype=np.float64), NPY))
    array = codecs.loads(body, NPY)
    body[-8:] = np.float64(-1).tobytes()
    assert array[-1] == -1
    assert np.shares_memory(array, np.frombuffer(body, np.uint8))


def test_encode_returns_the_arrays_own_memory() -> None:
    """encode gives the header plus a memoryview of the array itself, not a copy."""
    array = np.arange(1000, dtype=np.float32)
    _header, data = codecs.encode(array, NPY)
    assert isinstance(data, memoryview)
    assert np.shares_memory(np.frombuffer(data, np.float32), array)


def test_encode_of_100_mb_allocates_no_payload_sized_memory() -> None:
    """Encoding 100 MB allocates only the header (tracemalloc peak well under 1 MB)."""
    array = np.ones(25_000_000, dtype=np.float32)
    tracemalloc.start()
    try:
        parts = codecs.encode(array, NPY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(memoryview(p).nbytes for p in parts) > 100_000_000
    assert peak < 1_000_000


def test_object_arrays_are_refused_both_ways() -> None:
    """A pickle-bearing npy is a DecodeError and its payload never runs; object arrays are not encoded."""
    ran = []

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (ran.append, ("pwned",))

    body = _saved(np.array([Payload()], dtype=object), allow_pickle=True)
    assert b"pwned" in body
    with pytest.raises(DecodeError, match="object dtype is refused"):
        codecs.loads(body, NPY)
    assert ran == []
    with pytest.raises(TypeError, match="object dtype"):
        codecs.encode(np.array([{}], dtype=object), NPY)
    assert not codecs.lookup(NPY).can_encode(np.array([None], dtype=object))  # type: ignore[union-attr]
    assert pickle.dumps is not None  # pickle is only used here, to build the hostile body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"PK\x03\x04", "does not start with the \\\\x93NUMPY magic"),
        (b"\x93NUMPY\x01", "truncated: 7 bytes"),
        (b"\x93NUMPY\x09\x00\x10\x00", "version 9 is not supported"),
        (b"\x93NUMPY\x01\x00\xff\x00{'descr'", "truncated: the header needs 265 bytes"),
        (b"\x93NUMPY\x01\x00\x07\x00__import", "not a Python literal"),
        (b"\x93NUMPY\x02\x00\xff\xff\x00\x00", "at most 10000 are allowed"),
    ],
)
def test_malformed_headers_say_what_is_wrong(body: bytes, message: str) -> None:
    """Each kind of broken header gets its own message."""
    with pytest.raises(DecodeError, match=message):
        codecs.loads(body, NPY)


def test_data_length_must_match_the_header() -> None:
    """Truncated or padded data is refused with both sizes in the message."""
    body = codecs.dumps(np.zeros(300, np.float32), NPY)
    with pytest.raises(DecodeError, match=r"declares 1200 bytes of float32 data \(shape \(300,\)\), body has 800"):
        codecs.loads(body[:-400], NPY)
    with pytest.raises(DecodeError, match="body has 1201"):
        codecs.loads(body + b"\0", NPY)


def test_unusual_header_layouts_use_the_literal_parser() -> None:
    """Keys in another order still decode (via literal_eval, which evaluates no code)."""
    text = "{'shape': (2,), 'fortran_order': False, 'descr': '<i2'}"
    head = npy.MAGIC + b"\x01\x00" + len(text).to_bytes(2, "little") + text.encode()
    assert codecs.loads(head + b"\x01\x00\x02\x00", NPY).tolist() == [1, 2]
    text = "{'shape': (2,), 'descr': '<i2'}"
    body = npy.MAGIC + b"\x01\x00" + len(text).to_bytes(2, "little") + text.encode()
    with pytest.raises(DecodeError, match="exactly the keys"):
        codecs.loads(body, NPY)
