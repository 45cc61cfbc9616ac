"""``text/csv``: a 2-D float array when every cell is a number, else rows of strings (as SageMaker's CSV)."""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError

MEDIA_TYPE = "text/csv"


def _rows(obj: Any) -> list[Any]:
    """Rows to write: a 1-D sequence is one value per line (one prediction per record)."""
    if isinstance(obj, np.ndarray):
        if obj.ndim == 0:
            return [[obj.item()]]
        return [row if isinstance(row, list) else [row] for row in obj.tolist()]
    return [list(row) if isinstance(row, (list, tuple, np.ndarray)) else [row] for row in obj]


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
            pass  # not all numbers, or ragged: rows of strings
        try:
            return [row for row in csv.reader(io.StringIO(text, newline="")) if row]
        except csv.Error as exc:
            raise DecodeError(f"invalid CSV: {exc}") from None

    def encode(self, obj: Any) -> list[Buffer]:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(_rows(obj))
        return [out.getvalue().encode()]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return obj.ndim <= 2 and not obj.dtype.hasobject
        return isinstance(obj, (list, tuple))
