"""The PyTorch inference toolkit's defaults: ``model_fn`` loads TorchScript (``model.pt``, else the one ``.pt`` or
``.pth`` file) onto the GPU when there is one; JSON and CSV bodies as float32 tensors, ``.npy`` as a tensor of its
dtype; ``model.eval()`` and ``model(data)`` under ``torch.no_grad()``; tensors answered as lists (JSON, CSV, NPY).
PyTorch is imported on first use."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import werkzeug.exceptions

from inference_server import codecs
from inference_server.codecs import npy
from inference_server.containers._common import (
    CSV,
    JSON,
    TOOLKIT_ENCODERS,
    _as_bytes,
    _encode,
    _numbers,
    _torch,
    _unsupported,
)


def _device(torch: Any) -> Any:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_fn(model_dir: str) -> Any:
    """The PyTorch toolkit's default: the TorchScript model in ``model.pt``, else in the one ``.pt`` or ``.pth`` file
    of ``model_dir``, on the GPU when there is one."""
    torch = _torch()
    directory = Path(model_dir)
    path = directory / "model.pt"
    if not path.is_file():
        found = sorted(p.name for p in directory.glob("*.pt*") if p.suffix in (".pt", ".pth") and p.is_file())
        if len(found) != 1:
            raise ValueError(f"Exactly one .pth or .pt file is required for PyTorch models in {model_dir}: {found}")
        path = directory / found[0]
    device = _device(torch)
    try:
        with warnings.catch_warnings():  # PyTorch 2.13 deprecates TorchScript, the format this default loads
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(path), map_location=device)
    except RuntimeError as exc:
        raise RuntimeError(
            f"Failed to load {path}: save the model with TorchScript (torch.jit.save), or define model_fn to load it"
        ) from exc
    return model.to(device)


def input_fn(input_data: str | bytes, content_type: str) -> Any:
    """The PyTorch toolkit's default: JSON and CSV as a float32 tensor, ``.npy`` as a tensor of the array's dtype,
    on the model's device."""
    torch = _torch()
    bare = codecs.bare(content_type)
    try:
        if bare in (JSON, CSV):
            tensor = torch.as_tensor(_numbers(input_data, bare), dtype=torch.float32)
        elif bare == npy.MEDIA_TYPE:
            array = codecs.loads(_as_bytes(input_data), npy.MEDIA_TYPE)
            tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        else:
            raise _unsupported(content_type, "PyTorch", "JSON, CSV, NPY")
    except (TypeError, ValueError) as exc:  # torch's refusal of the array: strings, big-endian, unsupported dtypes
        raise werkzeug.exceptions.BadRequest(f"the {bare} body cannot be a tensor: {exc}") from None
    return tensor.to(_device(torch))


def predict_fn(data: Any, model: Any) -> Any:
    """The PyTorch toolkit's default: the model in eval mode, called on the data on its device, without gradients."""
    torch = _torch()
    device = _device(torch)
    with torch.no_grad():
        model = model.to(device)
        model.eval()
        return model(data.to(device))


def output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The PyTorch toolkit's default: a tensor as its list, then JSON, CSV or ``.npy``, the first of ``accept``."""
    torch = _torch()
    if type(prediction) is torch.Tensor:
        prediction = prediction.detach().cpu().numpy().tolist()
    return _encode(prediction, accept, TOOLKIT_ENCODERS, "PyTorch")
