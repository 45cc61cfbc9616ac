"""The defaults of AWS's framework containers for the functions an ``inference.py`` leaves out (``--script-defaults``).

Each follows its container's inference toolkit answer for answer, where the toolkit succeeds:

- ``sklearn``, the scikit-learn container: JSON and CSV bodies as float32 arrays, ``.npy`` as it is;
  ``model.predict``; answers by ``json.dumps``, ``np.savetxt(fmt="%s")`` or ``np.save``, the first ``Accept`` allows.
- ``xgboost``, the XGBoost container: CSV, LibSVM and RecordIO-protobuf bodies as a ``DMatrix``;
  ``model.predict(data, validate_features=False)``; the same answers.
- ``pytorch``, the PyTorch inference toolkit: ``model_fn`` loads TorchScript (``model.pt``, else the one ``.pt`` or
  ``.pth`` file) onto the GPU when there is one; JSON and CSV bodies as float32 tensors, ``.npy`` as a tensor of its
  dtype; ``model.eval()`` and ``model(data)`` under ``torch.no_grad()``; tensors answered as lists (JSON, CSV, NPY).
- ``huggingface``, the Hugging Face inference toolkit: ``model_fn`` builds a ``transformers`` pipeline for
  ``HF_TASK`` (else the task of ``config.json``'s architecture); JSON, CSV with a header row, ``.npy``, images and
  audio in; ``pipeline(inputs, **parameters)``; compact JSON, CSV records, ``.npy`` or an image out.

Where they differ from the toolkits, on purpose: media types match as HTTP says (case and parameters ignored; the
toolkits compare text); a body or ``Accept`` a default cannot handle is a 400, 415 or 406 saying what was wrong,
where the toolkits answer 500 (Hugging Face's: 400 for every failure, the model's too); ``.npy`` is never
unpickled. The modules these need (XGBoost, SciPy, PyTorch, transformers, Pillow) are imported on first use.
"""

from __future__ import annotations

import base64
import csv
import datetime
import importlib
import io
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import werkzeug.exceptions

from inference_server import codecs
from inference_server.codecs import npy

JSON, CSV = "application/json", "text/csv"


def _require(module: str, what: str) -> Any:
    """``module`` imported, or an ImportError saying which defaults need ``what`` and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"these --script-defaults need {what}") from None


def _as_bytes(input_data: str | bytes) -> bytes:
    return input_data if isinstance(input_data, bytes) else input_data.encode()


def _text(input_data: str | bytes, bare: str) -> str:
    if isinstance(input_data, str):
        return input_data
    try:
        return input_data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise werkzeug.exceptions.BadRequest(f"the {bare} body is not UTF-8: {exc}") from None


def _numbers(input_data: str | bytes, bare: str) -> np.ndarray:
    """A JSON (``np.array(json.loads(...))``) or CSV (``np.genfromtxt``) body as an array; a 400 when it is not
    numbers in rows of equal length."""
    text = _text(input_data, bare)
    try:
        if bare == JSON:
            return np.array(json.loads(text))
        return np.genfromtxt(io.StringIO(text), delimiter=",")
    except (ValueError, RecursionError) as exc:  # the client's body: not numbers, ragged, nested beyond reason
        raise werkzeug.exceptions.BadRequest(f"the {bare} body is not an array of numbers: {exc}") from None


def _unsupported(content_type: str, who: str, types: str) -> werkzeug.exceptions.UnsupportedMediaType:
    return werkzeug.exceptions.UnsupportedMediaType(
        f"Content type {content_type} is not supported by the {who} defaults ({types}): implement input_fn to "
        "deserialize it"
    )


def _tolist(value: Any) -> Any:
    """``json.dumps``'s ``default`` in the toolkits' encoder: anything with ``tolist()`` as its list."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _savetxt(prediction: Any) -> str:
    out = io.StringIO()
    np.savetxt(out, prediction, delimiter=",", fmt="%s")
    return out.getvalue()


def _npy(prediction: Any) -> bytes:
    """``np.save``'s bytes, never pickling (an object array is refused)."""
    return codecs.dumps(np.asarray(prediction), npy.MEDIA_TYPE)


