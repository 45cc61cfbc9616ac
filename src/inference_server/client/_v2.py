"""A client of the Open Inference Protocol v2 (KServe's and Triton's REST API), binary tensors by default."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from inference_server.client._predictor import _error, _HTTPTransport
from inference_server.codecs import v2
from inference_server.codecs._registry import Limits
from inference_server.errors import DecodeError, PredictionError

__all__ = ["V2Client"]

#: What a client reads at most as arrays built (not viewed) from an answer: JSON tensors and BYTES elements.
_CLIENT_LIMITS = Limits(max_decompressed_bytes=1 << 34, max_archive_members=1 << 16)


class V2Client:
    """Talk the Open Inference Protocol v2 to a server under ``url`` (``http://127.0.0.1:8080``): ours, Triton,
    KServe or MLServer, over one kept-alive connection per thread.

    :meth:`infer` sends its inputs as binary tensors (the arrays' own memory, no copy; ``binary=False``: JSON) and
    asks for binary outputs, which come back as ``np.frombuffer`` views on the answer. ``model_name`` is the model
    the calls name unless they give their own. An error answer raises :class:`PredictionError` with the status and
    the server's ``error``.
    """

    def __init__(
        self,
        url: str,
        model_name: str | None = None,
        *,
        timeout: float = 60.0,
        binary: bool = True,
        limits: Limits | None = None,
    ) -> None:
        self._transport = _HTTPTransport(url, timeout)
        self.model_name = model_name
        self.binary = binary
        #: The bounds on what an answer may make this client build (JSON tensors, BYTES elements).
        self.limits = limits or _CLIENT_LIMITS

    def infer(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        model_name: str | None = None,
        binary: bool | None = None,
        binary_output: bool | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        datatypes: Mapping[str, str] | None = None,
    ) -> v2.InferenceResponse:
        """Run the model on ``inputs`` (tensor name -> array, or anything ``np.asarray`` takes) and return its
        answer; ``.outputs`` holds the output tensors by name.

        ``outputs`` names the outputs wanted (``None``: all). ``binary`` and ``binary_output`` default to the
        client's ``binary``. ``datatypes`` may declare a ``uint16`` input ``BF16`` (its raw bits); ``parameters``
        are the request's own. BYTES tensors are ``object`` arrays of ``bytes`` (or ``str``) both ways.
        """
        arrays = [
            (name, value if isinstance(value, np.ndarray) else np.asarray(value)) for name, value in inputs.items()
        ]
        encoded = v2.encode_request(
            arrays,
            outputs,
            binary=self.binary if binary is None else binary,
            binary_output=self.binary if binary_output is None else binary_output,
            request_id=request_id,
            parameters=parameters,
            datatypes=datatypes,
        )
        headers = {"Content-Type": encoded.content_type}
        if encoded.header_length is not None:
            headers[v2.HEADER_LENGTH] = str(encoded.header_length)
        response, data = self._transport.request(
            "POST", f"{self._transport.base}{self._model_path(model_name)}/infer", encoded.body, headers
        )
        if response.status != 200:
            raise _error(response, data)
        header_length = v2.parse_header_length(response.getheader(v2.HEADER_LENGTH))
        try:
            return v2.decode_response(data, header_length, self.limits)
        except DecodeError as exc:
            raise PredictionError(
                response.status, f"the server's answer is not a v2 response: {exc}", bytes(data)
            ) from None

    def is_live(self) -> bool:
        """Whether the server is live (``GET /v2/health/live`` answers 200)."""
        return self._get("/v2/health/live")[0] == 200

    def is_ready(self) -> bool:
        """Whether the server is ready to serve (``GET /v2/health/ready`` answers 200)."""
        return self._get("/v2/health/ready")[0] == 200

    def is_model_ready(self, model_name: str | None = None) -> bool:
        """Whether the model can serve (``GET /v2/models/{name}/ready`` answers 200; 404 or 503: not)."""
        return self._get(f"{self._model_path(model_name)}/ready")[0] == 200

    def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and protocol extensions (``GET /v2``)."""
        return self._metadata("/v2")

    def model_metadata(self, model_name: str | None = None) -> dict[str, Any]:
        """The model's inputs and outputs, each with its name, datatype and shape (-1: any size)."""
        return self._metadata(self._model_path(model_name))

    def close(self) -> None:
        """Close the kept-alive connections of every thread that used this client."""
        self._transport.close()

    def __enter__(self) -> V2Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _model_path(self, model_name: str | None) -> str:
        name = model_name or self.model_name
        if not name:
            raise ValueError("which model? Give V2Client a model_name, or pass model_name= to the call")
        return f"/v2/models/{urllib.parse.quote(name, safe='')}"

    def _get(self, path: str) -> tuple[int, memoryview | bytes]:
        response, data = self._transport.request("GET", f"{self._transport.base}{path}", None, {})
        if response.status >= 500 and response.status != 503:
            raise _error(response, data)
        return response.status, data

    def _metadata(self, path: str) -> dict[str, Any]:
        response, data = self._transport.request("GET", f"{self._transport.base}{path}", None, {})
        if response.status != 200:
            raise _error(response, data)
        value = orjson.loads(bytes(data))
        if not isinstance(value, dict):
            raise PredictionError(response.status, "the server's metadata is not a JSON object", bytes(data))
        return value
