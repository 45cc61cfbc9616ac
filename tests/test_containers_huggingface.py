"""The Hugging Face container's defaults against the Hugging Face toolkit's decoders and encoders, side by side: the
same input gives the same result, or both refuse it (ours with a 4xx saying what)."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import werkzeug.exceptions
from PIL import Image

from inference_server.containers import huggingface
from tests.conftest import outcome, save_bert_classifier
from tests.test_containers_common import _assert_decoded_alike, _npy
from tests.test_containers_pytorch import _mapped_share


def _png(mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 3, 4)[..., : len(mode)].squeeze(), mode).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


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
        lambda: huggingface.input_fn(body, content_type),
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
    ours = outcome(lambda: huggingface.output_fn(prediction, accept))
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
        assert huggingface.output_fn(image, accept) == (decoder_encoder.encode(image, accept), accept)


def test_huggingface_csv_is_refused_for_tasks_that_need_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """zero-shot-classification and table-question-answering take JSON only: CSV is a 400 saying so."""
    monkeypatch.setenv("HF_TASK", "zero-shot-classification")
    with pytest.raises(werkzeug.exceptions.BadRequest, match="not supported with zero-shot-classification"):
        huggingface.input_fn("inputs\nx\n", "text/csv")


@pytest.mark.parametrize(
    ("data", "message"),
    [(["a list"], "not list"), ({"inputs": "x", "parameters": [1]}, "'parameters' must be an object")],
)
def test_huggingface_predict_fn_refuses_what_is_not_inputs_and_parameters(data: Any, message: str) -> None:
    """A body that is not {"inputs", "parameters"} (the toolkit's AttributeError, a 400 there too) is a 400."""
    with pytest.raises(werkzeug.exceptions.BadRequest, match=message):
        huggingface.predict_fn(data, lambda inputs, **parameters: inputs)


def test_huggingface_task_from_the_environment_or_the_architecture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_TASK wins; else config.json's architecture names the task (TAPAS before plain question answering); else
    an error says to set HF_TASK, or that diffusers pipelines are not provided."""
    monkeypatch.setenv("HF_TASK", "")  # recorded first, so HF_TASK is restored as it was (_task sets it)
    monkeypatch.delenv("HF_TASK")
    with pytest.raises(ValueError, match="set HF_TASK"):
        huggingface._task(str(tmp_path))
    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ValueError, match="diffusers pipelines"):
        huggingface._task(str(tmp_path))
    for architecture, task in [
        ("TapasForQuestionAnswering", "table-question-answering"),
        ("BertForQuestionAnswering", "question-answering"),
        ("GPT2LMHeadModel", "text-generation"),
    ]:
        (tmp_path / "config.json").write_text(f'{{"architectures": ["{architecture}"]}}')
        monkeypatch.delenv("HF_TASK", raising=False)
        assert huggingface._task(str(tmp_path)) == task
    (tmp_path / "config.json").write_text('{"architectures": ["SomethingElse"]}')
    monkeypatch.delenv("HF_TASK", raising=False)
    with pytest.raises(ValueError, match="cannot be inferred: set HF_TASK"):
        huggingface._task(str(tmp_path))
    monkeypatch.setenv("HF_TASK", "fill-mask")
    assert huggingface._task(str(tmp_path)) == "fill-mask"


def test_a_missing_module_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the framework the defaults need, the error says which and how to install it."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="need transformers and PyTorch: pip install transformers torch"):
        huggingface.model_fn("/nonexistent")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text classifier of about 3 MB saved as transformers saves one (config.json, model.safetensors, a word-level
    tokenizer), made here: nothing is downloaded."""
    return save_bert_classifier(
        tmp_path_factory.mktemp("bert"), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=32,
    )  # fmt: skip


def _copy_of(bert_dir: Path, where: Path, weights: str) -> Path:
    """``bert_dir`` copied to ``where`` with its weights as ``weights``: model.safetensors as it is, or a state dict
    saved by torch.save as pytorch_model.bin, zip-format or "legacy" (PyTorch's format before 1.6)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    shutil.copytree(bert_dir, where)
    if weights != "model.safetensors":
        state = load_file(where / "model.safetensors")
        (where / "model.safetensors").unlink()
        torch.save(state, where / "pytorch_model.bin", _use_new_zipfile_serialization=weights != "legacy")
    return where


def _scores(classify: Any) -> list[Any]:
    return classify(["the movie was good", "bad"], top_k=None)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_huggingface_model_fn_keeps_the_weights_mapped_from_their_file(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, weights: str
) -> None:
    """On the CPU the pipeline's weights lie in a mapping of model.safetensors (or of a zip-format .bin, which
    transformers loads with torch.load(mmap=True, weights_only=True)), not in copies; its predictions are those of
    the same model read into memory (disable_mmap); no DEBUG line."""
    from transformers import pipeline

    monkeypatch.setenv("HF_TASK", "text-classification")
    model_dir = _copy_of(bert_dir, tmp_path / "model", weights)
    with caplog.at_level(logging.DEBUG, logger="inference_server"):
        classify = huggingface.model_fn(str(model_dir))
    assert "not memory-mapped" not in caplog.text
    assert _mapped_share(classify.model.state_dict().values(), model_dir / weights) == 1.0
    read = pipeline("text-classification", model=str(bert_dir), device=-1, model_kwargs={"disable_mmap": True})
    assert _mapped_share(read.model.state_dict().values(), bert_dir) == 0.0
    assert _scores(classify) == _scores(read)


@pytest.mark.parametrize("case", ["legacy .bin", "dtype converted"])
def test_huggingface_weights_that_are_not_mapped_are_said_in_a_debug_line(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """A checkpoint transformers reads into memory (a .bin in PyTorch's legacy format) or converts (float16
    weights, config.json's dtype float32) loads as it did, and one DEBUG line says how many bytes are not mapped
    and the likely reason."""
    monkeypatch.setenv("HF_TASK", "text-classification")
    if case == "legacy .bin":
        model_dir = _copy_of(bert_dir, tmp_path / "model", "legacy")
        reason = "pytorch_model.bin: a checkpoint in PyTorch's legacy format (not a zip file)"
    else:
        from transformers import BertForSequenceClassification

        model_dir = tmp_path / "model"
        _copy_of(bert_dir, model_dir, "model.safetensors")
        BertForSequenceClassification.from_pretrained(str(bert_dir)).half().save_pretrained(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        assert config["dtype"] == "float16"
        (model_dir / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
        reason = "transformers copied them: a dtype in config.json other than the checkpoint's"
    with caplog.at_level(logging.DEBUG, logger="inference_server"):
        classify = huggingface.model_fn(str(model_dir))
    lines = [record.getMessage() for record in caplog.records if "not memory-mapped" in record.getMessage()]
    assert len(lines) == 1, lines
    size = sum(tensor.untyped_storage().nbytes() for tensor in classify.model.state_dict().values())
    assert f": {size} of the {size} bytes of the model's weights are in memory" in lines[0]
    assert reason in lines[0]
    assert _mapped_share(classify.model.state_dict().values(), model_dir) == 0.0
    assert [len(labels) for labels in _scores(classify)] == [2, 2]
