"""One frozen Settings object, read from the SageMaker environment variables and the command line.

Every setting is written once, as a field of :class:`Settings` carrying its :class:`Variable`; the environment
reading, the variables exported to worker processes and the ``serve`` options and help are derived from them. The
variables read by the built-in Batch Transform hooks (``env_*`` below) belong to those hooks, not to the server.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from inference_server.errors import ConfigurationError

T = TypeVar("T")

#: Where SageMaker puts the model's files.
DEFAULT_MODEL_DIR = "/opt/ml/model"
#: Where SageMaker puts the models of a multi-model endpoint (``/opt/ml/models/<name>/model``): models may load from it.
MULTI_MODEL_DIR = "/opt/ml/models"
#: Our own variable for the model directory (SageMaker itself always uses /opt/ml/model).
MODEL_DIR_ENV = "INFERENCE_SERVER_MODEL_DIR"

_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
#: How log lines are written.
LOG_FORMATS = ("text", "json")
#: The HTTP server backends ``serve`` can run.
SERVERS = ("gunicorn", "granian")
#: granian's interfaces the app can be served through: WSGI (a thread per request), or RSGI or ASGI (the event-loop
#: fronts).
GRANIAN_INTERFACES = ("auto", "wsgi", "rsgi", "asgi")
#: Where ``serve`` runs the app: on this machine (its ``--server``), or as a Ray Serve application.
ENGINES = ("local", "ray")
#: Where ``serve`` tells its workers which settings were given as options (see ``Settings.given``).
GIVEN_ENV = "INFERENCE_SERVER_GIVEN"
#: The request timeout in a Batch Transform container (``SAGEMAKER_BATCH=true``): SageMaker waits 600 s by default.
BATCH_TIMEOUT = 600


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


#: How JSON answers write NaN and infinities (strict JSON has neither).
JSON_NAN = ("null", "literal", "error")


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser of one word among ``choices`` (any case, surrounding blanks ignored)."""

    def parse(text: str) -> str:
        word = text.strip().lower()
        if word not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return word

    return parse


DEFAULT_HOOKS = ("codecs", "passthrough")
DEFAULT_HOOKS_ENV = "INFERENCE_SERVER_DEFAULT_HOOKS"


SCRIPT_DEFAULTS = ("inference-server", "sklearn", "xgboost", "pytorch", "huggingface")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _boolean(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)}")
    return word in _TRUE


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


def _setting(option: str, value: object, environ: Mapping[str, str], variable: Variable, default: T) -> T:
    """A command-line value when given (named ``--option`` in errors), else the environment variable, else default."""
    if value is None:
        if variable.env is None:
            return default
        return _from_env(environ, variable.env, variable.parse, default)  # type: ignore[arg-type]
    text = os.pathsep.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)  # a repeated option
    try:
        return variable.parse(text)  # type: ignore[return-value]
    except ValueError as exc:
        raise ConfigurationError(f"--{option.replace('_', '-')}={value!r} is invalid: {exc}") from None


def _directories(text: str) -> tuple[str, ...]:
    """Directories separated by ``os.pathsep``, as ``PATH`` lists them (empty entries skipped)."""
    if "\0" in text:
        raise ValueError("a directory's name cannot hold a NUL byte")
    return tuple(part for part in text.split(os.pathsep) if part)


def _media_types(text: str) -> tuple[str, ...]:
    """Media types separated by commas (or by ``os.pathsep``, as a repeated option's values are joined)."""
    types = tuple(part.strip().lower() for part in text.replace(os.pathsep, ",").split(",") if part.strip())
    for media_type in types:
        if media_type.count("/") != 1 or ";" in media_type or " " in media_type:
            raise ValueError(f"{media_type!r} is not a media type (type/subtype, no parameters)")
    return types


def _autoscale(text: str) -> str:
    """``MIN:MAX`` replicas, 0 <= MIN <= MAX, MAX >= 1."""
    low, colon, high = text.strip().partition(":")
    if not colon:
        raise ValueError("must be MIN:MAX (two numbers of replicas)")
    try:
        least, most = int(low), int(high)
    except ValueError:
        raise ValueError("must be MIN:MAX (two numbers of replicas)") from None
    if least < 0 or most < 1 or least > most:
        raise ValueError("must be MIN:MAX with 0 <= MIN <= MAX and MAX >= 1")
    return f"{least}:{most}"


