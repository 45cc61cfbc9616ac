"""The framework containers' defaults (``--script-defaults``) against the containers' own inference toolkits, side by
side: the PyTorch toolkit's ``DefaultPytorchInferenceHandler``, the SageMaker inference toolkit's encoder (the
scikit-learn and XGBoost answers) and the Hugging Face toolkit's decoders and encoders, each from PyPI, downloaded
when the tests run. The same input gives the same result, or both refuse it (ours with a 4xx saying what)."""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import werkzeug.exceptions
from PIL import Image

from inference_server import _containers
from tests.conftest import outcome, pip, save_torchscript

TOOLKITS = (
    "sagemaker-pytorch-inference==2.0.25",  # its sdist carries the sagemaker_inference toolkit it was built with
    "sagemaker-huggingface-inference-toolkit==2.6.0",
    "multi-model-server==1.1.11",  # the Hugging Face toolkit's exceptions come from its mms.service
    "retrying",
)


@pytest.fixture(scope="module")
def toolkits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The toolkits' code importable (downloaded from PyPI without their dependencies, never installed)."""
    where = tmp_path_factory.mktemp("toolkits")
    pip(sys.executable, "download", "--no-deps", "-d", str(where), *TOOLKITS)
    site = where / "site"
    for wheel in where.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    (sdist,) = where.glob("sagemaker_pytorch_inference-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(where, filter="data")
    shutil.copytree(where / sdist.name.removesuffix(".tar.gz") / "src", site, dirs_exist_ok=True)
    sys.path.insert(0, str(site))
    yield
    sys.path.remove(str(site))


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


def _png(mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 3, 4)[..., : len(mode)].squeeze(), mode).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


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
        lambda: _containers.pytorch_input_fn(body, content_type),
        lambda: DefaultPytorchInferenceHandler().default_input_fn(body, content_type),
    )


def test_difference_pytorch_json_scalars_and_mixed_csv_columns(toolkits: None) -> None:
    """Where the toolkit goes wrong we answer what was meant: one number (JSON or CSV) is a 0-d tensor (the toolkit's
    torch.FloatTensor(np.array(5)) is 5 floats of uninitialised memory); CSV mixing integer and decimal columns is
    read (the toolkit's genfromtxt(dtype=None) makes a record array that torch refuses)."""
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    toolkit = DefaultPytorchInferenceHandler()
    assert toolkit.default_input_fn("5", "application/json").shape == (5,)
    assert torch.equal(_containers.pytorch_input_fn("5", "application/json"), torch.tensor(5.0))
    assert toolkit.default_input_fn("7", "text/csv").shape == (7,)
    assert torch.equal(_containers.pytorch_input_fn("7", "text/csv"), torch.tensor(7.0))
    with pytest.raises(TypeError):
        toolkit.default_input_fn("1,2.5\n3,4", "text/csv")
    assert _containers.pytorch_input_fn("1,2.5\n3,4", "text/csv").tolist() == [[1.0, 2.5], [3.0, 4.0]]


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
    ours = _containers.pytorch_predict_fn(data, _containers.pytorch_model_fn(str(torchscript_dir)))
    assert not ours.requires_grad
    _same(ours, theirs)


def test_pytorch_model_fn_finds_the_one_model_file_and_says_what_is_wrong(tmp_path: Path) -> None:
    """Without model.pt the one .pt or .pth file is loaded; none or several, or a file that is not TorchScript, is
    an error naming the files."""
    save_torchscript(torch.nn.Linear(1, 1), tmp_path / "weights.pth")
    assert isinstance(_containers.pytorch_model_fn(str(tmp_path)), torch.jit.ScriptModule)
    (tmp_path / "other.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"Exactly one .pth or .pt file .*\['other.pt', 'weights.pth'\]"):
        _containers.pytorch_model_fn(str(tmp_path))
    (tmp_path / "weights.pth").unlink()
    with pytest.raises(RuntimeError, match="save the model with TorchScript"):
        _containers.pytorch_model_fn(str(tmp_path))


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
    body, content_type = _containers.pytorch_output_fn(prediction, accept)
    assert _utf8(body) == _utf8(theirs)
    assert content_type == next(part.strip() for part in accept.split(",") if part.strip() != "image/png")


def test_an_accept_no_container_writes_is_a_406_listing_what_it_writes(toolkits: None) -> None:
    """The toolkit raises UnsupportedFormatError (a 500 there); ours is a 406 naming the types it can write."""
    from sagemaker_inference import errors
    from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

    with pytest.raises(errors.UnsupportedFormatError):
        DefaultPytorchInferenceHandler().default_output_fn(torch.ones(1), "image/png")
    with pytest.raises(werkzeug.exceptions.NotAcceptable, match="application/json, text/csv, application/x-npy"):
        _containers.pytorch_output_fn(torch.ones(1), "image/png")


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
        outcome(lambda: _containers.toolkit_output_fn(prediction, accept)),
        outcome(lambda: encoder.encode(prediction, accept)),
    )
    assert our_kind == their_kind, (ours, theirs)
    if our_kind == "value":
        body, content_type = ours
        assert _utf8(body) == _utf8(theirs)
        assert content_type == accept


#: (body as the toolkit receives it, content type), for the Hugging Face input_fn.
HF_INPUTS = [
    ('{"inputs": "the movie was good"}', "application/json"),
    ('{"inputs": ["a", "b"], "parameters": {"top_k": 2}}', "application/json"),
    ('{"question": "who?", "context": "me"}', "application/json"),
    ("inputs\nthe movie was good\nbad\n", "text/csv"),
    ("question,context\nwho?,me\nwhere?,here\n", "text/csv"),
    ("1,2\n3,4\n", "text/csv"),
    (_npy(np.arange(3.0)), "application/x-npy"),
    (_png("RGBA"), "image/png"),
    (_png("L"), "image/x-image"),
    (b"RIFF....WAVEfmt ", "audio/wave"),
    ("{bad", "application/json"),
    (b"not an image", "image/jpeg"),
    (b"hello", "text/plain"),
]


