"""``application/jsonlines``: one JSON value per line, decoded to a list (SageMaker's JSON Lines type)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inference_server.codecs import json
from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError

MEDIA_TYPE = "application/jsonlines"


class JSONLinesCodec(Codec):
    """A list of records, one JSON document per line."""

    media_type = MEDIA_TYPE

    def decode(self, data: Buffer, limits: Limits) -> list[Any]:
        records = []
        for number, line in enumerate(bytes(data).splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line, f"JSON on line {number}"))
                except DecodeError as exc:
                    raise DecodeError(f"invalid JSON Lines: {exc.description}") from None
        return records

    def encode(self, obj: Any, nan: str = "null") -> list[Buffer]:
        if isinstance(obj, np.ndarray):
            text = json.number_table(obj, finite_only=nan != "null")
            if text is not None:  # one value per line, or one row (a JSON array) per line
                return [json.lines_of(text, obj.ndim, row_brackets=True)]
        records = json.as_lists(obj) if isinstance(obj, np.ndarray) and obj.dtype.hasobject else obj
        return [b"".join(json.dumps(record, nan) + b"\n" for record in records)]

    def can_encode(self, obj: Any) -> bool:
        if isinstance(obj, np.ndarray):
            return obj.ndim >= 1 and json.array_is_jsonable(obj)
        return isinstance(obj, (list, tuple))
