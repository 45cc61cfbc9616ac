"""A scikit-learn classifier saved with joblib as ``model.joblib`` in the model directory, served with micro-batching.

Rows of numbers come as CSV or as JSON (a list of rows), decoded by inference-server's built-in ``input_fn``; the
answer is each row's class probabilities (``predict_proba``, columns in the order of ``model.classes_``), in the
request's format unless ``Accept`` asks for another. Concurrent requests share one ``predict_proba`` call (the
``batching`` hook); each call's rows are counted in the log at DEBUG (``inference-server serve --log-level debug``).

Train a model, serve it, ask it::

    python -m sklearn_model.train /tmp/sklearn-model
    INFERENCE_SERVER_PLUGINS=sklearn_model inference-server serve --model-dir /tmp/sklearn-model
    curl localhost:8080/invocations -H 'Content-Type: text/csv' -d '5.1,3.5,1.4,0.2'
"""

import logging
from pathlib import Path
from typing import Any

import joblib
import numpy as np

import inference_server
from inference_server.errors import BadRequest

#: The file ``model_fn`` loads from the model directory.
MODEL_FILE = "model.joblib"

logger = logging.getLogger(__name__)


@inference_server.plugin_hook
def model_fn(model_dir: str) -> Any:
    """Load ``model.joblib`` from ``model_dir``; a missing file is an error naming it (``/ping`` then says 503)."""
    path = Path(model_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {MODEL_FILE} in {model_dir} (train one: python -m sklearn_model.train DIR)")
    return joblib.load(path)


@inference_server.plugin_hook
def predict_fn(data: Any, model: Any) -> Any:
    """Each row's class probabilities (``predict`` for a model without ``predict_proba``).

    Rows of the wrong width are the client's mistake (400); with batching, only the request that sent them fails.
    """
    try:
        rows = np.asarray(data, dtype=np.float64)  # CSV arrives as an array already, JSON as lists of rows
    except (TypeError, ValueError):
        raise BadRequest("the body must be rows of numbers (CSV, or JSON such as [[1, 2, 3, 4]])") from None
    width = model.n_features_in_
    if rows.ndim != 2 or rows.shape[1] != width:
        raise BadRequest(f"each row must have {width} numbers; the body's rows make an array of shape {rows.shape}")
    predict = getattr(model, "predict_proba", None) or model.predict
    logger.debug("%s on %d rows", predict.__name__, len(rows))
    return predict(rows)


@inference_server.plugin_hook
def batching() -> dict[str, int]:
    """Concurrent requests share one call: up to 32 of them, waiting at most 5 ms for each other."""
    return {"max_batch_size": 32, "max_batch_delay_ms": 5}
