"""A token-by-token text generator whose answer is streamed as it is made: a tiny deterministic "language model".

The model is a bigram table: which words follow each word of a text, the text read as a loop (so every word has a
next one). The text is ``{"text": "..."}`` in the model directory's ``model.json`` (write one with :func:`save`), or
the built-in :data:`CORPUS` when there is none. A request is JSON::

    {"prompt": "I thought", "max_tokens": 16, "seed": 0, "delay_ms": 0}

``predict_fn`` checks it (a bad one is a 400, before anything is sent), then returns a generator of tokens, each a
word with its leading space (the prompt and the tokens joined are the text). inference-server's own ``output_fn``
sends each token as it is made: JSON Lines by default, server-sent events to a client that accepts
``text/event-stream``, SageMaker's event stream on ``/endpoints/{name}/invocations-response-stream`` (boto3's
``invoke_endpoint_with_response_stream``). ``delay_ms`` makes each token take that long, as a real model's would.

Serve it and watch the tokens come::

    INFERENCE_SERVER_PLUGINS=token_stream inference-server serve
    curl -N localhost:8080/invocations -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \\
        -d '{"prompt": "I thought", "max_tokens": 20, "delay_ms": 200}'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import inference_server
from inference_server.errors import BadRequest

#: The file ``model_fn`` reads the model's text from, when the model directory has one.
MODEL_FILE = "model.json"
#: The text of the model when there is no model file: the opening of Moby-Dick (1851).
CORPUS = """
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing
particular to interest me on shore, I thought I would sail about a little and see the watery part of the world. It is
a way I have of driving off the spleen and regulating the circulation. Whenever I find myself growing grim about the
mouth, whenever it is a damp, drizzly November in my soul, then I account it high time to get to sea as soon as I can.
"""
#: The most tokens one request may ask for, and the longest delay before each (their product stays well within
#: inference-server's default --stream-timeout of 600 s).
MAX_TOKENS = 512
MAX_DELAY_MS = 1000

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BigramModel:
    """Which words follow each word of a text (keyed in lower case), and the text's first word."""

    followers: dict[str, tuple[str, ...]]
    first: str

    @classmethod
    def from_text(cls, text: str) -> BigramModel:
        """The table of ``text``'s words, read as a loop: the last word is followed by the first."""
        words = text.split()
        if len(words) < 2:
            raise ValueError(f"a model's text needs at least two words, not {len(words)}")
        followers: dict[str, list[str]] = {}
        for word, following in zip(words, [*words[1:], words[0]], strict=True):
            followers.setdefault(word.lower(), []).append(following)
        return cls({word: tuple(after) for word, after in followers.items()}, words[0])

    def generate(self, prompt: str, max_tokens: int, seed: int = 0) -> Iterator[str]:
        """``max_tokens`` tokens continuing ``prompt``, each drawn from the words that follow the one before (the
        same for the same seed); after a word the text does not have, its first word."""
        draw = random.Random(seed)
        words = prompt.split()
        word = words[-1] if words else ""
        for _ in range(max_tokens):
            after = self.followers.get(word.lower())
            word = draw.choice(after) if after else self.first
            yield " " + word


@dataclasses.dataclass(frozen=True)
class Request:
    """A generation request, checked: the prompt, how many tokens, the seed and the seconds before each token."""

    prompt: str
    max_tokens: int = 16
    seed: int = 0
    delay: float = 0.0

    @classmethod
    def parse(cls, data: Any) -> Request:
        """The request of a decoded JSON body; anything else is the client's mistake (400), saying what is wrong."""
        if not isinstance(data, dict):
            example = '{"prompt": "I thought", "max_tokens": 16}'
            raise BadRequest(f"the body must be a JSON object such as {example} (Content-Type: application/json)")
        prompt, max_tokens, seed = data.get("prompt", ""), data.get("max_tokens", 16), data.get("seed", 0)
        delay_ms = data.get("delay_ms", 0)
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS:
            raise BadRequest(f"max_tokens must be a whole number from 1 to {MAX_TOKENS}, not {max_tokens!r}")
        if not _is_int(seed):
            raise BadRequest(f"seed must be a whole number, not {seed!r}")
        if not isinstance(delay_ms, (int, float)) or isinstance(delay_ms, bool) or not 0 <= delay_ms <= MAX_DELAY_MS:
            raise BadRequest(f"delay_ms must be a number from 0 to {MAX_DELAY_MS}, not {delay_ms!r}")
        return cls(prompt, max_tokens, seed, delay_ms / 1000)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def save(model_dir: str | os.PathLike[str], text: str) -> Path:
    """Write a model's ``model.json`` of ``text`` in ``model_dir`` (made if missing); return the file's path."""
    BigramModel.from_text(text)  # a text that makes no model is refused here rather than when it is served
    path = Path(model_dir) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": text}))
    return path


@inference_server.plugin_hook
def model_fn(model_dir: str) -> BigramModel:
    """The table of ``model.json``'s text, or of :data:`CORPUS` when the model directory has no such file."""
    path = Path(model_dir) / MODEL_FILE
    if not path.is_file():
        logger.info("No %s in %s: the model is the built-in text's", MODEL_FILE, model_dir)
        return BigramModel.from_text(CORPUS)
    try:
        text = json.loads(path.read_bytes())["text"]
        model = BigramModel.from_text(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON, a missing key, a text that is not
        raise ValueError(f'{path} is not {{"text": "at least two words"}}: {exc}') from None
    logger.info("Loaded the text of %s: %d distinct words", path, len(model.followers))
    return model


@inference_server.plugin_hook
def predict_fn(data: Any, model: BigramModel) -> Iterator[str]:
    """Check the request now (a bad one is a plain 400), then return the generator that inference-server streams."""
    request = Request.parse(data)
    return _tokens(model, request)


def _tokens(model: BigramModel, request: Request) -> Iterator[str]:
    """The request's tokens, each after its delay; the ``finally`` runs when the stream ends or is closed, which
    inference-server does when the client goes away or the stream outlives --stream-timeout."""
    made = 0
    try:
        for token in model.generate(request.prompt, request.max_tokens, request.seed):
            time.sleep(request.delay)  # a real model's work for the next token
            made += 1
            yield token
    finally:
        logger.info("Made %d of %d tokens", made, request.max_tokens)
