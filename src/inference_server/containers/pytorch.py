"""The PyTorch inference toolkit's defaults: ``model_fn`` loads TorchScript (``model.pt``, else the one ``.pt`` or
``.pth`` file) onto the GPU when there is one; JSON and CSV bodies as float32 tensors, ``.npy`` as a tensor of its
dtype; ``model.eval()`` and ``model(data)`` under ``torch.no_grad()``; tensors answered as lists (JSON, CSV, NPY).
PyTorch is imported on first use.

On the CPU, the loaded model's parameters and buffers are then memory-mapped from the TorchScript archive itself, and
the copies ``torch.jit.load`` read are freed: the workers that load the same file (a multi-model endpoint's, each on
first use) share its pages through the page cache, as :func:`inference_server.mapped` shares arrays. A TorchScript
archive is a zip file whose tensors are stored uncompressed, one record each (``<archive>/data/<N>``, aligned to 64
bytes); each distinct storage of the model is matched to the record holding the same bytes (by size, then by
content: nothing is unpickled but by ``torch.jit.load``) and rebound to it in place, so the model's outputs are the
same. The mapping is copy-on-write (``MAP_PRIVATE``): a model that writes to its weights (a BatchNorm in training
mode) gets private copies of the pages it writes, never a change to the file. What cannot be mapped stays in memory
as loaded, with one DEBUG line saying how many bytes and why: compressed records (an archive zipped again), tensors
that are not parameters or buffers (a frozen model's constants, plain tensor attributes), quantized or sparse
tensors. The file must not be rewritten in place while the model is loaded (a mapped file that shrinks is SIGBUS
when its pages are read); replacing it (a new file renamed over it) is safe."""

from __future__ import annotations

import logging
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import werkzeug.exceptions

from inference_server import _memory, codecs
from inference_server._mapped import member_offset
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

logger = logging.getLogger("inference_server")

#: A TorchScript archive's tensor records: ``<archive>/data/<N>`` (parameters, buffers, attributes) and
#: ``<archive>/constants/<N>`` (a frozen model's constants).
_TENSOR_RECORD = re.compile(r"[^/]+/(data|constants)/[0-9]+")
#: What reading an archive the load accepted can still raise (it is then left as loaded).
_UNMAPPABLE = (OSError, ValueError, RuntimeError, struct.error, zipfile.BadZipFile)


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
    if device.type == "cpu":
        _map_tensors(torch, model, path)
    return model.to(device)


def _records(path: Path) -> tuple[dict[int, list[int]], int, int]:
    """The archive's uncompressed tensor records (their data's offsets in the file, by byte size, in the archive's
    order), the bytes of all its tensor records and of those that cannot be mapped (compressed or encrypted)."""
    stored: dict[int, list[int]] = {}
    total = compressed = 0
    with zipfile.ZipFile(path) as archive, path.open("rb") as file:
        for member in archive.infolist():
            if not _TENSOR_RECORD.fullmatch(member.filename) or member.file_size == 0:
                continue
            total += member.file_size
            if member.compress_type != zipfile.ZIP_STORED or member.flag_bits & 0x1:
                compressed += member.file_size
                continue
            stored.setdefault(member.file_size, []).append(member_offset(file, member))
    return stored, total, compressed


def _rebind(torch: Any, model: Any, whole: Any, stored: dict[int, list[int]]) -> int:
    """Rebind each distinct storage of ``model``'s parameters and buffers to the record of the mapped file ``whole``
    that holds the same bytes (each record once, so storages that are equal stay distinct); the bytes rebound."""
    file_bytes = torch.empty(0, dtype=torch.uint8).set_(whole)
    storages: dict[int, list[Any]] = {}  # the tensors on each distinct storage (tied weights, views), by address
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.layout == torch.strided and not tensor.is_quantized and tensor.device.type == "cpu":
            storages.setdefault(tensor.untyped_storage().data_ptr(), []).append(tensor)
    mapped = 0
    with torch.no_grad():
        for tensors in storages.values():
            size = tensors[0].untyped_storage().nbytes()
            own = torch.empty(0, dtype=torch.uint8).set_(tensors[0].untyped_storage())
            for offset in stored.get(size, ()):
                if any(offset % tensor.element_size() for tensor in tensors):
                    continue
                if torch.equal(own, file_bytes[offset : offset + size]):
                    stored[size].remove(offset)
                    for tensor in tensors:
                        start = offset // tensor.element_size() + tensor.storage_offset()
                        tensor.set_(whole, start, tensor.size(), tensor.stride())
                    mapped += size
                    break
    return mapped


def _map_tensors(torch: Any, model: Any, path: Path) -> None:
    """Map ``path`` copy-on-write and rebind ``model``'s tensors to its records, then give the copies they leave back
    to the system; one DEBUG line for the bytes of the archive's tensors that stay in memory, and why."""
    try:
        stored, total, compressed = _records(path)
        whole = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size) if stored else None
    except _UNMAPPABLE as exc:
        logger.debug("%s: its tensors stay in memory as loaded, not memory-mapped: %s", path, exc)
        return
    mapped = _rebind(torch, model, whole, stored) if whole is not None else 0
    if mapped:
        _memory.give_memory_back()  # (the copies of small tensors are in the allocator's pools)
    if mapped < total:
        reasons = [f"{compressed} bytes in compressed records (an archive zipped again)"] if compressed else []
        if total - mapped - compressed > 0:
            reasons.append(
                f"{total - mapped - compressed} bytes not found, byte for byte, among the model's parameters and "
                "buffers (a frozen model's constants, plain tensor attributes, quantized or sparse tensors)"
            )
        logger.debug(
            "%s: %d of the %d bytes of its tensors stay in memory as loaded, not memory-mapped: %s",
            path,
            total - mapped,
            total,
            "; ".join(reasons),
        )


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
