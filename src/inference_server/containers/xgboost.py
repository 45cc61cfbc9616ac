"""The XGBoost container's defaults: CSV, LibSVM and RecordIO-protobuf bodies as a ``DMatrix``;
``model.predict(data, validate_features=False)``; the scikit-learn container's answers
(:func:`~inference_server.containers._common.toolkit_output_fn`). XGBoost and SciPy are imported on first use."""

from __future__ import annotations

import csv
from typing import Any

import numpy as np
import werkzeug.exceptions

from inference_server import codecs
from inference_server.containers._common import CSV, _as_bytes, _require, _text, _unsupported


def _csv_rows(text: str) -> np.ndarray:
    """The XGBoost container's CSV: the delimiter sniffed from the first line, empty fields as NaN, float64."""
    try:
        delimiter = csv.Sniffer().sniff(text.split("\n")[0][:512]).delimiter
    except csv.Error:  # one column: nothing to sniff (the container fails there; a comma is what was meant)
        delimiter = ","
    if delimiter.isalnum():
        delimiter = ","
    rows = [["nan" if field == "" else field for field in line.split(delimiter)] for line in text.split("\n")]
    try:
        return np.array(rows).astype(None)
    except ValueError as exc:
        raise werkzeug.exceptions.BadRequest(f"the CSV body is not numeric rows of equal length: {exc}") from None


def _recordio_rows(body: bytes) -> Any:
    """RecordIO-protobuf's ``values`` features as rows: dense tensors stacked, sparse ones (keys and shape) as CSR."""
    import scipy.sparse  # type: ignore[import-untyped]

    from inference_server.codecs import recordio_protobuf as _record

    try:
        records = _record.read_records(body)
    except ValueError as exc:
        raise werkzeug.exceptions.BadRequest(str(exc)) from None
    rows: list[_record.Tensor] = []
    for record in records:
        value = record.features.get("values")
        kinds = (value.float32_tensor, value.float64_tensor, value.int32_tensor) if value is not None else ()
        tensor = next((kind for kind in kinds if kind.values or kind.shape), None)  # a sparse row may be all 0
        if tensor is None:
            raise werkzeug.exceptions.BadRequest("a RecordIO-protobuf record has no 'values' feature")
        rows.append(tensor)
    if all(not tensor.keys for tensor in rows):
        return np.array([tensor.values for tensor in rows], dtype=np.float64)
    width = max(tensor.shape[0] if tensor.shape else max(tensor.keys) + 1 for tensor in rows)
    if width >= 2**31 or any(key >= width for tensor in rows for key in tensor.keys):
        raise werkzeug.exceptions.BadRequest(
            f"a sparse RecordIO-protobuf record has a key or shape beyond its width ({width} columns, at most 2**31)"
        )
    data = [value for tensor in rows for value in tensor.values]
    columns = [key for tensor in rows for key in tensor.keys]
    pointers = np.cumsum(np.array([0] + [len(tensor.keys) for tensor in rows]))
    return scipy.sparse.csr_matrix((data, columns, pointers), shape=(len(rows), width))


def _libsvm_rows(text: str) -> Any:
    """LibSVM lines (``<label> <index>:<value> ...``, ``qid:`` and ``#`` comments ignored) as a CSR matrix; the
    labels are dropped, as for prediction. A malformed line is a 400 naming it."""
    import scipy.sparse

    data: list[float] = []
    columns: list[int] = []
    pointers = [0]
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        for field in fields[1:]:
            index, colon, value = field.partition(":")
            if index == "qid":
                continue
            try:
                column, number_value = int(index), float(value)
            except ValueError:
                column, number_value = -1, 0.0
            if not colon or not 0 <= column < 2**31:
                raise werkzeug.exceptions.BadRequest(f"LibSVM line {number}: {field!r} is not <index>:<value>")
            columns.append(column)
            data.append(number_value)
        pointers.append(len(columns))
    width = max(columns) + 1 if columns else 0
    return scipy.sparse.csr_matrix((data, columns, pointers), shape=(len(pointers) - 1, width))


def input_fn(input_data: str | bytes, content_type: str) -> Any:
    """The XGBoost container's default: CSV, LibSVM and RecordIO-protobuf bodies as a ``DMatrix``."""
    xgboost = _require("xgboost", "XGBoost: pip install xgboost (or xgboost-cpu)")
    bare = codecs.bare(content_type)
    if bare == CSV:
        return xgboost.DMatrix(_csv_rows(_text(input_data, bare)))
    if bare in ("text/libsvm", "text/x-libsvm"):
        return xgboost.DMatrix(_libsvm_rows(_text(input_data, "LibSVM")))
    if bare == "application/x-recordio-protobuf":
        return xgboost.DMatrix(_recordio_rows(_as_bytes(input_data)))
    raise _unsupported(content_type, "XGBoost", "text/csv, text/libsvm, application/x-recordio-protobuf")


def predict_fn(input_data: Any, model: Any) -> Any:
    """The XGBoost container's default: ``model.predict(data, validate_features=False)``."""
    return model.predict(input_data, validate_features=False)
