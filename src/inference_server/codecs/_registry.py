"""The one place that maps a media type to a codec, and content negotiation over it."""

from __future__ import annotations

import dataclasses
import functools
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from inference_server.errors import DecodeError, EncodeError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

#: A piece of a body: the concatenation of an ``encode`` result is the body.
Buffer = bytes | bytearray | memoryview

GiB = 1 << 30
MiB = 1 << 20


#: How many times the body limit (``MaxPayloadInMB``) a compressed body may decompress to on a server: a 6 MB
#: limit lets an Arrow body's zstd or lz4 buffers, or an ``.npz``'s deflated members, become 60 MiB, not the 1 GiB
#: (31,866 times a 33.7 KB body) a fixed bound allowed.
DECOMPRESSION_RATIO = 10


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds that decoders enforce on hostile input."""

    #: Most members an ``.npz`` archive may have.
    max_archive_members: int = 4096
    #: Most bytes the members of an archive may inflate to (a zip bomb is refused before inflating).
    max_decompressed_bytes: int = GiB
    #: What ``max_decompressed_bytes`` stands for, said in the 413 of a body that would decompress past it.
    decompressed_bound: str = "the decoder's default"

    @classmethod
    def for_payload(cls, max_payload_in_mb: int) -> Limits:
        """The limits of a server whose bodies are at most ``max_payload_in_mb`` MiB: they decompress to at most
        :data:`DECOMPRESSION_RATIO` times that (1 GiB where bodies have no limit: ``MaxPayloadInMB`` 0)."""
        if not max_payload_in_mb:
            return cls(decompressed_bound="the bound of a server whose bodies have no limit (MaxPayloadInMB 0)")
        return cls(
            max_decompressed_bytes=DECOMPRESSION_RATIO * max_payload_in_mb * MiB,
            decompressed_bound=(
                f"{DECOMPRESSION_RATIO} x the body limit of {max_payload_in_mb} MB (MaxPayloadInMB); the server's "
                "operator can raise it with SAGEMAKER_MAX_PAYLOAD_IN_MB or the max_payload_in_mb hook"
            ),
        )

    def decompressed_too_large(self, what: str) -> DecompressedTooLarge:
        """The error for a body that would decompress past the bound: ``what`` it would become, then the bound."""
        return DecompressedTooLarge(
            f"{what}; at most {self.max_decompressed_bytes} bytes are allowed: {self.decompressed_bound}"
        )


class DecompressedTooLarge(PayloadTooLarge, DecodeError):
    """413: a compressed body that would decompress past :attr:`Limits.max_decompressed_bytes` (refused before it
    is inflated); also a :class:`DecodeError`, so a ``ValueError``."""


class Codec:
    """Encodes Python objects to bodies of one media type and decodes them back.

    Subclasses set ``media_type`` (lower case, no parameters) and implement ``decode``, ``encode`` and
    ``can_encode``; ``natural_for`` says whether this is the format to send for an object when the client accepts
    anything. A codec whose optional library is missing raises :class:`UnsupportedMediaType` naming the extra.
    """

    media_type: ClassVar[str]

    def decode(self, data: Buffer, limits: Limits) -> Any:
        """Decode a whole body; invalid input raises :class:`DecodeError` saying what was wrong."""
        raise NotImplementedError

    def encode(self, obj: Any) -> list[Buffer]:
        """Encode ``obj``; the body is the concatenation of the returned buffers (no copy of array data)."""
        raise NotImplementedError

    def can_encode(self, obj: Any) -> bool:
        """Whether ``encode(obj)`` would work."""
        raise NotImplementedError

    def natural_for(self, obj: Any) -> bool:
        """Whether this is the format to pick for ``obj`` when the client accepts anything."""
        return False

    def available(self) -> bool:
        """Whether the libraries this codec needs are installed."""
        return True

    def install_hint(self) -> str:
        """How to install what this codec needs, when it is not :meth:`available`."""
        return ""


_codecs: dict[str, Codec] = {}
_lock = threading.Lock()


def register(codec: Codec, *, replace: bool = False) -> Codec:
    """Add ``codec`` for its media type; a plugin calls this at import time to add or replace a format."""
    media_type = codec.media_type.lower()
    with _lock:
        if media_type in _codecs and not replace:
            raise ValueError(f"a codec for {media_type} is registered already; pass replace=True to replace it")
        _codecs[media_type] = codec
    return codec


def media_types() -> list[str]:
    """The registered media types, in registration order."""
    return list(_codecs)


F = TypeVar("F", bound=Callable[..., Any])

#: The longest key :func:`cache_short` keeps: an ``Accept`` or ``.npy`` header of a real client is far shorter.
SHORT = 512


def cache_short(maxsize: int) -> Callable[[F], F]:
    """An LRU cache for a function whose first argument (a str or bytes) comes from clients: only values up to
    :data:`SHORT` long are kept, so the cache is bounded in bytes too (300 distinct 60 KB ``Accept`` headers would
    otherwise hold hundreds of MB); longer ones are computed every time."""

    def decorate(function: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(function)

        @functools.wraps(function)
        def call(key: Any, *args: Any) -> Any:
            return cached(key, *args) if len(key) <= SHORT else function(key, *args)

        return call  # type: ignore[return-value]

    return decorate


@cache_short(256)
def bare(media_type: str) -> str:
    """``'Application/X-NPY; charset=binary'`` -> ``'application/x-npy'``."""
    return media_type.split(";", 1)[0].strip().lower()


def lookup(media_type: str) -> Codec | None:
    """The codec for a media type (case-insensitive, parameters ignored), or ``None``."""
    return _codecs.get(bare(media_type))


def codec_for(media_type: str) -> Codec:
    """The codec for a media type, or :class:`UnsupportedMediaType` listing the supported ones."""
    codec = lookup(media_type)
    if codec is None:
        raise UnsupportedMediaType(f"cannot decode {media_type!r}; supported: {', '.join(_codecs)}")
    return codec


#: Exceptions that malformed input can raise inside third-party parsers; they become DecodeError.
_INPUT_ERRORS = (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error, zlib.error, EOFError)


_DEFAULT_LIMITS = Limits()


def loads(data: Buffer, media_type: str, limits: Limits | None = None) -> Any:
    """Decode a body of ``media_type`` within ``limits`` (default: :class:`Limits`' defaults).

    Zero-copy for ``.npy``, stored ``.npz`` members and Arrow. The server passes the limits of its own
    ``MaxPayloadInMB``, so two apps in one process each keep theirs.
    """
    codec = codec_for(media_type)
    try:
        return codec.decode(data, limits or _DEFAULT_LIMITS)
    except (DecodeError, UnsupportedMediaType):
        raise
    except _INPUT_ERRORS as exc:
        raise DecodeError(f"invalid {codec.media_type} body: {exc}") from None


def encode(obj: Any, media_type: str) -> list[Buffer]:
    """Encode ``obj`` as ``media_type``: a list of buffers whose concatenation is the body."""
    codec = lookup(media_type)
    if codec is None:
        raise NotAcceptable(f"cannot encode {media_type!r}; supported: {', '.join(_codecs)}")
    return codec.encode(obj)


def dumps(obj: Any, media_type: str) -> bytes:
    """Encode ``obj`` as ``media_type`` into one ``bytes`` (one copy of the data)."""
    return b"".join(encode(obj, media_type))


#: Media ranges of an Accept value: (type, subtype, q), in the header's order.
Ranges = tuple[tuple[str, str, float], ...]


def _range(media_range: str, quality: float) -> tuple[str, str, float]:
    type_, _, subtype = media_range.split(";", 1)[0].strip().lower().partition("/")
    return type_, subtype or "*", quality


@cache_short(256)
def _parse_accept(accept: str) -> Ranges:
    ranges = []
    for item in accept.split(","):
        parts = item.split(";")
        if not parts[0].strip():
            continue
        quality = 1.0
        for parameter in parts[1:]:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    quality = 0.0
        ranges.append(_range(parts[0], quality))
    return tuple(ranges)


@cache_short(256)  # a MIMEAccept's length is its count of media ranges
def _parsed_ranges(accept: tuple[tuple[str, float], ...]) -> Ranges:
    """The ranges of an Accept value parsed already (werkzeug's MIMEAccept: (value, q) pairs)."""
    return tuple(_range(value, quality) for value, quality in accept) or _parse_accept("*/*")


def _ranges(accept: str | Iterable[tuple[str, float]] | None) -> Ranges:
    """The media ranges of a header string, or of a parsed Accept (whose parse is reused, not repeated)."""
    if accept is None:
        return _parse_accept("*/*")
    if isinstance(accept, str):
        return _parse_accept(accept or "*/*")
    try:
        return _parsed_ranges(accept)  # type: ignore[arg-type]  # MIMEAccept is immutable and hashable
    except TypeError:  # a plain list of pairs
        return _parsed_ranges(tuple(accept))


def quality(accept: str, media_type: str) -> float:
    """How much ``accept`` wants ``media_type``: the q of the most specific matching range (RFC 9110 12.5.1)."""
    return _quality(_ranges(accept), media_type)


def _quality(ranges: Ranges, media_type: str) -> float:
    type_, _, subtype = media_type.partition("/")
    best, best_specificity = 0.0, -1
    for range_type, range_subtype, q in ranges:
        if range_type == type_ and range_subtype == subtype:
            specificity = 2
        elif range_type == type_ and range_subtype == "*":
            specificity = 1
        elif range_type == "*":
            specificity = 0
        else:
            continue
        if specificity > best_specificity:
            best, best_specificity = q, specificity
    return best


def describe(obj: Any) -> str:
    """A prediction's type in a few words, without its data: ``ndarray of dtype object holding dict``."""
    name = type(obj).__name__
    dtype = getattr(obj, "dtype", None)
    if dtype is None:
        return name
    if getattr(dtype, "hasobject", False) and getattr(obj, "size", 0):
        kinds = sorted({type(value).__name__ for value in obj.flat})
        return f"{name} of dtype {dtype} holding {', '.join(kinds[:5])}"
    return f"{name} of dtype {dtype}"


def negotiate(
    accept: str | Iterable[tuple[str, float]] | None,
    obj: Any = None,
    default: str | None = None,
    request: str | None = None,
) -> Codec:
    """Pick the codec to send ``obj`` with, for an ``Accept`` value (a header string or werkzeug's MIMEAccept).

    The highest q wins; ties (``*/*`` above all) go to the request's own media type ``request`` (JSON in, JSON out),
    then to ``default`` (``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``), then to the natural format of ``obj`` (ndarray:
    npy, dict of arrays: npz, Table: Arrow, else JSON), each only if it can encode ``obj``. Nothing acceptable: 406
    listing what could be sent; nothing at all can encode ``obj``: :class:`EncodeError` (500) naming its type.
    """
    ranges = _ranges(accept)
    if len(ranges) == 1 and ranges[0][2] > 0:  # one range (what clients send), so every match has the same q
        found = _one_range(ranges[0], obj, default, request)
        if found is not None:
            return found
    return _ranked(ranges, accept, obj, default, request)


def _ranked(
    ranges: Ranges, accept: str | Iterable[tuple[str, float]] | None, obj: Any, default: str | None, request: str | None
) -> Codec:
    """:func:`negotiate` by ranking every codec that can encode ``obj``."""
    candidates = [codec for codec in _codecs.values() if codec.available() and codec.can_encode(obj)]
    if not candidates:
        raise EncodeError(
            f"no codec can encode the prediction, a {describe(obj)}; return arrays of numbers or strings, "
            "lists, dicts or bytes, or encode it in output_fn"
        )
    request_codec = lookup(request) if request else None
    default_codec = lookup(default) if default else None
    preference = sorted(
        candidates,
        key=lambda codec: (codec is not request_codec, codec is not default_codec, not codec.natural_for(obj)),
    )  # stable: registration order breaks the remaining ties
    best, best_q = None, 0.0
    for codec in preference:
        q = _quality(ranges, codec.media_type)
        if q > best_q:
            best, best_q = codec, q
    if best is None:
        header = _header(accept)
        offered = ", ".join(codec.media_type for codec in preference)
        missing = [codec for codec in _codecs.values() if not codec.available() and _quality(ranges, codec.media_type)]
        hint = "".join(f"; {codec.media_type} needs {codec.install_hint()}" for codec in missing)
        raise NotAcceptable(f"cannot send a {type(obj).__name__} as {header!r}; it can be sent as: {offered}{hint}")
    return best


def _one_range(accepted: tuple[str, str, float], obj: Any, default: str | None, request: str | None) -> Codec | None:
    """:func:`negotiate`'s choice for an Accept of one range (q > 0), without ranking every codec; None where the
    whole ranking must say (a wildcard of one type, or nothing fits: its error names what could be sent).

    A media type names its codec; ``*/*`` takes the first that can encode ``obj`` of the request's, the default's,
    then the natural ones and then any, in registration order: the ranking's order when every q is the same."""
    range_type, range_subtype, _ = accepted
    if range_type != "*":
        media_type = f"{range_type}/{range_subtype}"
        codec = _codecs.get(media_type)
        usable = codec is not None and codec.media_type == media_type and codec.available() and codec.can_encode(obj)
        return codec if usable else None
    for preferred in (request, default):
        codec = lookup(preferred) if preferred else None
        if codec is not None and codec.available() and codec.can_encode(obj):
            return codec
    fallback = None
    for codec in _codecs.values():
        if codec.available() and codec.can_encode(obj):
            if codec.natural_for(obj):
                return codec
            fallback = fallback or codec
    return fallback


def _header(accept: str | Iterable[tuple[str, float]] | None) -> str:
    if accept is None:
        return "*/*"
    if isinstance(accept, str):
        return accept or "*/*"
    header = ", ".join(value if q == 1 else f"{value};q={q:g}" for value, q in accept)  # as the client wrote it
    return header or "*/*"
