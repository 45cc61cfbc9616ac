"""A transform job against a running container (``--endpoint URL``), as SageMaker drives one.

SageMaker's order: ``GET /execution-parameters`` (used when the container answers 200) for the job's defaults, wait
for ``GET /ping`` to answer 200, then ``POST /invocations`` for each request. A request that fails with a connection
error or a 5xx is sent again up to ``InvocationsMaxRetries`` times, with backoff; a 4xx fails its file at once.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any

from inference_server.errors import PredictionError, TransformError
from inference_server.transform import Predictor

#: Defaults when the container does not answer /execution-parameters (those of our own hooks).
DEFAULT_PARAMETERS = {"BatchStrategy": "MultiRecord", "MaxConcurrentTransforms": 1, "MaxPayloadInMB": 6}
#: Seconds to wait for /ping to answer 200.
READY_DEADLINE = 120.0
#: The first retry waits this long, each next one twice as long.
BACKOFF = 0.2


class EndpointPredictor(Predictor):
    """``POST /invocations`` to a running container, one connection per thread, kept alive."""

    def __init__(self, url: str, *, timeout: float = 600.0, retries: int = 3, chunked: bool = False) -> None:
        parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransformError(f"endpoint {url!r}: give an http:// or https:// URL with a host")
        self.url, self.parts = url, parts
        self.base = parts.path.rstrip("/")
        self.timeout, self.retries, self.chunked = timeout, retries, chunked
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.execution_parameters: dict[str, Any] = {**DEFAULT_PARAMETERS, **self._execution_parameters()}

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
            connection = kind(self.parts.hostname or "", self.parts.port, timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._opened.append(connection)
        return connection

    def close(self) -> None:
        """Close the connections of every thread."""
        with self._lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        connection = self._connection()
        try:
            connection.request(method, self.base + path, body=body, headers=headers or {}, encode_chunked=self.chunked)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._drop_connection()
            raise
        if response.getheader("Connection", "").lower() == "close":
            self._drop_connection()
        return response.status, data, response.getheader("Content-Type", "")

    def _execution_parameters(self) -> dict[str, Any]:
        try:
            status, data, _ = self._request("GET", "/execution-parameters")
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise TransformError(f"endpoint {self.url}: cannot connect: {exc}") from None
        if status != 200:
            return {}
        try:
            values = json.loads(data)
        except ValueError:
            return {}
        return {key: values[key] for key in DEFAULT_PARAMETERS if isinstance(values, dict) and key in values}

    def ready(self) -> None:
        """Wait until ``/ping`` answers 200 (SageMaker's health check), or fail the job."""
        deadline = time.monotonic() + READY_DEADLINE
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status, _, _ = self._request("GET", "/ping")
                if status == 200:
                    return
                last = f"status {status}"
            except (OSError, http.client.HTTPException) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise TransformError(f"endpoint {self.url}: /ping did not answer 200 within {READY_DEADLINE:.0f} s ({last})")

    def predict(self, body: bytes, content_type: str, accept: str = "*/*") -> tuple[bytes, str]:
        """The container's answer to one request body; :class:`PredictionError` once the retries are spent."""
        headers = {"Content-Type": content_type, "Accept": accept}
        failure = PredictionError(0, "no attempt was made")
        attempt = 0
        payload: Any = iter([body]) if self.chunked else body
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(BACKOFF * 2 ** (attempt - 1))
                payload = iter([body]) if self.chunked else body
            try:
                status, data, media_type = self._request("POST", "/invocations", payload, headers)
            except (OSError, http.client.HTTPException) as exc:
                failure = PredictionError(0, f"the connection failed: {exc}")
                continue
            if status < 400:
                return data, media_type
            failure = PredictionError(status, _message(data), data)
            if status < 500:
                break
        if failure.status and failure.status < 500:
            failure.message += " (a client error: not retried)"
        else:
            failure.message += f" ({attempt + 1} attempts)"
        raise failure


def _message(data: bytes) -> str:
    """The message of an error answer: our JSON shape's ``message``, else the body's start."""
    try:
        value = json.loads(data)
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return str(value["message"])
    except ValueError:
        pass
    return data[:300].decode("utf-8", "replace") or "no message"
