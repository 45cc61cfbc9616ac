"""A family of linear models behind one SageMaker multi-model endpoint: each model's directory holds its ``model.json``.

A model is ``{"coef": [w1, ..., wn], "intercept": b}``; a request is JSON rows of n numbers, and the answer is each
row's score, ``row . coef + b``. SageMaker loads each model through ``POST /models`` with its own directory, so
``model_fn`` runs once per model (in each worker that serves it), and ``model_unload_fn`` once per unload.

Save two models, serve them, load one and ask it::

    python -c 'import multi_model; multi_model.save("/tmp/models/fraud", [0.5, -1, 2], 0.1)'
    python -c 'import multi_model; multi_model.save("/tmp/models/churn", [1, 1, 1])'
    INFERENCE_SERVER_PLUGINS=multi_model inference-server serve --multi-model
    curl localhost:8080/models -d '{"model_name": "fraud", "url": "/tmp/models/fraud"}'
    curl localhost:8080/models/fraud/invoke -H 'Content-Type: application/json' -d '[[1, 2, 3]]'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import inference_server
from inference_server.errors import BadRequest

#: The file ``model_fn`` loads from each model's directory.
MODEL_FILE = "model.json"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LinearModel:
    """One model of the family: the directory it came from, its coefficients and its intercept."""

    model_dir: str
    coef: np.ndarray
    intercept: float

    def score(self, rows: np.ndarray) -> np.ndarray:
        """Each row's score: ``rows @ coef + intercept``."""
        return rows @ self.coef + self.intercept


def save(model_dir: str | os.PathLike[str], coef: Sequence[float], intercept: float = 0.0) -> Path:
    """Write a model's ``model.json`` in ``model_dir`` (made if missing); return the file's path."""
    path = Path(model_dir) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"coef": [float(value) for value in coef], "intercept": float(intercept)}))
    return path


@inference_server.plugin_hook
def model_fn(model_dir: str) -> LinearModel:
    """Load ``model.json`` from this model's directory; a missing or malformed file is an error naming it."""
    path = Path(model_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {MODEL_FILE} in {model_dir} (write one with multi_model.save)")
    try:
        fields = json.loads(path.read_bytes())
        coef = np.asarray(fields["coef"], dtype=np.float64)
        intercept = float(fields.get("intercept", 0.0))
    except (ValueError, KeyError, TypeError) as exc:  # JSON, a missing key, numbers that are not
        raise ValueError(f'{path} is not {{"coef": [numbers], "intercept": number}}: {exc}') from None
    if coef.ndim != 1 or coef.size == 0:
        raise ValueError(f"{path}: coef must be a non-empty list of numbers, not an array of shape {coef.shape}")
    logger.info("Loaded the linear model of %s: %d coefficients", model_dir, coef.size)
    return LinearModel(model_dir, coef, intercept)


@inference_server.plugin_hook
def predict_fn(data: Any, model: LinearModel) -> np.ndarray:
    """Each row's score; rows of the wrong width are the client's mistake (400), saying what this model expects."""
    try:
        rows = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise BadRequest("the body must be JSON rows of numbers, such as [[1, 2, 3]]") from None
    width = model.coef.size
    if rows.ndim != 2 or rows.shape[1] != width:
        raise BadRequest(f"each row must have {width} numbers; the body's rows make an array of shape {rows.shape}")
    return model.score(rows)


@inference_server.plugin_hook
def model_unload_fn(model: LinearModel) -> None:
    """Called once in each worker that held the model, when SageMaker unloads it (``DELETE /models/{name}``).

    A linear model holds only Python memory, which is freed with the last reference to it; a model holding GPU
    memory, open files or threads would release them here. This one says that it went.
    """
    logger.info("Unloaded the linear model of %s", model.model_dir)
