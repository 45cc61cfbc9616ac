"""The framework containers' defaults (``--script-defaults``) against the containers' own inference toolkits, side by
side: the PyTorch toolkit's ``DefaultPytorchInferenceHandler``, the SageMaker inference toolkit's encoder (the
scikit-learn and XGBoost answers) and the Hugging Face toolkit's decoders and encoders, each from PyPI, downloaded
on first use (the ``toolkits`` fixture of conftest). The same input gives the same result, or both refuse it (ours
with a 4xx saying what).

This module holds the comparisons the other ``test_containers_*`` modules share, and the encoder the scikit-learn and
XGBoost defaults share."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import werkzeug.exceptions
from PIL import Image

from inference_server.containers._common import toolkit_output_fn
from tests.conftest import outcome


def _same(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs), (ours, theirs)
    if isinstance(theirs, torch.Tensor):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
        assert torch.equal(ours, theirs)
    elif isinstance(theirs, np.ndarray):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
        assert np.array_equal(ours, theirs)
    elif isinstance(theirs, Image.Image):
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size)
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        for key in theirs:
            _same(ours[key], theirs[key])
    else:
        assert ours == theirs


def _assert_decoded_alike(ours: Callable[[], Any], theirs: Callable[[], Any]) -> None:
    """The same value from both input_fns, or both refuse (ours with a 400 or 415)."""
    (our_kind, our_result), (their_kind, their_result) = outcome(ours), outcome(theirs)
    assert our_kind == their_kind, (our_result, their_result)
    if our_kind == "error":
        assert isinstance(our_result, werkzeug.exceptions.HTTPException), our_result
        assert our_result.code in (400, 415)
    else:
        _same(our_result, their_result)


def _utf8(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("accept", ["application/json", "text/csv", "application/x-npy"])
@pytest.mark.parametrize(
    "prediction",
    [
        np.array([0, 1, 1]),
        np.array([[0.25, 0.75]], dtype=np.float32),
        np.array(["cat", "dog"]),
        [1, 2.5],
        np.float32(0.5),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    ],
    ids=["labels", "probabilities", "strings", "list", "scalar", "fortran order"],
)
def test_toolkit_output_fn_matches_the_inference_toolkits_encoder(toolkits: None, prediction: Any, accept: str) -> None:
    """The scikit-learn and XGBoost answers are the SageMaker inference toolkit encoder's, byte for byte, or both
    fail (a scalar as CSV: the model's prediction, a 500 in both)."""
    from sagemaker_inference import encoder

    (our_kind, ours), (their_kind, theirs) = (
        outcome(lambda: toolkit_output_fn(prediction, accept)),
        outcome(lambda: encoder.encode(prediction, accept)),
    )
    assert our_kind == their_kind, (ours, theirs)
    if our_kind == "value":
        body, content_type = ours
        assert _utf8(body) == _utf8(theirs)
        assert content_type == accept