#: The SageMaker inference toolkit's encoders (``sagemaker_inference.encoder``), shared by three containers.
TOOLKIT_ENCODERS: dict[str, Callable[[Any], str | bytes]] = {
    JSON: lambda prediction: json.dumps(prediction, default=_tolist),
    CSV: _savetxt,
    npy.MEDIA_TYPE: _npy,
}


def _encode(prediction: Any, accept: str, encoders: dict[str, Callable[[Any], Any]], who: str) -> tuple[Any, str]:
    """The prediction in the first type of ``accept`` that ``encoders`` write, with that type; else a 406."""
    for wanted in (codecs.bare(part) for part in accept.split(",")):
        encoder = encoders.get(wanted)
        if encoder is not None:
            return encoder(prediction), wanted
    raise werkzeug.exceptions.NotAcceptable(
        f"Accept {accept} is not supported by the {who} defaults ({', '.join(encoders)}): implement output_fn to "
        "serialize the prediction"
    )


# scikit-learn


def sklearn_input_fn(input_data: str | bytes, content_type: str) -> np.ndarray:
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


def sklearn_predict_fn(input_data: Any, model: Any) -> Any:
    """The scikit-learn container's default: ``model.predict``."""
    return model.predict(input_data)


def toolkit_output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The scikit-learn and XGBoost containers' default: JSON, CSV or ``.npy``, the first of ``accept`` it writes."""
    return _encode(prediction, accept, TOOLKIT_ENCODERS, "container")


# XGBoost


def _csv_rows(text: str) -> np.ndarray:
    """The XGBoost container's CSV: the delimiter sniffed from the first line, empty fields as NaN, float64."""
    try:
        delimiter = csv.Sniffer().sniff(text.split("\n")[0][:512]).delimiter
    except csv.Error:  # one column: nothing to sniff (the container fails there; a comma is what was meant)
        delimiter = ","
    if delimiter.isalnum():
        delimiter = ","
    rows = [["nan" if field == "" else field for field in line.split(delimiter)] for line in text.split("\n")]
    try:
        return np.array(rows).astype(None)
    except ValueError as exc:
        raise werkzeug.exceptions.BadRequest(f"the CSV body is not numeric rows of equal length: {exc}") from None


def _recordio_rows(body: bytes) -> Any:
    """RecordIO-protobuf's ``values`` features as rows: dense tensors stacked, sparse ones (keys and shape) as CSR."""
    import scipy.sparse  # type: ignore[import-untyped]

    from inference_server.codecs import recordio_protobuf as _record

    try:
        records = _record.read_records(body)
    except ValueError as exc:
        raise werkzeug.exceptions.BadRequest(str(exc)) from None
    rows: list[_record.Tensor] = []
    for record in records:
        value = record.features.get("values")
        kinds = (value.float32_tensor, value.float64_tensor, value.int32_tensor) if value is not None else ()
        tensor = next((kind for kind in kinds if kind.values or kind.shape), None)  # a sparse row may be all 0
        if tensor is None:
            raise werkzeug.exceptions.BadRequest("a RecordIO-protobuf record has no 'values' feature")
        rows.append(tensor)
    if all(not tensor.keys for tensor in rows):
        return np.array([tensor.values for tensor in rows], dtype=np.float64)
    width = max(tensor.shape[0] if tensor.shape else max(tensor.keys) + 1 for tensor in rows)
    if width >= 2**31 or any(key >= width for tensor in rows for key in tensor.keys):
        raise werkzeug.exceptions.BadRequest(
            f"a sparse RecordIO-protobuf record has a key or shape beyond its width ({width} columns, at most 2**31)"
        )
    data = [value for tensor in rows for value in tensor.values]
    columns = [key for tensor in rows for key in tensor.keys]
    pointers = np.cumsum(np.array([0] + [len(tensor.keys) for tensor in rows]))
    return scipy.sparse.csr_matrix((data, columns, pointers), shape=(len(rows), width))


