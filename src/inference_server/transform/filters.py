"""Batch Transform's data processing: ``InputFilter``, ``JoinSource`` and ``OutputFilter``, as SageMaker applies them.

A filter is a JSONPath expression, in the subset SageMaker documents: ``$`` (the whole record), ``.name`` and
``['name', ...]`` (members of an object), ``[i]`` and ``[i, j, ...]`` (elements of an array, negative from the end),
``[start:end]`` (a slice, either end left out), ``*`` / ``[*]`` (every member or element), chained
(``$.features[1:]``). A CSV row is an array of its cells; a JSON or JSON Lines record is its value.

Selecting one member or element gives that value; selecting several gives an array of them (an object of them for
several names); a slice gives an array. ``JoinSource Input`` joins each record with its answer: a CSV row gets the
answer's cells after its own; a JSON object gets the answer under ``SageMakerOutput``, and any other JSON value becomes
``{"SageMakerInput": value, "SageMakerOutput": answer}``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from inference_server.errors import ConfigurationError, TransformError

#: The media types whose records can be filtered and joined.
CSV_TYPES = frozenset({"text/csv"})
JSON_TYPES = frozenset({"application/json", "application/jsonlines", "application/x-jsonlines", "application/jsonl"})
JOIN_SOURCES = ("None", "Input")
_STEP = re.compile(r"\.(\*|[A-Za-z_][\w-]*)|\[([^\]]*)\]")
_NAME = re.compile(r"""\s*(?:'([^']*)'|"([^"]*)")\s*""")


@dataclass(frozen=True)
class _Step:
    names: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()
    slice: tuple[int | None, int | None] | None = None
    every: bool = False

    @property
    def single(self) -> bool:
        return len(self.names) + len(self.indexes) == 1 and self.slice is None and not self.every


def _step(text: str, expression: str) -> _Step:
    if text.strip() == "*":
        return _Step(every=True)
    if ":" in text:
        start, _, end = text.partition(":")
        try:
            return _Step(slice=(int(start) if start.strip() else None, int(end) if end.strip() else None))
        except ValueError:
            raise ConfigurationError(f"filter {expression!r}: [{text}] is not a slice of integers") from None
    parts = text.split(",")
    names = [_NAME.fullmatch(part) for part in parts]
    if all(names):
        return _Step(names=tuple(match.group(1) or match.group(2) or "" for match in names if match))
    try:
        return _Step(indexes=tuple(int(part) for part in parts))
    except ValueError:
        raise ConfigurationError(
            f"filter {expression!r}: [{text}] is neither indexes, a slice, '*' nor quoted names"
        ) from None


def parse(expression: str) -> list[_Step]:
    """The steps of a JSONPath filter; :class:`ConfigurationError` for anything outside SageMaker's subset."""
    text = expression.strip()
    if not text.startswith("$"):
        raise ConfigurationError(f"filter {expression!r}: a JSONPath starts with $")
    steps, position = [], 1
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            raise ConfigurationError(f"filter {expression!r}: cannot read it from character {position + 1}")
        name, bracket = match.groups()
        if name is not None:
            steps.append(_Step(every=True) if name == "*" else _Step(names=(name,)))
        else:
            steps.append(_step(bracket, expression))
        position = match.end()
    return steps


def _apply(steps: list[_Step], value: Any) -> Any:
    for step in steps:
        value = _select(step, value)
    return value


def _select(step: _Step, value: Any) -> Any:
    if step.every:
        return list(value.values()) if isinstance(value, dict) else list(value)
    if step.names:
        if not isinstance(value, dict):
            raise LookupError(f"members {list(step.names)} of a {type(value).__name__}, not an object")
        missing = [name for name in step.names if name not in value]
        if missing:
            raise LookupError(f"no member {missing[0]!r}")
        return value[step.names[0]] if step.single else {name: value[name] for name in step.names}
    if not isinstance(value, list):
        raise LookupError(f"elements of a {type(value).__name__}, not an array")
    if step.slice is not None:
        return value[step.slice[0] : step.slice[1]]
    for index in step.indexes:
        if not -len(value) <= index < len(value):
            raise LookupError(f"index {index} of an array of {len(value)}")
    return value[step.indexes[0]] if step.single else [value[index] for index in step.indexes]


def _csv_row(line: bytes) -> list[str]:
    return next(csv.reader([line.decode("utf-8")]), [])


def _csv_line(value: Any) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(value if isinstance(value, list) else [value])
    return out.getvalue().encode()


@dataclass(frozen=True)
class Processing:
    """A job's data processing for records of one media type (``None``: nothing to do)."""

    media_type: str
    input_filter: list[_Step] | None
    join: bool
    output_filter: list[_Step] | None

    @classmethod
    def create(cls, content_type: str, input_filter: str, join_source: str, output_filter: str) -> Processing | None:
        """Processing for these options, or None when all are the defaults (``$``, ``None``, ``$``)."""
        if join_source not in JOIN_SOURCES:
            raise ConfigurationError(f"join source {join_source!r}: use None or Input")
        input_steps, output_steps = parse(input_filter), parse(output_filter)
        if not input_steps and join_source == "None" and not output_steps:
            return None
        media_type = content_type.split(";")[0].strip().lower()
        if media_type not in CSV_TYPES | JSON_TYPES:
            raise ConfigurationError(
                f"filters and join source work on CSV and JSON records; the content type is {content_type!r}"
            )
        return cls(media_type, input_steps or None, join_source == "Input", output_steps or None)

    @property
    def csv(self) -> bool:
        return self.media_type in CSV_TYPES

    def _decode(self, record: bytes) -> Any:
        return _csv_row(record) if self.csv else orjson.loads(record)

    def _encode(self, value: Any) -> bytes:
        return _csv_line(value) if self.csv else orjson.dumps(value)

    def _run(self, what: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except (LookupError, ValueError, TypeError) as exc:  # orjson's and csv's errors are ValueErrors
            raise TransformError(f"{what}: {exc}") from None

    def filter_input(self, record: bytes, where: str) -> bytes:
        """The record as the model gets it (``InputFilter``)."""
        if self.input_filter is None:
            return record
        steps = self.input_filter
        return self._run(f"{where}: the input filter", lambda: self._encode(_apply(steps, self._decode(record))))  # type: ignore[no-any-return]

    def output(self, record: bytes, answer: bytes, where: str) -> bytes:
        """One record's line of output: its answer, joined with the record (``JoinSource``), filtered
        (``OutputFilter``)."""

        def make() -> bytes:
            value = self._decode(answer)
            if self.join:
                value = self._joined(self._decode(record), value)
            if self.output_filter is not None:
                value = _apply(self.output_filter, value)
            return self._encode(value)

        return self._run(f"{where}: the output", make)  # type: ignore[no-any-return]

    def _joined(self, record: Any, answer: Any) -> Any:
        if self.csv:
            return [*record, *(answer if isinstance(answer, list) else [answer])]
        if isinstance(record, dict):
            return {**record, "SageMakerOutput": answer}
        return {"SageMakerInput": record, "SageMakerOutput": answer}
