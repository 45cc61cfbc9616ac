"""``application/json`` with orjson: NumPy arrays and scalars are encoded natively."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError

MEDIA_TYPE = "application/json"
OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def default(obj: Any) -> Any:
    """What orjson cannot encode natively: non-contiguous or unusual arrays, NumPy scalars."""
    if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__} as JSON")


def dumps(obj: Any) -> bytes:
    """One JSON document."""
    return orjson.dumps(obj, default=default, option=OPTIONS)


def loads(data: Buffer, what: str = "JSON") -> Any:
    """Parse one JSON document, raising DecodeError with orjson's position of the problem."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid {what}: {exc}") from None


class JSONCodec(Codec):
    """Any JSON value; the fallback format for predictions."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> Any:
        return loads(data)

    def encode(self, obj: Any) -> list[Buffer]:
        return [dumps(obj)]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return not obj.dtype.hasobject
        return not isinstance(obj, (bytes, bytearray, memoryview)) and type(obj).__module__.split(".")[0] not in (
            "pyarrow",
            "pandas",
        )

    def natural_for(self, obj: Any) -> bool:
        return not isinstance(obj, (np.ndarray, str))