def _libsvm_rows(text: str) -> Any:
    """LibSVM lines (``<label> <index>:<value> ...``, ``qid:`` and ``#`` comments ignored) as a CSR matrix; the
    labels are dropped, as for prediction. A malformed line is a 400 naming it."""
    import scipy.sparse

    data: list[float] = []
    columns: list[int] = []
    pointers = [0]
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        for field in fields[1:]:
            index, colon, value = field.partition(":")
            if index == "qid":
                continue
            try:
                column, number_value = int(index), float(value)
            except ValueError:
                column, number_value = -1, 0.0
            if not colon or not 0 <= column < 2**31:
                raise werkzeug.exceptions.BadRequest(f"LibSVM line {number}: {field!r} is not <index>:<value>")
            columns.append(column)
            data.append(number_value)
        pointers.append(len(columns))
    width = max(columns) + 1 if columns else 0
    return scipy.sparse.csr_matrix((data, columns, pointers), shape=(len(pointers) - 1, width))


def xgboost_input_fn(input_data: str | bytes, content_type: str) -> Any:
    """The XGBoost container's default: CSV, LibSVM and RecordIO-protobuf bodies as a ``DMatrix``."""
    xgboost = _require("xgboost", "XGBoost: pip install xgboost (or xgboost-cpu)")
    bare = codecs.bare(content_type)
    if bare == CSV:
        return xgboost.DMatrix(_csv_rows(_text(input_data, bare)))
    if bare in ("text/libsvm", "text/x-libsvm"):
        return xgboost.DMatrix(_libsvm_rows(_text(input_data, "LibSVM")))
    if bare == "application/x-recordio-protobuf":
        return xgboost.DMatrix(_recordio_rows(_as_bytes(input_data)))
    raise _unsupported(content_type, "XGBoost", "text/csv, text/libsvm, application/x-recordio-protobuf")


def xgboost_predict_fn(input_data: Any, model: Any) -> Any:
    """The XGBoost container's default: ``model.predict(data, validate_features=False)``."""
    return model.predict(input_data, validate_features=False)


# PyTorch


def _torch() -> Any:
    return _require("torch", "PyTorch: pip install torch")


def _device(torch: Any) -> Any:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytorch_model_fn(model_dir: str) -> Any:
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


def pytorch_input_fn(input_data: str | bytes, content_type: str) -> Any:
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


def pytorch_predict_fn(data: Any, model: Any) -> Any:
    """The PyTorch toolkit's default: the model in eval mode, called on the data on its device, without gradients."""
    torch = _torch()
    device = _device(torch)
    with torch.no_grad():
        model = model.to(device)
        model.eval()
        return model(data.to(device))


def pytorch_output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The PyTorch toolkit's default: a tensor as its list, then JSON, CSV or ``.npy``, the first of ``accept``."""
    torch = _torch()
    if type(prediction) is torch.Tensor:
        prediction = prediction.detach().cpu().numpy().tolist()
    return _encode(prediction, accept, TOOLKIT_ENCODERS, "PyTorch")


# Hugging Face