def _percentage(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 100:
        raise ValueError("must be a whole percentage from 0 to 100")
    return value


CAPTURE_MODES = ("input", "output", "both")


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


@dataclasses.dataclass(frozen=True)
class Variable:
    """One setting's whole description: the single place its default, variable, parser and help are written."""

    #: The environment variable that sets it (``None``: only the command line does), and its parser.
    env: str | None
    parse: Callable[[str], object]
    #: What the ``serve --help`` line says, before "(default: ...)".
    help: str
    #: How the help names the default when its value is not the clearest way (e.g. "the number of CPUs").
    default_text: str | None = None
    choices: tuple[str, ...] | None = None
    #: An on/off switch: ``--option`` alone turns it on.
    flag: bool = False
    #: An option given once per value (the variable separates the values with ``os.pathsep``).
    repeat: bool = False


def _variable(default: T, env: str | None, parse: Callable[[str], object], help: str, **more: Any) -> T:
    """A :class:`Settings` field whose default is ``default``, described by a :class:`Variable`."""
    return dataclasses.field(default=default, metadata={"variable": Variable(env, parse, help, **more)})


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment and command line, validated once at start-up.

    Each field is the one table row of its setting: default, environment variable, parser and help, from which
    :meth:`from_env`, :meth:`environ` and the command line's options (``--field-name``) are all derived.
    """

    host: str = _variable("0.0.0.0", "INFERENCE_SERVER_HOST", str, "address to listen on (HTTP and gRPC)")
    port: int = _variable(8080, "SAGEMAKER_BIND_TO_PORT", _port, "TCP port")
    #: The Open Inference Protocol over gRPC, on this port in every worker (0: off).
    grpc_port: int = _variable(
        0,
        "INFERENCE_SERVER_GRPC_PORT",
        _port,
        "TCP port of the Open Inference Protocol over gRPC (KServe's and Triton's GRPCInferenceService; needs the "
        "grpc extra); 0: off",
        default_text="0 (off)",
    )
    workers: int = _variable(
        os.cpu_count() or 1,
        "SAGEMAKER_MODEL_SERVER_WORKERS",
        _integer(1),
        "worker processes, sharing the model loaded before they start (see --preload)",
        default_text="the number of CPUs",
    )
    #: Load the model in the serving process before its workers start, so that they share its memory (fork's
    #: copy-on-write) and a replaced worker starts without loading it; off (or a model found unsafe to fork): each
    #: worker loads its own.
    preload: bool = _variable(
        True,
        "INFERENCE_SERVER_PRELOAD",
        _boolean,
        "load the model once, in the serving process, before the workers start: they share its memory (copy-on-write) "
        "and a replaced worker does not load it again. A model_fn that fails then stops serve at start-up; one that "
        "leaves threads running, sockets or a GPU device open is loaded by each worker instead, with a warning",
        default_text="on",
        flag=True,
    )
    #: Hook calls a worker runs at once; above 1 the model must be thread-safe.
    threads: int = _variable(
        1, "INFERENCE_SERVER_THREADS", _integer(1), "request threads per worker; above 1 the model must be thread-safe"
    )
    #: Seconds a request may take, from its first body byte to its answer (0: no limit); past it: 504.
    timeout: int = _variable(
        60,
        "SAGEMAKER_MODEL_SERVER_TIMEOUT",
        _integer(0),
        "seconds a request may take before it is answered 504; work that cannot be stopped gets its worker "
        "replaced; 0: no limit, and requests run on the server's threads, a little faster",
        default_text=f"60, or {BATCH_TIMEOUT} when SAGEMAKER_BATCH is true (Batch Transform's invocation timeout)",
    )
    #: Seconds a streamed answer may take in all, from the request's arrival to its last chunk (0: no limit).
    stream_timeout: int = _variable(
        600,
        "INFERENCE_SERVER_STREAM_TIMEOUT",
        _integer(0),
        "seconds a streamed answer (a model that returns an iterator) may take from the request to its last chunk; "
        "--timeout applies to its first chunk; past it the stream is cut (on the event-stream route: a "
        "ModelStreamError); 0: no limit, and chunks are made on the server's threads",
    )
    #: Seconds a client may take to send a request's headers, and again its body; past it: 408 or a closed connection.
    read_timeout: int = _variable(
        30,
        "INFERENCE_SERVER_READ_TIMEOUT",
        _integer(1),
        "seconds a client may take to send a request's headers (else the connection is closed), and again its "
        "body (else 408)",
    )
    #: Seconds requests in flight get to finish after SIGTERM; SageMaker sends SIGKILL 30 s after SIGTERM.
    graceful_timeout: int = _variable(
        25,
        "INFERENCE_SERVER_GRACEFUL_TIMEOUT",
        _integer(1),
        "seconds requests in flight get to finish after SIGTERM, while /ping and new requests get 503 "
        "(SageMaker kills at 30)",
    )
    #: Replace a worker after it served this many requests, plus up to ``max_requests_jitter`` (0: never).
    max_requests: int = _variable(
        0,
        "INFERENCE_SERVER_MAX_REQUESTS",
        _integer(0),
        "replace a worker after it served this many requests, to contain leaks in model code; 0: never",
    )
    max_requests_jitter: int = _variable(
        0,
        "INFERENCE_SERVER_MAX_REQUESTS_JITTER",
        _integer(0),
        "add up to this many requests to each worker's --max-requests so that workers restart apart",
    )
    #: Bytes of request line and headers a request may have; past it: 431 (414 for the URL alone).
    max_header_bytes: int = _variable(
        65536,
        "INFERENCE_SERVER_MAX_HEADER_BYTES",
        _integer(8192),
        "largest request line and headers accepted, in bytes; beyond it 431",
    )
    model_dir: str = _variable(DEFAULT_MODEL_DIR, MODEL_DIR_ENV, str, "directory passed to model_fn")
    #: The response type when the client accepts anything (``None``: the prediction's natural format).
    default_accept: str | None = _variable(
        None,
        "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT",
        str,
        "media type of responses when the request's Accept allows anything",
        default_text="the prediction's natural format",
    )
    #: How JSON and JSON Lines answers write NaN and infinities.
    json_nan: str = _variable(
        "null",
        "INFERENCE_SERVER_JSON_NAN",
        _one_of(JSON_NAN),
        "NaN and infinity in JSON answers: null (strict JSON), literal (NaN, Infinity: what Python's json and "
        "pandas read, not strict JSON) or error (a 500 saying so)",
        choices=JSON_NAN,
    )
    #: What the built-in input_fn and output_fn do: decode and encode by media type, or pass bytes as 1.x did.
    default_hooks: str = _variable(
        "codecs",
        DEFAULT_HOOKS_ENV,
        _one_of(DEFAULT_HOOKS),
        "what the built-in input_fn and output_fn do when no plugin implements them: codecs (decode the body by its "
        "Content-Type and encode the prediction by Accept) or passthrough (inference-server 1.x: the body's bytes "
        "in, the prediction's bytes out as application/octet-stream)",
        choices=DEFAULT_HOOKS,
    )
    #: A SageMaker framework container's inference script to serve (else SAGEMAKER_PROGRAM, see ``_script``).
    script: str | None = _variable(
        None,
        "INFERENCE_SERVER_SCRIPT",
        str,
        "an inference.py written for AWS's framework containers (model_fn, input_fn, predict_fn, output_fn or "
        "transform_fn) to serve as a plugin",
        default_text="SAGEMAKER_PROGRAM in MODEL_DIR/code, else in SAGEMAKER_SUBMIT_DIRECTORY when local",
    )
    #: What stands in for the functions the script does not define.
    script_defaults: str = _variable(
        "inference-server",
        "INFERENCE_SERVER_SCRIPT_DEFAULTS",
        _one_of(SCRIPT_DEFAULTS),
        "what stands in for the functions a script does not define: inference-server (the built-in hooks), sklearn "
        "(the SageMaker scikit-learn container's defaults: JSON and CSV as float32 arrays, model.predict, json.dumps "
        "or np.savetxt answers), xgboost (the XGBoost container's: CSV, LibSVM and RecordIO-protobuf as a DMatrix, "
        "model.predict, the same answers), pytorch (the PyTorch container's: a TorchScript model.pt, tensors in, "
        "lists out) or huggingface (the Hugging Face container's: a transformers pipeline for HF_TASK, "
        '{"inputs", "parameters"} in, JSON out); with pytorch or huggingface no script is needed',
        choices=SCRIPT_DEFAULTS,
    )
    install_requirements: bool = _variable(
        False,
        "INFERENCE_SERVER_INSTALL_REQUIREMENTS",
        _boolean,
        "pip install the script's requirements.txt (beside it) before serving; a failed install stops start-up",
        default_text="off",
        flag=True,
    )
    server: str = _variable(
        "granian",
        "INFERENCE_SERVER_BACKEND",
        _one_of(SERVERS),
        "HTTP server: granian, fastest for real-time requests, or gunicorn, faster and leaner for bodies of many MB "
        "(each slow client holds one of its threads, up to about 1,000 per worker: past that, put it behind a proxy "
        "that buffers requests, as SageMaker's front end does)",
        choices=SERVERS,
    )
    log_level: str = _variable(
        "info", "INFERENCE_SERVER_LOG_LEVEL", _log_level, "critical, error, warning, info or debug"
    )
    #: How log lines are written (``None``: text when stderr is a terminal, JSON lines otherwise).
    log_format: str | None = _variable(
        None,
        "INFERENCE_SERVER_LOG_FORMAT",
        _one_of(LOG_FORMATS),
        "text or json (one JSON object per line, as container platforms collect them)",
        default_text="text when stderr is a terminal, else json",
        choices=LOG_FORMATS,
    )
    #: One line per request, written by the app (``/ping`` and ``/metrics`` at debug level).
    access_log: bool = _variable(
        True,
        "INFERENCE_SERVER_ACCESS_LOG",
        _boolean,
        "log one line per request (method, route, status, duration, sizes, request id); /ping and /metrics lines "
        "at debug level",
        default_text="on",
        flag=True,
    )
    #: ``GET /metrics`` in the Prometheus text format, over every worker process.
    metrics: bool = _variable(
        True,
        "INFERENCE_SERVER_METRICS",
        _boolean,
        "serve Prometheus metrics at GET /metrics (requests, latencies, hook stages, batching, model loads; "
        "one scrape covers every worker)",
        default_text="on",
        flag=True,
    )
    #: Accept HTTP/2 (with prior knowledge) beside HTTP/1.1 on granian; SageMaker speaks HTTP/1.1.
    granian_interface: str = _variable(
        "auto",
        "INFERENCE_SERVER_GRANIAN_INTERFACE",
        _one_of(GRANIAN_INTERFACES),
        "granian's interface: auto (asgi when a hook is async def, else wsgi), wsgi, or asgi or rsgi (the "
        "event-loop request path: every route that invokes the model on an event loop, with the 504 at the "
        "deadline, async hooks and streams that hold no thread; the others on a bridge)",
        choices=GRANIAN_INTERFACES,
    )
    #: ``ray``: a Ray Serve application (:mod:`inference_server.ray_serve`) in place of ``--server``'s workers.
    engine: str = _variable(
        "local",
        "INFERENCE_SERVER_ENGINE",
        _one_of(ENGINES),
        "local: serve on this machine with --server's workers; ray: deploy the app on Ray Serve (replicas on a Ray "
        "cluster, behind Serve's HTTP proxy on --host and --port; needs the ray extra)",
        choices=ENGINES,
    )
    ray_address: str | None = _variable(
        None,
        "INFERENCE_SERVER_RAY_ADDRESS",
        str,
        "with --engine ray: the Ray cluster to deploy on (auto, HOST:PORT or ray://...); else a local Ray is "
        "started, and stopped with serve",
        default_text="a local Ray",
    )
    replicas: int = _variable(
        1, "INFERENCE_SERVER_REPLICAS", _integer(1), "with --engine ray: replicas of the app, each with its model"
    )
    autoscale: str | None = _variable(
        None,
        "INFERENCE_SERVER_AUTOSCALE",
        _autoscale,
        "with --engine ray: MIN:MAX replicas, added and removed by Serve's autoscaler on requests in flight (in "
        "place of --replicas)",
        default_text="off",
    )
    http2: bool = _variable(
        False,
        "INFERENCE_SERVER_HTTP2",
        _boolean,
        "also accept HTTP/2 with prior knowledge (granian only), at most 100 streams per connection; SageMaker "
        "speaks HTTP/1.1, so it is off",
        default_text="off",
        flag=True,
    )
    #: Micro-batching (``batching.py``): requests grouped into one ``predict_fn`` call; 1 is off. ``None`` here
    #: means not set by an option or variable: the ``batching`` hook, then the built-in default, decide.
    max_batch_size: int | None = _variable(
        None,
        "INFERENCE_SERVER_MAX_BATCH_SIZE",
        _integer(1),
        "requests whose inputs may share one predict_fn call (concurrent requests only: a lone request never "
        "waits); 1: off. The option wins over the batching hook, the hook over the variable",
        default_text="the batching hook's, else 1",
    )
    #: Milliseconds (the hook's key is ``max_batch_delay_ms``).
    max_batch_delay: int | None = _variable(
        None,
        "INFERENCE_SERVER_MAX_BATCH_DELAY_MS",
        _integer(0),
        "milliseconds a request may wait for company when requests are on their way and the model is free",
        default_text="the batching hook's, else 5",
    )
    max_queue: int | None = _variable(
        None,
        "INFERENCE_SERVER_MAX_QUEUE",
        _integer(1),
        "requests waiting for the model per worker when batching; beyond it 503 with Retry-After at once",
        default_text="4 x the batch size",
    )
    #: SageMaker's multi-model endpoints: the ``/models`` API (SageMaker sets the variable for containers labelled
    #: ``com.amazonaws.sagemaker.capabilities.multi-models=true``).
    multi_model: bool = _variable(
        False,
        "SAGEMAKER_MULTI_MODEL",
        _boolean,
        "serve several models: SageMaker's model management API (POST/GET /models, GET/DELETE /models/NAME, "
        "POST /models/NAME/invoke), each model loaded by model_fn from its own directory",
        default_text="off",
        flag=True,
    )
    model_root: str | None = _variable(
        None,
        "INFERENCE_SERVER_MODEL_ROOT",
        str,
        "a directory of models (each a directory or a .tar.gz) that SageMaker Runtime's TargetModel names on "
        "POST /endpoints/NAME/invocations, loaded on first use as SageMaker does from S3",
        default_text="none",
    )
    #: Directories besides /opt/ml/models and ``model_root`` that the model management API may load models from.
    allow_model_dir: tuple[str, ...] = _variable(
        (),
        "INFERENCE_SERVER_ALLOW_MODEL_DIRS",
        _directories,
        f"a directory that POST /models and the v2 repository may load models from (multi-model), besides "
        f"{MULTI_MODEL_DIR} and --model-root; repeat the option for more (the variable: directories separated by "
        f"{os.pathsep!r}). Any other directory, or a symbolic link leading out of these, is refused with 403",
        default_text="none",
        repeat=True,
    )
    max_models: int = _variable(
        0,
        "INFERENCE_SERVER_MAX_MODELS",
        _integer(0),
        "models loaded at once (multi-model); past it a load answers 507 (--model-root: the least recently used is "
        "unloaded); 0: no limit",
    )
    max_model_memory: int = _variable(
        0,
        "INFERENCE_SERVER_MAX_MODEL_MEMORY_MB",
        _integer(0),
        "megabytes of memory the loaded models may cost the machine: what each load made resident in its worker (a "
        "model loaded through /models counted in every worker) plus their files mapped into memory, each once "
        "(multi-model); past it 507 (--model-root: the least recently used is unloaded, in any worker); 0: no limit",
    )
    metrics_max_models: int = _variable(
        100,
        "INFERENCE_SERVER_METRICS_MAX_MODELS",
        _integer(1),
        "distinct values of the metrics' model label per worker (multi-model); further models count as other",
    )
    #: The Open Inference Protocol (KServe v2, Triton's REST API) under ``/v2``.
    v2: bool = _variable(
        True,
        "INFERENCE_SERVER_V2",
        _boolean,
        "serve the Open Inference Protocol (KServe v2, Triton's REST API with binary tensors) under /v2, over the "
        "same hooks",
        default_text="on",
        flag=True,
    )
    #: The model's name on the Open Inference Protocol's routes (one model).
    model_name: str | None = _variable(
        None,
        "INFERENCE_SERVER_MODEL_NAME",
        str,
        "the model's name in /v2/models/NAME (one model; with --multi-model each model has its own)",
        default_text="the name of the plugin that implements predict_fn or model_fn, else model",
    )
    #: SageMaker Asynchronous Inference (``InvokeEndpointAsync``): where answers are written; None: off.
    async_output: str | None = _variable(
        None,
        "INFERENCE_SERVER_ASYNC_OUTPUT",
        str,
        "serve asynchronous inference (POST /endpoints/NAME/async-invocations, boto3's invoke_endpoint_async) and "
        "write each answer to URI/<uuid>.out: a directory, or s3://bucket/prefix (the s3 extra), as "
        "AsyncInferenceConfig's S3OutputPath",
        default_text="off",
    )
    async_failure: str | None = _variable(
        None,
        "INFERENCE_SERVER_ASYNC_FAILURE",
        str,
        "where failed asynchronous requests' errors are written, as URI/<uuid>-error.out "
        "(AsyncInferenceConfig's S3FailurePath)",
        default_text="the --async-output location",
    )
    async_queue: str | None = _variable(
        None,
        "INFERENCE_SERVER_ASYNC_QUEUE",
        str,
        "directory of the asynchronous requests' durable queue (an SQLite database): accepted requests survive a "
        "stop or a crash of the server and are done after it starts again",
        default_text="$XDG_STATE_HOME/inference-server/async-queue (~/.local/state/...)",
    )
    async_max_queue: int = _variable(
        1000,
        "INFERENCE_SERVER_ASYNC_MAX_QUEUE",
        _integer(1),
        "asynchronous requests queued or running at once; past it a new one is refused with 503 (ThrottlingException)",
    )
    async_workers: int = _variable(
        1,
        "INFERENCE_SERVER_ASYNC_WORKERS",
        _integer(1),
        "asynchronous requests invoking the model at once on this machine (AsyncInferenceConfig's "
        "MaxConcurrentInvocationsPerInstance)",
    )
    async_notify_success: str | None = _variable(
        None,
        "INFERENCE_SERVER_ASYNC_NOTIFY_SUCCESS",
        str,
        "where each finished asynchronous request is announced with SageMaker's notification (its SuccessTopic): an "
        "http(s):// URL that is POSTed the JSON, or an SNS topic ARN (the aws extra)",
        default_text="none",
    )
    async_notify_error: str | None = _variable(
        None,
        "INFERENCE_SERVER_ASYNC_NOTIFY_ERROR",
        str,
        "where each failed or expired asynchronous request is announced (its ErrorTopic): an http(s):// URL or an "
        "SNS topic ARN",
        default_text="none",
    )
    #: SageMaker Data Capture: where a sample of requests and answers is written as JSON Lines; None: off.
    data_capture: str | None = _variable(
        None,
        "INFERENCE_SERVER_DATA_CAPTURE",
        str,
        "capture requests and answers as SageMaker's Data Capture does (DataCaptureConfig's DestinationS3Uri): JSON "
        "Lines in SageMaker's record format, under URI/ENDPOINT/VARIANT/yyyy/mm/dd/hh/, where Model Monitor reads "
        "them; URI a directory, or s3://bucket/prefix (the s3 extra)",
        default_text="off",
    )
    data_capture_sampling: int = _variable(
        100,
        "INFERENCE_SERVER_DATA_CAPTURE_SAMPLING",
        _percentage,
        "the percentage of invocations captured (InitialSamplingPercentage)",
    )
    data_capture_mode: str = _variable(
        "both",
        "INFERENCE_SERVER_DATA_CAPTURE_MODE",
        _one_of(CAPTURE_MODES),
        "what is captured of each invocation: input (the request), output (the answer) or both (CaptureOptions)",
        choices=CAPTURE_MODES,
    )
    data_capture_csv_types: tuple[str, ...] = _variable(
        ("text/csv",),
        "INFERENCE_SERVER_DATA_CAPTURE_CSV_TYPES",
        _media_types,
        "media types captured as CSV text (CaptureContentTypeHeader's CsvContentTypes); repeat the option or "
        "separate them with commas; bodies of other types than these and the JSON ones are captured as base64",
        repeat=True,
    )
    data_capture_json_types: tuple[str, ...] = _variable(
        ("application/json",),
        "INFERENCE_SERVER_DATA_CAPTURE_JSON_TYPES",
        _media_types,
        "media types captured as JSON text (CaptureContentTypeHeader's JsonContentTypes)",
        repeat=True,
    )
    data_capture_flush_seconds: int = _variable(
        5,
        "INFERENCE_SERVER_DATA_CAPTURE_FLUSH_SECONDS",
        _integer(1),
        "seconds between two writes of what was captured (each a new object on S3; appended to the hour's file in a "
        "directory); what is left is written when the worker stops",
    )
    data_capture_endpoint: str = _variable(
        "local-endpoint",
        "INFERENCE_SERVER_DATA_CAPTURE_ENDPOINT",
        str,
        "the endpoint's name in the captured files' paths",
    )
    data_capture_variant: str = _variable(
        "AllTraffic",
        "INFERENCE_SERVER_DATA_CAPTURE_VARIANT",
        str,
        "the production variant's name in the captured files' paths",
    )
    #: Put a failing hook's exception message and traceback in its 500 answer (they may hold request data).
    debug: bool = _variable(
        False,
        "INFERENCE_SERVER_DEBUG",
        _boolean,
        "put a failing hook's exception message and traceback in its 500 answer; off in production, since "
        "exception messages can hold the data of requests",
        default_text="off",
        flag=True,
    )
    #: Treat every start-up warning (a plugin without hooks, the built-in echo model, ...) as an error.
    strict: bool = _variable(
        False,
        "INFERENCE_SERVER_STRICT",
        _boolean,
        "exit 1 at start-up if there is any warning (a plugin that implements no hook, the built-in echo model "
        "served, two plugins implementing one request hook, a missing model directory), as plugins --strict does",
        default_text="off",
        flag=True,
    )
    #: The settings given as options (the command line), which win over hooks that set the same (``batching``);
    #: passed on to worker processes in ``INFERENCE_SERVER_GIVEN``.
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    @property
    def log_level_number(self) -> int:
        """The log level as a :mod:`logging` number."""
        return int(getattr(logging, self.log_level.upper()))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: object) -> Settings:
        """Build settings from environment variables; ``options`` that are not ``None`` (the command line) win.

        ``options`` are field names; an invalid value names its option or variable.
        """
        env = os.environ if environ is None else environ
        unknown = set(options) - set(VARIABLES)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        defaults = dict(DEFAULTS)
        if _from_env(env, "SAGEMAKER_BATCH", _boolean, False):  # a Batch Transform container: SageMaker's timeout
            defaults["timeout"] = BATCH_TIMEOUT
        values = {
            field: _setting(field, options.get(field), env, variable, defaults[field])
            for field, variable in VARIABLES.items()
        }
        given = {field for field, value in options.items() if value is not None}
        given.update(name for name in env.get(GIVEN_ENV, "").split(",") if name in VARIABLES)
        return cls(**values, given=frozenset(given))  # type: ignore[arg-type]

    def environ(self) -> dict[str, str]:
        """The environment variables that make :meth:`from_env` give these settings again (in worker processes)."""
        values = {variable.env: getattr(self, field) for field, variable in VARIABLES.items() if variable.env}
        exported = {
            name: os.pathsep.join(value) if isinstance(value, tuple) else str(value)
            for name, value in values.items()
            if value is not None
        }
        if self.given:
            exported[GIVEN_ENV] = ",".join(sorted(self.given))
        return exported


#: Each setting's description, by field name, in declaration order.
VARIABLES: dict[str, Variable] = {
    field.name: field.metadata["variable"] for field in dataclasses.fields(Settings) if "variable" in field.metadata
}
#: Each setting's default, by field name.
DEFAULTS: dict[str, object] = {
    field.name: field.default for field in dataclasses.fields(Settings) if field.name in VARIABLES
}
