"""Batch Transform without AWS: SageMaker's ``CreateTransformJob`` semantics over local files, with the same hooks.

``transform(input, output, ...)`` (or ``inference-server transform INPUT OUTPUT``) reads every file under
``input``, splits it into records, packs them into requests, runs each request through the installed hooks
(``input_fn`` -> ``predict_fn`` -> ``output_fn``, the model loaded once) and writes ``OUTPUT/<relative path>.out``.
:class:`BatchPredictor` is the hooks without HTTP, for code that drives them itself.

Named ``transform`` so that it is never confused with micro-batching of concurrent requests in a server.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_server import _plugins, _tracing
from inference_server._pipeline import Pipeline
from inference_server._settings import BatchStrategy, Settings
from inference_server.errors import ConfigurationError
from inference_server.transform import filters, records
from inference_server.transform.records import ASSEMBLE_WITH, SPLIT_TYPES

__all__ = ["BatchPredictor", "Predictor", "TransformOptions", "TransformSummary", "transform"]

#: SageMaker's bounds: MaxPayloadInMB <= 100, and MaxConcurrentTransforms x MaxPayloadInMB <= 100.
MAX_PAYLOAD_IN_MB = 100
#: ModelClientConfig's bounds: InvocationsTimeoutInSeconds 1 to 3600, InvocationsMaxRetries 0 to 3.
MAX_INVOCATIONS_TIMEOUT, MAX_INVOCATIONS_RETRIES = 3600, 3


class Predictor(abc.ABC):
    """What a transform job sends its requests to: the installed hooks or a running container."""

    #: The defaults a job takes for the options left out (``/execution-parameters``).
    execution_parameters: dict[str, Any]

    @abc.abstractmethod
    def ready(self) -> None:
        """Wait until requests can be answered (the model loaded, the container healthy)."""

    @abc.abstractmethod
    def predict(self, body: bytes, content_type: str, accept: str = "*/*") -> tuple[bytes, str]:
        """The answer to one request body: its bytes and media type."""

    def predict_records(
        self,
        lines: Iterable[bytes],
        content_type: str,
        accept: str = "*/*",
        *,
        batch_strategy: str = "MultiRecord",
        max_payload_in_mb: int = 6,
    ) -> Iterator[bytes]:
        """Each request's answer, in order, for ``lines`` (records of SplitType Line, with or without their
        newline) packed as a transform job packs the lines of a file: SingleRecord one line per request (without
        its newline), MultiRecord as many as fit in ``max_payload_in_mb`` (0: all in one), each ending in a
        newline. A line over the limit raises :class:`~inference_server.errors.TransformError` saying so."""
        strategy = BatchStrategy.parse(batch_strategy)
        _check_limits(max_payload_in_mb, None)

        def framed() -> Iterator[records.Record]:
            offset = 0
            for index, line in enumerate(lines):
                payload = line.rstrip(b"\r\n")
                yield records.Record(index, offset, payload + b"\n", payload)
                offset += len(payload) + 1

        limit = max_payload_in_mb << 20 if max_payload_in_mb else None
        for request in records.requests(framed(), strategy, limit, "records"):
            answer, _ = self.predict(request.body, content_type, accept)
            yield answer


class BatchPredictor(Predictor):
    """The installed hooks for one model directory, without HTTP: the model is loaded on first use and kept.

    ``predict`` is one invocation, as ``POST /invocations`` would make it; thread-safe when the model is.
    """

    def __init__(self, *, model_dir: str | None = None) -> None:
        settings = Settings.from_env(model_dir=model_dir)
        tracing = _tracing.create()  # (each hook in a span of its own, as the server has them)
        self.pipeline = Pipeline(settings, _plugins.manager(), stage=tracing.stage if tracing is not None else None)
        #: What ``/execution-parameters`` would answer: the hooks' defaults for a transform job.
        self.execution_parameters: dict[str, Any] = self.pipeline.execution_parameters

    def model(self) -> Any:
        """The loaded model (loading it now if needed)."""
        return self.pipeline.model()

    def ready(self) -> None:
        """Load the model now; :class:`~inference_server.errors.ModelLoadError` if ``model_fn`` fails."""
        self.model()

    def predict(self, body: bytes, content_type: str, accept: str = "*/*") -> tuple[bytes, str]:
        """The answer to one request body: its bytes and media type. A hook's failure raises
        :class:`~inference_server.errors.HookError`; an HTTP error a hook chose raises as it is."""
        output = self.pipeline.invoke(body, content_type, accept, self.model())
        return b"".join(output.buffers), output.media_type


@dataclass(frozen=True)
class TransformOptions:
    """A transform job's settings, named as SageMaker's ``CreateTransformJob`` names them (in snake case).

    ``None`` for the strategy, payload and concurrency means: what the hooks' execution parameters say.
    """

    content_type: str = "application/octet-stream"
    accept: str = "*/*"
    split_type: str = "None"
    batch_strategy: BatchStrategy | None = None
    max_payload_in_mb: int | None = None
    max_concurrent_transforms: int | None = None
    assemble_with: str = "None"
    resume: bool = False
    fail_fast: bool = False
    quiet: bool = False
    model_dir: str | None = None
    #: A running container's URL: requests go there instead of to the installed hooks.
    endpoint: str | None = None
    invocations_timeout_in_seconds: int = 600
    invocations_max_retries: int = 3
    #: DataProcessing: JSONPath filters (``$``: everything) and whether to join each answer with its record.
    input_filter: str = "$"
    output_filter: str = "$"
    join_source: str = "None"
    #: Files are cut into parts of about this size (at record boundaries) for engines that share a file's work;
    #: requests never span two parts, so the outputs are the same whichever engine runs them.
    part_size_mb: int = 256

    def __post_init__(self) -> None:
        if self.split_type not in SPLIT_TYPES:
            raise ConfigurationError(f"split type {self.split_type!r}: use one of {', '.join(SPLIT_TYPES)}")
        if self.assemble_with not in ASSEMBLE_WITH:
            raise ConfigurationError(f"assemble with {self.assemble_with!r}: use one of {', '.join(ASSEMBLE_WITH)}")
        if self.batch_strategy is not None:
            try:
                object.__setattr__(self, "batch_strategy", BatchStrategy.parse(self.batch_strategy))
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        _check_limits(self.max_payload_in_mb, self.max_concurrent_transforms)
        processing = filters.Processing.create(
            self.content_type, self.input_filter, self.join_source, self.output_filter
        )
        if processing is not None and self.split_type not in ("None", "Line"):
            raise ConfigurationError("filters and join source need SplitType Line or None (CSV or JSON records)")
        if self.part_size_mb < 1:
            raise ConfigurationError(f"part size {self.part_size_mb} MB: at least 1")
        if not 1 <= self.invocations_timeout_in_seconds <= MAX_INVOCATIONS_TIMEOUT:
            raise ConfigurationError(
                f"invocations timeout {self.invocations_timeout_in_seconds} s: SageMaker allows 1 to "
                f"{MAX_INVOCATIONS_TIMEOUT}"
            )
        if not 0 <= self.invocations_max_retries <= MAX_INVOCATIONS_RETRIES:
            raise ConfigurationError(
                f"invocations max retries {self.invocations_max_retries}: SageMaker allows 0 to "
                f"{MAX_INVOCATIONS_RETRIES}"
            )

    def resolved(self, execution_parameters: dict[str, Any]) -> TransformOptions:
        """These options with the unset ones taken from the execution parameters, checked against SageMaker's
        bounds again (the hooks' values count as if given)."""
        options = dataclasses.replace(
            self,
            batch_strategy=self.batch_strategy or BatchStrategy.parse(execution_parameters["BatchStrategy"]),
            max_payload_in_mb=_first(self.max_payload_in_mb, execution_parameters["MaxPayloadInMB"]),
            max_concurrent_transforms=_first(
                self.max_concurrent_transforms, execution_parameters["MaxConcurrentTransforms"]
            ),
        )
        return options

    @property
    def limit(self) -> int | None:
        """The largest request body in bytes; ``None`` for ``MaxPayloadInMB`` 0 (no limit: a whole file)."""
        return self.max_payload_in_mb << 20 if self.max_payload_in_mb else None

    @property
    def part_size(self) -> int | None:
        """The size in bytes of the parts files are cut into; None for SplitType None (a file is one record)."""
        return None if self.split_type == "None" else self.part_size_mb << 20


def _first(value: int | None, default: int) -> int:
    return default if value is None else value


def _check_limits(payload: int | None, concurrency: int | None) -> None:
    if payload is not None and not 0 <= payload <= MAX_PAYLOAD_IN_MB:
        raise ConfigurationError(f"max payload {payload} MB: SageMaker allows 0 (no limit) to {MAX_PAYLOAD_IN_MB}")
    if concurrency is not None and concurrency < 1:
        raise ConfigurationError(f"max concurrent transforms {concurrency}: at least 1")
    if payload and concurrency and payload * concurrency > MAX_PAYLOAD_IN_MB:
        raise ConfigurationError(
            f"max concurrent transforms x max payload = {concurrency} x {payload} MB = {concurrency * payload} MB: "
            f"SageMaker allows at most {MAX_PAYLOAD_IN_MB} MB"
        )


@dataclass
class TransformSummary:
    """What a transform job did. ``failed`` pairs each failed input's relative path with the reason."""

    files: int = 0
    skipped: int = 0
    records: int = 0
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    failed: list[tuple[str, str]] = field(default_factory=list)

    def add(self, part: TransformSummary) -> None:
        """Add the counts and failures of a part of the job (one file, done elsewhere)."""
        self.skipped += part.skipped
        self.records += part.records
        self.requests += part.requests
        self.bytes_in += part.bytes_in
        self.bytes_out += part.bytes_out
        self.failed += part.failed

    @property
    def ok(self) -> bool:
        """True when every input file was transformed (or skipped by ``resume``)."""
        return not self.failed

    def line(self) -> str:
        """The job in one line, as the command prints it at the end."""
        rate = self.records / self.seconds if self.seconds else 0.0
        done = self.files - len(self.failed) - self.skipped
        return (
            f"{done} of {self.files} files transformed ({self.skipped} skipped, {len(self.failed)} failed); "
            f"{_count(self.records, 'record')} in {_count(self.requests, 'request')}; {self.bytes_in} bytes in, "
            f"{self.bytes_out} out; "
            f"{self.seconds:.1f} s ({rate:.0f} records/s)"
        )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def transform(input: str | Path, output: str | Path, **options: Any) -> TransformSummary:
    """Run a transform job over the files under ``input`` into ``output`` (see :class:`TransformOptions`)."""
    from inference_server.transform import local

    return local.run(str(input), str(output), TransformOptions(**options))
