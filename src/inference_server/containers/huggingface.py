"""The Hugging Face inference toolkit's defaults: ``model_fn`` builds a ``transformers`` pipeline for ``HF_TASK``
(else the task of ``config.json``'s architecture); JSON, CSV with a header row, ``.npy``, images and audio in;
``pipeline(inputs, **parameters)``; compact JSON, CSV records, ``.npy`` or an image out. transformers, PyTorch and
Pillow are imported on first use.

On the CPU the model's weights stay memory-mapped from its files, as transformers (5.x) loads them: a
``model.safetensors`` file (or its shards) through safetensors' ``mmap`` backend, a zip-format ``pytorch_model.bin``
through ``torch.load(mmap=True, weights_only=True)`` (nothing unpickled but what PyTorch's weights-only loader
allows), each tensor kept where it lies in the file when its dtype is the one the model is loaded in (``dtype="auto"``,
the pipeline's default: config.json's ``dtype``, else the checkpoint's). The workers that load the same model (a
multi-model endpoint's, each on first use) then share its pages through the page cache. What transformers copies
instead is said in one DEBUG line with its size and the likely reason: a legacy (pre-zip) ``.bin`` checkpoint, a
``dtype`` in config.json other than the checkpoint's, weights it converts or initialises (absent from the
checkpoint)."""

from __future__ import annotations

import base64
import csv
import datetime
import io
import json
import logging
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import werkzeug.exceptions

from inference_server import _memory, codecs
from inference_server.codecs import npy
from inference_server.containers._common import (
    CSV,
    JSON,
    _as_bytes,
    _encode,
    _npy,
    _require,
    _text,
    _torch,
    _unsupported,
)

logger = logging.getLogger("inference_server")

IMAGE_TYPES = ("image/jpeg", "image/png", "image/tiff", "image/bmp", "image/gif", "image/webp", "image/x-image")
AUDIO_TYPES = ("audio/x-flac", "audio/mpeg", "audio/wave", "audio/ogg", "audio/x-audio")
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


def _task(model_dir: str) -> str:
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


def model_fn(model_dir: str) -> Any:
    """The Hugging Face toolkit's default: a ``transformers`` pipeline for the task, from the model directory (its
    tokenizer or feature extractor too), on GPU 0 when there is one."""
    transformers = _require("transformers", "transformers and PyTorch: pip install transformers torch")
    task = _task(model_dir)
    source = {"feature_extractor" if task in _FEATURE_TASKS else "tokenizer": model_dir}
    device = 0 if _torch().cuda.is_available() else -1
    trust = os.environ.get("HF_TRUST_REMOTE_CODE", "false").strip().lower() in ("1", "y", "yes", "t", "true", "on")
    pipeline = transformers.pipeline(task=task, model=model_dir, device=device, trust_remote_code=trust, **source)
    _say_what_is_not_mapped(pipeline, model_dir)
    return pipeline


def _file_mappings(directory: Path) -> list[tuple[int, int]] | None:
    """The address ranges (start, end) this process maps of the files under ``directory`` (links followed), adjacent
    ones merged; None where ``/proc`` does not say (not Linux)."""
    if not os.path.isdir("/proc/self"):
        return None
    files = _memory.files_under(str(directory))
    merged: list[tuple[int, int]] = []
    for start, end in sorted((region.start, region.end) for region in _memory.mappings() if region.file in files):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _say_what_is_not_mapped(pipeline: Any, model_dir: str) -> None:
    """One DEBUG line when some of the pipeline's model's weights on the CPU (its state dict's distinct storages) lie
    outside the mappings of the model directory's files: transformers read or converted them into memory."""
    torch = _torch()
    model = getattr(pipeline, "model", None)
    if not isinstance(model, torch.nn.Module):
        return
    mappings = _file_mappings(Path(model_dir))
    if mappings is None:
        return
    total = unmapped = 0
    seen = set()
    for tensor in model.state_dict(keep_vars=True).values():
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.layout != torch.strided:
            continue
        storage = tensor.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
        if start in seen or size == 0:
            continue
        seen.add(start)
        total += size
        if not any(low <= start and start + size <= high for low, high in mappings):
            unmapped += size
    if unmapped:
        directory = Path(model_dir)
        safetensors = any(directory.glob("*.safetensors"))
        legacy = [] if safetensors else [p.name for p in sorted(directory.glob("*.bin")) if not zipfile.is_zipfile(p)]
        reason = (
            f"{', '.join(legacy)}: a checkpoint in PyTorch's legacy format (not a zip file), which torch.load reads "
            "into memory; save the model again (save_pretrained writes model.safetensors)"
            if legacy
            else "transformers copied them: a dtype in config.json other than the checkpoint's, weights it converts, "
            "or weights absent from the checkpoint"
        )
        logger.debug(
            "%s: %d of the %d bytes of the model's weights are in memory, not memory-mapped from its files: %s",
            model_dir,
            unmapped,
            total,
            reason,
        )


def _csv_inputs(text: str) -> dict[str, Any]:
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


def _image(data: bytes) -> Any:
    image_module = _require("PIL.Image", "Pillow for image bodies: pip install pillow")
    try:
        with image_module.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (OSError, ValueError, image_module.DecompressionBombError) as exc:
        raise werkzeug.exceptions.BadRequest(f"the image body cannot be read: {exc}") from None


def input_fn(input_data: str | bytes, content_type: str) -> Any:
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
        return _csv_inputs(_text(input_data, bare))
    if bare == npy.MEDIA_TYPE:
        return codecs.loads(_as_bytes(input_data), npy.MEDIA_TYPE)
    if bare in IMAGE_TYPES:
        return {"inputs": _image(_as_bytes(input_data))}
    if bare in AUDIO_TYPES:
        return {"inputs": _as_bytes(input_data)}
    raise _unsupported(content_type, "Hugging Face", "JSON, CSV, NPY, images, audio")


def predict_fn(data: Any, model: Any) -> Any:
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


def _json_default(value: Any) -> Any:
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
        return base64.b64encode(_encode_image(value, "image/png")).decode("utf-8")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json(prediction: Any) -> str:
    return json.dumps(prediction, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)


def _csv_records(prediction: Any) -> str:
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


def _encode_image(image: Any, media_type: str) -> bytes:
    image_format = "PNG" if media_type == "image/x-image" else media_type.split("/")[-1].upper()
    with io.BytesIO() as out:
        image.save(out, format=image_format)
        return out.getvalue()


def _image_encoder(media_type: str) -> Callable[[Any], bytes]:
    return lambda image: _encode_image(image, media_type)


#: The Hugging Face toolkit's encoders.
ENCODERS: dict[str, Callable[[Any], str | bytes]] = {
    JSON: _json,
    CSV: _csv_records,
    npy.MEDIA_TYPE: _npy,
    **{media_type: _image_encoder(media_type) for media_type in IMAGE_TYPES},
}


def output_fn(prediction: Any, accept: str) -> tuple[str | bytes, str]:
    """The Hugging Face toolkit's default: compact JSON, CSV records, ``.npy`` or an image, the first of
    ``accept``."""
    return _encode(prediction, accept, ENCODERS, "Hugging Face")
