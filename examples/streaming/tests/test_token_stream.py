"""The plugin in-process, as a model author tests it: the bigram table, the request's checks, the generator that
predict_fn returns, and the whole pipeline through inference-server's testing kit."""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import Path

import pytest
import token_stream

from inference_server import testing
from inference_server.errors import BadRequest


def test_the_table_is_the_texts_words_read_as_a_loop() -> None:
    """Each word (in lower case) maps to the words after it, the last to the first; an unknown word is followed by
    the text's first word, and every token is a word of the text with its leading space."""
    model = token_stream.BigramModel.from_text("The sea and the sky")
    assert model.followers == {"the": ("sea", "sky"), "sea": ("and",), "and": ("the",), "sky": ("The",)}
    tokens = list(model.generate("over", 6, seed=3))
    assert tokens[0] == " The"
    words = [token.removeprefix(" ") for token in tokens]
    assert all(after in model.followers[word.lower()] for word, after in itertools.pairwise(words))


def test_generation_is_deterministic_for_a_seed() -> None:
    """The same prompt and seed make the same tokens; the prompt's last word decides the first token."""
    model = token_stream.model_fn("/nonexistent")
    tokens = list(model.generate("I thought", 50, seed=7))
    assert len(tokens) == 50
    assert tokens == list(model.generate("so I thought", 50, seed=7))
    assert tokens[0].removeprefix(" ") in model.followers["thought"]
    assert {tuple(model.generate("I thought", 50, seed=seed)) for seed in range(5)} != {tuple(tokens)}


def test_a_saved_text_is_the_model_and_without_one_it_is_the_built_in_text(tmp_path: Path) -> None:
    """``save`` writes model.json; ``model_fn`` reads it back; an empty model directory has the built-in text's."""
    token_stream.save(tmp_path, "to be or not to be")
    assert token_stream.model_fn(str(tmp_path)).followers["to"] == ("be", "be")
    assert token_stream.model_fn(str(tmp_path / "empty")) == token_stream.BigramModel.from_text(token_stream.CORPUS)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"words": "a b"}', '{"text": 3}', '{"text": "one"}'])
def test_a_malformed_model_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    """A model.json that is not ``{"text": "at least two words"}`` fails to load, naming the file."""
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "model.json"))):
        token_stream.model_fn(str(tmp_path))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "the body must be a JSON object"),
        ({"prompt": 3}, "prompt must be a string"),
        ({"max_tokens": 0}, "max_tokens must be a whole number from 1 to 512, not 0"),
        ({"max_tokens": 513}, "max_tokens must be a whole number from 1 to 512, not 513"),
        ({"max_tokens": 2.5}, "max_tokens must be a whole number"),
        ({"seed": "x"}, "seed must be a whole number"),
        ({"delay_ms": 1001}, "delay_ms must be a number from 0 to 1000, not 1001"),
        ({"delay_ms": True}, "delay_ms must be a number"),
    ],
)
def test_a_bad_request_is_refused_before_any_token(body: object, message: str) -> None:
    """predict_fn checks the request when it is called, not when the first token is asked for: a 400 for the
    client, saying what is wrong."""
    model = token_stream.model_fn("/nonexistent")
    with pytest.raises(BadRequest, match=re.escape(message)):
        token_stream.predict_fn(body, model)


def test_a_closed_generator_logs_how_many_tokens_it_made(caplog: pytest.LogCaptureFixture) -> None:
    """predict_fn returns a generator; closed after two tokens (as inference-server closes it when the client goes
    away), its finally logs that it made two of the tokens asked for."""
    model = token_stream.model_fn("/nonexistent")
    tokens = token_stream.predict_fn({"prompt": "I", "max_tokens": 100}, model)
    caplog.clear()  # (model_fn's own line, when an earlier test set the level that lets it through)
    with caplog.at_level(logging.INFO, logger="token_stream"):
        assert [next(tokens), next(tokens)] == list(model.generate("I", 2))
        tokens.close()
    assert caplog.messages == ["Made 2 of 100 tokens"]


def test_the_pipeline_sends_json_lines_or_server_sent_events(tmp_path: Path) -> None:
    """Through the whole pipeline (input_fn to the built-in output_fn): JSON Lines by default, one event per token
    to a client that accepts text/event-stream, and a 400 for a bad request."""
    request = {"prompt": "I thought", "max_tokens": 5, "seed": 1}
    tokens = list(token_stream.model_fn(str(tmp_path)).generate("I thought", 5, seed=1))
    lines = testing.post_invocations(model_dir=str(tmp_path), json=request)
    assert (lines.status_code, lines.content_type) == (200, "application/jsonlines")
    assert [json.loads(line) for line in lines.data.splitlines()] == tokens
    events = testing.post_invocations(model_dir=str(tmp_path), json=request, headers={"Accept": "text/event-stream"})
    assert events.content_type == "text/event-stream"
    assert events.data == b"".join(b"data: %s\n\n" % token.encode() for token in tokens)
    refused = testing.post_invocations(model_dir=str(tmp_path), json={"max_tokens": 0})
    assert refused.status_code == 400
    assert "max_tokens must be" in refused.json["message"]
