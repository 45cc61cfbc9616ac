"""The defaults of AWS's framework containers for the functions an ``inference.py`` leaves out (``--script-defaults``):
one module per container (``sklearn``, ``xgboost``, ``pytorch``, ``huggingface``), each following its container's
inference toolkit answer for answer, where the toolkit succeeds.

Where they differ from the toolkits, on purpose: media types match as HTTP says (case and parameters ignored; the
toolkits compare text); a body or ``Accept`` a default cannot handle is a 400, 415 or 406 saying what was wrong,
where the toolkits answer 500 (Hugging Face's: 400 for every failure, the model's too); ``.npy`` is never
unpickled. The modules these need (XGBoost, SciPy, PyTorch, transformers, Pillow) are imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inference_server.containers import huggingface, pytorch, sklearn, xgboost
from inference_server.containers._common import JSON, toolkit_output_fn

__all__ = ["DEFAULTS", "FIXED_ACCEPT"]

#: ``--script-defaults``: what stands in for the functions a script does not define (``model_fn`` too, where the
#: container has one: then no script is needed at all).
DEFAULTS: dict[str, dict[str, Callable[..., Any]]] = {
    "inference-server": {},
    "sklearn": {"input_fn": sklearn.input_fn, "predict_fn": sklearn.predict_fn, "output_fn": toolkit_output_fn},
    "xgboost": {"input_fn": xgboost.input_fn, "predict_fn": xgboost.predict_fn, "output_fn": toolkit_output_fn},
    "pytorch": {
        "model_fn": pytorch.model_fn,
        "input_fn": pytorch.input_fn,
        "predict_fn": pytorch.predict_fn,
        "output_fn": pytorch.output_fn,
    },
    "huggingface": {
        "model_fn": huggingface.model_fn,
        "input_fn": huggingface.input_fn,
        "predict_fn": huggingface.predict_fn,
        "output_fn": huggingface.output_fn,
    },
}
#: The ``accept`` a container passes when the request has none (or ``*/*``); else SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT.
FIXED_ACCEPT = {"huggingface": JSON}
