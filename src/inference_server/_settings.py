"""One frozen Settings object, read from the SageMaker environment variables and the command line."""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from inference_server.errors import ConfigurationError

T = TypeVar("T")

#: Where SageMaker puts the model's files.
DEFAULT_MODEL_DIR = "/opt/ml/model"
#: Our own variable for the model directory (SageMaker itself always uses /opt/ml/model).
MODEL_DIR_ENV = "INFERENCE_SERVER_MODEL_DIR"

_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
#: The HTTP server backends ``serve`` can run.
SERVERS = ("gunicorn", "granian")


class BatchStrategy(str, enum.Enum):
    """How Batch Transform groups records into one request, as SageMaker names it in JSON."""

    SINGLE_RECORD = "SingleRecord"
    MULTI_RECORD = "MultiRecord"

    @classmethod
    def parse(cls, value: object) -> BatchStrategy:
        """Read a strategy in any spelling SageMaker uses: ``MULTI_RECORD``, ``MultiRecord``, any case."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.replace("_", "").replace("-", "").lower()
            for member in cls:
                if member.value.lower() == key:
                    return member
        raise ValueError(f"{value!r} is not a batch strategy: use SingleRecord or MultiRecord")

    def __str__(self) -> str:
        return self.value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not an integer") from None


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


def _log_level(text: str) -> str:
    level = text.strip().lower()
    if level not in _LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(_LOG_LEVELS)}")
    return level


def _from_env(environ: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """Parse one environment variable, naming the variable and the bad value when it is invalid."""
    text = environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        return parse(text.strip())
    except ValueError as exc:
        raise ConfigurationError(f"{name}={text!r} is invalid: {exc}") from None


def _setting(
    option: str, value: object, environ: Mapping[str, str], name: str, parse: Callable[[str], T], default: T
) -> T:
    """A command-line value when given (named ``--option`` in errors), else the environment variable, else default."""
    if value is None:
        return _from_env(environ, name, parse, default)
    try:
        return parse(str(value))
    except ValueError as exc:
        raise ConfigurationError(f"--{option.replace('_', '-')}={value!r} is invalid: {exc}") from None


def _server(text: str) -> str:
    name = text.strip().lower()
    if name not in SERVERS:
        raise ValueError(f"must be one of {', '.join(SERVERS)}")
    return name


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535")
    return value


def env_batch_strategy(environ: Mapping[str, str] = os.environ) -> BatchStrategy:
    """``SAGEMAKER_BATCH_STRATEGY``, else MultiRecord."""
    return _from_env(environ, "SAGEMAKER_BATCH_STRATEGY", BatchStrategy.parse, BatchStrategy.MULTI_RECORD)


def env_max_concurrent_transforms(environ: Mapping[str, str] = os.environ) -> int:
    """``SAGEMAKER_MAX_CONCURRENT_TRANSFORMS``, else 1."""
    return _from_env(environ, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", _integer(1), 1)


def env_max_payload_in_mb(environ: Mapping[str, str] = os.environ) -> int:
    """``SAGEMAKER_MAX_PAYLOAD_IN_MB``, else 6 (0 means no limit, as for Batch Transform's chunked mode)."""
    return _from_env(environ, "SAGEMAKER_MAX_PAYLOAD_IN_MB", _integer(0), 6)


#: Settings read from environment variables: field -> (variable, parser, default).
VARIABLES: dict[str, tuple[str, Callable[[str], object], object]] = {
    "port": ("SAGEMAKER_BIND_TO_PORT", _port, 8080),
    "workers": ("SAGEMAKER_MODEL_SERVER_WORKERS", _integer(1), os.cpu_count() or 1),
    "threads": ("INFERENCE_SERVER_THREADS", _integer(1), 1),
    "timeout": ("SAGEMAKER_MODEL_SERVER_TIMEOUT", _integer(0), 60),
    "read_timeout": ("INFERENCE_SERVER_READ_TIMEOUT", _integer(1), 30),
    "graceful_timeout": ("INFERENCE_SERVER_GRACEFUL_TIMEOUT", _integer(1), 25),
    "max_requests": ("INFERENCE_SERVER_MAX_REQUESTS", _integer(0), 0),
    "max_requests_jitter": ("INFERENCE_SERVER_MAX_REQUESTS_JITTER", _integer(0), 0),
    "max_header_bytes": ("INFERENCE_SERVER_MAX_HEADER_BYTES", _integer(8192), 65536),
    "model_dir": (MODEL_DIR_ENV, str, DEFAULT_MODEL_DIR),
    "log_level": ("INFERENCE_SERVER_LOG_LEVEL", _log_level, "info"),
    "server": ("INFERENCE_SERVER_BACKEND", _server, "granian"),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment, validated once at start-up."""

    host: str = "0.0.0.0"
    port: int = 8080
    workers: int = 1
    #: Hook calls a worker runs at once; above 1 the model must be thread-safe.
    threads: int = 1
    #: Seconds a request may take, from its first body byte to its answer (0: no limit); past it: 504.
    timeout: int = 60
    #: Seconds a client may take to send a request's headers, and again its body; past it: 408 or a closed connection.
    read_timeout: int = 30
    #: Seconds requests in flight get to finish after SIGTERM; SageMaker sends SIGKILL 30 s after SIGTERM.
    graceful_timeout: int = 25
    #: Replace a worker after it served this many requests, plus up to ``max_requests_jitter`` (0: never).
    max_requests: int = 0
    max_requests_jitter: int = 0
    #: Bytes of request line and headers a request may have; past it: 431 (414 for the URL alone).
    max_header_bytes: int = 65536
    model_dir: str = DEFAULT_MODEL_DIR
    log_level: str = "info"
    default_accept: str | None = None
    server: str = "granian"

    @property
    def log_level_number(self) -> int:
        """The log level as a :mod:`logging` number."""
        return int(getattr(logging, self.log_level.upper()))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, host: str | None = None, **options: object
    ) -> Settings:
        """Build settings from environment variables; ``options`` that are not ``None`` (the command line) win.

        ``options`` are fields of :data:`VARIABLES`; an invalid value names its option or variable.
        """
        env = os.environ if environ is None else environ
        unknown = set(options) - set(VARIABLES)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        values = {
            field: _setting(field, options.get(field), env, name, parse, default)
            for field, (name, parse, default) in VARIABLES.items()
        }
        return cls(
            host=host or "0.0.0.0",
            default_accept=env.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or None,
            **values,  # type: ignore[arg-type]
        )

    def environ(self) -> dict[str, str]:
        """The environment variables that make :meth:`from_env` give these settings again (in worker processes)."""
        return {name: str(getattr(self, field)) for field, (name, _, _) in VARIABLES.items()}
