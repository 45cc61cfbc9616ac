"""``text/plain`` (UTF-8 strings) and ``application/octet-stream`` (bytes, passed through)."""

from __future__ import annotations

from typing import Any

from inference_server.codecs._registry import Buffer, Codec, Limits
from inference_server.errors import DecodeError

PLAIN = "text/plain"
OCTET_STREAM = "application/octet-stream"


class TextCodec(Codec):
    """A UTF-8 string."""

    media_type = PLAIN

    def decode(self, data: Buffer, limits: Limits) -> str:
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"text/plain body is not UTF-8: byte {exc.start} is invalid") from None

    def encode(self, obj: Any) -> list[Buffer]:
        return [obj.encode()]

    def can_encode(self, obj: Any) -> bool:
        return isinstance(obj, str)

    def natural_for(self, obj: Any) -> bool:
        return isinstance(obj, str)


class BytesCodec(Codec):
    """Bytes, unchanged both ways (the body's own buffer, not a copy)."""

    media_type = OCTET_STREAM

    def decode(self, data: Buffer, limits: Limits) -> Buffer:
        return data

    def encode(self, obj: Any) -> list[Buffer]:
        return [obj]

    def can_encode(self, obj: Any) -> bool:
        return isinstance(obj, (bytes, bytearray, memoryview))

    def natural_for(self, obj: Any) -> bool:
        return self.can_encode(obj)
