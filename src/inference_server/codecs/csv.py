"""``text/csv``: a 2-D float array when every cell is a number (a header row is skipped), else rows of strings."""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from inference_server.codecs import json
from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError

MEDIA_TYPE = "text/csv"


def _rows(obj: Any) -> list[Any]:
    """Rows to write: a 1-D sequence is one value per line (one prediction per record)."""
    if isinstance(obj, np.ndarray):
        values = json.as_lists(obj)
        if obj.ndim == 0:
            return [[values]]
        return [list(row) if isinstance(row, (list, tuple)) else [row] for row in values]
    return [list(row) if isinstance(row, (list, tuple, np.ndarray)) else [row] for row in obj]


#: NumPy kinds CSV can write as text: bool, integers, floats, complex, timedeltas, datetimes, str.
_CSV_KINDS = frozenset("biufcmMU")


def _writable(array: np.ndarray[Any, Any]) -> bool:
    if array.dtype.names is not None:
        return all(_writable(array[name]) for name in array.dtype.names)
    return array.dtype.kind in _CSV_KINDS or json.array_is_jsonable(array)


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _after_header(rows: list[list[str]]) -> np.ndarray[Any, Any] | None:
    """The numbers below a header row (pandas' ``to_csv`` writes one; SageMaker's CSV has none), else None.

    A header is a first row with no number in it above rows of numbers only, all of its width.
    """
    if len(rows) < 2 or any(_number(cell) is not None for cell in rows[0]):
        return None
    width = len(rows[0])
    values = [[_number(cell) for cell in row] for row in rows[1:]]
    if any(len(row) != width or None in row for row in values):
        return None
    return np.array(values, dtype=np.float64)


class CSVCodec(Codec):
    """Comma-separated values."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> Any:
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"text/csv body is not UTF-8: byte {exc.start} is invalid") from None
        if not text.strip():
            return np.empty((0, 0))
        try:
            return np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.float64, ndmin=2, comments=None)
        except ValueError:
            pass  # not all numbers, a header row, or ragged
        try:
            rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
        except csv.Error as exc:
            raise DecodeError(f"invalid CSV: {exc}") from None
        numbers = _after_header(rows)
        return rows if numbers is None else numbers

    def encode(self, obj: Any) -> list[Buffer]:
        if isinstance(obj, np.ndarray) and obj.ndim in (1, 2):
            text = json.number_table(obj, kinds="iuf", finite_only=True)
            if text is not None:  # integers and finite floats, as JSON writes them; the rest by the csv module
                return [json.lines_of(text, obj.ndim, row_brackets=False)]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(_rows(obj))
        return [out.getvalue().encode()]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return obj.ndim <= 2 and _writable(obj)
        return isinstance(obj, (list, tuple))
