"""The Arrow codecs: interop with pyarrow's writers, zero-copy reads, and life without pyarrow."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from inference_server import codecs
from inference_server.errors import DecodeError, NotAcceptable, UnsupportedMediaType

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
            assert codecs.negotiate("*/*", {"a": np.zeros(2)}).media_type == "application/x-npz"
        print(len(attempts))
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "1"
