"""The Arrow codecs: interop with pyarrow's writers, zero-copy reads, and life without pyarrow."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from inference_server import codecs
from inference_server.errors import DecodeError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

STREAM = "application/vnd.apache.arrow.stream"
FILE = "application/vnd.apache.arrow.file"


def _written_by_pyarrow(table: pa.Table, stream: bool) -> bytes:
    sink = pa.BufferOutputStream()
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(("media_type", "stream"), [(STREAM, True), (FILE, False)])
def test_reads_pyarrow_and_pyarrow_reads_ours(media_type: str, stream: bool) -> None:
    """Bodies written by pyarrow decode to an equal Table, and pyarrow reads ours."""
    table = pa.table({"x": np.arange(5.0), "label": ["a", "b", None, "d", "e"]})
    assert codecs.loads(_written_by_pyarrow(table, stream), media_type).equals(table)
    body = pa.py_buffer(codecs.dumps(table, media_type))
    reader = pa.ipc.open_stream(body) if stream else pa.ipc.open_file(body)
    assert reader.read_all().equals(table)


def test_decode_is_zero_copy() -> None:
    """Column data of a decoded table points into the request body."""
    body = bytearray(codecs.dumps(pa.table({"x": np.arange(1000, dtype=np.int64)}), STREAM))
    column = codecs.loads(body, STREAM).column("x").chunk(0).to_numpy()
    assert np.shares_memory(column, np.frombuffer(body, np.uint8))


def test_encodes_record_batches_dicts_and_dataframes() -> None:
    """RecordBatch, dict of 1-D arrays and pandas DataFrame all encode to a Table."""
    expected = pa.table({"a": [1, 2], "b": [0.5, 1.5]})
    for value in (
        pa.record_batch({"a": [1, 2], "b": [0.5, 1.5]}),
        {"a": np.array([1, 2]), "b": np.array([0.5, 1.5])},
        pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}),
    ):
        assert codecs.loads(codecs.dumps(value, STREAM), STREAM).equals(expected)


def test_garbage_is_a_decode_error() -> None:
    """A body that is not Arrow IPC is a DecodeError naming the media type."""
    with pytest.raises(DecodeError, match=r"invalid application/vnd\.apache\.arrow\.stream body"):
        codecs.loads(b"\xff\xff\xff\xff\x10\x00\x00\x00garbage!", STREAM)


def test_without_pyarrow_decoding_is_415_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """With pyarrow missing, Arrow bodies are refused with the install command."""
    body = codecs.dumps(pa.table({"x": [1]}), STREAM)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(UnsupportedMediaType, match=r"pip install 'inference-server\[arrow\]'"):
        codecs.loads(body, STREAM)


def test_without_pyarrow_arrow_is_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """With pyarrow missing, negotiation skips Arrow and a client asking only for it hears about the extra."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert codecs.negotiate("*/*", {"a": np.zeros(2)}).media_type == "application/x-npz"
    with pytest.raises(NotAcceptable, match=r"arrow\.stream needs pip install 'inference-server\[arrow\]'"):
        codecs.negotiate(STREAM, {"a": np.zeros(2)})


def test_a_missing_pyarrow_is_looked_for_once() -> None:
    """When pyarrow cannot be imported, negotiation does not search for it again on every request."""
    code = """if True:
        import sys
        attempts = []

        class NoArrow:
            def find_spec(self, name, path=None, target=None):
                if name == "pyarrow":
                    attempts.append(name)
                    raise ModuleNotFoundError("No module named 'pyarrow'")

        sys.meta_path.insert(0, NoArrow())
        import numpy as np
        from inference_server import codecs
        for _ in range(100):
            accept = "application/x-npz, application/json;q=0.5"  # (two ranges: every codec is weighed)
            assert codecs.negotiate(accept, {"a": np.zeros(2)}).media_type == "application/x-npz"
        print(len(attempts))
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "1"


def _zstd_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_compressed_batches_are_bounded_before_they_are_inflated() -> None:
    """A zstd-compressed stream is refused when its buffers declare more than the decompression budget, before
    anything is inflated; within the budget it decodes as usual."""
    table = pa.table({"x": np.zeros(1 << 20, dtype=np.int64)})  # 8 MiB of zeros, a few KiB compressed
    body = _zstd_stream(table)
    assert len(body) < 64 << 10
    assert codecs.loads(body, STREAM).equals(table)
    with pytest.raises(DecodeError, match=r"would hold 8388608 bytes decompressed; at most 1048576"):
        codecs.loads(body, STREAM, codecs.Limits(max_decompressed_bytes=1 << 20))


def test_a_stream_decompressing_past_ten_times_the_body_limit_is_413_naming_the_ratio() -> None:
    """On a server with a 6 MB body limit, a zstd stream whose buffers decompress to 64 MiB (a few KB sent) is
    refused with 413 (also a DecodeError) saying 10 x the body limit; within it, it decodes."""
    body = _zstd_stream(pa.table({"x": np.zeros(8 << 20, dtype=np.int64)}))
    assert len(body) < 64 << 10
    limits = codecs.Limits.for_payload(6)
    with pytest.raises(PayloadTooLarge, match=r"hold 67108864 bytes decompressed; at most 62914560 bytes are allowed: "
                       r"10 x the body limit of 6 MB \(MaxPayloadInMB\)") as refused:  # fmt: skip
        codecs.loads(body, STREAM, limits)
    assert isinstance(refused.value, DecodeError)
    assert refused.value.code == 413
    assert codecs.loads(body, STREAM, codecs.Limits.for_payload(7)).num_rows == 8 << 20


def test_a_forged_uncompressed_length_is_refused_without_allocating() -> None:
    """A compressed buffer whose length prefix claims 64 GiB is refused by its declaration (nothing allocated)."""
    body = bytearray(_zstd_stream(pa.table({"x": np.zeros(1000, dtype=np.int64)})))
    prefix = (8000).to_bytes(8, "little")
    at = body.rindex(prefix)
    body[at : at + 8] = (64 << 30).to_bytes(8, "little")
    with pytest.raises(DecodeError, match=r"would hold 68719476736 bytes decompressed"):
        codecs.loads(bytes(body), STREAM)


def test_every_buffer_of_every_column_counts_toward_the_budget() -> None:
    """Uncompressed batches are bounded too: each buffer a batch lists counts, as often as it is listed."""
    column = np.arange(1 << 16, dtype=np.int64)
    table = pa.table({f"c{i}": column for i in range(16)})  # 16 x 512 KiB, as written
    body = _written_by_pyarrow(table, stream=True)
    with pytest.raises(DecodeError, match=r"would hold \d+ bytes decompressed"):
        codecs.loads(body, STREAM, codecs.Limits(max_decompressed_bytes=4 << 20))


def test_a_file_footer_listing_one_batch_twice_is_refused() -> None:
    """An Arrow file whose footer lists the same batch twice (one body, twice the table) is a 400 saying so."""
    batch = pa.record_batch({"x": np.arange(1000, dtype=np.int64)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch)
    body = bytearray(sink.getvalue().to_pybytes())
    footer_size = int.from_bytes(body[-10:-6], "little")
    footer = bytes(body[len(body) - 10 - footer_size : len(body) - 10])
    first = pa.ipc.open_file(pa.py_buffer(bytes(body)))
    assert first.num_record_batches == 2
    blocks = [footer.index(b) for b in _blocks(footer)]
    assert len(blocks) == 2
    start = len(body) - 10 - footer_size
    body[start + blocks[1] : start + blocks[1] + 8] = footer[blocks[0] : blocks[0] + 8]  # second offset = first
    with pytest.raises(DecodeError, match="footer lists batches that overlap"):
        codecs.loads(bytes(body), FILE)


def _blocks(footer: bytes) -> list[bytes]:
    """The 24-byte Block structs of a footer's record batches: (offset, metadata length, pad, body length)."""
    found = []
    for offset in range(8, len(footer) - 24, 8):
        start = int.from_bytes(footer[offset : offset + 8], "little")
        metadata = int.from_bytes(footer[offset + 8 : offset + 12], "little")
        body = int.from_bytes(footer[offset + 16 : offset + 24], "little")
        if 8 <= start < 1 << 20 and 0 < metadata < 4096 and body == 8000:
            found.append(footer[offset : offset + 24])
    return found


RACE = """
import sys, threading
from inference_server.codecs import arrow

importing = threading.Thread(target=__import__, args=("pyarrow",))
importing.start()
while "pyarrow" not in sys.modules:  # the import has begun: the module exists, not yet whole
    pass
module = arrow._load()
seen = [hasattr(module, "Table") and hasattr(module, "ipc")]
importing.join()
print(len(seen), all(seen))
"""


def test_pyarrow_is_never_handed_out_half_imported() -> None:
    """While one thread imports pyarrow, another asking for it waits for the whole module (it got a partially
    initialised one, without ``Table``: a 500 for concurrent first requests with micro-batching)."""
    result = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True"]
