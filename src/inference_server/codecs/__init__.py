"""Codecs: one module per format, and one registry that maps a media type to its codec.

``encode``/``decode`` never unpickle; bad input raises :class:`~inference_server.errors.DecodeError` (a
``ValueError`` and a 400) that says what was wrong. Register your own format with :func:`register`.
"""

from inference_server.codecs._registry import (
    Buffer,
    Codec,
    Limits,
    bare,
    cache_short,
    codec_for,
    describe,
    dumps,
    encode,
    loads,
    lookup,
    media_types,
    negotiate,
    quality,
    register,
)
from inference_server.codecs.arrow import FILE, STREAM, ArrowCodec
from inference_server.codecs.csv import CSVCodec
from inference_server.codecs.json import JSONCodec
from inference_server.codecs.jsonlines import JSONLinesCodec
from inference_server.codecs.npy import NpyCodec
from inference_server.codecs.npz import NpzCodec
from inference_server.codecs.text import BytesCodec, TextCodec

__all__ = [
    "Buffer",
    "Codec",
    "JSONCodec",
    "JSONLinesCodec",
    "Limits",
    "bare",
    "cache_short",
    "codec_for",
    "describe",
    "dumps",
    "encode",
    "loads",
    "lookup",
    "media_types",
    "negotiate",
    "quality",
    "register",
]

# Registration order breaks ties in negotiation: binary arrays first, JSON before the other text formats.
for _codec in (
    NpyCodec(),
    NpzCodec(),
    ArrowCodec(STREAM),
    ArrowCodec(FILE),
    JSONCodec(),
    JSONLinesCodec(),
    CSVCodec(),
    TextCodec(),
    BytesCodec(),
):
    register(_codec)
