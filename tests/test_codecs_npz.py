"""The npz codec: named arrays both ways, interop with np.savez, and bounded decompression."""

import io
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from inference_server import codecs
from inference_server.errors import DecodeError, PayloadTooLarge

NPZ = "application/x-npz"


def test_reads_savez_and_savez_compressed_in_order() -> None:
    """np.savez and np.savez_compressed archives decode to plain dicts in archive order."""
    for save in (np.savez, np.savez_compressed):
        buffer = io.BytesIO()
        save(buffer, scores=np.arange(3), conf=np.eye(2, dtype=np.float32), explains=np.array(["x", "y"]))
        result = codecs.loads(buffer.getvalue(), NPZ)
        assert type(result) is dict
        assert list(result) == ["scores", "conf", "explains"]
        assert result["conf"].dtype == np.float32
        assert result["explains"].tolist() == ["x", "y"]


def test_np_load_reads_ours() -> None:
    """Our archive loads in np.load with every name, dtype and value."""
    arrays = {"a": np.arange(5, dtype=">i8"), "b": np.asfortranarray(np.ones((2, 3))), "c": np.array(2.5)}
    with np.load(io.BytesIO(codecs.dumps(arrays, NPZ)), allow_pickle=False) as loaded:
        assert loaded.files == ["a", "b", "c"]
        for name, array in arrays.items():
            assert loaded[name].dtype == array.dtype
            assert np.array_equal(loaded[name], array)


def test_sequences_and_single_arrays_are_named_like_savez() -> None:
    """A tuple becomes arr_0, arr_1...; a single array arr_0."""
    assert list(codecs.loads(codecs.dumps((np.zeros(1), np.ones(2)), NPZ), NPZ)) == ["arr_0", "arr_1"]
    assert list(codecs.loads(codecs.dumps(np.zeros(1), NPZ), NPZ)) == ["arr_0"]


def test_stored_members_are_views_and_encode_does_not_copy() -> None:
    """Stored members decode as views on the body; encoding hands out the arrays' own memory."""
    array = np.arange(10_000, dtype=np.float64)
    parts = codecs.encode({"x": array}, NPZ)
    assert any(isinstance(p, memoryview) and np.shares_memory(np.frombuffer(p, np.uint8), array) for p in parts)
    body = bytearray(b"".join(parts))
    decoded = codecs.loads(body, NPZ)["x"]
    assert np.shares_memory(decoded, np.frombuffer(body, np.uint8))


def test_zip_bomb_is_refused_before_inflating(npz_bomb: Callable[..., bytes]) -> None:
    """A member declaring more than the limit is refused without inflating anything (no large allocation)."""
    body = npz_bomb(64)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=r"would inflate to 67108992 bytes; at most 1048576"):
            codecs.loads(body, NPZ, codecs.Limits(max_decompressed_bytes=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_members_inflating_past_ten_times_the_body_limit_are_413_naming_the_ratio(
    npz_bomb: Callable[..., bytes],
) -> None:
    """On a server with a 6 MB body limit, deflated members declaring 64 MiB (a 64 KB body) are refused with 413
    (also a DecodeError) saying 10 x the body limit, before anything is inflated; within it, they decode."""
    body = npz_bomb(64)
    with pytest.raises(PayloadTooLarge, match=r"inflate to 67108992 bytes; at most 62914560 bytes are allowed: "
                       r"10 x the body limit of 6 MB \(MaxPayloadInMB\)") as refused:  # fmt: skip
        codecs.loads(body, NPZ, codecs.Limits.for_payload(6))
    assert isinstance(refused.value, DecodeError)
    assert codecs.loads(body, NPZ, codecs.Limits.for_payload(7))["bomb"].nbytes == 64 << 20


def test_member_inflating_beyond_its_declared_size_is_refused(npz_bomb: Callable[..., bytes]) -> None:
    """A member lying about its size is stopped as soon as it inflates past the declared size."""
    with pytest.raises(DecodeError, match="inflates beyond its declared 1000 bytes"):
        codecs.loads(npz_bomb(8, declared=1000), NPZ)


def test_real_bomb_decodes_when_within_limits(npz_bomb: Callable[..., bytes]) -> None:
    """The bomb helper is a valid archive: under generous limits it inflates to its declared size."""
    assert codecs.loads(npz_bomb(3), NPZ)["bomb"].nbytes == 3 << 20


def test_member_count_is_bounded() -> None:
    """More members than the limit are refused before any is read."""
    body = codecs.dumps({f"m{i}": np.zeros(1) for i in range(20)}, NPZ)
    with pytest.raises(DecodeError, match="has 20 members; at most 10"):
        codecs.loads(body, NPZ, codecs.Limits(max_archive_members=10))


def test_pickle_inside_an_archive_is_refused() -> None:
    """An object-dtype member is a DecodeError naming the member."""
    buffer = io.BytesIO()
    np.savez(buffer, ok=np.zeros(2), evil=np.array([{}], dtype=object))
    with pytest.raises(DecodeError, match=r"npz member 'evil\.npy': npy data of object dtype is refused"):
        codecs.loads(buffer.getvalue(), NPZ)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda body: body[:-30], "no zip end-of-central-directory record|central directory"),
        (lambda body: body[100:], "beyond the end|corrupt|truncated"),
        (lambda body: b"not a zip at all", "no zip end-of-central-directory record"),
    ],
)
def test_broken_archives_say_what_is_wrong(mangle, message) -> None:  # type: ignore[no-untyped-def]
    """Truncated or foreign bodies are DecodeErrors with a message about the archive."""
    body = codecs.dumps({"a": np.arange(100)}, NPZ)
    with pytest.raises(DecodeError, match=message):
        codecs.loads(mangle(body), NPZ)


def test_more_than_65535_members_use_zip64_both_ways() -> None:
    """70,000 members need zip64 end records: we write them, np.load reads them, and so do we."""
    arrays = {f"m{i}": np.array([i], dtype=np.int32) for i in range(70_000)}
    body = codecs.dumps(arrays, NPZ)
    with np.load(io.BytesIO(body)) as loaded:
        assert len(loaded.files) == 70_000
        assert loaded["m69999"].tolist() == [69_999]
    decoded = codecs.loads(body, NPZ, codecs.Limits(max_archive_members=100_000))
    assert len(decoded) == 70_000
    assert decoded["m12345"].tolist() == [12_345]


def test_zip64_extra_fields_written_by_zipfile_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Central-directory zip64 fields (as zipfile writes for members over 2 GiB) are read, here on tiny members."""
    import zipfile

    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 10)  # every size and offset now goes to zip64 extra fields
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ("a", "b"):
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.arange(5))
    assert {k: v.tolist() for k, v in codecs.loads(buffer.getvalue(), NPZ).items()} == {
        "a": [0, 1, 2, 3, 4],
        "b": [0, 1, 2, 3, 4],
    }