HF_IMAGE_TYPES = ("image/jpeg", "image/png", "image/tiff", "image/bmp", "image/gif", "image/webp", "image/x-image")
HF_AUDIO_TYPES = ("audio/x-flac", "audio/mpeg", "audio/wave", "audio/ogg", "audio/x-audio")
#: Tasks whose pipeline takes a feature extractor from the model directory (the others take a tokenizer).
_FEATURE_TASKS = {
    "automatic-speech-recognition",
    "image-segmentation",
    "image-classification",
    "audio-classification",
    "object-detection",
    "zero-shot-image-classification",
}
#: The toolkit's task for an architecture, by the end of its name (the first that matches).
_ARCHITECTURE_TASKS = (
    ("TapasForQuestionAnswering", "table-question-answering"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForTokenClassification", "token-classification"),
    ("ForSequenceClassification", "text-classification"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForMaskedLM", "fill-mask"),
    ("ForCausalLM", "text-generation"),
    ("ForConditionalGeneration", "text2text-generation"),
    ("MTModel", "text2text-generation"),
    ("EncoderDecoderModel", "text2text-generation"),
    ("GPT2LMHeadModel", "text-generation"),
    ("T5WithLMHeadModel", "text2text-generation"),
)


def _hf_task(model_dir: str) -> str:
    """``HF_TASK``, else the task of the architecture in ``config.json`` (then set as ``HF_TASK``, as the toolkit
    does)."""
    task = os.environ.get("HF_TASK", "").strip()
    if task:
        return task
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        diffusers = (Path(model_dir) / "model_index.json").is_file()
        raise ValueError(
            f"no HF_TASK and no config.json in {model_dir}: "
            + (
                "diffusers pipelines (model_index.json) are not among the huggingface defaults; define model_fn"
                if diffusers
                else "set HF_TASK, and save the model (save_pretrained) into the model directory (models are never "
                "downloaded from the Hub at start-up, HF_MODEL_ID included)"
            )
        )
    architecture = (json.loads(config.read_text()).get("architectures") or [""])[0]
    for ending, task in _ARCHITECTURE_TASKS:
        if architecture.endswith(ending):
            os.environ["HF_TASK"] = task
            return task
    raise ValueError(f"the task of architecture {architecture!r} ({config}) cannot be inferred: set HF_TASK")


def huggingface_model_fn(model_dir: str) -> Any:
    """The Hugging Face toolkit's default: a ``transformers`` pipeline for the task, from the model directory (its
    tokenizer or feature extractor too), on GPU 0 when there is one."""
    transformers = _require("transformers", "transformers and PyTorch: pip install transformers torch")
    task = _hf_task(model_dir)
    source = {"feature_extractor" if task in _FEATURE_TASKS else "tokenizer": model_dir}
    device = 0 if _torch().cuda.is_available() else -1
    trust = os.environ.get("HF_TRUST_REMOTE_CODE", "false").strip().lower() in ("1", "y", "yes", "t", "true", "on")
    return transformers.pipeline(task=task, model=model_dir, device=device, trust_remote_code=trust, **source)


def _hf_csv(text: str) -> dict[str, Any]:
    """CSV with a header row naming ``inputs`` (one input per row) or ``question`` and ``context`` (a record each)."""
    lines = text.splitlines()
    if not lines or not any(name in lines[0].lower() for name in ("question", "context", "inputs")):
        raise werkzeug.exceptions.BadRequest(
            "the CSV body needs a header row with an 'inputs' column (or 'question' and 'context') for the "
            "Hugging Face defaults"
        )
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise werkzeug.exceptions.BadRequest("the CSV body has a header row and no rows")
    if "inputs" in rows[0]:
        return {"inputs": [row["inputs"] for row in rows]}
    return {"inputs": rows}


def _hf_image(data: bytes) -> Any:
    image_module = _require("PIL.Image", "Pillow for image bodies: pip install pillow")
    try:
        with image_module.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (OSError, ValueError, image_module.DecompressionBombError) as exc:
        raise werkzeug.exceptions.BadRequest(f"the image body cannot be read: {exc}") from None


def huggingface_input_fn(input_data: str | bytes, content_type: str) -> Any:
    """The Hugging Face toolkit's default: JSON as it is, CSV with a header as ``{"inputs": ...}``, ``.npy`` as an
    array, an image as ``{"inputs": PIL.Image}`` (RGB), audio as ``{"inputs": bytes}``."""
    bare = codecs.bare(content_type)
    task = os.environ.get("HF_TASK")
    if bare == CSV and task in ("zero-shot-classification", "table-question-answering"):
        raise werkzeug.exceptions.BadRequest(f"content type text/csv is not supported with {task}: send JSON")
    if bare == JSON:
        try:
            return json.loads(_text(input_data, bare))
        except (ValueError, RecursionError) as exc:
            raise werkzeug.exceptions.BadRequest(f"the JSON body cannot be parsed: {exc}") from None
    if bare == CSV:
        return _hf_csv(_text(input_data, bare))
    if bare == npy.MEDIA_TYPE:
        return codecs.loads(_as_bytes(input_data), npy.MEDIA_TYPE)
    if bare in HF_IMAGE_TYPES:
        return {"inputs": _hf_image(_as_bytes(input_data))}
    if bare in HF_AUDIO_TYPES:
        return {"inputs": _as_bytes(input_data)}
    raise _unsupported(content_type, "Hugging Face", "JSON, CSV, NPY, images, audio")


def huggingface_predict_fn(data: Any, model: Any) -> Any:
    """The Hugging Face toolkit's default: ``model(inputs, **parameters)`` from ``{"inputs": ..., "parameters":
    {...}}`` (a dict without ``inputs`` is the inputs). A pipeline's refusal of them is a 400."""
    if not isinstance(data, dict):
        raise werkzeug.exceptions.BadRequest(
            f"the Hugging Face defaults take an object with 'inputs' (and 'parameters'), not {type(data).__name__}"
        )
    inputs = data.pop("inputs", data)
    parameters = data.pop("parameters", None)
    if parameters is not None and not isinstance(parameters, dict):
        raise werkzeug.exceptions.BadRequest(f"'parameters' must be an object, not {type(parameters).__name__}")
    try:
        return model(inputs) if parameters is None else model(inputs, **parameters)
    except (TypeError, ValueError, KeyError) as exc:
        raise werkzeug.exceptions.BadRequest(
            f"the pipeline refused the inputs or parameters: {type(exc).__name__}: {exc}"
        ) from None


def _hf_default(value: Any) -> Any:
    """The Hugging Face toolkit's JSON encoder's ``default``: NumPy numbers, arrays, datetimes, images (PNG, base64)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, datetime.datetime):
        return str(value)
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        return base64.b64encode(_hf_encode_image(value, "image/png")).decode("utf-8")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _hf_json(prediction: Any) -> str:
    return json.dumps(prediction, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_hf_default)


def _hf_csv_records(prediction: Any) -> str:
    records = prediction if isinstance(prediction, list) else list(prediction)
    if not records or not all(isinstance(record, dict) for record in records):
        raise werkzeug.exceptions.NotAcceptable(
            "text/csv answers are records (dicts) for the Hugging Face defaults; this prediction is not: ask for "
            "application/json"
        )
    out = io.StringIO()
    writer = csv.DictWriter(out, records[0].keys())
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def _hf_encode_image(image: Any, media_type: str) -> bytes:
    image_format = "PNG" if media_type == "image/x-image" else media_type.split("/")[-1].upper()
    with io.BytesIO() as out:
        image.save(out, format=image_format)
        return out.getvalue()


def _hf_image_encoder(media_type: str) -> Callable[[Any], bytes]:
    return lambda image: _hf_encode_image(image, media_type)


#: The Hugging Face toolkit's encoders.
HF_ENCODERS: dict[str, Callable[[Any], str | bytes]] = {
    JSON: _hf_json,
    CSV: _hf_csv_records,
    npy.MEDIA_TYPE: _npy,
    **{media_type: _hf_image_encoder(media_type) for media_type in HF_IMAGE_TYPES},
}


def huggingface_output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The Hugging Face toolkit's default: compact JSON, CSV records, ``.npy`` or an image, the first of
    ``accept``."""
    return _encode(prediction, accept, HF_ENCODERS, "Hugging Face")


#: ``--script-defaults``: what stands in for the functions a script does not define (``model_fn`` too, where the
#: container has one: then no script is needed at all).
DEFAULTS: dict[str, dict[str, Callable[..., Any]]] = {
    "inference-server": {},
    "sklearn": {"input_fn": sklearn_input_fn, "predict_fn": sklearn_predict_fn, "output_fn": toolkit_output_fn},
    "xgboost": {"input_fn": xgboost_input_fn, "predict_fn": xgboost_predict_fn, "output_fn": toolkit_output_fn},
    "pytorch": {
        "model_fn": pytorch_model_fn,
        "input_fn": pytorch_input_fn,
        "predict_fn": pytorch_predict_fn,
        "output_fn": pytorch_output_fn,
    },
    "huggingface": {
        "model_fn": huggingface_model_fn,
        "input_fn": huggingface_input_fn,
        "predict_fn": huggingface_predict_fn,
        "output_fn": huggingface_output_fn,
    },
}
#: The ``accept`` a container passes when the request has none (or ``*/*``); else SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT.
FIXED_ACCEPT = {"huggingface": JSON}
