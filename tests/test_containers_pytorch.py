"""The PyTorch container's defaults against the PyTorch toolkit's ``DefaultPytorchInferenceHandler``, side by side:
the same input gives the same result, or both refuse it (ours with a 4xx saying what)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import werkzeug.exceptions

from inference_server.containers import pytorch
from tests.conftest import save_torchscript
from tests.test_containers_common import _assert_decoded_alike, _npy, _same, _utf8

#: (body as the toolkit receives it: str for JSON and CSV, content type), for the PyTorch input_fn.
PYTORCH_INPUTS = [
    ("[[1, 2], [3, 4]]", "application/json"),
    ("[1.5, -2e-3, 1e300]", "application/json"),
    ("[[true, false]]", "application/json"),
    ("1,2\n3,4", "text/csv"),
    ("0.5,2.5\n3.25,4", "text/csv"),
    (_npy(np.arange(6, dtype=np.float32).reshape(2, 3)), "application/x-npy"),
    (_npy(np.arange(4, dtype=np.int64)), "application/x-npy"),
    (_npy(np.array([[1.0, 2.0]])), "application/x-npy"),
    ('["a", "b"]', "application/json"),
    ("[[1, 2], [3]]", "application/json"),
    ("{bad", "application/json"),
    ('{"a": 1}', "application/json"),
    (_npy(np.array(["ab"])), "application/x-npy"),
    (b"hello", "text/plain"),
]


@pytest.mark.parametrize(("body", "content_type"), PYTORCH_INPUTS)
def test_pytorch_input_fn_matches_the_toolkit(toolkits: None, body: str | bytes, content_type: str) -> None:
    """JSON and CSV become float32 tensors and .npy a tensor of its dtype, as the PyTorch toolkit makes them; what
    it refuses we refuse with a 4xx."""
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    _assert_decoded_alike(
        lambda: pytorch.input_fn(body, content_type),
        lambda: DefaultPytorchInferenceHandler().default_input_fn(body, content_type),
    )


def test_difference_pytorch_json_scalars_and_mixed_csv_columns(toolkits: None) -> None:
    """Where the toolkit goes wrong we answer what was meant: one number (JSON or CSV) is a 0-d tensor (the toolkit's
    torch.FloatTensor(np.array(5)) is 5 floats of uninitialised memory); CSV mixing integer and decimal columns is
    read (the toolkit's genfromtxt(dtype=None) makes a record array that torch refuses)."""
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    toolkit = DefaultPytorchInferenceHandler()
    assert toolkit.default_input_fn("5", "application/json").shape == (5,)
    assert torch.equal(pytorch.input_fn("5", "application/json"), torch.tensor(5.0))
    assert toolkit.default_input_fn("7", "text/csv").shape == (7,)
    assert torch.equal(pytorch.input_fn("7", "text/csv"), torch.tensor(7.0))
    with pytest.raises(TypeError):
        toolkit.default_input_fn("1,2.5\n3,4", "text/csv")
    assert pytorch.input_fn("1,2.5\n3,4", "text/csv").tolist() == [[1.0, 2.5], [3.0, 4.0]]


@pytest.fixture(scope="module")
def torchscript_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory holding a TorchScript linear model as model.pt."""
    torch.manual_seed(0)
    where = tmp_path_factory.mktemp("torchscript")
    save_torchscript(torch.nn.Linear(3, 2), where / "model.pt")
    return where


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")  # the toolkit's own load
def test_pytorch_model_and_predict_fn_match_the_toolkit(toolkits: None, torchscript_dir: Path) -> None:
    """The TorchScript model.pt is loaded and called (eval mode, no gradients) to the same prediction."""
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    toolkit = DefaultPytorchInferenceHandler()
    data = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    theirs = toolkit.default_predict_fn(data, toolkit.default_model_fn(str(torchscript_dir)))
    ours = pytorch.predict_fn(data, pytorch.model_fn(str(torchscript_dir)))
    assert not ours.requires_grad
    _same(ours, theirs)


def test_pytorch_model_fn_finds_the_one_model_file_and_says_what_is_wrong(tmp_path: Path) -> None:
    """Without model.pt the one .pt or .pth file is loaded; none or several, or a file that is not TorchScript, is
    an error naming the files."""
    save_torchscript(torch.nn.Linear(1, 1), tmp_path / "weights.pth")
    assert isinstance(pytorch.model_fn(str(tmp_path)), torch.jit.ScriptModule)
    (tmp_path / "other.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"Exactly one .pth or .pt file .*\['other.pt', 'weights.pth'\]"):
        pytorch.model_fn(str(tmp_path))
    (tmp_path / "weights.pth").unlink()
    with pytest.raises(RuntimeError, match="save the model with TorchScript"):
        pytorch.model_fn(str(tmp_path))


PREDICTIONS = [
    torch.tensor([[0.5, -1.25], [3.0, 1e-8]]),
    torch.tensor([1, 2, 3]),
    [[1.5, 2], [3, 4]],
    np.array([0.1, 0.2], dtype=np.float32),
]
ACCEPTS = ["application/json", "text/csv", "application/x-npy", "text/csv, application/json", "image/png, text/csv"]


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("prediction", PREDICTIONS, ids=["tensor", "int tensor", "list", "float32 array"])
def test_pytorch_output_fn_matches_the_toolkit(toolkits: None, prediction: Any, accept: str) -> None:
    """The answer's bytes are the PyTorch toolkit's (tensors as lists, then JSON, CSV or .npy, the first of
    Accept), and its content type is the one chosen."""
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    theirs = DefaultPytorchInferenceHandler().default_output_fn(prediction, accept)
    body, content_type = pytorch.output_fn(prediction, accept)
    assert _utf8(body) == _utf8(theirs)
    assert content_type == next(part.strip() for part in accept.split(",") if part.strip() != "image/png")


def test_an_accept_no_container_writes_is_a_406_listing_what_it_writes(toolkits: None) -> None:
    """The toolkit raises UnsupportedFormatError (a 500 there); ours is a 406 naming the types it can write."""
    from sagemaker_inference import errors
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    with pytest.raises(errors.UnsupportedFormatError):
        DefaultPytorchInferenceHandler().default_output_fn(torch.ones(1), "image/png")
    with pytest.raises(werkzeug.exceptions.NotAcceptable, match="application/json, text/csv, application/x-npy"):
        pytorch.output_fn(torch.ones(1), "image/png")
