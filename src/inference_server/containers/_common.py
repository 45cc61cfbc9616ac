"""What the containers' defaults share: bodies read as text, bytes or numbers, the errors for what they cannot read or
write, and the SageMaker inference toolkit's encoders."""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import werkzeug.exceptions

from inference_server import codecs
from inference_server.codecs import npy

JSON, CSV = "application/json", "text/csv"


def _require(module: str, what: str) -> Any:
    """``module`` imported, or an ImportError saying which defaults need ``what`` and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"these --script-defaults need {what}") from None


def _torch() -> Any:
    return _require("torch", "PyTorch: pip install torch")


def _as_bytes(input_data: str | bytes) -> bytes:
    return input_data if isinstance(input_data, bytes) else input_data.encode()


def _text(input_data: str | bytes, bare: str) -> str:
    if isinstance(input_data, str):
        return input_data
    try:
        return input_data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise werkzeug.exceptions.BadRequest(f"the {bare} body is not UTF-8: {exc}") from None


def _numbers(input_data: str | bytes, bare: str) -> np.ndarray:
    """A JSON (``np.array(json.loads(...))``) or CSV (``np.genfromtxt``) body as an array; a 400 when it is not
    numbers in rows of equal length."""
    text = _text(input_data, bare)
    try:
        if bare == JSON:
            return np.array(json.loads(text))
        return np.genfromtxt(io.StringIO(text), delimiter=",")
    except (ValueError, RecursionError) as exc:  # the client's body: not numbers, ragged, nested beyond reason
        raise werkzeug.exceptions.BadRequest(f"the {bare} body is not an array of numbers: {exc}") from None


def _unsupported(content_type: str, who: str, types: str) -> werkzeug.exceptions.UnsupportedMediaType:
    return werkzeug.exceptions.UnsupportedMediaType(
        f"Content type {content_type} is not supported by the {who} defaults ({types}): implement input_fn to "
        "deserialize it"
    )


def _tolist(value: Any) -> Any:
    """``json.dumps``'s ``default`` in the toolkits' encoder: anything with ``tolist()`` as its list."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _savetxt(prediction: Any) -> str:
    out = io.StringIO()
    np.savetxt(out, prediction, delimiter=",", fmt="%s")
    return out.getvalue()


def _npy(prediction: Any) -> bytes:
    """``np.save``'s bytes, never pickling (an object array is refused)."""
    return codecs.dumps(np.asarray(prediction), npy.MEDIA_TYPE)


#: The SageMaker inference toolkit's encoders (``sagemaker_inference.encoder``), shared by three containers.
TOOLKIT_ENCODERS: dict[str, Callable[[Any], str | bytes]] = {
    JSON: lambda prediction: json.dumps(prediction, default=_tolist),
    CSV: _savetxt,
    npy.MEDIA_TYPE: _npy,
}


def _encode(prediction: Any, accept: str, encoders: dict[str, Callable[[Any], Any]], who: str) -> tuple[Any, str]:
    """The prediction in the first type of ``accept`` that ``encoders`` write, with that type; else a 406."""
    for wanted in (codecs.bare(part) for part in accept.split(",")):
        encoder = encoders.get(wanted)
        if encoder is not None:
            return encoder(prediction), wanted
    raise werkzeug.exceptions.NotAcceptable(
        f"Accept {accept} is not supported by the {who} defaults ({', '.join(encoders)}): implement output_fn to "
        "serialize the prediction"
    )


def toolkit_output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The scikit-learn and XGBoost containers' default: JSON, CSV or ``.npy``, the first of ``accept`` it writes."""
    return _encode(prediction, accept, TOOLKIT_ENCODERS, "container")