@pytest.mark.parametrize(("body", "content_type"), HF_INPUTS)
def test_huggingface_input_fn_matches_the_toolkit(toolkits: None, body: str | bytes, content_type: str) -> None:
    """JSON as it is, CSV with a header as {"inputs": ...}, .npy as an array, images as RGB PIL images and audio
    as bytes, as the Hugging Face toolkit decodes them; what it refuses we refuse with a 4xx."""
    from sagemaker_huggingface_inference_toolkit import decoder_encoder

    _assert_decoded_alike(
        lambda: _containers.huggingface_input_fn(body, content_type),
        lambda: decoder_encoder.decode(body, content_type),
    )


@pytest.mark.parametrize(
    ("prediction", "accept"),
    [
        ([{"label": "POSITIVE", "score": np.float32(0.5)}], "application/json"),
        ({"answer": "Zürich", "start": np.int64(3), "scores": np.array([0.25, 0.5])}, "application/json"),
        ([{"label": "POSITIVE", "score": 0.5}, {"label": "NEGATIVE", "score": 0.25}], "text/csv"),
        ([{"word": "a,b", "entity": 'say "hi"'}], "text/csv"),
        (np.array([[1.0, 2.0]]), "application/x-npy"),
        ([float("nan")], "application/json"),
        ([[1, 2]], "text/csv"),
    ],
)
def test_huggingface_output_fn_matches_the_toolkit(toolkits: None, prediction: Any, accept: str) -> None:
    """Compact JSON (non-ASCII kept, NumPy values as numbers), CSV records with a header, .npy: the Hugging Face
    toolkit's bytes; what it cannot write (NaN, CSV of non-records) it refuses and so do we."""
    from sagemaker_huggingface_inference_toolkit import decoder_encoder

    theirs = outcome(lambda: decoder_encoder.encode(prediction, accept))
    ours = outcome(lambda: _containers.huggingface_output_fn(prediction, accept))
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "value":
        body, content_type = ours[1]
        assert (body, content_type) == (theirs[1], accept)


def test_huggingface_images_are_answered_as_the_toolkit_writes_them(toolkits: None) -> None:
    """An image prediction goes out in the format Accept names (PNG for image/x-image), as the toolkit writes it,
    and inside JSON as base64 PNG."""
    from sagemaker_huggingface_inference_toolkit import decoder_encoder

    image = Image.open(io.BytesIO(_png("RGBA"))).convert("RGB")
    for accept in ("image/png", "image/x-image", "image/jpeg", "application/json"):
        assert _containers.huggingface_output_fn(image, accept) == (decoder_encoder.encode(image, accept), accept)


def test_huggingface_csv_is_refused_for_tasks_that_need_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """zero-shot-classification and table-question-answering take JSON only: CSV is a 400 saying so."""
    monkeypatch.setenv("HF_TASK", "zero-shot-classification")
    with pytest.raises(werkzeug.exceptions.BadRequest, match="not supported with zero-shot-classification"):
        _containers.huggingface_input_fn("inputs\nx\n", "text/csv")


@pytest.mark.parametrize(
    ("data", "message"),
    [(["a list"], "not list"), ({"inputs": "x", "parameters": [1]}, "'parameters' must be an object")],
)
def test_huggingface_predict_fn_refuses_what_is_not_inputs_and_parameters(data: Any, message: str) -> None:
    """A body that is not {"inputs", "parameters"} (the toolkit's AttributeError, a 400 there too) is a 400."""
    with pytest.raises(werkzeug.exceptions.BadRequest, match=message):
        _containers.huggingface_predict_fn(data, lambda inputs, **parameters: inputs)


def test_huggingface_task_from_the_environment_or_the_architecture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_TASK wins; else config.json's architecture names the task (TAPAS before plain question answering); else
    an error says to set HF_TASK, or that diffusers pipelines are not provided."""
    monkeypatch.setenv("HF_TASK", "")  # recorded first, so HF_TASK is restored as it was (_hf_task sets it)
    monkeypatch.delenv("HF_TASK")
    with pytest.raises(ValueError, match="set HF_TASK"):
        _containers._hf_task(str(tmp_path))
    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ValueError, match="diffusers pipelines"):
        _containers._hf_task(str(tmp_path))
    for architecture, task in [
        ("TapasForQuestionAnswering", "table-question-answering"),
        ("BertForQuestionAnswering", "question-answering"),
        ("GPT2LMHeadModel", "text-generation"),
    ]:
        (tmp_path / "config.json").write_text(f'{{"architectures": ["{architecture}"]}}')
        monkeypatch.delenv("HF_TASK", raising=False)
        assert _containers._hf_task(str(tmp_path)) == task
    (tmp_path / "config.json").write_text('{"architectures": ["SomethingElse"]}')
    monkeypatch.delenv("HF_TASK", raising=False)
    with pytest.raises(ValueError, match="cannot be inferred: set HF_TASK"):
        _containers._hf_task(str(tmp_path))
    monkeypatch.setenv("HF_TASK", "fill-mask")
    assert _containers._hf_task(str(tmp_path)) == "fill-mask"


def test_a_missing_module_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the framework the defaults need, the error says which and how to install it."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="need transformers and PyTorch: pip install transformers torch"):
        _containers.huggingface_model_fn("/nonexistent")
