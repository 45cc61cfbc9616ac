"""The text codecs: JSON, JSON Lines, CSV, text/plain and octet-stream."""

import numpy as np
import pytest

from inference_server import codecs
from inference_server.errors import DecodeError


def test_json_encodes_numpy_arrays_and_scalars() -> None:
    """Arrays (contiguous or not), NumPy scalars and dicts of arrays become JSON."""
    value = {"a": np.arange(6).reshape(2, 3)[:, ::2], "s": np.float32(0.5), "b": np.bool_(True)}
    assert codecs.loads(codecs.dumps(value, "application/json"), "application/json") == {
        "a": [[0, 2], [3, 5]],
        "s": 0.5,
        "b": True,
    }


def test_json_errors_name_the_position() -> None:
    """Invalid JSON is a DecodeError with orjson's location of the problem."""
    with pytest.raises(DecodeError, match=r"invalid JSON: .*line 1 column 9"):
        codecs.loads(b'{"a": 1,', "application/json")


def test_json_lines_skip_blank_lines_and_name_the_bad_line() -> None:
    """Blank lines are ignored; a broken record names its line."""
    assert codecs.loads(b'{"a": 1}\n\n{"a": 2}\r\n', "application/jsonlines") == [{"a": 1}, {"a": 2}]
    with pytest.raises(DecodeError, match="JSON on line 2"):
        codecs.loads(b'{"a": 1}\n{"a": \n', "application/jsonlines")
    assert codecs.dumps(np.eye(2, dtype=int), "application/jsonlines") == b"[1,0]\n[0,1]\n"


def test_csv_numbers_become_a_2d_float_array() -> None:
    """Numeric CSV is a 2-D float64 array, even with one row or one column."""
    for body, shape in ((b"1,2,3\n", (1, 3)), (b"1\n2\n", (2, 1)), (b"1.5,-2e3\n3,nan\n", (2, 2))):
        array = codecs.loads(body, "text/csv")
        assert array.dtype == np.float64
        assert array.shape == shape


def test_csv_text_becomes_rows_of_strings() -> None:
    """Non-numeric or ragged CSV is a list of rows of strings, quoting honoured."""
    assert codecs.loads(b'a,"b,c"\n1\n', "text/csv") == [["a", "b,c"], ["1"]]


def test_csv_encodes_one_prediction_per_line() -> None:
    """A 1-D array is one value per line; a 2-D array one row per line."""
    assert codecs.dumps(np.array([0.5, 1.0]), "text/csv") == b"0.5\n1.0\n"
    assert codecs.dumps(np.array([[1, 2], [3, 4]]), "text/csv") == b"1,2\n3,4\n"
    assert not codecs.lookup("text/csv").can_encode(np.zeros((2, 2, 2)))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(-5, 300, dtype=np.int16),
        np.arange(12, dtype=np.uint64).reshape(3, 4),
        np.array([[0.1, -2.5e-7, 1e300], [3.0, -0.0, 7.25]]),
        np.array([0.1, 1 / 3], dtype=np.float32),
        np.arange(6, dtype=np.float64)[::2],
        np.array([[1.0, np.nan], [np.inf, 2.0]]),
        np.array([True, False]),
    ],
    ids=["int16", "uint64-2d", "float64-2d", "float32", "strided", "non-finite", "bool"],
)
def test_csv_and_json_lines_of_arrays_read_back_as_the_same_values(array: np.ndarray) -> None:
    """Numeric arrays written as CSV and JSON Lines (the fast path cuts orjson's text into lines) read back equal,
    one line per value of a 1-D array and per row of a 2-D one; NaN and infinity as the csv module writes them."""
    csv_text = codecs.dumps(array, "text/csv")
    rows = array.reshape(len(array), -1)
    assert csv_text.count(b"\n") == len(array)
    decoded = codecs.loads(csv_text, "text/csv")
    if array.dtype.kind == "b":
        assert decoded == [[str(value)] for value in array.tolist()]
    else:
        assert np.array_equal(decoded.astype(array.dtype), rows, equal_nan=array.dtype.kind == "f")
    if array.dtype.kind in "iu" or np.isfinite(array).all():
        records = codecs.loads(codecs.dumps(array, "application/jsonlines"), "application/jsonlines")
        assert np.array_equal(np.array(records, dtype=array.dtype), array)


@pytest.mark.parametrize("media_type", ["text/csv", "text/plain"])
def test_text_must_be_utf8(media_type: str) -> None:
    """Bodies that are not UTF-8 are refused with the offending byte's position."""
    with pytest.raises(DecodeError, match="not UTF-8: byte 2 is invalid"):
        codecs.loads(b"ab\xff", media_type)


def test_octet_stream_passes_the_buffer_through() -> None:
    """application/octet-stream decodes to the very buffer it was given."""
    body = bytearray(b"raw")
    assert codecs.loads(body, "application/octet-stream") is body
