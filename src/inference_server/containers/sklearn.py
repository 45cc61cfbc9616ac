"""The scikit-learn container's defaults: JSON and CSV bodies as float32 arrays, ``.npy`` as it is; ``model.predict``;
answers by ``json.dumps``, ``np.savetxt(fmt="%s")`` or ``np.save``, the first ``Accept`` allows
(:func:`~inference_server.containers._common.toolkit_output_fn`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import werkzeug.exceptions

from inference_server import codecs
from inference_server.codecs import npy
from inference_server.containers._common import CSV, JSON, _as_bytes, _numbers, _unsupported


def input_fn(input_data: str | bytes, content_type: str) -> np.ndarray:
    """The scikit-learn container's default: JSON and CSV as float32 arrays, ``.npy`` as it is."""
    bare = codecs.bare(content_type)
    if bare in (JSON, CSV):
        array = _numbers(input_data, bare)
        try:
            return array.astype(np.float32)
        except (TypeError, ValueError) as exc:  # strings, objects
            raise werkzeug.exceptions.BadRequest(f"the {bare} body is not an array of numbers: {exc}") from None
    if bare == npy.MEDIA_TYPE:
        loaded: np.ndarray = codecs.loads(_as_bytes(input_data), npy.MEDIA_TYPE)
        return loaded
    raise _unsupported(content_type, "scikit-learn", "JSON, CSV, NPY")


def predict_fn(input_data: Any, model: Any) -> Any:
    """The scikit-learn container's default: ``model.predict``."""
    return model.predict(input_data)
