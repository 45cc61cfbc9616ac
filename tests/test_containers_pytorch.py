"""The PyTorch container's defaults against the PyTorch toolkit's ``DefaultPytorchInferenceHandler``, side by side:
the same input gives the same result, or both refuse it (ours with a 4xx saying what)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import werkzeug.exceptions

from inference_server import _memory
from inference_server.containers import pytorch
from tests.conftest import save_torchscript
from tests.test_containers_common import _assert_decoded_alike, _npy, _same, _utf8
from tests.test_mapped import _mapping

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


def _mapped_share(tensors: Iterable[torch.Tensor], path: Path) -> float:
    """The share of the bytes of ``tensors``' distinct storages that lie in this process's mappings of the file
    ``path``, or of the files under the directory ``path`` (from /proc/self/maps)."""
    where = str(path.resolve())
    ranges = [(region.start, region.end) for region in _memory.mappings()
              if region.path == where or region.path.startswith(where + "/")]  # fmt: skip
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in tensors}
    inside = sum(size for start, size in storages.items() if any(a <= start and start + size <= b for a, b in ranges))
    return inside / sum(storages.values())


class _Weights(torch.nn.Module):
    """About 0.8 MB of weights: float32 and bfloat16 layers, a BatchNorm, two equal buffers and one that is a view."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(256, 512)
        self.second = torch.nn.Linear(512, 256).to(torch.bfloat16)
        self.norm = torch.nn.BatchNorm1d(256)
        self.register_buffer("zeros", torch.zeros(256))
        self.register_buffer("more_zeros", torch.zeros(256))
        self.register_buffer("rows", self.first.weight.detach()[:2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.second(torch.relu(self.first(x)).to(torch.bfloat16)).float()
        return self.norm(hidden + self.zeros + self.more_zeros) + self.rows.sum()


def _plain_load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def test_pytorch_model_fn_maps_the_weights_from_the_archive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On the CPU the TorchScript model's parameters and buffers (bfloat16 ones too) lie in a mapping of model.pt,
    not in copies; its predictions are a plain torch.jit.load's; equal buffers stay distinct and a view stays a view;
    writing to them (BatchNorm in training mode) changes private copies, never the file; no DEBUG line."""
    torch.manual_seed(0)
    save_torchscript(_Weights(), tmp_path / "model.pt")
    data = torch.randn(4, 256)
    with caplog.at_level(logging.DEBUG, logger="inference_server"):
        model = pytorch.model_fn(str(tmp_path))
    assert "not memory-mapped" not in caplog.text
    tensors = [*model.parameters(), *model.buffers()]
    assert _mapped_share(tensors, tmp_path / "model.pt") == 1.0
    assert model.second.weight.dtype == torch.bfloat16
    _same(pytorch.predict_fn(data, model), pytorch.predict_fn(data, _plain_load(tmp_path / "model.pt")))
    assert model.rows.untyped_storage().data_ptr() == model.first.weight.untyped_storage().data_ptr()
    saved = (tmp_path / "model.pt").read_bytes()
    model.train()
    model(data)
    model.zeros.add_(1.0)
    assert (float(model.zeros.sum()), float(model.more_zeros.sum())) == (256.0, 0.0)
    assert (tmp_path / "model.pt").read_bytes() == saved


CHILD = """
import sys

import torch

from inference_server.containers import pytorch

model = pytorch.model_fn(sys.argv[1])
pytorch.predict_fn(torch.ones(2, 256), model)
print("loaded", flush=True)
sys.stdin.read()
"""


def test_two_processes_loading_one_pytorch_model_share_its_pages(tmp_path: Path) -> None:
    """Two processes that load the same model.pt with model_fn (as two workers of a multi-model endpoint do) map its
    tensors' pages, all of them resident and none private: each process's PSS holds half of them."""
    torch.manual_seed(0)
    save_torchscript(_Weights(), tmp_path / "model.pt")
    size = sum(tensor.untyped_storage().nbytes() for tensor in _Weights().parameters())  # (about 0.8 MB)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "loaded\n"
        for child in children:
            mapping = _mapping(child.pid, str((tmp_path / "model.pt").resolve()))
            assert mapping["Shared_Clean"] + mapping["Shared_Dirty"] >= size, mapping  # (dirty: just written)
            assert mapping["Private_Clean"] + mapping["Private_Dirty"] <= mapping["Rss"] // 16, mapping
            assert mapping["Pss"] <= mapping["Rss"] * 0.6, mapping
    finally:
        for child in children:
            child.communicate("", timeout=30)


def _zipped_again(path: Path) -> None:
    """Rewrite the archive at ``path`` with every record compressed (deflate), which torch.jit.load still reads."""
    with zipfile.ZipFile(path) as archive:
        records = [(member.filename, archive.read(member)) for member in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in records:
            archive.writestr(name, data)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("frozen", r"bytes not found, byte for byte, among the model's parameters and buffers \(a frozen model's"),
        ("zipped again", r"bytes in compressed records \(an archive zipped again\)"),
    ],
)
def test_a_pytorch_model_that_cannot_be_mapped_is_loaded_as_it_is_with_a_debug_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str, reason: str
) -> None:
    """A frozen TorchScript model (its weights are constants of its code, not parameters) or an archive whose
    records are compressed loads as torch.jit.load loads it, to the same predictions, with one DEBUG line saying
    how many bytes stay in memory and why."""
    torch.manual_seed(0)
    module: Any = _Weights()
    if case == "frozen":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.freeze(torch.jit.script(module.eval()))
    save_torchscript(module, tmp_path / "model.pt")
    if case == "zipped again":
        _zipped_again(tmp_path / "model.pt")
    data = torch.randn(4, 256)
    with caplog.at_level(logging.DEBUG, logger="inference_server"):
        model = pytorch.model_fn(str(tmp_path))
    lines = [record.getMessage() for record in caplog.records if "not memory-mapped" in record.getMessage()]
    assert len(lines) == 1, lines
    with zipfile.ZipFile(tmp_path / "model.pt") as archive:
        size = sum(m.file_size for m in archive.infolist() if "/data/" in m.filename or "/constants/" in m.filename)
    assert f": {size} of the {size} bytes of its tensors stay in memory as loaded" in lines[0]
    assert re.search(reason, lines[0]), lines[0]
    if case == "zipped again":
        assert _mapped_share([*model.parameters(), *model.buffers()], tmp_path / "model.pt") == 0.0
    _same(pytorch.predict_fn(data, model), pytorch.predict_fn(data, _plain_load(tmp_path / "model.pt")))
